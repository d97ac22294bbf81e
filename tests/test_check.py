import json
import math

import pytest
from typer.testing import CliRunner

from autotune.gate.check import OK, REGRESSED, REGRESSION, SAME_RUN, TWO_RUNS, UNDECIDED, compare, decide, parse_tolerance
from autotune.cli.app import app
from autotune.core.errors import BadInput

runner = CliRunner()
OBJECTIVES = ["output_tok_s", "e2e_ms_p50", "output_tok_s@concurrency=8"]


def entry(tok_s, e2e, *, at8=None, label="ngram k=3", passed=True, spread=0.01, method="ngram"):
    """A best.json entry with two measured windows a side (so ratio intervals exist)."""
    at8 = tok_s * 3 if at8 is None else at8
    m = {"output_tok_s": tok_s, "e2e_ms_p50": e2e, "output_tok_s@concurrency=8": at8,
         "output_tok_s_windows": [tok_s * (1 - spread), tok_s * (1 + spread)],
         "e2e_ms_p50_windows": [e2e * (1 - spread), e2e * (1 + spread)],
         "output_tok_s_windows@concurrency=8": [at8, at8]}
    return {"trial": 1, "label": label, "candidate": {"method": method}, "engine_kwargs": {"model": "m"},
            "measurement": m, "verdict": {"passed": passed, "reason": "ok" if passed else "greedy mismatch"}}


def with_speedup(e, base):
    bm, m = base["measurement"], e["measurement"]
    e["speedup"] = {"output_tok_s": m["output_tok_s"] / bm["output_tok_s"],
                    "output_tok_s_lo": m["output_tok_s"] / bm["output_tok_s"] * 0.98,
                    "output_tok_s_hi": m["output_tok_s"] / bm["output_tok_s"] * 1.02}
    return e


def report(best, *, base=(100, 200), deployed=None, vllm="0.32.0"):
    if deployed is not None and deployed is not best and "measurement" in deployed:
        deployed = {**deployed, "trial": 99}  # another trial than the pick's (the same object: the same trial)
    b = entry(*base, label="none", method="none")
    return {"schema_version": 1, "objectives": OBJECTIVES, "vllm_version": vllm, "platform": {"platform": "cpu"},
            "workload": "w.jsonl", "load": "concurrency=1", "baseline": with_speedup(b, b),
            "best": with_speedup(best, b) if best else None,
            "deployed": with_speedup(deployed, b) if deployed and "measurement" in deployed else deployed}


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("0.1", 0.1), ("0", 0.0)])
def test_parse_tolerance(text, value):
    assert parse_tolerance(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["five", "150%", "-1"])
def test_bad_tolerance(text):
    with pytest.raises(BadInput, match="--tolerance"):
        parse_tolerance(text)


def test_same_run_pick_against_the_re_measured_deployed_config():
    old = report(entry(180, 110))
    # The new pick is the deployed config itself, re-measured: ratio 1 everywhere.
    same = entry(150, 130)
    r = compare(report(same, base=(80, 230), deployed=same), old, tolerance=0.05)
    assert r.ok and r.basis == SAME_RUN and [c.ratio for c in r.objectives] == [1.0, 1.0, 1.0]
    # A pick 3% worse on e2e than the deployed config measured beside it: within 5%.
    r = compare(report(entry(160, 134, label="ngram k=4"), deployed=entry(150, 130)), old, tolerance=0.05)
    assert r.ok and r.objectives[0].ratio == pytest.approx(160 / 150) and r.objectives[1].ratio == pytest.approx(130 / 134)
    lo, hi = r.objectives[0].lo, r.objectives[0].hi
    assert lo < 160 / 150 < hi


def test_a_regression_at_a_second_load_level_fails_the_gate():
    """`check` used to skip metric@level objectives (no level parsing of its own)."""
    r = compare(report(entry(150, 130, at8=300), deployed=entry(150, 130, at8=450)), report(entry(150, 130)),
                tolerance=0.05)
    assert not r.ok and [c.name for c in r.objectives if c.regressed] == ["output_tok_s@concurrency=8"]
    assert r.reasons[0].startswith("output_tok_s@concurrency=8: the new pick is 33.3% worse than the deployed config "
                                   "measured in the same run (450 -> 300, ratio 0.667 [0.67-0.67])")


