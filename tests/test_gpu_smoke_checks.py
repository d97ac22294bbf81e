"""scripts/gpu_smoke.sh can fail where it matters (issue 51): its checks (scripts/gpu_smoke_checks.py)
on planted results folders, as a GPU run would leave them. A lossless trial that failed or was judged
incorrect, CUDA graphs in another trial's log but not the baseline's, a pick that is the baseline,
another model runner than vLLM picks, another tensor-parallel size: each exits 1 with one line, and
the script stops on it. No engine, no GPU."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ROOT / "scripts" / "gpu_smoke_checks.py"
GRAPHS = "(EngineCore pid=7) INFO [model_runner.py:901] Graph capturing finished in 12 secs, took 0.51 GiB\n"
V2_LOG = "(Worker pid=8) INFO [gpu_worker.py:518] Using V2 Model Runner\n"


def _row(trial, method, *, role=None, state="COMPLETE", status="ok", runner="v2", failure=None, **params):
    label = method if method == "none" else f"{method} k=3"
    return {"trial": trial, "state": state, "role": role, "label": label, "param_method": method, "status": status,
            "verdict": None if status == "ok" else "planted", "failure": failure, "model_runner": runner,
            **{f"param_{k}": v for k, v in params.items()}}


def _gpu_run(tmp_path, rows=None, logs=None, pick=1) -> Path:
    """A GPU smoke study's folder: trials.csv, each trial's server.log, best.json after confirm."""
    rows = rows or [_row(0, "none", role="baseline", kv_cache_dtype="auto", quantization="none"),
                    _row(1, "ngram"), _row(2, "eagle3"),
                    _row(3, "none", state="FAIL", status=None, failure="fp8 refused (planted)", kv_cache_dtype="fp8",
                         quantization="fp8")]
    d = tmp_path / "smoke"
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / "trials.csv", index=False)
    logs = logs if logs is not None else {0: V2_LOG + GRAPHS, 1: V2_LOG + GRAPHS, 2: V2_LOG + GRAPHS}
    for n, text in logs.items():
        (d / "trials" / f"{n:04d}").mkdir(parents=True)
        (d / "trials" / f"{n:04d}" / "server.log").write_text(text)
    label = {r["trial"]: r["label"] for r in rows}
    (d / "best.json").write_text(json.dumps({"baseline": {"trial": 0, "label": label[0]},
                                             "best": {"trial": pick, "label": label[pick],
                                                      "served": {"speedup": 1.4, "servers": 2}}}))
    return d


def _load():
    spec = importlib.util.spec_from_file_location("gpu_smoke_checks", CHECKS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SMOKE = _load()


def _check(*args: str) -> SimpleNamespace:
    """The check as the script runs it (``python scripts/gpu_smoke_checks.py ARGS``), in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = SMOKE.main(list(args))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr="")


def test_a_gpu_run_as_expected_passes_every_check(tmp_path):
    d = _gpu_run(tmp_path)
    for args in (["study", str(d), "--trials", "4", "--lossless", "ngram,eagle3"], ["graphs", str(d), "--platform", "cuda"],
                 ["runners", str(d), "--platform", "cuda"], ["pick", str(d)]):
        r = _check(*args)
        assert r.returncode == 0, (args, r.stdout + r.stderr)
    assert "trial 3 none FAIL" in _check("study", str(d), "--trials", "4", "--lossless", "ngram,eagle3").stdout


@pytest.mark.parametrize("ngram, said", [
    (dict(state="FAIL", status=None, failure="vllm serve exited before it was ready (planted)"),
     "lossless trial 1 (ngram k=3) must complete and pass: state FAIL"),
    (dict(status="failed"), "lossless trial 1 (ngram k=3) must complete and pass: state COMPLETE, status failed"),
    (dict(status="unverified"), "status unverified"),
])
def test_a_smoke_run_with_a_failing_lossless_trial_exits_non_zero(tmp_path, ngram, said):
    rows = [_row(0, "none", role="baseline"), _row(1, "ngram", **ngram), _row(2, "eagle3"), _row(3, "none")]
    r = _check("study", str(_gpu_run(tmp_path, rows)), "--trials", "4", "--lossless", "ngram,eagle3")
    assert r.returncode == 1 and said in r.stdout, r.stdout + r.stderr


