"""Benchmark: the demo's wall time with the launcher and without it, in one run (not a test).

Runs the demo's own command (what scripts/demo.sh runs after its setup: ``autotune search
examples/json_edit.jsonl --space quick --trials 8 --study demo --confirm``) with ``--no-launcher``
(every trial a fresh worker and a fresh `vllm serve`, confirm's servers and clients fresh processes,
as before) and as it is now (the launcher, autotune.run.launcher, which also forks confirm's servers
and clients), alternating run by run, each into a fresh results folder. For each run:
the whole wall, the study's part and confirm's (confirm starts when the study's report is
written), every trial's ``engine_init_s`` and wall (trials.csv), the pick, its claimed and
served speedup. Both arms in one run, because this machine's speed drifts between sessions by more
than the saving (the demo's baseline served 143-416 tok/s across earlier runs).

    .venv/bin/python benchmarks/demo_time.py [--pairs 1] [--out benchmarks/data/demo_time.json]
"""

from __future__ import annotations

import csv
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

ROOT = harness.ROOT

COMMAND = ["search", "examples/json_edit.jsonl", "--space", "quick", "--trials", "8", "--study", "demo", "--confirm"]


def study_seconds(study: Path, t0: float) -> float | None:
    """Seconds from ``t0`` to confirm's start: the first file confirm writes (its scripts)."""
    made = [f.stat().st_mtime for f in (study / "confirm").rglob("*") if f.is_file()]
    return min(made) - t0 if made else None


def recount(path: Path) -> None:
    """Recompute each run's study/confirm split in a saved output (a run's start: its log's time,
    written when the run ended, less its wall)."""
    data = json.loads(path.read_text())
    root = Path(data["folder"])
    for r in data["runs"]:
        if "failure" in r:
            continue
        t0 = (root / r["log"]).stat().st_mtime - r["wall_s"]
        s = study_seconds(Path(r["folder"]) / "demo", t0)
        r["study_s"], r["confirm_s"] = round(s, 1), round(r["wall_s"] - s, 1)
    data["summary"] = summarize(data["runs"])
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data["summary"], indent=1))


def run_once(n: int, arm: str, root: Path) -> dict[str, Any]:
    out = root / f"{n}-{arm}"
    cmd = [str(ROOT / ".venv/bin/autotune"), *COMMAND, "--results", str(out),
           *(["--no-launcher"] if arm == "fresh" else [])]
    t0 = time.time()
    proc, wall = harness.run_logged(cmd, root / f"{n}-{arm}.log")
    study = out / "demo"
    best_path = study / "best.json"
    if proc.returncode != 0 or not best_path.exists():
        return {"run": n, "arm": arm, "wall_s": round(wall, 1),
                "failure": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    best = json.loads(best_path.read_text())
    study_s = study_seconds(study, t0)
    rows = list(csv.DictReader(open(study / "trials.csv")))
    init = [float(r["engine_init_s"]) for r in rows if r.get("engine_init_s")]
    b, sv = best.get("best") or {}, (best.get("best") or {}).get("served") or {}
    return {"run": n, "arm": arm, "wall_s": round(wall, 1),
            "study_s": round(study_s, 1) if study_s is not None else None,
            "confirm_s": round(wall - study_s, 1) if study_s is not None else None,
            "trials": len(rows), "engine_init_s": [round(x, 1) for x in init],
            "trial_wall_s": [round(float(r["wall_s"]), 1) for r in rows if r.get("wall_s")],
            "pick": b.get("label"), "claimed": (b.get("speedup") or {}).get("output_tok_s"),
            "served": sv.get("speedup"), "served_lo": sv.get("speedup_lo"), "served_hi": sv.get("speedup_hi"),
            "confirm_servers": sv.get("servers") or "fresh",  # results before the launcher forked confirm's
            "confirm_ready_s": [r.get("ready_s") for r in sv.get("per_round", [])],
            "confirm_tok_s": {"baseline": sv.get("baseline_output_tok_s"), "pick": sv.get("pick_output_tok_s")},
            "baseline_tok_s": ((best.get("baseline") or {}).get("measurement") or {}).get("output_tok_s"),
            "log": f"{n}-{arm}.log", "folder": str(out)}


def main() -> None:
    ap = harness.parser(__doc__, out="demo_time.json")
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--results", type=Path, default=None, help="default: a fresh temporary folder")
    ap.add_argument("--recount", action="store_true", help="recompute the study/confirm split of the saved --out")
    args = ap.parse_args()
    if args.recount:
        recount(Path(args.out))
        return
    root = args.results or Path(tempfile.mkdtemp(prefix="demo-time-"))
    root.mkdir(parents=True, exist_ok=True)
    order = [arm for i in range(args.pairs) for arm in (("fresh", "launched") if i % 2 == 0 else ("launched", "fresh"))]
    runs = []
    for n, arm in enumerate(order):
        runs.append(run_once(n, arm, root))
        r = runs[-1]
        print(json.dumps({k: v for k, v in r.items() if k not in ("trial_wall_s",)}), flush=True)
    summary = summarize(runs)
    print(json.dumps(summary, indent=1))
    harness.save(args.out, {"command": ["autotune", *COMMAND], "order": order, "runs": runs, "summary": summary,
                            "folder": str(root)})


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = {arm: [r for r in runs if r["arm"] == arm and "failure" not in r] for arm in ("fresh", "launched")}
    summary: dict[str, Any] = {}
    if ok["fresh"] and ok["launched"]:
        med = {a: statistics.median(r["wall_s"] for r in v) for a, v in ok.items()}
        summary = {"wall_s_median": med, "wall_ratio_launched_over_fresh": round(med["launched"] / med["fresh"], 3),
                   "study_s_median": {a: statistics.median(r["study_s"] for r in v) for a, v in ok.items()},
                   "confirm_s_median": {a: statistics.median(r["confirm_s"] for r in v) for a, v in ok.items()},
                   # every trial after each run's first (the baseline, whose worker starts the launcher's first fork)
                   "engine_init_s_after_first": {a: [x for r in v for x in r["engine_init_s"][1:]] for a, v in ok.items()}}
        after = summary["engine_init_s_after_first"]
        summary["engine_init_s_after_first_max"] = {a: max(v) for a, v in after.items() if v}
        summary["engine_init_s_after_first_median"] = {a: statistics.median(v) for a, v in after.items() if v}
    return summary


if __name__ == "__main__":
    main()
