"""Load patterns on the real vLLM CPU engine: each does what it says."""

from __future__ import annotations

import pytest

from autotune import demo
from autotune.candidate import Candidate, Settings
from autotune.load import LoadPattern
from autotune.config import StudyConfig
from autotune.evaluate import trial_job
from autotune.worker import run_trial
from autotune.workload import Request, Workload, load_workload

pytestmark = pytest.mark.engine


def _run(tmp_path, wl, load):
    cfg = StudyConfig(name="load", results_dir=tmp_path, load=load, repeats=1, warmup=1,
                      settings=Settings(model=str(demo.TARGET), dtype=demo.DTYPE, max_model_len=demo.MAX_MODEL_LEN,
                                        gpu_memory_utilization=0.3))
    out = run_trial(trial_job(Candidate({"method": "none", "enforce_eager": True}), wl, cfg), tmp_path / load.kind,
                    timeout_s=600)
    assert out.raw is not None, out.failure
    return out.raw["windows"][0]["requests"]


def _max_in_flight(recs):
    events = sorted([(r["start"], 1) for r in recs] + [(r["end"], -1) for r in recs], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_closed_loop_never_exceeds_its_concurrency_and_uses_it(tmp_path):
    wl = load_workload("examples/json_edit.jsonl")
    wl = Workload(wl.path, wl.requests[:8])
    recs = _run(tmp_path, wl, LoadPattern("concurrency", concurrency=2))
    assert _max_in_flight(recs) == 2


def test_replay_sends_each_request_at_its_offset(tmp_path):
    base = load_workload("examples/smoke.jsonl").requests[:4]
    offsets = [0.0, 0.4, 1.5, 1.6]
    reqs = tuple(Request(id=r.id, prompt=r.prompt, max_tokens=8, arrival_s=10 + o) for r, o in zip(base, offsets))
    recs = {r["id"]: r for r in _run(tmp_path, Workload("replay", reqs), LoadPattern("replay"))}
    for r, o in zip(reqs, offsets):
        assert o - 0.001 <= recs[r.id]["start"] <= o + 0.25, (r.id, recs[r.id]["start"], o)
