"""The depth per batch size (autotune.study.schedule): pure rules, then studies on the FAKE engine.

The fake engine (tests/fake_engine.py) makes a step of depth k in a batch of c cost 1 + 0.15 c k
baseline steps at the extra load levels, with every draft accepted: deep speculation wins alone
and loses at 8 in flight, and it reads a config's schedule as vLLM does.
"""

import json
import os
import shlex

import pytest

from autotune.core.candidate import Candidate, Settings
from autotune.serve.export import command, config_yaml, llm_kwargs_json
from autotune.core.load import LoadPattern, level_loads, parse_levels, ramp_limits
from autotune.core.errors import BadInput
from autotune.results.files import write_results
from autotune.study.schedule import LevelPick, best_depths, instance_spread, judge, not_needed, ranges
from autotune.core.space import load_space
from autotune.measure.config import StudyConfig
from autotune.study.loop import run_study
from autotune.study.view import StudyView
from autotune.core.workload import load_workload


def m(**at):
    """A measurement with output tok/s at levels: m(c1=100, c8=50) (c1 is the study's own level)."""
    out = {}
    for name, v in at.items():
        key = "output_tok_s" if name == "c1" else f"output_tok_s@concurrency={name[1:]}" if name[0] == "c" \
            else f"output_tok_s@ramp={name[1:]}"
        out[key] = v
        out[key.replace("output_tok_s", "output_tok_s_windows")] = [v * 0.99, v * 1.01]
    return out


LEVELS = ["concurrency=1", "concurrency=8", "ramp=8"]


def test_each_level_takes_the_smallest_depth_within_the_noise_of_its_best():
    family = {0: m(c1=100, c8=200), 2: m(c1=180, c8=190), 4: m(c1=186, c8=120)}
    picks = best_depths(family, LEVELS, "concurrency=1", noise=0.05)
    # At 1: k=4 is best (186) but k=2 (180) is within 5%: the smaller depth. At 8: no speculation.
    assert [(p.batch, p.k, p.best_k) for p in picks] == [(1, 2, 4), (8, 0, 0)]
    assert [(p.batch, p.k) for p in best_depths(family, LEVELS, "concurrency=1", noise=0.01)] == [(1, 4), (8, 0)]


def test_no_schedule_when_one_depth_is_within_the_noise_of_the_best_at_every_level():
    """The tie rule alone (a smaller depth within the noise at 8) makes no schedule: depth 16 is the
    best measured at both levels. Nor does a best depth that differs by level where one depth is
    within the noise of the best everywhere. Only where every single depth falls short somewhere by
    more than the noise does the tie rule decide each level."""
    def why(family, noise=0.10):
        return not_needed(best_depths(family, LEVELS, "concurrency=1", noise=noise), family, "concurrency=1", noise)

    family = {5: m(c1=500, c8=1000), 16: m(c1=560, c8=1040)}
    picks = best_depths(family, LEVELS, "concurrency=1", noise=0.10)
    assert [(p.batch, p.k, p.best_k) for p in picks] == [(1, 16, 16), (8, 5, 16)]
    assert why(family).startswith("depth 16 measured best at every level")
    # Best at 8 is now depth 5, but depth 16 is 0.95x of it there (within 10%): still no schedule.
    family[5] = m(c1=500, c8=1100)
    assert why(family) == ("depth 16 is within the noise (10%) of the best at every level (at worst 0.95x, "
                           "at concurrency=8): no schedule beats it by more than the noise")
    # At 3% noise neither depth holds everywhere (depth 5: 0.89x at 1, depth 16: 0.95x at 8).
    assert [(p.k, p.best_k) for p in best_depths(family, LEVELS, "concurrency=1", noise=0.03)] == [(16, 16), (5, 5)]
    assert why(family, noise=0.03) is None
    # Depth 5 within the noise at 1 and best at 8: depth 5 is the answer.
    assert why({5: m(c1=550, c8=1100), 16: m(c1=560, c8=1040)}).startswith("depth 5 is within the noise (10%)")
    # The benchmark's table (benchmarks/depth_by_load.py, 1 to 256 in flight): depth 16 within 13% everywhere
    # (at worst 0.88x, at 128), 13% being the most one config moved between engine instances here.
    five = ["concurrency=1", "concurrency=8", "concurrency=32", "concurrency=128", "concurrency=256"]
    table = {4: [528, 1816, 2562, 2838, 3222], 8: [743, 2023, 2395, 2999, 3219], 16: [728, 2154, 3047, 2631, 3068]}
    family = {k: {("output_tok_s" if lv == five[0] else f"output_tok_s@{lv}"): v for lv, v in zip(five, vs)}
              for k, vs in table.items()}
    picks = best_depths(family, five, five[0], noise=0.13)
    assert [p.best_k for p in picks] == [8, 16, 16, 8, 4]
    assert not_needed(picks, family, five[0], 0.13).startswith("depth 16 is within the noise (13%)")
    assert not_needed([], {}, "concurrency=1", 0.10).startswith("no depth")