def test_an_inflated_old_claim_decides_nothing_when_the_deployed_config_was_re_measured():
    old = report(entry(150, 130))
    old["best"]["measurement"]["output_tok_s"] *= 3  # planted: 3x what the config can do
    for key in ("output_tok_s", "output_tok_s_lo", "output_tok_s_hi"):
        old["best"]["speedup"][key] *= 3
    r = compare(report(entry(150, 130), deployed=entry(150, 130)), old, tolerance=0.05)
    assert r.ok and r.basis == SAME_RUN
    assert r.drift.then == pytest.approx(4.5) and r.drift.now == pytest.approx(1.5) and r.drift.lost_gain
    assert any("lost gain since the old run: 4.50x [4.41-4.59] then, 1.50x [1.47-1.53] now" in n for n in r.notes)


def test_without_a_re_measurement_speedups_are_compared_across_two_runs():
    old = report(entry(180, 110), base=(100, 200))
    # Absolute tok/s 40% lower today (a slower machine), same speedup: throughput, whose speedup carries an
    # interval, holds; the latency objectives have none across two runs, so they cannot tell (no point decides).
    r = compare(report(entry(108, 183), base=(60, 333)), old, tolerance=0.05)
    assert r.status == UNDECIDED and r.basis == TWO_RUNS and any("spans two runs" in n for n in r.notes)
    assert r.objectives[0].ratio == pytest.approx(1.0) and r.objectives[0].decision == OK
    assert [c.decision for c in r.objectives[1:]] == [UNDECIDED, UNDECIDED] and r.reasons == []
    assert r.undecided[0].startswith("e2e_ms_p50: cannot tell") and "a point decides nothing; a run with " \
        "--warm-start decides on pairs measured side by side" in r.undecided[0]
    # The deployed draft pick (1.8x) against a new study that allows no speculation (1.0x): regression.
    r = compare(report(entry(100, 200, label="none", method="none"), base=(100, 200)), old, tolerance=0.05)
    assert not r.ok and r.reasons[0].startswith(
        "output_tok_s: the new pick's speedup over its baseline is 44.4% below the deployed config's in the old run "
        "(1.80x -> 1.00x, ratio 0.556 [0.54-0.57])")  # the two runs' intervals combined in quadrature


def test_incorrect_or_missing_pick_fails_and_a_failed_deployed_config_falls_back():
    old = report(entry(100, 100))
    r = compare(report(entry(120, 90, passed=False), deployed=entry(100, 100)), old, tolerance=0.05)
    assert not r.ok and "failed its correctness checks" in r.reasons[0]
    r = compare(report(None), old, tolerance=0.05)
    assert not r.ok and "no feasible" in r.reasons[0]
    failed = {"trial": 1, "label": "ngram k=3", "candidate": {"method": "ngram"}, "failure": "RuntimeError: boom"}
    r = compare(report(entry(100, 100), deployed=failed), old, tolerance=0.05)
    assert r.basis == TWO_RUNS and "the deployed config failed in this run: RuntimeError: boom" in r.notes
    r = compare(report(entry(100, 100), vllm="0.33.0"), old, tolerance=0.05)  # two runs: latency cannot tell
    assert r.reasons == [] and r.changed_context == {"vllm_version": ("0.32.0", "0.33.0")}


