"""Benchmark: time to a validated pick on the demo workload, three ways over one space (not a test).

One run, one machine, the arms one after another (never side by side: 2 cores):
1. **predict**: the demo's own command (`autotune search examples/json_edit.jsonl --space quick
   --trials 8`), then `autotune confirm` of its pick (fresh `vllm serve` pairs, `vllm bench serve`).
   Its time to a validated pick is the search's wall: every trial's outputs judged against the
   baseline's, the pick and the baseline re-measured on fresh engines.
2. **grid**: the same command with `--strategy grid --trials <every point>`: the same judging,
   pruning and re-measuring, the space in declaration order.
3. **sweep**: vLLM's own `vllm bench sweep serve` over the same points: each point's `vllm serve`
   command as autotune exports it, started fresh, read by one `vllm bench serve` run of the dataset
   confirm sends (`--num-runs 1`, the sweep's cheapest; its default is 3). It judges no output, so
   its "pick" is the fastest point, unvalidated.

An arm still running after ``--cap`` times predict's wall is stopped (SIGTERM for autotune, which
ends its engines and records the trial as interrupted; SIGKILL for the sweep's process group, and
its server ended by port): it has not reached a pick in that time, so predict's share of its time is below 1/cap,
which is what the file states. It also gives a floor for the arm's whole run: the time spent plus,
for each point left, the fastest point it measured (every point starts an engine of its own).

    .venv/bin/python benchmarks/time_to_pick.py            # -> benchmarks/data/time_to_pick.json
    .venv/bin/python benchmarks/time_to_pick.py --cap 4 --arms predict,grid,sweep
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from autotune.core import attrs

ROOT = harness.ROOT

AUTOTUNE = [sys.executable, "-m", "autotune.cli.app"]
STOP_GRACE_S = 240  # autotune ends a served trial's engines and writes its records


def _run(argv: list[str], *, log: Path, cap_s: float | None, stop_sig: int) -> dict[str, Any]:
    """Run ``argv`` (own session) until it ends or ``cap_s`` passes; then ``stop_sig``, then kill."""
    t0 = time.time()
    with log.open("w") as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        while p.poll() is None:
            time.sleep(2)
            if cap_s is not None and time.time() - t0 > cap_s:
                wall = time.time() - t0
                print(f"  cap reached at {wall:.0f} s: stopping", flush=True)
                if stop_sig == signal.SIGKILL:
                    os.killpg(p.pid, signal.SIGKILL)
                else:
                    p.send_signal(stop_sig)
                try:
                    p.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                return {"rc": p.returncode, "wall_s": round(wall, 1), "capped": True}
    return {"rc": p.returncode, "wall_s": round(time.time() - t0, 1), "capped": False}


def _trials(results: Path, study: str) -> list[dict[str, Any]]:
    """Every trial of the study as stored (complete, pruned, failed, interrupted), in start order."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = optuna.load_study(study_name=study, storage=f"sqlite:///{results / study / 'study.db'}")
    rows = []
    for t in s.get_trials(deepcopy=False):
        a = t.user_attrs
        m = a.get(attrs.MEASUREMENT) or {}
        v = a.get(attrs.VERDICT) or {}
        rows.append({"number": t.number, "label": a.get(attrs.LABEL), "state": t.state.name,
                     "role": a.get(attrs.ROLE), "pruned": a.get(attrs.PRUNED_WHY),
                     "failure": a.get(attrs.FAILURE), "interrupted": a.get(attrs.INTERRUPTED),
                     "wall_s": a.get(attrs.WALL_S), "engine_init_s": m.get("engine_init_s"),
                     "output_tok_s": m.get("output_tok_s"), "verdict": v.get("status"),
                     "start": t.datetime_start.timestamp() if t.datetime_start else None,
                     "end": t.datetime_complete.timestamp() if t.datetime_complete else None})
    return rows


