"""Predict, then measure, on the real vLLM engine (CPU build) with the bundled demo pair.

One --strategy predict study (session fixture) on a workload of three kinds of request: edits from
examples/json_edit.jsonl, chats from examples/support_chat.jsonl, and held-out corpus prompts made
fresh here. Every ngram and draft_model trial's mean accepted length, forecast before it ran from
the baseline's tokens (and the draft's one teacher-forced pass), must match vLLM's own counters
within 3%, over the whole workload and for each kind of request (vLLM's per-request metrics).
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune import demo
from autotune.cli import app
from autotune.demo.corpus import fresh_examples
from autotune.forecast import AcceptanceTable

pytestmark = pytest.mark.engine
PER_KIND = 6


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
def predicted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("predict")
    r = CliRunner().invoke(app, ["search", str(_workload(tmp / "mixed.jsonl")), "--space",
                                 "tests/data/engine_space_predict.yaml", "--trials", "5", "--results", str(tmp),
                                 "--study", "p", "--repeats", "1", "--max-repeats", "0", "--warmup", "1",
                                 "--samples", "0", "--trial-timeout", "300", "--no-remeasure"])
    print(r.output)
    assert r.exit_code == 0, r.output
    study = optuna.load_study(study_name="p", storage=f"sqlite:///{tmp / 'p' / 'study.db'}")
    return tmp / "p", study


def _speculative(study):
    return [t for t in study.trials if t.state.name == "COMPLETE"
            and t.user_attrs["candidate"].get("method") in ("ngram", "draft_model")]


def test_forecast_mean_accepted_length_matches_vllms_counters(predicted):
    _, study = predicted
    trials = _speculative(study)
    assert {t.user_attrs["candidate"]["method"] for t in trials} == {"ngram", "draft_model"}
    for t in trials:
        said, m = t.user_attrs["predicted"], t.user_attrs["measurement"]
        assert said["mean_accepted_length"] == pytest.approx(m["mean_accepted_length"], rel=0.03), t.user_attrs["label"]


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
             and "duplicate_of" not in t.user_attrs]
    assert cands and all(t.user_attrs.get("planned") and t.user_attrs.get("predicted") for t in cands)
    first = [t.user_attrs["candidate"]["method"] for t in cands[:2]]
    assert set(first) == {"ngram", "draft_model"}  # the best forecast of each method first
    r = CliRunner().invoke(app, ["predict", str(results), "--json", "--top", "0"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert len(rows) == 1 + 8 + 4 and all(x["speedup"] is not None for x in rows)
