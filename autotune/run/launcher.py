"""Pay vLLM's import once a study: trial workers and their `vllm serve` forked from one warm process.

Why (issue 28, benchmarks/engine_start.py, serve_timeline.txt): of a served trial's ~30 s start on
2 cores, ~27 s were three Python processes each importing vLLM (the API server; the engine core and
the CPU worker, which vLLM's CPU platform starts with ``spawn``), plus the trial worker's own import
beside them. The launcher is a process that imports the serve stack once and then forks, on
request, (a) trial workers (``autotune.run.worker``) and (b) their `vllm serve` (``autotune.vllm_cli``).
benchmarks/launcher_start.py (served trials of the demo, launched and fresh alternating, 8 pairs;
benchmarks/data/launcher_start.json): start to healthy 2.1 s against 35.0 s (medians), tok/s
launched over fresh 1.01 (0.79-1.26, inside the fresh instances' own 1.39-1.58x spread), the same
greedy outputs. `autotune confirm` forks its servers and clients too (autotune.gate.confirm;
`--no-launcher` starts them as users do).

Per platform (vLLM's ``current_platform``, read in the launcher without touching a device):
- CPU: the CPU worker and model runner are preloaded too, and a forked server forks its engine
  core and CPU worker, set up as vLLM's CPU platform sets up the ones it spawns (its spawn exists
  for LD_PRELOAD and OpenMP's binding, both reproduced: autotune.run.launcher_process); a user's
  own ``VLLM_WORKER_MULTIPROC_METHOD`` is kept.
- Elsewhere (CUDA): no worker preloads, and no start method set: `vllm serve` asks for spawn itself
  (cli_env_setup), so a forked server saves the API server's import only. After its preload the
  launcher checks that CUDA is not initialised and that a forked probe can use the device; if
  either fails it says why in one line and exits, and every process starts fresh. On an H200
  without vLLM (benchmarks/data/h200_launcher_selfcheck.json, benchmarks/launcher_selfcheck_gpu.py):
  torch and transformers imported leave CUDA uninitialised, the probe and a forked worker reach the
  GPU, and a preload that initialises CUDA is refused (a fork then fails with "Cannot re-initialize
  CUDA in forked subprocess"). With vLLM's own imports: untested on a GPU.

The processes, their arguments, environment (the launcher's own LD_PRELOAD is not passed on),
signals (SIGINT raises KeyboardInterrupt), allocator, OpenMP binding and IPC are those of a fresh
start; only how each process came to exist differs. Each child runs in a session of its own with
its log on stdout/stderr, as ``subprocess.Popen(..., start_new_session=True)`` would; the caller
holds a ``Launched`` handle with Popen's ``pid``, ``poll``, ``wait`` and ``returncode``. Its exit
status is kept in a file named for the launch (pids are reused), written by the launcher as it
reaps and by the process as it exits; where neither could (the launcher gone, the process killed
by a signal) it is said to be unknown (``describe_exit``), never made up. Anything the launcher
cannot take exactly as Popen would run it (another interpreter, an environment that differs in
what a warm process has already read, the launcher gone) is started with Popen, and the reason is
printed once.

Why not ``multiprocessing``'s forkserver with ``set_forkserver_preload`` (decided in issue 42): it
covers the warm import and the fork, but (1) a forkserver's children are handed only to the
process that created them, as ``Process`` objects, while here the requesters are separate
processes (the CLI, a forked trial worker asking for its `vllm serve`, confirm's client) that find
the launcher by ``AUTOTUNE_LAUNCHER``; a trial worker started by it would start a forkserver of its
own and import everything again; (2) a ``Process`` runs a function, not ``python -m module`` with
its ``sys.argv``, session, log descriptors and environment, and ends through
``os._exit`` without the atexit handlers vLLM relies on to end its engine processes; (3) its exit
code comes over the sentinel pipe to the creator only, which is the same need the status files
serve for any requester. What it would carry is the few lines of ``os.fork`` itself, so the
hand-written launcher stays whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENV_KEY = "AUTOTUNE_LAUNCHER"  # the launcher's socket, for run_trial and the worker's served engine
WORKER, SERVE = "autotune.run.worker", "autotune.vllm_cli"
REAL_ENGINE = "autotune.run.engine"  # the engine module whose imports the launcher holds
FORKED = False  # set in a process the launcher forked (autotune.run.launcher_process)
ENTRIES = {WORKER: "main", SERVE: "main"}  # module run with ``python -m`` -> its main(argv)
# What the warm process imports: the serve stack (API server, engine core, CPU/GPU workers) and the
# trial worker's own (config resolution, tokenizer, HTTP client). Names, not imports: the vLLM
# contract of the house keeps vLLM imports to the engine modules.
PRELOAD = ("autotune.vllm_cli", "autotune.run.worker", "autotune.run.engine", "autotune.run.served_engine",
           "vllm.entrypoints.cli.serve", "vllm.entrypoints.openai.api_server", "vllm.engine.arg_utils",
           "vllm.v1.engine.async_llm", "vllm.v1.engine.core", "vllm.v1.executor.multiproc_executor",
           "transformers", "aiohttp", "prometheus_client.parser")
# The CPU worker and model runner: imported only where forked engine processes run them (the CPU
# platform, ``launcher_process._fork_engine_processes``). On CUDA vLLM spawns its engine processes,
# which import their worker themselves; preloading the GPU model runner would only risk CUDA.
PRELOAD_CPU = ("vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner")
NOT_FORKING = "launcher: not forking: "  # the launcher's last line when its self-check failed
UNKNOWN_EXIT = -1000  # Launched.returncode when the exit status could not be known (``describe_exit``)
# Variables a warm process has not read yet, so a child may set them: vLLM reads its VLLM_* lazily
# (vllm.envs), except its logging set, which vllm.logger reads on import; device sets are read when
# a device is first touched, after the fork; pytest's name of the running test is read by nothing.
_MAY_DIFFER = re.compile(r"^(VLLM_(?!LOGGING|CONFIGURE_LOGGING)\w+|\w+_VISIBLE_DEVICES|ZE_AFFINITY_MASK|"
                         r"AUTOTUNE_\w+|PYTEST_CURRENT_TEST)$")
# OpenMP's binding variables, read when OpenMP loads (in the launcher, before any fork): a child may
# ask for vLLM's one-core binding all the same, which it applies itself (``bound_core``).
OMP_BINDING = ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND")
START_TIMEOUT_S = 300.0
PRELOAD_WAS = "AUTOTUNE_LAUNCHER_LD_PRELOAD_WAS"  # the requesters' LD_PRELOAD, when the launcher's differs
_said: set[str] = set()


def preloads(platform: str | None) -> tuple[str, ...]:
    """What the launcher imports on ``platform`` (vLLM's ``current_platform.device_type``)."""
    return PRELOAD + (PRELOAD_CPU if platform == "cpu" else ())


def _say_once(why: str) -> None:
    if why not in _said:
        _said.add(why)
        print(f"autotune: starting a process without the launcher: {why}", file=sys.stderr, flush=True)


class Launched:
    """A process the launcher forked: Popen's ``pid`` (also its process group), ``poll``, ``wait``.

    Its exit status is read from the file of this launch, written by the launcher when it reaps the
    process, or by the process itself as it exits (``launcher_process._child``). Once the launcher is
    gone (the process was reparented and reaped elsewhere), a process that ended without writing
    its own status (killed by a signal) has an unknown one: ``UNKNOWN_EXIT``, ``exit_known`` False."""

    def __init__(self, pid: int, status_path: Path, launcher_pid: int | None = None) -> None:
        self.pid = pid
        self.status_path = status_path
        self.launcher_pid = launcher_pid
        self.returncode: int | None = None
        self.exit_known = True

    def _read(self) -> int | None:
        try:
            return int(self.status_path.read_text())
        except (OSError, ValueError):
            return None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._read()
            if self.returncode is None and not (self.launcher_pid and _exists(self.launcher_pid)) \
                    and not _exists(self.pid):  # the launcher is gone, and so is the process
                time.sleep(0.2)  # a status written just before either exit: one more look
                self.returncode = self._read()
                if self.returncode is None:
                    self.returncode, self.exit_known = UNKNOWN_EXIT, False
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.05)
        return self.returncode  # type: ignore[return-value]


