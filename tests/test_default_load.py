"""The load a study runs when the user gives none (issue 52): the workload's own arrival times where
every request has one, else one request in flight, said in one line with the levels to give instead.
The CLI with the FAKE engine (tests/fake_engine.py); the choice itself is autotune.core.load.default_load."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.core.load import default_load, suggested_levels

runner = CliRunner()
SPACE = """name: load
baseline: {method: none}
params:
  method: {choices: [none, ngram]}
  num_speculative_tokens: {int: [2, 3], when: {method: [ngram]}}
"""


def _search(tmp_path, monkeypatch, workload, *args: str):
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.setenv("COLUMNS", "300")
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    r = runner.invoke(app, ["search", str(workload), "--model", "fake-model", "--space", str(space), "--trials", "2",
                            "--results", str(tmp_path / "results"), "--study", "s", "--samples", "0", "--repeats", "1",
                            "--max-repeats", "0", "--no-remeasure", "--no-launcher", *args])
    assert r.exit_code == 0, r.output
    return r.output, json.loads((tmp_path / "results" / "s" / "best.json").read_text())


def _timed(tmp_path, every: bool = True):
    rows = [json.loads(x) for x in open("examples/smoke.jsonl")]
    p = tmp_path / "timed.jsonl"
    p.write_text("".join(json.dumps({**r, **({"arrival_s": 0.05 * i} if every or i else {})}) + "\n"
                         for i, r in enumerate(rows)))
    return p


def test_arrival_times_are_replayed_by_default_and_said(tmp_path, monkeypatch, fake_engine_env):
    out, best = _search(tmp_path, monkeypatch, _timed(tmp_path))
    assert best["load"] == "replay"
    line = next(ln for ln in out.splitlines() if ln.startswith("load:"))
    assert line.startswith("load: replay (every request has arrival_s: 6 over 0.25 s, 20 requests/s")


def test_without_arrival_times_one_in_flight_is_said_with_the_levels_to_give(tmp_path, monkeypatch, fake_engine_env):
    out, best = _search(tmp_path, monkeypatch, "examples/smoke.jsonl")
    assert best["load"] == "concurrency=1"
    assert ("load: concurrency=1, one request in flight (the workload has no arrival_s); speculation gains most "
            "there and less as the batch grows: give the load you serve, e.g. --levels 1,6") in out
    # every figure names its load: each trial's line, and the pick's
    trials = [ln for ln in out.splitlines() if ln.startswith("trial ")]
    assert len(trials) == 2 and all(" concurrency=1: " in ln and "tok/s" in ln for ln in trials), trials
    # --no-remeasure: no holdout, so no figure; the pick's measured ratio (what it was chosen on) names its load
    assert "over the baseline's output tok/s at concurrency=1" in next(
        ln for ln in out.splitlines() if ln.startswith("chosen on:"))


def test_a_pick_that_loses_at_a_measured_level_says_so_in_its_line(tmp_path, monkeypatch, fake_engine_env):
    from rich.console import Console

    from autotune.cli.present import explain

    _, report = _search(tmp_path, monkeypatch, "examples/smoke.jsonl", "--levels", "1,4",
                        "--try", '{"method": "ngram", "num_speculative_tokens": 3}')
    sp = report["best"]["speedup"]
    assert {"output_tok_s@concurrency=4", "output_tok_s@ramp=4"} <= set(sp)
    sp["output_tok_s@concurrency=4"], sp["output_tok_s@ramp=4"] = 0.83, 1.2  # as if it lost at 4 in flight

    def best_line():
        say = Console(record=True, width=1000)
        explain(say, report, tmp_path)
        return next(ln for ln in say.export_text().splitlines() if ln.startswith("best:"))
    line = best_line()
    assert line.endswith("; at concurrency=4 it is 0.83x the baseline's output tok/s: slower there"), line
    sp["output_tok_s@concurrency=4"] = 1.1
    assert "slower there" not in best_line()


def test_a_load_given_is_not_second_guessed(tmp_path, monkeypatch, fake_engine_env):
    out, best = _search(tmp_path, monkeypatch, _timed(tmp_path), "--levels", "2")
    assert best["load"] == "concurrency=2" and "load:" not in out


@pytest.mark.parametrize("arrivals, load", [([0.0, 1.0, None], "concurrency=1"), ([None] * 3, "concurrency=1"),
                                            ([0.0, 0.5, 1.0], "replay"), ([2.0], "replay")])
def test_default_load(arrivals, load):
    chosen, why = default_load(arrivals)
    assert chosen == load and "\n" not in why
    if None in arrivals and any(a is not None for a in arrivals):
        assert "only 2 of 3 requests have arrival_s" in why


def test_suggested_levels_stay_within_the_workload():
    assert [suggested_levels(n) for n in (1, 6, 16, 32, 500)] == [(1,), (1, 6), (1, 8, 16), (1, 8, 32), (1, 8, 32)]
