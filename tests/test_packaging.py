"""An installed copy (a wheel, as `pip install .` or pipx make one) works outside the checkout.

The wheel is built from a copy of the sources (not in-tree: a stale build/lib would leak into it)
and installed without dependencies into a fresh venv that borrows .venv's packages through a
.pth line; commands run from a temporary folder, so the checkout is not on sys.path.
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

CHECK = """
import json, autotune
from autotune.core.space import SPACES_DIR, bundled_spaces, load_space
s = load_space("quick", platform="cpu", models={"draft_model"})
print(json.dumps({"package": autotune.__file__, "spaces_dir": str(SPACES_DIR),
                  "bundled": sorted(bundled_spaces()), "quick": s.name}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "autotune", src / "autotune", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    run = dict(capture_output=True, text=True, timeout=300)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                        "--disable-pip-version-check", "-w", str(tmp / "dist"), str(src)], **run)
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp / "dist").glob("autotune-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, **run)
    py = venv / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index",
                        "--quiet", "--disable-pip-version-check", str(wheel)], **run)
    assert r.returncode == 0, r.stderr
    # Dependencies from .venv: a plain path line, so .venv's editable-install hook is not run.
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, **run).stdout.strip()
    (venv / purelib.removeprefix(str(venv) + "/") / "_autotune_test_deps.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    return venv, tmp / "elsewhere"


def test_installed_wheel_carries_the_bundled_spaces(installed):
    venv, cwd = installed
    cwd.mkdir(exist_ok=True)
    r = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK], cwd=cwd, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["package"].startswith(str(venv)), got  # the installed copy, not the checkout
    assert got["spaces_dir"].startswith(str(venv)), got
    assert got["bundled"] == ["cpu", "gpu", "quick"] and got["quick"] == "quick"


def test_installed_console_script_runs(installed):
    venv, cwd = installed
    cwd.mkdir(exist_ok=True)
    r = subprocess.run([str(venv / "bin" / "autotune"), "search", "--help"], cwd=cwd, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Examples" in r.stdout and "--space" in r.stdout
