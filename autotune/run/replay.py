"""Replaying a workload on an engine: warm-up, measured windows at a load, sampled draws and
teacher-forced scoring, over the engine adapter's few methods (``stream``, ``prompt_logprobs``,
``counters``, ...). No vLLM here: the in-process adapter (autotune.run.engine) and the served one
(autotune.run.served_engine) both run through it, and the fake engine's conversations too.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from autotune.core.workload import chat_text, first_prompt, turn_id

from autotune.run.served_engine import PER_POS, PREEMPTIONS, SPEC_COUNTERS, TIME_SUMS

Phase = Callable[[str, dict[str, Any]], None]


def diff_counters(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    d = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    for k in (*TIME_SUMS, PREEMPTIONS):
        if k in before and k in after:
            d[k] = after[k] - before[k]
    b = before[PER_POS] + [0] * (len(after[PER_POS]) - len(before[PER_POS]))
    d[PER_POS] = [x - y for x, y in zip(after[PER_POS], b)]
    return d


LOGPROB_TOP_K = 5  # top log-probs kept per scored token (autotune.measure.validate's top-k KL)


# Sampled requests scored per trial (their paths' drift judges a lossy config): plenty of tokens for
# a stable mean, and it bounds the scoring pass and the baseline's scores kept in the study storage.
# Greedy requests are all scored: each is judged at every token (autotune.measure.every_token).
LOGPROB_MAX_SAMPLED = 64
# Greedy requests the baseline decodes again with log-probs: a sample of the decode-vs-prefill
# drift, the study's numerics (autotune.measure.numerics).
DRIFT_MAX_REQUESTS = 64


def _render(engine: Any, messages: list[dict[str, str]], **kwargs: Any) -> str:
    return chat_text(engine.get_tokenizer(), messages, **kwargs)


def prompt_text(engine: Any, req: dict[str, Any]) -> str | dict[str, Any]:
    """The first (or only) prompt of a request, as text; or, where the workload goes to the server's
    chat endpoint and the engine has one (``serves_chat``: the served instrument), the request's chat
    body, for the server's own template and tool handling (autotune.core.workload.Workload.endpoint)."""
    if req.get("chat") is not None and getattr(engine, "serves_chat", False):
        return dict(req["chat"])
    return first_prompt(req, lambda messages: _render(engine, messages, **(req.get("render") or {})))


Send = Callable[[dict[str, Any], list[dict[str, str]]], Awaitable[dict[str, Any]]]


async def converse(req: dict[str, Any], send: Send) -> list[dict[str, Any]]:
    """Replay a multi-turn request: each user turn is sent after the model's own answer to the
    previous one (not a canned answer), so later turns see the context a real user's would.

    ``send(turn_request, messages)`` runs one turn and returns its record. One record per turn, with
    ids from ``autotune.core.workload.turn_id``; after a turn that failed, the rest are not sent and
    carry that reason, so every turn has a record to judge.
    """
    messages: list[dict[str, str]] = []
    records: list[dict[str, Any]] = []
    for k, turn in enumerate(req["turns"]):
        sub = {**req, "id": turn_id(req["id"], k)}
        if records and (records[-1]["error"] or records[-1]["finish_reason"] not in ("stop", "length")):
            now = time.perf_counter()
            records.append({"id": sub["id"], "start": now, "end": now, "chunks": [], "token_ids": [], "text": "",
                            "finish_reason": None, "prompt_tokens": None,
                            "error": f"not sent: turn {k} did not finish ({records[-1]['error'] or 'no finish'})"})
            continue
        messages.append({"role": "user", "content": turn})
        records.append(await send(sub, list(messages)))
        messages.append({"role": "assistant", "content": records[-1]["text"]})
    return records


