"""Select, then estimate: the selection phase's last step and the final choice.

After the candidates, the leader (the best feasible fixed-depth record on the first objective) is
the pick outright when no other config comes within SELECTION_BAND of it: one instance each, with
instances of one config differing by 8-20% on a shared machine (benchmarks/data/instance_noise*.json),
a lead beyond that does not turn on noise. Otherwise the leader and the runner-up (the best lossless
config when the leader is lossy) are measured again on fresh engines beside the baseline, in
SELECTION_ROUNDS rounds in the one ABBA order (autotune.measure.intervals.abba), and the pick is the
better of the two over those rounds' pairs (side by side, never the first trials, which were measured
apart). A lossy config wins only where its paired gain interval lies above 1 + lossy_min_gain, and
is measured in rounds only as the leader (``contenders``).

The choice is then final (``SELECTED`` in the study) and the pick's figure comes from the holdout
(autotune.study.holdout): rounds measured after it, which cannot change it. The selection rounds pool
into each config's record (the table shows them), so the pick's pooled record is its claim: the
evidence it was chosen on, named so wherever it is shown.
"""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.core import attrs
from autotune.core.candidate import Candidate
from autotune.measure.config import LOSSY_MIN_GAIN
from autotune.measure.intervals import abba
from autotune.measure.metrics import paired_interval
from autotune.study.trials import feasible, is_schedule
from autotune.study.view import StudyView

SELECTION_BAND = 0.10  # a runner-up within this of the leader (one instance each) may change the choice
SELECTION_ROUNDS = 2  # rounds of fresh engines (baseline, leader, runner-up) when it may
# With a lossy contender: the lossy one must win on paired instances, and a t-interval on 2 pairs has
# t(1) = 12.7 (no gain is significant on it), on 3 t(2) = 4.3.
LOSSY_ROUNDS = 3
SELECTION_PREFIX = "s"  # selection rounds are "s<candidates>.<n>": a resumed study's new selection never pairs old ones


def _key(t: FrozenTrial) -> str:
    return Candidate(attrs.candidate(t)).key()


def _lossy(t: FrozenTrial) -> bool:
    return Candidate(attrs.candidate(t)).lossy


def contenders(view: StudyView) -> tuple[FrozenTrial | None, FrozenTrial | None]:
    """(leader, runner-up) among the current feasible fixed-depth records on the first objective: the
    leader may be lossy; the runner-up is the best other lossless config (the baseline included: a
    leader within the band of no speculation is not a sure gain). A lossy config is never the
    runner-up: behind a lossy leader it is not the lossless alternative, and behind a lossless one it
    could become the pick only by a gain over the leader that lies above 1 + lossy_min_gain on paired
    rounds, which LOSSY_ROUNDS rounds (t(2) = 4.3) cannot show for a config measured behind it: its
    rounds could not change the choice (round 5's demo spent 9 engines on such rounds)."""
    from autotune.study.pareto import pareto_trials

    front = pareto_trials(view, schedules=False)
    if not front:
        return None, None
    sign = view.sign
    # On a tie, the record with more evidence (pooled over fresh engines) goes first.
    lead = max(front, key=lambda t: (sign * t.values[0], attrs.REMEASURE_OF in t.user_attrs))
    others = [t for t in view.current if feasible(t) and not is_schedule(t) and _key(t) != _key(lead)
              and not _lossy(t)]
    runner = max(others, key=lambda t: sign * t.values[0], default=None)
    return lead, runner


def within_band(view: StudyView, lead: FrozenTrial, runner: FrozenTrial, band: float = SELECTION_BAND) -> bool:
    """Whether ``runner`` comes within ``band`` of ``lead`` on the first objective."""
    a, b = lead.values[0], runner.values[0]
    return view.sign * (a - b) <= band * abs(a)


def selected(view: StudyView) -> dict[str, Any] | None:
    """The final choice (StudyView.selected)."""
    return view.selected()


def _prefix(view: StudyView) -> str:
    return f"{SELECTION_PREFIX}{len(view.finished)}."


def _rounds(view: StudyView) -> list[FrozenTrial]:
    """This selection's rounds (after the candidates measured so far)."""
    return [t for t in view.trials if attrs.role(t) == attrs.REMEASURE
            and str(attrs.round_of(t) or "").startswith(_prefix(view)) and not attrs.is_interrupted(t)]


