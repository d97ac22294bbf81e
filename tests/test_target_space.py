"""The space fitted to the target (autotune.core.target_space): a pre-quantized target is not offered
the quantization knob; a tensor-parallel target's drafts are offered draft_tensor_parallel_size."""

import json
from pathlib import Path

from autotune.cli.search import SearchOptions, prepare
from autotune.core.candidate import Candidate, Settings
from autotune.core.space import load_space
from autotune.core.target_space import declared_quantization, fit_to_target

NEEDS = {"draft_model", "eagle_head", "eagle3_head", "sampled_requests"}


def _model(tmp_path: Path, quantized: bool) -> str:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    if quantized:
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    d = tmp_path / ("fp8-model" if quantized else "model")
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_a_pre_quantized_target_is_not_offered_the_quantization_knob(tmp_path):
    gpu = load_space("gpu", platform="cuda", models=NEEDS, tags={"cuda"})
    assert any(p.name == "quantization" for p in gpu.params)
    quantized = _model(tmp_path, True)
    assert declared_quantization(quantized) == "fp8" and declared_quantization(_model(tmp_path, False)) is None
    sp, notes = fit_to_target(gpu, quantized)
    assert not any(p.name == "quantization" for p in sp.params) and "quantization" not in sp.baseline
    assert notes == [f"quantization: not searched: {quantized} is already quantized (fp8, its config's "
                     "quantization_config), and vLLM serves it so"]
    assert fit_to_target(gpu, str(tmp_path / "model")) == (gpu, [])  # not quantized: unchanged


def test_a_tensor_parallel_target_offers_its_drafts_one_gpu_or_all(tmp_path):
    gpu = load_space("gpu", platform="cuda", models=NEEDS, tags={"cuda"})
    model = _model(tmp_path, False)
    assert fit_to_target(gpu, model, tensor_parallel=1) == (gpu, [])
    sp, notes = fit_to_target(gpu, model, tensor_parallel=4)
    p = next(p for p in sp.params if p.name == "draft_tensor_parallel_size")
    assert p.choices == (4, 1) and "draft_model" in p.when["method"] and "ngram" not in p.when["method"]
    assert notes and notes[0].startswith("draft_tensor_parallel_size: 4 (the target's) or 1")
    # it lands in the speculative config, where vLLM's SpeculativeConfig takes it (1 or the target's)
    kw = Candidate({"method": "draft_model", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}
                   ).engine_kwargs(Settings(model=model, draft_model=model))
    assert kw["speculative_config"]["draft_tensor_parallel_size"] == 1
    from vllm.config.speculative import SpeculativeConfig

    assert "draft_tensor_parallel_size" in SpeculativeConfig.__dataclass_fields__


def test_search_says_the_knob_is_left_out_before_any_engine(tmp_path):
    p = prepare(SearchOptions(workload=Path("examples/smoke.jsonl"), model=_model(tmp_path, True),
                              space="tests/data/fake_space.yaml", results=tmp_path / "res"))
    assert not any(x.name == "quantization" for x in p.space.params)
    assert any("quantization: not searched" in n and "already quantized (fp8" in n for n in p.notes)
