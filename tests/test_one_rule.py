"""One home for each rule (issue 49): the resolution formula, the ABBA order, lossy_min_gain's default.

Before round 5 the resolution was max(hi/r - 1, 1 - lo/r) in one module and sqrt(hi/lo) - 1 in two
others, the study ran the pick first in round 1 and confirm the baseline first, and 0.03 stood in five
places. A grep over the package and the benchmarks holds each to its one home."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

SOURCES = [*sorted((ROOT / "autotune").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]
# sqrt(hi / lo) - 1, hi / r - 1, 1 - lo / r and their spellings
RESOLUTION = re.compile(r"sqrt\(\s*hi\s*/\s*lo\s*\)|hi\s*/\s*r\w*\s*-\s*1|1\s*-\s*lo\s*/\s*r\w*")


def _offenders(pattern: re.Pattern[str], home: str) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{n}" for p in SOURCES if p.relative_to(ROOT).as_posix() != home
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line.split("#")[0]) and not line.strip().startswith(('"', "'"))]


def test_the_resolution_formula_has_one_home():
    assert _offenders(RESOLUTION, "autotune/measure/intervals.py") == []
    # the test catches a copy (planted in a string, as it would be written)
    assert RESOLUTION.search("half = math.sqrt(hi / lo) - 1") and RESOLUTION.search("max(hi / r - 1, 1 - lo / r)")


def test_the_round_order_is_abba_from_one_function():
    """The study's selection and holdout rounds and confirm's served rounds take their order from
    autotune.measure.intervals.abba, and no module defines another order."""
    for mod in ("study/select.py", "study/holdout.py", "gate/confirm.py"):
        tree = ast.parse((ROOT / "autotune" / mod).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "autotune.measure.intervals"
                    for a in n.names}
        assert "abba" in imported, mod
    defined = [f"{p.relative_to(ROOT)}:{n.name}" for p in SOURCES for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, ast.FunctionDef) and ("round_order" in n.name or "abba" in n.name)
               and p.relative_to(ROOT).as_posix() != "autotune/measure/intervals.py"]
    assert defined == [], defined


def test_lossy_min_gain_has_one_default():
    literal = re.compile(r"lossy_min_gain\W[^#]*=\s*0\.\d|LOSSY_MIN_GAIN\s*=\s*0\.\d|min_gain', 0\.\d")
    homes = [f"{p.relative_to(ROOT)}:{n}" for p in SOURCES for n, line in enumerate(p.read_text().splitlines(), 1)
             if literal.search(line)]
    assert homes == ["autotune/measure/config.py:" + str(next(
        n for n, line in enumerate((ROOT / "autotune/measure/config.py").read_text().splitlines(), 1)
        if line.startswith("LOSSY_MIN_GAIN = ")))], homes