def _comparison(view: StudyView, lead: FrozenTrial, runner: FrozenTrial) -> tuple[float, float, float, int]:
    """The leader over the runner-up on the first objective, > 1 when the leader is better: over the
    selection rounds' pairs where throughput is that objective, else the pooled records' ratio."""
    objective = (view.user_attrs.get(attrs.OBJECTIVES) or ["output_tok_s"])[0]
    a, b = view.latest(lead), view.latest(runner)
    if objective == "output_tok_s":
        r, lo, hi, n = paired_interval(attrs.measurement(a), attrs.measurement(b))
        if n:
            return r, lo, hi, n
    va, vb = a.values[0], b.values[0]
    r = (va / vb if view.sign == 1 else vb / va) if va > 0 and vb > 0 else float("nan")
    return r, float("nan"), float("nan"), 0


def _futile(view: StudyView, lead: FrozenTrial, runner: FrozenTrial, min_gain: float) -> bool:
    """A lossy contender whose paired gain over the lossless one, after a round or more, lies at or
    under 1 + min_gain: the rounds left cannot make it the pick (that needs the interval's lower end
    above 1 + min_gain on LOSSY_ROUNDS pairs, t(2) = 4.3: a mean far above it), so they are not run
    and the lossless config is the pick. Round 5's demo run 9 spent 6 engines on such rounds."""
    if _lossy(lead) == _lossy(runner):
        return False
    r, _, _, n = _comparison(view, lead, runner)
    if n < 1 or not math.isfinite(r) or r <= 0:
        return False
    return (r if _lossy(lead) else 1 / r) <= 1 + min_gain


def _decide(view: StudyView, lead: FrozenTrial, runner: FrozenTrial, min_gain: float) -> dict[str, Any]:
    r, lo, hi, n = _comparison(view, lead, runner)
    evidence = {"ratio": r, "lo": lo, "hi": hi, "pairs": n}
    if _lossy(lead) != _lossy(runner):  # lossless first: the lossy one must win clearly, on paired instances
        lossy, lossless = (lead, runner) if _lossy(lead) else (runner, lead)
        g, g_lo, g_hi = (r, lo, hi) if lossy is lead else (1 / r, 1 / hi, 1 / lo)
        if n >= 2 and math.isfinite(g_lo) and g_lo > 1 + min_gain:
            return {"pick": lossy, "other": lossless, **evidence,
                    "why": f"lossy, and its gain over the best lossless config on {n} paired rounds, {g:.2f}x "
                           f"[{g_lo:.2f}-{g_hi:.2f}], lies above 1 + {min_gain:.0%}"}
        said = f"{g:.2f}x [{g_lo:.2f}-{g_hi:.2f}] on {n} paired rounds" if n >= 2 else f"{n} paired round(s)"
        return {"pick": lossless, "other": lossy, "passed_over": view.first_record(lossy).number, "gain": [g_lo, g_hi],
                **evidence,
                "why": f"lossless first: {attrs.label(lossy)} is lossy and its gain ({said}) does not lie above "
                       f"1 + {min_gain:.0%}"}
    if n == 0 or not math.isfinite(r) or r >= 1:
        return {"pick": lead, "other": runner, **evidence,
                "why": f"ahead of {attrs.label(runner)}" + (f" on {n} paired round(s)" if n else "")}
    return {"pick": runner, "other": lead, **evidence,
            "why": f"ahead of {attrs.label(lead)} on {n} paired round(s), which the first trials had ahead"}


