"""Every job kind through the real worker as CUDA runs it (issue 59, rule 2 of DESIGN.md's platform).

No GPU is at hand: the parent process is told the platform is CUDA (``autotune.run.hardware.detect``)
and NVML is FAKED (tests/test_gpu_memory.py's FakeNVML, recording which devices each read asked
for). Everything else is the real code: the study's trials, the unspeculated reference of a lossy
config, the holdout's rounds, the EAGLE-3 trace and confirm's servers all go through the real
worker (``autotune.run.worker.run_trial`` / ``_run_process``) or confirm's real round, each of which
on CUDA first waits for its devices' memory. What the child processes run is the FAKE engine
(tests/fake_engine.py), the real EAGLE-3 trace on CPU (its job's device rewritten from ``cuda`` to
``cpu`` in the parent, after the study built it) and confirm's FAKE launcher (tests/test_confirm.py).

What failed here before (issue 59): the EAGLE-3 trace died on every CUDA run ("KeyError:
'engine_kwargs'": its job has no engine), the wait covered the tensor-parallel devices only (the
preflight counts tensor x pipeline x data parallel), and confirm started each server without waiting
for the previous one's memory.
"""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import demo
from autotune.cli.app import app
from autotune.core import attrs
from autotune.run import gpu_memory, hardware
from autotune.run.gpu_memory import GIB
from test_confirm import fake, stand_in_launcher, write_results  # noqa: F401 - fixtures
from test_gpu_memory import FakeNVML

runner = CliRunner()


class Recording(FakeNVML):
    """FakeNVML that records each read as the tuple of device handles it asked for, and, where
    ``short_reads`` is set, answers the first that many reads with a device still held."""

    def __init__(self, *devices, short_reads: int = 0):
        super().__init__(*devices)
        self.asked: list[tuple[int, ...]] = []
        self._now: list[int] = []
        self.short_reads = short_reads

    def nvmlInit(self):
        super().nvmlInit()
        self._now = []

    def nvmlShutdown(self):
        super().nvmlShutdown()
        self.asked.append(tuple(self._now))

    def nvmlDeviceGetMemoryInfo(self, h):
        self._now.append(h)
        got = super().nvmlDeviceGetMemoryInfo(h)
        if len(self.asked) < self.short_reads:
            return types.SimpleNamespace(total=got.total, free=GIB, used=got.total - GIB)
        return got


