"""A candidate configuration, and the one place it becomes vLLM engine keyword arguments."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.core import snapshots
from autotune.core.drafters import drafters, parallel_drafting

# Methods that need a model the user supplies (autotune.core.drafters: each drafter under the method
# its config says), and what a space's ``needs:`` calls that drafter.
NEEDS_FOR_METHOD = {"draft_model": "draft_model", "eagle": "eagle_head", "eagle3": "eagle3_head",
                    "dflash": "dflash_drafter", "dspark": "dspark_drafter"}
SPEC_METHODS = ("ngram", "draft_model", "suffix", "eagle", "eagle3", "mtp", "dflash", "dspark")
METHODS = ("none", *SPEC_METHODS)
# Keys a search space may set, by where they go in vLLM's arguments.
SPEC_KEYS = ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
             "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor",
             "suffix_decoding_min_token_prob", "suffix_decoding_max_cached_requests",
             "num_speculative_tokens_per_batch_size",
             "rejection_sample_method", "draft_sample_method",
             "draft_tensor_parallel_size",  # offered where the target runs tensor parallel (autotune.core.target_space)
             "parallel_drafting",  # EAGLE heads trained for it (P-EAGLE): every draft token in one pass (V1 only)
             "enable_adaptive_verification")  # dspark: verify fewer drafts where the drafter is unsure (V2 only)
# vLLM's own values for the lossless verification knobs: they change only sampled requests (a greedy
# request accepts a draft token exactly when it is the target's argmax, whichever the method), so a
# candidate at these values is the same engine as one that leaves them out.
SPEC_DEFAULTS = {"rejection_sample_method": "standard", "draft_sample_method": "greedy", "parallel_drafting": False,
                 "enable_adaptive_verification": False}
ENGINE_KEYS = ("dtype", "kv_cache_dtype", "quantization", "enforce_eager", "max_num_seqs",
               "max_num_batched_tokens")
COMPILATION_KEYS = ("cudagraph_mode",)
KEYS = ("method", *SPEC_KEYS, *ENGINE_KEYS, *COMPILATION_KEYS)
# Suffix decoding's knobs in a candidate's label.
SUFFIX_LABELS = (("suffix_decoding_max_tree_depth", "depth"), ("suffix_decoding_max_spec_factor", "factor"),
                 ("suffix_decoding_min_token_prob", "prob"), ("suffix_decoding_max_cached_requests", "cached"))
# Knobs that change the numbers on purpose: such candidates are judged by a drift budget.
LOSSY = {"kv_cache_dtype": ("auto",), "quantization": ("none", None), "dtype": ("default",)}
# Values that mean "leave this to the study's settings / vLLM's default".
UNSET = {"quantization": "none", "dtype": "default"}


@dataclass(frozen=True)
class Settings:
    """What stays fixed across a study: the model, its helpers and the memory budget."""

    model: str
    draft_model: str | None = None
    eagle_head: str | None = None
    eagle3_head: str | None = None
    tokenizer: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None  # vLLM's --kv-cache-memory-bytes (autotune.core.kv_budget)
    seed: int = 0
    trust_remote_code: bool = False
    # The user's own `vllm serve` flags, fixed in every trial (autotune.core.serving_flags): vLLM's
    # argument names, JSON values, as vLLM's parser read them.
    serve_flags: dict[str, Any] = field(default_factory=dict)

    def available_models(self) -> set[str]:
        """What the space's ``needs:`` can ask for: user-supplied drafters (by the method each one's
        config says: autotune.core.drafters), a head trained for parallel drafting, the model's own MTP layers,
        MoE layers (what vLLM's int8 weight-only quantization on CPU works on), and the optional
        packages a method needs here (Arctic Inference for suffix decoding)."""
        found = self.drafters()
        have = {NEEDS_FOR_METHOD[m] for m in found if m in NEEDS_FOR_METHOD}
        if "eagle3" in found and parallel_drafting(model_configs(found["eagle3"])):
            have.add("parallel_drafting_head")
        have |= {name for name in OPTIONAL_PACKAGES if package_installed(name)}
        if model_has_mtp(self.model):
            have.add("mtp_layers")
        if model_is_moe(self.model):
            have.add("moe_layers")
        return have

    def drafters(self) -> dict[str, str]:
        """Method -> the drafter this study has for it (autotune.core.drafters)."""
        return drafters(self, model_configs)


# Packages a method needs beyond vLLM, by import name: a space asks with ``needs: <name>``.
OPTIONAL_PACKAGES = ("arctic_inference",)  # suffix decoding's tree (vllm/v1/spec_decode/suffix_decoding.py)


def package_installed(name: str) -> bool:
    """Whether ``import name`` would find the package (found, not imported: no vLLM import here)."""
    from importlib.util import find_spec

    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# vLLM reads the MTP depth from these config keys (DeepSeek-V3, GLM-4.5, MiMo, Qwen3-Next, ...).
_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
# Expert counts of mixture-of-experts configs (Mixtral, Qwen-MoE, DeepSeek, ...).
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def model_configs(model: str) -> list[dict[str, Any]]:
    """The model's config.json (and its text_config), or nothing when it cannot be read.

    Local folders are read directly; a hub id from where autotune fetched it (the user's
    ``--download-dir`` or ``--revision``: autotune.core.snapshots), else from the local Hugging Face
    cache only (no network here: any earlier vLLM run of the model puts its config there).
    """
    where = snapshots.fetched(model)
    cfg = (where or Path(model)) / "config.json"
    if not cfg.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model, "config.json")
        except Exception:  # not a valid repo id, or no huggingface_hub: nothing known
            return []
        if not isinstance(cached, str):
            return []
        cfg = Path(cached)
    try:
        data = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return [data, data.get("text_config") or {}] if isinstance(data, dict) else []


def _has(model: str, keys: tuple[str, ...]) -> bool:
    return any(isinstance(c.get(k), int) and c[k] > 0 for c in model_configs(model) for k in keys)


def model_has_mtp(model: str) -> bool:
    """Whether the model's config.json declares multi-token-prediction layers."""
    return _has(model, _MTP_KEYS)


def mtp_layers(model: str) -> int | None:
    """How many MTP layers the model's config declares (vLLM's ``n_predict`` for its MTP draft), or None."""
    counts = [c[k] for c in model_configs(model) for k in _MTP_KEYS if isinstance(c.get(k), int) and c[k] > 0]
    return max(counts) if counts else None


def model_is_moe(model: str) -> bool:
    """Whether the model has mixture-of-experts layers (vLLM's CPU int8 weight-only quantizes only those)."""
    return _has(model, _MOE_KEYS)


def schedule_text(ranges: list[list[int]]) -> str:
    """A depth schedule in one word: ``[[1, 2, 4], [3, 256, 1]]`` -> ``4@1-2,1@3+``."""
    last = max(r[1] for r in ranges)
    return ",".join(f"{k}@{a}" + ("+" if b == last else "" if a == b else f"-{b}") for a, b, k in ranges)


@dataclass(frozen=True)
class Candidate:
    """One point of the search space: plain parameter values, keyed as in the space YAML."""

    params: dict[str, Any]

    @property
    def method(self) -> str:
        return self.params.get("method", "none")

    @property
    def lossy(self) -> bool:
        """True when the candidate changes numerics on purpose (quantization, KV dtype)."""
        return any(k in self.params and self.params[k] not in ok for k, ok in LOSSY.items())

    @property
    def label(self) -> str:
        """Short human name, e.g. ``ngram k=4 lookup=2..4 kv=fp8 eager``."""
        p, parts = self.params, [self.method]
        if p.get("num_speculative_tokens_per_batch_size"):
            parts.append("k=" + schedule_text(p["num_speculative_tokens_per_batch_size"]))
        elif "num_speculative_tokens" in p:
            parts.append(f"k={p['num_speculative_tokens']}")
        if "prompt_lookup_max" in p:
            parts.append(f"lookup={p.get('prompt_lookup_min', 1)}..{p['prompt_lookup_max']}")
        for key, short in SUFFIX_LABELS:
            if key in p:
                parts.append(f"{short}={p[key]:g}")
        for key, short in (("rejection_sample_method", "verify"), ("draft_sample_method", "drafts")):
            if p.get(key, SPEC_DEFAULTS[key]) != SPEC_DEFAULTS[key]:
                parts.append(f"{short}={p[key]}")
        for key, word in (("parallel_drafting", "parallel"), ("enable_adaptive_verification", "adaptive")):
            if p.get(key):
                parts.append(word)
        if "draft_tensor_parallel_size" in p:
            parts.append(f"draft-tp={p['draft_tensor_parallel_size']}")
        if p.get("dtype", "default") != "default":
            parts.append(p["dtype"])
        if p.get("kv_cache_dtype", "auto") != "auto":
            parts.append(f"kv={p['kv_cache_dtype']}")
        if p.get("quantization", "none") not in ("none", None):
            parts.append(f"q={p['quantization']}")
        if "cudagraph_mode" in p:
            parts.append(f"cg={p['cudagraph_mode']}")
        if "enforce_eager" in p:
            parts.append("eager" if p["enforce_eager"] else "compiled")
        return " ".join(parts)

    def key(self) -> str:
        """Canonical identity, to tell when two trials measure the same configuration."""
        return json.dumps(self.params, sort_keys=True)

    def engine_kwargs(self, settings: Settings) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` / ``AsyncEngineArgs``. The only place this mapping lives."""
        kw: dict[str, Any] = {"model": settings.model}
        for name in ("tokenizer", "dtype", "max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes"):
            if getattr(settings, name) is not None:
                kw[name] = getattr(settings, name)
        kw["seed"] = settings.seed
        if settings.trust_remote_code:
            kw["trust_remote_code"] = True
        kw.update(settings.serve_flags)  # never a key set around it: collisions are refused or removed from the space
        for key in ENGINE_KEYS:
            if key in self.params and self.params[key] != UNSET.get(key):
                kw[key] = self.params[key]
        compilation = {k: self.params[k] for k in COMPILATION_KEYS if k in self.params}
        if compilation:
            kw["compilation_config"] = compilation
        if self.method != "none":
            spec: dict[str, Any] = {"method": self.method}
            if self.method in NEEDS_FOR_METHOD:
                spec["model"] = settings.drafters().get(self.method)
            spec.update({k: self.params[k] for k in SPEC_KEYS if k in self.params
                         and self.params[k] != SPEC_DEFAULTS.get(k)})
            kw["speculative_config"] = spec
        return kw
