"""Compare a new study's pick with the deployed one (nightly CI): regression or not, and why.

Absolute tok/s moves by tens of percent between two runs on a shared machine, while ratios measured
side by side in one run hold to a few percent. So the gate compares what one run measured:
- the new study re-measured the deployed config (``search --warm-start``): the new pick against it in
  the holdout rounds both ran in (best.json's ``gate``), objective by objective, by the gate's
  sequential test over those pairs (autotune.measure.pairs.sequential_decision: a pick as fast as the
  deployed config passes, one twice the tolerance slower fails, the line 1 - tolerance midway); the
  study adds rounds until the test decides, up to a cap where the truncated test decides on the pairs'
  mean, and a run cut short cannot tell and says about how many pairs would (results from before
  round 5: the bootstrap over windows, with a note that the unit is too narrow);
- otherwise (the weaker mode): each pick's figure over its own run's baseline, their intervals combined
  in quadrature, and the summary says that the comparison spans two runs;
- a run checked against itself (SAME_EVIDENCE) has nothing to judge and passes, on that one basis.
The deployed config's drift (its speedup then and now) is reported beside, never judged.

Outside the same-run pairs, each objective is decided on its interval, never its point ratio
(``decide``): a regression only when the whole interval lies below 1 - tolerance, no regression when
it lies wholly at or above, and "cannot tell" when it straddles the line or there is no interval
(its own exit code, saying what would decide; a nightly job should neither deploy nor page on it).
Reads two saved StudyReports (best.json); needs neither Optuna nor vLLM.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.core.errors import BadInput
from autotune.measure.metrics import ratio_interval
from autotune.measure.objectives import direction, windows_key
from autotune.measure.intervals import t_quantile
from autotune.measure.pairs import (OK, REGRESSED, UNDECIDED, decide, pairs_needed, quotient_interval,
                                     sequential_decision)
from autotune.serve.served import ServedComparison, compare_served

SAME_RUN = "same run"
TWO_RUNS = "two runs"
SAME_EVIDENCE = "same evidence"  # a run checked against itself: nothing to judge
TWO_RUN_UNIT = "each run's interval, combined (two runs: the weaker mode)"
TWO_RUN_POINT = "each run's speedup, a point: best.json keeps no interval for it"
SERVED_UNIT = "served rounds, each run's interval combined"
SAME_CONFIG = "the same config: the new pick is the deployed config's own record"
WINDOWS_UNIT = "windows of one instance each"

REGRESSION = "regression"  # the check's status: the worst of its objectives (pairs' OK, UNDECIDED), correctness first


@dataclass(frozen=True)
class ObjectiveChange:
    """One objective: the new pick over the deployed config, oriented so that > 1 is better."""

    name: str
    direction: str
    deployed: float  # same run: the deployed config's value now; two runs: its speedup then
    new: float  # same run: the new pick's value; two runs: its speedup now
    ratio: float
    lo: float | None  # 95% interval of the ratio (same run: t over paired holdout rounds; two runs: both speedups')
    hi: float | None
    decision: str  # OK, REGRESSED or UNDECIDED (``decide``)
    unit: str = "paired holdout rounds"  # what the interval is over
    pairs: int | None = None
    pairs_needed: int | None = None  # about how many pairs would decide, where it cannot tell

    @property
    def regressed(self) -> bool:
        return self.decision == REGRESSED


@dataclass(frozen=True)
class Drift:
    """The deployed config's throughput speedup over each run's own baseline, then and now."""

    then: float
    then_lo: float | None
    then_hi: float | None
    now: float
    now_lo: float | None
    now_hi: float | None
    lost_gain: bool  # the intervals lie apart and the gain fell beyond the tolerance


@dataclass(frozen=True)
class CheckResult:
    status: str  # OK, REGRESSION or UNDECIDED; each has its own exit code
    reasons: list[str]  # why it is a regression (empty unless status is REGRESSION)
    objectives: list[ObjectiveChange]
    new_label: str | None
    old_label: str | None
    tolerance: float
    basis: str  # SAME_RUN, TWO_RUNS or SAME_EVIDENCE
    drift: Drift | None = None
    notes: list[str] = field(default_factory=list)
    changed_context: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    undecided: list[str] = field(default_factory=list)  # why it cannot tell (status UNDECIDED)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        for c, o in zip(d["objectives"], self.objectives):
            c["regressed"] = o.regressed
        return d


def parse_share(text: str, flag: str = "--tolerance") -> float:
    """``5%`` or ``0.05`` -> 0.05 (``flag`` names the option in the one-line refusal)."""
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        raise BadInput(f"{flag}: expected a share like 5% or 0.05, got {text!r}") from None
    if not 0 <= value < 1:
        raise BadInput(f"{flag}: expected a share in [0%, 100%), got {text!r}")
    return value


def parse_tolerance(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05."""
    return parse_share(text, "--tolerance")


