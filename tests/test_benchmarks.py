"""benchmarks/ as one suite (CONTRIBUTING.md "Benchmarks"): every benchmark starts from the shared
harness (benchmarks/harness.py), touches no private member of autotune, shares no six lines with
another (pylint's duplicate-code check), parses its arguments, and is listed in CONTRIBUTING.md
with its data files. Each rule is also shown to bite on a planted offender. No engine runs here.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, import_benchmark

BENCH = ROOT / "benchmarks"
HARNESS = BENCH / "harness.py"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p != HARNESS)
SHARED_LINES = 6  # the bar: no two benchmarks share six or more lines
# pylint reports a block only when it is *longer* than --min-similarity-lines (pylint/checkers/symilar.py:
# `eff_cmn_nb > min_similarity_lines`), so six shared lines need the setting at 5.
MIN_SIMILARITY_LINES = SHARED_LINES - 1
PLANTED = "\n".join(["def _planted(xs):", "    a = sorted(xs)", "    b = [x * 2 for x in a]", "    c = sum(b)",
                     "    d = max(b) - min(b)", "    e = c / len(b)", "    return a, b, c, d, e"])  # six lines of code


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str) -> list[str]:
    """Where ``source`` reaches into a private member: an ``x._name`` on anything but its own
    ``self``/``cls``, or an import of a ``_name`` (or through a ``_module``) from autotune."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "autotune":
            parts = node.module.split(".") + [a.name for a in node.names]
            found += [f"line {node.lineno}: from {node.module} import {p}" for p in parts if _private(p)][:1]
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "autotune" and any(_private(p) for p in a.name.split("."))]
    return found


def harness_use(source: str) -> list[str]:
    """What a benchmark does around the harness instead of with it: its parser not from
    ``harness.parser``, a data file (``out=``) not written by ``harness.save``, the machine's kind
    recorded by hand."""
    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]

    def named(call: ast.Call, owner: str, attr: str) -> bool:
        f = call.func
        return isinstance(f, ast.Attribute) and f.attr == attr and isinstance(f.value, ast.Name) and f.value.id == owner

    wrong = []
    if not any(isinstance(n, ast.Import) and any(a.name == "harness" for a in n.names) for n in tree.body):
        wrong.append("does not `import harness`")
    parsers = [c for c in calls if named(c, "harness", "parser")]
    if not parsers:
        wrong.append("builds no parser with harness.parser")
    if any(isinstance(c.func, (ast.Attribute, ast.Name)) and getattr(c.func, "attr", getattr(c.func, "id", None))
           == "ArgumentParser" for c in calls):
        wrong.append("builds an ArgumentParser itself")
    if any(k.arg == "out" for c in parsers for k in c.keywords) and not any(named(c, "harness", "save") for c in calls):
        wrong.append("has an --out file but never calls harness.save")
    if any(named(c, "hardware", "describe") or named(c, "hardware", "cpu_features") for c in calls):
        wrong.append("records the machine by hand (harness.save records it)")
    return wrong


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_benchmark_touches_a_private_member_of_autotune(script: Path) -> None:
    assert private_uses(script.read_text()) == []


def test_the_private_member_check_bites() -> None:
    planted = ("from autotune.gate import confirm as c\nfrom autotune.study.loop import _sampler\n"
               "import autotune.run._x\nst = c._setup(1)\nengine._session = None\n")
    assert len(private_uses(planted)) == 4
    assert private_uses("class A:\n    def f(self):\n        return self._x, cls._y, x.__dict__\n") == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_uses_the_harness(script: Path) -> None:
    assert harness_use(script.read_text()) == []


def test_the_harness_check_bites() -> None:
    assert len(harness_use("import argparse\nap = argparse.ArgumentParser()\n")) == 3
    assert harness_use("import harness\nap = harness.parser(__doc__, out='x.json')\n") == [
        "has an --out file but never calls harness.save"]
    assert harness_use("import harness\nap = harness.parser(__doc__)\nhardware.describe()\n") == [
        "records the machine by hand (harness.save records it)"]


def _similar(folder: Path, min_lines: int = MIN_SIMILARITY_LINES) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pylint", "--disable=all", "--enable=duplicate-code",
                           f"--min-similarity-lines={min_lines}", "--score=n", str(folder)],
                          capture_output=True, text=True, timeout=300)


def test_no_two_benchmarks_share_six_lines() -> None:
    out = _similar(BENCH)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_duplicate_check_bites_at_six_lines(tmp_path: Path) -> None:
    """The same six lines of code pasted into two benchmarks fail the check (and pass pylint at
    --min-similarity-lines=6, which would let them through)."""
    shutil.copytree(BENCH, tmp_path / "benchmarks", ignore=shutil.ignore_patterns("data", "__pycache__"))
    first, second = tmp_path / "benchmarks" / "kv_budget.py", tmp_path / "benchmarks" / "scoring_cost.py"
    first.write_text(first.read_text() + "\n\n" + PLANTED + "\n")  # after its last lines, before them in the
    main = 'if __name__ == "__main__":'  # other: only the six lines themselves are alike
    second.write_text(second.read_text().replace(main, PLANTED + "\n\n\n" + main))
    out = _similar(tmp_path / "benchmarks")
    assert out.returncode != 0 and "duplicate-code" in out.stdout, out.stdout + out.stderr
    assert _similar(tmp_path / "benchmarks", min_lines=SHARED_LINES).returncode == 0