def _best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest judged-correct config measured so far, with its speedup over the baseline."""
    base = next((r for r in rows if r["role"] == attrs.BASELINE and r["output_tok_s"]), None)
    ok = [r for r in rows if r["state"] == "COMPLETE" and r["verdict"] == "ok" and r["output_tok_s"]
          and not r["pruned"]]
    if not ok:
        return None
    top = max(ok, key=lambda r: r["output_tok_s"])
    return {"label": top["label"], "output_tok_s": top["output_tok_s"],
            "speedup": top["output_tok_s"] / base["output_tok_s"] if base else None}


def _floor(elapsed: float, done: int, points: int, per_point: list[float]) -> float | None:
    """The arm's whole run at least: what it spent, plus the fastest point it measured for each left."""
    per_point = [x for x in per_point if x]
    return round(elapsed + (points - done) * min(per_point), 1) if per_point else None


def _search(args: argparse.Namespace, strategy: str, trials: int, cap_s: float | None) -> dict[str, Any]:
    study = f"ttp-{strategy}"
    argv = [*AUTOTUNE, "search", args.workload, "--space", args.space, "--strategy", strategy,
            "--trials", str(trials), "--study", study, "--results", str(args.results)]
    print(f"{strategy}: {shlex.join(argv[2:])}", flush=True)
    run = _run(argv, log=args.results / f"{study}.log", cap_s=cap_s, stop_sig=signal.SIGTERM)
    rows = _trials(args.results, study)
    grid = [r for r in rows if r["role"] in (None, attrs.BASELINE) and r["state"] != "RUNNING"
            and not r["interrupted"]]
    out = {"command": shlex.join(["autotune", *argv[3:]]), **run, "trials": rows,
           "points_measured": len(grid)}
    if run["capped"]:
        out["floor_s"] = _floor(run["wall_s"], len(grid), args.points, [r["wall_s"] for r in grid])
        out["pick"] = None
        out["best_so_far"] = _best(rows)
    else:
        report = json.loads((args.results / study / "best.json").read_text())
        best = report.get("best") or {}
        sp = best.get("speedup") or {}
        out["pick"] = {"label": best.get("label"), "speedup": sp.get("output_tok_s"),
                       "interval": [sp.get("output_tok_s_lo"), sp.get("output_tok_s_hi")]}
    print(f"  {strategy}: {run['wall_s']:.0f} s, {len(grid)} points, pick {out.get('pick') or out.get('best_so_far')}",
          flush=True)
    return out


def _confirm(args: argparse.Namespace) -> dict[str, Any]:
    results = args.results / "ttp-predict"
    argv = [*AUTOTUNE, "confirm", str(results)]
    print(f"confirm: {shlex.join(argv[2:])}", flush=True)
    run = _run(argv, log=args.results / "ttp-confirm.log", cap_s=None, stop_sig=signal.SIGTERM)
    out = {**run, **_served(results)}
    print(f"  confirm: {run['wall_s']:.0f} s, served {out['served_speedup']}", flush=True)
    return out


def _served(results: Path) -> dict[str, Any]:
    """What `autotune confirm` wrote into best.json: the served speedup beside the claim."""
    report = json.loads((results / "best.json").read_text())
    served = (report.get("best") or {}).get("served") or {}
    claimed = (served.get("claimed") or {}).get("speedup")
    return {"served_speedup": served.get("speedup"), "interval": [served.get("speedup_lo"), served.get("speedup_hi")],
            "claimed": claimed, "claimed_over_served": claimed / served["speedup"] if claimed and served.get("speedup")
            else None, "line": report.get("served_vs_claimed")}


