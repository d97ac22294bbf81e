"""The pick's figure and the gate's pairs, from the holdout (autotune.study.holdout) alone, for best.json.

``figure``: the pick's speedup over the baseline over the holdout rounds (pairs measured side by side
after the choice was final): what the headline states. Its ``status`` says whether it was measured,
is pending (``--confirm``: the served rounds are the holdout, autotune.gate.confirm fills it), or was
not measured and why (the study ended first, a round failed); without a measured figure no interval
is the pick's speedup. ``gate``: the pick against a warm start's deployed config over the same
rounds, per objective, for ``autotune check``.
"""

from __future__ import annotations

from typing import Any

from optuna.trial import FrozenTrial

from autotune.core import attrs
from autotune.measure.intervals import UNIT_HOLDOUT, resolution
from autotune.measure.objectives import STREAM_TIMED, direction, split_objective
from autotune.measure.pairs import figure, holdout_interval, log_stats, pairs_needed, sequential_decision
from autotune.study.holdout import GATE_MAX_ROUNDS, deployed_beside, rounds_done, view_pairs
from autotune.study.view import StudyView

MEASURED, PENDING, NOT_MEASURED = "measured", "pending", "not measured"


def _num(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and x == x else None


def pick_figure(view: StudyView, pick: FrozenTrial | None, *, chosen: bool) -> dict[str, Any] | None:
    """best.json's ``figure`` for ``pick`` (its first record); ``chosen``: the selection phase ended."""
    base = view.baseline
    if pick is None or base is None:
        return None
    load = view.user_attrs.get(attrs.LOAD)
    out: dict[str, Any] = {"source": None, "speedup": None, "lo": None, "hi": None, "pairs": 0, "unit": UNIT_HOLDOUT,
                           "resolution": None, "load": load}
    if pick.number == base.number:
        return {**out, "status": NOT_MEASURED, "why": "the pick is the baseline"}
    wanted = view.user_attrs.get(attrs.HOLDOUT_PAIRS, 0)
    if wanted is None:
        return {**out, "status": NOT_MEASURED, "why": "no holdout was measured (--no-remeasure)"}
    want = int(wanted)
    pairs = view_pairs(view, pick, base)
    if not chosen:
        return {**out, "status": NOT_MEASURED,
                "why": "the study ended before its choice was final (no holdout: the measured ratio is the claim only)"}
    if want == 0 and not pairs:
        return {**out, "status": PENDING, "why": "autotune confirm's served rounds (the holdout)"}
    r, lo, hi, n = holdout_interval(pairs, _earlier(view, pick, base))
    out.update(source="holdout", pairs=n)
    if n < 2:
        done = len(rounds_done(view, pick))
        why = (f"{n} of {want} holdout pairs measured ({done} round(s) ended"
               + (", a round failed" if done > n else "") + "): no interval from fewer than 2"
               + ("; the study stopped first (--time-budget, or interrupted): --resume measures the rest"
                  if done < want else ""))
        return {**out, "speedup": _num(r), "status": NOT_MEASURED, "why": why}
    return {**out, "status": MEASURED, "why": None, "speedup": r, "lo": lo, "hi": hi, "resolution": resolution(lo, hi),
            "wanted": want}


def _earlier(view: StudyView, pick: FrozenTrial, base: FrozenTrial) -> list[float]:
    """The pick's log ratios over the baseline in the selection rounds both ran in (side by side,
    before the choice): how far the ratio moved at another time (autotune.measure.pairs.holdout_interval)."""
    import math

    import numpy as np

    from autotune.measure.metrics import round_pairs

    got = round_pairs(attrs.measurement(view.latest(pick)), attrs.measurement(view.latest(base)))
    return [math.log(float(np.median(c)) / float(np.median(b))) for _, c, b in got if float(np.median(c)) > 0]


def gate_pairs(view: StudyView, pick: FrozenTrial | None, tolerance: float) -> dict[str, Any] | None:
    """The pick against the deployed config over the holdout rounds both ran in, per objective (> 1: the
    pick is better), with the sequential decision at ``tolerance`` (autotune.measure.pairs.gate_decision;
    ``final``: the gate's rounds reached their cap, so the point decided what the test had not) and,
    where it cannot tell, about how many pairs would; None without a deployed config measured beside the pick."""
    if pick is None:
        return None
    deployed = deployed_beside(view, pick)
    if deployed is None:
        return None
    out: dict[str, Any] = {"deployed_trial": deployed.number, "deployed_label": attrs.label(deployed),
                           "tolerance": tolerance, "objectives": {}}
    final = len(rounds_done(view, pick)) >= GATE_MAX_ROUNDS
    for name in view.user_attrs.get(attrs.OBJECTIVES) or ["output_tok_s"]:
        dirn = direction(name)
        if dirn is None:
            continue
        pairs = view_pairs(view, pick, deployed, name)
        oriented = pairs if dirn == "maximize" else [(b, a) for a, b in pairs]
        r, lo, hi, n = figure(oriented)
        mean, sd, m = log_stats(oriented)
        decision = sequential_decision(mean, sd, m, tolerance, final=final)  # gate_decision, on the stats at hand
        if not pairs and _not_measured(view, pick, deployed, name):  # no data, nothing more rounds would decide
            decision = NOT_MEASURED
        out["objectives"][name] = {"direction": dirn, "ratio": _num(r), "lo": _num(lo), "hi": _num(hi), "pairs": n,
                                   "log_mean": _num(mean), "log_sd": _num(sd), "final": final, "decision": decision,
                                   "pairs_needed": pairs_needed(sd, tolerance) if decision == "cannot tell"
                                   else None}
    return out


def _not_measured(view: StudyView, pick: FrozenTrial, deployed: FrozenTrial, name: str) -> bool:
    """Objective ``name`` (which no round gave a pair of) is a TPOT or ITL that the holdout rounds the two
    ran side by side did not measure on one side or both: their streams delivered tokens in bursts
    (autotune.measure.coalescing). More rounds of such streams would not decide it: it is not measured."""
    return split_objective(name)[0].rsplit("_", 1)[0] in STREAM_TIMED and bool(view_pairs(view, pick, deployed))
