"""Whether a trial's decode steps ran under CUDA graphs, from the compilation config vLLM resolved.

A speculative decode step of ``c`` requests verifies ``k + 1`` tokens each: ``c * (k + 1)`` tokens.
vLLM 0.32 runs a step under a captured graph when its token count is at most the largest capture
size (padded up to the next size); past it, or under cudagraph mode NONE (eager), the step runs
without graphs and costs more. The rule depends on the model runner (autotune.core.runner):

- V1 (``VLLM_USE_V2_MODEL_RUNNER=0``, suffix decoding, EAGLE parallel drafting): with FULL decode
  graphs vLLM first rounds its capture sizes to multiples of ``k + 1`` and drops those above the
  ceiling (``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``, called from
  ``resolve_cudagraph_mode_and_sizes`` in the GPU worker, after the front end has built its
  config), for every graph: ``spec_capture_sizes`` mirrors that rule. A PIECEWISE decode mode keeps
  the sizes as they are.
- V2 (the CUDA build's default) skips that rounding (``use_v2_model_runner=True``): its graph manager
  (``CudaGraphManager._init_candidates``, vllm/v1/worker/gpu/cudagraph_utils.py) captures FULL
  decode graphs at each size rounded up to a multiple of ``k + 1`` that stays under the ceiling, and
  its mixed graphs (PIECEWISE under FULL_AND_PIECEWISE; FULL, PIECEWISE) at every size as resolved;
  a decode step runs under whichever covers its token count (``dispatch``).

A trial measured with decode outside the graphs is slower than the config serves where its batches
fit, and is said so. Both rules are checked against vLLM's own code on CPU (tests/test_cudagraphs.py);
untested on a GPU.
"""

from __future__ import annotations

from typing import Any

FULL_DECODE = {"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}  # CUDAGraphMode.decode_mode() == FULL
SEPARATE = {"FULL_DECODE_ONLY": "NONE", "FULL_AND_PIECEWISE": "PIECEWISE"}  # decode routine apart: the mixed mode


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def spec_capture_sizes(sizes: list[int], ceiling: int, query_len: int) -> list[int]:
    """The capture sizes after vLLM's rounding for a speculative step of ``query_len`` tokens a request."""
    if not sizes or query_len <= 1:
        return sorted(sizes)
    rounded = sorted({_round_up(s, query_len) for s in sizes if _round_up(s, query_len) <= ceiling})
    if not rounded and query_len <= ceiling:
        rounded = [query_len]
    return rounded


def v2_ceiling(mode: str, sizes: list[int], ceiling: int, query_len: int) -> int:
    """The most tokens a uniform decode step may have and run under a graph on Model Runner V2."""
    if mode == "NONE" or not sizes:
        return 0
    mixed = SEPARATE.get(mode, mode)  # FULL and PIECEWISE: one routine for every batch, at each size
    top = max(sizes) if mixed != "NONE" else 0
    if mode in SEPARATE:  # FULL decode graphs at each size rounded up to k+1, under the ceiling
        top = max([top, *(r for s in sizes if (r := _round_up(s, query_len)) <= ceiling)])
    return top


def depth_at(schedule: list[list[int]] | None, batch: int, k: int) -> int:
    """The depth vLLM drafts at ``batch`` requests under a depth schedule (``num_speculative_tokens_per_
    batch_size``: inclusive [start, end, depth] ranges), as its dense lookup reads it
    (``build_dynamic_sd_schedule_lookup``, vllm/v1/spec_decode/dynamic/utils.py): the range holding the
    batch, a gap or the tail carrying the previous range's depth, never above ``k``. No schedule: ``k``."""
    last = None
    for start, end, depth in sorted((int(a), int(b), int(d)) for a, b, d in schedule or []):
        if batch < start:
            break
        last = depth
        if batch <= end:
            break
    return k if last is None else min(k, last)


def decode_coverage(graphs: dict[str, Any], k: int, batch_sizes: list[int], runner: str | None = None,
                    schedule: list[list[int]] | None = None) -> dict[str, Any]:
    """Which of ``batch_sizes`` (requests decoding together) run their decode step under graphs.

    ``graphs``: ``{"mode": CUDAGraphMode name, "capture_sizes": [...], "max_capture_size": int}`` as
    the trial's engine resolved them (autotune.run.served_engine.resolved_cudagraphs); ``runner``:
    the model runner the engine ran ("v1", "v2"; None: V1, what trials recorded before runners were).
    ``schedule``: a depth schedule, under which a step of ``c`` requests verifies ``depth_at(c) + 1``
    tokens each. V2 captures FULL decode graphs for every depth the schedule can give
    (``CudaGraphManager._init_candidates``: one query length per scheduled depth), so each batch is
    checked at its own query length; V1 rounds its sizes for ``k + 1`` alone, and a batch at a
    smaller depth fits them by its token count.
    """
    mode, q = str(graphs.get("mode") or "NONE"), k + 1
    sizes = [int(s) for s in graphs.get("capture_sizes") or []]
    ceiling = int(graphs.get("max_capture_size") or (max(sizes) if sizes else 0))
    queries = {c: depth_at(schedule, c, k) + 1 for c in batch_sizes}
    if runner == "v2":
        tops = {c: v2_ceiling(mode, sizes, ceiling, queries[c]) for c in batch_sizes}
    else:
        if mode in FULL_DECODE:
            sizes = spec_capture_sizes(sizes, ceiling, q)
        tops = dict.fromkeys(batch_sizes, max(sizes) if sizes and mode != "NONE" else 0)
    outside = sorted({c for c in batch_sizes if c * queries[c] > tops[c]})
    top = v2_ceiling(mode, sizes, ceiling, q) if runner == "v2" else (max(sizes) if sizes and mode != "NONE" else 0)
    out = {"mode": mode, "query_len": q, "ceiling": top, "outside": outside, "runner": runner or "v1"}
    if schedule:  # the query length and ceiling each batch was held to
        out["by_batch"] = {str(c): [queries[c], tops[c]] for c in sorted(batch_sizes)}
    return out


def coverage_line(cov: dict[str, Any]) -> str | None:
    """One clause for a trial's line when some decode ran without graphs, else None."""
    if not cov.get("outside"):
        return None
    if cov["mode"] == "NONE" or not cov["ceiling"]:
        return f"decode ran without CUDA graphs (cudagraph_mode {cov['mode']})"
    c = cov["outside"][0]
    q, top = (cov.get("by_batch") or {}).get(str(c), (cov["query_len"], cov["ceiling"]))
    return (f"decode outside CUDA graphs at batch {c}: {c} x (k+1={q}) = {c * q} tokens "
            f"> capture ceiling {top} ({cov['mode']}); raise max_cudagraph_capture_size or lower the depth")
