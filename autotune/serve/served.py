"""The served numbers (autotune confirm): their verdict against the study's claim, the one line
that shows them, and the comparison `autotune check` makes when both runs were served.
Reads best.json dicts only; needs neither Optuna nor vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.measure.pairs import quotient_interval
from autotune.serve.bench_client import _num

AGREE = "agree"  # what confirm wrote before round 4 (a point ratio within 5%); still read


def _fmt(x: float, lo: float | None, hi: float | None) -> str:
    return f"{x:.2f}x" + (f" [{lo:.2f}-{hi:.2f}]" if lo is not None and hi is not None else "")


AGREE_WITHIN = 0.05  # claimed/served inside 1 +- this, its whole interval, is agreement within 5%
# The claimed/served verdict's first word (``gap``). Never "consistent": a 1.49 gap whose wide interval
# still held 1 was called that (issue 60), and a user reads a 49% gap.
WITHIN, RESOLVED, DIFFER, UNTOLD = f"within {AGREE_WITHIN:.0%}", "within the served resolution", "differ", "cannot tell"
CONSISTENT = "consistent"  # what confirm wrote before issue 60 (an interval holding 1); still read


def gap(ratio: float, lo: float, hi: float, resolution: float | None) -> tuple[str, str]:
    """(the first word, why) of a claim against a figure measured after the choice, ``ratio`` = claim /
    figure with its interval: ``within 5%`` where the whole interval lies inside 1 +- 5%; ``differ``
    where the interval excludes 1, or where the point gap is wider than the figure resolves (a plain
    difference, however wide the interval); within the resolution where the point gap is not; with no
    resolution and an interval holding 1, ``cannot tell``."""
    side = "above" if ratio > 1 else "below"
    if 1 - AGREE_WITHIN <= lo and hi <= 1 + AGREE_WITHIN:
        return WITHIN, f"the interval lies inside 1 +- {AGREE_WITHIN:.0%}"
    if not lo <= 1 <= hi:
        return DIFFER, f"the interval excludes 1: the claim lies {side} the served figure"
    if resolution is not None and abs(ratio - 1) > resolution:
        return DIFFER, (f"the claim lies {abs(ratio - 1):.0%} {side} the served figure, more than the served "
                        f"rounds resolve (+-{resolution:.0%}); the interval still holds 1")
    if resolution is not None:
        return RESOLVED, f"the gap is within the served rounds' +-{resolution:.0%}"
    return UNTOLD, "the interval holds 1 and the served figure has no resolution of its own"


def claim_ratio(served: tuple[float, float | None, float | None], claimed: tuple[float, float | None, float | None]
                ) -> tuple[float, float, float]:
    """claimed / served with an interval: the ratio of the points, and the widest ratios the two
    intervals allow (a side without an interval is its point)."""
    s, s_lo, s_hi = served
    c, c_lo, c_hi = claimed
    s_lo, s_hi = (s if s_lo is None else s_lo), (s if s_hi is None else s_hi)
    c_lo, c_hi = (c if c_lo is None else c_lo), (c if c_hi is None else c_hi)
    return c / s, c_lo / s_hi, c_hi / s_lo


def verdict(served: tuple[float, float | None, float | None], claimed: tuple[float, float | None, float | None],
            *, resolution: float | None = None, rounds: int | None = None) -> str:
    """One line: the claim against the served figure by ``gap``'s rule, with the claimed/served
    interval and confirm's own resolution (the relative half-width of the served interval over
    ``rounds``). A point ratio near 1 with a wide interval is no agreement, and a wide gap whose
    interval holds 1 is no agreement either."""
    r, lo, hi = claim_ratio(served, claimed)
    word, why = gap(r, lo, hi, resolution)
    res = (f"confirm resolves +-{resolution:.0%}" if resolution is not None else "confirm has no interval of its own")
    res += f" over {rounds} served round(s) a side" if rounds else ""
    return (f"{word}: claimed {_fmt(claimed[0], *claimed[1:])} (the study's), served {_fmt(served[0], *served[1:])}: "
            f"claimed/served {r:.2f} [{lo:.2f}-{hi:.2f}], {why}; {res}")


def _how(servers: str | None) -> str:
    """How confirm's servers came to exist (older results say nothing: fresh processes)."""
    return {"forked": ", servers forked from autotune's launcher",
            "forked+fresh": ", servers forked from autotune's launcher or, where it could not, fresh"}.get(servers or "", "")