def test_ranges_start_at_one_split_between_levels_and_merge_equal_neighbours():
    pick = lambda b, k: LevelPick(f"concurrency={b}", b, k, 1.0, k, 1.0)  # noqa: E731
    assert ranges([pick(1, 4), pick(8, 1)]) == [[1, 2, 4], [3, 256, 1]]
    assert ranges([pick(1, 4), pick(4, 4), pick(16, 0)]) == [[1, 8, 4], [9, 256, 0]]
    assert ranges([pick(2, 3), pick(3, 1)]) == [[1, 2, 3], [3, 256, 1]]
    assert ranges([pick(1, 2)]) == [[1, 256, 2]]


def test_ranges_pass_vllms_own_schedule_validation():
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    rs = ranges([LevelPick("concurrency=1", 1, 4, 1, 4, 1), LevelPick("concurrency=8", 8, 0, 1, 0, 1)])
    dense = build_dynamic_sd_schedule_lookup(rs, vllm_max_batch_size=16, vllm_num_speculative_tokens=4)
    assert dense[1:] == [4, 4] + [0] * 14


def test_the_schedule_holds_only_within_the_noise_of_the_best_fixed_depth():
    fixed = {"concurrency=1": ("ngram k=4", m(c1=200)), "ramp=8": ("ngram k=2", m(r8=150))}
    good = judge(m(c1=196, r8=151), fixed, "concurrency=1", noise=0.05)
    assert [c.ok for c in good] == [True, True] and good[0].ratio == pytest.approx(0.98)
    bad = judge(m(c1=198, r8=120), fixed, "concurrency=1", noise=0.05)
    assert [c.ok for c in bad] == [True, False] and bad[1].hi < 1 and bad[1].fixed == "ngram k=2"


def test_a_ramp_rises_to_the_top_level_and_back():
    assert ramp_limits(6, 8) == [1, 4, 7, 7, 4, 1]
    assert ramp_limits(1, 8) == [1]
    assert max(ramp_limits(33, 8)) == 8


def test_levels_are_concurrency_levels_and_bring_a_ramp():
    assert parse_levels("8, 1") == (1, 8)
    loads = level_loads((1, 8), LoadPattern(), ())
    assert [x.label for x in loads] == ["concurrency=8", "ramp=8"]
    assert level_loads((1,), LoadPattern(), ()) == ()
    for bad in ("", "0,4", "one"):
        with pytest.raises(BadInput, match="--levels: expected concurrency levels"):
            parse_levels(bad)


