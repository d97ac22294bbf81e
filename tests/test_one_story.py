"""One story from console to report (issue 53): each figure once, against a named baseline; lines computed
from the records the tables show; the report shows the decision. A whole study through the CLI on the
FAKE engine (tests/fake_engine.py): five ngram depths, two of them within the selection band, so that
the study runs selection rounds (pooled records, the baseline's among them), stops by its strategy
(predict) and measures its holdout; then `autotune report`, and a study with `--pairs 0` whose served
rounds (confirm's records, written as confirm writes them) are its figure.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from autotune.cli.app import app

TESTS = Path(__file__).resolve().parent
# Depth -> true speedup: k=5 and k=6 (one step past the space's edge) within the selection band.
TRUTH = {"1": 1.5, "2": 2.0, "3": 2.5, "4": 2.8, "5": 2.9, "6": 3.0}
TRIAL_LINE = re.compile(r"^trial +(\d+) (.*)$")
MEASURED = re.compile(r"measured (\d+\.\d+)x over trial (\d+)$")


def _study(out: Path, *extra: str) -> str:
    """`autotune search` on the fake engine, its console output (one line a trial at 300 columns)."""
    with pytest.MonkeyPatch.context() as mp:  # as conftest's fake_engine_env, once for the module
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
        mp.setenv("AUTOTUNE_FAKE_TRUE", json.dumps(TRUTH))
        mp.setenv("COLUMNS", "300")
        mp.setattr("autotune.cli.search.ENGINE", "fake_engine")
        r = CliRunner().invoke(app, ["search", "examples/smoke.jsonl", "--model", "fake-model", "--space",
                                     "tests/data/fake_five.yaml", "--results", str(out), "--samples", "0",
                                     "--candidates", "6", "--study", "story", "--explain", *extra])
    assert r.exit_code == 0, r.output
    return r.output


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    out = tmp_path_factory.mktemp("story")
    text = _study(out)
    res = out / "story"
    return text, res, pd.read_csv(res / "trials.csv"), json.loads((res / "best.json").read_text())


def _trial_lines(text: str) -> dict[int, str]:
    return {int(m.group(1)): m.group(2) for m in map(TRIAL_LINE.match, text.splitlines()) if m}


def test_the_study_ran_selection_rounds_and_a_holdout(story):
    _, _, frame, best = story
    assert (frame["role"] == "re-measure").sum() >= 6 and (frame["role"] == "holdout").sum() == 8
    assert best["baseline"]["engines"] > 1  # the baseline's record pools its selection rounds


def test_a_trials_console_figure_is_its_csv_figure_over_the_named_first_baseline(story):
    """The console's `measured Nx over trial 0` is trials.csv's speedup_over_first_baseline; the other
    speedup columns are over the baseline's current record, named in speedup_over, as best.json's are."""
    text, _, frame, best = story
    first = int(frame.loc[frame["role"] == "baseline", "trial"].iloc[0])
    rows = frame.set_index("trial")
    checked = 0
    for n, line in _trial_lines(text).items():
        m = MEASURED.search(line)
        if m:
            assert int(m.group(2)) == first, line
            assert f"{rows.loc[n, 'speedup_over_first_baseline']:.2f}" == m.group(1), (n, line)
            checked += 1
    assert checked >= 10
    ref = best["baseline"]["trial"]
    assert ref != first and (frame["speedup_over"].dropna() == ref).all()
    assert best["best"]["speedup_over"] == ref
    assert rows.loc[best["best"]["trial"], "speedup_output_tok_s"] == pytest.approx(best["best"]["speedup"]["output_tok_s"])
    assert f"speedup over #{ref}" in text and f"speedup: over trial {ref}, the baseline's record, pooled over " in text


def test_the_baselines_own_rows_show_a_speedup_of_1_only(story):
    text, res, frame, best = story
    base = frame[frame["label"] == best["baseline"]["label"]]
    assert len(base) >= 5  # trial 0, its selection rounds, its holdout instances
    for col in ("speedup_output_tok_s", "speedup_output_tok_s_lo", "speedup_output_tok_s_hi", "speedup_e2e_ms_p50",
                "speedup_tpot_ms_p50", "speedup_over_first_baseline"):
        assert (base[col] == 1.0).all(), (col, base[col].tolist())
    assert best["baseline"]["speedup"]["output_tok_s"] == 1.0 == best["baseline"]["speedup"]["output_tok_s_lo"]
    lines = _trial_lines(text)
    assert not any("measured" in lines[n] or "predicted" in lines[n] for n in base["trial"])
    md = (res / "report.md").read_text()
    for n in base["trial"]:
        row = next(x for x in md.splitlines() if re.match(rf"\|\s+{n} \|", x))
        assert [c.strip() for c in row.split("|")][7:9] == ["1", "1"], row


def test_pooled_and_holdout_rows_are_marked_wherever_shown(story):
    text, res, frame, best = story
    lines, md = _trial_lines(text), (res / "report.md").read_text()
    for r in frame.itertuples():
        if r.role == "re-measure":
            assert f"selection round {r.round}, fresh engine, pooled with trial " in lines[r.trial]
            assert r.record.startswith("pooled: ") and f"(round {r.round})" in r.record
        elif r.role == "holdout":
            assert lines[r.trial].startswith(f"{r.label}") and f"holdout round {r.round}, not pooled" in lines[r.trial]
            assert r.record == f"holdout {r.round}, not pooled"
        else:
            assert r.record == "first engine"
        assert re.search(rf"\|\s+{r.trial} \| {re.escape(str(r.label))}\s+\| {re.escape(r.record)}\s+\|", md), r.trial
    table = text[text.index("Pareto front"):text.index("speedup: over trial")]
    for e in best["pareto"]:
        if e["engines"] > 1:
            assert re.search(rf"│\s+{e['trial']} │ {re.escape(e['label'])} (\(baseline\) |\*best\* )?\(pooled: {e['engines']} engines\)",
                             table), e["trial"]


def test_the_stop_line_reads_the_records_the_table_shows(story):
    """The predict strategy's stop line names the pick with the figure the Pareto table shows, counts
    candidates (not every engine run), and names as unmeasured only configs no trial measured."""
    text, _, frame, best = story
    line = next(x for x in text.splitlines() if x.startswith("predict: stopped after "))
    n = int(re.match(r"predict: stopped after (\d+) candidates: ", line).group(1))
    assert n == frame["role"].isin(["baseline", "candidate"]).sum() == best["strategy"]["candidates"]
    pick, ref = best["best"], best["baseline"]["trial"]
    assert f"the pick ({pick['label']}, {pick['speedup']['output_tok_s']:.2f}x over trial {ref}, as the table shows it)" \
        in line, line
    unmeasured = re.search(r": (.*) at most \d+\.\d+x$", line).group(1)
    assert unmeasured not in set(frame["label"]), line
    assert best["strategy"]["stopped"] in line


def test_the_acceptance_chart_draws_each_config_once_the_pick_and_the_baseline(story):
    from autotune.results.charts import acceptance_chart

    _, _, frame, best = story
    names = [s.name for s in acceptance_chart(frame, best).series]
    labels = [re.sub(r"^#\d+ | \(the pick\)$", "", x) for x in names]
    assert len(labels) == len(set(labels))  # one line per config, however often it was measured
    assert f"#{best['best']['trial']} {best['best']['label']} (the pick)" in names
    assert any(x.startswith("#0 baseline") for x in names)
    speculative = set(frame.loc[frame["label"] != best["baseline"]["label"], "label"])
    assert set(labels) - {"baseline (no speculation: nothing drafted)"} == speculative


def test_importance_counts_first_measurements_only(story, tmp_path):
    from autotune.study.importance import param_importances

    _, res, frame, best = story
    n, _, _ = param_importances(res / "study.db", best["study"], best["objectives"], 1)
    assert n == (frame["role"] == "candidate").sum() < (frame["param_method"] == "ngram").sum()


@pytest.fixture(scope="module")
def confirmed(tmp_path_factory):
    """`search --confirm`: the study measures no holdout, and confirm's served rounds are its figure. The
    served rounds' measurement is a stand-in (no server here: tests/test_confirm.py runs those); what they
    write, best.json's ``best.served`` and ``figure`` and report.md, is confirm's own writer."""
    from autotune.gate import confirm as c
    from autotune.serve.served import verdict

    def stand_in(out, **_):
        report = json.loads((out / "best.json").read_text())
        assert report["figure"]["status"] == "pending" and not report.get("resolution")
        claim = report["best"]["speedup"]
        claimed = (claim["output_tok_s"], claim.get("output_tok_s_lo"), claim.get("output_tok_s_hi"))
        served = {"rounds": 4, "speedup": 2.71, "speedup_lo": 2.55, "speedup_hi": 2.88, "resolution": 0.061,
                  "interval_unit": "served rounds", "stopped": "the served interval resolves +-6%, under the 10% asked",
                  "servers": "forked", "baseline_output_tok_s": [100.0, 98.0, 103.0, 99.0],
                  "pick_output_tok_s": [270.0, 268.0, 280.0, 266.0], "client": {"notes": []},
                  "claimed": dict(zip(("speedup", "lo", "hi"), claimed))}
        c._record(out, served, verdict((2.71, 2.55, 2.88), claimed, resolution=0.061, rounds=4))

    out = tmp_path_factory.mktemp("confirmed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(c, "confirm", stand_in)
        text = _study(out, "--confirm")
    return out / "story", text


FIGURE = "2.71x [2.55-2.88] the baseline's output tok/s"


def test_report_md_states_the_served_figure_and_its_resolution(confirmed):
    res, text = confirmed
    quote = [ln for ln in text.splitlines() if ln.startswith("quote:")][-1]  # the summary after confirm
    assert "2.71x [2.55-2.88] over the baseline's output tok/s" in quote
    md = (res / "report.md").read_text()
    summary = md[:md.index("|")]  # before the trials table
    best = next(x for x in summary.splitlines() if x.startswith("**best:"))
    assert FIGURE in best and "served rounds: served: vllm serve + vllm bench serve" in best and "resolves +-6%" in best


def test_report_html_states_the_served_figure_in_its_text(confirmed, tmp_path):
    from autotune.results.report import write_report

    site = tmp_path / "site"
    write_report(confirmed[0], site)
    page = (site / "report.html").read_text()
    body = page[page.index("<h1>"):]
    text = html.unescape(re.sub(r"<script.*?</script>|<[^>]+>", " ", body[:body.index('<div')], flags=re.S))
    assert FIGURE in text and "resolves +-6%" in text and "served rounds" in text
    assert "claimed: " in text and "the evidence trial" in text  # the claim named as such beside it
    shutil.rmtree(site)
