"""The launcher (autotune.run.launcher): trial workers forked from one warm process, as Popen would start them.

No engine here (unmarked tests' processes cannot import vLLM: the launcher preloads what it can);
tests/test_engine_study.py runs a served study through it, and benchmarks/launcher_start.py
measures a launched server against a fresh one.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from autotune.run import launcher
from autotune.run.worker import run_trial
from autotune.serve import servers

# A job that says which process started it and what it found already imported.
WHO = '''
import os
import sys


def run_job(job, phase):
    out = {"windows": [], "ppid": os.getppid(), "pgid": os.getpgid(0), "pid": os.getpid(),
           "preloaded": "autotune.run.served_engine" in sys.modules, "env": dict(os.environ), "cwd": os.getcwd(),
           "cores": sorted(os.sched_getaffinity(0)),
           "threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None}
    if job.get("nested"):  # a process of its own, as a served trial's worker starts its `vllm serve`
        from pathlib import Path

        from autotune.run.worker import run_trial

        inner = run_trial({**job, "nested": False}, Path(job["workdir"]) / "inner", timeout_s=60)
        out["inner"] = inner.raw or {"failure": inner.failure}
    return out
'''

HANG = '''
import time


def run_job(job, phase):
    phase("engine", {})
    time.sleep(3600)
'''


@pytest.fixture
def jobs(tmp_path, monkeypatch):
    """Engine modules of these tests importable by workers (PYTHONPATH set before a launcher starts)."""
    (tmp_path / "who.py").write_text(WHO)
    (tmp_path / "hang.py").write_text(HANG)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    return tmp_path


def _job(module):
    return {"engine_kwargs": {"model": "m"}, "requests": [], "replay": {"load": {"kind": "batch"}},
            "engine_module": module}


def _launcher_pid(sock):
    return int(next(ln for ln in (open(os.path.join(os.path.dirname(sock), "launcher.log")))
                    if ln.startswith("launcher: ready")).split()[-1])


def test_a_trial_worker_is_forked_by_the_launcher_with_the_environment_it_asked_for(jobs):
    with launcher.active() as sock:
        assert sock and os.environ[launcher.ENV_KEY] == sock
        out = run_trial({**_job("who"), "nested": True}, jobs / "t", timeout_s=60,
                        env={"AUTOTUNE_FAKE_SEED": "7", "CUDA_VISIBLE_DEVICES": "1"})
        assert out.failure is None, out.failure
        raw = out.raw
        assert raw["ppid"] == _launcher_pid(sock)  # forked by the launcher, not started by this process
        # the worker's own process (a served trial's server) is forked by the launcher too, although
        # the worker's environment carries what the launcher's imports set
        assert raw["inner"].get("ppid") == _launcher_pid(sock), raw["inner"]
        assert raw["inner"]["env"]["CUDA_VISIBLE_DEVICES"] == "1" and raw["inner"]["preloaded"]
        assert raw["preloaded"]  # it found autotune's engine modules already imported
        assert raw["pgid"] == raw["pid"] == out.pid  # a session of its own, as Popen(start_new_session=True)
        assert raw["env"]["AUTOTUNE_FAKE_SEED"] == "7" and raw["env"]["CUDA_VISIBLE_DEVICES"] == "1"
        assert raw["env"]["PYTHONPATH"] == os.environ["PYTHONPATH"] and raw["cwd"] == os.getcwd()
    assert launcher.ENV_KEY not in os.environ and not os.path.exists(sock)  # ended, and its folder gone


def test_without_a_launcher_the_worker_is_started_fresh(jobs):
    out = run_trial(_job("who"), jobs / "t", timeout_s=60)
    assert out.failure is None, out.failure
    assert out.raw["ppid"] == os.getpid() and not out.raw["preloaded"]


def test_an_environment_the_launcher_has_not_read_is_started_fresh_and_said_once(jobs, capfd):
    """PYTHONPATH is read when an interpreter starts: a worker that needs another one cannot be a fork."""
    with launcher.active():
        env = {"PYTHONPATH": os.environ["PYTHONPATH"] + os.pathsep + str(jobs / "elsewhere")}
        launcher._said.clear()
        outs = [run_trial(_job("who"), jobs / f"t{i}", timeout_s=60, env=env) for i in range(2)]
    assert all(o.failure is None for o in outs), [o.failure for o in outs]
    assert all(o.raw["ppid"] == os.getpid() for o in outs)
    err = capfd.readouterr().err
    assert err.count("environment differs from the launcher's in PYTHONPATH") == 1, err


def test_a_launched_process_reports_its_exit_like_popen(jobs, tmp_path):
    """Launched.poll/wait give the exit code (a crash: 1) or minus the signal that killed it."""
    with launcher.active():
        worker = [sys.executable, "-m", "autotune.run.worker"]
        crash = launcher.launch([*worker, str(tmp_path / "missing.json"), str(tmp_path / "r"), str(tmp_path / "e")],
                                env=dict(os.environ), log_path=tmp_path / "crash.log")
        assert isinstance(crash, launcher.Launched)
        assert crash.wait(timeout=30) == 1 and crash.returncode == 1
        assert "FileNotFoundError" in (tmp_path / "crash.log").read_text()
        job = tmp_path / "job.json"
        job.write_text(json.dumps(_job("hang")))
        hung = launcher.launch([*worker, str(job), str(tmp_path / "r2"), str(tmp_path / "e2")],
                               env=dict(os.environ), log_path=tmp_path / "hang.log")
        with pytest.raises(subprocess.TimeoutExpired):
            hung.wait(timeout=1.0)
        assert hung.poll() is None
        os.killpg(hung.pid, signal.SIGKILL)
        assert hung.wait(timeout=10) == -signal.SIGKILL


def test_a_launched_workers_timeout_ends_its_whole_group(jobs):
    with launcher.active():
        out = run_trial(_job("hang"), jobs / "t", timeout_s=5)
    assert out.raw is None and out.failure.startswith("timeout"), out.failure
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(out.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.killpg(out.pid, signal.SIGKILL)
        pytest.fail(f"process group {out.pid} outlived the launched worker's timeout")


def test_the_launcher_can_be_turned_off_and_is_not_nested(jobs):
    with launcher.active(False) as off:
        assert off is None and launcher.ENV_KEY not in os.environ
    with launcher.active() as outer, launcher.active() as inner:
        assert outer and inner is None and os.environ[launcher.ENV_KEY] == outer


def test_a_held_launcher_outlives_the_block_that_started_it_and_ends_with_the_hold(jobs):
    """`search --confirm`: the study's launcher also forks confirm's servers, and is started only
    when the study starts one (a bad input before that starts none)."""
    with launcher.held():
        assert launcher.ENV_KEY not in os.environ  # the hold itself starts nothing
        with launcher.active() as sock:
            pid = _launcher_pid(sock)
        assert os.environ[launcher.ENV_KEY] == sock and servers.group_alive(pid)  # still serving
        with launcher.active() as again:
            assert again is None  # the held one is used
    assert launcher.ENV_KEY not in os.environ and not os.path.exists(sock)
    deadline = time.monotonic() + 10
    while servers.group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not servers.group_alive(pid)


def test_what_the_launchers_imports_set_may_be_passed_on_and_nothing_else_may_differ():
    """A forked worker's environment carries what the launcher's vLLM import set (LD_LIBRARY_PATH,
    TORCHINDUCTOR_CACHE_DIR, ...): its server's request must still be a fork. A variable read when an
    interpreter starts, changed, must not: a fork would not see it."""
    py = sys.executable
    before = {"PATH": "/bin", "PYTHONPATH": "/a", "LD_LIBRARY_PATH": "/x"}
    after = {**before, "LD_LIBRARY_PATH": "/x:/torch/lib", "TORCHINDUCTOR_CACHE_DIR": "/tmp/ind"}
    worker_env = {**after, "VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": "0", "AUTOTUNE_FAKE_SEED": "3"}
    assert launcher.refusal([py, "-m", launcher.SERVE], worker_env, before, after, py) is None
    assert launcher.refusal([py, "-m", launcher.WORKER], {**before, "VLLM_X": "1"}, before, after, py) is None
    why = launcher.refusal([py, "-m", launcher.SERVE], {**worker_env, "PYTHONPATH": "/b"}, before, after, py)
    assert why == "environment differs from the launcher's in PYTHONPATH"
    why = launcher.refusal([py, "-m", launcher.SERVE], {**after, "VLLM_LOGGING_LEVEL": "DEBUG"}, before, after, py)
    assert why == "environment differs from the launcher's in VLLM_LOGGING_LEVEL"  # read when vLLM is imported
    assert launcher.refusal(["/usr/bin/python3.9", "-m", launcher.SERVE], after, before, after, py).startswith(
        "another interpreter")


BIND = '''
import os, sys
from autotune.run.launcher_process import _bind_as_spawned
before = sorted(os.sched_getaffinity(0))
_bind_as_spawned()
cores = sorted(os.sched_getaffinity(0))  # before torch loads OpenMP, which would read the variables itself
import torch
print(before, "|", cores, torch.get_num_threads())
'''


@pytest.mark.parametrize("form", ["gomp", "omp", "none", "two threads"])
def test_a_forked_cpu_worker_takes_the_binding_vllm_set_for_its_start(form):
    """vLLM binds its CPU worker through OpenMP variables read when OpenMP loads (one core, one thread);
    a forked worker applies the same itself: its affinity (which its threads inherit) and one thread."""
    core = max(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env.update({"gomp": {"OMP_NUM_THREADS": "1", "GOMP_CPU_AFFINITY": str(core)},
                "omp": {"OMP_NUM_THREADS": "1", "OMP_PLACES": f"{{{core}}}", "OMP_PROC_BIND": "true"},
                "none": {},
                "two threads": {"OMP_NUM_THREADS": "2", "GOMP_CPU_AFFINITY": f"0 {core}"}}[form])
    out = subprocess.run([sys.executable, "-c", BIND], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-800:]
    before, after = out.stdout.strip().split(" | ")
    cores, threads = after.rsplit(" ", 1)
    if form in ("gomp", "omp"):
        assert (cores, threads) == (f"[{core}]", "1")
    else:  # nothing it could apply exactly: left as the process was (vLLM keeps spawn there); the
        # process's own affinity, read before (under pytest-xdist a process may start on fewer cores)
        assert cores == before


def test_a_worker_asking_for_a_one_core_openmp_binding_is_forked_and_bound(jobs):
    """A fresh process's OpenMP reads its binding when it loads; a forked one applies it itself, so
    the request is still a fork (a test runs engines two at a time, each on a core of its own). Any
    other OpenMP setting differs from what a fork can reproduce: a fresh start."""
    core = max(os.sched_getaffinity(0))
    bind = {"OMP_NUM_THREADS": "1", "OMP_PLACES": f"{{{core}}}", "OMP_PROC_BIND": "true"}
    with launcher.active() as sock:
        out = run_trial(_job("who"), jobs / "bound", timeout_s=60, env=bind)
        assert out.failure is None and out.raw["ppid"] == _launcher_pid(sock), out.failure
        assert (out.raw["cores"], out.raw["threads"]) == ([core], 1)
        out = run_trial(_job("who"), jobs / "two", timeout_s=60, env={**bind, "OMP_NUM_THREADS": "2"})
        assert out.failure is None and out.raw["ppid"] != _launcher_pid(sock)  # fresh: OpenMP reads it itself


def test_a_bad_request_leaves_the_launcher_serving_the_next(jobs):
    import socket

    with launcher.active() as sock:
        for junk in (b"not json\n", b'{"module": "os", "args": [], "env": {}}\n', b""):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(sock)
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                s.recv(1000)
        out = run_trial(_job("who"), jobs / "t", timeout_s=60)
        assert out.failure is None and out.raw["ppid"] == _launcher_pid(sock), out.failure
