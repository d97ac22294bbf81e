"""Predict, then measure: the step-cost model (autotune.forecast.forecast) and the strategies (autotune.study.strategy).

Pure tests on hand-built token streams and a synthetic "true" cost law, then the predict strategy
end to end on the FAKE engine (tests/fake_engine.py) through the CLI.
"""

from __future__ import annotations

import json
import re
import random

import pandas as pd
import pytest
from typer.testing import CliRunner

from autotune.core.candidate import Candidate
from autotune.cli.app import app
from autotune.forecast.forecast import AcceptanceTable, Model, Observation, fit_step_cost, speedup_of, step_cost_of
from autotune.core.space import SearchSpace, load_space, parse_space
from autotune.forecast.policy import next_in_grid, next_predicted

SPACE = {"baseline": {"method": "none", "kv_cache_dtype": "auto"},
         "params": {"method": {"choices": ["none", "ngram", "draft_model"]},
                    "num_speculative_tokens": {"int": [1, 6], "when": {"method": ["ngram", "draft_model"]}},
                    "prompt_lookup_max": {"int": [2, 4], "when": {"method": ["ngram"]}},
                    "prompt_lookup_min": {"int": [2, 2], "when": {"method": ["ngram"]}},
                    "kv_cache_dtype": {"choices": ["auto", "fp8"]}}}
BASE = {"method": "none", "kv_cache_dtype": "auto"}


def _space(data=SPACE):
    return parse_space(data, src="test", platform="cpu", models={"draft_model"})


def _outputs(n: int = 12, seed: int = 0) -> tuple[list[dict], dict[str, list[int]]]:
    """Requests that copy most of their prompt back (as an edit does), and a draft trace that gets
    ~70% of the next tokens right."""
    rng = random.Random(seed)
    outputs, argmax = [], {}
    for i in range(n):
        prompt = [rng.randrange(200) for _ in range(40)]
        out = prompt[5:30] + [rng.randrange(200) for _ in range(4)] + prompt[30:38]
        outputs.append({"id": f"r{i}", "prompt_token_ids": prompt, "token_ids": out})
        argmax[f"r{i}"] = [tok if rng.random() < 0.7 else -1 for tok in out[1:]] + [0]
    return outputs, argmax


# The machine's "true" step costs r = 1 + a + b*k, and the fp8 KV factor on the speedup.
TRUE = {"ngram": (0.25, 0.03), "draft_model": (0.3, 0.22)}
FP8 = 0.93
SHARE = 0.1


def _true_speedup(table: AcceptanceTable, params: dict) -> float:
    if params["method"] == "none":
        s = 1.0
    else:
        a, b = TRUE[params["method"]]
        s = speedup_of(1 + a + b * params["num_speculative_tokens"], table.get(params).tokens_per_step, SHARE)
    return s * (FP8 if params.get("kv_cache_dtype") == "fp8" else 1.0)


def _measure(table, params, rng, noise=0.01):
    s = _true_speedup(table, params) * (1 + rng.gauss(0, noise))
    return Observation(dict(params), s, s * 0.98, s * 1.02)


def test_step_cost_fit_recovers_a_cost_law_and_keeps_the_prior_without_data():
    fit = fit_step_cost("ngram", [(k, 1.2 + 0.05 * k, 0.01) for k in (1, 3, 5)])
    assert fit.at(4)[0] == pytest.approx(1.4, abs=0.01) and fit.at(4)[1] < 0.02
    prior = fit_step_cost("draft_model", [])
    assert prior.points == 0 and prior.at(3)[1] > 0.5  # wide: one measured depth will dominate it
    one = fit_step_cost("draft_model", [(3, 1.9, 0.03)])
    assert one.at(3)[0] == pytest.approx(1.9, abs=0.03)  # one point pins the depth it was measured at


def test_speedup_and_step_cost_are_inverse():
    for r, t, f in ((1.3, 2.5, 0.1), (2.0, 4.1, 0.0), (0.9, 1.0, 0.3)):
        assert step_cost_of(speedup_of(r, t, f), t, f) == pytest.approx(r)
    assert speedup_of(1.0, 1.0, 0.2) == pytest.approx(1.0)  # no gain when a step emits one token at equal cost