def test_cli_exit_codes_summary_and_json(tmp_path, monkeypatch):
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "best.json").write_text(json.dumps(report(entry(100, 100))))
    (tmp_path / "new" / "best.json").write_text(json.dumps(report(entry(70, 100), deployed=entry(100, 100))))
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    runner = CliRunner()
    r = runner.invoke(app, ["check", str(tmp_path / "new"), "--against", str(tmp_path / "old")])
    assert r.exit_code == 1 and r.stdout.startswith("## autotune check: REGRESSION")
    text = summary.read_text()
    assert "output_tok_s: the new pick is 30.0% worse than the deployed config measured in the same run" in text
    assert "Compared: the new pick against the deployed config, both measured in the new run." in text
    r = runner.invoke(app, ["check", str(tmp_path / "new"), "--against", str(tmp_path / "old"), "--tolerance", "40%",
                            "--json"])
    out = json.loads(r.stdout)
    assert r.exit_code == 0 and out["ok"] is True and out["basis"] == SAME_RUN
    assert out["objectives"][0]["ratio"] == pytest.approx(0.7) and out["objectives"][0]["lo"] == pytest.approx(0.7, abs=0.03)
    r = runner.invoke(app, ["check", str(tmp_path / "new"), "--against", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "no such results file" in r.stderr


def test_nightly_flow_on_the_fake_engine(tmp_path, monkeypatch, fake_engine_env):
    """Deployed results, a warm-started nightly study, then the gate; trials on the FAKE engine
    (deterministic timings), so every outcome below is exact at the default 5% tolerance."""
    from autotune.core.study_report import load_report

    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.setenv("AUTOTUNE_FAKE_NOISE", "0")  # quiet windows: the deterministic timings this test states
    common = ["--model", "fake-model", "--samples", "0", "--results", str(tmp_path), "--repeats", "2"]
    ngram = '{"method": "ngram", "num_speculative_tokens": 4}'
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--space", "tests/data/fake_space_ok.yaml", "--trials", "2",
                            "--study", "deployed", "--try", ngram, *common])
    assert r.exit_code == 0, r.output
    deployed = tmp_path / "deployed"
    old = load_report(deployed)
    # The knob the --try left out took the baseline's value: exactly the config given was measured.
    assert old["best"]["candidate"] == {"method": "ngram", "num_speculative_tokens": 4, "kv_cache_dtype": "auto"}
    assert old["serve_command"].startswith("vllm serve")  # best.json carries what --json prints
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--space", "tests/data/fake_space_ok.yaml", "--trials", "2",
                            "--study", "nightly", "--warm-start", str(deployed), "--json", *common])
    assert r.exit_code == 0, r.output
    new = json.loads(r.stdout)  # stdout is the JSON alone: the warm-start lines went to stderr
    assert "warm start: re-measuring 1 config(s)" in r.stderr
    assert new["deployed"]["trial"] == 1 and new["deployed"]["candidate"] == old["best"]["candidate"]
    assert new["warm_start"] == {"from": str(deployed)}
    nightly = tmp_path / "nightly"
    r = runner.invoke(app, ["check", str(nightly), "--against", str(deployed), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["basis"] == SAME_RUN
    # A planted, inflated claim in the deployed results decides nothing: the gate is within the new run.
    planted = tmp_path / "planted"
    planted.mkdir()
    old["best"]["measurement"]["output_tok_s"] *= 3
    (planted / "best.json").write_text(json.dumps(old))
    r = runner.invoke(app, ["check", str(nightly), "--against", str(planted)])
    assert r.exit_code == 0, r.output
    # A new study whose space allows no speculation: the deployed config is faster, and the gate says so.
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--space", "tests/data/fake_space_nospec.yaml",
                            "--trials", "1", "--study", "nospec", "--warm-start", str(deployed), *common])
    assert r.exit_code == 0, r.output
    assert "outside space 'fake-nospec'" in r.output
    r = runner.invoke(app, ["check", str(tmp_path / "nospec"), "--against", str(deployed)])
    assert r.exit_code == 1 and "REGRESSION" in r.stdout and "spans two runs" in r.stdout
    assert "output_tok_s: the new pick's speedup over its baseline is" in r.stdout