def describe_exit(proc: Any) -> str:
    """``exit code N``, ``killed by signal N``, or why the status is unknown (a Launched whose
    launcher ended first): never a status made up."""
    if getattr(proc, "exit_known", True) is False:
        return "exit status unknown: autotune's launcher ended before it, so nothing reaped it for autotune"
    code = proc.returncode
    return f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"


def _exists(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, its parent has not reaped it; a dead launcher is one
    until ``active`` reaps it, and an orphan may stay one where PID 1 reaps nothing) has ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust the signal probe
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")


def _entry(argv: list[str]) -> str | None:
    """The module of ``[python, "-m", module, ...]`` when the launcher can run it, else None."""
    if len(argv) >= 3 and argv[1] == "-m" and argv[2] in ENTRIES:
        return argv[2]
    return None


def bound_core(env: dict[str, str]) -> int | None:
    """The core ``env`` binds a process's OpenMP to, one thread on it, in either of the forms vLLM
    sets for a CPU worker (OMP_NUM_THREADS=1 and GOMP_CPU_AFFINITY=c, or OMP_PLACES={c} with
    OMP_PROC_BIND=true); None for anything else, which a fork could not reproduce exactly."""
    if env.get("OMP_NUM_THREADS") != "1":
        return None
    found = re.fullmatch(r"\{(\d+)\}", env.get("OMP_PLACES", "")) if env.get("OMP_PROC_BIND") == "true" else None
    found = found or re.fullmatch(r"(\d+)", env.get("GOMP_CPU_AFFINITY", ""))
    return int(found.group(1)) if found else None