def test_model_predicts_unmeasured_depths_and_knobs_from_a_few_trials():
    outputs, argmax = _outputs()
    table = AcceptanceTable(outputs, argmax, 4096)
    rng = random.Random(0)
    measured = [{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2,
                 "kv_cache_dtype": "auto"},
                {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, "prompt_lookup_min": 2,
                 "kv_cache_dtype": "auto"},
                {"method": "draft_model", "num_speculative_tokens": 3, "kv_cache_dtype": "auto"},
                {"method": "draft_model", "num_speculative_tokens": 3, "kv_cache_dtype": "fp8"}]
    obs = [Observation(BASE, 1, 1, 1)] + [_measure(table, p, rng) for p in measured]
    model = Model(table, obs, BASE, SHARE)
    for c in _space().grid():
        f = model.forecast(c.params)
        truth = _true_speedup(table, c.params)
        assert f.lo <= truth <= f.hi, (c.label, f.lo, truth, f.hi)
        if c.method == "ngram" and c.params["kv_cache_dtype"] == "auto":
            assert f.speedup == pytest.approx(truth, rel=0.04), c.label
    fp8 = model.forecast({"method": "draft_model", "num_speculative_tokens": 5, "kv_cache_dtype": "fp8"})
    assert "kv_cache_dtype=fp8 x0.9" in fp8.basis


def _run_predict(table, grid, rng, budget=30, fail=()):
    """The predict strategy against the synthetic truth: returns the measured order and the stop reason."""
    obs, failed, order = [Observation(BASE, 1, 1, 1)], [], []
    for _ in range(budget):
        step = next_predicted(grid, Model(table, obs, BASE, SHARE), obs, failed)
        if step.stop:
            return order, step.why
        order.append(Candidate(step.params).label)
        if any(all(step.params.get(k) == v for k, v in f.items()) for f in fail):
            failed.append(step.params)
        else:
            obs.append(_measure(table, step.params, rng))
    return order, None


@pytest.mark.parametrize("seed", range(5))
def test_predict_finds_the_best_in_a_few_trials_and_stops(seed):
    outputs, argmax = _outputs(seed=seed)
    table = AcceptanceTable(outputs, argmax, 4096)
    grid = _space().grid()
    best = max(grid, key=lambda c: _true_speedup(table, c.params))
    order, why = _run_predict(table, grid, random.Random(seed))
    assert why is not None and "by more than the noise" in why, order
    found = [i for i, label in enumerate(order) if _true_speedup(table, next(
        c.params for c in grid if c.label == label)) >= 0.98 * _true_speedup(table, best.params)]
    assert found and found[0] < 4, (order, best.label)
    assert len(order) < len(grid) / 3  # it stopped long before the grid would have


def test_predict_measures_each_method_first_then_a_knob_and_drops_a_failing_knob():
    outputs, argmax = _outputs()
    table = AcceptanceTable(outputs, argmax, 4096)
    grid = _space().grid()
    order, why = _run_predict(table, grid, random.Random(0), fail=[{"kv_cache_dtype": "fp8"}])
    methods = [label.split()[0] for label in order]
    assert set(methods[:2]) == {"ngram", "draft_model"}  # the best forecast of each method first
    fp8 = [label for label in order if "kv=fp8" in label]
    assert len(fp8) == 1  # tried once around the best; failed there, never again
    assert why is not None


def test_a_method_no_replay_covers_is_measured_once_without_a_prediction():
    """EAGLE-3 reads the target's hidden states: no replay of the baseline's tokens covers it (as
    the gpu space offers it: on CUDA, with an EAGLE-3 head given)."""
    data = json.loads(json.dumps(SPACE))
    data["params"]["method"]["choices"] = ["none", "ngram",
                                           {"value": "eagle3", "needs": "eagle3_head", "platforms": ["cuda"]}]
    data["params"]["num_speculative_tokens"]["when"] = {"method": ["ngram", "eagle3"]}
    space = parse_space(data, src="test", platform="cuda", models={"draft_model", "eagle3_head"})
    grid = space.grid()
    assert "eagle3" in {c.method for c in grid} and not space.dropped
    outputs, _ = _outputs()
    table = AcceptanceTable(outputs, None, 4096)
    obs = [Observation(BASE, 1, 1, 1)]
    steps = []
    for _ in range(3):
        step = next_predicted(grid, Model(table, obs, BASE, SHARE), obs)
        steps.append(step)
        obs.append(Observation(step.params, 1.2, 1.15, 1.25))
    assert steps[0].params["method"] == "ngram" and steps[1].params["method"] == "eagle3"
    assert "no prediction" in steps[1].why
    assert Model(table, obs, BASE, SHARE).forecast(steps[1].params).speedup is None


def test_grid_walks_the_space_in_order_and_stops_when_done():
    grid = _space().grid()
    tried = set()
    for c in grid:
        step = next_in_grid(grid, tried)
        assert step.params == c.params
        tried.add(c.key())
    assert next_in_grid(grid, tried).stop


