"""The house's rules (CONTRIBUTING.md "Floors"): import-linter's contracts from pyproject.toml hold,
no module imports itself back through others, and no module grows past 400 lines.

Each rule is also shown to bite: a forbidden import planted in a copy of the package breaks the
contracts, and a planted cycle is found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp

from conftest import ROOT

MAX_LINES = 400
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
        "--config", str(ROOT / "pyproject.toml"), "--no-cache"]


def _lint(pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:  # the copy is imported before the installed (editable) package
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(LINT, cwd=pythonpath or ROOT, env=env, capture_output=True, text=True, timeout=120)


def _lint_with(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """The contracts over a copy of the package with ``line`` planted at the end of ``module``."""
    shutil.copytree(ROOT / "autotune", tmp_path / "autotune", ignore=shutil.ignore_patterns("__pycache__", "models"))
    planted = tmp_path / "autotune" / module
    planted.write_text(planted.read_text() + f"\n{line}  # planted by tests/test_house.py\n")
    return _lint(tmp_path)


def _cycles(package: str) -> list[list[str]]:
    """The import cycles among the package's modules (strongly connected components of two or more)."""
    graph = grimp.build_graph(package)
    edges = {m: graph.find_modules_directly_imported_by(m) & graph.modules for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in sorted(edges):
        if m not in index:
            visit(m)
    return found


def test_contracts_hold() -> None:
    out = _lint()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout, out.stdout


def test_a_forbidden_import_breaks_the_contracts(tmp_path: Path) -> None:
    """Optuna imported by the core floor: two contracts break, and the report names the line."""
    out = _lint_with(tmp_path, "core/errors.py", "import optuna")
    assert out.returncode != 0, out.stdout
    assert "Optuna only in the study floor BROKEN" in out.stdout, out.stdout
    assert "autotune.core.errors -> optuna" in out.stdout, out.stdout


def test_an_upward_import_breaks_the_floors(tmp_path: Path) -> None:
    out = _lint_with(tmp_path, "measure/metrics.py", "from autotune.study import pareto")
    assert "floors: each imports only those below it BROKEN" in out.stdout, out.stdout
    assert "autotune.measure.metrics -> autotune.study.pareto" in out.stdout, out.stdout


def test_no_import_cycles() -> None:
    assert _cycles("autotune") == []


def test_a_planted_cycle_is_found(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "house_cycle"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from house_cycle import b\n")  # a lazy import is an import too
    (pkg / "b.py").write_text("from house_cycle import a\n")
    (pkg / "c.py").write_text("from house_cycle import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _cycles("house_cycle") == [["house_cycle.a", "house_cycle.b"]]


def test_no_module_over_400_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "autotune").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these by concept: {long}"


def _defined(module: str) -> set[str] | None:
    """Top-level names a module of autotune defines or imports (None: no such module)."""
    import ast

    path = ROOT / Path(*module.split("."))
    file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if not file.is_file():
        return None
    names = {p.stem for p in path.iterdir()} if path.is_dir() else set()  # submodules
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names |= {t.id for t in ast.walk(node) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def test_scripts_and_benchmarks_import_what_the_house_holds() -> None:
    """Files outside the package (benchmarks/, scripts/) name autotune's modules by path: a move
    of a module must move them too (three benchmarks still imported autotune.hardware after it
    became autotune.run.hardware)."""
    import ast

    stale = []
    for file in sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py")]):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "autotune":
                names = _defined(node.module)
                missing = [a.name for a in node.names] if names is None else \
                    [a.name for a in node.names if a.name not in names]
                stale += [f"{file.relative_to(ROOT)}: {node.module}.{n}" for n in missing]
            elif isinstance(node, ast.Import):
                stale += [f"{file.relative_to(ROOT)}: {a.name}" for a in node.names
                          if a.name.split(".")[0] == "autotune" and _defined(a.name) is None]
    assert not stale, stale
