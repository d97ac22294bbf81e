"""The methods vLLM 0.32.0 adds (issue 51): ``dflash`` (a block drafter), ``dspark`` with
``enable_adaptive_verification``, and EAGLE-3's ``parallel_drafting``, offered where the user gives
their drafter, each drafter under the method its config says (autotune.core.drafters), and each
candidate built by vLLM's own config classes:

- as the CUDA build builds it (tests/methods_config.py ``--cuda``: the platform faked, Triton present,
  so vLLM picks its model runner as on a GPU): dflash and dspark run Model Runner V2, EAGLE-3 with
  parallel drafting falls back to V1 (V2 lacks it), EAGLE-3 without it runs V2;
- as the CPU build builds it: dflash and parallel drafting build on V1, dspark is refused ("Model
  Runner V1 does not support: dspark speculative decoding"), which is why the spaces offer it on CUDA only.

Placeholders only (config.json, no weights): nothing here needs a GPU, and nothing runs on one.
What a GPU would add (kernels, CUDA graphs, the drafts' acceptance) is untested on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core.candidate import Candidate, Settings
from autotune.core.drafters import drafter_method
from autotune.core.space import load_space
from conftest import config_code_pythonpath

HERE = Path(__file__).resolve().parent
_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 512,
          "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
_QWEN3 = {**_LLAMA, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32}
_SPECULATORS = {"speculators_config": {"algorithm": "x", "proposal_methods": [{"speculative_tokens": 3}],
                                       "verifier": {"name_or_path": "t"}},
                "transformer_layer_config": {**_QWEN3, "num_hidden_layers": 1}}
PLACEHOLDERS = {
    "target": _LLAMA, "qwen3-target": _QWEN3, "draft": _LLAMA,
    # a DFlash drafter (z-lab/*-DFlash's layout: DFlashDraftModel over Qwen3 layers) under a name that says nothing
    "drafter": {**_QWEN3, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 1, "block_size": 8,
                "dflash_config": {"mask_token_id": 3, "target_layer_ids": [0, 1, 2]}},
    "speculators-drafter": {**_SPECULATORS, "speculators_model_type": "dflash", "aux_hidden_state_layer_ids": [1, 2, 3],
                            "mask_token_id": 3, "draft_vocab_size": 512},
    "dspark-qwen3": {**_QWEN3, "architectures": ["Qwen3DSparkModel"], "num_hidden_layers": 1, "block_size": 8,
                     "mask_token_id": 3, "target_layer_ids": [0, 1, 2], "markov_rank": 8, "enable_confidence_head": True},
    "head": {**_LLAMA, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1},
    "p-head": {**_LLAMA, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "pard_token": 3},
    "speculators-p-head": {**_SPECULATORS, "speculators_model_type": "peagle", "mask_token_id": 3,
                           "transformer_layer_config": {**_LLAMA, "num_hidden_layers": 1}},
}
ARCHS = ("LlamaForCausalLM", "Qwen3ForCausalLM", "DFlashDraftModel", "Qwen3DSparkModel", "LlamaForCausalLMEagle3")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("methods")
    for name, cfg in PLACEHOLDERS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    return {name: str(root / name) for name in PLACEHOLDERS}


def settings(models: dict[str, str], method: str) -> Settings:
    """The study each new method is offered in: the user's drafter for it, over a target it fits."""
    if method == "dspark":
        return Settings(model=models["qwen3-target"], draft_model=models["dspark-qwen3"])
    if method == "dflash":
        return Settings(model=models["target"], draft_model=models["drafter"])
    return Settings(model=models["target"], eagle3_head=models["p-head"])


