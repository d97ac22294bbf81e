"""What defines one study run (StudyConfig), and what it tells the person watching (Progress).

No Optuna here: the evaluation (autotune.run.evaluate), the benchmarks and the tests use these too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autotune.core.candidate import Settings
from autotune.core.load import LoadPattern
from autotune.measure.slo import SLO
from autotune.measure.validate import Tolerances


LOSSY_MIN_GAIN = 0.03  # --lossy-min-gain's default: the one home of the number (autotune.study.select uses it)
HOLDOUT_PAIRS = 4  # --pairs' default: holdout rounds after the choice (even: the ABBA order is balanced)
GATE_TOLERANCE = 0.05  # check's --tolerance default; the study's holdout measures until the gate can decide at it


@dataclass(frozen=True)
class StudyConfig:
    """Everything that defines one study run (keyword-only by convention)."""

    name: str
    results_dir: Path
    settings: Settings
    objectives: tuple[str, ...] = ("output_tok_s", "e2e_ms_p50")
    n_trials: int = 10
    storage: str | None = None
    load: LoadPattern = field(default_factory=LoadPattern)
    extra_loads: tuple[LoadPattern, ...] = ()  # more load levels measured on the same engine (objective@level)
    repeats: int = 2  # measured windows per trial; objectives are their medians
    max_repeats: int = 0  # re-measure a noisy candidate up to this many windows (0: never)
    warmup: int = 2
    trial_timeout_s: float = 600.0
    timeout_from_baseline: bool = False  # later trials' limit: at least 3x the baseline's wall time (autotune.study.budget)
    time_budget_s: float | None = None  # --time-budget: no new candidate once the time left cannot hold it and the re-measurement
    tolerances: Tolerances = field(default_factory=Tolerances)
    seed: int = 0
    slos: tuple[SLO, ...] = ()  # constraints: a config that misses one is infeasible
    samples: int = 64  # draws per sampled request for the distribution test
    sample_tokens: int = 24  # tokens a draw: the first three form one outcome, the rest are counted (stats)
    # Teacher-forced log-probs are a verdict's evidence only for a lossy config (its drift); a lossless
    # one is judged by its tokens and draws, so it scores the baseline's paths only when asked (the
    # tests do, to show speculation's drift is zero). The baseline always scores its own.
    score_lossless: bool = False
    lossy_min_gain: float = LOSSY_MIN_GAIN  # a lossy pick must beat the best lossless one by this, significantly
    strategy: str = "predict"  # autotune.forecast.policy.STRATEGIES: how the next candidate is chosen
    # Fresh engines after the candidates (the CLI: on): selection rounds where the runner-up may change the
    # choice (autotune.study.select), then the holdout the pick's figure comes from (autotune.study.holdout).
    remeasure: bool = False
    prune: bool = False  # stop a candidate after its first window when it cannot reach the best (the CLI: on)
    past_edge: bool = False  # predict: measure one step past an edge the best sits on when its forecast clears the noise
    pairs: int = HOLDOUT_PAIRS  # holdout rounds (0: none, `--confirm`'s served rounds are the holdout)
    gate_tolerance: float = GATE_TOLERANCE  # with a deployed config: holdout rounds until the gate decides at it
    schedule: bool = False  # two or more concurrency levels: a depth per batch size (autotune.study.schedule; the CLI: on)
    # Fork each trial's worker and its `vllm serve` from one process that imported vLLM once
    # (autotune.run.launcher; a served start of ~2 s instead of ~35, benchmarks/data/launcher_start.json; the CLI: on)
    launcher: bool = False
    engine_module: str = "autotune.run.engine"  # tests swap in a fake engine, named as such
    # How a trial is measured (autotune.cli.app.Instrument): "served", the exported `vllm serve` over
    # HTTP, what users get (the CLI's default); "inprocess", AsyncLLM in the worker, which skips the
    # serving cost of each request and so overstates speedups (benchmarks/served_gap.py).
    instrument: str = "inprocess"

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{(self.results_dir / 'study.db').resolve()}"


class Progress(Protocol):
    """What the study tells the person watching (the CLI draws it with Rich)."""

    def trial_started(self, number: int, label: str) -> None: ...
    def trial_event(self, number: int, event: dict[str, Any]) -> None: ...
    def trial_finished(self, number: int, label: str, summary: str) -> None: ...
    def note(self, text: str) -> None:
        """One line about the study rather than a trial: what was left out, why it stopped."""


class Quiet:
    """Progress that shows nothing (library use, tests)."""

    def trial_started(self, number: int, label: str) -> None: ...
    def trial_event(self, number: int, event: dict[str, Any]) -> None: ...
    def trial_finished(self, number: int, label: str, summary: str) -> None: ...
    def note(self, text: str) -> None: ...