def test_across_two_runs_served_speedups_replace_the_in_process_claims():
    """When both picks were confirmed served (autotune confirm), throughput across two runs is judged
    on the served speedups: in-process claims run 4-17% above what a served config delivers."""
    old, new = report(entry(180, 110)), report(entry(150, 110))  # in-process tok/s: 1.80x then, 1.50x now
    old["objectives"] = new["objectives"] = ["output_tok_s"]  # served numbers are at the study's own load
    old["best"]["served"] = {"speedup": 1.50, "speedup_lo": 1.48, "speedup_hi": 1.52}
    new["best"]["served"] = {"speedup": 1.48, "speedup_lo": 1.46, "speedup_hi": 1.50}
    r = compare(new, old, tolerance=0.05)
    assert r.ok and r.basis == TWO_RUNS and r.objectives[0].ratio == pytest.approx(1.48 / 1.50)
    lo, hi = r.objectives[0].lo, r.objectives[0].hi  # in quadrature: narrower than the widest quotient
    assert 1.46 / 1.52 < lo < 1.48 / 1.50 < hi < 1.50 / 1.48
    # Wider served intervals, same points: the ratio's interval straddles 0.95, so the gate cannot tell.
    new["best"]["served"] = {"speedup": 1.48, "speedup_lo": 1.40, "speedup_hi": 1.56}
    r = compare(new, old, tolerance=0.05)
    assert r.status == UNDECIDED and r.reasons == [] and r.undecided[0].startswith("output_tok_s: cannot tell")
    new["best"]["served"] = {"failure": "the pick server exited before it was ready"}
    r = compare(new, old, tolerance=0.05)
    assert not r.ok and any("failed when served" in x for x in r.reasons)


@pytest.mark.parametrize("ratio, lo, hi, decision", [
    (0.90, 0.85, 0.94, REGRESSED),   # the whole interval below 0.95
    (0.93, 0.90, 0.97, UNDECIDED),   # the point is below the line, the interval is not: cannot tell
    (0.97, 0.93, 1.01, UNDECIDED),   # the point is above the line, the interval is not: cannot tell either
    (0.97, 0.95, 0.99, OK),          # at or above the line throughout
    (0.93, None, None, UNDECIDED),   # no interval: cannot tell, whatever the point (issue 60)
    (0.97, None, None, UNDECIDED),
])
def test_the_gate_decides_on_the_interval_not_the_point(ratio, lo, hi, decision):
    assert decide(ratio, lo, hi, 0.05) == decision


def test_a_straddling_interval_is_cannot_tell_with_its_own_exit_code(tmp_path):
    """The point ratio 0.96 used to pass and 0.94 to fail, whatever the windows' spread: both are
    'cannot tell' when the interval crosses 0.95, and exit 4, so nightly CI neither deploys nor pages."""
    old = report(entry(100, 100))

    def report1(*a, **k):  # throughput alone
        rep = report(*a, **k)
        rep["objectives"] = ["output_tok_s"]
        return rep

    for tok_s in (96, 94):
        new = report1(entry(tok_s, 100, spread=0.05), deployed=entry(100, 100, spread=0.05))
        r = compare(new, old, tolerance=0.05)
        assert r.status == UNDECIDED and not r.ok and r.reasons == [], tok_s
        assert r.objectives[0].lo < 0.95 < r.objectives[0].hi
        assert r.undecided[0].startswith(f"output_tok_s: cannot tell: the new pick over the deployed config measured in "
                                         f"the same run is {tok_s / 100:.3f} [")
    # Tight windows: 0.94 is a regression, 0.96 is not.
    assert compare(report1(entry(94, 100, spread=0.001), deployed=entry(100, 100, spread=0.001)), old,
                   tolerance=0.05).status == REGRESSION
    assert compare(report1(entry(96, 100, spread=0.001), deployed=entry(100, 100, spread=0.001)), old,
                   tolerance=0.05).status == OK
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "best.json").write_text(json.dumps(old))
    (tmp_path / "new" / "best.json").write_text(json.dumps(report1(entry(96, 100, spread=0.05),
                                                                  deployed=entry(100, 100, spread=0.05))))
    r = runner.invoke(app, ["check", str(tmp_path / "new"), "--against", str(tmp_path / "old")])
    assert r.exit_code == 4 and r.stdout.startswith("## autotune check: CANNOT TELL")
    assert "**cannot tell**" in r.stdout