def _context(report: dict[str, Any]) -> dict[str, Any]:
    best = report.get("best") or {}
    return {"vllm_version": report.get("vllm_version"), "platform": (report.get("platform") or {}).get("platform"),
            "model": (best.get("engine_kwargs") or {}).get("model"), "workload": report.get("workload"),
            "load": report.get("load")}


def _finite(*xs: Any) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def _oriented(a: float, b: float, dirn: str) -> float:
    """a over b, > 1 when a is better."""
    return a / b if dirn == "maximize" else b / a


def _nan_none(x: float) -> float | None:
    return x if _finite(x) else None


def _paired(name: str, dirn: str, gate: dict[str, Any], tol: float) -> ObjectiveChange | None:
    """The pick against the deployed config over the holdout rounds both ran in (best.json's ``gate``):
    the unit the study's figure has, measured side by side; decided here at ``tol`` by the gate's
    sequential test (autotune.measure.pairs.sequential_decision) on the pairs' log mean and spread
    (from results that lack them, the spread is read back from the 95% t-interval)."""
    g = (gate.get("objectives") or {}).get(name)
    if not g or g.get("ratio") is None:
        return None
    lo, hi, n = g.get("lo"), g.get("hi"), int(g.get("pairs") or 0)
    mean, sd = g.get("log_mean"), g.get("log_sd")
    if not _finite(mean, sd) and n >= 2 and _finite(lo, hi) and 0 < lo <= hi:
        mean, sd = math.log(g["ratio"]), 0.5 * math.log(hi / lo) * math.sqrt(n) / t_quantile(n - 1)
    decision = (sequential_decision(mean, sd, n, tol, final=bool(g.get("final"))) if _finite(mean, sd)
                else UNDECIDED)
    needed = pairs_needed(sd, tol) if decision == UNDECIDED and _finite(sd) else None
    return ObjectiveChange(name, dirn, 1.0, g["ratio"], g["ratio"], lo, hi, decision, pairs=n, pairs_needed=needed)


def _same_run(name: str, dirn: str, pick: dict[str, Any], dep: dict[str, Any], tol: float,
              same_trial: bool = False) -> ObjectiveChange | None:
    """Before round 5 (no holdout pairs in best.json): the bootstrap over windows of one instance each,
    a unit far narrower than instances differ (the note says so)."""
    n, d = pick.get(name), dep.get(name)
    if not _finite(n, d) or n <= 0 or d <= 0:
        return None
    r = _oriented(n, d, dirn)
    if same_trial:  # the new pick is the deployed config itself: nothing changed, no ratio to judge
        return ObjectiveChange(name, dirn, d, n, 1.0, 1.0, 1.0, OK, unit=SAME_CONFIG)
    nw, dw = pick.get(windows_key(name)) or [], dep.get(windows_key(name)) or []
    lo, hi = ratio_interval(nw, dw) if dirn == "maximize" else ratio_interval(dw, nw)
    lo, hi = _nan_none(lo), _nan_none(hi)
    return ObjectiveChange(name, dirn, d, n, r, lo, hi, decide(r, lo, hi, tol), unit=WINDOWS_UNIT)


def _speedup_of(entry: dict[str, Any], base: dict[str, Any] | None, name: str, dirn: str) -> float:
    m, b = entry["measurement"].get(name), (base or {}).get("measurement", {}).get(name)
    return _oriented(m, b, dirn) if _finite(m, b) and m > 0 and b > 0 else float("nan")


def _two_runs(name: str, dirn: str, new: dict[str, Any], old: dict[str, Any], tol: float) -> ObjectiveChange | None:
    n = _speedup_of(new["best"], new.get("baseline"), name, dirn)
    o = _speedup_of(old["best"], old.get("baseline"), name, dirn)
    if not _finite(n, o):
        return None
    lo = hi = None  # no interval: cannot tell (``decide``)
    if name == "output_tok_s":  # the one objective whose speedup carries an interval in best.json
        (n, n_lo, n_hi), (o, o_lo, o_hi) = _figure_of(new, n), _figure_of(old, o)
        lo, hi = quotient_interval((n_lo, n_hi), (o_lo, o_hi))
    r = n / o
    return ObjectiveChange(name, dirn, o, n, r, lo, hi, decide(r, lo, hi, tol),
                           unit=TWO_RUN_UNIT if lo is not None else TWO_RUN_POINT)


