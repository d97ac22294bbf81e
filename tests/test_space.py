import optuna
import pytest

from autotune.core.candidate import Candidate, Settings
from autotune.core.errors import BadInput
from autotune.core.space import load_space, parse_space

from conftest import ROOT


def test_cpu_space_resolves_for_cpu_with_a_draft():
    s = load_space("cpu", platform="cpu", models={"draft_model"})
    names = [p.name for p in s.params]
    assert names[:4] == ["method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"]
    assert dict((p.name, p.choices) for p in s.params)["method"] == ("none", "ngram", "draft_model")
    assert "quantization=fp8 (needs cuda; this is cpu)" in s.dropped
    assert s.baseline_trial_params() == {"method": "none", "kv_cache_dtype": "auto", "dtype": "default",
                                         "enforce_eager": False}


def test_the_spaces_kept_in_search_spaces_load():
    s = load_space(str(ROOT / "search_spaces" / "deep.yaml"), platform="cpu", models={"draft_model"})
    depth = next(p for p in s.params if p.name == "num_speculative_tokens")
    assert (min(depth.values()), max(depth.values())) == (1, 16) and s.baseline_trial_params()["method"] == "none"


def test_methods_needing_a_model_are_dropped_and_reported():
    s = load_space("cpu", platform="cpu", models=set())
    method = next(p for p in s.params if p.name == "method")
    assert method.choices == ("none", "ngram") and "method=draft_model (needs --draft-model)" in s.dropped


def test_gpu_space_on_cpu_leaves_out_cuda_only_knobs():
    s = load_space("gpu", platform="cpu", models=set())
    assert "cudagraph_mode" not in [p.name for p in s.params]
    assert "method=eagle3 (needs cuda; this is cpu)" in s.dropped
    s = load_space("gpu", platform="cuda", models={"eagle3_head"})
    assert "eagle3" in next(p for p in s.params if p.name == "method").choices


def test_conditional_params_only_for_their_method():
    s = load_space("cpu", platform="cpu", models={"draft_model"})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(40):
        c = s.suggest(study.ask())
        seen.add(c.method)
        assert ("prompt_lookup_max" in c.params) == (c.method == "ngram")
        assert ("num_speculative_tokens" in c.params) == (c.method != "none")
    assert seen == {"none", "ngram", "draft_model"}


def test_engine_kwargs_from_candidate():
    s = load_space("cpu", platform="cpu", models={"draft_model", "moe_layers"}, tags={"cpu", "cpu-avx512"})
    study = optuna.create_study()
    study.enqueue_trial({"method": "draft_model", "num_speculative_tokens": 3, "kv_cache_dtype": "fp8",
                         "dtype": "bfloat16", "quantization": "int8_per_channel_weight_only", "enforce_eager": True})
    c = s.suggest(study.ask())
    kw = c.engine_kwargs(Settings(model="/m/t", draft_model="/m/d", max_model_len=512, gpu_memory_utilization=0.3))
    assert kw == {"model": "/m/t", "max_model_len": 512, "gpu_memory_utilization": 0.3, "seed": 0,
                  "dtype": "bfloat16", "kv_cache_dtype": "fp8", "quantization": "int8_per_channel_weight_only",
                  "enforce_eager": True,
                  "speculative_config": {"method": "draft_model", "model": "/m/d", "num_speculative_tokens": 3}}
    assert c.lossy and c.label == "draft_model k=3 bfloat16 kv=fp8 q=int8_per_channel_weight_only eager"
    # "default" dtype and "none" quantization leave the study's settings alone: not lossy.
    plain = Candidate({"method": "none", "dtype": "default", "kv_cache_dtype": "auto"})
    assert not plain.lossy
    assert plain.engine_kwargs(Settings(model="m", dtype="float32"))["dtype"] == "float32"


