"""Benchmark: how many measured candidates each strategy needs to find the best (not a test).

``measure``: a full-grid study (``autotune search --strategy grid``, every point of the space, the
demo pair, the same command a user runs) on a workload, then the table of what every candidate
measured, with the baseline's tokens and the draft trace that predictions read, saved as
``benchmarks/data/table-<workload>-<space>.json`` with the machine, vLLM version and date.

``replay``: the strategies replayed on saved tables, over seeds (grid order, random, TPE as a study
runs it, predict): measured candidates and wall time (the table's own trial times) until within 2%
of the table's best correct candidate, and how often each finds it. ``predict`` is deterministic
given the table, so its seeds differ only where the table's noise decides nothing.

``versus``: one live study with ``--strategy predict`` beside the table's grid study: its pick, its
wall time, against the grid's best and wall time.

    .venv/bin/python benchmarks/search_efficiency.py measure examples/json_edit.jsonl --space quick
    .venv/bin/python benchmarks/search_efficiency.py replay benchmarks/data/table-*.json --seeds 50
    .venv/bin/python benchmarks/search_efficiency.py versus examples/json_edit.jsonl --space quick
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

import harness

DATA = harness.DATA
RUNS = Path("results/bench")
WITHIN = 0.02


def _search(workload: str, space: str, strategy: str, study: str, trials: int) -> float:
    cmd = [str(Path(sys.executable).with_name("autotune")), "search", workload, "--space", space, "--strategy", strategy,
           "--trials", str(trials), "--study", study, "--results", str(RUNS)]
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    subprocess.run(cmd, check=False)
    return time.monotonic() - t0


def table_of(results: Path) -> dict[str, Any]:
    """What every trial of a finished study measured, and what its predictions read."""
    import optuna

    from autotune.core import attrs

    from autotune.run import hardware
    from autotune.study.trials import feasible
    from autotune.study.view import StudyView

    study = StudyView.of(optuna.load_study(study_name=results.name, storage=f"sqlite:///{results / 'study.db'}"))
    base = study.baseline
    rows, again = [], []
    for t in study.trials:
        if attrs.is_duplicate(t) or t.state.name not in ("COMPLETE", "FAIL"):
            continue
        if attrs.role(t) == attrs.REMEASURE:  # the grid's own measurement is the table; pooled ones aside
            again.append({"trial": t.number, "remeasure_of": t.user_attrs.get(attrs.REMEASURE_OF),
                          "output_tok_s_windows": attrs.measurement(t).get("output_tok_s_windows")})
            continue
        m = attrs.measurement(t)
        rows.append({"trial": t.number, "params": attrs.candidate(t), "label": attrs.label(t), "state": t.state.name,
                     "role": attrs.role(t), "failure": attrs.failure(t), "feasible": feasible(t),
                     "wall_s": t.user_attrs.get(attrs.WALL_S),
                     "output_tok_s": m.get("output_tok_s"), "output_tok_s_windows": m.get("output_tok_s_windows"),
                     "e2e_ms_p50": m.get("e2e_ms_p50"), "mean_accepted_length": m.get("mean_accepted_length"),
                     "spec_drafts": m.get("spec_drafts"), "windows": m.get("windows"),
                     "predicted": attrs.predicted(t)})
    bm = attrs.measurement(base)
    from autotune.study.pareto import choose

    choice = choose(study)
    pick = choice.trial.user_attrs.get(attrs.REMEASURE_OF, choice.trial.number) if choice else None
    return {"study": str(results), "workload": study.user_attrs.get(attrs.WORKLOAD), "pick": pick,
            "space": study.user_attrs.get(attrs.SPACE), "vllm_version": hardware.vllm_version(),
            "baseline": {"params": attrs.candidate(base), "outputs": base.user_attrs.get(attrs.OUTPUTS),
                         "ttft_ms_mean": bm.get("ttft_ms_mean"), "e2e_ms_mean": bm.get("e2e_ms_mean"),
                         "output_tok_s_windows": bm.get("output_tok_s_windows")},
            "draft_trace": study.user_attrs.get(attrs.DRAFT_TRACE), "rows": rows, "remeasured": again}


def measure(a: argparse.Namespace) -> None:
    from autotune import demo
    from autotune.run.hardware import platform_tags
    from autotune.core.space import load_space

    wl, sp = Path(a.workload).stem, Path(a.space).stem
    study = f"grid-{wl}-{sp}"
    n = len(load_space(a.space, platform="cpu", models={"draft_model"} if demo.available() else set(),
                       tags=platform_tags("cpu")).grid())
    wall = _search(a.workload, a.space, "grid", study, n + 1)
    table = {**table_of(RUNS / study), "wall_s": round(wall, 1)}
    out = harness.save(DATA / f"table-{wl}-{sp}.json", table)
    print(f"{out}: {len(table['rows'])} candidates measured in {wall / 60:.1f} min")


# --- replaying the strategies on a table ------------------------------------------------------

class Table:
    """A measured grid as an oracle: what measuring a candidate would have given, redrawn per seed
    by resampling each candidate's measured windows (so seeds differ where the noise allows)."""

    def __init__(self, data: dict[str, Any]):
        from autotune.core.candidate import Candidate
        from autotune.forecast.forecast import AcceptanceTable
        from autotune.core.space import load_space

        self.data = data
        self.rows = {Candidate(r["params"]).key(): r for r in data["rows"]}
        base = data["baseline"]
        self.base_params, self.base_windows = base["params"], base["output_tok_s_windows"]
        self.share = (base["ttft_ms_mean"] or 0) / base["e2e_ms_mean"]
        trace = data.get("draft_trace") or {}
        self.acceptance = AcceptanceTable(base["outputs"], trace.get("argmax"), 1 << 30)
        self.trace_s = trace.get("wall_s") or 0.0
        self.space = load_space(data["space"], platform="cpu", models={"draft_model"}, tags={"cpu", "cpu-avx512"})
        self.grid = [c for c in self.space.grid() if c.key() in self.rows]
        base_tok = float(np.median(self.base_windows))
        ok = [r for r in data["rows"] if r["state"] == "COMPLETE" and r["feasible"]]
        # The best as the study picks it: lossless first (a lossy config only by a significant gain).
        self.best = max(ok, key=lambda r: r["output_tok_s"])
        pick = data.get("pick")
        if pick is not None:
            self.best = next(r for r in data["rows"] if r["trial"] == pick)
        self.best_speedup = self.best["output_tok_s"] / base_tok
        self.base_wall = next(r["wall_s"] for r in data["rows"] if r["role"] == "baseline")
        # The table's own noise between engine instances: the spread of every measured speedup around
        # the step-cost law fitted on all of them (configs that do the same work measure apart).
        from autotune.forecast.forecast import Model, Observation
        from autotune.measure.metrics import ratio_interval

        every = [Observation(r["params"], self.true_speedup(k), *ratio_interval(r["output_tok_s_windows"],
                                                                                 self.base_windows))
                 for k, r in self.rows.items() if r["state"] == "COMPLETE" and r["role"] != "baseline"]
        self.noise = Model(self.acceptance, every, self.base_params, self.share).noise

    def draw(self, rng: np.random.Generator) -> dict[str, Any]:
        """One replicate: each candidate's observation (or failure) with resampled windows."""
        from autotune.forecast.forecast import Observation
        from autotune.measure.metrics import ratio_interval

        base = rng.choice(self.base_windows, len(self.base_windows))
        out: dict[str, Any] = {}
        for key, r in self.rows.items():
            if r["state"] != "COMPLETE":
                out[key] = None
                continue
            w = rng.choice(r["output_tok_s_windows"], len(r["output_tok_s_windows"]))
            lo, hi = ratio_interval(list(w), list(base))
            out[key] = Observation(r["params"], float(np.median(w) / np.median(base)), lo, hi, r["feasible"])
        return out

    def true_speedup(self, key: str) -> float:
        r = self.rows[key]
        ok = r["state"] == "COMPLETE" and r["feasible"]
        return r["output_tok_s"] / float(np.median(self.base_windows)) if ok else 0.0