def test_a_drafters_method_is_read_from_its_config_as_vllm_reads_it(models, vllm_may_inspect_models, tmp_path,
                                                                   monkeypatch):
    """autotune's reading against vLLM's: the speculators format's own method
    (SpeculatorsConfig.extract_vllm_speculative_config), and SpeculativeConfig's detection of a
    drafter given without a method (its name) where vLLM detects one. vLLM's cache starts empty, as on
    a fresh machine: its model inspection then runs in a subprocess (issue 59: this test failed from a
    fresh clone, passing only where an earlier engine test had filled ~/.cache/vllm)."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "fresh-vllm-cache"))
    from vllm.transformers_utils.configs.speculators import SpeculatorsConfig

    from autotune.core.candidate import model_configs

    for name in ("speculators-drafter", "speculators-p-head"):
        cfg = json.loads(Path(models[name], "config.json").read_text())
        assert drafter_method(models[name], model_configs(models[name])) == \
            SpeculatorsConfig.extract_vllm_speculative_config(cfg)["method"]
    got = {name: drafter_method(models[name], model_configs(models[name])) for name in models}
    assert got["drafter"] == got["speculators-drafter"] == "dflash"  # by its architecture, and by speculators
    assert got["dspark-qwen3"] == "dspark" and got["draft"] == "draft_model"
    assert got["p-head"] == got["speculators-p-head"] == got["head"] == "eagle3"
    for name, want in (("dspark-qwen3", "dspark"), ("draft", "draft_model")):
        assert _vllm_detects(models, name) == want == got[name]
    # Given without a method, vLLM finds a DFlash drafter by its name only (a speculators-format one
    # it reads as such only when it is --model): autotune reads the config and passes the method.
    assert _vllm_detects(models, "drafter") == "draft_model"


def _vllm_detects(models: dict[str, str], name: str) -> str:
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs

    target = models["qwen3-target" if "dspark" in name else "target"]
    args = EngineArgs(model=target, speculative_config={"model": models[name], "num_speculative_tokens": 3})
    return args.create_speculative_config(args.create_model_config(), ParallelConfig()).method


def test_the_spaces_offer_each_method_where_the_user_gives_its_drafter(models):
    dflash = settings(models, "dflash")
    assert "dflash_drafter" in dflash.available_models() and "draft_model" not in dflash.available_models()
    for name in ("cpu", "quick", "gpu"):
        s = load_space(name, platform="cuda" if name == "gpu" else "cpu", models=dflash.available_models())
        methods = next(p for p in s.params if p.name == "method").choices
        assert "dflash" in methods and "draft_model" not in methods, (name, methods)
        c = next(c for c in s.grid() if c.method == "dflash")
        spec = c.engine_kwargs(dflash)["speculative_config"]
        assert spec["method"] == "dflash" and spec["model"] == models["drafter"] and c.label.startswith("dflash k=")
    plain = load_space("cpu", platform="cpu", models={"draft_model"})
    assert "method=dflash (needs a --draft-model whose config says dflash (a DFlash block drafter))" in plain.dropped
    # dspark runs on Model Runner V2 only: offered on CUDA, left out on CPU in one line
    dspark = settings(models, "dspark").available_models()
    gpu = load_space("gpu", platform="cuda", models=dspark)
    assert "dspark" in next(p for p in gpu.params if p.name == "method").choices
    assert next(p for p in gpu.params if p.name == "enable_adaptive_verification").choices == (False, True)
    on_cpu = load_space("gpu", platform="cpu", models=dspark)
    assert "method=dspark (needs cuda; this is cpu)" in on_cpu.dropped
    # parallel drafting where the head is trained for it (its config names its masked slots' token)
    for head, values in (("p-head", (False, True)), ("speculators-p-head", (False, True)), ("head", (False,))):
        have = Settings(model=models["target"], eagle3_head=models[head]).available_models()
        for name in ("cpu", "gpu"):
            s = load_space(name, platform="cuda" if name == "gpu" else "cpu", models=have)
            assert next(p for p in s.params if p.name == "parallel_drafting").choices == values, (head, name)
    c = Candidate({"method": "eagle3", "num_speculative_tokens": 3, "parallel_drafting": True})
    assert c.engine_kwargs(settings(models, "eagle3"))["speculative_config"]["parallel_drafting"] is True
    assert c.label == "eagle3 k=3 parallel"
    assert "parallel_drafting" not in Candidate({**c.params, "parallel_drafting": False}).engine_kwargs(
        settings(models, "eagle3"))["speculative_config"]  # vLLM's default: the same engine as leaving it out


def _candidates(models: dict[str, str]) -> list[tuple[str, Candidate, dict]]:
    """Every value of each new method's own knobs, at the gpu space's baseline engine knobs; EAGLE-3
    with and without parallel drafting."""
    out = []
    for method in ("dflash", "dspark", "eagle3"):
        s = settings(models, method)
        space = load_space("gpu", platform="cuda", models=s.available_models())
        base = space.baseline
        for c in space.grid():
            same_engine = all(c.params.get(k) == v for k, v in base.items() if k != "method")
            if c.method == method and same_engine and c.params.get("rejection_sample_method", "standard") == "standard" \
                    and (method != "eagle3" or c.params["num_speculative_tokens"] == 3):
                out.append((method, c, c.engine_kwargs(s)))
    return out


def _build(models: dict[str, str], tmp_path: Path, cuda: bool) -> list[tuple[str, Candidate, dict]]:
    cands = _candidates(models)
    (tmp_path / "job.json").write_text(json.dumps({"architectures": list(ARCHS), "kwargs": [kw for *_, kw in cands]}))
    env = {**os.environ, "PYTHONPATH": config_code_pythonpath()}
    r = subprocess.run([sys.executable, str(HERE / "methods_config.py"), str(tmp_path / "job.json"),
                        *(["--cuda"] if cuda else [])], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    return [(m, c, rec) for (m, c, _), rec in zip(cands, got)]


def test_each_new_method_builds_as_a_cuda_config_on_the_runner_the_cuda_build_picks(models, tmp_path):
    built = _build(models, tmp_path, cuda=True)
    assert {m for m, *_ in built} == {"dflash", "dspark", "eagle3"}
    assert {c.params.get("enable_adaptive_verification") for m, c, _ in built if m == "dspark"} == {False, True}
    for method, c, rec in built:
        assert "error" not in rec, f"{c.label}: {rec['error']}"
        assert rec["platform"] == "FakeHopper" and rec["k"] == c.params["num_speculative_tokens"], (c.label, rec)
        assert rec["method"] == method and rec["adaptive"] == bool(c.params.get("enable_adaptive_verification"))
        # V2 unless a feature it lacks is asked for: EAGLE's parallel drafting runs V1 (dflash and
        # dspark draft in parallel natively, on V2)
        want = "V1" if c.params.get("parallel_drafting") else "V2"
        assert rec["runner"] == want, (c.label, rec)
        assert rec["parallel_drafting"] == (method in ("dflash", "dspark") or bool(c.params.get("parallel_drafting")))
    print(f"\n{len(built)} candidates built as CUDA configs: "
          + ", ".join(sorted({f'{c.label.split()[0]}{" parallel" if c.params.get("parallel_drafting") else ""}'
                              f'->{r["runner"]}' for _, c, r in built})))


def test_on_the_cpu_build_dflash_and_parallel_drafting_build_and_dspark_is_refused(models, tmp_path):
    built = _build(models, tmp_path, cuda=False)
    for method, c, rec in built:
        if method == "dspark":
            assert "Model Runner V1 does not support: dspark speculative decoding" in rec.get("error", ""), rec
        else:
            assert "error" not in rec and rec["runner"] == "V1", (c.label, rec)


def test_a_new_method_is_measured_without_a_forecast_said_in_one_line():
    from autotune.forecast.forecast import AcceptanceTable

    outputs = [{"id": "a", "prompt_token_ids": [1, 2, 3], "token_ids": [4, 5, 6, 7]}]
    table = AcceptanceTable(outputs, None, 1024, eagle3={"a": {"drafts": [[5, 6], [6, 7], [7, 8]], "beyond": []}})
    assert table.get({"method": "eagle3", "num_speculative_tokens": 2}) is not None
    for params in ({"method": "dflash", "num_speculative_tokens": 2}, {"method": "dspark", "num_speculative_tokens": 2},
                   {"method": "eagle3", "num_speculative_tokens": 2, "parallel_drafting": True}):
        assert table.get(params) is None
        why = table.why_not(params["method"], params)
        assert "no forecast" in why and why.endswith("measured") and "\n" not in why, why
