"""``started`` (forked from the launcher, or fresh) carried into every measurement, trials.csv and
best.json, and a pick compared across forked and fresh engines said in one line. FAKE engine for the
study; the mixed case is planted by launching the re-measurement of the pick fresh."""

import json
import os

import pandas as pd

from autotune.core.candidate import Settings
from autotune.core.workload import load_workload
from autotune.core.space import load_space
from autotune.measure.config import Quiet, StudyConfig
from autotune.measure.metrics import started_of
from autotune.results.files import write_results
from autotune.run import launcher
from autotune.study.loop import run_study


def test_started_names_the_measured_engines_process():
    assert started_of({"started": {"worker": "forked", "server": "fresh"}}) == "fresh"  # the server measured
    assert started_of({"started": {"worker": "forked", "server": "none (in the worker)"}}) == "forked"
    assert started_of({}) is None


def _ngram(k):
    return {"method": "ngram", "num_speculative_tokens": k, "kv_cache_dtype": "auto", "quantization": "none"}


def test_started_reaches_trials_csv_and_best_json_and_a_forked_fresh_pairing_is_said(tmp_path, fake_engine_env,
                                                                                        monkeypatch):
    space = load_space("tests/data/fake_space.yaml", platform="cpu", models=set())
    cfg = StudyConfig(name="fake", results_dir=tmp_path / "fake", settings=Settings(model="fake-model"), n_trials=2,
                      trial_timeout_s=20, engine_module="fake_engine", remeasure=True)
    real = launcher.launch
    calls = []

    def launch(argv, *, env, log_path):  # the last worker (the baseline's re-measure) started fresh, as if refused
        calls.append(1)
        if len(calls) < 4:
            return real(argv, env=env, log_path=log_path)
        sock = os.environ.pop(launcher.ENV_KEY)
        try:
            return real(argv, env={k: v for k, v in env.items() if k != launcher.ENV_KEY}, log_path=log_path)
        finally:
            os.environ[launcher.ENV_KEY] = sock

    with launcher.active():
        monkeypatch.setattr(launcher, "launch", launch)
        import autotune.run.worker as w

        monkeypatch.setattr(w, "launch", launch)
        study = run_study(cfg, load_workload("examples/smoke.jsonl"), space, enqueue=[_ngram(3)], progress=Quiet())
    report = write_results(study, tmp_path / "fake", settings=Settings(model="fake-model"), platform={"platform": "cpu"},
                           objectives=["output_tok_s", "e2e_ms_p50"],
                           storage_url=f"sqlite:///{tmp_path / 'fake' / 'study.db'}")
    frame = pd.read_csv(tmp_path / "fake" / "trials.csv")
    assert set(frame["started"]) <= {"forked", "fresh"} and "forked" in set(frame["started"]), frame["started"]
    best = json.loads((tmp_path / "fake" / "best.json").read_text())
    assert best["best"]["measurement"]["started"] in ("forked", "fresh")
    s = report["started"]
    # first engines, every selection round pooled, then every holdout instance: one entry per engine instance
    def engines(label: str) -> int:
        return int(((frame["label"] == label) & (frame["state"] == "COMPLETE")).sum())

    assert len(s["baseline"]) == engines("none") >= 2, s
    assert len(s["pick"]) == engines(best["best"]["label"]) >= 2, s
    assert s["mixed"] and s["mixed"].startswith("the pick's speedup pairs forked with fresh engines"), s
    assert "\n" not in s["mixed"]
