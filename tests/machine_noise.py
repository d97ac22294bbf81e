"""The machine's noise as this project measured it, for the FAKE engine and the calibration benchmarks.

An engine instance's speed moves with the machine's state, and a speculative config moves more than
the baseline (benchmarks/data/instance_noise.json: over 5 instances interleaved, the pick's log sd
0.149, the baseline's 0.046, their speeds' correlation 0.90); the state persists from one instance
to the next (``phi``: 0 none, 0.9 most of it). Instance ``i`` (the study's i-th engine, in time
order) of a config with instance sd ``sd`` runs at ``exp(sqrt(rho) sd s_i + sqrt(1 - rho) sd e + drift
i)`` times its true speed, where ``s`` is an AR(1) series of unit variance (one per study seed) and
``e`` the instance's own noise. Windows inside one instance spread by ``window_sd`` more.

Named for what it is: a model of noise, for orchestration tests and calibration, never a measurement.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from functools import lru_cache

ENV = "AUTOTUNE_FAKE_STATE"  # JSON of a Noise: the FAKE engine's instances follow it (tests/fake_engine.py)


@dataclass(frozen=True)
class Noise:
    phi: float = 0.5  # persistence of the machine's state from one engine instance to the next
    sd_spec: float = 0.149  # a speculative config's instance log sd (instance_noise.json)
    sd_base: float = 0.046  # the baseline's
    rho: float = 0.90  # the correlation of their speeds (the share of each one's variance that is the state's)
    drift: float = -0.002  # the machine's log speed per instance: a slow drift over the study
    window_sd: float = 0.04  # windows inside one instance (instance_noise_windows.json: 0.017-0.077)

    def to_env(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_env(cls, text: str) -> Noise:
        return cls(**json.loads(text))

    def log_factor(self, seed: int, slot: int, speculative: bool, own: random.Random) -> float:
        """Instance ``slot``'s log speed factor (``own``: the instance's own random draws)."""
        sd = self.sd_spec if speculative else self.sd_base
        s = state(seed, self.phi, slot)
        return math.sqrt(self.rho) * sd * s + math.sqrt(1 - self.rho) * sd * own.gauss(0, 1) + self.drift * slot


@lru_cache(maxsize=64)
def _series(seed: int, phi: float, n: int) -> tuple[float, ...]:
    rng = random.Random(f"machine-state/{seed}")
    s, out = rng.gauss(0, 1), []
    for _ in range(n):
        out.append(s)
        s = phi * s + math.sqrt(1 - phi * phi) * rng.gauss(0, 1)
    return tuple(out)


def state(seed: int, phi: float, slot: int) -> float:
    """The machine's state at engine instance ``slot`` of the study seeded ``seed`` (unit variance)."""
    n = 256
    while slot >= n:
        n *= 2
    return _series(seed, phi, n)[slot]