async def _request(engine: Any, req: dict[str, Any], prompt: str) -> list[dict[str, Any]]:
    """The records of one workload request: one, or one per turn of a conversation."""
    if not req.get("turns") or len(req["turns"]) == 1:
        return [await _one(engine, req, prompt)]
    return await converse(req, lambda sub, messages: _one(engine, sub, _render(engine, messages)))


async def _one(engine: Any, req: dict[str, Any], prompt: str) -> dict[str, Any]:
    """Run one request, streaming deltas; keep raw timestamps (derived numbers come later)."""
    rec: dict[str, Any] = {"id": req["id"], "start": time.perf_counter(), "chunks": [], "token_ids": [],
                           "text": "", "finish_reason": None, "error": None, "prompt_tokens": None}
    try:
        async for d in engine.stream(prompt, req["sampling"], f"{req['id']}-{uuid.uuid4().hex[:8]}"):
            now = time.perf_counter()
            # With n > 1 every completion's tokens are the load (chunks); the first is the one judged.
            index = getattr(d, "index", 0)
            first = index == 0
            if d.token_ids:  # [arrival, tokens] (+ the completion's index where n > 1: autotune.measure.coalescing)
                rec["chunks"].append([now, len(d.token_ids), *([index] if index else [])])
                if first:
                    rec["token_ids"].extend(d.token_ids)
            if first:
                rec["text"] += d.text
            if rec["prompt_tokens"] is None and d.prompt_token_ids is not None:
                rec["prompt_tokens"] = len(d.prompt_token_ids)
                rec["prompt_token_ids"] = list(d.prompt_token_ids)  # vLLM's own tokenization, for _score
            if d.finished and first:
                rec["finish_reason"] = d.finish_reason
                if d.spec_decode is not None:  # set where _engine_args asked for it (in-process only)
                    rec["spec_decode"] = d.spec_decode
    except Exception as e:  # a request error is recorded; the run is then incomplete
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["end"] = time.perf_counter()
    return rec


async def replay_requests(engine: Any, reqs: list[dict[str, Any]], prompts: list[str], load: dict[str, Any],
                  on_done: Callable[[int], None]) -> list[dict[str, Any]]:
    """Send the requests as the load pattern says (autotune.core.load) and collect their records.

    Closed loop: at most ``concurrency`` in flight, the next sent when one finishes. Open loop
    (batch, poisson, replay): each request is sent at its offset, however many are in flight.
    """
    from autotune.core.load import ramp_limits, send_offsets

    if load.get("kind") == "ramp":
        return await _ramp(engine, reqs, prompts, ramp_limits(len(reqs), load["concurrency"]), on_done)
    offsets = send_offsets(load, len(reqs), [r.get("arrival_s") for r in reqs])
    sem = asyncio.Semaphore(load.get("concurrency", 1) if offsets is None else max(1, len(reqs)))
    t0 = time.perf_counter()
    done = 0

    async def run(i: int) -> list[dict[str, Any]]:
        nonlocal done
        if offsets is not None:
            await asyncio.sleep(max(0.0, t0 + offsets[i] - time.perf_counter()))
        async with sem:  # a conversation holds its slot through all its turns
            recs = await _request(engine, reqs[i], prompts[i])
        done += 1
        on_done(done)
        return recs

    return [rec for recs in await asyncio.gather(*(run(i) for i in range(len(reqs)))) for rec in recs]


async def _ramp(engine: Any, reqs: list[dict[str, Any]], prompts: list[str], limits: list[int],
                on_done: Callable[[int], None]) -> list[dict[str, Any]]:
    """A closed loop whose in-flight limit changes per request (``limits``, autotune.core.load.ramp_limits):
    request i is sent, in order, once fewer than ``limits[i]`` requests are in flight."""
    room = asyncio.Condition()
    in_flight, done = 0, 0

    async def run(i: int) -> list[dict[str, Any]]:
        nonlocal in_flight, done
        try:
            return await _request(engine, reqs[i], prompts[i])
        finally:
            async with room:
                in_flight -= 1
                done += 1
                room.notify_all()
            on_done(done)

    tasks = []
    for i, limit in enumerate(limits):
        async with room:
            await room.wait_for(lambda limit=limit: in_flight < limit)
            in_flight += 1
        tasks.append(asyncio.create_task(run(i)))
    return [rec for recs in await asyncio.gather(*tasks) for rec in recs]


