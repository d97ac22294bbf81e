"""Issue 60: a gate that never decides on a point. Every objective of `autotune check` gates only on an
interval or the gate's sequential test over paired rounds; without one it cannot tell (exit 4) and says
what would decide. A run checked against itself prints one basis."""

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.gate.check import SAME_EVIDENCE, SAME_RUN, compare
from test_check import entry, report

runner = CliRunner()
DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
E2E_10 = 130 * 1.1  # the pick's e2e p50, planted 10% above the deployed config's 130 ms


def _check(tmp_path: Path, new: dict, old: dict, *args: str):
    for name, rep in (("new", new), ("old", old)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "best.json").write_text(json.dumps(rep))
    return runner.invoke(app, ["check", str(tmp_path / "new"), "--against", str(tmp_path / "old"), *args])


def _with_pairs(new: dict, ratios: dict[str, float], n: int = 8, sd: float = 0.03) -> dict:
    """best.json's ``gate``: the pick against the deployed config over n paired holdout rounds."""
    half = 2.36 * sd / math.sqrt(n)  # t(7) at 97.5%, for the interval the table shows
    new["gate"] = {"objectives": {k: {"ratio": r, "lo": r * math.exp(-half), "hi": r * math.exp(half), "pairs": n,
                                      "log_mean": math.log(r), "log_sd": sd, "final": False}
                                  for k, r in ratios.items()}}
    return new


def _planted(interval: str) -> dict:
    """The pick 10% slower on e2e p50 than the deployed config measured beside it, throughput the same;
    ``interval``: "pairs" (the holdout's paired rounds), "windows" (before round 5) or "none"."""
    new = report(entry(150, E2E_10, spread=0.001), deployed=entry(150, 130, spread=0.001))
    new["objectives"] = ["output_tok_s", "e2e_ms_p50"]
    if interval == "pairs":
        return _with_pairs(new, {"output_tok_s": 1.0, "e2e_ms_p50": 130 / E2E_10})
    if interval == "none":  # no windows saved on either side: a point ratio and nothing else
        for side in (new["best"], new["deployed"]):
            del side["measurement"]["e2e_ms_p50_windows"]
    return new


@pytest.mark.parametrize("interval", ["pairs", "windows"])
def test_a_planted_10pct_e2e_regression_with_an_interval_fails(tmp_path, interval):
    r = _check(tmp_path, _planted(interval), report(entry(150, 130)))
    assert r.exit_code == 1 and r.stdout.startswith("## autotune check: REGRESSION"), r.stdout
    reason = next(x for x in r.stdout.splitlines() if x.startswith("- e2e_ms_p50:"))
    assert "9.1% worse than the deployed config measured in the same run" in reason
    assert ("sequential test over 8 paired holdout rounds" if interval == "pairs" else "[0.91-0.91]") in reason
    assert "point" not in r.stdout


def test_the_same_regression_without_an_interval_cannot_tell(tmp_path):
    """Used to exit 1 with "(no interval: the point decided)"."""
    r = _check(tmp_path, _planted("none"), report(entry(150, 130)))
    assert r.exit_code == 4 and r.stdout.startswith("## autotune check: CANNOT TELL"), r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("- e2e_ms_p50:"))
    assert line.startswith("- e2e_ms_p50: cannot tell: the new pick over the deployed config measured in the same run "
                           "is 0.909 (windows of one instance each), with no interval: a point decides nothing; a new "
                           "study with --warm-start (and without --no-remeasure) measures the two in paired holdout "
                           "rounds, which decide"), line
    assert "| e2e_ms_p50 (minimize) | 130 | 143 | 0.909 (no interval) **cannot tell** |" in r.stdout
    # Across two runs (no --warm-start) best.json keeps no interval for e2e's speedup: cannot tell either,
    # whichever side of the line its point lies (it used to fail at 0.91 and pass at 1.10).
    for e2e in (E2E_10, 130 / 1.1):
        c = compare(report(entry(150, e2e)), report(entry(150, 130)), tolerance=0.05)
        e = next(o for o in c.objectives if o.name == "e2e_ms_p50")
        assert e.decision == "cannot tell" and (e.lo, e.hi) == (None, None) and c.reasons == [], e2e
        assert any(u.startswith("e2e_ms_p50: cannot tell") and "a run with --warm-start decides on pairs measured "
                   "side by side" in u for u in c.undecided)


def _fresh_demo() -> dict:
    """Issue 60's case, planted on the saved round-5 demo: a fresh demo run (another study file) served
    at 2.49x [1.89-3.26] (the issue's figures) and its pick's e2e p50 25% slower, with no --warm-start."""
    new = json.loads((DATA / "demo_round5_best.json").read_text())
    new.update(created="2026-12-08T10:00:00+00:00", storage="sqlite:///results/demo/study.db")
    new["best"]["served"].update(speedup=2.49, speedup_lo=1.89, speedup_hi=3.26)
    new["best"]["measurement"]["e2e_ms_p50"] *= 1.25
    return new


def test_the_demo_against_the_saved_round5_run_does_not_fail_on_a_point(tmp_path):
    """`check demo --against deployed` exited 1, decided by e2e_ms_p50 "(no interval: the point decided)",
    while throughput read 0.817 [0.57-1.18] cannot tell."""
    old = json.loads((DATA / "demo_round5_best.json").read_text())
    r = _check(tmp_path, _fresh_demo(), old)
    assert r.exit_code == 4 and r.stdout.startswith("## autotune check: CANNOT TELL"), r.stdout
    assert "| output_tok_s (maximize) | 3.041 | 2.49 | 0.819 [0.56-1.18] **cannot tell** |" in r.stdout
    assert "| e2e_ms_p50 (minimize) | 4.169 | 3.336 | 0.800 (no interval) **cannot tell** |" in r.stdout
    assert "point decided" not in r.stdout and "REGRESSION" not in r.stdout
    # the study's own best.json (before confirm) against the same run after it: identical evidence
    r = runner.invoke(app, ["check", str(DATA / "demo_round5_study_best.json"), "--against",
                            str(DATA / "demo_round5_best.json")])
    assert r.exit_code == 0, r.stdout


@pytest.mark.parametrize("warm", [False, True])
def test_a_run_checked_against_itself_prints_one_basis(tmp_path, warm):
    """It printed both "the comparison spans two runs" and "the same run: identical evidence on both sides"
    (and, warm-started, "both measured in the new run" beside the latter)."""
    rep = (report(entry(180, 110), deployed=entry(170, 115)) if warm else
           json.loads((DATA / "demo_round5_best.json").read_text()))
    rep.setdefault("created", "2026-12-05T10:00:00+00:00")
    r = _check(tmp_path, rep, rep)
    assert r.exit_code == 0 and r.stdout.startswith("## autotune check: no regression"), r.stdout
    basis = [x for x in r.stdout.splitlines() if x.startswith("Compared:")]
    assert basis == ["Compared: the same run on both sides (identical evidence): nothing changed, nothing to judge."]
    for other in ("spans two runs", "measured in the new run", "then, ", "| objective |"):
        assert other not in r.stdout, other
    r = _check(tmp_path, rep, rep, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["basis"] == SAME_EVIDENCE
    # a warm-started run against the deployed results it re-measured is a comparison, on the same run's basis
    if warm:
        assert compare(rep, report(entry(170, 115)), tolerance=0.05).basis == SAME_RUN