def test_a_schedule_exports_as_vllms_own_argument():
    params = {"method": "ngram", "num_speculative_tokens": 4,
              "num_speculative_tokens_per_batch_size": [[1, 2, 4], [3, 256, 0]]}
    c = Candidate(params)
    assert c.label == "ngram k=4@1-2,0@3+"
    kw = c.engine_kwargs(Settings(model="m"))
    assert kw["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 256, 0]]
    # vLLM's own parser reads the exported command back to the same speculative config.
    from autotune.vllm_cli import engine_args_from_serve
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    args = engine_args_from_serve(shlex.split(command(kw))[2:])
    assert args.speculative_config == kw["speculative_config"]
    assert validate_and_normalize_dynamic_sd_schedule(args.speculative_config[
        "num_speculative_tokens_per_batch_size"]) == [(1, 2, 4), (3, 256, 0)]
    assert "num_speculative_tokens_per_batch_size:" in config_yaml(kw)
    assert json.loads(llm_kwargs_json(kw))["speculative_config"] == kw["speculative_config"]


def _study(tmp_path, levels, **kw):
    load = LoadPattern()
    c = StudyConfig(**{"name": "sched", "results_dir": tmp_path / "sched", "settings": Settings(model="fake-model"),
                       "n_trials": 4, "trial_timeout_s": 20, "engine_module": "fake_engine", "strategy": "grid",
                       "load": load, "extra_loads": level_loads(levels, load, ()), "schedule": True, **kw})
    space = load_space("tests/data/fake_depths.yaml", platform="cpu", models=set())
    study = run_study(c, load_workload("examples/smoke.jsonl"), space)
    report = write_results(study, c.results_dir, settings=c.settings, platform={"platform": "cpu"},
                           objectives=list(c.objectives), storage_url=c.storage_url)
    return study, report


# The FAKE engine, except that a config's second engine instance (a fresh-engine re-measurement)
# runs 10% slower throughout: engine instances differ by more than the windows of one engine.
SLOWER_SECOND_ENGINE = '''
import copy
import hashlib
import json
import os
from pathlib import Path

import fake_engine


def _stretch(window, f):
    w = copy.deepcopy(window)
    for r in w["requests"]:
        r["start"], r["end"], r["chunks"] = r["start"] * f, r["end"] * f, [[t * f, n] for t, n in r["chunks"]]
    w["window_s"] *= f
    return w


def run_job(job, phase):
    out = fake_engine.run_job(job, phase)
    key = hashlib.sha1(json.dumps(job["engine_kwargs"], sort_keys=True).encode()).hexdigest()
    seen = Path(os.environ["AUTOTUNE_TEST_ENGINES"]) / key
    if seen.exists():
        out["windows"] = [_stretch(w, 1.1) for w in out["windows"]]
        out["levels"] = {k: [_stretch(w, 1.1) for w in ws] for k, ws in out["levels"].items()}
    seen.touch()
    return out
'''


def test_fake_study_recommends_a_schedule_that_holds_at_every_level_and_under_the_ramp(tmp_path, fake_engine_env,
                                                                                       monkeypatch):
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "slower_second_engine.py").write_text(SLOWER_SECOND_ENGINE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(engines), os.environ["PYTHONPATH"]]))
    monkeypatch.setenv("AUTOTUNE_TEST_ENGINES", str(engines))
    # Quiet windows: the instance spread asserted below is the planted 10% alone, not the fake's noise.
    monkeypatch.setenv("AUTOTUNE_FAKE_NOISE", "0")
    study, report = _study(tmp_path, (1, 4, 8), remeasure=True, engine_module="slower_second_engine")
    s = report["schedule"]
    # Alone and at 4 in flight depth 4 is best; at 8 no speculation: the ranges split at sqrt(4*8).
    assert s["status"] == "recommended", s
    assert s["ranges"] == [[1, 5, 4], [6, 256, 0]]
    # Judged by at least the spread the study's fresh-engine re-measurements showed: 1/1.1, wider
    # than the noise the windows of one engine give.
    assert s["instance_spread"] == instance_spread(StudyView.of(study)) == pytest.approx(1 - 1 / 1.1)
    assert s["noise"] >= s["instance_spread"] and "the most a config moved between engine instances here" in s["why"]
    assert {c["level"] for c in s["checks"]} == {"concurrency=1", "concurrency=4", "concurrency=8", "ramp=8"}
    assert report["best"]["trial"] == s["trial"]
    spec = report["best"]["engine_kwargs"]["speculative_config"]
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 5, 4], [6, 256, 0]]
    assert spec["num_speculative_tokens"] == 4
    roles = [t.user_attrs.get("role") for t in study.trials]
    assert roles.count("schedule") == 1 and len([r for r in roles if r is None]) == 3  # 3 depths, on top of none