def test_a_pareto_config_that_holds_every_objective_is_named():
    """The pick is chosen on the first objective; when it loses on another, a Pareto config that
    holds all of them against the deployed config is named beside the verdict."""
    new = report(entry(150, 160, spread=0.001), deployed=entry(140, 130, spread=0.001))
    other = entry(145, 128, label="ngram k=2", spread=0.001)
    other["trial"] = 7
    new["pareto"] = [new["best"], other]
    r = compare(new, report(entry(140, 130)), tolerance=0.05)
    assert r.status == REGRESSION and [c.name for c in r.objectives if c.regressed] == ["e2e_ms_p50"]
    assert any(n.startswith("ngram k=2 (trial 7, on the new Pareto front) holds every objective") for n in r.notes)
    other["measurement"]["e2e_ms_p50"] = 160  # now it loses e2e too: nothing is named
    other["measurement"]["e2e_ms_p50_windows"] = [160, 160]
    r = compare(new, report(entry(140, 130)), tolerance=0.05)
    assert not any("holds every objective" in n for n in r.notes)


def test_a_pick_that_is_the_deployed_configs_own_re_measurement_is_no_change():
    """Warm-started, the new pick can be the very trial that re-measured the deployed config: one
    record compared with itself is ratio 1 with no uncertainty, not a bootstrap of it against itself
    (which straddled 0.95 and said 'cannot tell' on the real engine)."""
    same = entry(150, 130, spread=0.08)
    r = compare(report(same, deployed=same), report(entry(150, 130)), tolerance=0.05)
    assert r.status == OK and all((c.ratio, c.lo, c.hi) == (1.0, 1.0, 1.0) for c in r.objectives)
    other = dict(entry(150, 130, spread=0.08), trial=2)  # the same numbers from another trial: windows decide
    r = compare(report(other, deployed=same), report(entry(150, 130)), tolerance=0.05)
    assert r.status == UNDECIDED


def test_two_runs_with_disjoint_objectives_compared_nothing_and_say_so(tmp_path):
    """A gate that compared nothing used to pass (exit 0, 'no regression'): runs that optimised other
    objectives, not re-measured side by side, share no objective to judge. Exit 2, naming both sides'."""
    new, old = report(entry(150, 110)), report(entry(100, 100))
    new["objectives"], old["objectives"] = ["e2e_ms_p50"], ["output_tok_s"]
    del old["best"]["measurement"]["e2e_ms_p50"], old["baseline"]["measurement"]["e2e_ms_p50"]
    with pytest.raises(BadInput, match=r"compared nothing.*new results' objectives: e2e_ms_p50.*deployed "
                                       r"results' objectives: output_tok_s"):
        compare(new, old, tolerance=0.05)
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "best.json").write_text(json.dumps(old))
    (tmp_path / "new" / "best.json").write_text(json.dumps(new))
    r = runner.invoke(app, ["check", str(tmp_path / "new"), "--against", str(tmp_path / "old")])
    assert r.exit_code == 2 and "compared nothing" in r.stderr and "Traceback" not in r.output
    # Objectives with no known direction compare nothing either.
    new["objectives"] = old["objectives"] = ["goodput"]
    with pytest.raises(BadInput, match="compared nothing"):
        compare(new, old, tolerance=0.05)


def test_a_run_checked_against_itself_passes(tmp_path):
    """Issue 49: `autotune check results/demo --against results/demo` printed CANNOT TELL 1.000 [0.31-3.25],
    exit 4: the two-run path added both intervals whole. The same run is the same evidence."""
    rep = report(entry(180, 110), base=(100, 200))
    rep.update(study="demo", created="2026-12-05T10:00:00+00:00", storage="sqlite:///x")
    r = compare(rep, json.loads(json.dumps(rep)), tolerance=0.05)
    assert r.ok and r.status == OK and r.objectives[0].ratio == 1.0 and "the same run" in r.objectives[0].unit


