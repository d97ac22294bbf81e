"""Benchmark: could confirm reach +-15% in 3 minutes by measuring each server longer or shorter? (issue 49)

Confirm's rounds are a new server a side, measured in passes of the workload until ``--min-pass-s``
measured seconds (6 s by default). Where does a round's noise sit: inside a server's passes (which
longer measurement averages away) or between rounds (which only more rounds do), and what does each
measured second cost in rounds? One long confirm answers both:

- ``autotune confirm RESULTS --rounds N --min-pass-s S`` on a copy of a results folder (``--rounds 12
  --min-pass-s 12``: 2 baseline passes and ~5 pick passes a round), its console read line by line
  with the time each line came (the engine lock held), so that each side's wall is known beside its
  measured seconds;
- per side: the log spread of passes inside a round (``within``), the spread of round means less
  what the passes contribute (``between``), the covariance of the two sides' round effects, the pass
  duration, and the side's overhead (its wall less its measured seconds: server end, fork, ready,
  warm-up);
- then each floor ``F`` of ``--floors``: a side measures ``ceil(F / pass duration)`` passes (at least
  1, at most confirm's MAX_PASSES), its rounds drawn from the fitted components, their time from the
  measured overheads and pass durations, and decided by confirm's own stopping rule
  (autotune.measure.sequential.Sequential, its defaults: target 10%, 3 minutes from the step's start,
  the start measured here). Per floor: the median resolution where the rule stopped, the share of
  confirms at 15% or better, the rounds, and the coverage of the true ratio at the rule's level;
  then each floor again as if servers started, warmed and ended in no time (a bound, not a design).

``--reuse FILE`` projects again from a saved data file's rounds (no engine).

    .venv/bin/python benchmarks/confirm_allocation.py results/demo [--rounds 12] [--min-pass-s 12]
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import json
import math
import random
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from autotune.gate.confirm import MAX_PASSES
from autotune.measure.intervals import paired_t, resolution
from autotune.measure.sequential import Sequential

SIDES = ("baseline", "pick")
STARTING = re.compile(r"^confirm round (\d+) (baseline|pick): starting ")
STOPPED = re.compile(r"^confirm: stopped after ")
FLOORS = (0.0, 3.0, 6.0, 9.0, 12.0, 18.0, 24.0)


def run_confirm(results: Path, rounds: int, min_pass_s: float, log: Path) -> dict:
    """Confirm on a copy of ``results`` (its own confirm folder dropped); rounds, timing and setup."""
    with tempfile.TemporaryDirectory(prefix="confirm-allocation-") as tmp:
        copy = Path(tmp) / results.name
        shutil.copytree(results, copy, ignore=shutil.ignore_patterns("confirm"))
        argv = [str(harness.ROOT / ".venv/bin/autotune"), "confirm", str(copy), "--rounds", str(rounds),
                "--min-pass-s", str(min_pass_s)]
        rc, start, end, lines = harness.run_locked_timed(argv, log)
        if rc != 0:
            raise SystemExit(f"confirm exited {rc}: see {log}")
        best = json.loads((copy / "best.json").read_text())["best"]
        served = best["served"]
    starts = [(t, int(m[1]), m[2]) for t, line in lines if (m := STARTING.match(line))]
    stop = next(t for t, line in lines if STOPPED.match(line))
    walls = {(n, side): (starts[i + 1][0] if i + 1 < len(starts) else stop) - t for i, (t, n, side) in enumerate(starts)}
    rows = [{"round": r["round"], "side": r["side"], "pass_tok_s": r["pass_tok_s"], "measured_s": r["duration_s"],
             "wall_s": round(walls[(r["round"], r["side"])], 2)} for r in served["per_round"]]
    return {"label": best.get("label"),
            "setup_s": round(starts[0][0] - start, 2), "confirm_s": round(end - start, 1), "rows": rows,
            "speedup": served["speedup"], "resolution": served["resolution"]}


def components(rows: list[dict]) -> dict:
    """Per side: within-round pass log variance, between-round variance, pass and overhead seconds;
    and the covariance of the two sides' round means."""
    out: dict = {}
    means: dict[str, dict[int, float]] = {}
    for side in SIDES:
        mine = [r for r in rows if r["side"] == side]
        logs = {r["round"]: [math.log(x) for x in r["pass_tok_s"]] for r in mine}
        means[side] = {n: statistics.fmean(v) for n, v in logs.items()}
        within = statistics.fmean(statistics.variance(v) for v in logs.values() if len(v) > 1)
        k = statistics.fmean(len(v) for v in logs.values())
        passes = sum(len(v) for v in logs.values())
        out[side] = {"within_var": within, "between_var": max(0.0, statistics.variance(means[side].values()) - within / k),
                     "passes_per_round": k, "pass_s": sum(r["measured_s"] for r in mine) / passes,
                     "overhead_s": statistics.median(r["wall_s"] - r["measured_s"] for r in mine),
                     "mean_log": statistics.fmean(means[side].values())}
        out[side] |= {"within_sd": math.sqrt(out[side]["within_var"]), "between_sd": math.sqrt(out[side]["between_var"])}
    common = sorted(set(means["baseline"]) & set(means["pick"]))
    out["between_cov"] = statistics.covariance([means["baseline"][n] for n in common], [means["pick"][n] for n in common])
    ratios = [means["pick"][n] - means["baseline"][n] for n in common]
    out["round_log_ratio_sd"] = statistics.stdev(ratios)
    out["round_log_ratio_lag1"] = harness.lag1([ratios])
    return out


