"""Does the study's figure agree with the served one? N demo runs with --confirm on the real engine.

Each run is `scripts/demo.sh`'s search (--space quick --candidates 8 --study demo) in a fresh results
folder, then `autotune confirm` on it, both under the machine-wide engine lock, the console read line by
line with the time each line came. The search runs without --confirm so that the study measures its own
figure (the holdout's pairs, what a study without --confirm reports); confirm then measures the served
figure as `search --confirm` would. Per run: the pick, the study's claim (best.json's
``best.speedup``: the selection phase's measured ratio), the study's figure (best.json's ``figure``
after the search), the served figure (its ``figure`` after confirm), their log ratios, confirm's
rounds, resolution and why it stopped, and the walls: the study until its holdout (what
`search --confirm` runs before confirm), the holdout, confirm. The summary: the mean
log(study figure / served) with its 95% t-interval over runs (issue 49: it should contain 0,
half-width at most 0.05), the same for the claim, how many lie above. Each run's console is kept as
``demo_round5_run<N>.log`` beside the data file (another ``--out``: ``<its stem>_run<N>.log``).

Run: .venv/bin/python benchmarks/claim_vs_served.py --runs 8 [--until EPOCH]
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = harness.ROOT
DEMO = ["search", "examples/json_edit.jsonl", "--space", "quick", "--candidates", "8", "--study", "demo"]
HOLDOUT_LINE = "holdout round "  # a holdout trial's line names it (printed as the trial ends)


def run_once(i: int, log_dir: Path, stem: str = "demo_round5") -> dict:
    out = Path(tempfile.mkdtemp(prefix="claim-"))
    exe = str(ROOT / ".venv/bin/autotune")
    # one lock for both: no other engine between the study and its confirm; the study's figure is
    # saved before confirm replaces it with the served one
    script = (f"{exe} {' '.join(DEMO)} --results {out} && cp {out}/demo/best.json {out}/study_best.json"
              f" && echo 'confirm starts' && {exe} confirm {out}/demo")
    log = log_dir / f"{stem}_run{i}.log"
    rc, _, end, lines = harness.run_locked_timed(["bash", "-c", script], log, env={**os.environ, "COLUMNS": "200"})
    t_lock = lines[0][0] if lines else None  # the first line: the study started
    if rc != 0:
        return {"run": i, "error": "\n".join(x for _, x in lines[-8:]), "log": log.name}
    confirm_at = next((t for t, x in lines if x == "confirm starts"), end)
    # the holdout began as the trial before its first round ended
    first = next((j for j, (_, x) in enumerate(lines) if HOLDOUT_LINE in x), None)
    holdout_at = next((t for t, x in reversed(lines[:first]) if x.lstrip().startswith("trial")), confirm_at) \
        if first is not None else confirm_at
    b = json.loads((out / "demo" / "best.json").read_text())
    study = (json.loads((out / "study_best.json").read_text()).get("figure") or {})
    claim, f, sv = b["best"]["speedup"], b.get("figure") or {}, b["best"].get("served") or {}
    served, figure = f.get("speedup"), study.get("speedup")
    return {"run": i, "log": log.name, "pick": b["best"]["label"], "selection": b.get("selection"),
            "claimed": claim.get("output_tok_s"), "claimed_lo": claim.get("output_tok_s_lo"),
            "claimed_hi": claim.get("output_tok_s_hi"), "claimed_unit": claim.get("output_tok_s_unit"),
            "figure": figure, "figure_lo": study.get("lo"), "figure_hi": study.get("hi"),
            "figure_pairs": study.get("pairs"), "figure_status": study.get("status"),
            "log_figure_over_served": math.log(figure / served) if served and figure else None,
            "served": served, "served_lo": f.get("lo"), "served_hi": f.get("hi"), "served_rounds": f.get("pairs"),
            "served_resolution": f.get("resolution"), "stopped": sv.get("stopped"),
            "pick_tok_s": sv.get("pick_output_tok_s"), "baseline_tok_s": sv.get("baseline_output_tok_s"),
            "passes": sv.get("passes"),
            "log_claim_over_served": math.log(claim["output_tok_s"] / served) if served else None,
            "study_s": round(holdout_at - (t_lock or end), 1), "holdout_s": round(confirm_at - holdout_at, 1),
            "confirm_s": round(end - confirm_at, 1),
            "trials": b["trials"]["finished"]}


def summary(rows: list[dict]) -> dict:
    from autotune.measure.intervals import t_quantile

    out: dict = {"runs": len(rows), "failed": sum("error" in r for r in rows)}
    for name in ("figure", "claim"):
        logs = [r[f"log_{name}_over_served"] for r in rows if r.get(f"log_{name}_over_served") is not None]
        out[f"{name}_with_served"] = len(logs)
        if len(logs) >= 2:
            mean, sd = statistics.mean(logs), statistics.stdev(logs)
            half = t_quantile(len(logs) - 1) * sd / math.sqrt(len(logs))
            out[name] = dict(mean_log=mean, sd_log=sd, lo=mean - half, hi=mean + half, half_width=half,
                             contains_0=bool(mean - half <= 0 <= mean + half), above=sum(x > 0 for x in logs),
                             median_over_served=math.exp(statistics.median(logs)))
    done = [r for r in rows if "error" not in r]
    if done:
        out.update(median_study_s=statistics.median(r["study_s"] for r in done),
                   median_holdout_s=statistics.median(r["holdout_s"] for r in done),
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
        stem = "demo_round5" if args.out.name == "claim_vs_served.json" else args.out.stem
        data["rows"].append(run_once(i, args.out.parent, stem))
        print(json.dumps(data["rows"][-1]), flush=True)
        data["summary"] = summary(data["rows"])
        harness.save(args.out, data)
    print(json.dumps(data.get("summary"), indent=1))


if __name__ == "__main__":
    sys.exit(main())
