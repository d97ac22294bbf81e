"""TPOT and ITL are measured only where the stream timed tokens (autotune.measure.coalescing, issue 60):
a window whose tokens reached the client in bursts reports them as not measured, and they stay out of
the objectives Optuna ranks on, the SLOs and the gate; evenly spaced tokens keep their TPOT.

Built on hand-made timing records through the real measurement functions, on the FAKE engine's
windows (tests/fake_engine.py), and through the production study and holdout with the engine's windows
hand-made (tests/sim_study.py's harness)."""

from __future__ import annotations

import math
import random
from typing import Any

import optuna
import pytest

from autotune.core import attrs
from autotune.measure.coalescing import MAX_UNSTEPPED_SHARE, SAME_INSTANT_S, step_tokens, stream_coalesced
from autotune.measure.metrics import measure_run, pool, unresolved_latency
from autotune.measure.objectives import objective_values
from autotune.measure.slo import goodput, parse_slos

PER_POS, DRAFTS = "vllm:spec_decode_num_accepted_tokens_per_pos", "vllm:spec_decode_num_drafts"
NO_SPEC = {DRAFTS: 0, PER_POS: []}  # the baseline's counters, as vLLM's reader gives them


def request(i: int, start: float, times: list[float], tokens: list[int]) -> dict[str, Any]:
    return {"id": f"r{i}", "start": start, "end": times[-1], "chunks": [[t, n] for t, n in zip(times, tokens)],
            "token_ids": list(range(sum(tokens))), "text": "", "finish_reason": "length", "error": None}


def window(kind: str, *, n: int = 40, step_s: float = 0.005, counters: dict[str, Any] | None = None,
           per_chunk: int = 1) -> dict[str, Any]:
    """Four requests one after another, ``n`` tokens each in chunks of ``per_chunk``: the first chunk
    20 ms after the start, then ``even``: one chunk every ``step_s``; ``bursty``: every later chunk
    at the end, 5 us apart (a backlog read from a buffer, as stream_coalescing.json's windows)."""
    reqs, t = [], 0.0
    chunks = n // per_chunk
    for i in range(4):
        first = t + 0.02
        if kind == "even":
            times = [first + j * step_s for j in range(chunks)]
        else:
            times = [first] + [first + (chunks - 1) * step_s + j * 5e-6 for j in range(chunks - 1)]
        reqs.append(request(i, t, times, [per_chunk] * chunks))
        t = times[-1]
    return {"window_s": t, "requests": reqs, "spec_counters": dict(NO_SPEC if counters is None else counters)}


def run(*kinds: str, **kw: Any) -> dict[str, Any]:
    return measure_run({"windows": [window(k, **kw) for k in kinds]})


def test_bursty_tokens_are_not_measured_and_evenly_spaced_ones_keep_their_tpot():
    even, bursty = run("even", "even"), run("bursty", "bursty")
    assert even["tpot_ms_p50"] == pytest.approx(5.0) and even["itl_ms_p50"] == pytest.approx(5.0)
    assert even["latency_not_measured"] is None and unresolved_latency(even) is None
    for key in ("tpot_ms_p50", "tpot_ms_p99", "itl_ms_p50", "itl_ms_mean"):
        assert math.isnan(bursty[key]), key
    assert all(math.isnan(x) for x in bursty["tpot_ms_p50_windows"])
    assert bursty["windows_coalesced"] == 2 and bursty["unstepped_share"] > 0.9
    line = unresolved_latency(bursty)
    assert line == "TPOT, ITL not measured: tokens reached the client in bursts (2 of 2 windows)"
    # what the stream did time is still measured: TTFT and E2E, and throughput
    assert bursty["ttft_ms_p50"] == pytest.approx(20.0) and bursty["e2e_ms_p50"] == pytest.approx(215.0, rel=1e-2)
    assert bursty["output_tok_s"] == pytest.approx(even["output_tok_s"], rel=1e-2)


def test_the_rule_sits_at_its_two_thresholds():
    """Chunks SAME_INSTANT_S apart are one arrival, and one just over it two; a window is coalesced past
    MAX_UNSTEPPED_SHARE of its decode tokens, not at it."""
    at = [window("even", step_s=SAME_INSTANT_S * 0.99)["requests"][0]]
    apart = [window("even", step_s=SAME_INSTANT_S * 1.01)["requests"][0]]
    assert stream_coalesced(at, step=1) and stream_coalesced(apart, step=1) is None
    # 41 tokens a request (40 decode tokens): k chunks of 2 where a step gives 1 leave k tokens unstepped
    def merged(k: int) -> list[dict[str, Any]]:
        tokens = [2] * k + [1] * (41 - 2 * k)
        return [request(0, 0.0, [0.01 + 0.005 * j for j in range(len(tokens))], tokens)]
    at_line = round(MAX_UNSTEPPED_SHARE * 40)
    assert stream_coalesced(merged(at_line), step=1) is None and stream_coalesced(merged(at_line + 1), step=1)


