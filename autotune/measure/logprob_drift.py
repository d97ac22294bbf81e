"""Log-prob drift: teacher-forced log-probs of the same token paths under two engines, compared.

Both engines score the baseline's greedy tokens (autotune.run.replay.score_greedy); the drift is the
mean over tokens of |log p_baseline - log p_candidate|, with its largest value and the mean KL over
each position's shared top-k tokens beside it. Lossy configs are gated by it (autotune.measure.validate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens the two sequences share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass(frozen=True)
class LogprobDrift:
    mean: float
    max: float
    kl: float | None
    tokens: int
    requests: tuple[str, ...] = ()  # the requests compared


def _topk_kl(base: list[list[float]], cand: list[list[float]]) -> float | None:
    """KL(base || cand) over the tokens both top-k lists hold, each renormalized there."""
    b, c = {int(t): lp for t, lp in base}, {int(t): lp for t, lp in cand}
    shared = b.keys() & c.keys()
    if not shared:
        return None
    zb = math.log(sum(math.exp(b[t]) for t in shared))
    zc = math.log(sum(math.exp(c[t]) for t in shared))
    return sum(math.exp(b[t] - zb) * ((b[t] - zb) - (c[t] - zc)) for t in shared)


def logprob_drift(cand: dict[str, dict[str, Any]], base: dict[str, dict[str, Any]]) -> LogprobDrift | None:
    """Compare teacher-forced scores (``autotune.run.replay.score_greedy``) request by request.

    Each side scored a token path; a token's log-prob depends only on the tokens before it, so
    the two are comparable on the paths' common prefix (the whole path when the candidate scored
    the baseline's tokens, as a study's candidates do).
    """
    diffs: list[float] = []
    kls: list[float] = []
    scored: list[str] = []
    for rid, c in cand.items():
        b = base.get(rid)
        if b is None or "logprobs" not in b or "logprobs" not in c:
            continue  # not scored on one side (its error is kept in the raw run)
        scored.append(rid)
        n = common_prefix(b["token_ids"], c["token_ids"])
        diffs += [abs(x - y) for x, y in zip(b["logprobs"][:n], c["logprobs"][:n])]
        kls += [k for tb, tc in zip(b["top"][:n], c["top"][:n]) if (k := _topk_kl(tb, tc)) is not None]
    if not diffs:
        return None
    return LogprobDrift(mean=sum(diffs) / len(diffs), max=max(diffs),
                        kl=sum(kls) / len(kls) if kls else None, tokens=len(diffs), requests=tuple(scored))


def drift_note(drift: LogprobDrift) -> tuple[str, str]:
    detail = f"max {drift.max:.3g}" + (f", top-k KL {drift.kl:.3g}" if drift.kl is not None else "") + \
        f", {drift.tokens} tokens"
    return detail, f"log-prob drift {drift.mean:.3g} nats/token ({detail})"
