"""What the gpu space offers, read against vLLM's config code (issue 59): what vLLM refuses or
silently changes is not offered. Each rule here failed at 54ab4cd; the whole space is built by vLLM's
own config code under a faked CUDA platform in tests/test_gpu_space_vllm.py.

- dspark's adaptive verification: vLLM refuses it without full CUDA graphs, under pipeline
  parallelism and with LoRA (``VllmConfig._validate_adaptive_verification``), and the user's
  ``--enforce-eager`` runs every graph mode as NONE (``VllmConfig.__post_init__``): offered under
  FULL_AND_PIECEWISE only, and under those flags neither it nor the graph modes are searched.
"""

from __future__ import annotations

import types

import pytest

from autotune.cli.serving import apply_serving_flags
from autotune.core.candidate import Settings
from autotune.core.space import load_space, reload_space

HAVE = {"dspark_drafter", "draft_model", "sampled_requests", "model_runner_v2"}


def _gpu():
    return load_space("gpu", platform="cuda", models=HAVE, tags={"cuda"})


def _flags(*argv: str):
    o = types.SimpleNamespace(serve_flags=argv, serve_config=None)
    return apply_serving_flags(o, Settings(model="fake-model"), _gpu())


def test_adaptive_verification_is_offered_only_with_full_cuda_graphs():
    grid = _gpu().grid()
    adaptive = {c.params.get("cudagraph_mode") for c in grid if c.params.get("enable_adaptive_verification")}
    assert adaptive == {"FULL_AND_PIECEWISE"}
    # dspark itself still runs under every graph mode, without it
    assert {c.params["cudagraph_mode"] for c in grid if c.method == "dspark"} == {"FULL_AND_PIECEWISE", "PIECEWISE",
                                                                                   "NONE"}


@pytest.mark.parametrize("argv,graphs", [(("--enforce-eager",), False), (("--pipeline-parallel-size", "2"), True),
                                         (("--enable-lora",), True)])
def test_under_flags_vllm_refuses_it_with_adaptive_verification_is_not_searched(argv, graphs):
    _, space, _, notes = _flags(*argv)
    names = {p.name for p in space.params}
    assert "enable_adaptive_verification" not in names
    assert ("cudagraph_mode" in names) == graphs  # --enforce-eager: every mode would run as NONE
    assert not any(c.params.get("enable_adaptive_verification") for c in space.grid())
    assert any(n.startswith("enable_adaptive_verification: not searched: vLLM refuses it under") for n in notes), notes
    if not graphs:
        assert "cudagraph_mode: not searched: --enforce-eager: vLLM runs every cudagraph_mode as NONE" in notes
        assert "cudagraph_mode" not in space.baseline
    # a study's space reloads as it ran (resumes, reports)
    again = reload_space(space.resolved)
    assert [c.key() for c in again.grid()] == [c.key() for c in space.grid()]


def test_without_such_flags_the_space_is_whole():
    _, space, _, notes = _flags("--max-num-seqs", "8")
    assert {"enable_adaptive_verification", "cudagraph_mode"} <= {p.name for p in space.params}
    assert not any("not searched" in n for n in notes)


def test_a_medusa_or_mlp_speculator_drafter_is_said_to_be_unsearched_and_why(tmp_path):
    """vLLM 0.33 removed medusa and mlp_speculator (issue 59: autotune's notes said they "run on V2
    now"): such a drafter is not tried, and one line says why, naming its flag."""
    import json

    from autotune.core.candidate import model_configs
    from autotune.core.drafters import unsearched
    from autotune.run.vllm_touchpoints import RULES

    for kind in ("medusa", "mlp_speculator"):
        d = tmp_path / kind
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": kind, "architectures": ["MedusaModel"]}))
        settings = Settings(model="fake-model", draft_model=str(d))
        assert "draft_model" not in settings.available_models()
        line, = unsearched(settings, model_configs)
        assert line.startswith(f"--draft-model {d}: not searched: ") and "vLLM 0.33 removed it" in line
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    assert unsearched(Settings(model="fake-model", draft_model=str(plain)), model_configs) == []
    said = " ".join(RULES["vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features"].values())
    assert "run on V2 now" not in said and "removed both methods" in said
