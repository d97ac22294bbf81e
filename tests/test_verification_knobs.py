"""The lossless verification knobs (issue 12, item 5): block verification and probabilistic drafts,
offered only where the workload has sampled requests, exported as vLLM reads them; block verification
only where the trial's model runner is V2 (issue 59: V1's rejection sampler reads no ``block``, so a
block trial there was labelled block and measured standard)."""

import json
import shlex

import optuna
import pytest

from autotune.core.candidate import Candidate, Settings
from autotune.core.errors import BadInput
from autotune.serve.export import command
from autotune.forecast.forecast import knobs, plain
from autotune.cli.search import _workload_needs, parse_try
from autotune.core.space import load_space
from autotune.core.workload import load_workload

SETTINGS = Settings(model="/m/t", draft_model="/m/d", max_model_len=512)
SETTINGS_ALL = Settings(model="/m/t", draft_model="/m/d", eagle3_head="/m/h", max_model_len=512)
TAGS = {"cpu", "cpu-avx512"}


def _space(sampled: bool, name: str = "cpu", *, v2: bool = True):
    """The space with a draft model, on a runner that is V2 (``v2``: what autotune.core.runner.needs
    gives the CUDA build) or V1 (the CPU build's)."""
    return load_space(name, platform="cpu", models={"draft_model"} | ({"sampled_requests"} if sampled else set())
                      | ({"model_runner_v2"} if v2 else set()), tags=TAGS)


def _choices(space, name):
    return next(p for p in space.params if p.name == name).choices


@pytest.mark.parametrize("name", ["cpu", "quick"])
def test_greedy_workloads_keep_vllms_defaults_and_say_what_was_left_out(name):
    s = _space(False, name)
    assert _choices(s, "rejection_sample_method") == ("standard",)
    assert _choices(s, "draft_sample_method") == ("greedy",)
    assert "rejection_sample_method=block (needs sampled requests (temperature > 0) in the workload)" in s.dropped
    assert not any("verify=" in c.label or "drafts=" in c.label for c in s.grid())


@pytest.mark.parametrize("name", ["cpu", "quick", "gpu"])
def test_block_verification_is_offered_only_where_the_trial_runs_model_runner_v2(name, monkeypatch):
    from autotune.core import runner

    platform = "cuda" if name == "gpu" else "cpu"
    have = {"draft_model", "sampled_requests", "eagle3_head", "parallel_drafting_head", "arctic_inference"}
    # the CPU build (no Triton: V1), and the CUDA build with the user's VLLM_USE_V2_MODEL_RUNNER=0
    for env in ({}, {runner.ENV: "0"}):
        v1 = load_space(name, platform=platform, models=have | runner.needs(platform if env else "cpu", env),
                        tags={platform})
        assert "block" not in _choices(v1, "rejection_sample_method"), (name, env)
        assert any(d.startswith("rejection_sample_method=block (needs Model Runner V2") for d in v1.dropped), v1.dropped
        with pytest.raises(BadInput, match="'rejection_sample_method': 'block' is left out of space"):
            parse_try('{"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "block"}', v1)
    # on the CUDA build (V2): offered, but never to a config that runs V1 (suffix, EAGLE parallel drafting)
    v2 = load_space(name, platform=platform, models=have | runner.needs("cuda", {}), tags={platform})
    assert "block" in _choices(v2, "rejection_sample_method")
    for c in v2.grid():
        if c.params.get("rejection_sample_method") == "block":
            want, _ = runner.expected(c.engine_kwargs(SETTINGS_ALL).get("speculative_config"), triton=True, env={})
            assert want == runner.V2, c.label
    assert not any(c.params.get("rejection_sample_method") == "block" for c in v2.grid()
                   if c.method == "suffix" or c.params.get("parallel_drafting"))


def test_sampled_workloads_offer_block_verification_and_probabilistic_drafts():
    s = _space(True)
    assert _choices(s, "rejection_sample_method") == ("standard", "block")
    assert _choices(s, "draft_sample_method") == ("greedy", "probabilistic")
    labels = {c.label for c in s.grid()}
    assert "ngram k=3 lookup=1..4 verify=block compiled" in labels
    assert "draft_model k=3 drafts=probabilistic compiled" in labels
    # vLLM caches draft probabilities only for its standard rule: no probabilistic drafts with block.
    assert not any("verify=block" in x and "drafts=" in x for x in labels)
    # ngram proposes tokens, not a distribution: the draft sampling knob is a draft model's only.
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(60):
        c = s.suggest(study.ask())
        assert ("draft_sample_method" in c.params) == (c.method == "draft_model"
                                                       and c.params["rejection_sample_method"] == "standard")


