"""Compare a new study's pick with the deployed one (nightly CI): regression or not, and why.

Reads two saved StudyReports (best.json); needs neither Optuna nor vLLM.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.errors import BadInput
from autotune.metrics import DIRECTIONS


@dataclass(frozen=True)
class ObjectiveChange:
    name: str
    direction: str
    old: float
    new: float
    change: float  # relative, signed so that negative is worse
    regressed: bool


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    reasons: list[str]
    objectives: list[ObjectiveChange]
    new_label: str | None
    old_label: str | None
    tolerance: float
    changed_context: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_tolerance(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05."""
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        raise BadInput(f"--tolerance: expected a share like 5% or 0.05, got {text!r}") from None
    if not 0 <= value < 1:
        raise BadInput(f"--tolerance: expected a share in [0%, 100%), got {text!r}")
    return value


def _context(report: dict[str, Any]) -> dict[str, Any]:
    best = report.get("best") or {}
    return {"vllm_version": report.get("vllm_version"), "platform": (report.get("platform") or {}).get("platform"),
            "model": (best.get("engine_kwargs") or {}).get("model"), "workload": report.get("workload"),
            "load": report.get("load")}


def compare(new: dict[str, Any], old: dict[str, Any], *, tolerance: float) -> CheckResult:
    """Is ``new``'s best at least as good as ``old``'s, within ``tolerance``, and correct?"""
    reasons: list[str] = []
    nb, ob = new.get("best"), old.get("best")
    if ob is None:
        raise BadInput("--against: the old results have no chosen configuration to compare with")
    changes: list[ObjectiveChange] = []
    if nb is None:
        reasons.append("the new study found no feasible (correct) configuration")
    elif not nb["verdict"]["passed"]:
        reasons.append(f"the new pick failed its correctness checks: {nb['verdict']['reason']}")
    if nb is not None:
        for name in old.get("objectives") or []:
            direction = DIRECTIONS.get(name)
            o, n = ob["measurement"].get(name), nb["measurement"].get(name)
            if direction is None or o is None or n is None or not (math.isfinite(o) and math.isfinite(n)) or o == 0:
                continue
            change = (n - o) / abs(o) * (1 if direction == "maximize" else -1)
            regressed = change < -tolerance
            changes.append(ObjectiveChange(name, direction, o, n, change, regressed))
            if regressed:
                reasons.append(f"{name} is {abs(change):.1%} worse ({o:.4g} -> {n:.4g}), beyond the {tolerance:.0%} tolerance")
    ctx_new, ctx_old = _context(new), _context(old)
    changed = {k: (ctx_old[k], ctx_new[k]) for k in ctx_new if ctx_new[k] != ctx_old[k]}
    return CheckResult(ok=not reasons, reasons=reasons, objectives=changes,
                       new_label=nb["label"] if nb else None, old_label=ob["label"], tolerance=tolerance,
                       changed_context=changed)


def markdown(r: CheckResult) -> str:
    """A short Markdown summary (for $GITHUB_STEP_SUMMARY)."""
    head = "## autotune check: " + ("no regression" if r.ok else "REGRESSION")
    lines = [head, "", f"Deployed: `{r.old_label}`; new pick: `{r.new_label}`; tolerance {r.tolerance:.0%}.", ""]
    if r.objectives:
        lines += ["| objective | deployed | new | change |", "|---|---|---|---|"]
        for c in r.objectives:
            lines.append(f"| {c.name} ({c.direction}) | {c.old:.4g} | {c.new:.4g} | "
                         f"{c.change:+.1%}{' **worse**' if c.regressed else ''} |")
        lines.append("")
    lines += [f"- {x}" for x in r.reasons]
    for k, (o, n) in r.changed_context.items():
        lines.append(f"- note: {k} changed: `{o}` -> `{n}`")
    return "\n".join(lines) + "\n"
