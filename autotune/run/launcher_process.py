"""The launcher's own process: import vLLM once, then fork each requested process (autotune.run.launcher).

Run as ``python -m autotune.run.launcher_process SOCKET`` by ``autotune.run.launcher.active``. Each
request names an entry (a trial worker or `vllm serve`), its arguments, environment, working folder
and log; the fork becomes that process as Popen would have started it, in a session of its own.
A forked `vllm serve` forks its engine core and CPU worker too, set up as vLLM sets up the ones it
spawns (``_fork_engine_processes``). Exit statuses are left in files beside the socket.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

from autotune.run import launcher
from autotune.run.launcher import PRELOAD_WAS, ENTRIES, PRELOAD, SERVE, read_line, refusal


def _fork_engine_processes(serve: bool) -> None:
    """In a forked `vllm serve` or trial worker: start vLLM's engine core and its worker with fork too,
    set up as spawned (a trial worker's in-process AsyncLLM starts the same two processes).

    `vllm serve` asks for spawn unless VLLM_WORKER_MULTIPROC_METHOD is set (cli_env_setup), and
    vLLM's CPU platform sets spawn while it checks the config, for what a process reads only when it
    starts: LD_PRELOAD (vLLM's tcmalloc and PyTorch's libgomp, which the launcher itself was started
    with: ``_cpu_preload``) and OpenMP's binding of the CPU worker to its core (OMP_NUM_THREADS and
    GOMP_CPU_AFFINITY or OMP_PLACES, set around the worker's start, vllm.utils.ompmultiprocessing).
    A forked worker has OpenMP loaded already, unbound: before this it read 0.65x of a fresh one's
    tok/s here (benchmarks/data/launcher_start_unbound.json). So a forked CPU worker applies that
    binding itself right after the fork, before any parallel region (``_bind_as_spawned``); where
    that could not be exact (a worker given several cores, whose threads OpenMP pins one per core;
    Intel OpenMP preloaded, with variables of its own), both keep vLLM's spawn and only the API
    server's import is saved."""
    try:
        from vllm.platforms import cpu
    except ImportError:  # no vLLM here (a worker of another engine): nothing it starts to set up
        return
    if serve:
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"  # read by cli_env_setup, and on GPU
    original = cpu.CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        original(cls, vllm_config)  # sets spawn
        if _one_core_per_worker(vllm_config):
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    os.register_at_fork(after_in_child=_bind_as_spawned)


def _one_core_per_worker(vllm_config: Any) -> bool:
    """Whether vLLM's OpenMP binding of this config gives each CPU worker exactly one core, through
    the portable variables (``_bind_as_spawned`` can apply exactly that after a fork)."""
    try:
        from vllm.utils.ompmultiprocessing import OMPProcessManager

        m = OMPProcessManager(vllm_config)
        return (not m.use_iomp and not m.skip_setup
                and bool(m.cpu_lists) and all(len(c) == 1 for c in m.cpu_lists))
    except Exception:  # another vLLM's internals: keep its spawn
        return False


def _bind_as_spawned() -> None:
    """In a process the launcher forked, or one forked inside it: the OpenMP binding its environment
    asks for (vLLM sets it around a CPU worker's start; a requester may too: OMP_NUM_THREADS=1 and
    GOMP_CPU_AFFINITY=c, or OMP_PLACES={c} with OMP_PROC_BIND=true), applied now that OpenMP, loaded
    before the fork, cannot read it: the process on core c, one thread. Processes without that
    binding (the engine core) are left alone."""
    core = launcher.bound_core(dict(os.environ))
    if core is None:
        return
    os.sched_setaffinity(0, {core})  # threads created from now on inherit it
    import torch

    torch.set_num_threads(1)


def _child(req: dict[str, Any], listener: socket.socket) -> None:
    """In the fork: become the requested process, as Popen would have started it; never returns."""
    code = 1
    try:
        listener.close()
        os.setsid()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        if sys.path and sys.path[0] == os.getcwd():  # `python -m` puts its cwd first: the requester's
            sys.path[0] = req["cwd"]
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        # the inherited heap stays frozen (gc.freeze above), as vLLM freezes its processes' after start
        module = req["module"]
        launcher.FORKED = True
        sys.argv = [module, *req["args"]]
        _bind_as_spawned()  # the binding the requested environment asks of OpenMP, which read its own at start
        _fork_engine_processes(serve=module == SERVE)
        result = getattr(importlib.import_module(module), ENTRIES[module])(req["args"])
        code = result if isinstance(result, int) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # what the interpreter would run at exit (vLLM ends its children)
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reap(status_dir: Path) -> None:
    """Record each exited child's status (before reaping it, so a handle never sees it gone unrecorded)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        tmp = status_dir / f"{info.si_pid}.tmp"
        tmp.write_text(str(code))
        tmp.replace(status_dir / f"{info.si_pid}.exit")
        os.waitpid(info.si_pid, 0)


def serve_forever(sock_path: str) -> None:
    """The launcher: import, then fork each request's process until the parent is gone or SIGTERM."""
    parent = os.getppid()
    if PRELOAD_WAS in os.environ:  # started with vLLM's CPU preload (_cpu_preload): children inherit it
        was = os.environ.pop(PRELOAD_WAS)
        own_env = {**os.environ, "LD_PRELOAD": was} if was else {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    else:
        own_env = dict(os.environ)  # as the requests' processes would start, before any import
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as e:  # a platform without that module: its children import what they need
            print(f"launcher: not preloaded {name}: {type(e).__name__}: {e}", flush=True)
    gc.collect()
    gc.freeze()  # what every child inherits stays out of its collections (and its pages shared)
    # What the imports (and the preload) did to the environment (vLLM sets a few variables when
    # imported): a child gets them on top of its requested environment, as a fresh process would.
    after_env = dict(os.environ)  # the launcher's environment does not change from here on
    imported_env = {k: v for k, v in after_env.items() if own_env.get(k) != v}
    status_dir = Path(sock_path).parent
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path + ".tmp")
    os.replace(sock_path + ".tmp", sock_path)  # the path appears when the launcher is ready
    listener.listen(16)
    listener.settimeout(0.2)
    print(f"launcher: ready, pid {os.getpid()}", flush=True)
    while os.getppid() == parent:
        _reap(status_dir)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        try:
            _answer(conn, listener, own_env, after_env, imported_env, status_dir)
        except Exception as e:  # one bad or vanished requester (it starts fresh): the launcher goes on
            print(f"launcher: a request failed: {type(e).__name__}: {e}", flush=True)


def _answer(conn: socket.socket, listener: socket.socket, own_env: dict[str, str], after_env: dict[str, str],
            imported_env: dict[str, str], status_dir: Path) -> None:
    """Read one request and fork its process (or say why not)."""
    with conn:
        conn.settimeout(30)
        req = json.loads(read_line(conn))
        why = refusal([req.get("python", ""), "-m", req["module"]], req["env"], own_env, after_env, sys.executable)
        if req["module"] not in ENTRIES:
            why = f"not a launcher entry: {req['module']}"
        if why:
            conn.sendall(json.dumps({"refused": why}).encode() + b"\n")
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child({**req, "env": {**req["env"], **imported_env}}, listener)
        conn.sendall(json.dumps({"pid": pid, "status": str(status_dir / f"{pid}.exit")}).encode() + b"\n")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    serve_forever(sys.argv[1])