def test_grid_enumerates_conditional_parameters():
    grid = _space().grid()
    # 2 (none x kv) + 6 k x 3 lookup x 2 kv (ngram) + 6 k x 2 kv (draft)
    assert len(grid) == 2 + 36 + 12 and len({c.key() for c in grid}) == len(grid)
    assert all("prompt_lookup_max" not in c.params for c in grid if c.method != "ngram")


# --- the predict strategy on the FAKE engine, through the CLI ---------------------------------

runner = CliRunner()


def best_trial_of(results) -> int:
    return json.loads((results / "best.json").read_text())["best"]["trial"]


FP8_LEFT_OUT = "kv_cache_dtype=fp8 (needs cpu-avx512 or cpu-amx or cuda; this is cpu)"


def quick_models() -> set[str]:
    """What `autotune search examples/smoke.jsonl --model fake-model --draft-model fake-draft` offers
    the space's ``needs:``: the draft, and the optional packages installed here (Arctic Inference:
    suffix decoding), plus what the workload needs (sampled requests: none in smoke.jsonl)."""
    from autotune.core.candidate import Settings
    from autotune.cli.search import _workload_needs
    from autotune.core.workload import load_workload

    return Settings(model="fake-model", draft_model="fake-draft").available_models() \
        | _workload_needs(load_workload("examples/smoke.jsonl"))


def quick_space_on(platform: dict) -> SearchSpace:
    """The quick space as `autotune search --draft-model ...` over examples/smoke.jsonl builds it on
    the platform a study reports (best.json's ``platform``: autotune.run.hardware.describe()): fp8 KV only
    where that platform has AVX-512, AMX or CUDA, suffix only where Arctic Inference is installed.
    Its grid is what `autotune predict` ranks."""
    return load_space("quick", platform=platform["platform"], models=quick_models(), tags=set(platform["tags"]))


