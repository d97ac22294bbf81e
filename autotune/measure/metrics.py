"""RawRun -> Measurement: latency and throughput with the definitions of `vllm bench serve`.

TTFT = first token chunk - request start; E2E = last chunk - start;
TPOT = (E2E - TTFT) / (output tokens - 1); ITL = gaps between successive chunks, pooled
over requests (a speculative burst arrives as one chunk carrying several tokens);
throughput = output tokens / makespan of the measured window.
TPOT and ITL time tokens only where the stream delivered each engine step as it came: in a window whose
tokens arrived in bursts (autotune.measure.coalescing.stream_coalesced) they are not measured (NaN, with
the reason), and a run's are the median over the windows that were measured.
Acceptance comes from vLLM's counters diffed around the window: acceptance fraction
(accepted / drafted tokens) and mean accepted length (1 + accepted / drafts) are different
numbers and both are reported, plus the acceptance rate by draft position.
"""

from __future__ import annotations

import math
from itertools import zip_longest
from typing import Any

from autotune.core.records import Measurement, RawRun, Window
from autotune.measure.acceptance import acceptance as spec_acceptance
from autotune.measure.coalescing import step_tokens, stream_coalesced, unstepped_share
from autotune.measure.objectives import DIRECTIONS, MAD, STATS, WINDOWS, metric_key, parse_key

import numpy as np


