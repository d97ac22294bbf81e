"""Every threshold in one table (docs/glossary.md, "Thresholds"), checked against the code's constants
(issue 53): each row's value is the constant's in the file it names, and each module that holds
thresholds has no numeric constant the table leaves out."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "docs" / "glossary.md"
ROW = re.compile(r"^\| `([\w.]+)` \| ([^|]+) \| [^|]+ \| `(autotune/[\w/]+\.py)` \|$")
# Modules whose numeric constants are all thresholds: each must be in the table.
THRESHOLD_MODULES = ("autotune/measure/config.py", "autotune/measure/resolution.py", "autotune/measure/intervals.py",
                     "autotune/measure/sequential.py", "autotune/measure/metrics.py", "autotune/study/select.py",
                     "autotune/study/holdout.py", "autotune/gate/confirm.py", "autotune/serve/served.py",
                     "autotune/forecast/forecast.py", "autotune/forecast/policy.py", "autotune/results/charts.py",
                     "autotune/measure/coalescing.py")


def rows(text: str) -> list[tuple[str, str, str]]:
    """(name, printed value, file) for each row of the Thresholds table."""
    table = text[text.index("## Thresholds"):]
    return [m.groups() for m in map(ROW.match, table.splitlines()) if m]


def number(printed: str) -> float:
    """A printed value as the code holds it: "3%" is 0.03, "180 s" is 180."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(%|s)?", printed.strip())
    assert m, f"not a value: {printed!r}"
    return float(m.group(1)) / (100 if m.group(2) == "%" else 1)


def constant(path: str, name: str) -> float:
    obj = importlib.import_module(path[:-3].replace("/", "."))
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def literal_constants(path: str) -> set[str]:
    """Module-level UPPER_CASE names assigned a number literal (not a bool, not derived from another name)."""
    out = set()
    for node in ast.parse((ROOT / path).read_text()).body:
        target, value = (node.targets[0], node.value) if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            (node.target, node.value) if isinstance(node, ast.AnnAssign) else (None, None)
        if isinstance(target, ast.Name) and target.id.isupper() and isinstance(value, ast.Constant) \
                and isinstance(value.value, (int, float)) and not isinstance(value.value, bool):
            out.add(target.id)
    return out


def mismatches(text: str) -> list[str]:
    bad = []
    for name, printed, path in rows(text):
        try:
            got = constant(path, name)
        except (ImportError, AttributeError) as e:
            bad.append(f"{name} ({path}): {type(e).__name__}: {e}")
            continue
        if abs(float(got) - number(printed)) > 1e-9:
            bad.append(f"{name} ({path}): the table says {printed.strip()}, the code {got}")
    return bad


def test_every_row_is_the_codes_constant():
    assert len(rows(GLOSSARY.read_text())) >= 20
    assert mismatches(GLOSSARY.read_text()) == []


def test_a_changed_threshold_fails():
    text = GLOSSARY.read_text()
    assert mismatches(text.replace("| `SELECTION_BAND` | 10% |", "| `SELECTION_BAND` | 15% |"))
    assert mismatches(text.replace("`MAX_S` | 180 s |", "`MAX_S` | 120 s |"))


@pytest.mark.parametrize("path", THRESHOLD_MODULES)
def test_no_threshold_is_left_out_of_the_table(path):
    listed = {name for name, _, p in rows(GLOSSARY.read_text()) if p == path}
    assert literal_constants(path) <= listed, sorted(literal_constants(path) - listed)


def test_one_noise_floor():
    """Two names that meant the same number are one constant: the tie band and the forecast's least noise."""
    from autotune.forecast import forecast
    from autotune.measure import resolution

    assert resolution.TIE_BAND is resolution.NOISE_FLOOR and forecast.FLOOR is resolution.NOISE_FLOOR
    assert not hasattr(importlib.import_module("autotune.forecast.policy"), "NOISE_MIN")