def served_line(report: dict[str, Any]) -> str | None:
    """One line for the console and reports: served beside claimed, or why there is no served number."""
    best = report.get("best") or {}
    sv = best.get("served")
    if not sv:
        return None
    if sv.get("failure"):
        return f"served: not confirmed: {sv['failure']}"
    c = sv.get("claimed") or {}
    claim = f"; claimed by the study {_fmt(c['speedup'], c.get('lo'), c.get('hi'))}" if _num(c.get("speedup")) else ""
    line = (f"served: {_fmt(sv['speedup'], sv.get('speedup_lo'), sv.get('speedup_hi'))} the baseline's output "
            f"tok/s (vllm serve + vllm bench serve, {sv['rounds']} round(s) a side{_how(sv.get('servers'))}, "
            f"95% interval over {sv.get('interval_unit') or 'rounds'})"
            f"{claim}")
    v = report.get("served_vs_claimed")
    if v == AGREE and _num(c.get("speedup")):  # written before round 4: a point ratio within 5%
        return line + f": claimed/served {c['speedup'] / sv['speedup']:.2f}, within {AGREE_WITHIN:.0%}"
    return line + (f": {v}" if v else "")




@dataclass(frozen=True)
class ServedComparison:
    """The served throughput speedups of the two picks (each over its own run's baseline)."""

    new: float | None
    new_lo: float | None
    new_hi: float | None
    old: float | None
    old_lo: float | None
    old_hi: float | None
    ratio: float | None  # new / old, > 1 better; None unless both were served
    ratio_lo: float | None  # the widest new / old the two served intervals allow
    ratio_hi: float | None
    reasons: list[str]  # beyond the ratio: each makes `check` fail
    notes: list[str]


def _served_of(report: dict[str, Any]) -> dict[str, Any] | None:
    sv = (report.get("best") or {}).get("served")
    return sv if isinstance(sv, dict) else None


def compare_served(new: dict[str, Any], old: dict[str, Any]) -> ServedComparison | None:
    """``check``'s view of the served numbers in two StudyReports (best.json dicts); None when
    neither has any.

    Both served: the throughput comparison uses the served speedups (``ratio``; `check` puts it
    in place of the study's claims across two runs). A served speedup is compared only with
    another served one: a study's claim rests on fewer server instances. Fails (``reasons``): the new pick's
    served confirmation failed (the exported command did not serve), or its served speedup
    interval lies wholly below 1 (slower than the baseline when served).
    """
    sn, so = _served_of(new), _served_of(old)
    if sn is None and so is None:
        return None
    reasons: list[str] = []
    notes: list[str] = []
    vals: dict[str, tuple[float | None, float | None, float | None]] = {}
    for key, sv in (("new", sn), ("old", so)):
        if sv is None or sv.get("failure"):
            vals[key] = (None, None, None)
            continue
        vals[key] = (_num(sv.get("speedup")), _num(sv.get("speedup_lo")), _num(sv.get("speedup_hi")))
    if sn is not None and sn.get("failure"):
        reasons.append(f"the new pick's exported command failed when served (autotune confirm): {sn['failure']}")
    elif sn is None:
        notes.append("the new pick was not confirmed served (autotune confirm): the study's numbers only")
    n, n_lo, n_hi = vals["new"]
    if n is not None:
        if n_hi is not None and n_hi < 1:
            reasons.append(f"the new pick is slower than its baseline when served: {_fmt(n, n_lo, n_hi)} "
                           "(vllm serve + vllm bench serve)")
        elif n_hi is None and n < 1:  # one served round: no interval, and a point decides nothing (issue 60)
            notes.append(f"the new pick served {_fmt(n, None, None)} its baseline in one round, no interval: "
                         "cannot tell whether it is slower (autotune confirm with more rounds decides)")
        if new.get("served_vs_claimed") not in (None, AGREE) and not new["served_vs_claimed"].startswith(WITHIN):
            notes.append(new["served_vs_claimed"])
    o, o_lo, o_hi = vals["old"]
    ratio = n / o if n is not None and o is not None and o > 0 else None
    r_lo = r_hi = None
    if ratio is not None:
        r_lo, r_hi = quotient_interval((n_lo, n_hi), (o_lo, o_hi))
    if ratio is not None:
        notes.append(f"output_tok_s: compared on served speedups (vllm serve + vllm bench serve): "
                     f"{_fmt(*vals['old'])} then, {_fmt(*vals['new'])} now")
    elif n is not None or o is not None:
        notes.append("only one run has served numbers: throughput compared on the studies' speedups")
    return ServedComparison(new=n, new_lo=n_lo, new_hi=n_hi, old=o, old_lo=vals["old"][1], old_hi=vals["old"][2],
                            ratio=ratio, ratio_lo=r_lo, ratio_hi=r_hi, reasons=reasons, notes=notes)