def test_the_same_run_gate_decides_on_paired_holdout_rounds():
    """With a warm start, the pick and the deployed config ran in the same holdout rounds (best.json's
    ``gate``): check decides on those pairs at its own tolerance by the gate's sequential test, and where
    it cannot (the study stopped before its gate rounds ended), says about how many pairs would."""
    new = report(entry(150, 110))
    new["deployed"] = entry(150, 110, label="ngram k=2")
    new["deployed"]["trial"] = 7
    g = {"deployed_trial": 7, "deployed_label": "ngram k=2", "tolerance": 0.05,
         "objectives": {"output_tok_s": {"direction": "maximize", "ratio": 0.99, "lo": 0.96, "hi": 1.02, "pairs": 6,
                                         "log_mean": math.log(0.99), "log_sd": 0.03, "final": False,
                                         "decision": "ok", "pairs_needed": None}}}
    new["gate"] = g
    new["objectives"] = ["output_tok_s"]
    old = report(entry(180, 110))
    r = compare(new, old, tolerance=0.05)
    assert r.ok and r.basis == SAME_RUN and r.objectives[0].unit == "paired holdout rounds"
    assert r.objectives[0].pairs == 6
    # results without the log spread (written before it was kept): read back from the t-interval, sd 0.082
    o = g["objectives"]["output_tok_s"]
    for k in ("log_mean", "log_sd"):
        del o[k]
    o.update(ratio=0.98, lo=0.90, hi=1.07, decision="cannot tell")
    r = compare(new, old, tolerance=0.05)
    assert r.status == UNDECIDED and "about 9 paired holdout rounds would decide (this run measured 6" \
        in r.undecided[0], r.undecided
    o["final"] = True  # the gate's rounds reached their cap: the point against the line 0.95 decides
    assert compare(new, old, tolerance=0.05).status == OK
    o.update(ratio=0.94)
    assert compare(new, old, tolerance=0.05).status == REGRESSION
    o.update(ratio=0.88, lo=0.84, hi=0.92, final=False)
    assert compare(new, old, tolerance=0.05).status == REGRESSION
    new["best"]["served"] = {"failure": "the pick server exited before it was ready"}
    r = compare(new, old, tolerance=0.05)
    assert not r.ok and any("failed when served" in x for x in r.reasons)


def test_the_gates_rounds_run_until_its_test_decides_and_a_planted_regression_fails():
    """Through the production study and holdout (tests/sim_study.py, the choice PLANTED on a config 10%
    slower than the deployed one, noise at persistence 0.8): check fails it in most studies, after at
    least GATE_MIN_PAIRS gate pairs and never more than GATE_MAX_ROUNDS; at a ratio inside the
    indifference zone (0.95) the rounds run to the cap, where the point decides ("final"), never
    "cannot tell". benchmarks/calibration_fake.py --mode gate measures the rates on 1,000 studies."""
    from machine_noise import Noise
    from sim_study import Truth, report_of, simulate

    from autotune.measure.pairs import GATE_MIN_PAIRS
    from autotune.study.holdout import GATE_MAX_ROUNDS

    old = {"best": {"label": "ngram k=2", "candidate": {"method": "ngram", "num_speculative_tokens": 2}, "trial": 0,
                    "verdict": {"passed": True}, "speedup": {"output_tok_s": 3.0}, "measurement": {}},
           "objectives": ["output_tok_s"]}
    deployed = {"method": "ngram", "num_speculative_tokens": 2}

    def gate(seed, ratio, phi):
        view = simulate(seed, Noise(phi=phi), truth=Truth({1: 3.0 * ratio, 2: 3.0, 3: 2.0, 4: 1.9, 5: 1.8}),
                        deployed=deployed, plant=1)
        rep = report_of(view)
        assert rep["best"]["label"] == "ngram k=1"  # the planted pick
        return rep["gate"]["objectives"]["output_tok_s"], compare(rep, old, tolerance=0.05)

    results = [gate(seed, 0.9, 0.8) for seed in range(20)]
    assert sum(r.status == REGRESSION for _, r in results) >= 17, [r.status for _, r in results]
    assert all(GATE_MIN_PAIRS <= g["pairs"] <= GATE_MAX_ROUNDS for g, _ in results)
    capped = [(g, r) for g, r in (gate(seed, 0.95, 0.0) for seed in range(12)) if g["final"]]
    assert capped, "no gate reached its cap in the zone"
    for g, r in capped:
        assert g["pairs"] == GATE_MAX_ROUNDS and g["decision"] in (OK, REGRESSED) and r.status != UNDECIDED
