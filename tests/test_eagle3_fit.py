"""The EAGLE-3 forecast only where it can run (autotune.forecast.eagle3_fit): the head's format and
the target's size checked from file headers before anything is loaded; and a --try or grid eagle3
trial gets its forecast (the FAKE engine measures; the bundled head is really traced)."""

import json
import struct

import pytest
from optuna.trial import TrialState

from autotune import demo
from autotune.core import attrs
from autotune.core.candidate import Settings
from autotune.core.space import load_space
from autotune.core.workload import load_workload
from autotune.forecast import eagle3_fit
from autotune.measure.config import Quiet, StudyConfig
from autotune.study.loop import run_study


def _safetensors(path, tensors):
    header = json.dumps({n: {"dtype": "BF16", "shape": s, "data_offsets": [0, 0]} for n, s in tensors.items()}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)


LLAMA31_8B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "num_hidden_layers": 32,
              "rms_norm_eps": 1e-5, "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000.0,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "torch_dtype": "bfloat16"}


@pytest.fixture
def big_target(tmp_path):
    """An 8B Llama target, as its headers say (no weights: nothing here could load it)."""
    t = tmp_path / "target"
    t.mkdir()
    (t / "config.json").write_text(json.dumps(LLAMA31_8B))
    _safetensors(t / "model-00001-of-00002.safetensors", {"model.embed_tokens.weight": [128256, 4096]})
    _safetensors(t / "model-00002-of-00002.safetensors", {"model.layers.0.mlp.up_proj.weight": [1_000_000, 7500]})
    return t


def _head(tmp_path, config, tensors, name="head"):
    h = tmp_path / name
    h.mkdir()
    (h / "config.json").write_text(json.dumps(config))
    _safetensors(h / "model.safetensors", tensors)
    return h


