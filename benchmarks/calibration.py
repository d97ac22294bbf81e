"""Do the intervals autotune prints cover what they claim? Simulation at this machine's noise.

(a) The interval estimator alone (autotune.measure.metrics.paired_interval, the production code):
    simulated pairs of engine instances with a known true ratio, at the noise measured on the
    2-core EPYC (benchmarks/data/instance_noise*.json): windows inside one instance spread with a
    log sd of 0.02-0.08 (0.04 here), instances with a log sd of 0.05-0.15 a side (spread 10-35%:
    the baseline's 8.4%, the pick's 36% over 5 instances), and a slow drift of the machine's speed
    over the study (-1% per engine slot), rounds in ABBA order as the study runs them. The old
    cluster bootstrap (round 3's, with its selecting pair) beside it, on the same draws.
(b) Whole studies, simulated (no engine): candidates with known true ratios, each measured once on
    one instance (the selecting trial), the best picked, then FIGURE_PAIRS rounds of fresh instances
    of the pick and the baseline, the figure from autotune.study.pareto.speedup (production code).
    How often the pick's interval covers its true ratio; how often, of two configs one stated
    resolution apart (the median resolution the studies state), the better one is picked.

Run: PYTHONPATH=. .venv/bin/python benchmarks/calibration.py [--runs 2000] [--studies 1000]
Writes benchmarks/data/calibration.json. No engine: seconds.
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import math
import time

import numpy as np

from autotune.measure.metrics import paired_interval  # noqa: E402
from autotune.measure.resolution import FIGURE_PAIRS  # noqa: E402
from autotune.study.pareto import speedup  # noqa: E402

WINDOW_SD = 0.04  # log sd of windows inside one instance (instance_noise_windows.json: 0.017-0.077)
WINDOWS = 2  # windows a trial measures (--repeats 2)
DRIFT = -0.01  # the machine's speed per engine slot: slow drift over the study
NOISE = [(0.05, 0.05), (0.05, 0.15), (0.10, 0.10), (0.15, 0.15)]  # (baseline, pick) instance log sd
TRUE = 3.0  # the pick's true speedup in (a)
BASE_TOK_S = 150.0


def instance(rng: np.random.Generator, level: float, sd: float, slot: int) -> list[float]:
    """One engine instance's windows: its level, the instance's noise, the drift at its slot."""
    inst = level * math.exp(rng.normal(0, sd) + DRIFT * slot)
    return [float(inst * math.exp(rng.normal(0, WINDOW_SD))) for _ in range(WINDOWS)]


def rounds(rng: np.random.Generator, ratio: float, sds: tuple[float, float], n: int, start: int
           ) -> tuple[list[list[float]], list[list[float]]]:
    """``n`` re-measurement rounds from engine slot ``start``: (pick instances, baseline instances),
    ABBA (round 1 pick first, as autotune.study.remeasure queues them)."""
    pick, base = [], []
    for r in range(n):
        first_pick = r % 2 == 0
        s0, s1 = start + 2 * r, start + 2 * r + 1
        pick.append(instance(rng, BASE_TOK_S * ratio, sds[1], s0 if first_pick else s1))
        base.append(instance(rng, BASE_TOK_S, sds[0], s1 if first_pick else s0))
    return pick, base


def old_bootstrap(cand: list[list[float]], base: list[list[float]], rng: np.random.Generator, draws: int = 1000
                  ) -> tuple[float, float]:
    """Round 3's paired_interval, vectorised: every pair (the selecting one included), pairs
    resampled, then windows inside each; percentile interval of median(cand) / median(base)."""
    c, b = np.asarray(cand), np.asarray(base)  # (pairs, windows)
    n, w = c.shape
    pick = rng.integers(0, n, (draws, n))
    wi = rng.integers(0, w, (draws, n, w))
    cc = np.take_along_axis(c[pick], wi, axis=2).reshape(draws, -1)
    bb = np.take_along_axis(b[pick], rng.integers(0, w, (draws, n, w)), axis=2).reshape(draws, -1)
    ratios = np.median(cc, axis=1) / np.median(bb, axis=1)
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def estimator(runs: int, seed: int) -> list[dict]:
    """(a): coverage of the true ratio by the new and the old interval, by pairs and noise."""
    out = []
    for sds in NOISE:
        for n in (2, 3, 4, 6):
            rng = np.random.default_rng(seed)
            new = old = 0
            widths = []
            for _ in range(runs):
                sel_p, sel_b = instance(rng, BASE_TOK_S * TRUE, sds[1], 1), instance(rng, BASE_TOK_S, sds[0], 0)
                p, b = rounds(rng, TRUE, sds, n, 10)
                _, lo, hi, pairs = paired_interval([sel_p, *p], [sel_b, *b])
                new += lo <= TRUE <= hi
                widths.append(math.sqrt(hi / lo) - 1)
                o_lo, o_hi = old_bootstrap([sel_p, *p], [sel_b, *b], rng)
                old += o_lo <= TRUE <= o_hi
            out.append({"instance_sd": {"baseline": sds[0], "pick": sds[1]}, "pairs": n, "runs": runs,
                        "coverage_t_interval": new / runs, "coverage_old_bootstrap": old / runs,
                        "median_resolution": float(np.median(widths))})
            print(f"(a) sd {sds} pairs {n}: t-interval {new / runs:.3f}, old bootstrap {old / runs:.3f}, "
                  f"resolution {np.median(widths):.0%}", flush=True)
    return out


def _measurement(windows: list[list[float]]) -> dict:
    flat = [x for w in windows for x in w]
    tok_s = float(np.median(flat))
    return {"output_tok_s": tok_s, "output_tok_s_windows": flat, "output_tok_s_instances": windows,
            "e2e_ms_p50": 1000.0 / tok_s, "tpot_ms_p50": 1000.0 / tok_s}


def studies(n_studies: int, seed: int, sds: tuple[float, float]) -> dict:
    """(b): whole studies, simulated. Candidates: the demo's measured speedups (docs/findings.md:
    suffix 3.2-3.7x, ngram 2.6x, draft 1.4x, eagle3 1.1x), each measured on one instance; the best
    on that instance is picked and re-measured FIGURE_PAIRS rounds beside the baseline."""
    rng = np.random.default_rng(seed)
    trues = [3.4, 3.2, 2.6, 1.4, 1.1]
    covered, old_covered, resolutions, rows, bias, old_bias = 0, 0, [], [], [], []
    for _ in range(n_studies):
        base0 = instance(rng, BASE_TOK_S, sds[0], 0)
        firsts = [instance(rng, BASE_TOK_S * r, sds[1], 1 + i) for i, r in enumerate(trues)]
        k = int(np.argmax([np.median(f) for f in firsts]))
        p, b = rounds(rng, trues[k], sds, FIGURE_PAIRS, 1 + len(trues))
        s = speedup(_measurement([firsts[k], *p]), _measurement([base0, *b]))
        hit = s["output_tok_s_lo"] <= trues[k] <= s["output_tok_s_hi"]
        covered += hit
        o_lo, o_hi = old_bootstrap([firsts[k], *p], [base0, *b], rng)  # round 3's: the selecting pair in
        old_covered += o_lo <= trues[k] <= o_hi
        allp, allb = [x for w in [firsts[k], *p] for x in w], [x for w in [base0, *b] for x in w]
        old_bias.append(math.log(float(np.median(allp) / np.median(allb)) / trues[k]))
        bias.append(math.log(s["output_tok_s"] / trues[k]))
        resolutions.append(math.sqrt(s["output_tok_s_hi"] / s["output_tok_s_lo"]) - 1)
        rows.append({"picked_true": trues[k], "figure": s["output_tok_s"], "lo": s["output_tok_s_lo"],
                     "hi": s["output_tok_s_hi"], "covered": bool(hit)})
    res = float(np.median(resolutions))
    # Two configs one stated resolution apart, each measured once as the study measures candidates:
    # how often the better one is picked.
    right = 0
    for _ in range(n_studies):
        a = np.median(instance(rng, BASE_TOK_S * 3.0 * (1 + res), sds[1], 1))
        b = np.median(instance(rng, BASE_TOK_S * 3.0, sds[1], 2))
        right += a > b
    return {"instance_sd": {"baseline": sds[0], "pick": sds[1]}, "studies": n_studies, "pairs": FIGURE_PAIRS,
            "coverage": covered / n_studies, "median_stated_resolution": res,
            "ordered_one_resolution_apart": right / n_studies,
            "coverage_old_bootstrap_with_selecting_pair": old_covered / n_studies,
            "median_figure_over_true": math.exp(float(np.median(bias))),
            "median_old_figure_over_true": math.exp(float(np.median(old_bias))),
            "examples": rows[:5]}


def main() -> None:
    ap = harness.parser(__doc__, out="calibration.json", summary=True)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--studies", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()
    a = estimator(args.runs, args.seed)
    b = []
    for sds in NOISE:
        r = studies(args.studies, args.seed + 1, sds)
        print(f"(b) sd {sds}: {r['studies']} studies, pick's interval covers its true ratio in {r['coverage']:.1%}; "
              f"stated resolution {r['median_stated_resolution']:.0%}; ordered one resolution apart "
              f"{r['ordered_one_resolution_apart']:.1%}; old bootstrap {r['coverage_old_bootstrap_with_selecting_pair']:.1%}"
              f"; figure/true {r['median_figure_over_true']:.3f} (old {r['median_old_figure_over_true']:.3f})", flush=True)
        b.append(r)
    harness.save(args.out, {
        "what": "coverage of autotune's 95% intervals in simulation at this machine's measured noise",
        "noise": {"window_log_sd": WINDOW_SD, "windows": WINDOWS, "drift_per_engine_slot": DRIFT,
                  "instance_log_sd": NOISE, "from": "benchmarks/data/instance_noise.json, instance_noise_windows.json"},
        "estimator": a, "studies": b, "real_engine": "benchmarks/calibration_engine.py writes it here",
        "wall_s": round(time.time() - t0, 1)})


if __name__ == "__main__":
    main()
