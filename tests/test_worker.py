"""The worker process (autotune.run.worker): failure reasons, and a worker's whole process group ended."""

import os
import signal
import sys
import time

from autotune.run.worker import failure_reason, run_trial


def test_failure_reason_keeps_the_telling_lines():
    e = ValueError("1 validation error for VllmConfig\n  Value error, torch.float32 is not supported for "
                   "quantization method fp8. [type=value_error, input_value=ArgsKwargs(...)]\n"
                   "    For further information visit https://errors.pydantic.dev/2/v/value_error")
    assert failure_reason(e) == ("ValueError: 1 validation error for VllmConfig | Value error, torch.float32 is "
                                 "not supported for quantization method fp8.")
    assert failure_reason(RuntimeError("")) == "RuntimeError: "
    assert len(failure_reason(RuntimeError("x" * 5000))) == 600


def test_a_known_vllm_fault_in_the_worker_log_is_explained(tmp_path):
    from autotune.run.worker import explain

    log = tmp_path / "worker.log"
    log.write_text("...\n  File \"gpu_model_runner.py\", line 3502\n    gen.set_offset(gen.get_offset() - 4)\n"
                   "RuntimeError: CPU Generator does not use offset\n")
    why = explain(log)
    assert why.startswith("; cause: vLLM's CPU model runner cannot rewind a seeded request's generator")
    assert "give the sampled requests no seed" in why and "\n" not in why
    log.write_text("RuntimeError: something else\n")
    assert explain(log) == "" and explain(tmp_path / "missing.log") == "" and explain(None) == ""


# A job that hangs after starting a child of its own, as vLLM starts its engine core: the child
# stays in the worker's process group (the worker leads it: it starts in its own session).
HANG_WITH_A_CHILD = '''
import os
import subprocess
import sys
import time
from pathlib import Path


def run_job(job, phase):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    Path(job["pids"]).write_text(f"{child.pid} {os.getpgid(child.pid)}")
    time.sleep(3600)
'''


def _group_gone(pgid, timeout_s):
    """True once no process of group ``pgid`` is left (within ``timeout_s``: the dead are reaped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _hang(tmp_path, monkeypatch, name, source):
    """Run a worker whose job is ``source`` (module ``name``) into a 5 s timeout; the outcome and the
    file where the job wrote its pids."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    pids = tmp_path / "pids"
    job = {"engine_kwargs": {"model": "m"}, "requests": [], "replay": {"load": {"kind": "batch"}},
           "engine_module": name, "pids": str(pids)}
    return run_trial(job, tmp_path / "t", timeout_s=5, python=sys.executable), pids


def test_worker_timeout_ends_the_whole_process_group(tmp_path, monkeypatch):
    out, pids = _hang(tmp_path, monkeypatch, "hang_with_a_child", HANG_WITH_A_CHILD)
    try:
        assert out.raw is None and out.failure.startswith("timeout") and 5 <= out.wall_s < 30
        child, group = map(int, pids.read_text().split())
        assert group == out.pid  # the worker led the group, and its child was in it
        assert _group_gone(out.pid, 10), f"process group {out.pid} outlived the worker's timeout (child {child})"
    finally:  # a broken _end_group leaves the child behind: never leave it running
        try:
            os.killpg(out.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# A job that starts a "server" in a session of its own, as the served instrument starts `vllm serve`
# (autotune.run.served_engine), records its group where the parent looks for it, and hangs.
HANG_WITH_A_SERVER = '''
import subprocess
import sys
import time
from pathlib import Path


def run_job(job, phase):
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
    (Path(job["workdir"]) / "server.pgid").write_text(str(server.pid))
    Path(job["pids"]).write_text(str(server.pid))
    time.sleep(3600)
'''


def test_worker_timeout_ends_a_served_trials_server_in_its_own_session(tmp_path, monkeypatch):
    out, pids = _hang(tmp_path, monkeypatch, "hang_with_a_server", HANG_WITH_A_SERVER)
    server = int(pids.read_text())
    try:
        assert out.failure.startswith("timeout") and server != out.pid  # a group apart from the worker's
        assert _group_gone(server, 15), f"the server's group {server} outlived the worker's timeout"
        assert not (tmp_path / "t" / "server.pgid").exists()  # never signalled again: ids are reused
    finally:
        try:
            os.killpg(server, signal.SIGKILL)
        except ProcessLookupError:
            pass


PHASED = '''
import time


def run_job(job, phase):
    phase("engine", {})
    time.sleep(0.3)
    phase("score", {"total": 1})
    time.sleep(0.6)
    return {"windows": []}
'''


def test_each_phase_event_carries_the_workers_clock_and_the_last_phase_ends(tmp_path, monkeypatch):
    """events.jsonl says where a trial's time went: every event is stamped (seconds since the worker
    started) and a "done" event closes the last phase (benchmarks/scoring_cost.py times the scoring
    pass this way)."""
    import json

    (tmp_path / "phased.py").write_text(PHASED)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    job = {"engine_kwargs": {"model": "m"}, "requests": [], "replay": {"load": {"kind": "batch"}},
           "engine_module": "phased"}
    out = run_trial(job, tmp_path / "t", timeout_s=30, python=sys.executable)
    assert out.failure is None, out.failure
    events = [json.loads(x) for x in (tmp_path / "t" / "events.jsonl").read_text().splitlines()]
    assert [e["phase"] for e in events] == ["engine", "score", "done"]
    t = [e["t"] for e in events]
    assert t == sorted(t) and 0.25 <= t[1] - t[0] < 3 and 0.5 <= t[2] - t[1] < 3, t
