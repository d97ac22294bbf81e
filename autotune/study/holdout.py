"""The holdout: once the choice is final (autotune.study.select), the pick and the baseline, and a warm
start's deployed config, on fresh engines side by side in rounds, in the one ABBA order
(autotune.measure.intervals.abba). These trials never pool into a record and never enter the choice,
so the pick's figure, taken from them alone, carries no winner's curse: a round is a pair (or a triple)
measured next to each other, paired by its round id, never with another pick's rounds.

How many: ``--pairs`` rounds (HOLDOUT_PAIRS in the study; 0 with ``--confirm``, whose served rounds
are the holdout); with a deployed config, more rounds of the pick and the deployed config alone while
the gate's sequential test (autotune.measure.pairs.gate_decision) cannot decide at its tolerance, up
to GATE_MAX_ROUNDS, where the point decides.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core import attrs
from autotune.core.candidate import Candidate
from autotune.measure.intervals import abba
from autotune.measure.pairs import gate_decision
from autotune.study.opening import enqueue_again
from autotune.study.trials import feasible
from autotune.study.view import StudyView

# Holdout rounds at most where the gate against a deployed config cannot decide yet: at the spread of
# pairs one engine apart on this project's noise model (log sd 0.21) the test needs about 20 on average.
GATE_MAX_ROUNDS = 40
SIDES = ("baseline", "pick", "deployed")


def the_pick(view: StudyView) -> FrozenTrial | None:
    """The final pick's first record (a recommended depth schedule, else the selected config), or None
    while the selection phase goes on."""
    from autotune.study.schedule import scheduled_trial

    sel = view.selected()
    if sel is None:
        return None
    chosen = scheduled_trial(view) or view.trial(sel["trial"])
    return view.first_record(chosen)


def deployed_beside(view: StudyView, pick: FrozenTrial) -> FrozenTrial | None:
    """The deployed config measured in this run (a warm start), where it is another config than the
    pick and the baseline and it passed its checks: the gate compares the pick with it, paired."""
    d = view.deployed()
    if d is None or not feasible(d) or view.baseline is None:
        return None
    d = view.first_record(d)
    keys = {Candidate(attrs.candidate(t)).key() for t in (pick, view.baseline)}
    return None if Candidate(attrs.candidate(d)).key() in keys else d


def holdout_trials(view: StudyView, pick: FrozenTrial) -> list[FrozenTrial]:
    """Every holdout trial of ``pick``'s rounds (its own, the baseline's and the deployed config's)."""
    prefix = round_prefix(pick)
    return [t for t in view.trials if attrs.role(t) == attrs.HOLDOUT and str(attrs.round_of(t) or "").startswith(prefix)]


def round_prefix(pick: FrozenTrial) -> str:
    """Holdout rounds of one pick are "h<pick>.<n>": a later pick (a resumed study) never pairs with them."""
    return f"h{pick.number}."


def rounds_done(view: StudyView, pick: FrozenTrial) -> list[str]:
    """The round ids of ``pick``'s holdout whose trials all ended (complete or failed), in order."""
    by: dict[str, list[FrozenTrial]] = {}
    for t in holdout_trials(view, pick):
        if not attrs.is_interrupted(t):
            by.setdefault(str(attrs.round_of(t)), []).append(t)
    done = [r for r, ts in by.items() if all(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in ts)]
    return sorted(done, key=lambda r: int(r.rsplit(".", 1)[1]))


def holdout_step(study: optuna.Study, view: StudyView, cfg: Any) -> bool:
    """Queue the next holdout round; True if queued. ``study``: for writing only."""
    pick, base = the_pick(view), view.baseline
    if pick is None or base is None or pick.number == base.number or not cfg.remeasure:
        return False
    mine = holdout_trials(view, pick)
    if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in mine):
        return False  # a round in flight
    want = int(view.user_attrs.get(attrs.HOLDOUT_PAIRS, cfg.pairs) or 0)
    done = rounds_done(view, pick)
    n = len({attrs.round_of(t) for t in mine if not attrs.is_interrupted(t)}) + 1
    deployed = deployed_beside(view, pick)
    sides: dict[str, FrozenTrial] = {"baseline": base, "pick": pick}
    if deployed is not None:
        sides["deployed"] = deployed
    if len(done) >= want:
        if deployed is None or n > GATE_MAX_ROUNDS:
            return False
        tolerance = float(view.user_attrs.get(attrs.GATE_TOLERANCE, 0.05))
        if gate_decision(view_pairs(view, pick, deployed), tolerance) != "cannot tell":
            return False
        sides = {"pick": pick, "deployed": deployed}  # the gate's pairs alone
    for side in abba(n, [s for s in SIDES if s in sides]):
        t = sides[side]
        enqueue_again(study, t, {attrs.ROLE: attrs.HOLDOUT, attrs.HOLDOUT_OF: t.number,
                                 attrs.ROUND: f"{round_prefix(pick)}{n}"})
    return True


def side_trials(view: StudyView, pick: FrozenTrial, config: FrozenTrial) -> dict[str, FrozenTrial]:
    """``config``'s completed holdout trials in ``pick``'s rounds, by round id."""
    return {str(attrs.round_of(t)): t for t in holdout_trials(view, pick)
            if t.user_attrs.get(attrs.HOLDOUT_OF) == config.number and t.state == TrialState.COMPLETE}


def view_pairs(view: StudyView, pick: FrozenTrial, other: FrozenTrial, metric: str = "output_tok_s"
               ) -> list[tuple[float, float]]:
    """(pick, other) values of ``metric`` per holdout round both completed, in round order."""
    a, b = side_trials(view, pick, pick), side_trials(view, pick, other)
    rounds = sorted(set(a) & set(b), key=lambda r: int(r.rsplit(".", 1)[1]))
    out = []
    for r in rounds:
        x, y = attrs.measurement(a[r]).get(metric), attrs.measurement(b[r]).get(metric)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x > 0 and y > 0:
            out.append((float(x), float(y)))
    return out
