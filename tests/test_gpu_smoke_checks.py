"""scripts/gpu_smoke.sh can fail where it matters (issues 51, 59): its checks (scripts/gpu_smoke_checks.py)
on planted results folders, as a GPU run would leave them. A lossless trial that failed or was judged
incorrect, a drafter's trace that failed, a trial without its forecast, CUDA graphs in another trial's
log but not the baseline's, a pick that is the baseline, a recorded runner, verification or graph mode
that vLLM's own log contradicts, another tensor-parallel size: each exits 1 with one line, and the
script stops on it. The plan's choice of trials from the space. No engine, no GPU."""

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
V1_LOG = "(APIServer pid=1) WARNING [vllm.py:726] Model Runner V2 requires Triton; using the V1 model runner instead.\n"


def _config_log(mode: str) -> str:
    """vLLM's engine-core config line, its resolved compilation config (the graph mode) in it."""
    return (f"(EngineCore pid=7) INFO [core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: model='m', "
            f"compilation_config={{'mode': None, 'cudagraph_mode': <CUDAGraphMode.{mode}: 1>, 'x': 1}}\n")


def _row(trial, method, *, role=None, state="COMPLETE", status="ok", runner="v2", failure=None, predicted=1.5,
         **params):
    label = method if method == "none" else f"{method} k=3"
    return {"trial": trial, "state": state, "role": role, "label": label, "param_method": method, "status": status,
            "verdict": None if status == "ok" else "planted", "failure": failure, "model_runner": runner,
            "predicted_speedup": None if method == "none" else predicted,
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
    logs = logs if logs is not None else {n: V2_LOG + GRAPHS + _config_log("FULL_AND_PIECEWISE") for n in (0, 1, 2)}
    for n, text in logs.items():
        (d / "trials" / f"{n:04d}").mkdir(parents=True)
        (d / "trials" / f"{n:04d}" / "server.log").write_text(text)
    label = {r["trial"]: r["label"] for r in rows}
    (d / "best.json").write_text(json.dumps({"baseline": {"trial": 0, "label": label[0]},
                                             "best": {"trial": pick, "label": label[pick],
                                                      "served": {"speedup": 1.4, "servers": 2}},
                                             "strategy": {"eagle3_trace": {"wall_s": 3.1, "device": "cuda"}}}))
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
                 ["ran", str(d), "--platform", "cuda"], ["pick", str(d)]):
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
    d = _gpu_run(tmp_path, rows, logs={0: V2_LOG, 1: V1_LOG})
    r = _check("ran", str(d), "--platform", "cuda")
    assert r.returncode == 1 and "trial 1 (ngram k=3): vLLM ran v1, autotune expects v2" in r.stdout, r.stdout
    rows = [_row(0, "none", role="baseline", runner="v1"), _row(1, "ngram", runner="v1")]
    assert _check("ran", str(_gpu_run(tmp_path / "cpu", rows, logs={0: V1_LOG, 1: V1_LOG})), "--platform",
                  "cpu").returncode == 0
    rows = [_row(0, "none", role="baseline"), _row(1, "suffix", runner="v1"), _row(2, "eagle3", runner="v1",
                                                                                  parallel_drafting=True)]
    assert _check("ran", str(_gpu_run(tmp_path / "v1", rows, logs={0: V2_LOG, 1: V1_LOG, 2: V1_LOG})), "--platform",
                  "cuda").returncode == 0


@pytest.mark.parametrize("row, log, said", [
    # recorded V2, but the log shows V1 (issue 59: the smoke predicted the runner from the method alone)
    (dict(runner="v2"), V1_LOG, "trial 1 (ngram k=3): recorded v2, but vLLM's log says v1"),
    (dict(runner="v2"), "", "its server.log names no model runner"),
    # block verification recorded, run on V1 (where vLLM verifies it as standard)
    (dict(runner="v1", rejection_sample_method="block"), V1_LOG, "recorded verify=block, but vLLM ran Model Runner V1"),
    # a graph mode recorded, another resolved
    (dict(cudagraph_mode="PIECEWISE"), V2_LOG + _config_log("NONE"),
     "recorded cudagraph_mode PIECEWISE, but vLLM's log says NONE"),
])
def test_what_a_trial_recorded_is_held_to_what_vllms_log_says_it_ran(tmp_path, row, log, said, monkeypatch):
    v1 = row.get("runner") == "v1"
    if v1:  # the user's VLLM_USE_V2_MODEL_RUNNER=0: V1 is what vLLM picks, and block must not run there
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    rows = [_row(0, "none", role="baseline", runner=row.get("runner", "v2")), _row(1, "ngram", **row)]
    logs = {0: V1_LOG if v1 else V2_LOG, 1: log}
    r = _check("ran", str(_gpu_run(tmp_path, rows, logs=logs)), "--platform", "cuda")
    assert r.returncode == 1 and said in r.stdout, r.stdout


