"""Shared fixtures. Expensive real-engine runs happen once per session and are shared."""

from __future__ import annotations

import io
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
    for item in items:  # a CPU fact says which: scripts/test.sh deselects these on a GPU machine
        mark = item.get_closest_marker("cpu_only")
        if mark is not None and not mark.kwargs.get("reason"):
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.cpu_only needs reason=\"...\" (the CPU fact it states)")


@pytest.fixture
def fake_engine_env(monkeypatch):
    """Let worker processes import the FAKE engine module from tests/."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))


# The flags /proc/cpuinfo shows on each kind of CPU machine the suite must pass on (issue 30).
CPU_FLAGS = {"avx512": "fpu sse4_2 avx avx2 fma avx512f avx512dq avx512bw avx512vl",
             "no-avx512": "fpu sse4_2 avx avx2 fma"}


@pytest.fixture(params=list(CPU_FLAGS))
def faked_cpu(request, monkeypatch) -> str:
    """Run a test as on both kinds of CPU machine, whatever this one is: autotune.run.hardware sees the
    CPU platform (not CUDA) and reads a /proc/cpuinfo whose flags have AVX-512 (``avx512``) or not
    (``no-avx512``), so fp8 KV is in the spaces exactly with ``avx512``. Returns the kind. This
    process only: a worker subprocess would read the real file (the fake engine never does)."""
    from autotune.run import hardware

    text = "".join(f"processor\t: {i}\nflags\t\t: {CPU_FLAGS[request.param]}\n\n" for i in range(2))

    def fake_open(path, *args, **kwargs):
        return io.StringIO(text) if str(path) == "/proc/cpuinfo" else open(path, *args, **kwargs)

    monkeypatch.setattr(hardware, "detect", lambda: "cpu")
    monkeypatch.setattr(hardware, "open", fake_open, raising=False)  # cpu_features' read of /proc/cpuinfo
    return request.param


@pytest.fixture(scope="session")
def _vllm_refused(tmp_path_factory) -> Path:
    """A folder whose ``vllm`` package refuses to import, for unmarked tests' subprocesses."""
    d = tmp_path_factory.mktemp("vllm_refused")
    (d / "vllm").mkdir()
    (d / "vllm" / "__init__.py").write_text(
        'raise ImportError("vLLM started by a test not marked `engine`: mark it (pytestmark = '
        'pytest.mark.engine) so that `pytest -m \\"not engine\\"` stays fast and engine-free")\n')
    return d


@pytest.fixture(scope="session")
def engine_launcher():
    """One launcher (autotune.run.launcher) for the real-engine tests, as a study has one: vLLM
    imported once for the session, every trial worker, its `vllm serve` and the engine processes
    they start forked from it (a study inside reuses it). A worker whose environment a fork cannot
    reproduce (the mended sampler's PYTHONPATH) starts fresh. Started by the first engine test (they
    run after every other test: pytest_collection_modifyitems), so no unmarked test runs under it;
    session fixtures that start engines ask for it first. tests/ is on every engine test's
    PYTHONPATH, and so on the launcher's, so that engine modules of the tests' own
    (faulty_engine.py, eagle3_engine.py) are forked too."""
    from autotune.run import launcher

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
        with launcher.active() as sock:
            yield sock


def config_code_pythonpath() -> str:
    """PYTHONPATH without the unmarked-test guard's folder: for vLLM's config code, which inspects a
    model's architecture in a subprocess of its own (``python -m vllm.model_executor.models.registry``)
    when its model-info cache (``$VLLM_CACHE_ROOT/modelinfos``) lacks it. That is config validation,
    not an engine; on a fresh machine the cache is empty, so a test that builds configs must allow it
    (scripts/test.sh runs the unmarked tests with an empty cache to prove none depends on a warm one)."""
    return os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                           if p and "vllm_refused" not in p)


@pytest.fixture
def vllm_may_inspect_models(monkeypatch) -> None:
    """Lift the unmarked-test guard for vLLM's model-inspection subprocess (``config_code_pythonpath``)."""
    monkeypatch.setenv("PYTHONPATH", config_code_pythonpath())


