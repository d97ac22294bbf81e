"""Benchmark: how much fresh engine instances of one config differ (issue 24, item 2).

N fresh instances each of the baseline and of the demo's usual pick (ngram k=5 lookup 2..3),
interleaved (baseline, pick, pick, baseline, ...), each measured by the study's own harness
(a worker, warm-up, ``--windows`` windows of examples/json_edit.jsonl at concurrency 1) with the
chosen instrument. Prints each instance's median tok/s and, per config, the spread
(max - min) / median and the paired speedups. Around each instance, with nothing else running, a
probe times the machine itself on vLLM's OpenMP core (a pure-Python loop, a one-thread matmul):
its correlation with the instances' tok/s says whether the spread is the machine's drift. Saves
everything to ``--out``:

    .venv/bin/python benchmarks/instance_noise.py [--instances 5] [--instrument served|inprocess]
"""

from __future__ import annotations

import collections
import glob
import os
import threading
import statistics
import tempfile
import time
from pathlib import Path

import harness
from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.measure.config import StudyConfig
from autotune.run.evaluate import trial_job
from autotune.core.load import LoadPattern
from autotune.measure.metrics import measure_run
from autotune.run.worker import run_trial
from autotune.core.workload import load_workload

PICK = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 3,
        "enforce_eager": True}
BASE = {"method": "none", "enforce_eager": True}


