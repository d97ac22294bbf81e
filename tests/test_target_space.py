"""The space fitted to the target (autotune.core.target_space): a pre-quantized target is not offered
the quantization knob; a tensor-parallel target's drafts are not offered draft_tensor_parallel_size 1,
which vLLM 0.32 honours on no runner (held to vLLM's own code)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cli.search import SearchOptions, prepare
from autotune.core.space import Param, load_space
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


def test_draft_tp_1_is_not_offered_under_tensor_parallel_2(tmp_path):
    gpu = load_space("gpu", platform="cuda", models=NEEDS, tags={"cuda"})
    model = _model(tmp_path, False)
    assert fit_to_target(gpu, model, tensor_parallel=1) == (gpu, [])
    assert fit_to_target(gpu, model, tensor_parallel=2) == (gpu, [])  # nothing added
    # a space that names it keeps only the target's own size: the knob is left out, in one line
    named = replace(gpu, params=(*gpu.params, Param("draft_tensor_parallel_size", choices=(2, 1))))
    sp, notes = fit_to_target(named, model, tensor_parallel=2)
    assert not any(p.name == "draft_tensor_parallel_size" for p in sp.params)
    assert notes == ["draft_tensor_parallel_size: not searched: vLLM 0.32 runs every draft on the target's 2 GPU(s) "
                     "whatever it is set to (V1 refuses another size, V2 and EAGLE ignore it)"]


def test_vllm_0_32_honours_no_draft_tp_below_the_targets(tmp_path):
    """vLLM's config takes draft TP 1 under target TP 2, but: V1's draft proposer refuses it (its own
    check, on that config); V2's draft speculator and every EAGLE drafter never size the draft by it
    (vLLM's code reading ``draft_parallel_config``: the V1 draft proposer, V2's standalone draft and
    DSpark speculators only), and V2's draft layers shard over the global tensor-parallel group."""
    import inspect
    from types import SimpleNamespace

    import vllm
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.linear import ColumnParallelLinear
    from vllm.v1.spec_decode.draft_model import DraftModelProposer

    from test_gpu_space_valid import placeholder_models

    settings, _ = placeholder_models(tmp_path)
    args = EngineArgs(model=settings.model, skip_tokenizer_init=True, speculative_config={
        "method": "draft_model", "model": settings.draft_model, "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": 1})
    spec = args.create_speculative_config(args.create_model_config(), ParallelConfig(tensor_parallel_size=2))
    assert spec.draft_parallel_config.tensor_parallel_size == 1  # the config takes it
    with pytest.raises(ValueError, match="must be the same. Got 1 and 2"):  # V1 refuses it
        DraftModelProposer._raise_if_draft_tp_mismatch(SimpleNamespace(speculative_config=spec))
    root = Path(vllm.__file__).parent
    readers = {str(p.relative_to(root)) for p in (root / "v1").rglob("*.py") if "draft_parallel_config" in p.read_text()}
    assert readers == {"v1/spec_decode/draft_model.py", "v1/worker/gpu/spec_decode/standalone_ar/speculator.py",
                       "v1/worker/gpu/spec_decode/dspark/utils.py"}  # no EAGLE drafter among them
    v2 = (root / "v1/worker/gpu/spec_decode/standalone_ar/speculator.py").read_text()
    assert "spec.draft_parallel_config,\n                rank=self.vllm_config.parallel_config.rank" in v2
    assert "get_tensor_model_parallel_world_size()" in inspect.getsource(ColumnParallelLinear.__init__)


def test_search_says_the_knob_is_left_out_before_any_engine(tmp_path):
    p = prepare(SearchOptions(workload=Path("examples/smoke.jsonl"), model=_model(tmp_path, True),
                              space="tests/data/fake_space.yaml", results=tmp_path / "res"))
    assert not any(x.name == "quantization" for x in p.space.params)
    assert any("quantization: not searched" in n and "already quantized (fp8" in n for n in p.notes)


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_mtp_searches_the_depths_vllm_takes_for_the_models_mtp_layers(tmp_path, layers, vllm_may_inspect_models):
    """vLLM refuses an MTP depth above the model's MTP layers (n_predict) that is no multiple of them
    (issue 59: the gpu space searched 1..7 whatever the model). Each depth the fitted space offers is
    built by vLLM's own SpeculativeConfig; with one layer every depth runs (it is reused)."""
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs

    from autotune.core.candidate import Settings
    from test_gpu_space_valid import _DEEPSEEK_MTP

    d = tmp_path / f"mtp{layers}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**_DEEPSEEK_MTP, "num_nextn_predict_layers": layers}))
    gpu = load_space("gpu", platform="cuda", models={"mtp_layers", "draft_model"}, tags={"cuda"})
    sp, notes = fit_to_target(gpu, str(d))
    grid = sp.grid()
    offered = sorted({c.params["num_speculative_tokens"] for c in grid if c.method == "mtp"})
    others = sorted({c.params["num_speculative_tokens"] for c in grid if c.method == "ngram"})
    assert others == list(range(1, 8))  # the other methods keep the space's range

    def vllm_takes(k: int) -> bool:
        args = EngineArgs(model=str(d), speculative_config={"method": "mtp", "num_speculative_tokens": k})
        try:
            args.create_speculative_config(args.create_model_config(), ParallelConfig())
            return True
        except ValueError as e:
            assert "must be divisible by n_predict" in str(e)
            return False

    assert all(vllm_takes(k) for k in offered), offered
    if layers == 1:
        assert offered == list(range(1, 8)) and notes == []
    else:
        assert offered == list(range(1, layers + 1))
        assert notes == [f"num_speculative_tokens: mtp searches 1..{layers}, the model's {layers} MTP layers (vLLM takes "
                         f"a deeper k only as a multiple of {layers}, reusing them)"]
        assert not vllm_takes(layers + 1)  # what the space offered before, refused
    # Optuna draws each method's depth from its own range under one name
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(40):
        c = sp.suggest(study.ask())
        if c.method == "mtp":
            assert c.params["num_speculative_tokens"] in offered