def _sweep(args: argparse.Namespace, cap_s: float | None) -> dict[str, Any]:
    """`vllm bench sweep serve` over every point of the space, as autotune would export each."""
    from autotune.cli.search import SearchOptions, prepare
    from autotune.core.workload import load_workload
    from autotune.gate import confirm
    from autotune.core.study_report import load_report
    from autotune.serve.export import serve_argv
    from autotune.serve.servers import HOST, free_port

    prep = prepare(SearchOptions(workload=Path(args.workload), space=args.space))
    points = prep.space.grid()
    base_kw = points[0].engine_kwargs(prep.cfg.settings)
    params = []
    for i, cand in enumerate(points):
        kw = cand.engine_kwargs(prep.cfg.settings)
        params.append({"_benchmark_name": f"p{i:03d}", **{k: v for k, v in kw.items()
                                                           if k not in base_kw or base_kw[k] != v}})
    work = args.results / "ttp-sweep"
    work.mkdir(parents=True, exist_ok=True)
    (work / "serve_params.json").write_text(json.dumps(params, indent=1))
    # The sweep resets the prefix cache between runs only for a command whose program is named
    # `vllm`; on the CPU build that console script fails, so a `vllm` that runs vLLM's own CLI.
    shim = Path(tempfile.mkdtemp()) / "vllm"
    shim.write_text(f"#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} -m autotune.vllm_cli \"$@\"\n")
    shim.chmod(0o755)
    port = free_port()
    report = load_report(args.results / "ttp-predict")
    st = confirm.setup(args.results / "ttp-predict", report, load_workload(report["workload"]), python=sys.executable)
    serve_cmd = [str(shim), "serve", *serve_argv(base_kw), "--host", HOST, "--port", str(port)]
    bench_cmd = [str(shim), *st.client[3:], "--base-url", f"http://{HOST}:{port}"]
    argv = [str(shim), "bench", "sweep", "serve", "--serve-cmd", shlex.join(serve_cmd),
            "--bench-cmd", shlex.join(bench_cmd), "--serve-params", str(work / "serve_params.json"),
            "--num-runs", "1", "--continue-on-error", "-o", str(work), "-e", "sweep"]
    print(f"sweep: {len(params)} points, vllm bench sweep serve --num-runs 1", flush=True)
    # SIGKILL to its group (the sweep and its bench client): it went on to the next point after a
    # SIGINT; every finished point is on disk already, and its server is ended by port below.
    run = _run(argv, log=args.results / "ttp-sweep.log", cap_s=cap_s, stop_sig=signal.SIGKILL)
    subprocess.run(["pkill", "-f", "--", f"--port {port}"], check=False)  # a server the sweep left behind
    out = {"command": "vllm bench sweep serve " + shlex.join(argv[4:]), **run, **_sweep_points(work, run["wall_s"],
                                                                                               run["capped"])}
    print(f"  sweep: {run['wall_s']:.0f} s, {out['points_measured']} points", flush=True)
    return out


def _sweep_points(work: Path, wall_s: float, capped: bool) -> dict[str, Any]:
    """The points the sweep finished within ``wall_s``, each timed by its summary file (the sweep's
    start: when serve_params.json was written); a point finished while the sweep was being stopped
    does not count."""
    params = json.loads((work / "serve_params.json").read_text())
    t0 = (work / "serve_params.json").stat().st_mtime
    done = {}
    for f in (work / "sweep").glob("*/summary.json"):
        m = re.search(r"p(\d{3})$", f.parent.name)
        if m and f.stat().st_mtime - t0 <= wall_s:
            done[int(m.group(1))] = (f.stat().st_mtime - t0, json.loads(f.read_text())[0])
    ends = sorted(t for t, _ in done.values())
    per_point = [b - a for a, b in zip([0.0, *ends], ends)]
    rows = [{"point": i, "output_tok_s": d.get("output_throughput"), "done_s": round(t, 1),
             "params": {k: v for k, v in params[i].items() if k != "_benchmark_name"}}
            for i, (t, d) in sorted(done.items())]
    base = next((r["output_tok_s"] for r in rows if r["point"] == 0), None)
    top = max(rows, key=lambda r: r["output_tok_s"] or 0.0, default=None)
    out = {"points_measured": len(rows), "per_point_s": [round(x, 1) for x in per_point], "rows": rows,
           "fastest_so_far" if capped else "fastest": top and {
               **top, "speedup": top["output_tok_s"] / base if base else None}}
    if capped:
        out["floor_s"] = _floor(wall_s, len(rows), len(params), per_point)
    return out


