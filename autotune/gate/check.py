"""Compare a new study's pick with the deployed one (nightly CI): regression or not, and why.

Absolute tok/s moves by tens of percent between two runs on a shared machine, while ratios measured
side by side in one run hold to a few percent. So the gate compares what one run measured:
- the new study re-measured the deployed config (``search --warm-start``): the new pick against that
  re-measurement, objective by objective, with the bootstrap interval of the ratio over windows;
- otherwise: each pick's speedup over its own run's baseline, and the summary says that the
  comparison spans two runs.
The deployed config's drift (its speedup then and now) is reported beside, never judged on the old
run's absolute numbers.

Each objective is decided on its interval, not its point ratio (``decide``): a regression only when
the whole interval lies below 1 - tolerance, no regression when it lies wholly at or above, and
"cannot tell" when it straddles the line (its own exit code: more rounds or pairs are needed, and a
nightly job should neither deploy nor page on it). Reads two saved StudyReports (best.json); needs
neither Optuna nor vLLM.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.core.errors import BadInput
from autotune.measure.metrics import ratio_interval
from autotune.measure.objectives import direction, windows_key
from autotune.serve.served import compare_served

SAME_RUN = "same run"
TWO_RUNS = "two runs"

# An objective's decision, and the check's status (the worst of its objectives, correctness first).
OK, REGRESSED, UNDECIDED = "ok", "regressed", "cannot tell"
REGRESSION = "regression"


def decide(ratio: float, lo: float | None, hi: float | None, tolerance: float) -> str:
    """One objective's ratio (> 1 better) against the line 1 - tolerance, on its interval where
    there is one: REGRESSED when the interval lies wholly below the line, OK when wholly at or above,
    UNDECIDED when it straddles. Without an interval the point decides (and the caller says so)."""
    line = 1 - tolerance
    if lo is None or hi is None:
        return REGRESSED if ratio < line else OK
    if hi < line:
        return REGRESSED
    return OK if lo >= line else UNDECIDED


@dataclass(frozen=True)
class ObjectiveChange:
    """One objective: the new pick over the deployed config, oriented so that > 1 is better."""

    name: str
    direction: str
    deployed: float  # same run: the deployed config's value now; two runs: its speedup then
    new: float  # same run: the new pick's value; two runs: its speedup now
    ratio: float
    lo: float | None  # 95% interval of the ratio (same run: bootstrap over windows; two runs: from both speedups')
    hi: float | None
    decision: str  # OK, REGRESSED or UNDECIDED (``decide``)

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
    basis: str  # SAME_RUN or TWO_RUNS
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


def _same_run(name: str, dirn: str, pick: dict[str, Any], dep: dict[str, Any], tol: float,
              same_trial: bool = False) -> ObjectiveChange | None:
    n, d = pick.get(name), dep.get(name)
    if not _finite(n, d) or n <= 0 or d <= 0:
        return None
    r = _oriented(n, d, dirn)
    if same_trial:  # the new pick is the deployed config's own re-measurement: one record, no uncertainty
        return ObjectiveChange(name, dirn, d, n, r, 1.0, 1.0, decide(r, 1.0, 1.0, tol))
    nw, dw = pick.get(windows_key(name)) or [], dep.get(windows_key(name)) or []
    lo, hi = ratio_interval(nw, dw) if dirn == "maximize" else ratio_interval(dw, nw)
    lo, hi = _nan_none(lo), _nan_none(hi)
    return ObjectiveChange(name, dirn, d, n, r, lo, hi, decide(r, lo, hi, tol))


def _speedup_of(entry: dict[str, Any], base: dict[str, Any] | None, name: str, dirn: str) -> float:
    m, b = entry["measurement"].get(name), (base or {}).get("measurement", {}).get(name)
    return _oriented(m, b, dirn) if _finite(m, b) and m > 0 and b > 0 else float("nan")


def quotient_interval(new: tuple[float | None, float | None], old: tuple[float | None, float | None]
                      ) -> tuple[float | None, float | None]:
    """The widest new/old the two intervals allow (None where either side has none)."""
    (n_lo, n_hi), (o_lo, o_hi) = new, old
    if not _finite(n_lo, n_hi, o_lo, o_hi) or o_lo <= 0 or o_hi <= 0:
        return None, None
    return n_lo / o_hi, n_hi / o_lo


def _two_runs(name: str, dirn: str, new: dict[str, Any], old: dict[str, Any], tol: float) -> ObjectiveChange | None:
    n = _speedup_of(new["best"], new.get("baseline"), name, dirn)
    o = _speedup_of(old["best"], old.get("baseline"), name, dirn)
    if not _finite(n, o):
        return None
    lo = hi = None
    if name == "output_tok_s":  # the one objective whose speedup carries an interval in best.json
        sn, so = new["best"].get("speedup") or {}, old["best"].get("speedup") or {}
        lo, hi = quotient_interval((sn.get("output_tok_s_lo"), sn.get("output_tok_s_hi")),
                                   (so.get("output_tok_s_lo"), so.get("output_tok_s_hi")))
    r = n / o
    return ObjectiveChange(name, dirn, o, n, r, lo, hi, decide(r, lo, hi, tol))


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
    return (f"{c.name}: cannot tell: the new pick over {what} is {c.ratio:.3f}{_interval(c.lo, c.hi)}, an interval "
            f"across the line {1 - tolerance:.2f} (the {tolerance:.0%} tolerance); measure more rounds to decide")


def _reason(c: ObjectiveChange, basis: str, tolerance: float) -> str:
    if basis == SAME_RUN:
        return (f"{c.name}: the new pick is {1 - c.ratio:.1%} worse than the deployed config measured in the same "
                f"run ({c.deployed:.4g} -> {c.new:.4g}, ratio {c.ratio:.3f}{_interval(c.lo, c.hi)}), "
                f"beyond the {tolerance:.0%} tolerance" + ("" if c.lo is not None else " (no interval: the point "
                                                          "decided)"))
    return (f"{c.name}: the new pick's speedup over its baseline is {1 - c.ratio:.1%} below the deployed config's "
            f"in the old run ({c.deployed:.2f}x -> {c.new:.2f}x, ratio {c.ratio:.3f}{_interval(c.lo, c.hi)}), beyond "
            f"the {tolerance:.0%} tolerance" + ("" if c.lo is not None else " (no interval: the point decided)"))


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
    basis = SAME_RUN if dep is not None else TWO_RUNS
    if basis == TWO_RUNS:
        notes.append("the deployed config was not re-measured in this run (no --warm-start, or outside the space): "
                     "the comparison spans two runs, on each pick's speedup over its own run's baseline")
    changes: list[ObjectiveChange] = []
    undecided: list[str] = []
    drift = None
    served = compare_served(new, old)  # None: neither run was confirmed served
    if nb is not None:
        for name in new.get("objectives") or old.get("objectives") or []:
            dirn = direction(name)
            if dirn is None:
                continue
            if basis == TWO_RUNS and name == "output_tok_s" and served is not None and served.ratio is not None:
                # Both picks were served (autotune confirm): their served speedups, not the in-process claims.
                c = ObjectiveChange(name, dirn, served.old, served.new, served.ratio, served.ratio_lo,
                                    served.ratio_hi, decide(served.ratio, served.ratio_lo, served.ratio_hi, tolerance))
            else:
                c = (_same_run(name, dirn, nb["measurement"], dep["measurement"], tolerance,
                               same_trial=nb.get("trial") is not None and nb.get("trial") == dep.get("trial"))
                     if dep is not None else _two_runs(name, dirn, new, old, tolerance))
            if c is None:
                notes.append(f"{name}: not measured on both sides, not compared")
                continue
            changes.append(c)
            if c.regressed:
                reasons.append(_reason(c, basis, tolerance))
            elif c.decision == UNDECIDED:
                undecided.append(_undecided(c, basis, tolerance))
    if dep is not None:
        drift = _drift(ob, dep, tolerance)
        if drift is not None and drift.lost_gain:
            notes.append(f"the deployed config lost gain since the old run: {drift.then:.2f}x"
                         f"{_interval(drift.then_lo, drift.then_hi)} then, {drift.now:.2f}x"
                         f"{_interval(drift.now_lo, drift.now_hi)} now (speedups over each run's own baseline)")
    if served is not None:
        reasons += served.reasons
        notes += served.notes
    ctx_new, ctx_old = _context(new), _context(old)
    changed = {k: (ctx_old[k], ctx_new[k]) for k in ctx_new if ctx_new[k] != ctx_old[k]}
    if dep is not None and (reasons or undecided) and nb is not None:
        notes += _holds_all(new, dep, tolerance)
    if nb is not None and not changes and not reasons:  # a gate that compared nothing must not pass
        raise BadInput(f"check: compared nothing: the new results' objectives: {_names(new)}; the deployed "
                       f"results' objectives: {_names(old)}; no objective with a known direction was measured on "
                       "both sides (rerun the new study with the deployed run's --objectives, or --warm-start)")
    status = REGRESSION if reasons else UNDECIDED if undecided else OK
    return CheckResult(status=status, reasons=reasons, objectives=changes,
                       new_label=nb["label"] if nb else None, old_label=ob["label"], tolerance=tolerance,
                       basis=basis, drift=drift, notes=notes, changed_context=changed, undecided=undecided)


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
    how = ("the new pick against the deployed config, both measured in the new run" if r.basis == SAME_RUN else
           "each pick's speedup over its own run's baseline; **the comparison spans two runs**")
    lines = [head, "", f"Deployed: `{r.old_label}`; new pick: `{r.new_label}`; tolerance {r.tolerance:.0%}.",
             f"Compared: {how}.", ""]
    if r.objectives:
        cols = ("deployed now", "new pick") if r.basis == SAME_RUN else ("deployed speedup then", "new speedup now")
        unit = ("95% interval over the windows of one instance each" if r.basis == SAME_RUN else
                "95% interval: the widest quotient of both runs' speedup intervals")
        lines += [f"| objective | {cols[0]} | {cols[1]} | ratio (> 1 better), {unit} |", "|---|---|---|---|"]
        for c in r.objectives:
            lines.append(f"| {c.name} ({c.direction}) | {c.deployed:.4g} | {c.new:.4g} | "
                         f"{c.ratio:.3f}{_interval(c.lo, c.hi)}"
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
