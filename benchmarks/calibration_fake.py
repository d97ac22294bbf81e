"""Does the pick's 95% interval cover its true speedup? autotune's own selection and estimate, at the
noise this project measured, with five candidates within 15% of each other.

Every study runs autotune's loop (autotune.study.loop.run_study): the baseline and five ngram depths
(true speedups 3.0x and 3.5-14% below it, shuffled over the depths), the selection rounds where the
runner-up comes within the selection band, the choice, then the holdout; the figure is
autotune.study.figures.pick_figure's, over the holdout pairs alone. Engine instances follow
tests/machine_noise.py: the machine's state persists from one instance to the next (``--phi``), a
speculative config moves with it more than the baseline (log sd 0.149 against 0.046, correlation
0.90: benchmarks/data/instance_noise.json), a slow drift, windows 4% apart.

``--mode memory`` (default): the study's loop in memory, each instance's windows drawn from the model
(tests/sim_study.py); also the ``--confirm`` path: the same seed's study with no holdout, then confirm's
served rounds (the holdout) drawn from the same model right after it, stopped by confirm's own rule
(autotune.measure.sequential).
``--mode fake``: whole studies on the FAKE engine (tests/fake_engine.py, a worker process per trial,
AUTOTUNE_FAKE_STATE and AUTOTUNE_FAKE_TRUE), at one ``--phi``. ``--mode gate``: warm-started studies in
memory whose new candidate (ngram k=1) is as fast as the deployed config (k=2) or 10% slower, chosen by
the study or, for the 10% regression, planted as the pick; then `autotune check`
(autotune.gate.check.compare) on the study's report at ``--tolerance``: how often it passes, fails and
cannot tell, and the pairs the gate's rounds measured.

Run: PYTHONPATH=.:tests .venv/bin/python benchmarks/calibration_fake.py [--mode memory] [--studies 1000]
Writes benchmarks/data/calibration_holdout.json (memory) or calibration_fake_studies.json (fake).
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(harness.ROOT / "tests"))

from machine_noise import Noise  # noqa: E402


def _figure(view) -> tuple[dict, float, str]:
    from autotune.study.figures import pick_figure
    from autotune.study.holdout import the_pick
    from sim_study import Truth

    pick = the_pick(view)
    truth = Truth.drawn(int(view.name.removeprefix("sim")))
    return pick_figure(view, pick, chosen=True), truth.of(pick.user_attrs["candidate"]), pick.user_attrs["label"]


def _served(seed: int, noise: Noise) -> dict:
    """What `search --confirm` does: a study with no holdout (``pairs=0``), then confirm's served rounds
    right after its last engine, drawn from the same model (the machine's state goes on from there),
    stopped by confirm's own rule; the figure as confirm computes it (a paired t-interval over the
    rounds at the rule's level)."""
    from autotune.measure.intervals import abba, paired_t, resolution
    from autotune.measure.sequential import Sequential
    from autotune.study.holdout import the_pick
    from sim_study import Truth, simulate

    view = simulate(seed, noise, pairs=0)
    pick = the_pick(view)
    true = Truth.drawn(seed).of(pick.user_attrs["candidate"])
    rng, rule = random.Random(f"served/{seed}"), Sequential(max_s=None)
    slot, tps, stopped = len(view.trials), {"pick": [], "baseline": []}, None  # the slots after the study's
    while stopped is None:
        for side in abba(len(tps["pick"]) + 1, ("baseline", "pick")):
            spec = side == "pick"
            level = (true if spec else 1.0) * math.exp(noise.log_factor(seed, slot, spec, rng))
            tps[side].append(level * math.exp(rng.gauss(0, noise.window_sd / 2)))
            slot += 1
        stopped = rule.stop(tps["pick"], tps["baseline"], 0.0)
    r, lo, hi, n = paired_t(tps["pick"], tps["baseline"], level=rule.level)
    return {"pick": pick.user_attrs["label"], "true": true, "speedup": r, "lo": lo, "hi": hi, "rounds": n,
            "resolution": resolution(lo, hi), "covered": lo <= true <= hi}


def memory(args) -> dict:
    from sim_study import simulate

    out = {}
    for phi in args.phi:
        noise, rows, t0 = Noise(phi=phi), [], time.time()
        for seed in range(args.studies):
            view = simulate(seed, noise, pairs=args.pairs)
            f, true, label = _figure(view)
            sv = _served(seed, noise)
            rows.append({"seed": seed, "pick": label, "true": true, "speedup": f["speedup"], "lo": f["lo"],
                         "hi": f["hi"], "pairs": f["pairs"], "selection_rounds": (view.selected() or {}).get("rounds"),
                         "covered": f["lo"] is not None and f["lo"] <= true <= f["hi"],
                         "served": sv, "served_covered": sv["covered"]})
        out[str(phi)] = _summary(rows, time.time() - t0)
        s = out[str(phi)]
        print(f"phi {phi}: holdout coverage {s['coverage']:.3f}, median figure/true {s['median_figure_over_true']:.3f}; "
              f"served coverage {s['served_coverage']:.3f} (median {s['served_median_rounds']} rounds); "
              f"{s['wall_s']:.0f} s", flush=True)
    return out


def _summary(rows: list[dict], wall: float) -> dict:
    done = [r for r in rows if r["lo"] is not None]
    return {"studies": len(rows), "with_interval": len(done),
            "coverage": sum(r["covered"] for r in done) / len(done),
            "median_figure_over_true": statistics.median(r["speedup"] / r["true"] for r in done),
            "median_resolution": statistics.median(math.sqrt(r["hi"] / r["lo"]) - 1 for r in done),
            "with_selection_rounds": sum(bool(r["selection_rounds"]) for r in rows) / len(rows),
            "picked_true_best": sum(abs(r["true"] - 3.0) < 1e-9 for r in rows) / len(rows),
            "served_coverage": sum(r["served_covered"] for r in rows) / len(rows),
            "served_median_rounds": statistics.median(r["served"]["rounds"] for r in rows),
            "served_median_over_true": statistics.median(r["served"]["speedup"] / r["served"]["true"] for r in rows),
            "served_median_resolution": statistics.median(r["served"]["resolution"] for r in rows),
            "wall_s": round(wall, 1), "rows": rows}


def fake(args) -> dict:
    """Whole studies on the FAKE engine: a worker process per trial, the noise model in its environment."""
    from autotune.core.space import load_space
    from autotune.core.workload import load_workload
    from autotune.measure.config import Settings, StudyConfig
    from autotune.results.files import write_results
    from autotune.study.loop import run_study
    from sim_study import SPACE, WORKLOAD, Truth

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.ROOT / "tests"), str(harness.ROOT),
                                                             os.environ.get("PYTHONPATH")]))
    phi = args.phi[0]
    rows, t0 = [], time.time()
    with tempfile.TemporaryDirectory() as d:
        for seed in range(args.studies):
            truth = Truth.drawn(seed)
            os.environ.update({"AUTOTUNE_FAKE_SEED": str(seed), "AUTOTUNE_FAKE_STATE": Noise(phi=phi).to_env(),
                               "AUTOTUNE_FAKE_TRUE": __import__("json").dumps(truth.speedups)})
            cfg = StudyConfig(name=f"f{seed}", results_dir=Path(d) / f"f{seed}", settings=Settings(model="fake-model"),
                              objectives=("output_tok_s",), n_trials=6, trial_timeout_s=60, engine_module="fake_engine",
                              strategy="grid", remeasure=True, pairs=args.pairs, samples=0, seed=seed)
            try:
                study = run_study(cfg, load_workload(str(WORKLOAD)), load_space(str(SPACE), platform="cpu", models=set()))
                rep = write_results(study, cfg.results_dir, settings=cfg.settings, platform={"platform": "cpu"},
                                    objectives=list(cfg.objectives), storage_url=cfg.storage_url)
                f, true = rep["figure"], truth.of(rep["best"]["candidate"])
                rows.append({"seed": seed, "pick": rep["best"]["label"], "true": true, "speedup": f["speedup"],
                             "lo": f["lo"], "hi": f["hi"], "pairs": f["pairs"],
                             "selection_rounds": (rep.get("selection") or {}).get("rounds"),
                             "covered": f["lo"] is not None and f["lo"] <= true <= f["hi"]})
            except Exception as e:  # a study that failed is counted as such, not dropped silently
                rows.append({"seed": seed, "error": f"{type(e).__name__}: {e}"})
            done = [r for r in rows if r.get("lo") is not None]
            print(f"study {seed}: {rows[-1].get('pick')} covered so far {sum(r['covered'] for r in done)}/{len(done)}",
                  flush=True)
    done = [r for r in rows if r.get("lo") is not None]
    return {str(phi): {"studies": len(rows), "failed": sum("error" in r for r in rows), "with_interval": len(done),
                       "coverage": sum(r["covered"] for r in done) / len(done) if done else None,
                       "median_figure_over_true": statistics.median(r["speedup"] / r["true"] for r in done)
                       if done else None, "wall_s": round(time.time() - t0, 1), "rows": rows}}