def _walk(table: Table, order: list[str], budget: int, within: float = WITHIN) -> dict[str, Any]:
    """Candidates (after the baseline) and wall time until within ``within`` of the table's best."""
    wall, out = table.base_wall, {"found": False, "candidates": None, "wall_s": None,
                                  "measured": min(len(order), budget),
                                  "total_s": table.base_wall + sum(table.rows[k]["wall_s"] or 0.0 for k in order[:budget])}
    if table.best["role"] == "baseline":  # nothing beats no speculation: found with the baseline itself
        return {**out, "found": True, "candidates": 0, "wall_s": wall, "found_in_noise": True,
                "candidates_in_noise": 0}
    for i, key in enumerate(order[:budget], 1):
        wall += table.rows[key]["wall_s"] or 0.0
        if table.true_speedup(key) >= (1 - within) * table.best_speedup:
            out.update(found=True, candidates=i, wall_s=wall)
            break
    # The same within the table's own noise between instances (a 2% target below it is luck).
    noisy = max(within, table.noise)
    hit = next((i for i, key in enumerate(order[:budget], 1)
                if table.true_speedup(key) >= (1 - noisy) * table.best_speedup), None)
    out.update(found_in_noise=hit is not None, candidates_in_noise=hit)
    return out


def _candidates(table: Table) -> list[str]:
    """The grid after the baseline (which a study measures first, as trial 0)."""
    base = table.space.baseline_candidate().key()
    return [c.key() for c in table.grid if c.key() != base]


