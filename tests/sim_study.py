"""A whole study in memory: autotune's own loop (autotune.study.loop.run_study: the candidates, the
selection rounds, the holdout, the choice) with each engine instance's throughput drawn from the
machine's noise model (tests/machine_noise.py) instead of measured, and Optuna's storage in memory.

For the calibration benchmark (benchmarks/calibration_fake.py) and the tests that need hundreds of
studies (the gate's error rates): a FAKE study, named as such. What is not production here is only
what an engine would measure: a trial's windows (``run_one`` below, which pools a re-measurement with
the production ``pool`` and tells Optuna as autotune.study.record does); the selection, the holdout,
the pairing and the figure are autotune's own code.
"""

from __future__ import annotations

import itertools
import math
import random
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import optuna

from autotune.core import attrs
from autotune.core.space import load_space
from autotune.core.workload import load_workload
from autotune.measure.config import Settings, StudyConfig
from autotune.measure.metrics import pool
from autotune.run.evaluate import CONSTRAINTS
from machine_noise import Noise

ROOT = Path(__file__).resolve().parents[1]
SPACE = ROOT / "tests" / "data" / "fake_five.yaml"  # the baseline and ngram k=1..5
WORKLOAD = ROOT / "examples" / "smoke.jsonl"
BASE_TOK_S = 100.0
# Five candidates within 15% of each other (pick_stability*.json's spread), the best 3x the baseline.
SPREAD = (1.0, 0.965, 0.93, 0.895, 0.86)


@dataclass(frozen=True)
class Truth:
    """Each depth's true speedup over the baseline, and the deployed config's (a warm start), if any."""

    speedups: dict[int, float]

    @classmethod
    def drawn(cls, seed: int, top: float = 3.0) -> Truth:
        vals = [top * f for f in SPREAD]
        random.Random(f"truth/{seed}").shuffle(vals)
        return cls(dict(zip(range(1, 6), vals)))

    def of(self, params: dict[str, Any]) -> float:
        return 1.0 if params.get("method") in (None, "none") else self.speedups[int(params["num_speculative_tokens"])]


def record_correct(study: optuna.Study, view: Any, trial: optuna.Trial, m: dict[str, Any], values: Any) -> None:
    """Record measurement ``m`` as a correct trial (pooled with the trial it re-measures, as
    autotune.study.record pools a fresh engine's record) and tell Optuna ``values(m)``."""
    of = trial.user_attrs.get(attrs.REMEASURE_OF)
    if of is not None:  # one record of both engine instances
        m = pool(view.trial(of).user_attrs[attrs.MEASUREMENT], m)
    trial.set_user_attr(attrs.MEASUREMENT, m)
    trial.set_user_attr(attrs.VERDICT, {"passed": True, "status": "ok", "reason": "ok",
                                        "constraints": [0.0] * len(CONSTRAINTS)})
    for key in CONSTRAINTS:
        trial.set_constraint(key, 0.0)
    study.tell(trial, values(m))


def _run_one(seed: int, noise: Noise, truth: Truth) -> Any:
    """autotune.study.record.run_one's stand-in: one engine instance's windows from the noise model."""
    slot, rng = itertools.count(), random.Random(f"instances/{seed}")

    def run_one(study: optuna.Study, view: Any, trial: optuna.Trial, cand: Any, workload: Any, space: Any,
                cfg: StudyConfig, progress: Any, is_base: bool, *, env: dict[str, str], stop: Any) -> None:
        i = next(slot)
        spec = cand.params.get("method") not in (None, "none")
        level = BASE_TOK_S * truth.of(cand.params) * math.exp(noise.log_factor(seed, i, spec, rng))
        w = [level * math.exp(rng.gauss(0, noise.window_sd)) for _ in range(2)]
        m: dict[str, Any] = {"output_tok_s": float(np.median(w)), "output_tok_s_windows": w,
                             "output_tok_s_instances": [w], "output_tok_s_rounds": [trial.user_attrs.get(attrs.ROUND)],
                             "e2e_ms_p50": 1e5 / level, "tpot_ms_p50": 1e3 / level, "windows": 2, "slot": i}
        record_correct(study, view, trial, m, lambda m: [m[o] for o in cfg.objectives])

    return run_one


def _planted(depth: int) -> Any:
    """autotune.study.select.selection_step's stand-in for a PLANTED choice: once the candidates are
    measured, the choice is recorded as the config of ngram ``depth`` (no selection rounds), whatever
    was measured, so that the holdout and the gate run on a pick known to be what the test plants."""
    from autotune.study.select import selected

    def step(study: optuna.Study, view: Any, cfg: Any, *, more_rounds: bool = True) -> bool:
        if selected(view) is not None:
            return False
        hits = [t for t in view.finished if t.state.name == "COMPLETE"
                and int(attrs.candidate(t).get("num_speculative_tokens") or 0) == depth]
        if not hits:
            return False
        pick = view.first_record(hits[0])
        study.set_user_attr(attrs.SELECTED, {"trial": pick.number, "label": attrs.label(pick),
                                             "candidates": len(view.finished), "rounds": 0, "runner_up": None,
                                             "why": "planted (tests/sim_study.py)"})
        return False

    return step


@contextmanager
def in_memory(seed: int, noise: Noise, truth: Truth, plant: int | None = None) -> Iterator[None]:
    """Within: run_study measures through the noise model, its storage in memory (``plant``: the
    choice is planted on that depth, _planted)."""
    from autotune.study import loop, opening, remeasure

    saved = loop.run_one, opening.open_storage, loop.selection_step, remeasure.selection_step
    loop.run_one = _run_one(seed, noise, truth)
    opening.open_storage = lambda url: optuna.storages.InMemoryStorage()
    if plant is not None:
        loop.selection_step = remeasure.selection_step = _planted(plant)
    try:
        yield
    finally:
        loop.run_one, opening.open_storage, loop.selection_step, remeasure.selection_step = saved


def simulate(seed: int, noise: Noise, *, truth: Truth | None = None, pairs: int = 4,
             deployed: dict[str, Any] | None = None, tolerance: float = 0.05, plant: int | None = None) -> Any:
    """One study (the baseline, then each of the five depths once, by grid) through autotune's loop;
    returns its StudyView. ``deployed``: a warm start's config (measured after the baseline);
    ``plant``: the choice planted on that depth (_planted)."""
    from autotune.study.loop import run_study
    from autotune.study.view import StudyView

    truth = truth or Truth.drawn(seed)
    cfg = StudyConfig(name=f"sim{seed}", results_dir=Path(tempfile.gettempdir()) / "autotune-sim",
                      settings=Settings(model="fake-model"), objectives=("output_tok_s",), n_trials=6, strategy="grid",
                      remeasure=True, pairs=pairs, gate_tolerance=tolerance, engine_module="fake_engine", samples=0,
                      seed=seed)
    space = load_space(str(SPACE), platform="cpu", models=set())
    with in_memory(seed, noise, truth, plant):
        study = run_study(cfg, load_workload(str(WORKLOAD)), space, deployed=deployed)
    return StudyView.of(study)


def report_of(view: Any) -> dict[str, Any]:
    """The StudyReport (best.json) autotune writes for ``view``, without writing files."""
    from autotune.core.study_report import clean
    from autotune.results.files import study_report
    from autotune.study.pareto import trials_frame

    rep = study_report(view, trials_frame(view), settings=Settings(model="fake-model"), platform={"platform": "cpu"},
                       objectives=["output_tok_s"], storage_url="memory")
    return clean(rep)
