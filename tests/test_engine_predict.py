"""Predict, then measure, on the real vLLM engine (CPU build) with the bundled demo pair.

One --strategy predict study (session fixture) on a workload of three kinds of request: edits from
examples/json_edit.jsonl, chats from examples/support_chat.jsonl, and held-out corpus prompts made
fresh here. Every ngram and draft_model trial's mean accepted length, forecast before it ran from
the baseline's tokens (and the draft's one teacher-forced pass), must match vLLM's own counters
within 3%, over the whole workload and for each kind of request (vLLM's per-request metrics).

The study runs at two load levels (``--levels 1,LEVEL``) and under the ramp between them, so the
same engines also show the depth schedule's path end to end: each level's forecast-best depth,
the schedule vLLM runs, its checks against the best fixed depth, and what is exported.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from conftest import exported_serve_args
from typer.testing import CliRunner

from autotune import demo
from autotune.cli.app import app
from autotune.demo.corpus import fresh_examples
from autotune.forecast.forecast import AcceptanceTable

pytestmark = pytest.mark.engine
PER_KIND = 6
LEVEL = 16  # on 2 CPU cores, where speculation's gain is smallest
# A user's schedule that turns speculation off from batch size 3 (as in a vLLM user's report, where
# such a schedule took 8 concurrent requests from ~232 tok/s to 24-157): judged like the study's own.
SCHEDULE = "num_speculative_tokens_per_batch_size"
TRIED = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, "prompt_lookup_min": 2,
         SCHEDULE: [[1, 2, 5], [3, 256, 0]]}


def _workload(path: Path) -> Path:
    rows = []
    for src, kind in (("examples/json_edit.jsonl", "json_edit"), ("examples/support_chat.jsonl", "support_chat")):
        for line in Path(src).read_text().splitlines()[:PER_KIND]:
            rows.append({**json.loads(line), "category": kind})
    for i, e in enumerate(fresh_examples(PER_KIND, seed=4242)):
        rows.append({"id": f"fresh-{i}", "prompt": e.prompt, "max_tokens": 128, "temperature": 0.0, "category": "fresh"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def predicted(tmp_path_factory, engine_launcher):
    tmp = tmp_path_factory.mktemp("predict")
    r = CliRunner().invoke(app, ["search", str(_workload(tmp / "mixed.jsonl")), "--space",
                                 "tests/data/engine_space_predict.yaml", "--trials", "4", "--results", str(tmp),
                                 "--study", "p", "--repeats", "1", "--max-repeats", "0", "--warmup", "1",
                                 "--samples", "0", "--trial-timeout", "300", "--no-remeasure",
                                 "--levels", f"1,{LEVEL}", "--try", json.dumps(TRIED),
                                 # vLLM's per-request acceptance (by kind, below) reaches only an in-process engine
                                 "--instrument", "inprocess"])
    print(r.output)
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="p", storage=f"sqlite:///{tmp / 'p' / 'study.db'}")
    return tmp / "p", study


def _speculative(study):
    """The fixed-depth speculative trials (a schedule has no forecast of its own)."""
    return [t for t in study.trials if t.state.name == "COMPLETE" and SCHEDULE not in t.user_attrs["candidate"]
            and t.user_attrs["candidate"].get("method") in ("ngram", "draft_model")]


def test_forecast_mean_accepted_length_matches_vllms_counters(predicted):
    _, study = predicted
    trials = _speculative(study)
    assert {t.user_attrs["candidate"]["method"] for t in trials} == {"ngram", "draft_model"}
    for t in trials:
        said, m = t.user_attrs["predicted"], t.user_attrs["measurement"]
        assert said["mean_accepted_length"] == pytest.approx(m["mean_accepted_length"], rel=0.03), \
            (t.user_attrs["label"], {k: v for k, v in study.user_attrs["draft_trace"].items() if k != "argmax"})


def test_forecast_matches_for_each_kind_of_request(predicted):
    """The examples and the fresh prompts separately: vLLM's per-request acceptance, pooled by kind."""
    _, study = predicted
    base = next(t for t in study.trials if t.user_attrs.get("role") == "baseline")
    kinds = {}
    for line in (predicted[0].parent / "mixed.jsonl").read_text().splitlines():
        row = json.loads(line)
        kinds[row["id"]] = row["category"]
    argmax = study.user_attrs["draft_trace"]["argmax"]
    for t in _speculative(study):
        by_kind = t.user_attrs["measurement"]["by_category"]
        for kind in ("json_edit", "support_chat", "fresh"):
            outputs = [o for o in base.user_attrs["outputs"] if kinds[o["id"]] == kind]
            got = AcceptanceTable(outputs, argmax, demo.MAX_MODEL_LEN).get(t.user_attrs["candidate"])
            assert by_kind[kind]["acceptance_source"] == "vllm"
            assert got.mean_accepted_length == pytest.approx(by_kind[kind]["mean_accepted_length"], rel=0.03), \
                (t.user_attrs["label"], kind)


