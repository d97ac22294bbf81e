"""benchmarks/confirm_allocation.py's analysis (no engine): the saved figures are what its code computes
from the saved rounds, and its split of the noise tells passes from rounds, which is what its
conclusion (no --min-pass-s floor reaches +-15% in 3 minutes) rests on."""

from __future__ import annotations

import json
import math
import random

import pytest

from conftest import ROOT, import_benchmark

DATA = ROOT / "benchmarks" / "data" / "confirm_allocation.json"


@pytest.fixture(scope="module")
def ca():
    return import_benchmark("confirm_allocation")


def _rows(between: float, within: float, rounds: int = 12, seed: int = 1) -> list[dict]:
    """Rounds of a made-up confirm: each side's round effect ``between``, each pass ``within``."""
    rng = random.Random(seed)
    rows = []
    for n in range(1, rounds + 1):
        for side, tok_s, passes, pass_s in (("baseline", 200.0, 2, 7.0), ("pick", 600.0, 6, 2.0)):
            effect = rng.gauss(0, between)
            rows.append({"round": n, "side": side, "measured_s": passes * pass_s, "wall_s": passes * pass_s + 5.0,
                         "pass_tok_s": [tok_s * math.exp(effect + rng.gauss(0, within)) for _ in range(passes)]})
    return rows


def test_the_saved_components_are_what_the_code_computes_from_the_saved_rounds(ca) -> None:
    saved = json.loads(DATA.read_text())
    c = ca.components(saved["run"]["rows"])
    for side in ("baseline", "pick"):
        for key in ("within_sd", "between_sd", "overhead_s", "pass_s"):
            assert c[side][key] == pytest.approx(saved["components"][side][key], rel=1e-9)
    assert c["round_log_ratio_sd"] == pytest.approx(saved["components"]["round_log_ratio_sd"], rel=1e-9)
    floor6 = next(r for r in saved["by_floor"] if r["floor_s"] == 6.0 and not r["free_starts"])
    again = ca.project(c, saved["run"]["setup_s"], 6.0, saved["confirms"], seed=0)
    assert again["median_resolution"] == floor6["median_resolution"] and again["share_15"] == floor6["share_15"]


def test_the_split_tells_noise_between_rounds_from_noise_inside_a_server(ca) -> None:
    rounds_only = ca.components(_rows(between=0.15, within=0.0, rounds=40))
    passes_only = ca.components(_rows(between=0.0, within=0.15, rounds=40))
    assert rounds_only["pick"]["between_sd"] == pytest.approx(0.15, abs=0.04)
    assert rounds_only["pick"]["within_sd"] < 1e-9
    assert passes_only["pick"]["within_sd"] == pytest.approx(0.15, abs=0.02)
    # the passes' share of the round mean is taken out (left in, it would read 0.15 / sqrt(6) = 0.061)
    assert passes_only["pick"]["between_sd"] < 0.04
    assert rounds_only["baseline"]["overhead_s"] == pytest.approx(5.0)


def test_a_longer_floor_helps_only_where_the_noise_is_inside_a_server(ca) -> None:
    passes_only = ca.components(_rows(between=0.0, within=0.3))
    rounds_only = ca.components(_rows(between=0.2, within=0.0))
    # noise inside a server: more passes a round average it (3 pick passes against 1 at 0 s)
    assert ca.project(passes_only, 3.0, 6.0, 400, seed=0)["median_resolution"] < \
        ca.project(passes_only, 3.0, 0.0, 400, seed=0)["median_resolution"]
    # noise between rounds: the longer round only costs rounds
    assert ca.project(rounds_only, 3.0, 12.0, 400, seed=0)["median_resolution"] > \
        ca.project(rounds_only, 3.0, 0.0, 400, seed=0)["median_resolution"]
