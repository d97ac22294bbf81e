"""The names autotune stores in Optuna's user attributes, defined once.

A study keeps everything a report needs in its storage (so an interrupted study resumes and a
shared one has one source of truth); these are the keys, for the study, the Pareto table, the
results files, ``check`` and the report. Read a trial's attributes through the helpers below.
"""

from __future__ import annotations

from typing import Any

# Trial attributes.
ROLE = "role"  # BASELINE, DEPLOYED, EXTRA_BASELINE, REMEASURE, DEPTH, SCHEDULE or absent (a candidate)
SCHEDULE_RANGES = "schedule_ranges"  # a schedule trial's [first, last, k] ranges
ASKED = "asked"  # a config the user asked for (--try): measured whole, never pruned
PRUNED_WHY = "pruned"  # why the study stopped this trial after its first window (a hopeless candidate)
PAST_EDGE = "past_edge"  # {knob: value} beyond the space that a planned trial measures (not an Optuna parameter)
EDGE = "edge"  # the pick on an edge of the space, with the forecast one step past it (autotune.study.strategy.edge_report)
QUEUED = "queued"  # a baseline enqueued at the study's start (goes first among baselines)
CANDIDATE = "candidate"  # the space parameters (autotune.core.candidate.Candidate.params)
LABEL = "label"
WORKER = "worker"  # host:pid/thread
DEVICES = "devices"  # the worker's device environment
WALL_S = "wall_s"
MEASUREMENT = "measurement"  # autotune.core.records.Measurement
VERDICT = "verdict"  # autotune.measure.validate.Verdict.to_dict()
SLO_MISSED = "slo_missed"
VLLM_VERSION = "vllm_version"
FAILURE = "failure"  # why a trial failed (one line)
INTERRUPTED = "interrupted"  # cut short (Ctrl-C, a dead worker): not counted, measured again
DUPLICATE_OF = "duplicate_of"  # the trial that already measured this candidate
LEFT_OUT = "left_out"  # queued, but the budget was used first: not measured (why, one line); --resume queues it again
PREDICTED = "predicted"  # autotune.forecast.forecast.Forecast.to_dict(), made before the trial was measured
REMEASURE_OF = "remeasure_of"  # a re-measurement on a fresh engine: the trial it pools windows with
ROUND = "round"  # the round of fresh engines a selection or holdout trial belongs to ("s1", "h2"): pairs share it
HOLDOUT_OF = "holdout_of"  # a holdout trial: the first record of the config it measures again (never pooled)
PLANNED = "planned"  # why the strategy chose this candidate (predict, grid)
# The baseline's reference for judging candidates.
OUTPUTS = "outputs"
SAMPLES = "samples"
SCORES = "scores"
# The baseline's margins where a fresh instance of it flipped against it, under the cap (autotune.measure.numerics).
NUMERICS_FLOOR = "numerics_floor"
# The study's numerics, measured on the baseline (autotune.measure.numerics.Numerics.to_dict()).
NUMERICS = "numerics"
# The baseline's fresh instances' flips above the cap: it does not reproduce itself there (one line each).
NUMERICS_FINDINGS = "numerics_findings"

# Roles.
BASELINE = "baseline"
DEPLOYED = "deployed"  # the warm start's pick, re-measured in this run so `check` compares side by side
REMEASURE = "re-measure"  # the pick or the baseline again, on a fresh engine; its record pools both
EXTRA_BASELINE = "extra baseline"  # a baseline queued twice (two workers started at once)
DEPTH = "depth"  # the pick's method at the depth the forecast says is best at another load level
SCHEDULE = "schedule"  # the pick's method with a depth per batch size (autotune.study.schedule)
# After the choice is final: the pick, the baseline (and a warm start's deployed config) on fresh engines,
# side by side in rounds; the pick's figure comes from these alone, and they never change the choice.
HOLDOUT = "holdout"
OUTSIDE_BUDGET = (REMEASURE, DEPTH, SCHEDULE, HOLDOUT)  # roles measured on top of --candidates

# Study attributes.
OBJECTIVES = "objectives"
WORKLOAD = "workload"
SPACE = "space"
MAX_MODEL_LEN = "max_model_len"
SPACE_RESOLVED = "space_resolved"  # autotune.core.space.SearchSpace.resolved: to load the same space again
LOAD = "load"
CONCURRENCY = "concurrency"
LEVELS = "levels"  # the study's own load level first, then the extra ones
LOSSY_MIN_GAIN = "lossy_min_gain"
WARM_START = "warm_start"
STRATEGY = "strategy"  # autotune.forecast.policy.STRATEGIES
FINGERPRINT = "fingerprint"  # what defines the study (autotune.study.loop.fingerprint): a run that differs may not join
STOPPED = "stopped"  # why the study stopped before the budget was used (the strategy, or no new config to ask)
SCHEDULE_PLAN = "schedule"  # autotune.study.schedule: the planned ranges and what they rest on, or why none
DRAFT_TRACE = "draft_trace"  # {"argmax": request id -> the draft's teacher-forced choices} or {"failure": ...}
SELECTED = "selected"  # the final choice (autotune.study.select): its trial, the runner-up, the evidence
GATE_TOLERANCE = "gate_tolerance"  # the tolerance the holdout measures the deployed config's pairs for
HOLDOUT_PAIRS = "holdout_pairs"  # the holdout rounds the study measures (0: `--confirm`'s served rounds are the holdout)
EAGLE3_TRACE = "eagle3_trace"  # {"traces": request id -> the EAGLE-3 head's trace, "depth": k} or {"failure": ...}
# {"traces": request id -> the DFlash drafter's blocks per depth (autotune.forecast.dflash_drafter.trace),
#  "depths": [k, ...]} or {"failure": ...}
DFLASH_TRACE = "dflash_trace"


def role(t: Any) -> str | None:
    return t.user_attrs.get(ROLE)


def candidate(t: Any) -> dict[str, Any]:
    return t.user_attrs.get(CANDIDATE, {})


def label(t: Any) -> str | None:
    return t.user_attrs.get(LABEL)


def measurement(t: Any) -> dict[str, Any]:
    return t.user_attrs.get(MEASUREMENT, {})


def verdict(t: Any) -> dict[str, Any]:
    return t.user_attrs.get(VERDICT, {})


def failure(t: Any) -> str | None:
    return t.user_attrs.get(FAILURE)


def predicted(t: Any) -> dict[str, Any]:
    return t.user_attrs.get(PREDICTED) or {}


def is_duplicate(t: Any) -> bool:
    return DUPLICATE_OF in t.user_attrs


def round_of(t: Any) -> str | None:
    return t.user_attrs.get(ROUND)


def is_interrupted(t: Any) -> bool:
    return bool(t.user_attrs.get(INTERRUPTED))