def speculators_config(**layer):
    """A Llama-3.1-8B speculators-format EAGLE-3 head's config.json (RedHatAI's layout)."""
    return {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "draft_vocab_size": 32000,
            "transformer_layer_config": {**LLAMA31_8B, "num_hidden_layers": 1, **layer},
            "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"speculative_tokens": 3}],
                                   "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}}}


HEAD_TENSORS = {"layers.0.self_attn.q_proj.weight": [4096, 8192], "lm_head.weight": [32000, 4096], "d2t": [32000],
                "t2d": [128256]}


def test_a_speculators_head_over_a_target_larger_than_the_ram_is_skipped_in_one_line_and_nothing_loads(
        tmp_path, big_target, monkeypatch):
    import torch
    import transformers

    def no(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(torch, "load", no)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no)
    monkeypatch.setattr(transformers.LlamaForCausalLM, "from_pretrained", no)
    spec = _head(tmp_path, speculators_config(), HEAD_TENSORS)
    why = eagle3_fit.why_not(str(spec), str(big_target), ram_bytes=16 * 2**30)
    # the speculators layout, d2t/t2d and an lm_head of its own are read now: the target's size decides
    assert why is not None and "8.19B parameters in float32" in why and "RAM available: 16.0 GiB" in why, why
    assert "\n" not in why
    # on a GPU the trace runs there, in the dtype vLLM serves the target in: an 80 GiB one holds it
    assert eagle3_fit.why_not(str(spec), str(big_target), device="cuda", device_bytes=80 * 2**30) is None
    why = eagle3_fit.why_not(str(spec), str(big_target), device="cuda", device_bytes=16 * 2**30)
    assert why == "the trace would load 8.19B parameters in bfloat16 (~19.1 GiB) onto one GPU of 16.0 GiB", why
    # and through the study's step: one line said, the skip kept, no load
    import types

    from autotune.study.strategy import trace_eagle3
    from autotune.study.view import StudyView

    study = types.SimpleNamespace(study_name="s", user_attrs={}, directions=[], get_trials=lambda deepcopy=False: [])
    study.set_user_attr = study.user_attrs.__setitem__
    base = types.SimpleNamespace(number=0, datetime_start="t", user_attrs={attrs.OUTPUTS: []})
    space = load_space("quick", platform="cpu", models={"eagle3_head"})
    monkeypatch.setattr(eagle3_fit, "available_ram", lambda: 16 * 2**30)
    view = StudyView.of(study)
    line = trace_eagle3(study, view, space, types.SimpleNamespace(settings=Settings(model=str(big_target),
                                                                        eagle3_head=str(spec))), base)
    assert line.startswith("eagle3 forecast skipped: the trace would load 8.19B") and "\n" not in line
    assert study.user_attrs[attrs.EAGLE3_TRACE]["failure"].startswith("not traced:")


def _refusals(tmp_path):
    """(head, target, the refusal's words) for each head or target the trace cannot follow."""
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    ok = _head(tmp_path, speculators_config(), HEAD_TENSORS, "ok")
    dflash = _head(tmp_path, {**speculators_config(), "speculators_model_type": "dflash"}, HEAD_TENSORS, "dflash")
    two = _head(tmp_path, speculators_config(num_hidden_layers=2), HEAD_TENSORS, "two")
    yarn = _head(tmp_path, speculators_config(rope_scaling={"rope_type": "yarn", "factor": 4.0}), HEAD_TENSORS, "yarn")
    no_head = _head(tmp_path, speculators_config(), {"layers.0.self_attn.q_proj.weight": [4096, 8192], "d2t": [32000]},
                    "nolm")
    bare = _head(tmp_path, {"speculators_model_type": "eagle3", "speculators_config": {}}, HEAD_TENSORS, "bare")
    target = str(demo.TARGET)
    return [("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", target, "neither a local folder nor in the local Hugging Face cache"),
            (str(ok), str(qwen), "loads Llama targets only"),
            (str(ok), "meta-llama/Llama-3.1-8B-Instruct", "the target meta-llama/Llama-3.1-8B-Instruct is neither"),
            (str(dflash), target, "a speculators-format 'dflash' drafter; the trace follows EAGLE-3 heads only"),
            (str(two), target, "2 decoder layers; the trace runs one-layer heads"),
            (str(yarn), target, "RoPE 'yarn'; the trace computes default and llama3"),
            (str(no_head), target, "drafts over 32000 tokens (draft_vocab_size) but has no lm_head of its own"),
            (str(bare), target, "its layer config has no hidden_size")]


def test_what_the_trace_cannot_follow_is_refused_in_one_line(tmp_path, monkeypatch):
    from huggingface_hub import constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    for head, target, words in _refusals(tmp_path):
        why = eagle3_fit.why_not(head, target, ram_bytes=2**40)
        assert why is not None and words in why and "\n" not in why, (head, target, why)
    if demo.eagle3_available():
        assert eagle3_fit.why_not(str(demo.EAGLE3), str(demo.TARGET), ram_bytes=2**40) is None


SPACE = """name: eagle3-only
baseline: {method: none, kv_cache_dtype: auto, quantization: none}
params:
  method: {choices: [none, eagle3]}
  num_speculative_tokens: {int: [2, 3], when: {method: [eagle3]}}
"""


@pytest.mark.parametrize("how", ["try", "grid"])
def test_try_and_grid_eagle3_trials_carry_a_forecast(tmp_path, fake_engine_env, how):
    """Queued eagle3 trials (--try, the grid) used to run before the trace, which waited for an empty
    queue: 'no head trace'. Now the head is traced before the first of them."""
    if not demo.eagle3_available():
        pytest.skip("no shipped head")
    (tmp_path / "space.yaml").write_text(SPACE)
    space = load_space(str(tmp_path / "space.yaml"), platform="cpu", models={"eagle3_head"})
    settings = Settings(model=str(demo.TARGET), eagle3_head=str(demo.EAGLE3))
    cfg = StudyConfig(name="e3", results_dir=tmp_path / "r", settings=settings, n_trials=2, trial_timeout_s=30,
                      engine_module="fake_engine", strategy="grid" if how == "grid" else "predict")
    try_ = [{"method": "eagle3", "num_speculative_tokens": 2, "kv_cache_dtype": "auto", "quantization": "none"}]
    study = run_study(cfg, load_workload("examples/smoke.jsonl"), space, enqueue=try_ if how == "try" else [],
                      progress=Quiet())
    e3 = [t for t in study.trials if t.state == TrialState.COMPLETE and t.user_attrs["candidate"]["method"] == "eagle3"]
    assert e3 and "traces" in study.user_attrs[attrs.EAGLE3_TRACE], study.user_attrs.get(attrs.EAGLE3_TRACE)
    for t in e3:
        assert t.user_attrs.get(attrs.PREDICTED, {}).get("speedup") is not None, t.user_attrs.get(attrs.PREDICTED)
