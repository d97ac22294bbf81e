"""Does the study's figure agree with the served one? N demo runs with --confirm on the real engine.

Each run is `scripts/demo.sh`'s search (--space quick --candidates 8 --study demo --confirm) in a fresh
results folder, under the machine-wide engine lock, its console read line by line with the time each
line came: the study's wall (until confirm's first round) and confirm's. Per run: the pick, the
study's claim (best.json's ``best.speedup``: the selection phase's measured ratio), the figure
(best.json's ``figure``: confirm's served rounds, the holdout), their log ratio, confirm's rounds,
resolution and why it stopped. The summary: the mean log(claim / served) with its 95% t-interval
over runs (issue 49: it should contain 0, half-width at most 0.05), how many claims lie above. Each
run's console is kept as ``demo_round5_run<N>.log`` beside the data file.

Run: .venv/bin/python benchmarks/claim_vs_served.py --runs 8 [--until EPOCH]
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = harness.ROOT
LOCK = "/tmp/autotune-engine.lock"
DEMO = ["search", "examples/json_edit.jsonl", "--space", "quick", "--candidates", "8", "--study", "demo", "--confirm"]


def run_once(i: int, log_dir: Path) -> dict:
    out = Path(tempfile.mkdtemp(prefix="claim-"))
    cmd = ["flock", LOCK, str(ROOT / ".venv/bin/autotune"), *DEMO, "--results", str(out)]
    lines: list[tuple[float, str]] = []
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "COLUMNS": "200"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    t_lock = None
    for line in proc.stdout:  # type: ignore[union-attr]
        now = time.time()
        t_lock = t_lock or now  # the first line: the lock was held and the study started
        lines.append((now, line.rstrip("\n")))
    rc = proc.wait()
    end = time.time()
    log = log_dir / f"demo_round5_run{i}.log"
    log.write_text("\n".join(x for _, x in lines) + f"\nrc={rc}\n")
    if rc != 0:
        return {"run": i, "error": "\n".join(x for _, x in lines[-8:]), "log": log.name}
    confirm_at = next((t for t, x in lines if x.startswith("confirm round 1 ")), end)
    b = json.loads((out / "demo" / "best.json").read_text())
    claim, f, sv = b["best"]["speedup"], b.get("figure") or {}, b["best"].get("served") or {}
    served = f.get("speedup")
    return {"run": i, "log": log.name, "pick": b["best"]["label"], "selection": b.get("selection"),
            "claimed": claim.get("output_tok_s"), "claimed_lo": claim.get("output_tok_s_lo"),
            "claimed_hi": claim.get("output_tok_s_hi"), "claimed_unit": claim.get("output_tok_s_unit"),
            "served": served, "served_lo": f.get("lo"), "served_hi": f.get("hi"), "served_rounds": f.get("pairs"),
            "served_resolution": f.get("resolution"), "stopped": sv.get("stopped"),
            "pick_tok_s": sv.get("pick_output_tok_s"), "baseline_tok_s": sv.get("baseline_output_tok_s"),
            "passes": sv.get("passes"),
            "log_claim_over_served": math.log(claim["output_tok_s"] / served) if served else None,
            "study_s": round(confirm_at - (t_lock or end), 1), "confirm_s": round(end - confirm_at, 1),
            "trials": b["trials"]["finished"]}


def summary(rows: list[dict]) -> dict:
    from autotune.measure.intervals import t_quantile

    logs = [r["log_claim_over_served"] for r in rows if r.get("log_claim_over_served") is not None]
    out: dict = {"runs": len(rows), "with_served": len(logs), "failed": sum("error" in r for r in rows)}
    if len(logs) >= 2:
        mean, sd = statistics.mean(logs), statistics.stdev(logs)
        half = t_quantile(len(logs) - 1) * sd / math.sqrt(len(logs))
        out.update(mean_log=mean, sd_log=sd, lo=mean - half, hi=mean + half, half_width=half,
                   contains_0=bool(mean - half <= 0 <= mean + half), claims_above=sum(x > 0 for x in logs),
                   median_claim_over_served=math.exp(statistics.median(logs)))
    done = [r for r in rows if "error" not in r]
    if done:
        out.update(median_study_s=statistics.median(r["study_s"] for r in done),
                   median_confirm_s=statistics.median(r["confirm_s"] for r in done),
                   max_confirm_s=max(r["confirm_s"] for r in done),
                   served_resolutions=[r["served_resolution"] for r in done],
                   median_served_rounds=statistics.median(r["served_rounds"] or 0 for r in done))
    return out


def main() -> None:
    ap = harness.parser(__doc__, out="claim_vs_served.json", summary=True)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--until", type=float, default=float("inf"), help="start no run after this epoch time")
    args = ap.parse_args()
    data = json.loads(args.out.read_text()) if args.out.is_file() else {"rows": []}
    data["what"] = ("demo studies with --confirm on the real engine: the study's claim (best.speedup) against "
                    "the served figure (best.json's figure, confirm's rounds), and the walls of each part")
    data["command"] = " ".join(["autotune", *DEMO])
    for _ in range(args.runs):
        if time.time() > args.until:
            print("stopped: past --until", flush=True)
            break
        i = len(data["rows"]) + 1
        data["rows"].append(run_once(i, args.out.parent))
        print(json.dumps(data["rows"][-1]), flush=True)
        data["summary"] = summary(data["rows"])
        harness.save(args.out, data)
    print(json.dumps(data.get("summary"), indent=1))


if __name__ == "__main__":
    sys.exit(main())