def selection_step(study: optuna.Study, view: StudyView, cfg: Any, *, more_rounds: bool = True) -> bool:
    """Queue the next selection round, or end the selection phase by recording the choice
    (``SELECTED``). True when a round was queued; False when the choice is (now) final or there is
    none. ``study``: for writing only; ``view``: the study as this step read it. ``more_rounds``
    False (out of time): the choice is made on the rounds measured so far."""
    if selected(view) is not None:
        return False
    lead, runner = contenders(view)
    base = view.baseline
    if lead is None or base is None:
        return False
    rounds = _rounds(view)
    if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in rounds):
        return False  # a round in flight
    min_gain = float(view.user_attrs.get(attrs.LOSSY_MIN_GAIN, LOSSY_MIN_GAIN))
    started = {attrs.round_of(t) for t in rounds}
    # Once rounds began they go on to their number: a round that moved the records apart decides nothing alone.
    close = runner is not None and (bool(started) or _lossy(lead) or within_band(view, lead, runner))
    want = LOSSY_ROUNDS if runner is not None and _lossy(lead) != _lossy(runner) else SELECTION_ROUNDS
    futile = bool(started) and runner is not None and _futile(view, lead, runner, min_gain)
    if close and cfg.remeasure and more_rounds and len(started) < want and not _failed(rounds) and not futile:
        _queue_round(study, view, len(started) + 1, [base, lead, runner])
        return True
    if runner is None:
        choice = {"pick": lead, "other": None, "why": "no other feasible config to compare with"}
    elif not close:
        gap = view.sign * (lead.values[0] - runner.values[0]) / abs(lead.values[0])
        choice = {"pick": lead, "other": runner,
                  "why": f"{gap:.0%} ahead of {attrs.label(runner)}, beyond the selection band ({SELECTION_BAND:.0%})"}
    else:
        choice = _decide(view, lead, runner, min_gain)
        if futile and len(started) < want:
            choice["why"] += (f"; after {len(started)} of {want} rounds its paired gain lay at or under 1 + "
                              f"{min_gain:.0%}, where the rest could not lift its interval above it: not run")
    other, chosen = choice.pop("other"), choice.pop("pick")
    for k in ("ratio", "lo", "hi", "pairs"):
        choice.pop(k, None)
    pick = view.first_record(chosen)
    study.set_user_attr(attrs.SELECTED, {
        "trial": pick.number, "label": attrs.label(pick), "candidates": len(view.finished), "rounds": len(started),
        "runner_up": None if other is None else {"trial": view.first_record(other).number, "label": attrs.label(other),
                                                 **_over(view, chosen, other)},
        **{k: ([_clean(x) for x in v] if isinstance(v, list) else v) for k, v in choice.items()}})
    return False


def _over(view: StudyView, pick: FrozenTrial, other: FrozenTrial) -> dict[str, Any]:
    """The pick over ``other`` (> 1: the pick is better on the first objective): over the selection
    rounds' pairs where there were any, else the bootstrap over the windows of one instance each."""
    from autotune.measure.metrics import ratio_interval

    r, lo, hi, n = _comparison(view, pick, other)
    if not n:
        a, b = attrs.measurement(view.latest(pick)), attrs.measurement(view.latest(other))
        lo, hi = ratio_interval(a.get("output_tok_s_windows") or [], b.get("output_tok_s_windows") or [])
        if view.sign == -1 or (view.user_attrs.get(attrs.OBJECTIVES) or ["output_tok_s"])[0] != "output_tok_s":
            lo = hi = float("nan")  # the windows' interval is throughput's; the ratio is the objective's
    return {"ratio": _clean(r), "lo": _clean(lo), "hi": _clean(hi), "pairs": n}


def _clean(x: Any) -> float | None:
    """A number Optuna's storage keeps as JSON (no NaN)."""
    return None if not isinstance(x, (int, float)) or not math.isfinite(x) else float(x)


def _failed(rounds: list[FrozenTrial]) -> bool:
    """A selection round whose engine failed: no more rounds (the records stand as they are)."""
    return any(t.state == TrialState.FAIL for t in rounds)


def _queue_round(study: optuna.Study, view: StudyView, n: int, sides: list[FrozenTrial]) -> None:
    """Round ``n`` of fresh engines for ``sides`` (each pools with its config's current record), in the
    one ABBA order."""
    from autotune.study.opening import enqueue_again

    unique = list({_key(t): t for t in sides}.values())  # the baseline may be the runner-up
    names = {str(i): t for i, t in enumerate(unique)}
    for i in abba(n, list(names)):
        t = view.latest(names[i])
        enqueue_again(study, t, {attrs.ROLE: attrs.REMEASURE, attrs.REMEASURE_OF: t.number,
                                 attrs.ROUND: f"{_prefix(view)}{n}"})
