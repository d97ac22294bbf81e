"""A study whose stream delivers tokens in bursts (issue 60, "latency as measured or not at all"): TPOT is
not measured, so an objective on it neither fails the baseline nor decides the Pareto front, the pick or
the gate, and the console says so once; with evenly streamed tokens TPOT stays an objective.

Whole studies through `autotune search` on the FAKE engine (tests/fake_engine.py; AUTOTUNE_FAKE_BURSTS=1
reads each request's chunks after the first at its end, 1 us apart), plus by-category TPOT on hand-made
records and confirm's rounds on the FAKE launcher of tests/test_confirm.py with detailed bench results."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.core import attrs
from autotune.core.study_report import load_report

from test_confirm import fake, write_results  # noqa: F401 (fake: the FAKE launcher, a fixture)

runner = CliRunner()
NGRAM2 = '{"method": "ngram", "num_speculative_tokens": 2, "kv_cache_dtype": "auto"}'
NOTE = re.compile(r"^latency: tpot_ms_p50 not measured \(tokens reached the client in bursts\): left out of the "
                  r"objectives \(the pick rests on output_tok_s\)$")


def _search(tmp_path: Path, study: str, *args: str) -> Any:
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--model", "fake-model", "--results", str(tmp_path),
                            "--samples", "0", "--repeats", "1", "--study", study,
                            "--objectives", "output_tok_s,tpot_ms_p50", *args])
    assert r.exit_code == 0, r.output
    return r


def _nightly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bursts: bool) -> tuple[Any, Any]:
    """A deployed study (the baseline and ngram k=2), then a study warm-started from it whose space
    reaches k=4 (so its pick differs from the deployed config, measured beside it in the holdout), its
    runner-up within the selection band (so selection rounds pool fresh engines' records)."""
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.setenv("COLUMNS", "1000")  # each record whole on one line, to read it (a pipe wraps at 100)
    monkeypatch.setenv("AUTOTUNE_FAKE_NOISE", "0")
    monkeypatch.setenv("AUTOTUNE_FAKE_TRUE", '{"2": 2.0, "3": 2.1, "4": 2.15}')
    if bursts:
        monkeypatch.setenv("AUTOTUNE_FAKE_BURSTS", "1")
    deployed = _search(tmp_path, "deployed", "--space", "tests/data/fake_space_ok.yaml", "--trials", "2",
                       "--try", NGRAM2)
    nightly = _search(tmp_path, "nightly", "--space", "tests/data/fake_space_ok.yaml", "--trials", "3",
                      "--warm-start", str(tmp_path / "deployed"))
    return deployed, nightly


def _told(results: Path) -> list[optuna.trial.FrozenTrial]:
    """The study's complete trials as Optuna was told them."""
    study = optuna.load_study(study_name=results.name, storage=f"sqlite:///{results / 'study.db'}")
    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


def test_a_study_in_bursts_leaves_tpot_out_and_says_so_once(tmp_path, monkeypatch, fake_engine_env):
    deployed, nightly = _nightly(tmp_path, monkeypatch, bursts=True)
    for r, d in ((deployed, tmp_path / "deployed"), (nightly, tmp_path / "nightly")):
        frame = pd.read_csv(d / "trials.csv")
        # every trial measured, the baseline first: an unmeasured TPOT fails none
        assert (frame["state"] == "COMPLETE").all() and frame["failure"].isna().all(), frame["failure"]
        assert frame["tpot_ms_p50"].isna().all() and frame["latency_not_measured"].notna().all()
        # no ratio of unmeasured TPOTs, the baseline's own rows' "1 by definition" included
        assert frame["speedup_tpot_ms_p50"].isna().all()
        # said once, after the first trial's line, and never a TPOT number on a round's line
        notes = [ln for ln in r.stdout.splitlines() if "not measured" in ln and "tpot" in ln.lower()]
        assert len(notes) == 1 and NOTE.match(notes[0]), notes
        lines = r.stdout.splitlines()
        assert lines.index(notes[0]) == next(i for i, ln in enumerate(lines) if ln.startswith("trial   0 ")) + 1
        # Optuna was told TPOT's worst value (no data: it ranks nothing), throughput as measured
        told = _told(d)
        assert all(t.values[1] == math.inf and math.isfinite(t.values[0]) for t in told)
        # the front and the pick rest on throughput alone: the best current record, and only it
        best = load_report(d)["best"]
        fastest = frame.loc[frame["output_tok_s"].idxmax()]
        assert best["label"] == fastest["label"] and set(frame.loc[frame["pareto"], "label"]) == {fastest["label"]}
    assert any(attrs.REMEASURE_OF in t.user_attrs for t in _told(tmp_path / "nightly"))  # pooled records told too
    gate = load_report(tmp_path / "nightly")["gate"]
    assert gate["deployed_label"] == "ngram k=2" and gate["objectives"]["output_tok_s"]["pairs"] >= 2
    assert gate["objectives"]["tpot_ms_p50"]["decision"] == "not measured"
    assert gate["objectives"]["tpot_ms_p50"]["pairs_needed"] is None  # no number of rounds would tell
    r = runner.invoke(app, ["check", str(tmp_path / "nightly"), "--against", str(tmp_path / "deployed")])
    assert r.exit_code == 0, r.output
    assert "tpot_ms_p50: not measured on both sides, not compared" in r.stdout


def test_evenly_streamed_tokens_keep_tpot_an_objective(tmp_path, monkeypatch, fake_engine_env):
    deployed, nightly = _nightly(tmp_path, monkeypatch, bursts=False)
    for r, d in ((deployed, tmp_path / "deployed"), (nightly, tmp_path / "nightly")):
        assert "not measured" not in r.stdout
        frame = pd.read_csv(d / "trials.csv")
        assert frame["tpot_ms_p50"].notna().all() and frame["latency_not_measured"].isna().all()
        base = frame["param_method"] == "none"
        assert (frame.loc[base, "speedup_tpot_ms_p50"] == 1.0).all()
        assert (frame.loc[~base, "speedup_tpot_ms_p50"] > 1.0).all()  # speculation cut the time a token
        told = _told(d)
        assert all(t.values[1] == pytest.approx(t.user_attrs["measurement"]["tpot_ms_p50"]) for t in told)
    decision = load_report(tmp_path / "nightly")["gate"]["objectives"]["tpot_ms_p50"]["decision"]
    assert decision in ("ok", "regressed", "cannot tell")


def test_a_category_in_bursts_has_no_tpot_and_no_step_sizes():
    """by_category (by_category.csv, the per-category table): a window whose category's tokens came in
    bursts (a backlog of steps merged into chunks read at one instant) gives no TPOT and no stream step
    sizes (a merged chunk reads as one long step); the other windows do."""
    from autotune.measure.categories import by_category

    def rec(rid: str, bursty: bool) -> dict[str, Any]:
        chunks = ([[0.02, 1], [0.22, 20], [0.220001, 19]] if bursty else [[0.02 + j * 0.005, 1] for j in range(40)])
        return {"id": rid, "start": 0.0, "chunks": chunks, "finish_reason": "length", "error": None}

    cats = {"a": "edit", "b": "chat"}

    def window(bursty: bool, counters: bool = True) -> dict[str, Any]:  # "edit" streamed evenly, "chat" as given
        return {"requests": [rec("a", False), rec("b", bursty)],
                **({"spec_counters": {"vllm:spec_decode_num_drafts": 0,
                                      "vllm:spec_decode_num_accepted_tokens_per_pos": []}} if counters else {})}

    even = by_category([window(False)] * 2, cats, 0)
    assert even["edit"]["tpot_ms_p50"] == pytest.approx(5.0) and even["chat"]["tpot_ms_p50"] == pytest.approx(5.0)
    bursts = by_category([window(True)] * 2, cats, 0)
    assert bursts["edit"]["tpot_ms_p50"] == pytest.approx(5.0) and math.isnan(bursts["chat"]["tpot_ms_p50"])
    one = by_category([window(True), window(False)], cats, 0)  # the window that timed tokens stands alone
    assert one["chat"]["tpot_ms_p50"] == pytest.approx(5.0)
    # the stream's step sizes (k = 3, no counters: a step gives at most 4 tokens): the timed window's alone
    steps = by_category([window(True, counters=False), window(False, counters=False)], cats, 3)["chat"]
    assert steps["mean_accepted_length"] == pytest.approx(1.0)
    assert math.isnan(by_category([window(True, counters=False)], cats, 3)["chat"]["mean_accepted_length"])


def test_goodput_leaves_out_a_tpot_bound_where_chunks_carry_merged_steps():
    """The other kind of burst: chunks well apart in time, each carrying two engine steps' tokens where
    the window's counters say a step gives one (no speculation). The study's goodput reads the step from
    each window's counters (autotune.run.evaluate.measure), so a TPOT bound is left out there."""
    from autotune.core.candidate import Candidate, Settings
    from autotune.measure.config import StudyConfig
    from autotune.measure.slo import parse_slos
    from autotune.run.evaluate import measure

    def window(tokens_a_chunk: int) -> dict[str, Any]:  # 41 tokens a request, a chunk every 5 ms a token
        n = 40 // tokens_a_chunk
        chunks = [[0.02, 1]] + [[0.02 + 0.005 * tokens_a_chunk * (j + 1), tokens_a_chunk] for j in range(n)]
        req = {"id": "r", "start": 0.0, "end": chunks[-1][0], "chunks": chunks, "token_ids": list(range(41)),
               "text": "", "finish_reason": "length", "error": None}
        return {"window_s": chunks[-1][0], "requests": [req],
                "spec_counters": {"vllm:spec_decode_num_drafts": 0,
                                  "vllm:spec_decode_num_accepted_tokens_per_pos": []}}

    cfg = StudyConfig(name="g", results_dir=Path("unused"), settings=Settings(model="m"),
                      slos=parse_slos("tpot_ms_p50<=4"))
    base = Candidate({"method": "none"})
    stepped = measure({"windows": [window(1)], "levels": {}}, [], base, cfg)
    assert stepped["tpot_ms_p50"] == pytest.approx(5.0) and stepped["goodput"] == 0.0  # 5 ms misses 4 ms
    merged = measure({"windows": [window(2)], "levels": {}}, [], base, cfg)
    assert math.isnan(merged["tpot_ms_p50"]) and merged["goodput"] == 1.0  # not measured: neither met nor missed


def _detailed(gap_s: float) -> Any:
    """served_rounds.read_bench as the real client's --save-detailed results read: each request's TTFT,
    its chunk gaps (``gap_s`` apart) and output length beside the summary the FAKE launcher wrote."""
    from autotune.gate import served_rounds

    real = served_rounds.read_bench

    def read(path: Path, *, expected: int) -> dict[str, Any]:
        data = real(path, expected=expected)
        return {**data, "ttfts": [0.01] * expected, "itls": [[gap_s] * 39] * expected,
                "output_lens": [40] * expected, "errors": [""] * expected}
    return read


@pytest.mark.parametrize("gap_s, measured", [(5e-6, False), (0.005, True)])
def test_confirms_rounds_report_tpot_only_where_the_stream_timed_tokens(tmp_path, fake, monkeypatch, gap_s,
                                                                        measured):
    from autotune.gate import confirm as c, served_rounds

    monkeypatch.setattr(served_rounds, "read_bench", _detailed(gap_s))
    d = write_results(tmp_path / "study")
    lines: list[str] = []
    served = c.confirm(d, rounds=2, warmups=0, python=fake.python, launcher=False, say=lines.append)
    rounds = [x for x in lines if re.match(r"confirm round \d (pick|baseline): \d", x)]
    assert len(rounds) == 4
    if measured:  # the summary's median TPOT, as before
        assert all("tpot p50 10.0 ms" in x or "tpot p50 6.7 ms" in x for x in rounds), rounds
        assert all(r["tpot_ms_p50"] is not None and r["tpot_not_measured"] is None for r in served["per_round"])
        assert served["pick"]["tpot_ms_p50"] == pytest.approx(1000 / 150) and served["pick"]["tpot_not_measured"] is None
    else:  # no number: neither 0.0 ms nor the client's microseconds
        assert all("tpot not measured: bursts" in x and "tpot p50" not in x for x in rounds), rounds
        assert all(r["tpot_ms_p50"] is None for r in served["per_round"])
        assert all(r["tpot_not_measured"].startswith("tokens reached the client in bursts")
                   for r in served["per_round"])
        for side in ("pick", "baseline"):
            assert served[side]["tpot_ms_p50"] is None and served[side]["tpot_not_measured"]
    saved = json.loads((d / "best.json").read_text())["best"]["served"]
    assert [r["tpot_not_measured"] is None for r in saved["per_round"]] == [measured] * 4
    for n in (1, 2):  # the round files stay
        assert (d / "confirm" / f"round-{n}-pick.pass1.json").is_file()
