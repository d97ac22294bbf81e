"""Suffix decoding on the real vLLM CPU engine (Arctic Inference's tree), against its forecast.

The baseline and one suffix candidate serve the first edits of examples/json_edit.jsonl and as many
held-out corpus prompts of every domain made here (edits, logs, support chats: not the workload the
forecast was developed on) one at a time, twice over (two windows, no warm-up, one engine each).
Lossless: every greedy output equals the baseline's. Predicted: replaying Arctic Inference's cache
over the baseline's prompts and outputs in the same order, from an empty cache, gives vLLM's own
counters for the first window exactly: drafts, draft tokens, accepted tokens and accepted tokens by
position.

Every window starts with an empty cache (autotune.run.vllm_ext, through vLLM's worker extension),
as it starts with a cold prefix cache: without that, the second window's tree would hold every
response it is about to generate and draft them whole, and the trial would measure a speedup
no fresh server gives. So the second window equals the same forecast too, exactly.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.measure.config import StudyConfig
from autotune.run.served_engine import PER_POS
from autotune.run.engine import UNTIMED_ENV
from autotune.run.evaluate import trial_job
from autotune.forecast.predict import suffix_acceptance, suffix_available
from autotune.run.worker import run_trial
from autotune.core.workload import load_workload

pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(not suffix_available(), reason="Arctic Inference is not installed "
                                 "(scripts/setup.sh builds it; without it vLLM refuses method: suffix)")]
REQUESTS = 6
SUFFIX = {"method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_tree_depth": 24,
          "suffix_decoding_max_spec_factor": 2.0, "suffix_decoding_min_token_prob": 0.1, "enforce_eager": True}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, engine_launcher):
    """The baseline's and the suffix candidate's raw runs over the same requests."""
    from autotune.demo.corpus import fresh_examples

    tmp = tmp_path_factory.mktemp("suffix")
    rows = Path("examples/json_edit.jsonl").read_text().splitlines(keepends=True)[:REQUESTS]
    rows += [json.dumps({"id": f"fresh-{i}", "prompt": e.prompt, "max_tokens": 96, "temperature": 0.0}) + "\n"
             for i, e in enumerate(fresh_examples(REQUESTS, seed=4242))]
    (tmp / "mixed.jsonl").write_text("".join(rows))
    wl = load_workload(str(tmp / "mixed.jsonl"))
    cfg = StudyConfig(name="suffix", results_dir=tmp, repeats=2, warmup=0, samples=0,
                      settings=Settings(model=str(demo.TARGET), dtype=demo.DTYPE, max_model_len=demo.MAX_MODEL_LEN,
                                        kv_cache_memory_bytes=demo.KV_CACHE_BYTES))
    out = {}
    for name, params, instrument in (("baseline", {"method": "none", "enforce_eager": True}, "inprocess"),
                                     ("suffix", SUFFIX, "inprocess"), ("suffix served", SUFFIX, "served")):
        # Counters and outputs only, never speed: vLLM's engine core runs its worker in-process.
        got = run_trial(trial_job(Candidate(params), wl, replace(cfg, instrument=instrument)), tmp / name,
                        timeout_s=600, env=UNTIMED_ENV)
        assert got.raw is not None, got.failure
        out[name] = got.raw
    return out


def _counters(window):
    c = window["spec_counters"]
    return {"drafts": c["vllm:spec_decode_num_drafts"], "draft_tokens": c["vllm:spec_decode_num_draft_tokens"],
            "accepted": c["vllm:spec_decode_num_accepted_tokens"], "per_pos": list(c[PER_POS])}


def _said(a, k):
    return {"drafts": a.drafts, "draft_tokens": a.draft_tokens, "accepted": a.accepted,
            "per_pos": list(a.per_pos) + [0] * (k - len(a.per_pos))}


def test_suffix_outputs_are_the_baselines(runs):
    base = {r["id"]: r["token_ids"] for r in runs["baseline"]["windows"][0]["requests"]}
    assert len(base) == 2 * REQUESTS and all(base.values())
    for name in ("suffix", "suffix served"):
        for w in runs[name]["windows"]:
            assert {r["id"]: r["token_ids"] for r in w["requests"]} == base, name
        assert runs[name]["speculative_config"]["method"] == "suffix"


def test_each_trial_records_the_model_runner_its_engine_ran(runs):
    """Suffix runs Model Runner V1 on every build (V2 does not support it: autotune.core.runner), read
    from the served trial's server log and the in-process trial's engine config; the baseline runs
    what this build runs (V1 without Triton, V2 on a GPU)."""
    import os

    from autotune.core import runner
    from autotune.run import hardware

    assert runs["suffix served"]["model_runner"] == runs["suffix"]["model_runner"] == "v1"
    assert runs["suffix served"]["model_runner_from"] == "server log ('using the V1 model runner instead')"
    assert runs["baseline"]["model_runner"] == runner.expected(
        None, triton=runner.has_triton(hardware.detect()), env=os.environ)[0]


def test_forecast_equals_vllms_counters_window_by_window(runs):
    recs = runs["baseline"]["windows"][0]["requests"]
    pairs = [(r["prompt_token_ids"], r["token_ids"]) for r in recs]
    k = SUFFIX["num_speculative_tokens"]
    knobs = dict(k=k, max_model_len=demo.MAX_MODEL_LEN, max_tree_depth=SUFFIX["suffix_decoding_max_tree_depth"],
                 max_spec_factor=SUFFIX["suffix_decoding_max_spec_factor"],
                 min_token_prob=SUFFIX["suffix_decoding_min_token_prob"])
    first = suffix_acceptance(pairs, **knobs)
    assert first.drafts > 0 and first.accepted > 0
    # the held-out prompts draft on their own too, so the exact match below covers them
    held_out = [(r["prompt_token_ids"], r["token_ids"]) for r in recs if r["id"].startswith("fresh-")]
    assert len(held_out) == REQUESTS and suffix_acceptance(held_out, **knobs).drafts > 0
    for name in ("suffix", "suffix served"):  # in-process, and served: the reset over /collective_rpc
        measured = [_counters(w) for w in runs[name]["windows"]]
        print(name, "forecast", _said(first, k), "vLLM", measured)
        assert measured == [_said(first, k)] * len(measured), name  # every window from an empty cache, exactly
    # Without the reset the second window drafts from the first's responses: the same replay
    # twice over accepts more in its second pass, which is what the reset keeps out.
    both = suffix_acceptance(pairs, windows=2, **knobs)
    assert both.accepted - first.accepted > first.accepted

