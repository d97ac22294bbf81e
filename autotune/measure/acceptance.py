"""Speculative-decoding acceptance from vLLM's counter terms: the one place it is computed.

From drafts (verify steps that drafted), draft tokens, accepted tokens and accepted tokens by draft
position, as vLLM's ``vllm:spec_decode_*`` counters count them: the acceptance rate (accepted /
drafted tokens), the mean accepted length (1 + accepted / drafts: tokens a drafting step emits) and
the acceptance rate by draft position (accepted at position i / drafts). The first two are different
numbers and both are reported. NaN (and no positions) when nothing was drafted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def acceptance_rate(accepted: float, draft_tokens: float) -> float:
    """Accepted over drafted tokens."""
    return accepted / draft_tokens if draft_tokens else float("nan")


def mean_accepted_length(accepted: float, drafts: float) -> float:
    """1 + accepted tokens per drafting step: vLLM's definition."""
    return 1 + accepted / drafts if drafts else float("nan")


def acceptance_by_pos(per_pos: Sequence[float], drafts: float) -> list[float]:
    """The share of drafting steps that accepted draft position 1, 2, ..."""
    return [a / drafts for a in per_pos] if drafts else []


def acceptance(drafts: float, draft_tokens: float, accepted: float, per_pos: Sequence[float]) -> dict[str, Any]:
    """``acceptance_rate``, ``mean_accepted_length`` and ``acceptance_by_pos`` from the counts."""
    return {"acceptance_rate": acceptance_rate(accepted, draft_tokens),
            "mean_accepted_length": mean_accepted_length(accepted, drafts),
            "acceptance_by_pos": acceptance_by_pos(per_pos, drafts)}
