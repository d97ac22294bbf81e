"""Whole studies on the FAKE engine (tests/fake_engine.py, no vLLM) at this machine's measured noise:
does the pick's interval cover its true speedup, and is the truly best config picked?

Each study is autotune's own loop (autotune.study.loop.run_study: grid over ngram k=1,2,4 and the
baseline, then the default 3 rounds of fresh engines, the figure from autotune.study.pareto.speedup)
on the fake engine with windows spread 4% (AUTOTUNE_FAKE_NOISE), instances 10% a side
(AUTOTUNE_FAKE_INSTANCE_NOISE) and a slow drift of -1% per trial (AUTOTUNE_FAKE_DRIFT), each study
its own seed. The true speedups are those of one study with every noise off.

Run: PYTHONPATH=.:tests .venv/bin/python benchmarks/calibration_fake.py [--studies 50]
Writes benchmarks/data/calibration_fake_studies.json (what finished, if stopped early).
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import os
import tempfile
import time
from pathlib import Path

ROOT = harness.ROOT
NOISE = {"AUTOTUNE_FAKE_NOISE": "0.04", "AUTOTUNE_FAKE_INSTANCE_NOISE": "0.10", "AUTOTUNE_FAKE_DRIFT": "-0.01"}


def one(seed: int | None, tmp: Path) -> dict:
    from autotune.core.space import load_space
    from autotune.core.workload import load_workload
    from autotune.measure.config import Settings, StudyConfig
    from autotune.results.files import write_results
    from autotune.study.loop import run_study

    quiet = seed is None
    env = {"AUTOTUNE_FAKE_NOISE": "0"} if quiet else {**NOISE, "AUTOTUNE_FAKE_SEED": str(seed)}
    for k in ("AUTOTUNE_FAKE_NOISE", "AUTOTUNE_FAKE_INSTANCE_NOISE", "AUTOTUNE_FAKE_DRIFT", "AUTOTUNE_FAKE_SEED"):
        os.environ.pop(k, None)
    os.environ.update(env)
    name = "truth" if quiet else f"s{seed}"
    space = load_space(str(ROOT / "tests/data/fake_depths.yaml"), platform="cpu", models=set())
    cfg = StudyConfig(name=name, results_dir=tmp / name, settings=Settings(model="fake-model"),
                      objectives=("output_tok_s",), n_trials=4, trial_timeout_s=60, engine_module="fake_engine",
                      strategy="grid", remeasure=not quiet, samples=0)
    study = run_study(cfg, load_workload(str(ROOT / "examples/smoke.jsonl")), space)
    report = write_results(study, cfg.results_dir, settings=cfg.settings, platform={"platform": "cpu"},
                           objectives=list(cfg.objectives), storage_url=cfg.storage_url)
    base = report["baseline"]["measurement"]["output_tok_s"]
    if quiet:  # every config the grid measured, noise off: its true speedup
        return {t.user_attrs["label"]: t.user_attrs["measurement"]["output_tok_s"] / base for t in study.trials
                if "measurement" in t.user_attrs}
    s = report["best"]["speedup"]
    return {"seed": seed, "pick": report["best"]["label"], "speedup": s["output_tok_s"],
            "lo": s.get("output_tok_s_lo"), "hi": s.get("output_tok_s_hi"), "pairs": s.get("output_tok_s_pairs"),
            "unit": s.get("output_tok_s_unit"), "resolution": (report.get("resolution") or {}).get("resolution")}


def main() -> None:
    ap = harness.parser(__doc__, out="calibration_fake_studies.json", summary=True)
    ap.add_argument("--studies", type=int, default=50)
    args = ap.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"), str(ROOT),
                                                             os.environ.get("PYTHONPATH")]))
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        truth = one(None, Path(d))
        print("true speedups:", {k: round(v, 3) for k, v in truth.items()}, flush=True)
        best = max(truth, key=truth.get)
        rows = []
        for seed in range(args.studies):
            try:
                r = one(seed, Path(d))
            except Exception as e:  # a study that failed is counted as such, not dropped silently
                r = {"seed": seed, "error": f"{type(e).__name__}: {e}"}
            if "pick" in r:
                t = truth.get(r["pick"])
                r.update(true=t, covered=None if r["lo"] is None or t is None else bool(r["lo"] <= t <= r["hi"]),
                         picked_best=r["pick"] == best)
            rows.append(r)
            done = [x for x in rows if x.get("covered") is not None]
            print(f"study {seed}: {r.get('pick')} {r.get('speedup', float('nan')):.2f}x "
                  f"[{r.get('lo') or float('nan'):.2f}-{r.get('hi') or float('nan'):.2f}] true {r.get('true')}; "
                  f"covered so far {sum(x['covered'] for x in done)}/{len(done)}", flush=True)
            _write(args.out, truth, best, rows, time.time() - t0)


def _write(out: Path, truth: dict, best: str, rows: list[dict], wall: float) -> None:
    done = [x for x in rows if x.get("covered") is not None]
    second = sorted(truth.values())[-2] if len(truth) > 1 else None
    harness.save(out, {
        "what": "full studies on the FAKE engine at this machine's noise: the pick's 95% interval against its "
                "true speedup (the same study with every noise off)",
        "noise": NOISE, "space": "tests/data/fake_depths.yaml (ngram k=1,2,4; grid)", "pairs": 3,
        "true_speedups": truth, "true_best": best,
        "true_best_over_runner_up": truth[best] / second if second else None,
        "studies": len(rows), "with_interval": len(done),
        "coverage": sum(x["covered"] for x in done) / len(done) if done else None,
        "picked_true_best": sum(bool(x.get("picked_best")) for x in rows) / len(rows) if rows else None,
        "failed": sum("error" in x for x in rows), "rows": rows, "wall_s": round(wall, 1)})


if __name__ == "__main__":
    main()
