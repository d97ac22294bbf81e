"""Calibration on the real engine: demo studies, each followed by confirm. How often does the served
figure lie inside the study's claimed 95% interval, and what is claimed/served?

Each run is `scripts/demo.sh`'s search (--space quick --trials 8 --confirm) in a fresh results
folder, under the machine-wide engine lock (one engine at a time); a run starts only before
``--until`` (epoch seconds), so a session's time bounds it. Earlier runs' folders may be added
with ``--add FOLDER`` (their best.json is read). Appends to benchmarks/data/calibration_engine.json.

Run: PYTHONPATH=. .venv/bin/python benchmarks/calibration_engine.py --runs 5 [--until EPOCH] [--add DIR]
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = harness.ROOT
LOCK = harness.ENGINE_LOCK


def row(folder: Path, wall_s: float | None) -> dict:
    b = json.loads((folder / "best.json").read_text())
    sp, sv = b["best"]["speedup"], b["best"].get("served") or {}
    served, lo, hi = sv.get("speedup"), sp.get("output_tok_s_lo"), sp.get("output_tok_s_hi")
    return {"folder": str(folder), "wall_s": wall_s, "pick": b["best"]["label"],
            "claimed": sp.get("output_tok_s"), "claimed_lo": lo, "claimed_hi": hi,
            "claimed_unit": sp.get("output_tok_s_unit"), "pairs": sp.get("output_tok_s_pairs"),
            "served": served, "served_lo": sv.get("speedup_lo"), "served_hi": sv.get("speedup_hi"),
            "served_inside_claimed": None if None in (served, lo, hi) else bool(lo <= served <= hi),
            "claimed_over_served": sp["output_tok_s"] / served if served else None,
            "verdict": (b.get("served_vs_claimed") or "").split(":")[0]}


def main() -> None:
    ap = harness.parser(__doc__, out="calibration_engine.json", summary=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--until", type=float, default=float("inf"), help="start no run after this epoch time")
    ap.add_argument("--add", type=Path, action="append", default=[], help="an earlier run's results folder")
    args = ap.parse_args()
    data = json.loads(args.out.read_text()) if args.out.is_file() else {
        "what": "demo studies (search --space quick --trials 8 --confirm) on the real engine: the served figure "
                "against the claimed 95% interval",
        "rows": []}
    data["rows"] += [row(f, None) for f in args.add]
    for i in range(args.runs):
        if time.time() > args.until:
            print(f"stopped before run {i + 1}: past --until")
            break
        out = Path(tempfile.mkdtemp(prefix="calib-"))
        t0 = time.time()
        cmd = ["flock", LOCK, str(ROOT / ".venv/bin/autotune"), "search", "examples/json_edit.jsonl", "--space",
               "quick", "--trials", "8", "--study", "demo", "--confirm", "--results", str(out)]
        r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
        if r.returncode != 0:
            data["rows"].append({"folder": str(out), "error": r.stdout[-500:] + r.stderr[-500:]})
        else:
            data["rows"].append(row(out / "demo", round(time.time() - t0, 1)))
        print(json.dumps(data["rows"][-1]), flush=True)
        _summary(data, args.out)
    _summary(data, args.out)


def _summary(data: dict, out: Path) -> None:
    done = [x for x in data["rows"] if x.get("served_inside_claimed") is not None]
    data["runs"] = len(data["rows"])
    data["served_inside_claimed"] = f"{sum(x['served_inside_claimed'] for x in done)} of {len(done)}"
    data["claimed_over_served"] = [round(x["claimed_over_served"], 3) for x in done]
    harness.save(out, data)


if __name__ == "__main__":
    sys.exit(main())
