"""What a study will run, said before its first trial: the candidates (the budget), what comes on top of
them (a depth schedule's trials, the selection rounds, the holdout and the gate's rounds, confirm's
served rounds) and the most engine runs that makes; once the baseline is measured, the time that
many runs would take at its pace. ``--time-budget`` stays the one hard stop.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.measure.config import StudyConfig


@dataclass(frozen=True)
class Plan:
    """The most engine runs of each part of a study (each a trial: one engine, fresh; a lossy config's
    trial also starts its unspeculated twin inside it)."""

    candidates: int  # the budget (--candidates), the baseline and a warm start's deployed config included
    schedule: int  # a depth schedule's trials (two or more load levels)
    selection: int  # the selection rounds: the baseline, the leader and the runner-up, a round each
    holdout: int  # the holdout's rounds (the pick, the baseline, a deployed config), and the gate's extra rounds
    confirm: int  # confirm's served rounds, two servers each (--confirm)

    @property
    def runs(self) -> int:
        return self.candidates + self.schedule + self.selection + self.holdout

    def line(self) -> str:
        parts = [f"{self.candidates} candidates (the baseline included)"]
        if self.schedule:
            parts.append(f"up to {self.schedule} depth-schedule trials")
        if self.selection:
            parts.append(f"up to {self.selection} selection-round engines (where a runner-up comes within reach)")
        if self.holdout:
            parts.append(f"up to {self.holdout} holdout engines (the figure's pairs, after the choice)")
        text = f"plan: {', '.join(parts)}: at most {self.runs} engine runs"
        if self.confirm:
            text += f", then confirm's served rounds, at most {self.confirm} servers"
        return text + "; --time-budget is the one hard stop"

    def pace(self, baseline_wall_s: float) -> str:
        """The plan's time at the baseline's pace, once it was measured."""
        total = self.runs * baseline_wall_s
        return (f"plan: the baseline took {baseline_wall_s:.0f} s, so the {self.runs} engine runs at most would take "
                f"about {total / 60:.0f} min at its pace (candidates with a draft or a compile take longer)")


def plan_of(cfg: StudyConfig, *, deployed: bool = False, confirm_rounds: int = 0) -> Plan:
    """The plan of a study run with ``cfg`` (``deployed``: a warm start; ``confirm_rounds``: the most
    served rounds of `--confirm`)."""
    from autotune.study.holdout import GATE_MAX_ROUNDS
    from autotune.study.select import LOSSY_ROUNDS

    levels = 1 + len(cfg.extra_loads)
    schedule = levels + 1 if cfg.schedule and levels > 1 else 0
    selection = 3 * LOSSY_ROUNDS if cfg.remeasure else 0
    holdout = 0
    if cfg.remeasure:
        holdout = cfg.pairs * (3 if deployed else 2)
        if deployed:
            holdout += 2 * max(0, GATE_MAX_ROUNDS - cfg.pairs)
    return Plan(candidates=cfg.n_trials, schedule=schedule, selection=selection, holdout=holdout,
                confirm=2 * confirm_rounds)