def test_a_chunk_is_one_engine_step_only_up_to_the_drafts_depth():
    """A speculative step gives a request up to 1 + k tokens in one chunk (k: the per-position counter's
    length): chunks of 4 are steps of a k=3 engine, and merged steps of a baseline's."""
    spec = {DRAFTS: 40, PER_POS: [30, 20, 10]}
    assert step_tokens(spec) == 4 and step_tokens(NO_SPEC) == 1 and step_tokens({}) is None
    assert step_tokens({DRAFTS: 5, PER_POS: []}) is None  # drafts with no positions: a step's size unknown
    k3 = run("even", "even", counters=spec, per_chunk=4)
    assert k3["tpot_ms_p50"] == pytest.approx(9 * 5.0 / 39) and unresolved_latency(k3) is None
    base = run("even", "even", per_chunk=4)
    assert math.isnan(base["tpot_ms_p50"]) and base["windows_coalesced"] == 2
    # counters that do not say (an older record): only arrival times tell steps apart
    assert run("even", counters={}, per_chunk=4)["latency_not_measured"] is None


def test_completions_of_one_request_are_streams_of_their_own():
    """With n > 1 each step gives every completion its tokens at once: the client records each chunk's
    completion index (autotune.run.replay), and arrivals are told apart per completion."""
    import asyncio

    from autotune.run.replay import _one
    from autotune.run.served_engine import Delta

    class TwoCompletions:  # a stand-in engine: each step streams both completions' tokens back to back
        async def stream(self, prompt: str, sampling: dict[str, Any], rid: str) -> Any:
            for step in range(5):
                await asyncio.sleep(0.002)
                for index in (0, 1):
                    yield Delta(token_ids=[step], text="x", finished=step == 4, index=index,
                                finish_reason="length" if step == 4 else None)

    rec = asyncio.run(_one(TwoCompletions(), {"id": "a", "sampling": {"n": 2}}, "p"))
    assert [len(c) for c in rec["chunks"]] == [2, 3] * 5 and all(c[2] == 1 for c in rec["chunks"][1::2])
    assert rec["token_ids"] == [0, 1, 2, 3, 4]
    # hand-made: both completions' chunks 1 us apart at each 5 ms step
    chunks = [[0.01 + 0.005 * s + 1e-6 * i, 1, *([i] if i else [])] for s in range(20) for i in (0, 1)]
    both = [{**request(0, 0.0, [0.1], [1]), "chunks": chunks}]
    assert stream_coalesced(both, step=1) is None
    assert stream_coalesced([{**both[0], "chunks": [c[:2] for c in chunks]}], step=1)  # one stream: half unstepped


def test_a_run_keeps_the_windows_that_timed_tokens_and_pooling_re_derives_it():
    part = run("even", "bursty", "even")
    assert part["tpot_ms_p50"] == pytest.approx(5.0) and part["windows_coalesced"] == 1
    assert part["latency_not_measured"] is None and unresolved_latency(part) is None
    pooled = pool(run("bursty", "bursty"), run("even", "even"))
    assert pooled["tpot_ms_p50"] == pytest.approx(5.0) and pooled["windows_coalesced"] == 2
    assert pooled["latency_not_measured"] is None
    both = pool(run("bursty", "bursty"), run("bursty"))
    assert math.isnan(both["tpot_ms_p50"]) and "3 of 3 windows" in unresolved_latency(both)
    from autotune.measure.metrics import not_measured

    assert not_measured({**both, "tpot_ms_p50": None}) == both["latency_not_measured"]  # as best.json holds it


def test_a_load_level_reports_its_own_bursts():
    from autotune.measure.metrics import at_level

    m = run("even", "even")
    m.update(at_level(run("bursty", "bursty"), "concurrency=8"))
    assert m["tpot_ms_p50"] == pytest.approx(5.0) and math.isnan(m["tpot_ms_p50@concurrency=8"])
    assert unresolved_latency(m) == ("TPOT, ITL not measured: tokens reached the client in bursts "
                                     "(2 of 2 windows at concurrency=8)")