def test_a_failed_trace_or_a_missing_forecast_stops_the_smoke(tmp_path):
    d = _gpu_run(tmp_path / "trace")
    best = json.loads((d / "best.json").read_text())
    best["strategy"]["eagle3_trace"] = {"failure": "KeyError: 'engine_kwargs'", "wall_s": 0.0}
    (d / "best.json").write_text(json.dumps(best))
    r = _check("study", str(d), "--trials", "4", "--lossless", "ngram,eagle3")
    assert r.returncode == 1 and "the eagle3 trace failed: KeyError: 'engine_kwargs'" in r.stdout, r.stdout
    best["strategy"]["eagle3_trace"] = {"failure": "not traced: the head does not fit", "wall_s": 0.0}
    (d / "best.json").write_text(json.dumps(best))
    r = _check("study", str(d), "--trials", "4", "--lossless", "ngram,eagle3")
    assert r.returncode == 0 and "eagle3 trace: not traced: the head does not fit" in r.stdout  # a skip, said
    rows = [_row(0, "none", role="baseline"), _row(1, "ngram", predicted=None), _row(2, "eagle3"), _row(3, "none")]
    r = _check("study", str(_gpu_run(tmp_path / "forecast", rows)), "--trials", "4", "--lossless", "ngram,eagle3")
    assert r.returncode == 1 and "trial 1 (ngram k=3) has no forecast" in r.stdout, r.stdout


def test_the_plan_runs_one_trial_per_method_and_runner_covering_each_graph_mode_and_knob():
    from autotune.core.candidate import Settings
    from autotune.core.space import load_space

    space = load_space("gpu", platform="cuda", tags={"cuda"}, models={
        "draft_model", "eagle3_head", "parallel_drafting_head", "arctic_inference", "sampled_requests",
        "model_runner_v2", "dspark_drafter"})
    settings = Settings(model="/m/t", draft_model="/m/d", eagle3_head="/m/h")
    chosen = SMOKE.choose(space, settings, platform="cuda", env={})
    keys = [(c.method, bool(c.params.get("parallel_drafting"))) for c in chosen if not c.lossy]
    assert sorted(keys) == sorted({(m, p) for m, p in keys})  # one each
    assert {m for m, _ in keys} == {"ngram", "suffix", "draft_model", "eagle3", "dspark"}
    assert ("eagle3", True) in keys and ("eagle3", False) in keys  # V1 and V2
    from autotune.core.candidate import SPEC_DEFAULTS

    # every graph mode and verification, adaptive and drafting value the space offers runs once at least
    # (the baseline's graph mode and vLLM's defaults in the trials that set nothing)
    offered = {(k, v) for p in space.params if p.name in SMOKE.COVER for k in [p.name] for v in p.values()}
    ran = {(k, c.params[k]) for c in chosen for k in SMOKE.COVER if k in c.params}
    ran |= {(k, v) for k, v in {**SPEC_DEFAULTS, **space.baseline}.items() if k in SMOKE.COVER}
    assert offered <= ran, offered - ran
    assert {"PIECEWISE", "NONE"} <= {c.params.get("cudagraph_mode") for c in chosen}
    lossy = [c for c in chosen if c.lossy]
    assert len(lossy) == 1 and lossy[0].method == "none"
    assert lossy[0].params["kv_cache_dtype"] == "fp8" and lossy[0].params["quantization"] == "fp8"
    assert [c.method for c in SMOKE.choose(space, settings, platform="cuda", env={}, methods={"eagle3"})] == \
        ["eagle3", "eagle3"]


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
    for name in ("plan", "study", "ran", "graphs", "pick", "tp"):
        assert f"check {name} " in script, name
