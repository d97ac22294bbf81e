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


@pytest.fixture
def big_target(tmp_path):
    """An 8B Llama target, as its headers say (no weights: nothing here could load it)."""
    t = tmp_path / "target"
    t.mkdir()
    (t / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    _safetensors(t / "model-00001-of-00002.safetensors", {"model.embed_tokens.weight": [128256, 4096]})
    _safetensors(t / "model-00002-of-00002.safetensors", {"model.layers.0.mlp.up_proj.weight": [1_000_000, 7500]})
    return t


def _head(tmp_path, config, tensors):
    h = tmp_path / "head"
    h.mkdir()
    (h / "config.json").write_text(json.dumps(config))
    _safetensors(h / "model.safetensors", tensors)
    return h


def test_a_speculators_head_over_a_target_larger_than_the_ram_is_skipped_in_one_line_and_nothing_loads(
        tmp_path, big_target, monkeypatch):
    import torch
    import transformers

    def no(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(torch, "load", no)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no)
    monkeypatch.setattr(transformers.LlamaForCausalLM, "from_pretrained", no)
    spec = _head(tmp_path, {"speculators_model_type": "eagle3", "speculators_config": {}},
                 {"layers.0.self_attn.q_proj.weight": [4096, 8192]})
    why = eagle3_fit.why_not(str(spec), str(big_target), ram_bytes=16 * 2**30)
    assert why == f"the EAGLE-3 head {spec} is in the speculators format, which the trace does not read"
    # a head in the bundled format over the same target: the target's size decides
    (spec / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    why = eagle3_fit.why_not(str(spec), str(big_target), ram_bytes=16 * 2**30)
    assert why is not None and "8.06B parameters in float32" in why and "RAM available: 16.0 GiB" in why, why
    assert "\n" not in why
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
    assert line.startswith("eagle3 forecast skipped: the trace would load 8.06B") and "\n" not in line
    assert study.user_attrs[attrs.EAGLE3_TRACE]["failure"].startswith("not traced:")


@pytest.mark.parametrize("tensors, why", [
    ({"fc.weight": [8, 24], "lm_head.weight": [32000, 8], "d2t": [32000], "t2d": [128256]},
     "carries d2t, lm_head, t2d (a vocabulary of its own)"),
])
def test_a_head_with_its_own_vocabulary_a_hub_id_and_a_qwen_target_are_refused(tmp_path, tensors, why):
    head = _head(tmp_path, {"architectures": ["LlamaForCausalLMEagle3"]}, tensors)
    assert why in eagle3_fit.why_not(str(head), str(demo.TARGET), ram_bytes=2**40)
    assert "not a local folder" in eagle3_fit.why_not("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", str(demo.TARGET))
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    if demo.eagle3_available():
        assert "loads Llama targets only" in eagle3_fit.why_not(str(demo.EAGLE3), str(qwen), ram_bytes=2**40)
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
