"""Shared fixtures. Expensive real-engine runs happen once per session and are shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Unit and fake-engine tests first, real-engine tests after (each group in file order): a
    quick failure shows early, and what a real-engine test leaves in this process (vLLM's imports,
    signal handlers) cannot reach the orchestration tests. The two-worker Ctrl-C test failed twice
    after the engine tests in the full suite and never alone."""
    items.sort(key=lambda item: item.get_closest_marker("engine") is not None)


@pytest.fixture
def fake_engine_env(monkeypatch):
    """Let worker processes import the FAKE engine module from tests/."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))


@pytest.fixture(scope="session")
def _vllm_refused(tmp_path_factory) -> Path:
    """A folder whose ``vllm`` package refuses to import, for unmarked tests' subprocesses."""
    d = tmp_path_factory.mktemp("vllm_refused")
    (d / "vllm").mkdir()
    (d / "vllm" / "__init__.py").write_text(
        'raise ImportError("vLLM started by a test not marked `engine`: mark it (pytestmark = '
        'pytest.mark.engine) so that `pytest -m \\"not engine\\"` stays fast and engine-free")\n')
    return d


@pytest.fixture(autouse=True)
def _engine_tests_are_marked(request, monkeypatch):
    """Every test that starts the real vLLM engine carries the `engine` marker: in any other test,
    a worker (or server) process that imports vllm fails, naming the missing marker. The engine
    only ever runs in such processes (a worker per trial, `autotune serve`). Processes started by a
    module- or session-scoped fixture are set up before this runs, and not covered."""
    if request.node.get_closest_marker("engine") is None:
        refused = request.getfixturevalue("_vllm_refused")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(refused), os.environ.get("PYTHONPATH")])))

import sys  # noqa: E402

sys.path.insert(0, str(TESTS))  # test helpers (markov.py, fake_engine.py) import by name
