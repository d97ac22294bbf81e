"""vLLM's own config code on candidates' engine arguments, no engine started (issue 59).

``built`` turns each candidate's engine keyword arguments into vLLM's whole ``VllmConfig``
(``AsyncEngineArgs(**kwargs).create_engine_config()``: the same Python in the CPU wheel and the CUDA
build) and reads back what vLLM made of it: the model runner it chose, the CUDA-graph mode it kept,
the speculative method, depth and verification it settled on, the KV-cache dtype and quantization, or
the refusal. autotune.core.engine_config says what autotune expects of each, and which differences
mean a candidate the space must not offer.

On a GPU (scripts/gpu_smoke.sh) it runs on the real platform, over every candidate of the space the
user gets, before any engine starts. Without a GPU, tests/cuda_config.py fakes the CUDA platform
around it (tests/test_gpu_space_vllm.py). Run as ``python -m autotune.run.config_check IN.json OUT.json``
(a JSON list of engine keyword arguments in, a list of records out).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any


def summary(vc: Any) -> dict[str, Any]:
    """What vLLM made of one config: the fields a candidate can vary, as vLLM resolved them."""
    sc, cc = vc.speculative_config, vc.compilation_config
    spec: dict[str, Any] = {}
    if sc is not None:
        spec = {"method": sc.method, "k": sc.num_speculative_tokens,
                "rejection_sample_method": getattr(sc, "rejection_sample_method", "standard"),
                "draft_sample_method": getattr(sc, "draft_sample_method", "greedy"),
                "parallel_drafting": bool(getattr(sc, "parallel_drafting", False)),
                "adaptive": bool(getattr(sc, "enable_adaptive_verification", False)),
                "prompt_lookup": [getattr(sc, "prompt_lookup_min", None), getattr(sc, "prompt_lookup_max", None)],
                "suffix": [getattr(sc, k, None) for k in ("suffix_decoding_max_tree_depth",
                                                         "suffix_decoding_max_spec_factor",
                                                         "suffix_decoding_min_token_prob")],
                "schedule": getattr(sc, "num_speculative_tokens_per_batch_size", None)}
    return {"runner": "v2" if vc.use_v2_model_runner else "v1", "mode": cc.cudagraph_mode.name,
            "kv_cache_dtype": vc.cache_config.cache_dtype, "quantization": vc.model_config.quantization,
            "enforce_eager": bool(vc.model_config.enforce_eager), "dtype": str(vc.model_config.dtype),
            "tp": vc.parallel_config.tensor_parallel_size, "pp": vc.parallel_config.pipeline_parallel_size,
            **({"spec": spec} if spec else {})}


def built(kwargs_list: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each engine-argument dict built into a ``VllmConfig`` by vLLM: its ``summary``, or
    ``{"error": ...}`` with vLLM's words. Arguments that are no engine argument (the API server's own,
    such as ``--chat-template``) are left out, as the in-process engine leaves them out."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    out = []
    for kw in kwargs_list:
        try:
            vc = AsyncEngineArgs(**{k: v for k, v in kw.items() if k in fields}).create_engine_config()
            out.append(summary(vc))
        except Exception as e:  # noqa: BLE001 - each refusal is a record, in vLLM's words
            lines = [x.strip() for x in str(e).splitlines() if x.strip()]
            out.append({"error": f"{type(e).__name__}: " + " | ".join(lines[:3])[:500]})
    return out


def main(argv: list[str]) -> int:
    src, dst = (Path(a) for a in argv)
    Path(dst).write_text(json.dumps(built(json.loads(src.read_text()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
