"""The KV cache a study's engines need on CPU, sized from the models and the load, not the machine.

vLLM's CPU worker takes ``--gpu-memory-utilization`` as a share of the host's RAM and fills it
with KV cache at every start: 0.3 of a 24 GiB host is 4.6 GiB for the 11 MB demo target, and
with it a served start took 40.9 s against 26.2 s sized (benchmarks/data/kv_budget.json). An explicit
``kv_cache_memory_bytes`` (vLLM's ``--kv-cache-memory-bytes``) of what the study can hold in
flight measures the same steps (the cache's size changes which blocks are free, not the
kernels) and also skips the CPU worker's profiling forward pass in eager mode.
"""

from __future__ import annotations

from autotune.core.candidate import model_configs
from autotune.core.load import LoadPattern

# The widest KV element vLLM's CPU cache stores (a float32 model; bfloat16 and fp8 take less).
_WIDEST_BYTES = 4
MARGIN = 2  # room over the estimate: block rounding, prefix-cache blocks kept between requests
FLOOR = 256 * 2**20  # below this the saving is nothing and a mis-read config would bite


def kv_bytes_per_token(model: str) -> int | None:
    """Bytes one token's keys and values take in the model's attention layers (at float32), from
    its config.json; None when the config does not say (a hub id not in the local cache, an
    unusual architecture)."""
    for c in model_configs(model):
        layers, heads = c.get("num_hidden_layers"), c.get("num_attention_heads")
        if not (isinstance(layers, int) and isinstance(heads, int) and layers > 0 and heads > 0):
            continue
        kv_heads = c.get("num_key_value_heads") or heads
        head_dim = c.get("head_dim") or (c.get("hidden_size") or 0) // heads
        if isinstance(kv_heads, int) and isinstance(head_dim, int) and kv_heads > 0 and head_dim > 0:
            return 2 * layers * kv_heads * head_dim * _WIDEST_BYTES
    return None


def kv_cache_bytes(models: list[str], context: int, in_flight: int) -> int | None:
    """KV bytes for ``in_flight`` requests of up to ``context`` tokens each in every model that keeps
    a cache (the target and its draft or EAGLE head share vLLM's one budget), with ``MARGIN``;
    None when a model's size per token is unknown (the caller keeps vLLM's share of RAM)."""
    per_token = [kv_bytes_per_token(m) for m in models]
    if not models or any(p is None for p in per_token) or context <= 0:
        return None
    need = sum(p for p in per_token if p is not None) * context * max(1, in_flight) * MARGIN
    return max(FLOOR, need)


SAMPLED_IN_FLIGHT = 8  # autotune.run.replay.sampled_draws: the distribution test's draws in flight at most


def most_in_flight(loads: list[LoadPattern], n_requests: int, samples: int) -> int:
    """The most requests a study's engine holds at once: a closed loop's limit, every request for
    the open loads (batch, poisson, replay), and the distribution test's draws."""
    peak = [x.concurrency if x.kind in ("concurrency", "ramp") else n_requests for x in loads]
    return max([1, *peak, SAMPLED_IN_FLIGHT if samples else 1])
