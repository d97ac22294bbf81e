"""Looking past the space's edge (issue 28): forecasts cost no engine, so when the best config sits
at the top of an integer knob's range (a depth, a lookup) the study forecasts one step beyond it,
says so in best.json, and --strategy predict may measure that step when its forecast clears the
noise. Pure tests on a synthetic workload whose outputs copy long runs of their prompts (deeper
ngram drafts keep paying), measured against a synthetic cost law."""

from __future__ import annotations

import random

from autotune.core.candidate import Candidate
from autotune.forecast.forecast import AcceptanceTable, Model, Observation, speedup_of
from autotune.core.space import parse_space
from autotune.forecast.policy import edges, next_predicted

BASE = {"method": "none", "kv_cache_dtype": "auto"}
SHARE = 0.1


def _space(top: int):
    return parse_space({"baseline": BASE, "params": {
        "method": {"choices": ["none", "ngram"]},
        "num_speculative_tokens": {"int": [1, top], "when": {"method": ["ngram"]}},
        "prompt_lookup_max": {"int": [3, 3], "when": {"method": ["ngram"]}},
        "prompt_lookup_min": {"int": [2, 2], "when": {"method": ["ngram"]}},
        "kv_cache_dtype": {"choices": ["auto"]}}}, src="test", platform="cpu", models=set())


def _table() -> AcceptanceTable:
    """Outputs that copy 60-token runs of their prompt: an ngram draft of any depth is accepted whole."""
    rng = random.Random(1)
    outputs = []
    for i in range(12):
        prompt = [rng.randrange(500) for _ in range(80)]
        outputs.append({"id": f"r{i}", "prompt_token_ids": prompt, "token_ids": prompt[10:70]})
    return AcceptanceTable(outputs, None, 4096)


def _truth(table: AcceptanceTable, params: dict) -> float:
    if params["method"] == "none":
        return 1.0
    return speedup_of(1.25 + 0.03 * params["num_speculative_tokens"], table.get(params).tokens_per_step, SHARE)


def _run(past_edge: bool) -> tuple[list[dict], list[str]]:
    table, grid = _table(), _space(3).grid()
    obs, measured, whys = [Observation(BASE, 1, 1, 1)], [], []
    for _ in range(12):
        step = next_predicted(grid, Model(table, obs, BASE, SHARE), obs, past_edge=past_edge)
        if step.stop:
            return measured, whys + [step.why]
        params = {**step.params, **(step.beyond or {})}
        measured.append(params)
        whys.append(step.why)
        s = _truth(table, params)
        obs.append(Observation(params, s, s * 0.99, s * 1.01))
    raise AssertionError("predict did not stop")


def test_edges_are_the_top_of_each_integer_knob_for_the_method():
    grid = _space(5).grid()
    top = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, "prompt_lookup_min": 2,
           "kv_cache_dtype": "auto"}
    assert edges(grid, top) == [("num_speculative_tokens", 5, 6), ("prompt_lookup_max", 3, 4)]
    assert edges(grid, {**top, "num_speculative_tokens": 4}) == [("prompt_lookup_max", 3, 4)]
    assert edges(grid, BASE) == []


def test_predict_measures_one_step_past_the_edge_where_the_forecast_clears_the_noise():
    measured, whys = _run(past_edge=True)
    depths = [p.get("num_speculative_tokens") for p in measured]
    assert 3 in depths and 4 in depths and max(depths) == 4  # one step past k=3, and no further
    at4 = depths.index(4)
    assert whys[at4].startswith("past the space's edge: ngram k=3") and "at 4 predicted" in whys[at4]
    assert Candidate(measured[at4]).label.startswith("ngram k=4")


def test_without_past_edge_predict_stops_at_the_edge():
    measured, whys = _run(past_edge=False)
    assert max(p.get("num_speculative_tokens", 0) for p in measured) == 3
    assert "by more than the noise" in whys[-1]


def test_a_step_past_the_edge_runs_in_a_study_and_is_remeasured_as_itself(tmp_path, fake_engine_env, monkeypatch):
    """The study side on the FAKE engine: a planned step past the edge (k=5 where the space stops at
    4) is measured as k=5 though Optuna's parameters stay inside the space, and the fresh-engine
    re-measurement of that pick measures k=5 again."""
    from optuna.trial import TrialState

    from autotune.measure.config import Settings, StudyConfig
    from autotune.core.space import load_space
    from autotune.forecast.policy import Step
    from autotune.study.loop import run_study
    from autotune.core.workload import load_workload

    monkeypatch.setenv("AUTOTUNE_FAKE_NOISE", "0")
    calls = []

    def plan(study, space, strategy, max_model_len, *, past_edge=False):
        calls.append(past_edge)
        if len(calls) == 1:
            return Step({"method": "ngram", "num_speculative_tokens": 4}, "past the space's edge: test",
                        beyond={"num_speculative_tokens": 5})
        return Step(None, "done", stop=True)

    monkeypatch.setattr("autotune.study.loop.plan", plan)
    space = load_space("tests/data/fake_depths.yaml", platform="cpu", models=set())
    cfg = StudyConfig(name="edge", results_dir=tmp_path / "edge", settings=Settings(model="fake-model"),
                      objectives=("output_tok_s",), n_trials=3, trial_timeout_s=20, engine_module="fake_engine",
                      strategy="predict", past_edge=True, remeasure=True, pairs=2)
    study = run_study(cfg, load_workload("examples/smoke.jsonl"), space)
    assert calls and all(calls)  # the study's flag reaches the strategy
    past = [t for t in study.trials if t.user_attrs.get("past_edge")]
    assert [t.user_attrs["candidate"]["num_speculative_tokens"] for t in past] == [5, 5, 5]  # trial, holdout
    assert all(t.params["num_speculative_tokens"] == 4 for t in past)  # Optuna's view stays in the space
    assert past[0].state == TrialState.COMPLETE and past[0].user_attrs["label"].startswith("ngram k=5")
    assert past[1].user_attrs.get("role") == "holdout" and past[1].state == TrialState.COMPLETE