@pytest.fixture(autouse=True)
def _engine_tests_are_marked(request, monkeypatch):
    """Every test that starts the real vLLM engine carries the `engine` marker: in any other test,
    a worker (or server) process that imports vllm fails, naming the missing marker. The engine
    only ever runs in such processes (a worker per trial, `autotune serve`). Processes started by a
    module- or session-scoped fixture are set up before this runs, and not covered. Engine tests
    run under the session's launcher (``engine_launcher``)."""
    if request.node.get_closest_marker("engine") is None:
        refused = request.getfixturevalue("_vllm_refused")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(refused), os.environ.get("PYTHONPATH")])))
    else:
        request.getfixturevalue("engine_launcher")

import sys  # noqa: E402

sys.path.insert(0, str(TESTS))  # test helpers (markov.py, fake_engine.py) import by name


def exported_words(stdout: str) -> list[str]:
    """The words of the one command `autotune export --format command` prints (its comments, which say
    where each flag comes from, dropped): ``vllm serve ...``, or on the CPU build ``PYTHON -m
    autotune.vllm_cli serve ...``."""
    import shlex

    (line,) = [ln for ln in stdout.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return shlex.split(line)


def exported_serve_args(stdout: str) -> list[str]:
    """The arguments of that command after ``serve``, as vLLM's serve parser reads them."""
    words = exported_words(stdout)
    return words[words.index("serve") + 1:]


def import_benchmark(name: str):
    """benchmarks/<name>.py as a module; benchmarks/ is on the path only while it loads (a benchmark's
    own ``import harness`` needs it there)."""
    import importlib

    bench = str(ROOT / "benchmarks")
    sys.path.insert(0, bench)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(bench)


# The shared study's tried configs, in trial order after the baseline.
TRIES = ['{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2, '
         '"kv_cache_dtype": "auto", "quantization": "none", "enforce_eager": true}',
         '{"method": "draft_model", "num_speculative_tokens": 3, "kv_cache_dtype": "auto", "quantization": "none", '
         '"enforce_eager": true}',
         '{"method": "none", "kv_cache_dtype": "auto", "quantization": "fp8", "enforce_eager": true}']


SHARED_EDITS = 16  # of examples/json_edit.jsonl's 32


@pytest.fixture(scope="session")
def shared_edits(tmp_path_factory) -> Path:
    """The shared study's workload, and the nightly flow's (a warm start compares workloads): the
    first 16 edits of examples/json_edit.jsonl, where ngram and the draft clearly win (2-3x; on
    smoke.jsonl's six requests ngram gained ~1.1x, inside the spread between engine instances).
    Half the demo's edits halve every window the shared study and the nightly studies measure."""
    path = tmp_path_factory.mktemp("workload") / "json_edit_16.jsonl"
    lines = (ROOT / "examples/json_edit.jsonl").read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:SHARED_EDITS]))
    return path


@pytest.fixture(scope="session")
def study_dir(tmp_path_factory, engine_launcher, shared_edits):
    """The shared short real-engine study (tests/test_engine_study.py, the real confirm test):
    baseline, ngram, draft_model and an fp8-weights candidate that crashes engine init on CPU."""
    from typer.testing import CliRunner

    from autotune.cli.app import app

    results = tmp_path_factory.mktemp("results")
    args = ["search", str(shared_edits), "--space", "tests/data/engine_space.yaml", "--trials", "4",
            "--results", str(results), "--study", "e2e", "--trial-timeout", "300",
            "--objectives", "output_tok_s,e2e_ms_p50,output_tok_s@4", "--max-repeats", "3",
            # The schedule's path has its own real-engine study (test_engine_predict.py): here it
            # would add depth and schedule trials to every test's setup.
            "--no-schedule"]
    for t in TRIES:
        args += ["--try", t]
    r = CliRunner().invoke(app, args)
    print(r.output)
    assert r.exit_code == 0, r.output
    assert "quote:" in r.output and "pick:" in r.output  # the summary (the front: --explain)
    return results / "e2e"
