"""What vLLM's config must make of a candidate's engine arguments, and where it did otherwise (issue 59).

autotune.run.config_check builds each candidate into vLLM's ``VllmConfig`` and reads back a summary;
this module compares it with what the candidate asked for. A difference is a candidate the space must
not offer: vLLM refused it, or silently ran another config than the one the study labels and records
(three CUDA-graph modes run as NONE under ``--enforce-eager``; ``block`` verification, which Model
Runner V1's sampler reads as standard). The model runner is held to autotune.core.runner's
expectation, which every trial's record and line rest on. Pure data: no vLLM here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.core import runner

# What a candidate's speculative config asks, and where vLLM's summary keeps it (run.config_check.summary).
_SPEC_ASKS = (("method", "method", None), ("num_speculative_tokens", "k", None),
              ("rejection_sample_method", "rejection_sample_method", "standard"),
              ("draft_sample_method", "draft_sample_method", "greedy"),
              ("enable_adaptive_verification", "adaptive", False))


def mismatches(kwargs: Mapping[str, Any], built: Mapping[str, Any], *, platform: str,
               env: Mapping[str, str]) -> list[str]:
    """Where vLLM's build of ``kwargs`` (``built``: a config_check record) is not what the candidate
    asked for or autotune expects, one phrase each; empty when it is."""
    if "error" in built:
        return [f"vLLM refused it: {built['error']}"]
    out: list[str] = []
    mode = (kwargs.get("compilation_config") or {}).get("cudagraph_mode")
    if mode is not None and built["mode"] != mode:
        out.append(f"cudagraph_mode {mode} ran as {built['mode']}")
    spec = kwargs.get("speculative_config")
    got = built.get("spec")
    if (spec is None) != (got is None):
        out.append("speculation " + ("dropped" if got is None else "added") + " by vLLM")
    if spec and got:
        for key, field, default in _SPEC_ASKS:
            if spec.get(key, default) != got.get(field, default):
                out.append(f"{key} {spec.get(key, default)!r} became {got.get(field, default)!r}")
        if spec.get("parallel_drafting") and not got.get("parallel_drafting"):
            out.append("parallel_drafting dropped")
        if got.get("rejection_sample_method") == "block" and built["runner"] == runner.V1:
            out.append("block verification on Model Runner V1, whose sampler verifies it as standard")
    want, why = runner.expected(spec, triton=runner.has_triton(platform), env=env)
    if built["runner"] != want:
        out.append(f"vLLM runs it on {runner.name(built['runner'])}; autotune expects {runner.name(want)} ({why})")
    if kwargs.get("kv_cache_dtype", "auto") != built["kv_cache_dtype"]:
        out.append(f"kv_cache_dtype {kwargs.get('kv_cache_dtype', 'auto')!r} became {built['kv_cache_dtype']!r}")
    if kwargs.get("quantization") is not None and kwargs["quantization"] != built["quantization"]:
        out.append(f"quantization {kwargs['quantization']!r} became {built['quantization']!r}")
    return out


def collapsed(kwargs_list: Sequence[Mapping[str, Any]], builds: Sequence[Mapping[str, Any]],
              labels: Sequence[str]) -> list[str]:
    """Distinct candidates that vLLM built into one config (the same summary): one line per group.
    The study would measure one engine under several labels and call their difference a finding."""
    seen: dict[str, list[str]] = {}
    for kw, b, label in zip(kwargs_list, builds, labels):
        if "error" not in b:
            seen.setdefault(json.dumps(b, sort_keys=True), []).append(label)
    return [f"{', '.join(group)}: one engine, as vLLM builds them" for group in seen.values() if len(group) > 1]
