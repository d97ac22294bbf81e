"""Measuring hooks mixed into vLLM's worker (``worker_extension_cls``): never part of an exported config.

Suffix decoding keeps a cache of every response the engine served, across requests. A trial
replays the same workload in every window (and its warm-up sends the first requests), so from the
second window on the cache holds the very responses about to be generated and drafts them whole:
measured on the demo, a suffix trial's windows differed by ~10% and its speedup was well above
what a fresh server (``confirm``) or the forecast (an empty cache) gives. Each window starts
with an empty cache instead, as it starts with a cold prefix cache: requests of one window still
draft from the earlier requests of that window, as on a server. Importable without vLLM.
"""

from __future__ import annotations

from typing import Any

QUALNAME = "autotune.run.vllm_ext.MeasureExtension"
RESET = "autotune_reset_drafter_state"  # the worker method's name, for collective_rpc
STATEFUL_METHODS = ("suffix",)  # proposers whose state outlives a request


class MeasureExtension:
    """Methods vLLM adds to its worker when ``--worker-extension-cls`` names this class."""

    def autotune_reset_drafter_state(self) -> int:
        """Empty a suffix-decoding drafter's cache (as vLLM builds it at start); 1 if there was one."""
        drafter: Any = getattr(getattr(self, "model_runner", None), "drafter", None)
        if getattr(drafter, "suffix_cache", None) is None:
            return 0
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        old = drafter.suffix_cache
        drafter.suffix_cache = SuffixDecodingCache(max_tree_depth=old.max_tree_depth,
                                                   max_cached_requests=old.max_cached_requests)
        return 1


def needs_reset(engine_kwargs: dict[str, Any]) -> bool:
    """Whether a candidate's proposer keeps state across requests (and so across windows)."""
    return (engine_kwargs.get("speculative_config") or {}).get("method") in STATEFUL_METHODS
