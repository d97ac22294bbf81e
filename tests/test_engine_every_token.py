"""Every token judged on the real vLLM CPU engine, in bfloat16 (the demo runs float32, where the
threshold is ~4e-6 nats and any flip is a fault; tests/test_engine_four_methods.py judges the four
methods there): the baseline measures the study's numerics, the demo's lossless methods pass, and a
fault planted in vLLM's acceptance (drafts accepted within 0.25 nats of the top token:
tests/faulty_engine.py ``accept_within``) is caught where it changes an output: each changed output's
own decode (speculation on, log-probs asked) ranks the token the fault let through under the top.

The workload (tests/data/near_tie_prompts.jsonl) holds two held-out corpus prompts where the demo
draft proposes the target's runner-up at a near-tie (found offline, transformers in bfloat16: the
demo target is sure of nearly every token, so the fault has few places to act) and six others.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from queue import Queue

import pytest

from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.core.workload import load_workload
from autotune.forecast.predict import suffix_available
from autotune.measure.config import StudyConfig
from autotune.measure.numerics import Numerics
from autotune.run.engine import UNTIMED_ENV
from autotune.run.evaluate import run_and_evaluate
from faulty_engine import ENV as FAULT_ENV

pytestmark = pytest.mark.engine
EAGER = {"enforce_eager": True}
DRAFT = {"method": "draft_model", "num_speculative_tokens": 3, **EAGER}
RUNS = {
    "baseline": ({"method": "none", **EAGER}, None),
    "ngram": ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
               **EAGER}, None),
    "draft_model": (DRAFT, None),
    "eagle3": ({"method": "eagle3", "num_speculative_tokens": 3, **EAGER}, None),
    "near_tie_fault": (DRAFT, {"accept_within": 0.25}),
}
if suffix_available():
    RUNS["suffix"] = ({"method": "suffix", "num_speculative_tokens": 6, **EAGER}, None)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory, engine_launcher):
    """name -> (raw run, evaluation) for every run above, in bfloat16, judged against the baseline."""
    root = tmp_path_factory.mktemp("every_token")
    wl = load_workload("tests/data/near_tie_prompts.jsonl")
    cfg = StudyConfig(name="every_token", results_dir=root, samples=0, repeats=1, warmup=1,
                      settings=Settings(model=str(demo.TARGET), draft_model=str(demo.DRAFT), eagle3_head=str(demo.EAGLE3),
                                        dtype="bfloat16", max_model_len=demo.MAX_MODEL_LEN,
                                        kv_cache_memory_bytes=demo.KV_CACHE_BYTES))
    cores: Queue[str] = Queue()  # two engines at a time, each on a core of its own (test_engine_correctness.py)
    for core in sorted(os.sched_getaffinity(0))[:2]:
        cores.put(str(core))

    def run(name: str, reference=None):
        params, fault = RUNS[name]
        core = cores.get()
        # Outputs only, never speed; the engine core in the worker's process, where the fault is planted.
        env = {"VLLM_CPU_OMP_THREADS_BIND": core, "OMP_NUM_THREADS": "1", "OMP_PLACES": f"{{{core}}}",
               "OMP_PROC_BIND": "true", **UNTIMED_ENV}
        run_cfg = cfg
        if fault:
            env[FAULT_ENV] = json.dumps(fault)
            run_cfg = replace(cfg, engine_module="faulty_engine")
        try:
            res, ev = run_and_evaluate(Candidate(params), wl, run_cfg, root / name, reference=reference, env=env)
        finally:
            cores.put(core)
        assert ev is not None, f"{name}: {res.failure}"
        return {**res.raw, "log": Path(res.log_path).read_text(errors="replace")}, ev

    base = run("baseline")
    with ThreadPoolExecutor(cores.qsize()) as pool:
        rest = list(pool.map(lambda n: run(n, base[1].reference), list(RUNS)[1:]))
    return dict(zip(RUNS, [base, *rest]))


def test_the_baseline_measures_the_studys_numerics_in_bfloat16(bf16):
    raw, ev = bf16["baseline"]
    n = Numerics.from_dict(ev.reference.numerics)
    assert raw["dtype"] == "bfloat16" and n.dtype == "bfloat16"
    assert n.drift is not None and n.drift.positions >= 200 and n.drift.requests == 8
    assert n.scale_source.startswith("measured") and 4 <= n.scale <= 64, n.scale_source  # top logits 13-24
    assert n.threshold.value <= 0.25 and ev.verdict.near_tie_threshold == n.threshold.value
    assert ev.verdict.passed and ev.verdict.excused_p is not None, ev.verdict.reason  # its own decodes pass


@pytest.mark.parametrize("name", [n for n in RUNS if n not in ("baseline", "near_tie_fault")])
def test_the_demos_lossless_methods_pass_in_bfloat16(bf16, name):
    raw, ev = bf16[name]
    assert ev.verdict.passed and ev.verdict.status == "ok", ev.verdict.reason
    assert ev.verdict.flip_faults == 0
    # Where an output differs, its own decode ranked every token it emitted first (lossless by construction)
    assert all("logprobs" in s.get("decoded", {}) for s in (raw.get("own_scores") or {}).values())


def test_a_fault_accepting_drafts_within_a_quarter_nat_of_the_top_is_caught_where_it_changes_an_output(bf16):
    raw, ev = bf16["near_tie_fault"]
    assert "faulty_engine: accepted drafts" in raw["log"]  # the fault acted
    base = {r["id"]: r["token_ids"] for r in bf16["baseline"][1].reference.outputs}
    changed = [r["id"] for r in raw["windows"][0]["requests"] if r["token_ids"] != base[r["id"]]]
    assert changed, "the fault changed no output: nothing to catch on this workload"
    v = ev.verdict
    assert not v.passed and v.status == "failed" and "greedy mismatch" in v.reason, v.reason
    # Each changed output judged: a token past the threshold, or excused where the run's excused tokens
    # are more than the baseline's own drift predicts (measured: 2 changed outputs, each flipped once
    # at one bfloat16 step, 0.0625 nats, under the threshold 0.125; 2 excused where 0.072 were
    # predicted, p = 0.0025).
    assert v.flip_faults + v.near_ties == len(changed) and v.flips_unscored == 0
    assert v.flip_faults or v.excused_p < 0.01, v.reason
    assert set(raw["own_scores"]) == set(changed)  # each changed output scored teacher-forced, once
    # And decoded again by its own engine, speculation on, with log-probs: vLLM's come from the verifying
    # target's raw logits, apart from the acceptance the fault changed, so the token it let through
    # shows ranked under the top at whatever margin (autotune.measure.every_token.own_rank_fault):
    # every changed output is a fault, none left to the count.
    assert all("logprobs" in raw["own_scores"][r].get("decoded", {}) for r in changed), raw["own_scores"]
    assert v.flip_faults == len(changed) and "its own decode with speculation emitted" in v.reason, v.reason
    # The unfaulted config on the same workload passes (test_the_demos_lossless_methods_pass_in_bfloat16):
    # the fault alone fails it.
    assert bf16["draft_model"][1].verdict.passed