def _figure_of(report: dict[str, Any], point: float) -> tuple[float, float | None, float | None]:
    """A run's throughput speedup and its interval: its figure (holdout or served, measured after the
    choice) where it has one, else best.json's speedup (before round 5)."""
    f = report.get("figure") or {}
    if f.get("status") == "measured" and _finite(f.get("speedup"), f.get("lo"), f.get("hi")):
        return f["speedup"], f["lo"], f["hi"]
    s = report["best"].get("speedup") or {}
    return point, s.get("output_tok_s_lo"), s.get("output_tok_s_hi")


def _drift(old_best: dict[str, Any], deployed: dict[str, Any], tol: float) -> Drift | None:
    then, now = old_best.get("speedup") or {}, deployed.get("speedup") or {}
    if not _finite(then.get("output_tok_s"), now.get("output_tok_s")):
        return None
    t_lo, n_hi = then.get("output_tok_s_lo"), now.get("output_tok_s_hi")
    lost = _finite(t_lo, n_hi) and n_hi < t_lo and now["output_tok_s"] < then["output_tok_s"] * (1 - tol)
    return Drift(then["output_tok_s"], _nan_none(then.get("output_tok_s_lo")), _nan_none(then.get("output_tok_s_hi")),
                 now["output_tok_s"], _nan_none(now.get("output_tok_s_lo")), _nan_none(n_hi), bool(lost))


def _interval(lo: float | None, hi: float | None) -> str:
    return f" [{lo:.2f}-{hi:.2f}]" if lo is not None and hi is not None else ""


def _undecided(c: ObjectiveChange, basis: str, tolerance: float) -> str:
    what = "the deployed config measured in the same run" if basis == SAME_RUN else "the deployed config's speedup " \
        "in the old run"
    more = (f"about {c.pairs_needed} paired holdout rounds would decide (this run measured {c.pairs}: "
            "search --pairs, or a wider --tolerance)" if c.pairs_needed else
            "a new study with --warm-start (and without --no-remeasure) measures the two in paired holdout rounds, "
            "which decide" if basis == SAME_RUN else "a run with --warm-start decides on pairs measured side by side")
    line = f"the line {1 - tolerance:.2f} (the {tolerance:.0%} tolerance)"
    how = (f"the gate's sequential test against {line} undecided after {c.pairs} pair(s)" if c.pairs is not None
           else f"an interval across {line}" if c.lo is not None else "with no interval: a point decides nothing")
    return (f"{c.name}: cannot tell: the new pick over {what} is {c.ratio:.3f}{_interval(c.lo, c.hi)} ({c.unit}), "
            f"{how}; {more}")


def _reason(c: ObjectiveChange, basis: str, tolerance: float) -> str:
    if basis == SAME_RUN:
        return (f"{c.name}: the new pick is {1 - c.ratio:.1%} worse than the deployed config measured in the same "
                f"run ({c.deployed:.4g} -> {c.new:.4g}, ratio {c.ratio:.3f}{_interval(c.lo, c.hi)}), "
                f"beyond the {tolerance:.0%} tolerance" + (f", by the gate's sequential test over {c.pairs} paired "
                                                          "holdout rounds" if c.pairs else f" ({c.unit})"))
    return (f"{c.name}: the new pick's speedup over its baseline is {1 - c.ratio:.1%} below the deployed config's "
            f"in the old run ({c.deployed:.2f}x -> {c.new:.2f}x, ratio {c.ratio:.3f}{_interval(c.lo, c.hi)}), beyond "
            f"the {tolerance:.0%} tolerance ({c.unit})")


def _objective(name: str, dirn: str, new: dict[str, Any], old: dict[str, Any], dep: dict[str, Any] | None,
               served: ServedComparison | None, tolerance: float) -> ObjectiveChange | None:
    """One objective's comparison on the strongest evidence both runs have; without an interval (or a
    sequential test) its decision is UNDECIDED, never the point's."""
    nb, same_config = new["best"], _same_config(new["best"], dep, new.get("selection"))
    if dep is not None and not same_config and (c := _paired(name, dirn, new.get("gate") or {}, tolerance)):
        return c  # the holdout's pairs (a study with --no-remeasure has none: the windows below)
    if dep is not None:
        return _same_run(name, dirn, nb["measurement"], dep["measurement"], tolerance, same_trial=same_config)
    if name == "output_tok_s" and served is not None and served.ratio is not None:
        # Both picks were served (autotune confirm): their served speedups, not the in-process claims.
        return ObjectiveChange(name, dirn, served.old, served.new, served.ratio, served.ratio_lo, served.ratio_hi,
                               decide(served.ratio, served.ratio_lo, served.ratio_hi, tolerance), unit=SERVED_UNIT)
    return _two_runs(name, dirn, new, old, tolerance)