def refusal(argv: list[str], env: dict[str, str], before: dict[str, str], after: dict[str, str],
            python: str) -> str | None:
    """Why the launcher cannot run ``argv`` with ``env`` as a fresh process would run, or None.

    ``before``/``after``: the launcher's environment before and after its imports (a process it
    forked, asking for a process of its own, passes on what the imports set)."""
    if os.path.realpath(argv[0]) != os.path.realpath(python):
        return f"another interpreter ({argv[0]})"
    bindable = bound_core(env) is not None  # applied by the child itself (launcher_process._bind_as_spawned)
    differ = sorted(k for k in set(env) | set(before)
                    if env.get(k) != before.get(k) and env.get(k) != after.get(k) and not _MAY_DIFFER.match(k)
                    and not (bindable and k in OMP_BINDING))
    if differ:
        return f"environment differs from the launcher's in {', '.join(differ[:5])}"
    return None


def launch(argv: list[str], *, env: dict[str, str], log_path: Path) -> Launched | subprocess.Popen:
    """Start ``argv`` in a session of its own, stdout and stderr to ``log_path`` (appended to), with
    exactly ``env``: forked by the launcher when one is active (``ENV_KEY``) and can run it, else Popen."""
    sock_path = os.environ.get(ENV_KEY)
    module = _entry(argv)
    if sock_path and module:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(60)
                s.connect(sock_path)
                s.sendall(json.dumps({"module": module, "args": argv[3:], "env": env, "cwd": os.getcwd(),
                                      "log": str(log_path), "python": argv[0]}).encode() + b"\n")
                reply = json.loads(read_line(s))
            if "pid" in reply:
                return Launched(int(reply["pid"]), Path(reply["status"]), reply.get("launcher"))
            _say_once(reply.get("refused", "the launcher refused"))
        except (OSError, ValueError) as e:
            _say_once(f"the launcher did not answer ({type(e).__name__}: {e})")
    log = open(log_path, "a")
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    finally:
        log.close()


