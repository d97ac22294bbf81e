"""Servers and clients in their own process groups: start, wait until healthy, end, check gone.

What `autotune confirm` runs (a `vllm serve` per round, `vllm bench serve` against it), as vLLM's own
benchmarks/sweep does: one context manager per server, whose ready-wait tells a crash (the process
exited) from a timeout, and whose exit ends the whole process group (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core.errors import AutotuneError

HOST = "127.0.0.1"
READY_TIMEOUT_S = 600.0  # engine init: 27 s eager, 80 s compiled (demo pair, CPU); big models on GPU more
BENCH_TIMEOUT_S = 1800.0
STOP_GRACE_S = 30.0  # vLLM shuts its engine core down on SIGTERM; SIGKILL after this


class ServeFailed(AutotuneError):
    """A server did not start (crash or timeout), the client failed, or a run was incomplete."""

    exit_code = 1


# How a process is started: (argv, its whole environment, its log) -> a handle with Popen's pid (also
# its process group), poll, wait and returncode, in a session of its own, stdout and stderr to the
# log. Popen by default; `autotune confirm` passes the study's launcher (autotune.run.launcher.launch).
Start = Callable[[list[str], dict[str, str], Path], Any]


def popen(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """Start ``argv`` as a new process in a session of its own (the default ``Start``)."""
    with open(log_path, "w") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)


def free_port(host: str = HOST) -> int:
    """A TCP port free on ``host`` now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of that id exists, not ours: not one we started
        return False
    return True


def end_pgid(pgid: int, *, proc: Any = None, grace_s: float = STOP_GRACE_S) -> bool:
    """End process group ``pgid`` (SIGTERM, then SIGKILL); True once nothing of it is left.

    ``proc``: its leader, when this process started it (reaped here, or the group never empties).
    """
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()
            if (proc is None or proc.returncode is not None) and not group_alive(pgid):
                return True
            time.sleep(0.1)
    if proc is not None:
        proc.poll()
    return not group_alive(pgid)


def end_group(proc: Any, *, grace_s: float = STOP_GRACE_S) -> None:
    """End ``proc``'s whole process group (SIGTERM, then SIGKILL) and check that nothing is left.

    Raises ServeFailed if a process of the group outlives SIGKILL.
    """
    if not end_pgid(proc.pid, proc=proc, grace_s=grace_s):
        raise ServeFailed(f"process group {proc.pid} still has processes after SIGKILL")


def tail(path: Path, n: int = 8) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (errors[-1] if errors else " | ".join(lines[-n:]))[-400:]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


@dataclass(frozen=True)
class Server:
    base_url: str
    pid: int  # also its process-group id
    ready_s: float
    process: Any = None  # the handle ``start`` returned


@contextmanager
def serving(argv: list[str], *, port: int, log_path: Path, env: dict[str, str] | None = None,
            ready_timeout_s: float = READY_TIMEOUT_S, what: str = "server", start: Start = popen) -> Iterator[Server]:
    """Start ``argv`` (a server that binds ``port`` on 127.0.0.1) in its own session, wait until
    ``/health`` answers 200, yield it, then end its process group. ``start``: how (Popen by default).

    Raises ServeFailed naming the log when the server exits before it is ready (a crash) or is not
    ready in ``ready_timeout_s`` (a timeout); either way nothing of it is left running.
    """
    base = f"http://{HOST}:{port}"
    t0 = time.monotonic()
    proc = start(argv, {**os.environ, **(env or {})}, log_path)
    try:
        while not healthy(f"{base}/health"):
            code = proc.poll()
            if code is not None:
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                raise ServeFailed(f"{what} exited before it was ready ({how}; log {log_path}): {tail(log_path)}")
            if time.monotonic() - t0 > ready_timeout_s:
                raise ServeFailed(f"{what} not ready after {ready_timeout_s:g} s (ended; log {log_path}): "
                                  f"{tail(log_path)}")
            time.sleep(0.5)
        yield Server(base_url=base, pid=proc.pid, ready_s=time.monotonic() - t0, process=proc)
    finally:  # also on Ctrl-C or a failed bench: never leave a server behind
        end_group(proc)


@contextmanager
def client_started(argv: list[str], *, log_path: Path, env: dict[str, str] | None = None,
                   start: Start = popen) -> Iterator[Any]:
    """Start the bench client in its own session; on exit (also on a failure around it) end its group."""
    proc = start(argv, {**os.environ, **(env or {})}, log_path)
    try:
        yield proc
    finally:
        end_group(proc, grace_s=5.0)


def finish_client(proc: Any, *, log_path: Path, timeout_s: float = BENCH_TIMEOUT_S) -> None:
    """Wait for a started client to end; ServeFailed on a timeout or a non-zero exit."""
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ServeFailed(f"vllm bench serve did not finish in {timeout_s:g} s (ended; log {log_path})") from None
    if getattr(proc, "exit_known", True) is False:  # a launcher's child outlived it: its result file decides
        print(f"autotune: vllm bench serve's exit status is unknown (its launcher ended first; log {log_path})",
              file=sys.stderr, flush=True)
        return
    if code != 0:
        raise ServeFailed(f"vllm bench serve failed (exit code {code}; log {log_path}): {tail(log_path)}")


def run_client(argv: list[str], *, log_path: Path, timeout_s: float = BENCH_TIMEOUT_S,
               env: dict[str, str] | None = None) -> None:
    """Run the bench client to its end (own session, ended with its group at ``timeout_s``)."""
    with client_started(argv, log_path=log_path, env=env) as proc:
        finish_client(proc, log_path=log_path, timeout_s=timeout_s)
