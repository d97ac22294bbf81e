"""The launcher's own process: import vLLM once, then fork each requested process (autotune.run.launcher).

Run as ``python -m autotune.run.launcher_process SOCKET`` by ``autotune.run.launcher.active``. Each
request names an entry (a trial worker or `vllm serve`), its arguments, environment, working folder
and log; the fork becomes that process as Popen would have started it, in a session of its own.
On the CPU platform a forked `vllm serve` forks its engine core and CPU worker too, set up as vLLM
sets up the ones it spawns (``_fork_engine_processes``); elsewhere vLLM's own start method is kept.
Before serving, the launcher checks that its imports left the device usable by a fork
(``self_check``); where not, it says why in one line and exits, and every process starts fresh.
Each process's exit status is left in a file named for that launch (never for its pid alone, which
the kernel reuses), by the launcher when it reaps it and by the process itself as it exits.
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
from autotune.run.launcher import ENTRIES, NOT_FORKING, PRELOAD_WAS, SERVE, preloads, read_line, refusal


def device_platform() -> str | None:
    """The platform vLLM resolves here (``cpu``, ``cuda``, ...), or None without vLLM. vLLM finds it
    through NVML on CUDA (vllm/platforms/__init__.py), which leaves CUDA uninitialised."""
    try:
        from vllm.platforms import current_platform

        return str(current_platform.device_type)
    except Exception:  # no vLLM (a worker of another engine) or a broken install: nothing to tailor
        return None


def self_check(platform: str | None, cuda: Any = None, probe: Any = None) -> str | None:
    """Why processes forked from this one could not use the device, or None. Off CPU: vLLM's own
    guard (vllm.utils.system_utils._maybe_force_spawn) refuses fork once ``torch.cuda.is_initialized()``;
    then a forked probe must reach the device as a trial would (``_probe_device``). ``cuda`` and
    ``probe``: torch.cuda and that probe, unless given (tests fake them)."""
    if platform in (None, "cpu"):
        return None
    if cuda is None:
        import torch

        cuda = torch.cuda
    if cuda.is_initialized():
        return "the preload initialised CUDA (torch.cuda.is_initialized()), so a forked process could not use it"
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            (probe or _probe_device)(cuda)
            code = 0
        except BaseException as e:
            print(f"launcher: device probe: {type(e).__name__}: {e}", flush=True)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return f"a process forked after the preload could not use the {platform} device (see the launcher log)"
    if cuda.is_initialized():  # the probe ran in the fork only; this process must stay clean
        return "CUDA became initialised in the launcher during its self-check"
    return None


def _probe_device(cuda: Any) -> None:
    """In a fork: use the device as a trial's engine would first (initialise it, allocate on it)."""
    cuda.init()
    if cuda.device_count() < 1:
        raise RuntimeError("no device visible")
    import torch

    torch.empty(1, device="cuda").add_(1)
    cuda.synchronize()


