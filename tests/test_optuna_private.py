"""Optuna's private API is used in one module only, autotune/study/optuna_private.py (issue 45): a
private import from optuna, or a private attribute that autotune itself never defines (``study._storage``,
``trial._trial_id``) in the study floor, fails here anywhere else. Optuna may move its private names in any release;
one module is one place to mend."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "autotune"
STUDY = PACKAGE / "study"  # the only floor that imports Optuna (import-linter, tests/test_house.py)
ALLOWED = STUDY / "optuna_private.py"


def _own_private_names(trees: dict[Path, ast.AST]) -> set[str]:
    """Every ``_name`` autotune defines: functions, classes, assignments, attributes it sets, arguments."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
    return {n for n in names if n.startswith("_")}


def foreign_private_uses(trees: dict[Path, ast.AST]) -> list[str]:
    own = _own_private_names(trees)
    bad = []
    for path, tree in trees.items():
        if path == ALLOWED:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optuna"):
                parts = (node.module or "").split(".")
                if any(p.startswith("_") for p in parts) or any(a.name.startswith("_") for a in node.names):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                bad += [f"{path.relative_to(ROOT)}:{node.lineno}: import {a.name}" for a in node.names
                        if a.name.startswith("optuna") and any(p.startswith("_") for p in a.name.split("."))]
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                  and node.attr not in own and STUDY in path.parents):  # Optuna objects live in study/ only
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    return bad


def _trees() -> dict[Path, ast.AST]:
    return {p: ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def test_private_optuna_names_only_in_optuna_private() -> None:
    assert foreign_private_uses(_trees()) == []


def test_a_planted_private_use_is_caught() -> None:
    trees = _trees()
    planted = PACKAGE / "study" / "pareto.py"
    for line in ("storage = study._storage", "from optuna.study._multi_objective import x",
                 "from optuna.storages import _heartbeat"):
        trees[planted] = ast.parse(planted.read_text() + "\n" + line + "\n")
        assert foreign_private_uses(trees), line
    trees[ALLOWED] = ast.parse(ALLOWED.read_text() + "\nstorage = study._storage\n")  # its home
    trees[planted] = ast.parse(planted.read_text())
    assert foreign_private_uses(trees) == []
