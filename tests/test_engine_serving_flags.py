"""Tensor parallel 2 on the real vLLM engine (CPU build, issue 41): the user's flags after -- in
every trial's `vllm serve`, read back from the server's own "non-default args" line, in serve.sh as
vLLM's parser reads it, and served by confirm. The demo target (4 heads, 4 KV heads) divides by 2;
autotune binds each rank to a core list of its own (vLLM's autobind wants a NUMA node per rank)."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from typer.testing import CliRunner

from autotune.cli.app import app

pytestmark = pytest.mark.engine

SPACE = """name: tp
baseline: {method: none, enforce_eager: true}
params:
  method: {choices: [none, ngram]}
  num_speculative_tokens: {int: [3, 3], when: {method: [ngram]}}
  prompt_lookup_max: {int: [4, 4], when: {method: [ngram]}}
  prompt_lookup_min: {int: [2, 2], when: {method: [ngram]}}
  enforce_eager: {choices: [true]}
"""
NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")


def _tensor_parallel(log: str) -> list[int | None]:
    """tensor_parallel_size in each "non-default args" line vLLM logged (None where it was default)."""
    found = []
    for m in NON_DEFAULT.finditer(log):
        tp = re.search(r"'tensor_parallel_size': (\d+)", m.group(1))
        found.append(int(tp.group(1)) if tp else None)
    return found


def _gpus() -> int:
    from autotune.run import hardware, platform_check

    return len(platform_check.nvidia_gpus()) if hardware.detect() == "cuda" else 0


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    """A 2-trial study at tensor parallel 2 and one confirm round: (search output, results folder, confirm output)."""
    from autotune.run import hardware

    if hardware.detect() == "cuda" and _gpus() < 2:
        pytest.skip("tensor parallel 2 needs two GPUs")
    tmp_path = tmp_path_factory.mktemp("tp2")
    space = tmp_path / "tp.yaml"
    space.write_text(SPACE)
    workload = tmp_path / "three.jsonl"  # three edits, 16 tokens each: the flags are under test, not speed
    workload.write_text("".join(json.dumps({**json.loads(line), "max_tokens": 16}) + "\n"
                                for line in open("examples/smoke.jsonl").read().splitlines()[:3]))
    runner = CliRunner()
    r = runner.invoke(app, ["search", str(workload), "--space", str(space), "--strategy", "grid",
                            "--trials", "2", "--results", str(tmp_path), "--study", "tp", "--repeats", "1",
                            "--max-repeats", "0", "--samples", "0", "--warmup", "1", "--no-remeasure",
                            "--no-schedule", "--no-prune", "--no-past-edge", "--trial-timeout", "300",
                            "--", "--tensor-parallel-size", "2"])
    print(r.output)
    assert r.exit_code == 0, r.output
    out = tmp_path / "tp"
    c = runner.invoke(app, ["confirm", str(out), "--rounds", "1"])
    print(c.output)
    assert c.exit_code == 0, c.output
    return r.output, out


def test_tensor_parallel_2_in_every_trial_serve_sh_and_confirm(tp2):
    from autotune.vllm_cli import parse_serve_args

    _, out = tp2
    logs = sorted(out.glob("trials/*/server.log"))
    assert len(logs) == 2
    for log in logs:  # what each trial's server was started with, as vLLM itself logged it
        assert _tensor_parallel(log.read_text()) == [2], log
    best = json.loads((out / "best.json").read_text())
    assert best["best"]["engine_kwargs"]["tensor_parallel_size"] == 2
    words = shlex.split((out / "serve.sh").read_text().splitlines()[-1])
    assert parse_serve_args(words[4:-1]).tensor_parallel_size == 2  # serve.sh as vLLM's parser reads it
    served = sorted((out / "confirm").glob("round-1-*.log"))
    served = [p for p in served if not p.name.endswith(".bench.log")]
    assert len(served) == 2  # the baseline and the pick, each a server of its own
    for log in served:
        assert _tensor_parallel(log.read_text()) == [2], log
    assert json.loads((out / "best.json").read_text())["best"]["served"]["rounds"] == 1


@pytest.mark.cpu_only(reason="on CPU each rank is bound to cores of its own (VLLM_CPU_OMP_THREADS_BIND), "
                             "in the study and in serve.sh; a GPU's ranks are its devices")
def test_on_cpu_each_rank_gets_its_cores_in_the_study_and_serve_sh(tp2):
    output, out = tp2
    assert "2 ranks on CPU: VLLM_CPU_OMP_THREADS_BIND=" in output
    assert 'export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-' in (out / "serve.sh").read_text()
