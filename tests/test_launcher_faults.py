"""The launcher's defects of issue 42, each planted: a reused pid, the launcher killed while its
children run (a study's worker, confirm's client), SIGINT/SIGTERM to a forked trial's group, and
the launcher's own LD_PRELOAD. A forked process must look to autotune as a fresh one would.
No engine: trial workers run small job modules (tests/test_launcher.py's ``jobs``)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from autotune.run import launcher
from autotune.serve.servers import finish_client
from test_launcher import _job, _launcher_pid, jobs  # noqa: F401  (the fixture)

WORKER = [sys.executable, "-m", "autotune.run.worker"]

# Waits for a file to appear, then leaves: a trial that ends when the test says so.
GATED = '''
import os
import time


def run_job(job, phase):
    phase("engine", {})
    while not os.path.exists(job["gate"]):
        time.sleep(0.05)
    return {"windows": []}
'''


def _start(d, job, env=None, fresh=False):
    d.mkdir(parents=True, exist_ok=True)
    (d / "job.json").write_text(json.dumps(job))
    argv = [*WORKER, str(d / "job.json"), str(d / "result.json"), str(d / "events.jsonl")]
    env = {**os.environ, **(env or {})}
    if fresh:
        with open(d / "worker.log", "a") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                    stdin=subprocess.DEVNULL)
    else:
        proc = launcher.launch(argv, env=env, log_path=d / "worker.log")
    _started.append(proc.pid)
    return proc


def _until(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _group_gone(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


_started: list[int] = []  # process groups a test started: ended at its teardown, whatever it asserted


@pytest.fixture
def gated(jobs):
    (jobs / "gated.py").write_text(GATED)
    yield jobs
    while _started:
        try:
            os.killpg(_started.pop(), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_status_left_under_a_reused_pid_is_not_the_new_childs(gated):
    """pids wrap: a status an earlier child left under this pid's name must not be read as this one's."""
    with launcher.active() as sock:
        proc = _start(gated / "t", {**_job("gated"), "gate": str(gated / "open")})
        assert isinstance(proc, launcher.Launched)
        planted = os.path.join(os.path.dirname(sock), f"{proc.pid}.exit")  # where an old child's status was kept
        with open(planted, "w") as f:
            f.write("0")
        time.sleep(0.5)
        assert proc.poll() is None  # still running
        (gated / "open").touch()
        assert proc.wait(timeout=30) == 0


def test_a_dead_launchers_children_keep_their_true_exit_or_say_it_is_unknown(gated):
    with launcher.active() as sock:
        done = _start(gated / "done", {**_job("gated"), "gate": str(gated / "open")})
        killed = _start(gated / "killed", {**_job("gated"), "gate": str(gated / "never")})
        _until(lambda: (gated / "killed" / "events.jsonl").exists() and (gated / "done" / "events.jsonl").exists())
        os.kill(_launcher_pid(sock), signal.SIGKILL)  # the launcher dies mid-study
        (gated / "open").touch()
        assert done.wait(timeout=30) == 0 and done.exit_known  # the worker's own status, not a made-up SIGKILL
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
        assert not killed.exit_known and launcher.describe_exit(killed).startswith("exit status unknown")
        assert launcher.describe_exit(done) == "exit code 0"


def test_confirm_does_not_fail_a_client_that_succeeded_after_the_launcher_died(gated):
    """`autotune confirm`: a `vllm bench serve` that exits 0 after the launcher died is no ServeFailed."""
    with launcher.active() as sock:
        client = _start(gated / "c", {**_job("gated"), "gate": str(gated / "open")})
        _until(lambda: (gated / "c" / "events.jsonl").exists())
        os.kill(_launcher_pid(sock), signal.SIGKILL)
        (gated / "open").touch()
        finish_client(client, log_path=gated / "c" / "worker.log", timeout_s=30)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_a_forked_trials_group_ends_it_as_it_ends_a_fresh_one(gated, sig):
    """Same exit code, same files, nothing left: a fresh Python turns SIGINT into KeyboardInterrupt
    (the worker writes its error), and dies of SIGTERM."""
    if sig == signal.SIGINT and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        pytest.skip("SIGINT is ignored here, so in every Python this starts (a background job of a non-interactive "
                    "shell, `cmd &`): run the suite in the foreground")
    seen = {}
    with launcher.active():
        for how in ("fresh", "forked"):
            d = gated / how
            proc = _start(d, {**_job("gated"), "gate": str(gated / "never")}, fresh=how == "fresh")
            assert isinstance(proc, launcher.Launched) == (how == "forked")
            _until(lambda: (d / "events.jsonl").exists() and "engine" in (d / "events.jsonl").read_text())
            os.killpg(proc.pid, sig)
            code = proc.wait(timeout=30)
            _until(lambda: _group_gone(proc.pid))
            result = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else None
            seen[how] = (code, sorted(p.name for p in d.iterdir()), result)
    assert seen["forked"] == seen["fresh"], seen


def test_a_forked_workers_environment_is_a_fresh_ones_without_the_launchers_ld_preload(jobs, monkeypatch):
    """The launcher runs with vLLM's CPU LD_PRELOAD (tcmalloc, libgomp); a fresh worker or API server
    starts with the requester's, and vLLM sets its own for the engine processes it starts."""
    from autotune.run.worker import run_trial

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    if launcher._cpu_preload() is None:
        pytest.skip("no CPU preload on this platform: nothing the launcher could leak")
    fresh = run_trial(_job("who"), jobs / "fresh", timeout_s=60)
    with launcher.active() as sock:
        forked = run_trial({**_job("who"), "nested": True}, jobs / "forked", timeout_s=60)
        assert forked.raw["ppid"] == forked.raw["inner"]["ppid"] == _launcher_pid(sock)
    assert "LD_PRELOAD" not in fresh.raw["env"]
    assert "LD_PRELOAD" not in forked.raw["env"] and "LD_PRELOAD" not in forked.raw["inner"]["env"]