def _summary(name: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {f"{name}_{s}": float("nan") for s, _ in STATS}
    arr = np.asarray(values) * 1000.0
    return {f"{name}_{s}": float(arr.mean() if q is None else np.percentile(arr, q)) for s, q in STATS}


def complete(rec: dict[str, Any]) -> bool:
    """A request counts only if it finished on its own terms with no error."""
    return rec.get("error") is None and rec.get("finish_reason") in ("stop", "length") and bool(rec["chunks"])


def request_latency(rec: dict[str, Any]) -> tuple[float, float, float | None, int]:
    """One complete request's (TTFT, E2E, TPOT, output tokens) from its chunk timestamps, in
    seconds: first chunk - start, last chunk - start, (E2E - TTFT) / (tokens - 1) (None for a
    one-token answer). The one place these are derived from a request record."""
    n = sum(c[1] for c in rec["chunks"])
    ttft, e2e = rec["chunks"][0][0] - rec["start"], rec["chunks"][-1][0] - rec["start"]
    return ttft, e2e, (e2e - ttft) / (n - 1) if n > 1 else None, n


def measure(raw: Window) -> Measurement:
    """Compile one measured window (requests, window_s, spec_counters) into flat metrics."""
    recs = raw["requests"]
    done = [r for r in recs if complete(r)]
    ttft, tpot, itl, e2e = [], [], [], []
    out_tokens = 0
    for r in done:
        first, last, per_token, n = request_latency(r)
        out_tokens += n
        ttft.append(first)
        e2e.append(last)
        if per_token is not None:
            tpot.append(per_token)
        times = [c[0] for c in r["chunks"]]
        itl.extend(b - a for a, b in zip(times, times[1:]))
    window = raw["window_s"]
    step = step_tokens(raw.get("spec_counters"))
    coalesced = stream_coalesced(done, step=step)
    if coalesced:  # the client timed bursts, not tokens: no TPOT or ITL from this window
        tpot, itl = [], []
    m: dict[str, Any] = {
        "requests": len(recs), "completed": len(done), "incomplete": len(recs) - len(done),
        "output_tokens": out_tokens, "window_s": window,
        "output_tok_s": out_tokens / window if window > 0 else 0.0,
        "req_s": len(done) / window if window > 0 else 0.0,
    }
    for name, values in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2e_ms", e2e)):
        m.update(_summary(name, values))
    share = unstepped_share(done, step=step)
    m["unstepped_share"] = float("nan") if share is None else share
    m["windows_coalesced"] = int(coalesced is not None)
    m.update(acceptance(raw.get("spec_counters") or {}))
    m["prefill_share"] = prefill_share(raw.get("spec_counters") or {})
    return m


def prefill_share(c: dict[str, Any]) -> float:
    """The share of the engine's request time spent in prefill, from vLLM's own prefill and decode
    time histograms (diffed over the window): NaN where they were not read. Unlike TTFT / E2E it
    does not depend on how the stream reached the client (a lagging API process merges chunks)."""
    pre, dec = c.get("vllm:request_prefill_time_seconds"), c.get("vllm:request_decode_time_seconds")
    if pre is None or dec is None or pre + dec <= 0:
        return float("nan")
    return float(pre / (pre + dec))


def acceptance(c: dict[str, Any]) -> dict[str, Any]:
    """Speculation statistics from diffed vLLM counters (NaN when nothing was drafted)."""
    drafts = c.get("vllm:spec_decode_num_drafts", 0)
    drafted = c.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = c.get("vllm:spec_decode_num_accepted_tokens", 0)
    per_pos = c.get("vllm:spec_decode_num_accepted_tokens_per_pos", [])
    return {"spec_drafts": drafts, "spec_draft_tokens": drafted, "spec_accepted_tokens": accepted,
            **spec_acceptance(drafts, drafted, accepted, per_pos)}


# Metrics whose spread across windows is reported (median absolute deviation).
SPREAD = ("output_tok_s", "req_s", "ttft_ms_p50", "ttft_ms_p95", "tpot_ms_p50", "itl_ms_p50", "e2e_ms_p50",
          "e2e_ms_p95")
# Metrics whose per-window series is kept: every objective (and the forecast's prefill share), so a
# record pooled over engine instances re-derives each from all windows (``pool``).
WINDOWED = (*DIRECTIONS, "prefill_share")
NOISY_SHARE = 0.03  # a throughput MAD above 3% of the median makes a ranking untrustworthy


def noisy(throughputs: list[float]) -> bool:
    """Windows whose throughput MAD exceeds NOISY_SHARE of their median (one window can't tell)."""
    if len(throughputs) < 2:
        return False
    arr = np.asarray(throughputs, dtype=float)
    med = float(np.median(arr))
    return bool(med and float(np.median(np.abs(arr - med))) / med > NOISY_SHARE)


def _sum_counters(windows: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for w in windows:
        for k, v in (w.get("spec_counters") or {}).items():
            if isinstance(v, list):
                prev = total.get(k, [])
                total[k] = [a + b for a, b in zip(prev + [0] * (len(v) - len(prev)), v)]
            else:
                total[k] = total.get(k, 0) + v
    return total


def measure_run(raw: RawRun | dict[str, Any]) -> Measurement:
    """All windows of a run: the median of each metric, its MAD, and acceptance over all windows.

    One number from one window is not trusted: each window replays the whole workload on a cold
    prefix cache, and the spread says how far a single window can be off. Every metric keeps its
    per-window series (``metric_windows``) so that a record of several engine instances
    (``pool``) re-derives each one from all windows by the same rule.
    """
    per = [measure(w) for w in raw["windows"]]
    m: dict[str, Any] = {}
    for key, value in per[0].items():  # a window that did not measure a metric (NaN) does not vote
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            m[key] = _median([p[key] for p in per])
    for key in SPREAD:
        m[metric_key(key, suffix=MAD)] = _mad(np.asarray([p[key] for p in per], dtype=float))
    for key in WINDOWED:
        m[metric_key(key, suffix=WINDOWS)] = [float(p[key]) for p in per]  # for intervals of ratios (speedup, `check`) and pooling
    m["output_tok_s_instances"] = [m["output_tok_s_windows"]]  # one engine instance; pool() appends the next
    m["windows"] = len(per)
    m["incomplete"] = sum(p["incomplete"] for p in per)
    m["windows_coalesced"] = sum(p["windows_coalesced"] for p in per)
    m["latency_not_measured"] = not_measured(m)
    m["completed"] = sum(p["completed"] for p in per)
    m["requests"] = sum(p["requests"] for p in per)
    m["noisy"] = noisy(m["output_tok_s_windows"])
    m["engine_init_s"], m["warmup_s"] = raw.get("engine_init_s"), raw.get("warmup_s")
    m["started"] = started_of(raw)
    counters = _sum_counters(raw["windows"])
    m.update(acceptance(counters))
    m["spec_accepted_per_pos"] = list(counters.get("vllm:spec_decode_num_accepted_tokens_per_pos", []))
    m.update(kv_pressure(raw))
    return m


def started_of(raw: dict[str, Any]) -> str | None:
    """How the measured engine's process came to exist: "forked" (the study's launcher) or "fresh";
    a served trial's is its `vllm serve`'s, an in-process one's the worker's (autotune.run.engine)."""
    s = raw.get("started") or {}
    return s.get("server") if s.get("server") in ("forked", "fresh") else s.get("worker")


PREEMPTIONS = "vllm:num_preemptions"  # autotune.run.served_engine.PREEMPTIONS (run/ is a floor above)


def kv_pressure(raw: RawRun | dict[str, Any]) -> dict[str, Any]:
    """The engine's KV cache in blocks and the requests vLLM preempted in every measured window (every
    load level): a preempted request gave its KV blocks back and is recomputed, so a trial measured so
    ran short of KV cache (speculation's drafts take KV room too) and is slower than one with room.
    None where the engine did not say (an older record, the fake engine)."""
    windows = list(raw["windows"]) + [w for ws in (raw.get("levels") or {}).values() for w in ws]
    counts = [w["spec_counters"][PREEMPTIONS] for w in windows if PREEMPTIONS in (w.get("spec_counters") or {})]
    return {"kv_cache_blocks": raw.get("kv_cache_blocks"), "preemptions": int(sum(counts)) if counts else None}


def _median(values: Any) -> float:
    """The median of the finite values (NaN: a window that did not measure it); NaN where none is."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    return float(np.median(arr)) if len(arr) else float("nan")


def _mad(arr: np.ndarray) -> float:
    arr = np.asarray(arr, dtype=float)
    arr = arr[np.isfinite(arr)]
    return float(np.median(np.abs(arr - np.median(arr)))) if len(arr) else float("nan")


def not_measured(m: dict[str, Any], level: str | None = None) -> str | None:
    """Why TPOT and ITL are not measured in ``m`` (at load ``level``): every window's stream delivered its
    tokens in bursts (autotune.measure.coalescing); None where a window measured them."""
    n, windows = m.get(metric_key("windows_coalesced", level)) or 0, m.get(metric_key("windows", level)) or 0
    tpot = m.get(metric_key("tpot_ms_p50", level))  # NaN here, None once written to best.json
    if not n or (isinstance(tpot, (int, float)) and math.isfinite(tpot)):
        return None
    return f"tokens reached the client in bursts in {n} of {windows} windows"


def unresolved_latency(m: dict[str, Any]) -> str | None:
    """One line for the console: that ``m`` did not measure TPOT and ITL and why (its stream delivered
    tokens in bursts, at the study's load and at each other level where it did), or None where it did."""
    levels = sorted({parse_key(k)[2] or "" for k in m if parse_key(k)[0] == "latency_not_measured"})
    where = [f"{m[metric_key('windows_coalesced', lvl or None)]} of {m[metric_key('windows', lvl or None)]} windows"
             + (f" at {lvl}" if lvl else "") for lvl in levels if m.get(metric_key("latency_not_measured", lvl or None))]
    return f"TPOT, ITL not measured: tokens reached the client in bursts ({'; '.join(where)})" if where else None


def pool(first: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """One candidate measured on two (or more) engine instances, as one measurement: every metric
    re-derived from the joined windows of all instances by the rule that derived it from one
    instance's windows. That is the median for rates and latencies (``metric_windows`` and
    ``metric_windows@level`` joined, the MAD beside), the worst window for goodput (its own rule in
    autotune.run.evaluate.measure), and summed vLLM counters for acceptance. Intervals from it include
    the spread between instances, which on a shared machine is wider than the spread between windows
    of one engine. Not pooled: ``by_category`` (a breakdown from the first engine; no decision
    rests on it)."""
    m = dict(first)
    for key, values in first.items():
        metric, suffix, level = parse_key(key)
        if suffix != WINDOWS or not isinstance(values, list) or not isinstance(again.get(key), list):
            continue
        joined = [float(v) for v in values + again[key]]
        arr = np.asarray(joined)
        m[key] = joined
        if metric == "goodput":
            m[metric_key(metric, level)] = float(arr.min()) if len(arr) else float("nan")
            continue
        m[metric_key(metric, level)] = _median(arr)
        m[metric_key(metric, level, MAD)] = _mad(arr)
    for key in [k for k in first if k in ("completed", "requests")
                or parse_key(k)[:2] in (("windows", ""), ("incomplete", ""))]:
        m[key] = first[key] + again.get(key, 0)
    for key in [k for k in {**first, **again} if parse_key(k)[:2] == ("windows_coalesced", "")]:
        m[key] = (first.get(key) or 0) + (again.get(key) or 0)
        level = parse_key(key)[2]  # measured where any window of either instance was
        m[metric_key("latency_not_measured", level)] = not_measured(m, level)
    for key in [k for k in first if parse_key(k)[:2] == ("noisy", "")]:
        m[key] = noisy(m.get(metric_key("output_tok_s", parse_key(key)[2], WINDOWS), []))
    m.update(_pooled_acceptance(first, again))
    # A start is not pooled: the record of a re-measure trial carries its own engine's start and
    # warm-up (its trial's row in trials.csv), not the first instance's.
    m["engine_init_s"], m["warmup_s"] = again.get("engine_init_s"), again.get("warmup_s")
    m["started"] = again.get("started")
    if first.get("preemptions") is not None or again.get("preemptions") is not None:  # every instance's windows
        m["preemptions"] = (first.get("preemptions") or 0) + (again.get("preemptions") or 0)
    m["kv_cache_blocks"] = again.get("kv_cache_blocks", first.get("kv_cache_blocks"))
    m["output_tok_s_rounds"] = rounds_of(first) + rounds_of(again)  # before the instances: rounds_of counts them
    m["output_tok_s_instances"] = instances_of(first) + instances_of(again)
    m["instances"] = len(m["output_tok_s_instances"])
    a, b = first.get("output_tok_s_windows"), again.get("output_tok_s_windows")
    if a and b:  # how far one config moved between engine instances: the noise a comparison meets
        before = float(np.median(a))
        moved = abs(float(np.median(b)) / before - 1.0) if before > 0 else 0.0
        m["instance_spread"] = max(moved, first.get("instance_spread", 0.0))
    return m


def instances_of(m: dict[str, Any]) -> list[list[float]]:
    """A measurement's throughput windows per engine instance (a record from before this was kept:
    its windows as one instance)."""
    inst = m.get("output_tok_s_instances")
    return [list(x) for x in inst] if inst else [list(m.get("output_tok_s_windows") or [])]


def _pooled_acceptance(first: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """Acceptance over both instances from their summed counts (what measure_run does over windows)."""
    if "spec_drafts" not in first or "spec_drafts" not in again:
        return {}
    per_pos = [a + b for a, b in zip_longest(first.get("spec_accepted_per_pos") or [],
                                              again.get("spec_accepted_per_pos") or [], fillvalue=0)]
    c = {"vllm:spec_decode_num_drafts": first["spec_drafts"] + again["spec_drafts"],
         "vllm:spec_decode_num_draft_tokens": first["spec_draft_tokens"] + again["spec_draft_tokens"],
         "vllm:spec_decode_num_accepted_tokens": first["spec_accepted_tokens"] + again["spec_accepted_tokens"],
         "vllm:spec_decode_num_accepted_tokens_per_pos": per_pos}
    return {**acceptance(c), "spec_accepted_per_pos": per_pos}


def rounds_of(m: dict[str, Any]) -> list[str | None]:
    """The round each of a measurement's engine instances was measured in ("s1", "h2": the study's
    rounds of fresh engines side by side, autotune.core.attrs.ROUND), None for an instance measured on
    its own (a first trial) or a record from before rounds were kept."""
    n = len(instances_of(m))
    kept = m.get("output_tok_s_rounds")
    return list(kept) if isinstance(kept, list) and len(kept) == n else [None] * n


def round_pairs(cand: dict[str, Any], base: dict[str, Any]) -> list[tuple[str, list[float], list[float]]]:
    """(round, candidate windows, baseline windows) for each round both were measured in: a pair is two
    instances measured next to each other, never instances of other rounds (another pick's, say)."""
    by_round = {r: w for r, w in zip(rounds_of(base), instances_of(base)) if r is not None}
    return [(r, c, by_round[r]) for r, c in zip(rounds_of(cand), instances_of(cand))
            if r is not None and r in by_round and c and by_round[r] and min(by_round[r]) > 0]


def paired_interval(cand: dict[str, Any], base: dict[str, Any], *, level: float = 0.95
                    ) -> tuple[float, float, float, int]:
    """The speedup of ``cand`` over ``base`` (measurements, pooled over engine instances) with the
    rounds both were measured in as the unit (``round_pairs``: side by side, in the one ABBA order of
    autotune.measure.intervals.abba): each pair's ratio is median(cand windows) / median(base windows),
    the figure exp(mean log ratio) with a t-interval on the log ratios (autotune.measure.intervals: a
    bootstrap over 2-4 pairs does not reach its coverage). A first trial is in no round, so the trial
    that selected a config never enters a pair. Returns (ratio, lo, hi, pairs); one pair: no interval
    (lo, hi NaN); none: all NaN, 0."""
    from autotune.measure.intervals import paired_t

    pairs = round_pairs(cand, base)
    if not pairs:
        return float("nan"), float("nan"), float("nan"), 0
    return paired_t([float(np.median(c)) for _, c, _ in pairs], [float(np.median(b)) for _, _, b in pairs],
                    level=level)


def ratio_interval(cand: list[float], base: list[float], *, level: float = 0.95, draws: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of median(cand) / median(base) (the reported speedup is a ratio
    of medians), windows resampled on both sides.

    Each window is one full replay of the workload, so windows are the independent units of a
    run. With two windows a side the interval spans little more than the extreme window ratios:
    more ``--repeats`` make it a real interval.
    """
    c, b = np.asarray(cand, dtype=float), np.asarray(base, dtype=float)
    if not len(c) or not len(b) or not np.all(np.isfinite(c)) or not np.all(np.isfinite(b)) or b.min() <= 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ratios = np.median(rng.choice(c, (draws, len(c))), axis=1) / np.median(rng.choice(b, (draws, len(b))), axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))


def at_level(m: dict[str, Any], label: str) -> dict[str, Any]:
    """A run's measurement at one load level as flat ``metric@level`` keys (objective names)."""
    keys = (*DIRECTIONS, *(metric_key(k, suffix=WINDOWS) for k in WINDOWED), metric_key("output_tok_s", suffix=MAD),
            "windows", "noisy", "incomplete", "acceptance_rate", "mean_accepted_length", "prefill_share",
            "windows_coalesced", "unstepped_share", "latency_not_measured")
    return {metric_key(k, label): m[k] for k in keys if k in m}
