"""The gpu space, checked without a GPU (issue 25, item 5).

Every grid point of ``search_spaces/gpu.yaml``, resolved as on a CUDA machine that has every
``needs:`` (a draft, both EAGLE heads, an MTP model, sampled requests, Arctic Inference), is turned
into engine arguments and put through vLLM's own config validation, as far as the CPU build
constructs it:

- the exported ``vllm serve`` command, read back by vLLM's serve parser (``engine_args_from_serve``):
  every flag known, ``--kv-cache-dtype`` among its choices, ``--compilation-config`` built into a
  ``CompilationConfig``; and the same keyword arguments as ``AsyncEngineArgs(**kwargs)`` (the path
  the workers take), both reading back the values the candidate set;
- each value against vLLM's own types: ``kv_cache_dtype`` in ``CacheDType`` (and a ``CacheConfig``
  built with it), ``quantization`` in ``QUANTIZATION_METHODS`` with a registered config class (the
  parser takes any string here), the speculative config's keys among ``SpeculativeConfig``'s
  fields, its method in ``SpeculativeMethod``, its verification knobs in their literals;
- vLLM's own ``EngineArgs.create_model_config`` and ``create_speculative_config``, which build the
  ``SpeculativeConfig`` itself, draft ``ModelConfig`` and EAGLE/MTP config rewrites included. The
  models are placeholders: folders holding only a tiny ``config.json`` (a Llama target, draft and
  heads; a DeepSeek-V3 target with one MTP layer), so no weights and no network are needed;
- ``EngineArgs.create_engine_config`` (the whole ``VllmConfig``) for one candidate per distinct
  speculative config and per distinct engine knob combination. This runs under the CPU platform,
  which rewrites the CUDA-only parts (``cudagraph_mode`` becomes NONE): it checks that the pieces
  fit together, not what CUDA would make of them. Triton is present, as in the CUDA build
  (``HAS_TRITON`` patched in ``vllm.config.vllm``), so vLLM picks each config's model runner as on a
  GPU, and that runner is the one autotune expects (autotune.core.runner: V2, V1 for suffix).

What needs a GPU is not checked: CUDA kernels' support for fp8 weights or an fp8 KV cache on a
given GPU, CUDA graph capture, and the attention backends' choices.

Nothing here starts an engine (no `engine` marker); vLLM is imported once, by a module fixture.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import io
import json
import logging
import os
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args

import pytest
import yaml

from autotune.core import runner
from autotune.core.candidate import Candidate, Settings
from autotune.serve.export import serve_argv
from autotune.core.space import SPACES_DIR, SearchSpace, load_space

GPU_YAML = SPACES_DIR / "gpu.yaml"
# Every need a search space may ask for today; the test adds any other the gpu space names.
NEEDS = {"draft_model", "eagle_head", "eagle3_head", "mtp_layers", "moe_layers", "sampled_requests",
         "arctic_inference", "model_runner_v2"}

_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 2,
          "vocab_size": 512, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
# A DeepSeek-V3 with one MTP layer: the target an `mtp` candidate drafts with (vLLM reads its
# num_nextn_predict_layers and builds the DeepSeekMTPModel draft from the same folder).
_DEEPSEEK_MTP = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 64,
                 "intermediate_size": 128, "moe_intermediate_size": 32, "num_attention_heads": 2,
                 "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 512,
                 "max_position_embeddings": 1024, "n_routed_experts": 4, "num_experts_per_tok": 2,
                 "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 16,
                 "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16, "n_group": 1, "topk_group": 1,
                 "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-6}


# Block drafters, each with a drafter (and dspark a Qwen3 target) of its own: built as CPU and CUDA
# configs in tests/test_methods_valid.py, not with this file's placeholders.
OWN_DRAFTERS = ("dflash", "dspark")


class Invalid(AssertionError):
    """vLLM's config validation refused a gpu-space candidate (the message says where)."""


def _needs(path: Path) -> set[str]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {n for p in data["params"].values() for c in p.get("choices", ()) if isinstance(c, dict) and "needs" in c
            for n in ([c["needs"]] if isinstance(c["needs"], str) else c["needs"])}