def _share(predict_s: float, arm: dict[str, Any]) -> dict[str, Any]:
    """predict's time over the arm's: exact when the arm finished, an upper bound when it was capped."""
    if not arm["capped"]:
        return {"share": round(predict_s / arm["wall_s"], 3), "bound": "exact"}
    return {"share_below": round(predict_s / arm["wall_s"], 3),
            "share_at_floor": round(predict_s / arm["floor_s"], 3) if arm.get("floor_s") else None,
            "bound": "the arm had not finished when stopped"}


def recount(path: Path) -> None:
    """Rewrite a saved run's figures from its files (runs of this script before the sweep was
    timed by its summaries' files, or the served figures read from best.json)."""
    out = json.loads(path.read_text())
    results = ROOT / out["results"]
    out["arms"]["confirm"].update(_served(results / "ttp-predict"))
    predict_s = out["arms"]["predict"]["wall_s"]
    sweep = out["arms"].get("sweep")
    if sweep and "wall_s" in sweep:
        for k in ("fastest", "fastest_so_far", "floor_s"):
            sweep.pop(k, None)
        sweep.update(_sweep_points(results / "ttp-sweep", sweep["wall_s"], sweep["capped"]))
    for arm in ("sweep", "grid"):
        if "wall_s" in (out["arms"].get(arm) or {}):
            out[f"predict_share_of_{arm}"] = _share(predict_s, out["arms"][arm])
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out.get(k) for k in ("predict_share_of_grid", "predict_share_of_sweep")}, indent=1))


def main() -> None:
    ap = harness.parser(__doc__, out="time_to_pick.json")
    ap.add_argument("--workload", default="examples/json_edit.jsonl")
    ap.add_argument("--space", default="quick")
    ap.add_argument("--trials", type=int, default=8, help="predict's --trials (the demo's)")
    ap.add_argument("--cap", type=float, default=4.0, help="stop grid and sweep after this many times predict's wall")
    ap.add_argument("--arms", default="predict,grid,sweep")
    ap.add_argument("--results", type=Path, default=None, help="default: results/bench/time_to_pick-<time>")
    ap.add_argument("--recount", action="store_true", help="read a saved run's files again (--out, its results "
                    "folder) and rewrite --out: the served figures, the sweep's points within its cap")
    args = ap.parse_args()
    if args.recount:
        return recount(Path(args.out))
    args.results = (args.results or ROOT / "results/bench" / f"time_to_pick-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    args.results.mkdir(parents=True, exist_ok=True)
    from autotune.cli.search import SearchOptions, prepare

    args.points = len(prepare(SearchOptions(workload=Path(args.workload), space=args.space)).space.grid())
    arms = args.arms.split(",")
    out: dict[str, Any] = {"workload": args.workload,
                           "space": args.space, "points": args.points, "cap": args.cap,
                           "results": str(args.results.relative_to(ROOT)), "arms": {}}
    save = lambda: harness.save(args.out, out)  # noqa: E731 - after each arm
    if "predict" in arms:
        out["arms"]["predict"] = _search(args, "predict", args.trials, None)
        save()
        out["arms"]["confirm"] = _confirm(args)
        save()
    else:  # the other arms against a saved predict run (its results folder given with --results)
        saved = json.loads(Path(args.out).read_text())
        out["arms"].update({k: saved["arms"][k] for k in ("predict", "confirm")})
    predict_s = out["arms"]["predict"]["wall_s"]
    cap_s = args.cap * predict_s
    # The sweep first: it reads the dataset confirm wrote, and a fault in it shows within a minute.
    for arm in [a for a in ("sweep", "grid") if a in arms]:
        try:
            out["arms"][arm] = _sweep(args, cap_s) if arm == "sweep" else _search(args, "grid", args.points, cap_s)
            out[f"predict_share_of_{arm}"] = _share(predict_s, out["arms"][arm])
        except Exception as e:  # noqa: BLE001 - record it, then the next arm
            out["arms"][arm] = {"error": f"{type(e).__name__}: {e}"}
            print(f"  {arm} failed: {e}", flush=True)
        save()
    print(json.dumps({k: out.get(k) for k in ("predict_share_of_grid", "predict_share_of_sweep")}, indent=1))

if __name__ == "__main__":
    main()
