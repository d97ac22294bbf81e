"""Exact speculative sampling on a tiny Markov chain: a known model for testing the two-sample test.

Four events; the target and the draft are 4x4 transition tables. ``speculative`` implements the
rule of Leviathan et al. / Chen et al.: accept a drafted token y with probability
min(1, p(y)/q(y)); on rejection sample from the normalized residual max(0, p - q) and end the
block; after k accepted tokens sample one bonus token from the target. ``broken=True`` resamples
from p instead of the residual after a rejection, a plausible bug that biases the output.
"""

from __future__ import annotations

import numpy as np

P = np.array([[0.70, 0.15, 0.10, 0.05],
              [0.10, 0.60, 0.20, 0.10],
              [0.25, 0.25, 0.25, 0.25],
              [0.05, 0.05, 0.30, 0.60]])
Q = np.array([[0.40, 0.40, 0.10, 0.10],
              [0.30, 0.30, 0.30, 0.10],
              [0.10, 0.40, 0.40, 0.10],
              [0.25, 0.25, 0.25, 0.25]])
START = 0


def _draw(rng: np.random.Generator, probs: np.ndarray) -> int:
    # Inverse-CDF draw: much faster than rng.choice for a 4-way distribution.
    return min(int(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum(), side="right")), len(probs) - 1)


def target(rng: np.random.Generator, n: int, length: int = 3) -> list[tuple[int, ...]]:
    """``n`` sequences sampled from the target chain directly (the baseline)."""
    out = []
    for _ in range(n):
        s, seq = START, []
        for _ in range(length):
            s = _draw(rng, P[s])
            seq.append(s)
        out.append(tuple(seq))
    return out


def speculative(rng: np.random.Generator, n: int, length: int = 3, k: int = 2, *,
                broken: bool = False) -> list[tuple[int, ...]]:
    """``n`` sequences from speculative sampling with draft ``Q`` and target ``P``."""
    out = []
    for _ in range(n):
        seq: list[int] = []
        prev = START
        while len(seq) < length:
            ctx = prev
            drafted = []
            for _ in range(k):
                y = _draw(rng, Q[ctx])
                drafted.append((ctx, y))
                ctx = y
            for ctx, y in drafted:
                p, q = P[ctx], Q[ctx]
                if rng.random() < min(1.0, p[y] / q[y]):
                    seq.append(y)
                    prev = y
                    continue
                residual = np.maximum(p - q, 0.0)
                fix = p if broken else residual / residual.sum()
                prev = _draw(rng, fix)
                seq.append(prev)
                break
            else:
                prev = _draw(rng, P[prev])  # bonus token from the target
                seq.append(prev)
        out.append(tuple(seq[:length]))
    return out