class Placement:
    """Samples, every ``every_s``, which CPU each running thread on the machine is on (/proc/*/task/*/stat),
    counting running threads other than vLLM's OpenMP compute thread that share its core: the
    contention a run meets. vLLM binds the OpenMP thread to one core (here cpu 0) and nothing keeps
    the API server, the engine core's loop or the client off it."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s, self.samples, self.shared, self._stop = every_s, 0, 0, threading.Event()
        self.others: collections.Counter[str] = collections.Counter()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Placement":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(self.every_s):
            on0: list[str] = []
            for stat in glob.glob("/proc/[0-9]*/task/[0-9]*/stat"):
                try:
                    raw = Path(stat).read_text()
                except OSError:
                    continue
                comm = raw[raw.index("(") + 1:raw.rindex(")")]
                fields = raw[raw.rindex(")") + 2:].split()
                if fields[0] == "R" and fields[36] == "0" and not stat.startswith(f"/proc/{me}/"):
                    on0.append(comm)
            self.samples += 1
            # The OpenMP compute thread is one running thread on cpu 0; any other is contention.
            if len(on0) > 1:
                self.shared += 1
                self.others.update(on0)

    def share(self) -> float:
        return self.shared / self.samples if self.samples else float("nan")


def probe(seconds: float = 1.0) -> dict[str, float]:
    """The machine's own speed just now, with no engine running, on the core vLLM's OpenMP thread
    binds to: a pure-Python loop (the interpreter work most of the demo pair's decode step is)
    and a one-thread float32 256x256 matmul, each as operations per second. If instances differ
    because the machine's speed drifts, these move with their tok/s."""
    import torch

    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t, n = time.perf_counter(), 0
        while time.perf_counter() - t < seconds:
            sum(range(10_000))
            n += 1
        py = n / (time.perf_counter() - t)
        a = torch.randn(256, 256)
        t, n = time.perf_counter(), 0
        while time.perf_counter() - t < seconds:
            a @ a
            n += 1
        mm = n / (time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, before)
    return {"python_loops_s": py, "matmuls_s": mm}


def correlation(xs: list[float], ys: list[float]) -> float:
    return statistics.correlation(xs, ys) if len(xs) > 2 and len(set(xs)) > 1 and len(set(ys)) > 1 else float("nan")


def main() -> None:
    ap = harness.parser(__doc__, out="instance_noise.json")
    ap.add_argument("--workload", default="examples/json_edit.jsonl")
    ap.add_argument("--instances", type=int, default=5)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--instrument", default="served", choices=("served", "inprocess"))
    ap.add_argument("--warmup", type=int, default=2, help="requests replayed unmeasured first (the study's default: 2)")
    ap.add_argument("--configs", default="baseline,pick", help="which of baseline,pick to measure")
    ap.add_argument("--no-probe", dest="probe", action="store_false",
                    help="skip the machine-speed probe around each instance")
    args = ap.parse_args()
    wl = load_workload(args.workload)
    settings = Settings(model=str(demo.TARGET), max_model_len=demo.MAX_MODEL_LEN, dtype="float32",
                        kv_cache_memory_bytes=demo.KV_CACHE_BYTES)  # sized, as `autotune search` sets it on CPU
    tmp = Path(tempfile.mkdtemp(prefix="instance_noise-"))
    cfg = StudyConfig(name="noise", results_dir=tmp, settings=settings, load=LoadPattern(concurrency=1),
                      repeats=args.windows, samples=0, instrument=args.instrument, warmup=args.warmup)
    sides = {s: c for s, c in {"baseline": Candidate(BASE), "pick": Candidate(PICK)}.items()
             if s in args.configs.split(",")}
    tok: dict[str, list[float]] = {s: [] for s in sides}
    windows: dict[str, list[list[float]]] = {s: [] for s in sides}
    shared: dict[str, list[float]] = {s: [] for s in sides}
    probes: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    t0 = time.time()
    for i in range(args.instances):
        for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):  # ABBA
            first = probe() if args.probe else {}
            with Placement() as place:
                out = run_trial(trial_job(sides[side], wl, cfg), tmp / f"{i}-{side}", timeout_s=1800)
            if args.probe:  # the machine's speed around the instance: the mean of just before and just after
                last = probe()
                probes[side].append({k: (first[k] + last[k]) / 2 for k in first})
            if out.raw is None:
                raise SystemExit(f"{side} instance {i} failed: {out.failure}")
            m = measure_run(out.raw)
            tok[side].append(m["output_tok_s"])
            windows[side].append(m["output_tok_s_windows"])
            shared[side].append(place.share())
            print(f"instance {i} {side:<8} {m['output_tok_s']:7.1f} tok/s (windows "
                  f"{', '.join(f'{x:.1f}' for x in m['output_tok_s_windows'])}) at {time.time() - t0:.0f} s; "
                  f"the OpenMP core shared in {place.share():.0%} of samples "
                  f"({', '.join(f'{k} {v}' for k, v in place.others.most_common(4))})", flush=True)
    summary: dict = {s: {"median": statistics.median(v), "spread": harness.spread(v),
                         # the spread of each window position across instances: does it shrink as warm-up goes on?
                         "spread_by_window": [harness.spread([w[j] for w in windows[s]])
                                              for j in range(args.windows)]}
                     for s, v in tok.items()}
    for s, v in tok.items():
        if probes[s]:  # does the machine's own speed move with the instances' tok/s?
            for k in probes[s][0]:
                speed = [x[k] for x in probes[s]]
                summary[s][f"corr_{k}"] = correlation(v, speed)
                summary[s][f"spread_{k}"] = harness.spread(speed)
                summary[s][f"spread_per_{k}"] = harness.spread([t / x for t, x in zip(v, speed)])
    paired = harness.paired(tok.get("pick", []), tok.get("baseline", []))
    if paired:
        summary["speedup"] = {"paired": paired, "median": statistics.median(paired), "spread": harness.spread(paired)}
    for s in sides:
        print(f"{s:<8} median {summary[s]['median']:.1f} tok/s, spread (max-min)/median {summary[s]['spread']:.1%} "
              f"over {args.instances} fresh instances")
        print(f"{s:<8} spread of window 1..{args.windows} across instances: "
              + ", ".join(f"{x:.1%}" for x in summary[s]["spread_by_window"]))
        for k in (probes[s][0] if probes[s] else {}):
            print(f"{s:<8} probe {k}: spread {summary[s][f'spread_{k}']:.1%}, correlation with tok/s "
                  f"{summary[s][f'corr_{k}']:+.2f}, spread of tok/s per probe speed {summary[s][f'spread_per_{k}']:.1%}")
    if paired:
        print(f"paired speedups {', '.join(f'{x:.2f}' for x in paired)}: median {summary['speedup']['median']:.2f}x, "
              f"spread {summary['speedup']['spread']:.1%}")
    harness.save(args.out, {"instrument": args.instrument, "instances": args.instances, "warmup": args.warmup,
                            "windows": args.windows, "tok_s": tok, "windows_tok_s": windows,
                            "omp_core_shared": shared, "probe": probes, "summary": summary}, indent=2)


if __name__ == "__main__":
    main()
