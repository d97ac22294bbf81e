"""Where does this machine sit on the calibration's persistence axis? The saved real-engine rounds
against the noise model's (tests/machine_noise.py) at each persistence φ.

The coverage calibration (calibration_fake.py) varies φ, the persistence of the machine's state from
one engine instance to the next, from 0 to 0.9, and the figures cover 93-97% up to φ 0.5 but not at
0.8. Which φ fits the machine the demo runs measured? Two saved series, each run's rounds in the
order they ran: confirm's served rounds (``vllm bench serve``, a new server a side and round, about
13 s each: claim_vs_served.json, claim_vs_served_s4.json, demo_s5.log) and the study's holdout pairs
(autotune's client on fresh engines, about 30 s each: demo_round5_run*.log,
claim_vs_served_s4_run*.log). For each, the pooled lag-1 autocorrelation of every run's log ratios
(pick over baseline) about the run's own mean, and their median spread within a run; then the same
two numbers from the model at each φ, drawn in the same ABBA order and the same run lengths, over
``--sets`` replicate sets. A φ fits where its lag-1 lies within two of its sets' sd of the observed;
the spread is the sharper test where the runs are short (4 pairs: lag-1 hardly moves with φ), but it
rests on the model's marginal spreads (instance_noise.json), which the lag-1 does not.
No engine: the saved data and the model only.

Run: .venv/bin/python benchmarks/machine_persistence.py [--sets 200]
Writes benchmarks/data/machine_persistence.json.
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import json
import math
import random
import re
import statistics
import sys

sys.path.insert(0, str(harness.ROOT / "tests"))

from machine_noise import Noise  # noqa: E402

from autotune.measure.intervals import abba  # noqa: E402

PHIS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9)
HOLDOUT = re.compile(r"^trial\s+\d+\s+(.*?)\s+holdout round h\d+\.(\d+), not pooled: ([\d.]+) ")
SERVED = re.compile(r"^confirm round (\d+) (baseline|pick): ([\d.]+) output tok/s")


def _log_ratios(by_round: dict[int, dict[str, float]]) -> list[float]:
    return [math.log(r["pick"] / r["baseline"]) for _, r in sorted(by_round.items()) if len(r) == 2]


def _from_log(path, pattern, side_of) -> list[float]:
    by: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        m = pattern.match(line)
        if m:
            side, n, v = side_of(m)
            by.setdefault(int(n), {})[side] = float(v)
    return _log_ratios(by)


def served_runs() -> list[list[float]]:
    runs = []
    for name in ("claim_vs_served.json", "claim_vs_served_s4.json"):
        for row in json.loads((harness.DATA / name).read_text())["rows"]:
            if row.get("pick_tok_s") and row.get("baseline_tok_s"):
                runs.append([math.log(a / b) for a, b in zip(row["pick_tok_s"], row["baseline_tok_s"])])
    runs.append(_from_log(harness.DATA / "demo_s5.log", SERVED, lambda m: (m[2], m[1], m[3])))
    return runs


def holdout_runs() -> list[list[float]]:
    logs = sorted(harness.DATA.glob("demo_round5_run*.log")) + sorted(harness.DATA.glob("claim_vs_served_s4_run*.log"))
    side = lambda m: ("baseline" if m[1].startswith("none") else "pick", m[2], m[3])  # noqa: E731
    return [y for y in (_from_log(p, HOLDOUT, side) for p in logs) if len(y) >= 3]


def lag1_and_spread(runs: list[list[float]]) -> tuple[float, float]:
    """Pooled lag-1 autocorrelation about each run's mean, and the median within-run sd."""
    return harness.lag1(runs), statistics.median(statistics.stdev(y) for y in runs)


def model_runs(phi: float, lengths: list[int], rep: int, window_sd: float) -> list[list[float]]:
    """Runs of the given lengths drawn from the noise model at ``phi``, in the ABBA order."""
    noise, rng, out = Noise(phi=phi), random.Random(f"persistence/{phi}/{rep}"), []
    for k, n in enumerate(lengths):
        seed, order = 1000 * rep + k, [s for r in range(1, n + 1) for s in abba(r, ("baseline", "pick"))]
        logs = [noise.log_factor(seed, 20 + i, s == "pick", rng) + rng.gauss(0, window_sd) for i, s in enumerate(order)]
        pick = [x for x, s in zip(logs, order) if s == "pick"]
        base = [x for x, s in zip(logs, order) if s == "baseline"]
        out.append([a - b for a, b in zip(pick, base)])
    return out


def fit(runs: list[list[float]], sets: int, window_sd: float) -> dict:
    lag, sd = lag1_and_spread(runs)
    lengths, by_phi = [len(y) for y in runs], {}
    for phi in PHIS:
        got = [lag1_and_spread(model_runs(phi, lengths, r, window_sd)) for r in range(sets)]
        lags = [g[0] for g in got]
        by_phi[str(phi)] = {"lag1": statistics.mean(lags), "lag1_sd": statistics.stdev(lags),
                            "spread": statistics.mean(g[1] for g in got)}
    fits = [float(p) for p, v in by_phi.items() if abs(v["lag1"] - lag) <= 2 * v["lag1_sd"]]
    return {"runs": len(runs), "lengths": lengths, "observed": {"lag1": lag, "spread": sd}, "model": by_phi,
            "phi_fits_lag1": fits, "phi_nearest_lag1": min(by_phi, key=lambda p: abs(by_phi[p]["lag1"] - lag)),
            "phi_nearest_spread": min(by_phi, key=lambda p: abs(by_phi[p]["spread"] - sd))}


def main() -> None:
    ap = harness.parser(__doc__, out="machine_persistence.json", summary=True)
    ap.add_argument("--sets", type=int, default=200, help="replicate sets of the model a persistence")
    args = ap.parse_args()
    w = Noise().window_sd
    out = {"served": fit(served_runs(), args.sets, w / 2), "holdout": fit(holdout_runs(), args.sets, w / 2)}
    for k, v in out.items():
        print(f"{k}: {v['runs']} runs, observed lag-1 {v['observed']['lag1']:.3f}, spread {v['observed']['spread']:.3f}; "
              f"phi fitting the lag-1 {v['phi_fits_lag1']}, nearest {v['phi_nearest_lag1']}; nearest spread "
              f"{v['phi_nearest_spread']}", flush=True)
        for p, m in v["model"].items():
            print(f"  phi {p}: lag-1 {m['lag1']:.3f} (sd {m['lag1_sd']:.3f}), spread {m['spread']:.3f}")
    harness.save(args.out, {"what": "the persistence of this machine's state that fits the saved rounds (lag-1 "
                                    "autocorrelation of each run's log ratios) against the noise model's",
                            "noise": Noise().__dict__ | {"phi": list(PHIS)}, "sets": args.sets, **out})


if __name__ == "__main__":
    main()