def replay_grid(table: Table, seed: int, budget: int) -> dict[str, Any]:
    return _walk(table, _candidates(table), budget)


def replay_random(table: Table, seed: int, budget: int) -> dict[str, Any]:
    keys = _candidates(table)
    np.random.default_rng(seed).shuffle(keys)
    return _walk(table, keys, budget)


def replay_tpe(table: Table, seed: int, budget: int) -> dict[str, Any]:
    """Optuna's TPE as a study runs it (autotune.study.opening.sampler), on the table's measurements."""
    import optuna
    from optuna.trial import TrialState

    from autotune.study.opening import sampler

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    obs = table.draw(np.random.default_rng(seed))
    study = optuna.create_study(directions=["maximize"], sampler=sampler(seed, "tpe"))
    study.enqueue_trial(table.space.baseline_trial_params())
    order: list[str] = []
    seen: set[str] = set()
    for _ in range(8 * budget):
        if len(order) >= budget:
            break
        t = study.ask()
        cand = table.space.suggest(t)
        key = cand.key()
        if key == table.space.baseline_candidate().key() or key in seen or key not in table.rows:
            study.tell(t, state=TrialState.PRUNED)  # a duplicate: an ask, not a measurement
            continue
        seen.add(key)
        order.append(key)
        o = obs[key]
        if o is None:
            study.tell(t, state=TrialState.FAIL)
        else:
            t.set_constraint("correct", 0.0 if o.feasible else 1.0)
            study.tell(t, [o.speedup if o.feasible else 0.0])
    return _walk(table, order, budget)


def replay_predict(table: Table, seed: int, budget: int) -> dict[str, Any]:
    from autotune.core.candidate import Candidate
    from autotune.forecast.forecast import Model, Observation
    from autotune.forecast.policy import next_predicted

    draw = table.draw(np.random.default_rng(seed))
    obs, failed, order = [Observation(table.base_params, 1.0, 1.0, 1.0)], [], []
    while len(order) < budget:
        step = next_predicted(table.grid, Model(table.acceptance, obs, table.base_params, table.share), obs, failed)
        if step.stop:
            break
        key = Candidate(step.params).key()
        order.append(key)
        if draw.get(key) is None:
            failed.append(step.params)
        else:
            obs.append(draw[key])
    out = _walk(table, order, budget)
    out["total_s"] += table.trace_s  # the draft's trace runs before the first candidate
    if out["wall_s"] is not None:
        out["wall_s"] += table.trace_s
    return out


STRATEGY_REPLAYS = {"grid": replay_grid, "random": replay_random, "tpe": replay_tpe, "predict": replay_predict}


def replay(a: argparse.Namespace) -> None:
    results: dict[str, Any] = {}
    for path in a.tables:
        table = Table(json.loads(Path(path).read_text()))
        name = Path(path).stem
        n = len(table.grid)
        print(f"\n{name}: {n} candidates measured ({table.data['date']}, vLLM {table.data['vllm_version']}); best "
              f"{table.best['label']} {table.best_speedup:.2f}x; within {WITHIN:.0%}: "
              + ", ".join(r["label"] for r in table.data["rows"]
                          if r["state"] == "COMPLETE" and r["feasible"]
                          and table.true_speedup(_key(r)) >= (1 - WITHIN) * table.best_speedup))
        print(f"noise between engine instances (spread around the fitted step-cost law): {table.noise:.1%}")
        print(f"{'strategy':<9} {'found (budget ' + str(a.budget) + ')':>18} {'candidates p50':>15} {'p90':>5} "
              f"{'max':>5} {'wall min p50':>13} {'stopped at p50':>15} {'total min':>10}")
        results[name] = {}
        for strategy, fn in STRATEGY_REPLAYS.items():
            runs = [fn(table, seed, a.budget) for seed in range(1 if strategy == "grid" else a.seeds)]
            hits = [r for r in runs if r["found"]]
            cands = np.array([r["candidates"] for r in hits]) if hits else np.array([np.nan])
            walls = np.array([r["wall_s"] for r in hits]) if hits else np.array([np.nan])
            row = {"seeds": len(runs), "found": len(hits) / len(runs),
                   "candidates_p50": float(np.median(cands)), "candidates_p90": float(np.percentile(cands, 90)),
                   "candidates_max": float(np.max(cands)), "wall_min_p50": float(np.median(walls)) / 60,
                   "measured_p50": float(np.median([r["measured"] for r in runs])),
                   "total_min_p50": float(np.median([r["total_s"] for r in runs])) / 60,
                   "within_4": float(np.mean([r["found"] and r["candidates"] <= 4 for r in runs])),
                   "found_in_noise": float(np.mean([r["found_in_noise"] for r in runs])),
                   "in_noise_within_4": float(np.mean([r["found_in_noise"] and r["candidates_in_noise"] <= 4
                                                       for r in runs]))}
            results[name][strategy] = row
            print(f"{strategy:<9} {row['found']:>18.0%} {row['candidates_p50']:>15.0f} {row['candidates_p90']:>5.0f} "
                  f"{row['candidates_max']:>5.0f} {row['wall_min_p50']:>13.1f} {row['measured_p50']:>15.0f}"
                  f" {row['total_min_p50']:>10.1f}"
                  f"   (within 4: {row['within_4']:.0%}; within the noise: found {row['found_in_noise']:.0%}, "
                  f"within 4: {row['in_noise_within_4']:.0%})")
    harness.save(a.out, {"budget": a.budget, "seeds": a.seeds, "within": WITHIN, "tables": results})