def gate(args) -> dict:
    """`check` on warm-started studies in memory (the holdout's pick/deployed pairs): pass, fail, cannot
    tell. Three settings a persistence: the pick as fast as the deployed config (the study's own
    choice), 10% slower with the study's own choice (which mostly picks the deployed config back: no
    change), and 10% slower with the choice PLANTED on it (tests/sim_study.py: the gate alone decides)."""
    import collections

    from autotune.gate.check import compare
    from sim_study import Truth, report_of, simulate

    old = {"best": {"label": "ngram k=2", "candidate": {"method": "ngram", "num_speculative_tokens": 2}, "trial": 0,
                    "verdict": {"passed": True}, "speedup": {"output_tok_s": 3.0}, "measurement": {}},
           "objectives": ["output_tok_s"]}
    out = {}
    for phi in args.phi:
        for ratio, plant in ((1.0, None), (0.9, None), (0.9, 1)):
            t0, counts, pairs, differ = time.time(), collections.Counter(), [], collections.Counter()
            for seed in range(args.studies):
                truth = Truth({1: 3.0 * ratio, 2: 3.0, 3: 2.0, 4: 1.9, 5: 1.8})
                view = simulate(seed, Noise(phi=phi), truth=truth, tolerance=args.tolerance,
                                deployed={"method": "ngram", "num_speculative_tokens": 2}, plant=plant)
                rep = report_of(view)
                r = compare(rep, old, tolerance=args.tolerance)
                same = rep["best"]["label"] == "ngram k=2"  # the pick is the deployed config itself
                counts[("same config: " if same else "") + r.status] += 1
                g = ((rep.get("gate") or {}).get("objectives") or {}).get("output_tok_s") or {}
                if not same:
                    differ[r.status] += 1
                    pairs.append(g.get("pairs") or 0)
            n, m = args.studies, sum(differ.values())
            key = f"{phi}/{ratio}" + ("/planted" if plant else "")
            out[key] = {"phi": phi, "true_ratio": ratio, "planted": plant is not None, "studies": n,
                        "outcomes": dict(counts),
                        "pass": sum(v for k, v in counts.items() if k.endswith("ok")) / n,
                        "fail": sum(v for k, v in counts.items() if k.endswith("regression")) / n,
                        "cannot_tell": sum(v for k, v in counts.items() if k.endswith("cannot tell")) / n,
                        "pick_differs": m,
                        "pass_where_differs": differ["ok"] / m if m else None,
                        "fail_where_differs": differ["regression"] / m if m else None,
                        "median_pairs": statistics.median(pairs) if pairs else None,
                        "mean_pairs": round(statistics.mean(pairs), 1) if pairs else None,
                        "wall_s": round(time.time() - t0, 1)}
            print(f"phi {phi}, true ratio {ratio}{' planted' if plant else ''}: {dict(counts)}; mean pairs "
                  f"{out[key]['mean_pairs']}", flush=True)
    return out


def main() -> None:
    ap = harness.parser(__doc__, summary=True)
    ap.add_argument("--mode", choices=("memory", "fake", "gate"), default="memory")
    ap.add_argument("--tolerance", type=float, default=0.05, help="--mode gate: check's tolerance")
    ap.add_argument("--studies", type=int, default=1000)
    ap.add_argument("--phi", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.5, 0.8, 0.9])
    ap.add_argument("--pairs", type=int, default=4, help="holdout pairs (the study's --pairs)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or harness.DATA / {"memory": "calibration_holdout.json", "fake": "calibration_fake_studies.json",
                                      "gate": "calibration_gate.json"}[args.mode]
    results = {"memory": memory, "fake": fake, "gate": gate}[args.mode](args)
    harness.save(out, {"what": "the pick's 95% interval (the holdout's figure; with --confirm the served rounds') "
                               "against its true speedup, through autotune's selection and estimate",
                       "mode": args.mode, "noise": Noise().__dict__ | {"phi": args.phi}, "pairs": args.pairs,
                       "candidates": "the baseline and 5 ngram depths; true speedups 3.0x and 0.965, 0.93, 0.895, "
                                     "0.86 of it, shuffled", "by_phi": results})


if __name__ == "__main__":
    main()
