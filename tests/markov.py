"""Exact speculative sampling on a tiny Markov chain: a known model for testing the two-sample test.

Four events; the target and the draft are 4x4 transition tables. ``speculative`` implements the
rule of Leviathan et al. / Chen et al.: accept a drafted token y with probability
min(1, p(y)/q(y)); on rejection sample from the normalized residual max(0, p - q) and end the
block; after k accepted tokens sample one bonus token from the target. ``broken=True`` resamples
from p instead of the residual after a rejection, a plausible bug that biases the output.
``speculative_batch`` / ``target_batch`` / ``late_fault`` draw long sequences (vectorized) with
faults planted from a given token on (``LATE_FAULTS``: a wrong temperature, top-p, or residual rule).
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


# --- Longer draws with faults that start late (issue 16) --------------------------------------
#
# Vectorized over the n draws (the benchmarks draw millions of tokens); the functions above stay
# as they were (scalar, same random streams), since tests depend on their seeded output.
# ``start`` is the 0-based index of the first token a fault affects: 3 is the 4th token, just past
# the first-3-token window of the old test.

LATE_START = 3


def tempered(temperature: float, probs: np.ndarray = P) -> np.ndarray:
    """Each row raised to 1/temperature and renormalized: sampling at another temperature."""
    w = probs ** (1.0 / temperature)
    return w / w.sum(axis=1, keepdims=True)


def top_p(mass: float = 0.8, probs: np.ndarray = P) -> np.ndarray:
    """Each row truncated to its most likely states up to cumulative ``mass`` (the state that
    reaches it included, ties in index order), renormalized: top-p (nucleus) sampling."""
    out = np.zeros_like(probs)
    for i, row in enumerate(probs):
        order = np.argsort(-row, kind="stable")
        keep = order[: int(np.searchsorted(np.cumsum(row[order]), mass - 1e-12)) + 1]
        out[i, keep] = row[keep]
    return out / out.sum(axis=1, keepdims=True)


# The planted late faults: keyword arguments of speculative_batch.
LATE_FAULTS: dict[str, dict] = {
    "temperature 0.7": {"late": tempered(0.7)},
    "temperature 1.4": {"late": tempered(1.4)},
    "top-p 0.8": {"late": top_p(0.8)},
    "residual": {"broken": True},  # resamples from p after a rejection, from `start` on only
}


def _draw_rows(rng: np.random.Generator, rows: np.ndarray) -> np.ndarray:
    """One inverse-CDF draw from each row of ``rows`` (m x 4)."""
    cum = np.cumsum(rows, axis=1)
    u = rng.random(len(rows)) * cum[:, -1]
    return np.minimum((cum <= u[:, None]).sum(axis=1), rows.shape[1] - 1)


def _targets(length: int, late: np.ndarray | None, start: int) -> np.ndarray:
    """The transition table in force at each position (length x 4 x 4)."""
    return np.stack([P if late is None or t < start else late for t in range(length)])


def target_batch(rng: np.random.Generator, n: int, length: int = 12, *, late: np.ndarray | None = None,
                 start: int = LATE_START) -> list[tuple[int, ...]]:
    """``n`` sequences of the chain sampled directly: ``P`` throughout (the baseline), or ``late``
    from token ``start`` on."""
    tables = _targets(length, late, start)
    out = np.empty((n, length), dtype=np.int64)
    s = np.full(n, START)
    for t in range(length):
        s = _draw_rows(rng, tables[t][s])
        out[:, t] = s
    return [tuple(r) for r in out.tolist()]


def speculative_batch(rng: np.random.Generator, n: int, length: int = 12, k: int = 2, *,
                      late: np.ndarray | None = None, broken: bool = False,
                      start: int = LATE_START) -> list[tuple[int, ...]]:
    """``n`` sequences from speculative sampling (draft ``Q``, ``k`` drafts per block), exact
    unless a fault is planted from token ``start`` on: ``late`` is the target the verifier uses
    there (a wrong temperature or top-p), ``broken`` resamples from p instead of the residual
    after a rejection there. Without either it has the target chain's distribution exactly."""
    tables = _targets(length, late, start)
    bad = np.array([broken and t >= start for t in range(length)])
    out = np.zeros((n, length + k + 1), dtype=np.int64)
    pos = np.zeros(n, dtype=np.int64)  # tokens written so far
    prev = np.full(n, START)
    active = np.arange(n)
    while active.size:
        m = active.size
        rows = np.arange(m)
        p0, ctx = pos[active], prev[active]
        ctxs, ys = [], []
        for _ in range(k):
            y = _draw_rows(rng, Q[ctx])
            ctxs.append(ctx)
            ys.append(y)
            ctx = y
        alive = np.ones(m, dtype=bool)
        new_pos, new_prev = p0.copy(), prev[active].copy()
        for j in range(k):
            t = np.minimum(p0 + j, length - 1)  # positions past the end are cut off anyway
            p, q, y = tables[t, ctxs[j]], Q[ctxs[j]], ys[j]
            accept = rng.random(m) < np.minimum(1.0, p[rows, y] / q[rows, y])
            ok, rej = alive & accept, alive & ~accept
            out[active[ok], p0[ok] + j] = y[ok]
            if rej.any():
                pr = p[rej]
                res = np.maximum(pr - Q[ctxs[j][rej]], 0.0)
                tot = res.sum(axis=1, keepdims=True)
                fix = np.where(tot > 0, res / np.where(tot > 0, tot, 1.0), pr)
                fix = np.where(bad[t[rej]][:, None], pr, fix)
                z = _draw_rows(rng, fix)
                out[active[rej], p0[rej] + j] = z
                new_prev[rej], new_pos[rej] = z, p0[rej] + j + 1
            alive = ok
        if alive.any():  # all k accepted: a bonus token from the target
            t = np.minimum(p0[alive] + k, length - 1)
            z = _draw_rows(rng, tables[t, ys[-1][alive]])
            out[active[alive], p0[alive] + k] = z
            new_prev[alive], new_pos[alive] = z, p0[alive] + k + 1
        pos[active], prev[active] = new_pos, new_prev
        active = active[new_pos < length]
    return [tuple(r) for r in out[:, :length].tolist()]


def late_fault(rng: np.random.Generator, n: int, fault: str, length: int = 12, k: int = 2,
               start: int = LATE_START) -> list[tuple[int, ...]]:
    """``n`` speculative draws with the named fault of ``LATE_FAULTS`` (or "exact") from ``start`` on."""
    return speculative_batch(rng, n, length, k, start=start, **({} if fault == "exact" else LATE_FAULTS[fault]))


def marginals(length: int, late: np.ndarray | None = None, start: int = LATE_START) -> np.ndarray:
    """The exact distribution of each token (length x 4) of the chain ``target_batch`` samples."""
    tables = _targets(length, late, start)
    dist, out = np.eye(4)[START], []
    for t in range(length):
        dist = dist @ tables[t]
        out.append(dist)
    return np.array(out)