def compare(new: dict[str, Any], old: dict[str, Any], *, tolerance: float) -> CheckResult:
    """Is ``new``'s pick at least as good as the deployed one (``old``'s), within ``tolerance``, and correct?"""
    ob, nb = old.get("best"), new.get("best")
    if ob is None:
        raise BadInput("--against: the old results have no chosen configuration to compare with")
    reasons: list[str] = []
    notes: list[str] = []
    if nb is None:
        reasons.append("the new study found no feasible (correct) configuration")
    elif not nb["verdict"]["passed"]:
        reasons.append(f"the new pick failed its correctness checks: {nb['verdict']['reason']}")
    elif nb["verdict"].get("status") == "unverified":
        reasons.append(f"the new pick is unverified (no evidence it is correct): {nb['verdict']['reason']}")
    dep = new.get("deployed")
    if dep is not None and any(dep.get("candidate", {}).get(k) != v for k, v in ob.get("candidate", {}).items()):
        notes.append(f"the re-measured config ({dep['label']}) differs from the deployed one ({ob['label']}): "
                     "its space lacks some of the deployed knobs")
    if dep is not None and "measurement" not in dep:
        notes.append(f"the deployed config failed in this run: {dep.get('failure')}")
        dep = None
    same = _same_evidence(new, old) if nb is not None else None
    basis = SAME_EVIDENCE if same else SAME_RUN if dep is not None else TWO_RUNS
    if basis == TWO_RUNS:
        notes.append("the deployed config was not re-measured in this run (no --warm-start, or outside the space): "
                     "the comparison spans two runs, on each pick's speedup over its own run's baseline")
    changes: list[ObjectiveChange] = []
    undecided: list[str] = []
    drift = None
    served = compare_served(new, old)  # None: neither run was confirmed served
    for name in (new.get("objectives") or old.get("objectives") or []) if nb is not None else []:
        if (dirn := direction(name)) is None:
            continue
        c = (ObjectiveChange(name, dirn, 1.0, 1.0, 1.0, 1.0, 1.0, OK, unit=same) if same else
             _objective(name, dirn, new, old, dep, served, tolerance))
        if c is None:
            notes.append(f"{name}: not measured on both sides, not compared")
            continue
        if c.unit == WINDOWS_UNIT:
            notes.append(f"{name}: results from before round 5 (no holdout pairs): judged on windows of one "
                         "instance each, far narrower than instances differ; rerun the new study to decide on pairs")
        changes.append(c)
        if c.regressed:
            reasons.append(_reason(c, basis, tolerance))
        elif c.decision == UNDECIDED:
            undecided.append(_undecided(c, basis, tolerance))
    if basis == SAME_RUN:
        drift = _drift(ob, dep, tolerance)
        if drift is not None and drift.lost_gain:
            notes.append(f"the deployed config lost gain since the old run: {drift.then:.2f}x"
                         f"{_interval(drift.then_lo, drift.then_hi)} then, {drift.now:.2f}x"
                         f"{_interval(drift.now_lo, drift.now_hi)} now (speedups over each run's own baseline)")
    if served is not None:  # the new pick's own served failures count on every basis; a self-check compares nothing
        reasons += served.reasons
        notes += served.notes if basis != SAME_EVIDENCE else []
    ctx_new, ctx_old = _context(new), _context(old)
    changed = {k: (ctx_old[k], ctx_new[k]) for k in ctx_new if ctx_new[k] != ctx_old[k]}
    if basis == SAME_RUN and (reasons or undecided) and nb is not None:
        notes += _holds_all(new, dep, tolerance)
    if nb is not None and not changes and not reasons:  # a gate that compared nothing must not pass
        raise BadInput(f"check: compared nothing: the new results' objectives: {_names(new)}; the deployed "
                       f"results' objectives: {_names(old)}; no objective with a known direction was measured on "
                       "both sides (rerun the new study with the deployed run's --objectives, or --warm-start)")
    status = REGRESSION if reasons else UNDECIDED if undecided else OK
    return CheckResult(status=status, reasons=reasons, objectives=changes,
                       new_label=nb["label"] if nb else None, old_label=ob["label"], tolerance=tolerance,
                       basis=basis, drift=drift, notes=notes, changed_context=changed, undecided=undecided)