def versus(a: argparse.Namespace) -> None:
    """A live --strategy predict study beside the table's grid study (same workload and space)."""
    import optuna

    from autotune.core import attrs
    from autotune.study.view import StudyView

    wl, sp = Path(a.workload).stem, Path(a.space).stem
    table = Table(json.loads((DATA / f"table-{wl}-{sp}.json").read_text()))
    if a.results:  # a predict study already run (e.g. the demo's, results/demo)
        folder, wall = Path(a.results), None
    else:
        folder = RUNS / f"predict-{wl}-{sp}"
        wall = _search(a.workload, a.space, "predict", folder.name, len(table.grid) + 1)
    st = optuna.load_study(study_name=folder.name, storage=f"sqlite:///{folder / 'study.db'}")
    base = attrs.measurement(StudyView.of(st).baseline)["output_tok_s"]
    elapsed, reached, lines = 0.0, None, []
    trace = (st.user_attrs.get(attrs.DRAFT_TRACE) or {}).get("wall_s") or 0.0
    for t in sorted(st.get_trials(deepcopy=False), key=lambda t: t.number):
        if attrs.is_duplicate(t) or t.state.name not in ("COMPLETE", "FAIL"):
            continue
        elapsed += (t.user_attrs.get(attrs.WALL_S) or 0.0) + (trace if t.number == 1 else 0.0)
        own = attrs.measurement(t).get("output_tok_s", 0.0) / base if t.state.name == "COMPLETE" else 0.0
        in_table = table.true_speedup(_key({"params": attrs.candidate(t)})) if _key(
            {"params": attrs.candidate(t)}) in table.rows else float("nan")
        ok = t.state.name == "COMPLETE" and bool(attrs.verdict(t).get("passed"))
        if reached is None and ok and attrs.role(t) != attrs.BASELINE and \
                in_table >= (1 - WITHIN) * table.best_speedup:
            reached = (t.number, elapsed)
        lines.append(f"  trial {t.number:>2} {attrs.label(t):<34} {own:5.2f}x here, {in_table:5.2f}x in the grid's table")
    print("\n".join(lines))
    grid_wall = table.data.get("wall_s") or sum(r["wall_s"] or 0 for r in table.data["rows"])
    result = {"workload": wl, "space": sp, "grid_best": table.best["label"], "grid_best_speedup": table.best_speedup,
              "grid_wall_s": grid_wall, "predict_wall_s": wall if wall is not None else elapsed,
              "predict_trials": len(lines),
              "stopped": st.user_attrs.get(attrs.STOPPED),
              "reached_trial": reached and reached[0], "reached_wall_s": reached and reached[1],
              "reached_share_of_grid_wall": reached and reached[1] / grid_wall}
    print(json.dumps(result, indent=1))
    harness.save(DATA / f"versus-{wl}-{sp}.json", result)


def _key(row: dict[str, Any]) -> str:
    from autotune.core.candidate import Candidate

    return Candidate(row["params"]).key()


def main() -> None:
    ap = harness.parser(__doc__, summary=True)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("workload")
    m.add_argument("--space", default="quick")
    r = sub.add_parser("replay")
    r.add_argument("tables", nargs="+")
    r.add_argument("--seeds", type=int, default=50)
    r.add_argument("--budget", type=int, default=25, help="Candidates after the baseline at most.")
    r.add_argument("--out", type=Path, default=DATA / "search_efficiency.json")
    v = sub.add_parser("versus")
    v.add_argument("workload")
    v.add_argument("--space", default="quick")
    v.add_argument("--results", help="Read this finished predict study instead of running one.")
    a = ap.parse_args()
    {"measure": measure, "replay": replay, "versus": versus}[a.cmd](a)


if __name__ == "__main__":
    main()