@pytest.fixture
def cuda(monkeypatch):
    """The parent on a faked CUDA host of four 80-GiB GPUs with 60 GiB free each: an engine at
    gpu_memory_utilization 0.6 fits, one at vLLM's default 0.92 does not (so a wait that forgets the
    study's utilization fails). Returns the recording NVML."""
    nv = Recording(*[(80, 60, [])] * 4)
    monkeypatch.setattr(hardware, "detect", lambda: "cuda")
    monkeypatch.setattr(gpu_memory, "_nvml", lambda: nv)
    monkeypatch.setattr(gpu_memory, "RELEASE_TIMEOUT_S", 3.0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return nv


SPACE = """name: cuda-jobs
baseline: {method: none, kv_cache_dtype: auto}
params:
  method: {choices: [none, ngram]}
  num_speculative_tokens: {int: [2, 3], when: {method: [ngram]}}
  kv_cache_dtype: {choices: [auto, fp8]}
"""


def test_a_studys_every_worker_waits_for_every_device_of_its_engine(tmp_path, monkeypatch, cuda, fake_engine_env):
    """A study on the faked CUDA host, its engines at tensor parallel 2 x pipeline parallel 2 (the
    user's flags): the preflight and every worker (the baseline, the candidates, a lossy config's
    unspeculated reference, the holdout's rounds) read all four devices of its engine, at the
    study's utilization, before it starts; nothing failed for memory."""
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--model", "fake-model", "--space", str(space),
                            "--results", str(tmp_path / "results"), "--study", "s", "--samples", "0", "--repeats", "1",
                            "--max-repeats", "0", "--no-launcher", "--candidates", "3", "--pairs", "2",
                            "--gpu-memory-utilization", "0.6",
                            "--try", '{"method": "ngram", "num_speculative_tokens": 3, "kv_cache_dtype": "fp8"}',
                            "--", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "results" / "s"
    jobs = sorted(out.rglob("job.json"))
    kinds = {"unspeculated" if p.parent.name == "unspeculated" else "trial" for p in jobs}
    assert kinds == {"trial", "unspeculated"}, jobs  # a lossy config's reference ran too
    report = json.loads((out / "best.json").read_text())
    assert (report.get("figure") or {}).get("pairs") or report.get("gate"), "no holdout rounds ran"
    # one read for the preflight, then one for each worker, each over the engine's four devices
    assert len(cuda.asked) == 1 + len(jobs), (cuda.asked, jobs)
    assert set(cuda.asked) == {(0, 1, 2, 3)}, cuda.asked
    assert "GPU memory not released" not in (out / "trials.csv").read_text()


@pytest.mark.skipif(not demo.eagle3_available(), reason="no shipped head")
@pytest.mark.parametrize("head_as", ["folder", "hub id"])
def test_the_eagle3_trace_runs_through_the_worker_on_cuda(tmp_path, monkeypatch, cuda, head_as):
    """The study's EAGLE-3 trace on a GPU is a worker job (autotune.study.head_trace._on_device): it
    goes through the real worker, which waits for the memory of the engine's devices at the study's
    utilization before it starts, and returns what the in-process trace gives. Before issue 59 the
    worker read the job's engine arguments, which a trace has none of: "eagle3 trace failed:
    KeyError: 'engine_kwargs'" on every CUDA run. A head named by a hub id that autotune fetched into
    the user's --download-dir reaches the worker as that folder (the worker's default cache lacks it)."""
    from optuna.trial import TrialState

    from autotune.core.candidate import Settings
    from autotune.core.space import load_space
    from autotune.forecast import eagle3_trace
    from autotune.study import head_trace
    from autotune.study.view import StudyView

    pairs = [([5, 17, 33, 41, 9, 12, 60, 61], [70, 71, 72, 73, 74, 75, 2]), ([8, 9, 10, 11], [12, 13, 14, 15, 16])]
    outputs = [{"id": f"r{i}", "prompt_token_ids": p, "token_ids": o} for i, (p, o) in enumerate(pairs)]
    base = types.SimpleNamespace(number=0, datetime_start="t", state=TrialState.COMPLETE,
                                 user_attrs={attrs.OUTPUTS: outputs, attrs.ROLE: attrs.BASELINE})
    study = types.SimpleNamespace(study_name="g", user_attrs={}, directions=[],
                                  get_trials=lambda deepcopy=False: [base])
    study.set_user_attr = study.user_attrs.__setitem__
    built = eagle3_trace.job

    def on_this_cpu(*args, **kwargs):  # the job as the study builds it for the GPU, run here on CPU
        j = built(*args, **kwargs)
        assert j["eagle3_trace"]["device"] == "cuda"
        return {**j, "eagle3_trace": {**j["eagle3_trace"], "device": "cpu", "dtype": "float32"}}

    monkeypatch.setattr(eagle3_trace, "job", on_this_cpu)
    head = str(demo.EAGLE3)
    if head_as == "hub id":  # as autotune.run.model_fetch leaves it after fetching into a download dir
        from autotune.core import snapshots

        head = "acme/eagle3-head-for-the-demo"
        fetched = shutil.copytree(demo.EAGLE3, tmp_path / "downloads" / "snapshot")
        monkeypatch.setattr(snapshots, "_fetched", {head: Path(fetched)})
    space = load_space("quick", platform="cuda", models={"eagle3_head"})
    settings = Settings(model=str(demo.TARGET), eagle3_head=head, gpu_memory_utilization=0.6,
                        serve_flags={"tensor_parallel_size": 2})
    cfg = types.SimpleNamespace(settings=settings, results_dir=tmp_path, trial_timeout_s=120)
    line = head_trace.ensure_eagle3_trace(study, StudyView.of(study), space, cfg, env={})
    assert line is None, line
    kept = study.user_attrs[attrs.EAGLE3_TRACE]
    assert kept["device"] == "cuda"
    want = eagle3_trace.trace(pairs, depth=kept["depth"], head_dir=demo.EAGLE3)
    assert [kept["traces"][o["id"]] for o in outputs] == want
    job = json.loads((tmp_path / "eagle3-trace" / "job.json").read_text())
    assert job["gpu_memory"] == {"utilization": 0.6, "devices": 2} and "engine_kwargs" not in job
    assert Path(job["eagle3_trace"]["head"]).is_dir()  # a folder, never a hub id the worker would look up
    # where() read one device's size for the fit check; the worker's wait read both of the engine's
    assert cuda.asked[-1] == (0, 1), cuda.asked


def _cuda_results(tmp_path: Path) -> Path:
    """tests/test_confirm.py's results folder as a CUDA study leaves it (serve.sh for the vllm build)."""
    from autotune.serve.export import serve_script

    d = write_results(tmp_path / "study")
    report = json.loads((d / "best.json").read_text())
    report["platform"] = {"platform": "cuda"}
    for side in ("baseline", "best"):
        report[side]["engine_kwargs"].update(gpu_memory_utilization=0.6, tensor_parallel_size=2)
    (d / "best.json").write_text(json.dumps(report))
    (d / "serve.sh").write_text(serve_script(report["best"]["engine_kwargs"], platform="cuda"))
    return d


def test_confirm_waits_for_each_servers_memory_on_cuda(tmp_path, cuda, fake, stand_in_launcher):  # noqa: F811
    """Each of confirm's servers starts only once its devices have the memory it asks for (the other
    side's server, ended a moment ago, may still hold it): one wait per server, over its two
    tensor-parallel devices, at the served config's utilization; the first reads find a device held."""
    from autotune.gate import confirm as c

    d = _cuda_results(tmp_path)
    cuda.short_reads = 2
    served = c.confirm(d, rounds=1, warmups=0, python=fake.python)
    assert served["order"] == ["baseline", "pick"] and served["speedup"] == pytest.approx(1.5)
    assert cuda.asked == [(0, 1)] * 4, cuda.asked  # the baseline's wait read twice short, then fit; the pick's once
    assert len([x for x in fake.calls() if x[0] == "serve"]) == 2


def test_confirm_on_cuda_fails_its_round_in_one_line_when_the_memory_stays_held(tmp_path, cuda, fake,
                                                                                 stand_in_launcher):  # noqa: F811
    from autotune.gate import confirm as c
    from autotune.serve.servers import ServeFailed

    d = _cuda_results(tmp_path)
    cuda.short_reads = 10 ** 6
    with pytest.raises(ServeFailed, match=r"the baseline server \(confirm/baseline.sh, round 1\) was not started: "
                                          r"GPU memory not released within 3s: GPU 0 has 1.0 of 80.0 GiB free"):
        c.confirm(d, rounds=1, warmups=0, python=fake.python)
    assert not [x for x in fake.calls() if x[0] == "serve"]  # no server was started
    assert "was not started" in json.loads((d / "best.json").read_text())["best"]["served"]["failure"]
