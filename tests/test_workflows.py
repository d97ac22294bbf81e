"""The CI workflows pass zizmor's static security audit (template injection, unpinned actions,
persisted credentials, ...), offline: no GitHub API calls."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


def _zizmor() -> str | None:
    here = Path(sys.executable).parent / "zizmor"  # the venv's, without relying on PATH
    return str(here) if here.is_file() else shutil.which("zizmor")


def test_workflows_pass_zizmor_offline():
    exe = _zizmor()
    if exe is None:
        pytest.skip("zizmor is not installed (it is in the `test` extra: pip install -e '.[test]')")
    r = subprocess.run([exe, "--offline", "--no-progress", "--color", "never", "--format", "plain",
                        ".github/workflows"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NO_COLOR": "1"})
    # Exit 0 only with no findings (zizmor exits 10+ with the highest severity found).
    assert r.returncode == 0, r.stdout + r.stderr
    assert "No findings to report" in r.stdout, r.stdout
