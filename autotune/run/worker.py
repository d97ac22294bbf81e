"""One trial in a fresh process: the parent side (``run_trial``) and the child side (``main``).

Why a process per trial: vLLM does not reliably free memory when an engine is deleted
in-process, a candidate may crash engine init (fp8 weights on CPU), and compiled graphs are
cached per process. The child starts in its own session so the parent can end the whole
process group (vLLM's engine-core child included): SIGTERM first, then SIGKILL.
Data crosses as JSON files: the job in, phase events out as JSON lines, the RawRun out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core.records import Job, RawRun
from autotune.run.launcher import WORKER, Launched, describe_exit, launch

OnEvent = Callable[[dict[str, Any]], None]
WORKER_LOG = "worker.log"  # the worker's stdout and stderr, in its trial folder
UNSPECULATED_DIR = "unspeculated"  # in a trial's folder: its unspeculated reference run (run_trial)


@dataclass(frozen=True)
class TrialOutcome:
    """What the parent learns from one worker: a RawRun dict, or a failure reason."""

    raw: RawRun | None
    failure: str | None
    wall_s: float
    log_path: str
    pid: int  # the worker's pid, which is also its process-group id


# vLLM faults whose message names a symptom, not the cause: found in a worker's log, the trial's
# failure reason says what the user can do.
KNOWN_FAULTS = {
    "CPU Generator does not use offset": (
        "vLLM's CPU model runner cannot rewind a seeded request's generator when its prefill is split "
        "over steps (more prompt tokens in flight than max_num_batched_tokens): give the sampled "
        "requests no seed, or send fewer at once"),
}


def explain(log_path: str | Path | None) -> str:
    """``"; cause: ..."`` for a known vLLM fault in a worker's log, else ``""``."""
    from autotune.run.served_engine import SERVER_LOG

    text = ""
    if log_path:  # the worker's log, and a served trial's server log beside it
        for p in (Path(log_path), Path(log_path).with_name(SERVER_LOG)):
            try:
                text += p.read_text(errors="replace")
            except OSError:
                pass
    return "".join(f"; cause: {why} (worker log: {sign!r})" for sign, why in KNOWN_FAULTS.items() if sign in text)


def _tail(path: Path, n: int = 12) -> str:
    """The most telling line of a crash (autotune.serve.servers.tail)."""
    from autotune.serve.servers import tail

    return tail(path, n)


def _end_group(proc: subprocess.Popen | Launched, grace_s: float = 10.0) -> None:
    """End the worker's whole process group, its engine core included (autotune.serve.servers.end_pgid):
    a caller that looks right after finds nothing of the group left. A worker that has exited has
    written its result: what is left of its group (an engine core) gets SIGKILL at once, not a grace."""
    from autotune.serve.servers import end_pgid

    end_pgid(proc.pid, proc=proc, grace_s=0.0 if proc.poll() is not None else grace_s)


PRUNED = "pruned"  # TrialOutcome.failure of a trial its caller stopped early (``prune``)


def run_trial(job: Job, workdir: Path, *, timeout_s: float, on_event: OnEvent | None = None,
              python: str = sys.executable, env: dict[str, str] | None = None,
              stop: threading.Event | None = None, prune: threading.Event | None = None) -> TrialOutcome:
    """Run ``job`` in a fresh worker process under a time limit; never raises for a bad candidate.

    ``env``: extra environment for the worker (its device set). ``stop``: set by another thread to
    end the worker, which then raises KeyboardInterrupt here as Ctrl-C would. ``prune``: set (by an
    ``on_event`` callback that has seen enough) to end the worker and return ``PRUNED`` as the failure.
    A job with an ``unspeculated`` reference (a lossy config with speculation) runs that job next,
    in a fresh process of its own under the same limit (``UNSPECULATED_DIR``), and the raw run
    carries its outputs and draws (``unspeculated``), or why it gave none: what the verdict
    judges the speculation against (autotune.measure.validate).
    """
    outcome = _run_process(job, workdir, timeout_s=timeout_s, on_event=on_event, python=python, env=env, stop=stop,
                           prune=prune)
    twin = job.get("unspeculated")
    if twin is None or outcome.raw is None:
        return outcome
    ref = _run_process(twin, workdir / UNSPECULATED_DIR, timeout_s=timeout_s, on_event=on_event, python=python,
                       env=env, stop=stop)
    if ref.raw is None:
        got: dict[str, Any] = {"error": ref.failure}
    else:
        got = {"outputs": ref.raw["windows"][0]["requests"], "samples": ref.raw.get("samples") or {}}
    raw: RawRun = {**outcome.raw, "unspeculated": got}  # type: ignore[typeddict-item]
    return TrialOutcome(raw, None, outcome.wall_s + ref.wall_s, outcome.log_path, outcome.pid)