def test_predict_study_plans_every_candidate_and_ranks_the_space(predicted):
    results, study = predicted
    cands = [t for t in study.trials if t.state.name in ("COMPLETE", "FAIL") and t.user_attrs.get("role") != "baseline"
             and SCHEDULE not in t.user_attrs["candidate"] and "duplicate_of" not in t.user_attrs]
    assert cands and all(t.user_attrs.get("planned") and t.user_attrs.get("predicted") for t in cands)
    first = [t.user_attrs["candidate"]["method"] for t in cands[:2]]
    assert set(first) == {"ngram", "draft_model"}  # the best forecast of each method first
    r = CliRunner().invoke(app, ["predict", str(results), "--json", "--top", "0"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert len(rows) == 1 + 8 + 4 and all(x["speedup"] is not None for x in rows)


def test_each_level_gets_its_depth_and_a_schedule_is_judged_at_every_level(predicted):
    """Every trial measured at 1, at LEVEL and under the ramp; the forecast-best depth at each level
    measured; the schedule (the study's own where the levels disagree, else the --try one) run by
    vLLM and judged against the best fixed depth at each level; what is exported follows the
    verdict, read back by vLLM's own parser."""
    import shlex

    from autotune.forecast.forecast import FLOOR
    from autotune.vllm_cli import engine_args_from_serve

    results, study = predicted
    report = json.loads((results / "best.json").read_text())
    s = report["schedule"]
    print(s)
    levels = ["concurrency=1", f"concurrency={LEVEL}", f"ramp={LEVEL}"]
    for t in study.trials:
        if t.state.name == "COMPLETE":
            m = t.user_attrs["measurement"]
            assert all(m["output_tok_s" if lv == levels[0] else f"output_tok_s@{lv}"] > 0 for lv in levels)
        if t.user_attrs.get("role") == "depth":
            assert t.user_attrs["planned"].startswith("best depth at concurrency=")
    tried = next(t for t in study.trials if t.user_attrs["candidate"].get(SCHEDULE) == TRIED[SCHEDULE])
    assert tried.state.name == "COMPLETE", tried.user_attrs.get("failure")  # vLLM ran it at every level
    # The study's own schedule is judged where the study measured one (its levels' best depths
    # differed), else the --try one: one outcome, named by what the study did.
    own = [t for t in study.trials if t.user_attrs.get("role") == "schedule" and t.state.name in ("COMPLETE", "FAIL")]
    assert s["source"] == ("planned" if own else "tried"), (s, study.user_attrs.get("schedule"))
    assert {c["level"] for c in s["checks"]} == set(levels)
    assert s["status"] == ("recommended" if all(c["ok"] for c in s["checks"]) else "fell back"), s
    r = CliRunner().invoke(app, ["export", str(results)])
    spec = engine_args_from_serve(exported_serve_args(r.stdout)).speculative_config or {}
    if s["status"] == "recommended":
        assert report["best"]["trial"] == s["trial"] and spec[SCHEDULE] == s["ranges"]
    else:
        worst = min(s["checks"], key=lambda c: c["ratio"])
        assert worst["level"] in s["why"] and SCHEDULE not in spec and report["best"]["trial"] != s["trial"]
    # Each check judged what the study measured, by the rule and the noise best.json states. The
    # schedule and each fixed depth ran on engines of their own, and fresh instances of one config
    # differ by up to ~20% on some machines (a 2-core EPYC: 455 against 356 tok/s): no fixed
    # tolerance between two engines holds on every machine, so no figure is compared across them here.
    judged = next(t for t in study.trials if t.number == s["trial"])
    assert s["noise"] >= max(s["instance_spread"], FLOOR)  # at least the forecast's floor and the instance spread
    for c in s["checks"]:
        key = "output_tok_s" if c["level"] == levels[0] else f"output_tok_s@{c['level']}"
        assert c["schedule_tok_s"] == pytest.approx(judged.user_attrs["measurement"][key], rel=1e-9) and \
            c["schedule_tok_s"] > 0
        named = [t.user_attrs["measurement"][key] for t in study.trials
                 if t.state.name == "COMPLETE" and t.user_attrs.get("label") == c["fixed"]]
        assert c["fixed_tok_s"] in named and c["fixed_tok_s"] > 0, (c, named)  # the config it names, measured there
        assert c["ratio"] == pytest.approx(c["schedule_tok_s"] / c["fixed_tok_s"])
        assert c["ok"] == (c["ratio"] >= 1 - s["noise"] or (c["hi"] or 0) >= 1), (c, s["noise"])  # NaN: no interval
    if s["source"] == "tried":  # speculation off from batch 3: at LEVEL it is judged against the best fixed depth
        at = next(c for c in s["checks"] if c["level"] == f"concurrency={LEVEL}")
        base = next(t for t in study.trials if t.user_attrs.get("role") == "baseline")
        # The baseline (depth 0) is one of the fixed depths it is judged against: the best of them is
        # at least the baseline's figure there, and the schedule's ratio is to that best.
        assert at["fixed_tok_s"] >= base.user_attrs["measurement"][f"output_tok_s@concurrency={LEVEL}"] > 0