def test_fake_study_falls_back_to_the_best_fixed_depth_when_the_ramp_says_so(tmp_path, fake_engine_env):
    study, report = _study(tmp_path, (1, 8))
    s = report["schedule"]
    # The ranges split at 2: batches of 4-7 in the ramp run without speculation, where depth 4
    # would still gain; under the ramp the fixed depth wins by more than the noise.
    assert s["ranges"] == [[1, 2, 4], [3, 256, 0]]
    assert s["status"] == "fell back" and "ramp=8" in s["why"], s
    # No config ran on a second engine here (StudyConfig's default; the CLI re-measures): the
    # verdict says its noise leaves out how far engine instances differ.
    assert "no config was measured on a second engine" in s["why"]
    ramp = next(c for c in s["checks"] if c["level"] == "ramp=8")
    assert not ramp["ok"] and ramp["ratio"] < 0.95
    assert "num_speculative_tokens_per_batch_size" not in report["best"]["candidate"]
    assert report["best"]["candidate"]["num_speculative_tokens"] == 4


def test_levels_through_the_cli_plan_each_levels_best_depth_then_the_schedule(tmp_path, monkeypatch, fake_engine_env):
    """--levels on the FAKE engine with --strategy predict: the step cost at 8 in flight is fitted on
    what was measured there, and the depth it forecasts best there is measured before the schedule.
    The quick space as on a machine without Arctic Inference: no suffix decoding, which vLLM runs at
    one fixed depth (no schedule), so the study picks a method that schedules."""
    import pandas as pd
    from typer.testing import CliRunner

    from autotune.core import candidate
    from autotune.cli.app import app

    monkeypatch.setattr(candidate, "package_installed", lambda name: False)
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    # Quiet windows: with --repeats 1 and one engine per config, the fake's 8% window noise alone
    # would fail the schedule's checks at 1 and 8 in flight too, and the cause asserted below is the ramp's.
    monkeypatch.setenv("AUTOTUNE_FAKE_NOISE", "0")
    r = CliRunner().invoke(app, ["search", "examples/smoke.jsonl", "--space", "quick", "--trials", "6", "--model",
                                 "fake-model", "--draft-model", "fake-draft", "--results", str(tmp_path),
                                 "--samples", "0", "--repeats", "1", "--study", "lv", "--levels", "1,8",
                                 "--no-remeasure", "--explain"])  # the schedule's line: --explain
    assert r.exit_code == 0, r.output
    frame = pd.read_csv(tmp_path / "lv" / "trials.csv")
    assert "output_tok_s@concurrency=8" in frame.columns and "output_tok_s@ramp=8" in frame.columns
    # Where the forecast-best depth at a level was not measured yet, it is measured before the schedule.
    depth = frame[frame["role"] == "depth"]
    assert depth["planned"].str.match(r"best depth at concurrency=(1|8) by forecast").all()
    assert (frame["role"] == "schedule").sum() == 1
    # The model at 8 in flight is fitted on the throughput measured there, not at the study's own level.
    import optuna

    from autotune.core.space import load_space
    from autotune.study.strategy import study_model

    study = optuna.load_study(study_name="lv", storage=f"sqlite:///{tmp_path / 'lv' / 'study.db'}")
    space = load_space("quick", platform="cpu", models={"draft_model"})
    view = StudyView.of(study)
    at8 = {Candidate(o.params).label: o.speedup for o in study_model(view, space, None, level="concurrency=8")[1]}
    want = {row.label: row["output_tok_s@concurrency=8"] / frame.loc[0, "output_tok_s@concurrency=8"]
            for _, row in frame.iterrows() if row["role"] in ("candidate", "depth")}
    assert at8 == pytest.approx({"none eager": 1.0, **want}) and all(v < 1 for k, v in want.items())
    report = json.loads((tmp_path / "lv" / "best.json").read_text())
    s = report["schedule"]
    assert s["ranges"][0][:2] == [1, 2] and s["ranges"][-1][2] == 0  # deep alone, none at 8
    # One outcome, for its cause: at 1 and at 8 in flight the schedule runs each level's best depth
    # (ratio 1 on quiet windows), but under the ramp batches 3-7 run without speculation, where the deep
    # depth still gains, so the ramp check fails and the best fixed depth stays the pick.
    checks = {c["level"]: c for c in s["checks"]}
    assert s["status"] == "fell back" and len(checks) == 3 and "at ramp=8 the schedule measured" in s["why"], s
    assert checks["concurrency=1"]["ok"] and checks["concurrency=8"]["ok"]
    assert checks["concurrency=1"]["ratio"] == pytest.approx(1.0)
    assert checks["concurrency=8"]["ratio"] == pytest.approx(1.0)
    # (0.96 with the quick space's depths up to 8: the deep fixed depth gains more under the ramp)
    assert not checks["ramp=8"]["ok"] and checks["ramp=8"]["ratio"] < 0.97
    assert "depth schedule k=" in r.stdout and s["status"] in r.stdout