async def sampled_draws(engine: Any, reqs: list[dict[str, Any]], prompts: list[str], replay: dict[str, Any],
                        phase: Phase, prompt_tokens: dict[str, int | None]) -> dict[str, list[list[int]]]:
    """After the measured window: draw ``samples`` short samples of every sampled request.

    Their ``sample_tokens`` tokens feed the distribution test against the baseline (autotune.measure.stats:
    the first token, the first three jointly, the later tokens and token pairs).
    Seeds are fixed per draw, so a run is reproducible.
    """
    n, length = replay.get("samples", 0), replay.get("sample_tokens", 24)
    picked = [(r, p) for r, p in zip(reqs, prompts) if r["sampling"].get("temperature", 0) > 0]
    if not n or not picked:
        return {}
    phase("samples", {"total": n * len(picked)})
    budget = engine.token_budget()
    out: dict[str, list[list[int]]] = {}
    for r, p in picked:
        # vLLM's CPU model runner cannot rewind a seeded request's generator when that request's
        # prefill is split over steps ("CPU Generator does not use offset", gpu_model_runner's
        # set_offset): the draws in flight together must fit the step's token budget, and a
        # prompt that alone does not is drawn unseeded (the test compares distributions, not
        # same-seed pairs).
        need = (prompt_tokens.get(r["id"]) or 0) + length + 16
        seeded = budget is None or need <= budget
        in_flight = 8 if budget is None else max(1, min(8, budget // need))
        base_seed = r["sampling"].get("seed") or 0
        jobs = [{"id": f"{r['id']}#s{i}", "sampling": {**r["sampling"], "max_tokens": length, "n": 1,
                                                         "seed": base_seed * 100_003 + i if seeded else None}}
                for i in range(n)]
        recs = await replay_requests(engine, jobs, [p] * n, {"kind": "concurrency", "concurrency": in_flight},
                             lambda d: None)
        out[r["id"]] = [rec["token_ids"] for rec in recs]
    return out


async def _score(engine: Any, prompt_ids: list[int], path: list[int], rid: str) -> dict[str, Any]:
    """One teacher-forced prefill of prompt + path: each path token's log-prob and the top
    ``LOGPROB_TOP_K`` at its position (or the error vLLM gave)."""
    try:
        lps = await engine.prompt_logprobs(prompt_ids + path, LOGPROB_TOP_K, f"{rid}-score-{uuid.uuid4().hex[:8]}")
        by_pos = lps[len(prompt_ids):]  # position i: {token id: (log-prob, rank)} for path[i]
        return {"token_ids": path, "logprobs": [round(d[t][0], 5) for d, t in zip(by_pos, path)],
                "top": [[[t, round(lp, 5)] for t, (lp, _) in d.items()] for d in by_pos]}
    except Exception as e:  # e.g. a config where vLLM refuses prompt_logprobs: say why, measure on
        return {"token_ids": path, "error": f"{type(e).__name__}: {e}"}


def _greedy(req: dict[str, Any]) -> bool:
    return req["sampling"].get("temperature", 0) == 0


async def score_greedy(engine: Any, reqs: list[dict[str, Any]], records: list[dict[str, Any]],
                 reference: dict[str, list[int]] | None, phase: Phase) -> dict[str, dict[str, Any]]:
    """After measuring: score a token path of every greedy request and of up to ``LOGPROB_MAX_SAMPLED``
    sampled ones, teacher-forced.

    The path is the baseline's output (``reference``, request id -> token ids; the baseline's job
    has none and scores its own): its greedy tokens, or for a sampled request the tokens it
    sampled, so that a lossy candidate on a sampled workload has drift evidence too. The raw
    log-probs (before temperature and top-p) measure how far the model's distribution moved. Prompt + path go through one prefill with ``prompt_logprobs``,
    which gives each path token's log-prob under this engine (and the top ``LOGPROB_TOP_K``), so
    a lossy candidate is compared with the baseline on the same tokens even where its own greedy
    output went elsewhere. One request at a time: batching changes numerics, and both sides
    must be batched alike. A request vLLM cannot score keeps its error instead; the trial goes on.
    """
    if reference == {}:  # nothing to score: an unspeculated reference run (autotune.run.evaluate.unspeculated_job)
        return {}
    by_id = {r["id"]: r for r in records}
    present = [r for r in reqs if r["id"] in by_id]
    chosen = [r["id"] for r in present if _greedy(r)] + [r["id"] for r in present if not _greedy(r)][:LOGPROB_MAX_SAMPLED]
    phase("score", {"total": len(chosen)})
    out: dict[str, dict[str, Any]] = {}
    for rid in chosen:
        prompt_ids = by_id[rid].get("prompt_token_ids")
        path = by_id[rid]["token_ids"] if reference is None else reference.get(rid)
        if path and prompt_ids:
            out[rid] = await _score(engine, prompt_ids, path, rid)
    return out


# Sampling keys whose logits processors can make a greedy token other than the raw logits' argmax:
# vLLM's log-probs are of the raw logits, so the own-rank check (autotune.measure.every_token) skips them.
PROCESSED = ("min_tokens", "logit_bias", "bad_words", "allowed_token_ids", "structured_outputs", "guided_json",
             "guided_regex", "guided_choice", "guided_grammar", "response_format", "repetition_penalty",
             "presence_penalty", "frequency_penalty", "logits_processors")
NEUTRAL = {"min_tokens": 0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def plain_greedy(sampling: dict[str, Any]) -> bool:
    """Greedy with nothing that changes the logits before the argmax (see PROCESSED)."""
    return sampling.get("temperature", 0) == 0 and all(sampling.get(k) in (None, NEUTRAL.get(k)) for k in PROCESSED)


async def score_own(engine: Any, records: list[dict[str, Any]], judge: dict[str, list[int] | None] | None,
                    phase: Phase, sampling: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """After measuring: score teacher-forced, in one prefill each, the run's own greedy outputs that
    differ from the reference's (``judge``: request id -> its tokens; None there: score it whatever
    they are), so that every token of theirs is judged (autotune.measure.every_token). A prefill
    verifies no draft: a speculative engine scores as the target alone.

    Where ``sampling`` (request id -> its sampling) holds the request as plain greedy and the engine
    decodes with log-probs, the request is also decoded again, speculation on, with the top log-prob
    at each token (under ``decoded``): the target's own ranking of each token it emitted
    (autotune.measure.every_token.own_rank_fault). One request at a time, like the scoring."""
    chosen = [r for r in records if judge and r["id"] in judge and r.get("prompt_token_ids") and r["token_ids"]
              and (judge[r["id"]] is None or r["token_ids"] != judge[r["id"]])]
    if not chosen:
        return {}
    phase("score_own", {"total": len(chosen)})
    out = {r["id"]: await _score(engine, r["prompt_token_ids"], r["token_ids"], r["id"]) for r in chosen}
    plain = [r for r in chosen if sampling and r["id"] in sampling and plain_greedy(sampling[r["id"]])]
    if plain and hasattr(engine, "decode_logprobs"):
        phase("decode_own", {"total": len(plain)})
        for r in plain:
            try:
                out[r["id"]]["decoded"] = await engine.decode_logprobs(
                    r["prompt_token_ids"], sampling[r["id"]], 1, f"{r['id']}-rank-{uuid.uuid4().hex[:8]}")
            except Exception as e:  # judged by the scores alone; say why
                out[r["id"]]["decoded"] = {"error": f"{type(e).__name__}: {e}"}
    return out


async def decode_drift(engine: Any, reqs: list[dict[str, Any]], records: list[dict[str, Any]],
                       load: dict[str, Any], phase: Phase) -> dict[str, dict[str, Any]]:
    """After measuring, in the baseline: decode up to ``DRIFT_MAX_REQUESTS`` greedy requests again
    from their measured prompts, with their top log-probs, as many in flight as the study's load keeps
    (decode's batch shapes). Against the same tokens' teacher-forced scores this is the model's own
    decode-vs-prefill drift on this platform and dtype (autotune.measure.numerics)."""
    if not hasattr(engine, "decode_logprobs"):
        return {}
    sampling = {r["id"]: r["sampling"] for r in reqs if _greedy(r)}
    chosen = [r for r in records if r["id"] in sampling and r.get("prompt_token_ids")][:DRIFT_MAX_REQUESTS]
    phase("drift", {"total": len(chosen)})
    sem = asyncio.Semaphore(max(1, int(load.get("concurrency") or 1)))

    async def one(rec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        async with sem:
            try:
                return rec["id"], await engine.decode_logprobs(rec["prompt_token_ids"], sampling[rec["id"]],
                                                               LOGPROB_TOP_K, f"{rec['id']}-drift-{uuid.uuid4().hex[:8]}")
            except Exception as e:  # measured without it: the threshold falls back to the dtype's rounding
                return rec["id"], {"error": f"{type(e).__name__}: {e}"}

    return {rid: d for rid, d in await asyncio.gather(*(one(r) for r in chosen)) if "error" not in d}


async def _window(engine: Any, reqs: list[dict[str, Any]], prompts: list[str], load: dict[str, Any],
                  on_done: Callable[[int], None]) -> dict[str, Any]:
    """One measured window: a cold prefix cache, the whole workload, counters diffed around it."""
    await engine.reset_prefix_cache()  # every window (and every candidate) starts equally cold
    await engine.reset_drafter()  # and with no suffix cache of the windows before (autotune.run.vllm_ext)
    before = await engine.counters()
    t0 = time.perf_counter()
    records = await replay_requests(engine, reqs, prompts, load, on_done)
    t1 = time.perf_counter()
    counters = diff_counters(before, await engine.counters())
    for r in records:  # times relative to the window start, easier to read and to check
        r["start"] -= t0
        r["end"] -= t0
        for c in r["chunks"]:
            c[0] -= t0
    return {"window_s": t1 - t0, "requests": records, "spec_counters": counters}


async def measure_windows(engine: Any, reqs: list[dict[str, Any]], prompts: list[str], load: dict[str, Any],
                          replay: dict[str, Any], phase: Phase, *, main: bool = False) -> list[dict[str, Any]]:
    """``repeats`` windows at one load level, and more (up to ``max_repeats``) while their
    throughput spread is too wide to rank the candidate: re-measured while the engine is up.
    ``main``: the study's own level, whose finished windows are told as they come (``window_done``,
    with their throughput), so that the study can stop a hopeless candidate early."""
    from autotune.measure.metrics import noisy, measure

    repeats = replay.get("repeats", 1)
    most = max(repeats, replay.get("max_repeats", repeats))
    windows: list[dict[str, Any]] = []
    while len(windows) < repeats or (len(windows) < most and noisy([measure(w)["output_tok_s"] for w in windows])):
        w, total = len(windows) + 1, max(repeats, len(windows) + 1)
        phase("measure", {"total": len(reqs), "window": w, "windows": total, "load": load.get("label")})
        windows.append(await _window(engine, reqs, prompts, load, lambda n, w=w, total=total: phase(
            "progress", {"done": n, "total": len(reqs), "window": w, "windows": total})))
        if main:
            phase("window_done", {"window": w, "output_tok_s": measure(windows[-1])["output_tok_s"]})
    return windows

