"""The benchmarks' shared harness: every script in benchmarks/ starts from here.

A benchmark does ``import harness`` first (it puts this checkout's ``autotune`` on the path, before
any installed one), builds its parser with ``parser(__doc__, out=...)``, and writes its data file
with ``save(path, data)``, which records the machine's kind in every file (``machine()``: CPU
model, cores, AVX-512/AMX, vLLM version). ``spread``, ``paired`` and ``ratio_interval`` are the
figures the benchmarks quote; ``reset_prefix_cache`` and ``run_logged`` the two things several
benchmarks do to a server and to a command. CONTRIBUTING.md lists every benchmark, its question and
its data files.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
sys.path.insert(0, str(ROOT))  # this checkout's autotune first, before an installed (editable) one elsewhere

from autotune.measure.metrics import ratio_interval  # noqa: E402
from autotune.run import hardware  # noqa: E402

__all__ = ["DATA", "ENGINE_LOCK", "ROOT", "machine", "paired", "parser", "ratio_interval", "reset_prefix_cache",
           "run_locked_timed", "run_logged", "save", "spread"]

ENGINE_LOCK = "/tmp/autotune-engine.lock"  # the machine-wide lock: one engine at a time


def parser(doc: str | None, *, out: str | None = None, summary: bool = False) -> argparse.ArgumentParser:
    """The benchmark's argument parser, its module docstring as ``--help`` (the whole docstring, or
    its first paragraph with ``summary``). ``out``: the data file's default, a name under
    benchmarks/data/ (``--out`` is added); without it the benchmark writes no file."""
    text = (doc or "").split("\n\n")[0] if summary else doc
    ap = argparse.ArgumentParser(description=text, formatter_class=argparse.RawDescriptionHelpFormatter)
    if out is not None:
        ap.add_argument("--out", type=Path, default=DATA / out, help=f"the data file (default: benchmarks/data/{out})")
    return ap


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """The machine's kind, as every data file records it: autotune's platform facts (platform, its
    tags, vLLM and Python versions) plus the CPU model, its cores and whether it has AVX-512 / AMX
    (vLLM's CPU kernels branch on them)."""
    features = hardware.cpu_features()
    return {**hardware.describe(), "cpu": _cpu_model(), "cores": os.cpu_count(),
            "avx512": "avx512" in features, "amx": "amx" in features}


def save(path: str | Path, data: dict[str, Any], *, indent: int = 1) -> Path:
    """Write ``data`` as JSON to ``path`` with the machine's kind (``machine``) and the date first
    (the harness's, whatever ``data`` says), making its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine(), "date": datetime.date.today().isoformat(),
              **{k: v for k, v in data.items() if k not in ("machine", "date")}}
    path.write_text(json.dumps(record, indent=indent) + "\n")
    print(f"saved {path}", flush=True)
    return path


def spread(xs: Sequence[float]) -> float:
    """(max - min) / median: how far apart repeated readings of one thing are."""
    return (max(xs) - min(xs)) / statistics.median(xs)


def lag1(runs: Sequence[Sequence[float]]) -> float:
    """Pooled lag-1 autocorrelation of series, each about its own mean: does a reading carry on into
    the next (the machine's state persisting from one round to the next)?"""
    num = den = 0.0
    for y in runs:
        m = statistics.mean(y)
        d = [v - m for v in y]
        num += sum(a * b for a, b in zip(d, d[1:]))
        den += sum(v * v for v in d)
    return num / den


def paired(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Each reading of ``num`` over its partner in ``den`` (same round), in order."""
    return [a / b for a, b in zip(num, den)]


def reset_prefix_cache(base_url: str) -> None:
    """Empty a `vllm serve`'s prefix cache (started with VLLM_SERVER_DEV_MODE=1) before a run."""
    req = urllib.request.Request(base_url + "/reset_prefix_cache", method="POST")
    urllib.request.urlopen(req, timeout=30).read()


def run_logged(argv: list[str], log: Path, *, cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run a command to its end, its output into ``log``; the process and its wall seconds."""
    t0 = time.time()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    wall = time.time() - t0
    log.write_text(proc.stdout + proc.stderr)
    return proc, wall


def run_locked_timed(argv: list[str], log: Path, *, cwd: Path = ROOT, env: dict[str, str] | None = None
                     ) -> tuple[int, float, float, list[tuple[float, str]]]:
    """Run a command under the engine lock, its output read line by line with the time each came;
    the console into ``log`` (its exit code last). (exit code, when the lock was held, end, lines)."""
    held = "autotune-benchmark: lock held"
    proc = subprocess.Popen(["flock", ENGINE_LOCK, "bash", "-c", f'echo "{held}"; exec "$@"', "_", *argv], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append((time.time(), line.rstrip("\n")))
    rc = proc.wait()
    end = time.time()
    start = lines[0][0] if lines and lines[0][1] == held else end
    lines = lines[1:] if lines and lines[0][1] == held else lines
    log.write_text("\n".join(x for _, x in lines) + f"\nrc={rc}\n")
    return rc, start, end, lines