def test_a_schedule_given_with_try_is_checked_then_judged_like_the_studys_own(tmp_path, fake_engine_env):
    from autotune.study.trials import SCHEDULE_KEY
    from autotune.study.schedule import check_ranges
    from autotune.cli.search import parse_try

    space = load_space("tests/data/fake_depths.yaml", platform="cpu", models=set())
    assert check_ranges([[1, 2, 4], [3, 256, 0]], 4) is None
    for bad, why in ((([[2, 8, 4]]), "start at batch size 1"), ([[1, 4, 4], [3, 8, 1]], "not overlapping"),
                     ([[1, 8, 4]], "at least the schedule's largest k"), ("4", "a non-empty list")):
        with pytest.raises(BadInput, match=f"--try: key 'num_speculative_tokens_per_batch_size': .*{why}"):
            parse_try(json.dumps({"method": "ngram", "num_speculative_tokens": 2, SCHEDULE_KEY: bad}), space)
    tried = parse_try(json.dumps({"method": "ngram", "num_speculative_tokens": 4,
                                  SCHEDULE_KEY: [[1, 2, 4], [3, 256, 0]]}), space)
    load = LoadPattern()
    c = StudyConfig(name="tried", results_dir=tmp_path / "tried", settings=Settings(model="fake-model"),
                    n_trials=5, trial_timeout_s=20, engine_module="fake_engine", strategy="grid", load=load,
                    extra_loads=level_loads((1, 8), load, ()))
    study = run_study(c, load_workload("examples/smoke.jsonl"), space, enqueue=[tried])
    report = write_results(study, c.results_dir, settings=c.settings, platform={"platform": "cpu"},
                           objectives=list(c.objectives), storage_url=c.storage_url)
    s = report["schedule"]
    # Speculation off from batch 3: under the ramp, batches of 4-7 lose what depth 4 would gain.
    assert s["source"] == "tried" and s["ranges"] == [[1, 2, 4], [3, 256, 0]] and s["status"] == "fell back", s
    assert "ramp=8" in s["why"] and report["best"]["candidate"] == {"method": "ngram", "num_speculative_tokens": 4}
