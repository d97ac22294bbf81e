"""Shared fixtures. Expensive real-engine runs happen once per session and are shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.fixture
def fake_engine_env(monkeypatch):
    """Let worker processes import the FAKE engine module from tests/."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))

import sys  # noqa: E402

sys.path.insert(0, str(TESTS))  # test helpers (markov.py, fake_engine.py) import by name