def _run_process(job: Job, workdir: Path, *, timeout_s: float, on_event: OnEvent | None, python: str,
                 env: dict[str, str] | None, stop: threading.Event | None,
                 prune: threading.Event | None = None) -> TrialOutcome:
    """One worker process for ``job`` (``run_trial``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    job_path, result_path = workdir / "job.json", workdir / "result.json"
    events_path, log_path = workdir / "events.jsonl", workdir / WORKER_LOG
    from autotune.run.served_engine import SERVER_PGID

    for p in (result_path, events_path, workdir / SERVER_PGID):
        p.unlink(missing_ok=True)
    job_path.write_text(json.dumps(job))
    log_path.write_text("")
    if (why := _gpu_memory_released(job, env)) is not None:  # never start an engine vLLM would refuse
        return TrialOutcome(None, why, 0.0, str(log_path), 0)
    t0 = time.monotonic()
    # forked by the study's launcher when one runs (vLLM already imported), else a fresh Popen
    proc = launch([python, "-m", WORKER, str(job_path), str(result_path), str(events_path)],
                  env={**os.environ, **(env or {})}, log_path=log_path)
    seen, failure = 0, None
    try:
        while proc.poll() is None:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            seen = _pump(events_path, seen, on_event)
            if prune is not None and prune.is_set():
                failure = PRUNED
                break
            if time.monotonic() - t0 > timeout_s:
                failure = f"timeout: no result after {timeout_s:.0f}s (worker ended)"
                break
            time.sleep(0.2)
    finally:  # also on KeyboardInterrupt: never leave an engine behind
        _end_group(proc)
        _end_server(workdir)
    _pump(events_path, seen, on_event)
    wall = time.monotonic() - t0
    if failure is None and result_path.exists():
        result = json.loads(result_path.read_text())
        if "error" in result:
            return TrialOutcome(None, result["error"], wall, str(log_path), proc.pid)
        return TrialOutcome(result, None, wall, str(log_path), proc.pid)
    if failure is None:
        failure = f"worker crashed ({describe_exit(proc)}): {_tail(log_path)}"
    return TrialOutcome(None, failure, wall, str(log_path), proc.pid)


def _gpu_memory_released(job: Job, env: dict[str, str] | None) -> str | None:
    """On a GPU, wait (autotune.run.gpu_memory) until the devices this job uses (every device of its
    engine: tensor x pipeline x data parallel, as the preflight counts them) have the memory it asks
    for: the previous trial's engine may still be giving it back. Every job kind comes through here,
    the EAGLE-3 trace's too, which starts no engine (``gpu_memory.asked_by``). Why not, or None."""
    from autotune.run import gpu_memory, hardware

    if hardware.detect() != "cuda":
        return None
    utilization, devices = gpu_memory.asked_by(dict(job))
    return gpu_memory.wait_released(env, utilization, devices=devices, timeout_s=gpu_memory.RELEASE_TIMEOUT_S)


def _end_server(workdir: Path) -> None:
    """A served trial's `vllm serve` runs in a session of its own (autotune.run.served_engine): end its
    group too, whether the worker ended it or was ended before it could."""
    from autotune.run.served_engine import SERVER_PGID
    from autotune.serve.servers import end_pgid

    pgid_file = workdir / SERVER_PGID
    try:
        pgid = int(pgid_file.read_text())
    except (OSError, ValueError):
        return
    end_pgid(pgid, grace_s=10.0)
    pgid_file.unlink(missing_ok=True)


def _pump(events_path: Path, seen: int, on_event: OnEvent | None) -> int:
    if on_event is None or not events_path.exists():
        return seen
    lines = events_path.read_text().splitlines()
    for line in lines[seen:]:
        try:
            on_event(json.loads(line))
        except json.JSONDecodeError:  # a half-written last line: read it next time
            return seen
        seen += 1
    return seen


def failure_reason(e: BaseException) -> str:
    """One line: the exception type and its telling lines (pydantic's trailing URL line dropped)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.strip().startswith("For further")]
    text = " | ".join(lines[:3])
    text = text.split(" [type=")[0]  # pydantic appends the whole input; the message is before it
    return f"{type(e).__name__}: {text}"[:600]


def main(argv: list[str]) -> int:
    """Child side: run the job, write the result (or the error) and exit."""
    job_path, result_path, events_path = (Path(a) for a in argv)
    job = json.loads(job_path.read_text())
    job["workdir"] = str(job_path.parent)  # where the engine may keep logs of its own (a served trial's server)
    events = open(events_path, "a", buffering=1)
    t0 = time.monotonic()

    def phase(name: str, data: dict[str, Any]) -> None:  # t: seconds since the worker started, where a trial's time goes
        events.write(json.dumps({"phase": name, **data, "t": round(time.monotonic() - t0, 3)}) + "\n")

    try:
        import importlib

        # autotune.run.engine imports vLLM lazily; orchestration tests name a fake engine here.
        engine = importlib.import_module(job.get("engine_module", "autotune.run.engine"))
        result: dict[str, Any] = engine.run_job(job, phase)
        phase("done", {})  # the last phase's end: the engine is shut down
        if isinstance(result, dict) and "windows" in result:  # how this process came to exist, whatever the engine
            from autotune.run import launcher

            result["started"] = {"worker": "forked" if launcher.FORKED else "fresh", **(result.get("started") or {})}
    except BaseException as e:  # every failure becomes a reason string in the result file
        traceback.print_exc()
        result = {"error": failure_reason(e)}
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(result_path)  # atomic: the parent never reads a half-written result
    sys.stdout.flush()
    # vLLM may leave non-daemon threads behind; the result is written, so leave now.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