def project(c: dict, setup_s: float, floor: float, confirms: int, seed: int, free_starts: bool = False) -> dict:
    """Confirms drawn from the components ``c`` at a pass floor ``floor``, stopped by confirm's rule
    (``free_starts``: as if a server started, warmed and ended in no time, a bound no design reaches)."""
    rng = random.Random(f"{seed}/{floor}")
    k = {s: min(MAX_PASSES, max(1, math.ceil(floor / c[s]["pass_s"]))) for s in SIDES}
    side_s = {s: (0.0 if free_starts else c[s]["overhead_s"]) + k[s] * c[s]["pass_s"] for s in SIDES}
    vb, vp, cov = c["baseline"]["between_var"], c["pick"]["between_var"], c["between_cov"]
    a = math.sqrt(vb)  # the two sides' round effects: a bivariate normal by its Cholesky factor
    b21 = cov / a if a > 0 else 0.0
    b22 = math.sqrt(max(0.0, vp - b21 * b21))
    truth = c["pick"]["mean_log"] - c["baseline"]["mean_log"]
    rule = Sequential()
    res, rounds, covered = [], [], 0
    for _ in range(confirms):
        pick, base, elapsed = [], [], setup_s
        while True:
            z1, z2 = rng.gauss(0, 1), rng.gauss(0, 1)
            eff = {"baseline": a * z1, "pick": b21 * z1 + b22 * z2}
            for s, out in (("baseline", base), ("pick", pick)):
                noise = statistics.fmean(rng.gauss(0, math.sqrt(c[s]["within_var"])) for _ in range(k[s]))
                out.append(math.exp(c[s]["mean_log"] + eff[s] + noise))
            elapsed += side_s["baseline"] + side_s["pick"]
            if rule.stop(pick, base, elapsed, setup_s) is not None:
                break
        _, lo, hi, _ = paired_t(pick, base, level=rule.level)
        res.append(resolution(lo, hi))
        rounds.append(len(pick))
        covered += lo <= math.exp(truth) <= hi
    return {"floor_s": floor, "free_starts": free_starts, "passes": k, "round_s": round(side_s["baseline"] + side_s["pick"], 1),
            "median_rounds": statistics.median(rounds), "median_resolution": round(statistics.median(res), 3),
            "share_15": round(sum(r <= 0.15 for r in res) / confirms, 3), "coverage": round(covered / confirms, 3)}


def main() -> int:
    ap = harness.parser(__doc__, out="confirm_allocation.json")
    ap.add_argument("results", nargs="?", type=Path, help="a results folder with best.json (copied, never written)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--min-pass-s", type=float, default=12.0)
    ap.add_argument("--confirms", type=int, default=2000, help="simulated confirms per floor")
    ap.add_argument("--floors", type=lambda s: [float(x) for x in s.split(",")], default=list(FLOORS))
    ap.add_argument("--reuse", type=Path, help="a saved data file: project again from its rounds, no engine")
    args = ap.parse_args()
    if args.reuse:
        run = json.loads(args.reuse.read_text())["run"]
    elif args.results:
        log = Path(args.out).with_suffix(".log")
        run = run_confirm(args.results, args.rounds, args.min_pass_s, log)
        run["log"] = log.name
    else:
        ap.error("a results folder, or --reuse FILE")
    c = components(run["rows"])
    rows = [project(c, run["setup_s"], f, args.confirms, seed=0) for f in args.floors]
    rows += [project(c, run["setup_s"], f, args.confirms, seed=0, free_starts=True) for f in args.floors]
    for r in rows:
        print(f"floor {r['floor_s']:>4g} s{' (free starts)' if r['free_starts'] else ''}: passes {r['passes']}, round {r['round_s']} s, rounds {r['median_rounds']}, "
              f"resolution {r['median_resolution']:.1%} (median), <=15% in {r['share_15']:.0%}, coverage {r['coverage']:.1%}")
    print(f"round log ratio sd {c['round_log_ratio_sd']:.3f}, lag-1 {c['round_log_ratio_lag1']:+.2f}; "
          + ", ".join(f"{s}: within {c[s]['within_sd']:.3f} a pass, between {c[s]['between_sd']:.3f}, "
                      f"overhead {c[s]['overhead_s']:.1f} s" for s in SIDES))
    harness.save(args.out, {"what": "confirm's variance by pass and by round, and the resolution each pass floor "
                                    "would reach in 3 minutes under confirm's own stopping rule",
                            "command": f"autotune confirm --rounds {args.rounds} --min-pass-s {args.min_pass_s}",
                            "run": run, "components": c, "confirms": args.confirms, "by_floor": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