def test_the_workload_decides_what_is_offered(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text(json.dumps({"prompt": "a", "max_tokens": 4}) + "\n")
    assert _workload_needs(load_workload(str(f))) == set()
    f.write_text(f.read_text() + json.dumps({"prompt": "b", "max_tokens": 4, "temperature": 0.7}) + "\n")
    assert _workload_needs(load_workload(str(f))) == {"sampled_requests"}


def test_vllms_defaults_stay_out_of_the_engine_arguments_and_the_rest_reach_vllms_parser():
    from autotune.vllm_cli import engine_args_from_serve

    same = Candidate({"method": "draft_model", "num_speculative_tokens": 3, "rejection_sample_method": "standard",
                      "draft_sample_method": "greedy"}).engine_kwargs(SETTINGS)
    assert same == Candidate({"method": "draft_model", "num_speculative_tokens": 3}).engine_kwargs(SETTINGS)
    for params, want in (({"rejection_sample_method": "block"}, ("block", "greedy")),
                         ({"draft_sample_method": "probabilistic"}, ("standard", "probabilistic"))):
        kw = Candidate({"method": "draft_model", "num_speculative_tokens": 3, **params}).engine_kwargs(SETTINGS)
        args = engine_args_from_serve(shlex.split(command(kw))[2:])
        spec = args.speculative_config
        assert (spec["rejection_sample_method"] if "rejection_sample_method" in spec else "standard",
                spec["draft_sample_method"] if "draft_sample_method" in spec else "greedy") == want


def test_a_verification_knob_is_a_measured_factor_to_the_forecast_and_its_default_is_not():
    base = _space(True).baseline
    std = {"method": "ngram", "num_speculative_tokens": 3, "rejection_sample_method": "standard",
           "kv_cache_dtype": "auto", "dtype": "default", "enforce_eager": False}
    assert knobs(std, base) == {}
    block = {**std, "rejection_sample_method": "block"}
    assert knobs(block, base) == {"rejection_sample_method": "block"}
    assert plain(block, base) == std


def test_try_leaves_the_verification_knobs_at_vllms_defaults():
    got = parse_try('{"method": "draft_model", "num_speculative_tokens": 2}', _space(True))
    assert got["rejection_sample_method"] == "standard" and got["draft_sample_method"] == "greedy"
    got = parse_try('{"method": "draft_model", "num_speculative_tokens": 2, "rejection_sample_method": "block"}',
                    _space(True))
    assert got["rejection_sample_method"] == "block" and "draft_sample_method" not in got
    assert "rejection_sample_method" not in parse_try('{"method": "none"}', _space(True))


def test_a_warm_start_from_results_before_these_knobs_re_measures_the_deployed_config(tmp_path):
    from rich.console import Console

    from autotune.results.files import SCHEMA_VERSION
    from autotune.cli.search import warm_start

    old = {"schema_version": SCHEMA_VERSION, "best": {"label": "draft_model k=2 compiled", "candidate": {
        "method": "draft_model", "num_speculative_tokens": 2, "kv_cache_dtype": "auto", "dtype": "default",
        "enforce_eager": False}}, "pareto": []}
    (tmp_path / "best.json").write_text(json.dumps(old))
    deployed, _ = warm_start(tmp_path, _space(True), SETTINGS, "w.jsonl", Console(quiet=True))
    assert deployed == {**old["best"]["candidate"], "rejection_sample_method": "standard",
                        "draft_sample_method": "greedy"}


def test_a_warm_start_re_measures_a_deployed_schedule_as_deployed(tmp_path):
    """Seen in the real-engine nightly test: a recommended schedule was the pick, and the warm
    start re-measured its fixed depth instead (the schedule is no space parameter)."""
    from rich.console import Console

    from autotune.results.files import SCHEMA_VERSION
    from autotune.cli.search import warm_start

    cand = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
            "num_speculative_tokens_per_batch_size": [[1, 2, 3], [3, 256, 0]], "kv_cache_dtype": "auto",
            "dtype": "default", "enforce_eager": False}
    old = {"schema_version": SCHEMA_VERSION, "best": {"label": "ngram k=3@1-2,0@3+", "candidate": cand}, "pareto": []}
    (tmp_path / "best.json").write_text(json.dumps(old))
    deployed, _ = warm_start(tmp_path, _space(False), SETTINGS, "w.jsonl", Console(quiet=True))
    assert deployed == {**cand, "rejection_sample_method": "standard"}
