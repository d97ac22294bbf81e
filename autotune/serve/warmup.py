"""Confirm's warm-up: requests outside the measured set, so a server never measures what it memorised.

`vllm bench serve` sends its ready-check request and all ``--num-warmups`` requests as the
dataset's first request (``input_requests[0]``, module ``vllm.benchmarks.serve``): a stateful
proposer (suffix decoding keeps every answer in a global cache) then drafts that measured request
from its own earlier answer, several times over, and the prefix cache holds its prompt. Confirm
therefore runs the client with ``--num-warmups 0 --ready-check-timeout-sec 0`` and warms each
server itself, from the client process once ``/health`` answers (autotune.vllm_cli), on a prompt
that is no measured request and shares no first token with any: vLLM's prefix-cache block hashes
chain from the first block, so no measured request can hit the warm-up's blocks, and the suffix
cache holds only the warm-up's own answer, never a measured one. The study empties both caches
before every measured window (autotune.run.replay), so both start each measured pass with nothing
of the measured requests cached. Stdlib only.
"""

from __future__ import annotations

import json
import statistics
import urllib.request
from typing import Any

# Repetitive on purpose: n-gram and suffix proposers find drafts in it, so their paths run (and
# compile) during the warm-up as the measured requests will run them.
WORDS = "warm-up request, not measured: north east south west " * 8
MAX_TOKENS = 64


def warmup_prompt(prompts: list[str]) -> str:
    """A prompt whose first character no measured prompt starts with (so no first token, no
    first prefix-cache block in common); the fixed text behind a marker character."""
    firsts = {p[:1] for p in prompts}
    marker = next((ch for ch in "~#@%^&|" if ch not in firsts), None)
    if marker is None:  # every marker taken: a character no prompt starts with
        marker = next(chr(c) for c in range(0x2500, 0x2600) if chr(c) not in firsts)
    return f"{marker} {WORDS}"


def warmup_spec(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """What the client sends before measuring: ``n`` requests of the warm-up prompt, each as long as a
    typical measured answer (the median max_tokens, at most MAX_TOKENS)."""
    lengths = [r["output_tokens"] for r in rows if isinstance(r.get("output_tokens"), int) and r["output_tokens"] > 0]
    max_tokens = min(int(statistics.median(lengths)) if lengths else MAX_TOKENS, MAX_TOKENS)
    return {"prompt": warmup_prompt([str(r.get("prompt") or "") for r in rows]), "max_tokens": max(max_tokens, 1),
            "n": n}


def warm_up(base_url: str, model: str, spec: str | dict[str, Any], *, timeout_s: float = 600.0) -> int:
    """Send the warm-up requests to ``base_url``'s /v1/completions one after another; the number
    sent. Raises RuntimeError (one line) when the server refuses one."""
    s = json.loads(spec) if isinstance(spec, str) else spec
    body = json.dumps({"model": model, "prompt": s["prompt"], "max_tokens": s["max_tokens"], "temperature": 0.0,
                       "ignore_eos": True}).encode()
    for i in range(int(s.get("n") or 0)):
        req = urllib.request.Request(base_url.rstrip("/") + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                r.read()
        except OSError as e:
            raise RuntimeError(f"warm-up request {i + 1} to {base_url}/v1/completions failed: {e}") from None
    return int(s.get("n") or 0)