def test_predict_study_on_the_fake_engine_records_forecasts_and_stops_early(tmp_path, monkeypatch, fake_engine_env,
                                                                            faked_cpu):
    """On both kinds of CPU (faked: with AVX-512 the quick space has fp8 KV and twice the points it
    has without), so the expectations follow the platform the study reports, never one machine's space."""
    from autotune.run import hardware

    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.setenv("AUTOTUNE_FAKE_NOISE", "0")  # quiet windows: the 3 rounds of fresh engines a figure needs
    monkeypatch.setenv("COLUMNS", "1000")  # each record whole on one line, to read it (a pipe wraps at 100)
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--space", "quick", "--trials", "30", "--model",
                            "fake-model", "--draft-model", "fake-draft", "--results", str(tmp_path), "--samples", "0",
                            "--repeats", "1", "--study", "p", "--explain"])  # the stop line: --explain
    assert r.exit_code == 0, r.output
    best = json.loads((tmp_path / "p" / "best.json").read_text())
    assert best["platform"]["tags"] == sorted(hardware.platform_tags())  # the study reports the machine it ran on
    space = quick_space_on(best["platform"])
    grid = space.grid()
    # fp8 KV is searched exactly where the platform runs it; elsewhere the search says why it is left out.
    assert any(c.params.get("kv_cache_dtype") == "fp8" for c in grid) == (FP8_LEFT_OUT not in space.dropped)
    assert (f"left out: {FP8_LEFT_OUT}" in " ".join(r.stdout.split())) == (FP8_LEFT_OUT in space.dropped)
    frame = pd.read_csv(tmp_path / "p" / "trials.csv")
    cands = frame[~frame["role"].isin(["baseline", "re-measure", "holdout"])]
    # Stopped well before the grid, with budget left.
    assert 2 <= len(cands) and 3 * len(cands) < 2 * len(grid) and len(frame) < 30
    assert cands["predicted_speedup"].notna().all() and cands["planned"].notna().all()
    # Then the pick and the baseline in the holdout's rounds of fresh engines (the pick's figure rests on them
    # alone, never pooled), after any selection rounds (pooled).
    held = frame[frame["role"] == "holdout"]
    assert len(held) == 2 * 4 and set(held["holdout_of"]) == {0, best["selection"]["trial"]}
    again = frame[frame["role"].isin(["re-measure", "holdout"])]
    # Each speculative config's line: its forecast and its tok/s over the named first baseline; the
    # baseline's own config (trial 0 and its fresh engines) shows no speedup but 1.
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("trial ")]
    assert all("predicted " in ln and re.search(r", measured \d+\.\d+x over trial 0$", ln) for ln in lines
               if ln.split()[2] != "none")
    assert not any("measured" in ln for ln in lines if ln.split()[2] == "none")
    assert best["strategy"]["name"] == "predict" and "by more than the noise" in best["strategy"]["stopped"]
    assert best["strategy"]["draft_trace"]["wall_s"] >= 0 and best["best"]["predicted"]["speedup"] > 1
    assert "predict: stopped after" in r.stdout
    # autotune predict: the ranked forecast of the saved study, no engine.
    r = runner.invoke(app, ["predict", str(tmp_path / "p"), "--json", "--top", "0"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    scored = [x["speedup"] for x in rows if x["speedup"] is not None]
    assert len(rows) == len(grid) and scored == sorted(scored, reverse=True)  # the study's space, every point
    assert sorted(x["label"] for x in rows) == sorted(c.label for c in grid)
    # Re-measures are the same configs; a step past the space's edge (--past-edge) is no point of it.
    past = frame[~frame["label"].isin([c.label for c in grid]) & ~frame["role"].isin(["re-measure", "holdout"])]
    assert all(str(p).startswith("past the space's edge") for p in past["planned"])
    assert sum(x["measured"] is not None for x in rows) == len(frame) - len(again) - len(past)
    r = runner.invoke(app, ["predict", str(tmp_path / "p"), "--top", "5"])
    assert r.exit_code == 0 and "forecast from the baseline's tokens, the draft's trace" in r.stdout
    # The report plots each forecast against its measurement.
    r = runner.invoke(app, ["report", str(tmp_path / "p")])
    assert r.exit_code == 0 and (tmp_path / "p" / "report" / "prediction.png").is_file(), r.output


def test_predict_command_bad_input_is_one_line(tmp_path):
    r = runner.invoke(app, ["predict", str(tmp_path / "none")])
    assert r.exit_code == 2 and "no such study storage" in r.output and len(r.output.strip().splitlines()) == 1


def test_strategy_flag_is_checked(tmp_path):
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--strategy", "bayes", "--results", str(tmp_path)])
    assert r.exit_code == 2 and "--strategy: expected one of predict, grid, tpe, random" in r.output


def test_the_model_widens_to_the_noise_its_fit_shows():
    """Configs that do the same work but measure apart (engine instances differ) raise the model's
    noise above its floor, so forecasts and the stop rule widen with it."""
    outputs, argmax = _outputs()
    table = AcceptanceTable(outputs, argmax, 4096)
    grid = [c for c in _space().grid() if c.params["kv_cache_dtype"] == "auto" and c.method != "none"]
    rng = random.Random(1)
    quiet = [Observation(BASE, 1, 1, 1)] + [_measure(table, c.params, rng, noise=0.005) for c in grid]
    loud = [Observation(BASE, 1, 1, 1)] + [_measure(table, c.params, rng, noise=0.12) for c in grid]
    calm, noisy = Model(table, quiet, BASE, SHARE), Model(table, loud, BASE, SHARE)
    assert calm.noise == pytest.approx(0.03) and 0.07 < noisy.noise < 0.2
    probe = grid[len(grid) // 2].params
    f_calm, f_noisy = calm.forecast(probe), noisy.forecast(probe)
    assert (f_noisy.hi - f_noisy.lo) > 1.5 * (f_calm.hi - f_calm.lo)


def test_two_studies_of_one_name_in_one_process_replay_their_own_baselines():
    """The acceptance replay is cached per baseline trial, not per study name: a test suite (or a
    long-lived process) runs several studies called the same; one once forecast from another's."""
    import optuna

    from autotune.core import attrs
    from autotune.study.strategy import study_model
    from autotune.study.view import StudyView

    def study(tokens):
        st = optuna.create_study(study_name="same", directions=["maximize"])
        out = {"id": "r", "prompt_token_ids": [1, 2, 3, 4], "token_ids": tokens}
        st.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, values=[1.0], params={}, distributions={},
            user_attrs={attrs.ROLE: "baseline", attrs.CANDIDATE: {"method": "none"}, attrs.OUTPUTS: [out],
                        attrs.MEASUREMENT: {"output_tok_s": 100.0, "output_tok_s_windows": [100.0]}}))
        return StudyView.of(st)

    copies = study([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4])  # repeats the prompt: ngram drafts land
    fresh = study([9, 8, 7, 6, 5, 9, 8, 7, 6, 5, 0, 0])  # nothing to look up
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 2}
    said = [study_model(s, None, 1024)[0].forecast(ngram).to_dict()["tokens_per_step"] for s in (copies, fresh)]
    assert said[0] > 2.0 and said[1] < 1.5, said
