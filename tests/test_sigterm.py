"""SIGTERM (a CI job cancelled, `kill`, a container stopped) ends `autotune search` as Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna

from autotune.core import errors

TESTS = Path(__file__).resolve().parent
# The command as installed (autotune.cli.app:main), with the FAKE engine named for its workers.
SCRIPT = ("import sys, autotune.cli.search as s; s.ENGINE = 'fake_engine'; "
          "from autotune.cli.app import main; sys.argv = ['autotune', *sys.argv[1:]]; main()")


def _worker_pid(job: Path) -> int | None:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"autotune.run.worker" in args and str(job).encode() in args:
            return int(cmdline.parent.name)
    return None


def test_sigterm_ends_the_running_trial_and_the_study_resumes(tmp_path):
    env = {**os.environ, "AUTOTUNE_FAKE_DELAY_S": "300",  # the baseline's worker stays up until ended
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "search", "examples/smoke.jsonl", "--space",
                             "tests/data/fake_space.yaml", "--trials", "2", "--results", str(tmp_path), "--study", "t",
                             "--no-remeasure"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    job = tmp_path / "t" / "trials" / "0000" / "job.json"
    pid, deadline = None, time.monotonic() + 120
    while pid is None and time.monotonic() < deadline and proc.poll() is None:
        pid = _worker_pid(job) if job.exists() else None
        time.sleep(0.2)
    assert pid is not None, ("the baseline's worker never started", proc.poll(),
                             proc.stdout.read() if proc.poll() is not None else "")
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    try:  # nothing of the worker's process group is left (its own session: only the parent can end it)
        os.killpg(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    if alive:  # a failing run leaves no sleeping worker behind for the rest of the suite
        os.killpg(pid, signal.SIGKILL)
    assert proc.returncode == errors.INTERRUPTED and "interrupted" in out, out
    assert not alive, f"worker group {pid} still running after SIGTERM"
    trials = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path / 't' / 'study.db'}").trials
    assert [t.state.name for t in trials] == ["FAIL"] and trials[0].user_attrs.get("interrupted"), \
        [(t.state.name, t.user_attrs) for t in trials]