def test_an_slo_and_an_objective_on_tpot_leave_out_what_was_not_measured():
    (slo,) = parse_slos("tpot_ms_p50<=4")
    even, bursty = run("even"), run("bursty")
    assert slo.violation(even["tpot_ms_p50"]) > 0  # 5 ms misses 4 ms: measured, judged
    assert slo.violation(bursty["tpot_ms_p50"]) == 0.0  # not measured: neither met by a number nor missed
    # goodput: a request's TPOT bound applies only where the window timed tokens
    assert goodput(window("even")["requests"], (slo,), step=1) == 0.0
    assert goodput(window("bursty")["requests"], (slo,), step=1) == 1.0
    (e2e,) = parse_slos("e2e_ms_p50<=100")  # E2E is timed either way: 215 ms misses it in both
    assert goodput(window("bursty")["requests"], (e2e,)) == 0.0
    names = ("output_tok_s", "tpot_ms_p50", "e2e_ms_p50")
    values, left_out = objective_values(bursty, names)
    assert left_out == ["tpot_ms_p50"] and values[1] == math.inf and values[0] == bursty["output_tok_s"]
    values, left_out = objective_values(even, names)
    assert left_out == [] and values[1] == pytest.approx(5.0)


def test_the_fake_engines_windows_keep_their_tpot_and_lose_it_when_delivered_in_bursts():
    """The FAKE engine streams one step a chunk (1 + k tokens in a speculative one): measured; the same
    windows with every request's chunks after the first read at one instant: not measured."""
    import fake_engine

    reqs = [{"id": f"q{i}", "sampling": {"max_tokens": 24, "temperature": 0.0}, "expect": None, "prompt": "x"}
            for i in range(6)]
    replay = {"load": {"kind": "concurrency", "concurrency": 1, "label": "concurrency=1"}, "extra_loads": [],
              "repeats": 2, "max_repeats": 2, "warmup": 0, "samples": 0, "sample_tokens": 8}
    for kw in ({"model": "m"}, {"model": "m", "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}}):
        raw = fake_engine.run_job({"engine_kwargs": kw, "requests": reqs, "replay": replay, "engine_module": "fake"},
                                  lambda *a: None)
        m = measure_run(raw)
        assert math.isfinite(m["tpot_ms_p50"]) and m["tpot_ms_p50"] > 1.0 and unresolved_latency(m) is None, kw
        for w in raw["windows"]:
            for r in w["requests"]:
                last = r["chunks"][-1][0]
                for j, c in enumerate(r["chunks"][1:]):
                    c[0] = last + j * 1e-6
        assert math.isnan(measure_run(raw)["tpot_ms_p50"]) and unresolved_latency(measure_run(raw)), kw


# --- the gate: the production study and holdout, the windows hand-made ----------------------------------


def _run_one(kind: str, speedups: dict[int, float]) -> Any:
    """autotune.study.record.run_one's stand-in: an instance's two windows built as ``window`` builds
    them at the config's speed (streamed ``kind``), measured by measure_run and told to Optuna with
    objective_values (what the study tells for objectives a run did not measure)."""
    rng, slot = random.Random(0), iter(range(10_000))

    def run_one(study: optuna.Study, view: Any, trial: optuna.Trial, cand: Any, workload: Any, space: Any,
                cfg: Any, progress: Any, is_base: bool, *, env: dict[str, str], stop: Any) -> None:
        from sim_study import record_correct

        next(slot)
        depth = int(cand.params.get("num_speculative_tokens") or 0)
        speed = 1.0 if cand.params.get("method") in (None, "none") else speedups[depth]
        m = measure_run({"windows": [window(kind, step_s=0.005 / (speed * rng.uniform(0.97, 1.03)))
                                     for _ in range(2)]})
        m["output_tok_s_rounds"] = [trial.user_attrs.get(attrs.ROUND)]
        record_correct(study, view, trial, m, lambda m: objective_values(m, cfg.objectives)[0])

    return run_one


def _gated_study(kind: str, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], Any, Any]:
    """A study with objectives output_tok_s and tpot_ms_p50, the choice planted on ngram k=1 and a warm
    start's deployed ngram k=2 measured beside it in the holdout; its best.json, check's verdict and
    trials.csv's rows as write_results writes them."""
    from pathlib import Path
    import tempfile

    from sim_study import SPACE, WORKLOAD, _planted

    from autotune.core.space import load_space
    from autotune.core.study_report import clean
    from autotune.core.workload import load_workload
    from autotune.gate.check import compare
    from autotune.measure.config import Settings, StudyConfig
    from autotune.results.files import _latency_column, study_report
    from autotune.study import loop, opening, remeasure
    from autotune.study.loop import run_study
    from autotune.study.pareto import trials_frame
    from autotune.study.view import StudyView

    objectives = ("output_tok_s", "tpot_ms_p50")
    monkeypatch.setattr(loop, "run_one", _run_one(kind, {1: 2.0, 2: 2.2, 3: 1.5, 4: 1.4, 5: 1.3}))
    monkeypatch.setattr(opening, "open_storage", lambda url: optuna.storages.InMemoryStorage())
    monkeypatch.setattr(loop, "selection_step", _planted(1))
    monkeypatch.setattr(remeasure, "selection_step", _planted(1))
    cfg = StudyConfig(name=f"latency-{kind}", results_dir=Path(tempfile.gettempdir()) / "autotune-latency",
                      settings=Settings(model="fake-model"), objectives=objectives, n_trials=6, strategy="grid",
                      remeasure=True, pairs=4, gate_tolerance=0.05, engine_module="fake_engine", samples=0, seed=0)
    study = run_study(cfg, load_workload(str(WORKLOAD)), load_space(str(SPACE), platform="cpu", models=set()),
                      deployed={"method": "ngram", "num_speculative_tokens": 2})
    view = StudyView.of(study)
    frame = trials_frame(view)
    _latency_column(view, frame)
    rep = clean(study_report(view, frame, settings=Settings(model="fake-model"),
                             platform={"platform": "cpu"}, objectives=list(objectives), storage_url="memory"))
    old = {"best": {"label": "ngram k=2", "candidate": {"method": "ngram", "num_speculative_tokens": 2}, "trial": 0,
                    "verdict": {"passed": True}, "speedup": {"output_tok_s": 2.2}, "measurement": {}},
           "objectives": list(objectives)}
    return rep, compare(rep, old, tolerance=0.05), frame


def test_tpot_not_measured_is_left_out_of_the_gate(monkeypatch):
    rep, r, frame = _gated_study("bursty", monkeypatch)
    assert rep["best"]["label"] == "ngram k=1" and unresolved_latency(rep["best"]["measurement"])
    assert rep["gate"]["objectives"]["tpot_ms_p50"]["ratio"] is None
    assert rep["gate"]["objectives"]["tpot_ms_p50"]["pairs"] == 0
    assert [c.name for c in r.objectives] == ["output_tok_s"]  # the gate compared throughput alone
    assert "tpot_ms_p50: not measured on both sides, not compared" in r.notes
    assert not any("tpot" in x for x in (*r.reasons, *r.undecided))
    # trials.csv: TPOT's cells empty, and a column that says why
    # (a record of the baseline's own config reads 1 there by definition: autotune.study.pareto.unit_speedup)
    assert frame["tpot_ms_p50"].isna().all()
    assert frame.loc[frame["param_method"] != "none", "speedup_tpot_ms_p50"].isna().all()
    assert all(x.startswith("TPOT, ITL not measured: tokens reached the client in bursts")
               for x in frame["latency_not_measured"])


def test_evenly_spaced_tokens_keep_tpot_in_the_gate(monkeypatch):
    rep, r, frame = _gated_study("even", monkeypatch)
    g = rep["gate"]["objectives"]["tpot_ms_p50"]
    assert g["pairs"] >= 2 and g["ratio"] == pytest.approx(2.0 / 2.2, rel=0.1)
    assert [c.name for c in r.objectives] == ["output_tok_s", "tpot_ms_p50"]
    assert not any("tpot" in x for x in r.notes)
    assert frame["tpot_ms_p50"].notna().all() and frame["latency_not_measured"].isna().all()


def test_confirms_bench_results_are_judged_by_the_same_rule():
    """`vllm bench serve` keeps each request's TTFT and gaps between chunks with --save-detailed (which the
    client plan asks for): read back as request records, a result whose chunks came 5 us apart is
    coalesced, one whose chunks came 5 ms apart is not; a result without them cannot be judged (None)."""
    from autotune.core.workload import Request
    from autotune.serve.bench_client import bench_requests, client_plan

    plan = client_plan([Request(id="a", prompt="p", max_tokens=8)], load="concurrency=1", render=None)
    assert "--save-detailed" in plan.flags

    def result(gap: float) -> dict[str, Any]:
        return {"ttfts": [0.02] * 4, "itls": [[gap] * 39] * 4, "output_lens": [40] * 4, "errors": [""] * 4}

    assert stream_coalesced(bench_requests(result(5e-6))) and stream_coalesced(bench_requests(result(0.005))) is None
    even = bench_requests(result(0.005))
    assert measure_run({"windows": [{"window_s": 1.0, "requests": even, "spec_counters": {}}]})["tpot_ms_p50"] \
        == pytest.approx(5.0)
    assert bench_requests({"completed": 4, "median_tpot_ms": 0.01}) is None
