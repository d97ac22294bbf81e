"""Whether a trial's decode steps ran under CUDA graphs, from the compilation config vLLM resolved.

A speculative decode step of ``c`` requests verifies ``k + 1`` tokens each: ``c * (k + 1)`` tokens.
vLLM 0.32 runs a step under a captured graph when its token count is at most the largest capture
size (padded up to the next size); past it, or under cudagraph mode NONE (eager), the step runs
without graphs and costs more. With FULL decode graphs, vLLM first rounds its capture sizes to
multiples of ``k + 1`` and drops those above the ceiling (``CompilationConfig.
adjust_cudagraph_sizes_for_spec_decode``, called from ``resolve_cudagraph_mode_and_sizes`` in the
GPU worker, after the front end has built its config): ``spec_capture_sizes`` mirrors that rule. A
PIECEWISE decode mode keeps the sizes as they are. A trial measured with decode outside the graphs
is slower than the config serves where its batches fit, and is said so. Rule read from vLLM's
code; untested on a GPU.
"""

from __future__ import annotations

from typing import Any

FULL_DECODE = {"FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}  # CUDAGraphMode.decode_mode() == FULL


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


def decode_coverage(graphs: dict[str, Any], k: int, batch_sizes: list[int]) -> dict[str, Any]:
    """Which of ``batch_sizes`` (requests decoding together) run their decode step under graphs.

    ``graphs``: ``{"mode": CUDAGraphMode name, "capture_sizes": [...], "max_capture_size": int}`` as
    the trial's engine resolved them (autotune.run.served_engine.resolved_cudagraphs).
    """
    mode, q = str(graphs.get("mode") or "NONE"), k + 1
    sizes = [int(s) for s in graphs.get("capture_sizes") or []]
    ceiling = int(graphs.get("max_capture_size") or (max(sizes) if sizes else 0))
    if mode in FULL_DECODE:
        sizes = spec_capture_sizes(sizes, ceiling, q)
    top = max(sizes) if sizes and mode != "NONE" else 0
    outside = sorted({c for c in batch_sizes if c * q > top})
    return {"mode": mode, "query_len": q, "ceiling": top, "outside": outside}


def coverage_line(cov: dict[str, Any]) -> str | None:
    """One clause for a trial's line when some decode ran without graphs, else None."""
    if not cov.get("outside"):
        return None
    if cov["mode"] == "NONE" or not cov["ceiling"]:
        return f"decode ran without CUDA graphs (cudagraph_mode {cov['mode']})"
    c = cov["outside"][0]
    return (f"decode outside CUDA graphs at batch {c}: {c} x (k+1={cov['query_len']}) = {c * cov['query_len']} tokens "
            f"> capture ceiling {cov['ceiling']} ({cov['mode']}); raise max_cudagraph_capture_size or lower the depth")