def gpu_space(path: Path = GPU_YAML) -> SearchSpace:
    """The gpu space as a CUDA machine with every model and package it can ask for resolves it."""
    return load_space(str(path), platform="cuda", models=NEEDS | _needs(path), tags={"cuda"})


@pytest.fixture(autouse=True)
def _vllm_may_inspect_models(vllm_may_inspect_models):
    """vLLM's config code may inspect a model in a subprocess (conftest.config_code_pythonpath)."""


@pytest.fixture(scope="module")
def v(tmp_path_factory):
    """vLLM's pieces (imported once), the placeholder models, and caches for repeated sub-configs."""
    env = dict(os.environ)
    log = logging.getLogger("vllm")
    level = log.level
    log.setLevel(logging.ERROR)  # a warning per candidate ("fp8 is deprecated ...") would flood the log
    with pytest.MonkeyPatch.context() as mp:
        import vllm.config.speculative as speculative
        import vllm.config.vllm as vllm_config
        from vllm.config import CacheConfig, CompilationConfig, ParallelConfig, SpeculativeConfig
        from vllm.config.cache import CacheDType
        from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

        from autotune import vllm_cli

        mp.setattr(vllm_config, "HAS_TRITON", True)  # the CUDA build has Triton: its runner choice
        mp.delenv(runner.ENV, raising=False)
        parser = vllm_cli.serve_parser()  # seconds to build: once, then engine_args_from_serve reuses it
        mp.setattr(vllm_cli, "serve_parser", lambda: parser)
        arctic = speculative.has_arctic_inference()
        if not arctic:  # suffix decoding's config check asks for the package; its values are what is tested
            mp.setattr(speculative, "has_arctic_inference", lambda: True)

        settings, mtp_settings = placeholder_models(tmp_path_factory.mktemp("placeholder_models"))
        assert "mtp_layers" in mtp_settings.available_models()  # autotune offers mtp for it, as vLLM drafts from it

        spec_fields = {f.name for f in dataclasses.fields(SpeculativeConfig) if f.init} - {
            "target_model_config", "target_parallel_config", "draft_model_config", "draft_parallel_config"}
        yield SimpleNamespace(
            AsyncEngineArgs=AsyncEngineArgs, CacheConfig=CacheConfig, CompilationConfig=CompilationConfig,
            ParallelConfig=ParallelConfig, engine_args_from_serve=vllm_cli.engine_args_from_serve,
            get_quantization_config=get_quantization_config, arctic=arctic,
            engine_fields={f.name for f in dataclasses.fields(EngineArgs)},
            cache_dtypes=set(get_args(CacheDType)), quantizations=set(QUANTIZATION_METHODS),
            spec_fields=spec_fields, spec_methods=set(get_args(speculative.SpeculativeMethod)),
            spec_literals={"rejection_sample_method": set(get_args(speculative.RejectionSampleMethod)),
                           "draft_sample_method": set(get_args(speculative.DraftSampleMethod))},
            settings=settings, mtp_settings=mtp_settings,
            seen={"values": {}, "engine": set(), "spec_methods": set(), "runners": {}})
    log.setLevel(level)
    os.environ.clear()
    os.environ.update(env)  # whatever vLLM's config code set stays in this module


def _once(v, kind: str, key: Any, build) -> Any:
    """``build()`` once per distinct ``key``: the grid repeats sub-configs many times over."""
    cache = v.seen["values"].setdefault(kind, {})
    if key not in cache:
        cache[key] = build()
    return cache[key]