def read_line(s: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


_holds: list[contextlib.ExitStack] = []  # open ``held`` blocks: a launcher started inside outlives its ``active``


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A launcher that an ``active`` inside this block starts keeps running until the block ends
    (`search --confirm`: the study's launcher also forks confirm's servers; a bad input before the
    study still fails before any launcher starts)."""
    with contextlib.ExitStack() as stack:
        _holds.append(stack)
        try:
            yield
        finally:
            _holds.remove(stack)


@contextlib.contextmanager
def active(enabled: bool = True, python: str = sys.executable) -> Iterator[str | None]:
    """Run a launcher for the duration (``ENV_KEY`` set in this process's environment, so that trial
    workers and their servers are forked by it), or until the enclosing ``held`` block ends; yields
    its socket path, or None when not enabled, already active, or it could not start (then
    everything starts with Popen, as before)."""
    if not enabled or os.environ.get(ENV_KEY):
        yield None
        return
    if _holds:
        sock_path = _holds[-1].enter_context(_running(python))
        yield sock_path
        return
    with _running(python) as sock_path:
        yield sock_path


@contextlib.contextmanager
def _running(python: str) -> Iterator[str | None]:
    """Start a launcher, set ``ENV_KEY`` while it runs, end it on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="autotune-launcher-"))
    sock_path = str(tmp / "sock")
    log = open(tmp / "launcher.log", "w")
    env = dict(os.environ)
    preload = _cpu_preload()
    if preload:  # loaded from its start, as in the engine processes vLLM spawns; the requesters' own value kept
        env.update({"LD_PRELOAD": preload, PRELOAD_WAS: os.environ.get("LD_PRELOAD", "")})
    proc = subprocess.Popen([python, "-m", "autotune.run.launcher_process", sock_path], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    t0 = time.monotonic()
    while not os.path.exists(sock_path) and proc.poll() is None and time.monotonic() - t0 < START_TIMEOUT_S:
        time.sleep(0.1)
    if not os.path.exists(sock_path):
        said = [ln for ln in (tmp / "launcher.log").read_text(errors="replace").splitlines()
                if ln.startswith(NOT_FORKING)]
        _say_once(said[-1][len(NOT_FORKING):] + "; every process starts fresh" if said
                  else f"the launcher did not start (log {tmp / 'launcher.log'})")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
        yield None
        return
    os.environ[ENV_KEY] = sock_path
    try:
        yield sock_path
    finally:
        os.environ.pop(ENV_KEY, None)
        proc.terminate()  # its children are in sessions of their own: their owners end them
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)  # the socket and the exit statuses: their owners are done


def _cpu_preload() -> str | None:
    """The LD_PRELOAD vLLM's CPU platform gives the engine core and CPU worker it spawns, or None
    where it would add nothing (off the CPU build). As vllm/platforms/cpu.py check_and_update_config
    builds it: PyTorch's libgomp appended unless an OpenMP is preloaded already, then its bundled
    tcmalloc put first unless a tcmalloc is."""
    import glob
    import importlib.util

    from autotune.run import hardware

    have = os.environ.get("LD_PRELOAD", "")
    torch_spec, vllm_spec = importlib.util.find_spec("torch"), importlib.util.find_spec("vllm")
    if hardware.detect() != "cpu" or not (torch_spec and torch_spec.origin and vllm_spec and vllm_spec.origin):
        return None
    torch_pkg = os.path.dirname(torch_spec.origin)
    gomp = [*glob.glob(os.path.join(os.path.dirname(torch_pkg), "torch.libs", "libgomp*.so*")),
            *glob.glob(os.path.join(torch_pkg, "lib", "libgomp*.so*"))]
    libs = os.path.join(os.path.dirname(vllm_spec.origin), "libs")
    tcmalloc = [*glob.glob(os.path.join(libs, "libtcmalloc_minimal*.so*")), *glob.glob(os.path.join(libs, "libtcmalloc.so*"))]
    preload = have
    if gomp and not any(x in preload for x in ("libomp", "libgomp", "libiomp")):
        preload = f"{preload}:{gomp[0]}" if preload else gomp[0]
    if tcmalloc and "libtcmalloc" not in preload:
        preload = f"{tcmalloc[0]}:{preload}" if preload else tcmalloc[0]
    return preload if preload != have else None