def _fork_engine_processes(serve: bool, platform: str | None = "cpu") -> None:
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
    server's import is saved.

    Only on the CPU platform, and only when the requester did not ask for a start method itself:
    elsewhere the start method is left to the user and to vLLM (`vllm serve` asks for spawn, the
    library forks unless CUDA is initialised), so on CUDA a forked server saves its own import only.
    Untested on a GPU."""
    if platform != "cpu" or os.environ.get("VLLM_WORKER_MULTIPROC_METHOD"):
        return
    try:
        from vllm.platforms import cpu
    except ImportError:  # no vLLM here (a worker of another engine): nothing it starts to set up
        return
    if serve:
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"  # read by cli_env_setup (CPU only, above)
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


def _child(req: dict[str, Any], listener: socket.socket, platform: str | None = "cpu") -> None:
    """In the fork: become the requested process, as Popen would have started it; never returns.

    Signals as a fresh Python has them: SIGINT raises KeyboardInterrupt, which, uncaught, prints its
    traceback, runs the exit handlers and ends the process by SIGINT (as CPython's main does)."""
    code: int = 1
    interrupted = False
    try:
        listener.close()
        os.setsid()
        _record_own_exit(Path(req["status"]))
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
        _fork_engine_processes(serve=module == SERVE, platform=platform)
        result = getattr(importlib.import_module(module), ENTRIES[module])(req["args"])
        code = result if isinstance(result, int) else 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # what the interpreter would run at exit (vLLM ends its children)
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        if interrupted:  # for a requester that outlives the launcher (os._exit below records the rest)
            with contextlib.suppress(BaseException):
                _write_status(Path(req["status"]), -int(signal.SIGINT))
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def _record_own_exit(path: Path) -> None:
    """Make this process's ``os._exit`` leave its status first (the trial worker leaves that way),
    for a requester whose launcher is gone; processes forked from this one (vLLM's) leave theirs alone."""
    me, real_exit = os.getpid(), os._exit

    def _exit(code: int) -> None:
        if os.getpid() == me:
            with contextlib.suppress(BaseException):
                _write_status(path, code)
        real_exit(code)

    os._exit = _exit  # type: ignore[assignment]


def _write_status(path: Path, code: int) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(str(code))
    tmp.replace(path)


def _reap(status_of: dict[int, Path]) -> None:
    """Record each exited child's status in its launch's file (before reaping it, so a handle never
    sees it gone unrecorded), and forget its pid, which the kernel may give to the next child."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        path = status_of.pop(info.si_pid, None)
        if path is not None:
            _write_status(path, code)
        os.waitpid(info.si_pid, 0)


def serve_forever(sock_path: str) -> None:
    """The launcher: import, then fork each request's process until the parent is gone or SIGTERM."""
    parent = os.getppid()
    if PRELOAD_WAS in os.environ:  # started with vLLM's CPU preload (_cpu_preload): children inherit it
        was = os.environ.pop(PRELOAD_WAS)
        own_env = {**os.environ, "LD_PRELOAD": was} if was else {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    else:
        own_env = dict(os.environ)  # as the requests' processes would start, before any import
    platform = device_platform()
    for name in preloads(platform):
        try:
            importlib.import_module(name)
        except Exception as e:  # a platform without that module: its children import what they need
            print(f"launcher: not preloaded {name}: {type(e).__name__}: {e}", flush=True)
    why = self_check(platform)
    if why:  # the requester reads this line (autotune.run.launcher._running) and starts everything fresh
        print(f"{NOT_FORKING}{why}", flush=True)
        os._exit(3)
    gc.collect()
    gc.freeze()  # what every child inherits stays out of its collections (and its pages shared)
    # What the imports (and the preload) did to the environment (vLLM sets a few variables when
    # imported): a child gets them on top of its requested environment, as a fresh process would.
    # LD_PRELOAD is the launcher's own (vLLM's CPU preload, read by this process's loader): a fresh
    # API server or worker starts without it, and vLLM sets it for the engine processes it starts.
    after_env = dict(os.environ)  # the launcher's environment does not change from here on
    imported_env = {k: v for k, v in after_env.items() if own_env.get(k) != v and k != "LD_PRELOAD"}
    status_dir = Path(sock_path).parent
    status_of: dict[int, Path] = {}  # running children: pid -> the file of that launch
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path + ".tmp")
    os.replace(sock_path + ".tmp", sock_path)  # the path appears when the launcher is ready
    listener.listen(16)
    listener.settimeout(0.2)
    print(f"launcher: ready (platform {platform}), pid {os.getpid()}", flush=True)
    launches = 0
    while os.getppid() == parent:
        _reap(status_of)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        launches += 1
        try:
            _answer(conn, listener, own_env, after_env, imported_env, status_dir / f"{launches}.exit", status_of,
                    platform)
        except Exception as e:  # one bad or vanished requester (it starts fresh): the launcher goes on
            print(f"launcher: a request failed: {type(e).__name__}: {e}", flush=True)


def _answer(conn: socket.socket, listener: socket.socket, own_env: dict[str, str], after_env: dict[str, str],
            imported_env: dict[str, str], status: Path, status_of: dict[int, Path], platform: str | None) -> None:
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
            _child({**req, "env": {**req["env"], **imported_env}, "status": str(status)}, listener, platform)
        status_of[pid] = status
        conn.sendall(json.dumps({"pid": pid, "status": str(status), "launcher": os.getpid()}).encode() + b"\n")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    serve_forever(sys.argv[1])