@pytest.mark.parametrize("data, fragment", [
    ([1], "expected a mapping"),
    ({"params": {"method": {"choices": ["none"]}}, "colour": 1}, "key 'colour'"),
    ({"params": {"speed": {"choices": [1]}, "method": {"choices": ["none"]}}}, "key 'params.speed': expected a known parameter"),
    ({"params": {"method": {"choices": ["none", "telepathy"]}}}, "key 'params.method.choices': expected methods"),
    ({"params": {"method": {"choices": ["none"]}, "num_speculative_tokens": {"int": [5, 1]}}}, "low <= high"),
    ({"params": {"method": {"choices": ["none"]}, "kv_cache_dtype": {"choices": []}}}, "a non-empty list"),
    ({"params": {"method": {"choices": ["none"]}, "kv_cache_dtype": {"choices": ["auto"], "when": {"x": [1]}}}}, "declared above"),
    ({"params": {"method": {"choices": ["none"]}}, "baseline": {"method": "ngram"}}, "key 'baseline'"),
    ({"params": {"method": {"choices": ["none"]}, "enforce_eager": {"choices": [True]}}}, "key 'baseline.enforce_eager'"),
    ({"params": {"kv_cache_dtype": {"choices": ["auto"]}}}, "includes 'method'"),
])
def test_bad_space_is_a_clear_error(data, fragment):
    with pytest.raises(BadInput) as e:
        parse_space(data, src="s.yaml", platform="cpu", models=set())
    assert str(e.value).startswith("s.yaml") and fragment in str(e.value)


def test_bad_yaml_names_the_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nparams:\n  method: [unclosed\n")
    with pytest.raises(BadInput, match=r"bad.yaml:\d+: not valid YAML"):
        load_space(str(p), platform="cpu", models=set())
    with pytest.raises(BadInput, match="no such search space"):
        load_space("nope", platform="cpu", models=set())


def test_mtp_only_for_models_that_declare_mtp_layers(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "deepseek_v3", "num_nextn_predict_layers": 1}')
    assert "mtp_layers" in Settings(model=str(tmp_path)).available_models()
    s = load_space("gpu", platform="cuda", models=Settings(model=str(tmp_path)).available_models())
    assert "mtp" in next(p for p in s.params if p.name == "method").choices
    s = load_space("gpu", platform="cuda", models=Settings(model="meta-llama/Llama-3.1-8B").available_models())
    assert "method=mtp (needs a model with MTP layers)" in s.dropped


def test_fp8_kv_cache_only_on_cpus_with_avx512_or_amx():
    plain = load_space("cpu", platform="cpu", models=set(), tags={"cpu"})
    assert next(p for p in plain.params if p.name == "kv_cache_dtype").choices == ("auto",)
    assert "kv_cache_dtype=fp8 (needs cpu-avx512 or cpu-amx or cuda; this is cpu)" in plain.dropped
    for tags in ({"cpu", "cpu-avx512"}, {"cpu", "cpu-amx"}):
        wide = load_space("cpu", platform="cpu", models=set(), tags=tags)
        assert next(p for p in wide.params if p.name == "kv_cache_dtype").choices == ("auto", "fp8")
        assert not any(d.startswith("kv_cache_dtype") for d in wide.dropped)
    # Without tags, the platform name alone: what a space says is the same on every machine.
    assert load_space("cpu", platform="cpu", models=set()).dropped == plain.dropped


def test_int8_weight_only_only_for_moe_models(tmp_path):
    # vLLM 0.32's CPU int8 weight-only quantizes MoE layers only: on a dense model it is a no-op.
    dense = load_space("cpu", platform="cpu", models=Settings(model=str(ROOT / "autotune/demo/models/target"))
                       .available_models(), tags={"cpu"})
    assert next(p for p in dense.params if p.name == "quantization").choices == ("none",)
    assert "quantization=int8_per_channel_weight_only (needs a mixture-of-experts model)" in dense.dropped
    (tmp_path / "config.json").write_text('{"model_type": "mixtral", "num_local_experts": 8}')
    moe = load_space("cpu", platform="cpu", models=Settings(model=str(tmp_path)).available_models(), tags={"cpu"})
    assert "int8_per_channel_weight_only" in next(p for p in moe.params if p.name == "quantization").choices