def test_the_study_check_wants_its_baseline_its_trials_and_a_reason_for_each_failure(tmp_path):
    rows = [_row(0, "none", role="baseline", state="FAIL", status=None, failure="timeout"), _row(1, "ngram")]
    assert "the baseline did not complete" in _check("study", str(_gpu_run(tmp_path / "a", rows)), "--trials", "2",
                                                     "--lossless", "ngram").stdout
    rows = [_row(0, "none", role="baseline"), _row(1, "ngram"), _row(2, "none", state="FAIL", status=None)]
    assert "trial 2 (none) FAIL without a reason" in _check("study", str(_gpu_run(tmp_path / "b", rows)), "--trials",
                                                             "3", "--lossless", "ngram").stdout
    rows = [_row(0, "none", role="baseline"), _row(1, "ngram")]
    assert "no trial of eagle3" in _check("study", str(_gpu_run(tmp_path / "c", rows)), "--trials", "2",
                                          "--lossless", "ngram,eagle3").stdout


def test_graph_capture_is_read_from_the_baselines_own_log(tmp_path):
    d = _gpu_run(tmp_path, logs={0: V2_LOG, 1: V2_LOG + GRAPHS})  # another trial captured, the baseline did not
    r = _check("graphs", str(d), "--platform", "cuda")
    assert r.returncode == 1 and "no 'Graph capturing finished' in the baseline's own log" in r.stdout
    assert "0000/server.log" in r.stdout


def test_confirms_pick_must_not_be_the_baseline(tmp_path):
    r = _check("pick", str(_gpu_run(tmp_path, pick=0)))
    assert r.returncode == 1 and "confirm's pick is the baseline (none)" in r.stdout


def test_each_trial_ran_the_runner_vllm_picks_for_it(tmp_path):
    rows = [_row(0, "none", role="baseline"), _row(1, "ngram", runner="v1")]  # ngram on V1 on a GPU: not as vLLM picks
    r = _check("runners", str(_gpu_run(tmp_path, rows)), "--platform", "cuda")
    assert r.returncode == 1 and "trial 1 (ngram k=3) ran v1, expected v2" in r.stdout
    rows = [_row(0, "none", role="baseline", runner="v1"), _row(1, "ngram", runner="v1")]
    assert _check("runners", str(_gpu_run(tmp_path / "cpu", rows)), "--platform", "cpu").returncode == 0
    rows = [_row(0, "none", role="baseline"), _row(1, "suffix", runner="v1")]
    assert _check("runners", str(_gpu_run(tmp_path / "sfx", rows)), "--platform", "cuda").returncode == 0


def test_every_server_ran_at_the_asked_tensor_parallel_size(tmp_path):
    args = "(APIServer pid=1) INFO [api_utils.py:99] non-default args: {'model_tag': 'm', 'tensor_parallel_size': %d}\n"
    d = _gpu_run(tmp_path, rows=[_row(0, "none", role="baseline"), _row(1, "ngram")], logs={0: args % 2, 1: args % 2})
    assert _check("tp", str(d), "--size", "2").returncode == 0
    (d / "trials" / "0001" / "server.log").write_text("non-default args: {'model_tag': 'm'}\n")  # TP 1: default
    r = _check("tp", str(d), "--size", "2")
    assert r.returncode == 1 and "tensor_parallel_size [1], expected 2" in r.stdout


def test_the_checks_run_as_the_script_runs_them(tmp_path):
    d = _gpu_run(tmp_path, pick=0)
    r = subprocess.run([sys.executable, str(CHECKS), "pick", str(d)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "confirm's pick is the baseline" in r.stdout


def test_the_script_stops_on_each_check():
    """Every check of the smoke script goes through ``check``, which stops the script on exit 1."""
    script = (ROOT / "scripts" / "gpu_smoke.sh").read_text()
    assert 'check() { local got; got=$("${CHECK[@]}" "$@" 2>&1) || surprise "$got";' in script
    for name in ("study", "runners", "graphs", "pick", "tp"):
        assert f"check {name} " in script, name