def test_every_benchmark_parses_its_arguments() -> None:
    """``--help`` of each, in one child process (each script's main(), as `python benchmarks/X.py`
    runs it): a script whose parser or imports broke in a refactor fails here, with no engine."""
    code = ("import runpy, sys\nsys.path.insert(0, sys.argv[1])\nbad = []\nfor path in sys.argv[2:]:\n"
            "    sys.argv = [path, '--help']\n    try:\n        runpy.run_path(path, run_name='__main__')\n"
            "    except SystemExit as e:\n        bad += [] if e.code == 0 else [f'{path}: exit {e.code}']\n"
            "    except Exception as e:\n        bad.append(f'{path}: {type(e).__name__}: {e}')\n"
            "print('BAD', bad)\n")
    out = subprocess.run([sys.executable, "-c", code, str(BENCH), *map(str, SCRIPTS)], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert "BAD []" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def _contributing_section() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    return text.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]


def test_contributing_lists_every_benchmark_and_every_data_file() -> None:
    """Every benchmark has a row (script, question, data files) and every file under
    benchmarks/data/ is named there, by a benchmark's row or a retired script's."""
    section = _contributing_section()
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    for script in SCRIPTS:
        assert any(f"`{script.name}`" in ln.split("|")[1] for ln in rows), f"CONTRIBUTING.md: no row for {script.name}"
    named = set(re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", section, flags=re.S)))
    for f in sorted((BENCH / "data").iterdir()):
        patterns = [n for n in named if "*" in n or n == f.name or n.endswith("/" + f.name)]
        assert any(Path(f.name).match(Path(p).name) for p in patterns), f"CONTRIBUTING.md names no {f.name}"


def test_the_harness_records_the_machine_kind(tmp_path: Path) -> None:
    harness = import_benchmark("harness")
    path = harness.save(tmp_path / "sub" / "x.json", {"rows": [1], "machine": "overridden"})
    saved = json.loads(path.read_text())
    assert set(saved["machine"]) >= {"cpu", "cores", "avx512", "amx", "vllm", "platform"}
    assert saved["rows"] == [1] and saved["date"]
    assert harness.spread([1.0, 2.0, 4.0]) == 1.5 and harness.paired([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]


def test_the_harness_resets_a_servers_prefix_cache_and_logs_a_command(tmp_path: Path) -> None:
    """``reset_prefix_cache`` POSTs vLLM's dev endpoint (a stand-in server here, not vLLM);
    ``run_logged`` keeps a command's output in its log."""
    import http.server
    import threading

    harness = import_benchmark("harness")
    posted: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            posted.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        harness.reset_prefix_cache(f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert posted == ["/reset_prefix_cache"]
    proc, wall = harness.run_logged([sys.executable, "-c", "print('to the log')"], tmp_path / "x.log")
    assert proc.returncode == 0 and wall > 0 and (tmp_path / "x.log").read_text() == "to the log\n"


def _retired() -> set[str]:
    section = _contributing_section().split("Retired benchmarks", 1)
    return set(re.findall(r"^\| `([^`]+\.py)`", section[1], flags=re.M)) if len(section) == 2 else set()


def test_every_benchmark_and_data_file_the_repo_names_exists_or_is_retired() -> None:
    """A `benchmarks/X.py` named in the README, docs/, autotune/, tests/ or scripts/ exists, or
    CONTRIBUTING lists it as retired (with the commit that holds it); a `benchmarks/data/F` exists
    (a `*` in F matching at least one file)."""
    files = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("autotune/**/*.py"), *ROOT.glob("scripts/*"),
             *(p for p in ROOT.glob("tests/*.py") if p.name != Path(__file__).name)]
    retired, missing = _retired(), []
    assert {"serve_timeline.py", "demo_pair.py"} <= retired  # the table is read
    for f in files:
        if not f.is_file():
            continue
        for ref in set(re.findall(r"benchmarks/(?:data/)?[A-Za-z0-9_*.-]*[A-Za-z0-9_*]", f.read_text())):
            name = ref.split("/")[-1]
            if ref.startswith("benchmarks/data/"):
                ok = any((BENCH / "data").glob(name))
            elif ref.endswith(".py"):
                ok = any(BENCH.glob(name)) or name in retired
            else:
                continue
            if not ok:
                missing.append(f"{f.relative_to(ROOT)}: {ref}")
    assert missing == []