def _same_config(nb: dict[str, Any], dep: dict[str, Any] | None, selection: dict[str, Any] | None = None) -> bool:
    """The new pick is the deployed config (its re-measurement, or a pooled record of it: the selection
    names the pick by its first record, which is the deployed trial): nothing changed."""
    if dep is None:
        return False
    first = (selection or {}).get("trial")
    return (nb.get("trial") is not None and nb.get("trial") == dep.get("trial")) or \
        (first is not None and first == dep.get("trial"))


def _same_evidence(new: dict[str, Any], old: dict[str, Any]) -> str | None:
    """A run checked against itself (the same study's results, the same pick measured once): no change
    to judge, so no regression; None for two runs, or results with no creation time to tell them by."""
    nb, ob = new.get("best") or {}, old.get("best") or {}
    if new.get("created") is not None and all(new.get(k) == old.get(k) for k in ("study", "created", "storage")) \
            and nb.get("trial") == ob.get("trial") and nb.get("measurement") == ob.get("measurement"):
        return "the same run: identical evidence on both sides"
    return None


def _names(report: dict[str, Any]) -> str:
    return ", ".join(report.get("objectives") or []) or "none"


def _holds_all(new: dict[str, Any], dep: dict[str, Any], tolerance: float) -> list[str]:
    """The pick is chosen on the first objective; with several, a config of the new Pareto front may
    hold every objective against the deployed config where the pick does not. Name it (judged by
    the same rule, every objective OK), so the operator can deploy it instead."""
    names = [n for n in new.get("objectives") or [] if direction(n) is not None]
    for e in new.get("pareto") or []:
        if e.get("label") == (new.get("best") or {}).get("label") or not (e.get("verdict") or {}).get("passed"):
            continue
        changes = [_same_run(n, direction(n), e["measurement"], dep["measurement"], tolerance) for n in names]
        if changes and all(c is not None and c.decision == OK for c in changes):
            return [f"{e['label']} (trial {e.get('trial')}, on the new Pareto front) holds every objective against "
                    f"the deployed config within the {tolerance:.0%} tolerance, where the pick does not"]
    return []


def markdown(r: CheckResult) -> str:
    """A short Markdown summary (for $GITHUB_STEP_SUMMARY)."""
    head = "## autotune check: " + {OK: "no regression", REGRESSION: "REGRESSION", UNDECIDED: "CANNOT TELL"}[r.status]
    how = {SAME_RUN: "the new pick against the deployed config, both measured in the new run",
           TWO_RUNS: "each pick's speedup over its own run's baseline; **the comparison spans two runs**",
           SAME_EVIDENCE: "the same run on both sides (identical evidence): nothing changed, nothing to judge"}[r.basis]
    lines = [head, "", f"Deployed: `{r.old_label}`; new pick: `{r.new_label}`; tolerance {r.tolerance:.0%}.",
             f"Compared: {how}.", ""]
    if r.objectives and r.basis != SAME_EVIDENCE:
        cols = ("deployed now", "new pick") if r.basis == SAME_RUN else ("deployed speedup then", "new speedup now")
        units = " / ".join(dict.fromkeys(c.unit for c in r.objectives if c.lo is not None))
        unit = f", 95% interval over {units}" if units else ""
        lines += [f"| objective | {cols[0]} | {cols[1]} | ratio (> 1 better){unit} |", "|---|---|---|---|"]
        for c in r.objectives:
            lines.append(f"| {c.name} ({c.direction}) | {c.deployed:.4g} | {c.new:.4g} | "
                         f"{c.ratio:.3f}{_interval(c.lo, c.hi) or ' (no interval)'}"
                         f"{' **worse**' if c.regressed else ' **cannot tell**' if c.decision == UNDECIDED else ''} |")
        lines.append("")
    if r.drift is not None:
        d = r.drift
        lines += [f"Deployed config's speedup over its run's baseline: {d.then:.2f}x{_interval(d.then_lo, d.then_hi)} "
                  f"then, {d.now:.2f}x{_interval(d.now_lo, d.now_hi)} now.", ""]
    lines += [f"- {x}" for x in r.reasons + r.undecided]
    lines += [f"- note: {x}" for x in r.notes]
    for k, (o, n) in r.changed_context.items():
        lines.append(f"- note: {k} changed: `{o}` -> `{n}`")
    return "\n".join(lines) + "\n"
