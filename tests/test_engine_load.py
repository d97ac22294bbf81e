"""Load patterns on the real vLLM CPU engine: each does what it says.

One engine serves both patterns, as a study's trial serves its extra levels: replay is the trial's
own load and concurrency=2 an extra level measured after it.
"""

from __future__ import annotations

import pytest

from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.measure.config import StudyConfig
from autotune.run.evaluate import trial_job
from autotune.core.load import LoadPattern
from autotune.run.worker import run_trial
from autotune.core.workload import Request, Workload, load_workload

pytestmark = pytest.mark.engine
OFFSETS = [0.0, 0.4, 1.5, 1.6]
CLOSED = LoadPattern("concurrency", concurrency=2)


@pytest.fixture(scope="module")
def trial(tmp_path_factory, engine_launcher):
    """(requests, the raw run) of one served engine."""
    tmp = tmp_path_factory.mktemp("load")
    base = load_workload("examples/smoke.jsonl").requests[:4]
    reqs = tuple(Request(id=r.id, prompt=r.prompt, max_tokens=8, arrival_s=10 + o) for r, o in zip(base, OFFSETS))
    cfg = StudyConfig(name="load", results_dir=tmp, load=LoadPattern("replay"), extra_loads=(CLOSED,), repeats=1,
                      warmup=1, settings=Settings(model=str(demo.TARGET), dtype=demo.DTYPE,
                                                  max_model_len=demo.MAX_MODEL_LEN, kv_cache_memory_bytes=demo.KV_CACHE_BYTES))
    out = run_trial(trial_job(Candidate({"method": "none", "enforce_eager": True}), Workload("replay", reqs), cfg),
                    tmp / "trial", timeout_s=600)
    assert out.raw is not None, out.failure
    return reqs, out.raw


@pytest.fixture(scope="module")
def run(trial):
    """(requests, replay window's records, concurrency=2 window's records) from one engine."""
    reqs, raw = trial
    return reqs, raw["windows"][0]["requests"], raw["levels"][CLOSED.label][0]["requests"]


def test_the_trial_records_the_model_runner_its_server_ran(trial):
    """Read from the engine's own config (an in-process trial), not predicted: the runner vLLM chose
    here (V1 on the CPU build, which has no Triton; V2 on a GPU), as autotune.core.runner expects it.
    A served trial's is read from its server's log (tests/test_engine_suffix.py)."""
    import os

    from autotune.core import runner
    from autotune.run import hardware

    _, raw = trial
    want, _ = runner.expected(None, triton=runner.has_triton(hardware.detect()), env=os.environ)
    assert raw["model_runner"] == want
    assert raw["model_runner_from"] == "the engine's config (VllmConfig.use_v2_model_runner)"


def _max_in_flight(recs):
    events = sorted([(r["start"], 1) for r in recs] + [(r["end"], -1) for r in recs], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_closed_loop_never_exceeds_its_concurrency_and_uses_it(run):
    reqs, _, closed = run
    assert len(closed) == len(reqs)
    assert _max_in_flight(closed) == 2


def test_replay_sends_each_request_at_its_offset(run):
    reqs, replayed, _ = run
    recs = {r["id"]: r for r in replayed}
    for r, o in zip(reqs, OFFSETS):
        assert o - 0.001 <= recs[r.id]["start"] <= o + 0.25, (r.id, recs[r.id]["start"], o)