def _stage(where: str, what: str, fn, *args, **kwargs) -> Any:
    """Run one validation step; any refusal (argparse's exit included) becomes ``Invalid``."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return fn(*args, **kwargs)
    except Invalid:
        raise
    except (Exception, SystemExit) as e:
        said = err.getvalue().strip().splitlines()  # argparse says why on stderr, then exits
        why = said[-1] if isinstance(e, SystemExit) and said else f"{type(e).__name__}: {e}"
        raise Invalid(f"{where}: {what}: {why}") from e


def check_kwargs(v, kw: dict[str, Any], where: str, *, whole: bool = False) -> None:
    """Put one candidate's engine keyword arguments through vLLM's config validation."""
    kw = copy.deepcopy(kw)
    unknown = set(kw) - v.engine_fields
    if unknown:
        raise Invalid(f"{where}: not EngineArgs fields: {sorted(unknown)}")
    argv = serve_argv(kw)
    parsed = _stage(where, f"vLLM's serve parser refused `vllm serve {shlex.join(argv)}`", v.engine_args_from_serve,
                    argv)
    direct = _stage(where, "AsyncEngineArgs(**engine_kwargs) refused them", v.AsyncEngineArgs, **copy.deepcopy(kw))

    # Both read back what the candidate set (a flag vLLM renamed or ignores would not).
    for name, value in kw.items():
        if name == "compilation_config":
            continue
        if not getattr(parsed, name) == getattr(direct, name) == value:
            raise Invalid(f"{where}: {name}: set {value!r}, the serve parser read {getattr(parsed, name)!r}, "
                          f"AsyncEngineArgs {getattr(direct, name)!r}")
    compilation = kw.get("compilation_config") or {}
    cc = _once(v, "compilation", json.dumps(compilation, sort_keys=True),
               lambda: _stage(where, f"CompilationConfig(**{compilation}) refused it", v.CompilationConfig,
                              **compilation))
    for name, value in compilation.items():
        got = getattr(cc, name)
        if isinstance(got, enum.Enum) and got.name != value:  # no alias or case folding let through
            raise Invalid(f"{where}: compilation_config.{name}: set {value!r}, vLLM read {got.name!r}")
        if not getattr(parsed.compilation_config, name) == getattr(direct.compilation_config, name) == got:
            raise Invalid(f"{where}: compilation_config.{name}: the serve parser and AsyncEngineArgs read it "
                          "differently from CompilationConfig")

    # Values against vLLM's own types, where its parser does not check them.
    if "kv_cache_dtype" in kw:
        dtype = kw["kv_cache_dtype"]
        if dtype not in v.cache_dtypes:
            raise Invalid(f"{where}: kv_cache_dtype {dtype!r} is not one of vLLM's CacheDType {sorted(v.cache_dtypes)}")
        _once(v, "cache", dtype, lambda: _stage(where, f"CacheConfig(cache_dtype={dtype!r})", v.CacheConfig,
                                                cache_dtype=dtype))
    if "quantization" in kw:
        q = kw["quantization"]
        if q not in v.quantizations:
            raise Invalid(f"{where}: quantization {q!r} is not one of vLLM's QUANTIZATION_METHODS")
        _once(v, "quantization", q, lambda: _stage(where, f"no quantization config for {q!r}",
                                                   v.get_quantization_config, q))
    spec = kw.get("speculative_config")
    if spec is not None:
        if set(spec) - v.spec_fields:
            raise Invalid(f"{where}: speculative_config keys that are no SpeculativeConfig field: "
                          f"{sorted(set(spec) - v.spec_fields)}")
        if spec.get("method") not in v.spec_methods:
            raise Invalid(f"{where}: speculative method {spec.get('method')!r} is not one of vLLM's SpeculativeMethod")
        for name, allowed in v.spec_literals.items():
            if name in spec and spec[name] not in allowed:
                raise Invalid(f"{where}: speculative_config.{name} {spec[name]!r} is not one of {sorted(allowed)}")

    # vLLM's own EngineArgs steps: the target's ModelConfig, then the SpeculativeConfig from it.
    def build() -> Any:
        model_config = _stage(where, "EngineArgs.create_model_config", parsed.create_model_config)
        sc = _stage(where, "EngineArgs.create_speculative_config (SpeculativeConfig)", parsed.create_speculative_config,
                    model_config, v.ParallelConfig())
        if spec is not None:
            if sc.method != spec["method"] or sc.num_speculative_tokens != spec["num_speculative_tokens"]:
                raise Invalid(f"{where}: SpeculativeConfig has method={sc.method!r} k={sc.num_speculative_tokens}")
            v.seen["spec_methods"].add(sc.method)
        return sc

    _once(v, "model", (kw["model"], kw.get("quantization"), json.dumps(spec, sort_keys=True)), build)

    if whole:  # the whole VllmConfig, under the CPU platform (see the module docstring)
        ea = _stage(where, "AsyncEngineArgs(**engine_kwargs)", v.AsyncEngineArgs, **copy.deepcopy(kw))
        vc = _stage(where, "EngineArgs.create_engine_config (VllmConfig, CPU platform)", ea.create_engine_config)
        if (spec is None) != (vc.speculative_config is None):
            raise Invalid(f"{where}: VllmConfig.speculative_config is {vc.speculative_config!r}")
        chose = runner.V2 if vc.use_v2_model_runner else runner.V1
        want, why = runner.expected(spec, triton=True, env={})
        if chose != want:
            raise Invalid(f"{where}: vLLM runs it on {runner.name(chose)}; autotune expects {runner.name(want)} ({why})")
        method = (spec or {}).get("method", "none") + (" parallel" if (spec or {}).get("parallel_drafting") else "")
        v.seen["runners"].setdefault(method, set()).add(chose)


def settings_for(v, c: Candidate) -> Settings:
    return v.mtp_settings if c.method == "mtp" else v.settings


def check(v, c: Candidate, *, whole: bool = False) -> None:
    check_kwargs(v, c.engine_kwargs(settings_for(v, c)), c.label, whole=whole)


def check_space(v, space: SearchSpace) -> tuple[int, list[str]]:
    """Every grid point; the whole VllmConfig for the first point of each distinct speculative config
    and of each distinct engine knob combination. Returns (candidates checked, failures)."""
    failures: list[str] = []
    grid = space.grid()
    whole_keys: set[str] = set()
    for c in grid:
        if c.method in OWN_DRAFTERS:
            continue
        kw = c.engine_kwargs(settings_for(v, c))
        keys = {"spec:" + json.dumps(kw.get("speculative_config"), sort_keys=True),
                "engine:" + json.dumps({k: x for k, x in kw.items() if k != "speculative_config"}, sort_keys=True)}
        whole = not keys <= whole_keys
        whole_keys |= keys
        try:
            check(v, c, whole=whole)
        except Invalid as e:
            failures.append(str(e))
        if whole:
            v.seen["engine"].add(c.key())
    return len(grid), failures


def test_the_gpu_space_resolves_whole_on_cuda_with_every_need():
    space = gpu_space()
    assert space.dropped == (), f"left out on CUDA with every need met: {space.dropped}"
    methods = next(p for p in space.params if p.name == "method").choices
    assert {"ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp"} <= set(methods)


def test_every_gpu_candidate_passes_vllms_config_validation(v):
    space = gpu_space()
    n, failures = check_space(v, space)
    assert not failures, f"{len(failures)} of {n} gpu-space candidates refused by vLLM:\n" + "\n".join(failures[:20])
    # Every value of every knob reached vLLM (the grid visits each; a knob that never did was not tested).
    grid = space.grid()
    for p in space.params:
        assert {c.params.get(p.name) for c in grid} >= set(p.values()), p.name
    methods = set(next(p for p in space.params if p.name == "method").choices) - {"none", *OWN_DRAFTERS}
    assert v.seen["spec_methods"] == methods  # a SpeculativeConfig was built for each method
    assert len(v.seen["engine"]) >= len(methods)
    # the CUDA build's runner per method, as vLLM chose it with Triton present
    assert v.seen["runners"]["none"] == v.seen["runners"]["ngram"] == v.seen["runners"]["eagle3"] == {"v2"}
    assert v.seen["runners"]["suffix"] == {"v1"}
    assert v.seen["runners"].get("eagle3 parallel", {"v1"}) == {"v1"}  # V2 lacks parallel drafting
    print(f"\n{n} gpu-space candidates validated; {len(v.seen['values']['model'])} distinct target+speculative "
          f"configs built; {len(v.seen['engine'])} whole VllmConfigs built (CPU platform)"
          + ("" if v.arctic else "; Arctic Inference not installed: suffix config checked with its import faked"))


# Typos a hand edit could make, each in the engine arguments of a candidate of the right method.
TYPOS = {
    "speculative key": ("eagle3", lambda kw: kw["speculative_config"].update(
        num_speculative_token=kw["speculative_config"].pop("num_speculative_tokens")),
        "keys that are no SpeculativeConfig field: \\['num_speculative_token'\\]"),
    "speculative method": ("eagle3", lambda kw: kw["speculative_config"].update(method="eagle_3"),
                           "speculative method 'eagle_3'"),
    "verification knob": ("ngram", lambda kw: kw["speculative_config"].update(rejection_sample_method="blocks"),
                          "rejection_sample_method 'blocks'"),
    "suffix knob out of range": ("suffix", lambda kw: kw["speculative_config"].update(
        suffix_decoding_min_token_prob=3.0), "suffix_decoding_min_token_prob=3.0 must be in \\[0, 1\\]"),
    "cudagraph mode": ("ngram", lambda kw: kw["compilation_config"].update(cudagraph_mode="PIECEWISSE"),
                       "PIECEWISSE"),
    "compilation key": ("ngram", lambda kw: kw.update(compilation_config={"cudagraph_modes": "PIECEWISE"}),
                        "cudagraph_modes"),
    "kv cache dtype": ("draft_model", lambda kw: kw.update(kv_cache_dtype="fp8_e4m4"),
                       "invalid choice: 'fp8_e4m4'"),
    "quantization": ("mtp", lambda kw: kw.update(quantization="fp-8"), "quantization 'fp-8' is not one of"),
    "engine flag": ("none", lambda kw: kw.update(kv_cache_dtypes="fp8"), "not EngineArgs fields"),
}


@pytest.mark.parametrize("typo", list(TYPOS))
def test_a_typo_in_a_candidates_engine_arguments_fails(v, monkeypatch, typo):
    method, edit, message = TYPOS[typo]
    c = next(c for c in gpu_space().grid() if c.method == method and c.params.get("cudagraph_mode") == "PIECEWISE"
             and c.params.get("rejection_sample_method", "standard") == "standard")
    check(v, c)  # the candidate as the space makes it passes

    real = Candidate.engine_kwargs

    def misspelt(self, settings):
        kw = real(self, settings)
        edit(kw)
        return kw

    monkeypatch.setattr(Candidate, "engine_kwargs", misspelt)
    with pytest.raises(Invalid, match=message):
        check(v, c)


def _misspell(value: Any) -> Any:
    """Two letters swapped (``PIECEWISE`` -> ``PIECEWIES``), or a probability above 1."""
    return value[:-2] + value[-1] + value[-2] if isinstance(value, str) else value + 1.0


@pytest.mark.parametrize("param", ["cudagraph_mode", "kv_cache_dtype", "quantization", "rejection_sample_method",
                                   "suffix_decoding_min_token_prob"])
def test_a_typo_in_a_copy_of_gpu_yaml_fails(v, tmp_path, param):
    data = yaml.safe_load(GPU_YAML.read_text(encoding="utf-8"))
    choices = data["params"][param]["choices"]
    base = data["baseline"].get(param)
    i = next(i for i, x in enumerate(choices) if (x["value"] if isinstance(x, dict) else x) != base)
    old = choices[i]["value"] if isinstance(choices[i], dict) else choices[i]
    typo = _misspell(old)
    if isinstance(choices[i], dict):
        choices[i]["value"] = typo
    else:
        choices[i] = typo
    edited = tmp_path / "gpu.yaml"
    edited.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    space = gpu_space(edited)  # autotune itself takes it: only vLLM knows the value is wrong
    bad = [c for c in space.grid() if c.params.get(param) == typo]
    assert bad
    for c in bad[:3]:
        with pytest.raises(Invalid, match=str(typo)):
            check(v, c)
    check(v, next(c for c in space.grid() if c.params.get(param) not in (None, typo)))  # the rest still pass


def placeholder_models(root: Path) -> tuple[Settings, Settings]:
    """config.json-only stand-ins for every model the gpu space names (a Llama target, draft and heads;
    a DeepSeek target with MTP layers): the settings with all of them, and the MTP target's."""
    for name, cfg in (("target", _LLAMA), ("draft", _LLAMA), ("eagle_head", _LLAMA), ("eagle3_head", _LLAMA),
                      ("mtp_target", _DEEPSEEK_MTP)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(cfg))
    return (Settings(model=str(root / "target"), draft_model=str(root / "draft"),
                     eagle_head=str(root / "eagle_head"), eagle3_head=str(root / "eagle3_head")),
            Settings(model=str(root / "mtp_target")))
