"""best.json as a typed StudyReport (autotune.core.study_report): its keys are declared once, a reader
accepts the versions it knows, and confirm's additions make a new report instead of editing one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.core.errors import BadInput
from autotune.core.study_report import READABLE, REQUIRED, SCHEMA_VERSION, StudyReport, load_report, with_served


def _report(**extra) -> dict:
    base = {"schema_version": SCHEMA_VERSION, "study": "s", "objectives": ["output_tok_s"], "platform": {},
            "trials": {"finished": 1, "failed": 0, "pruned": 0, "left_out": []}, "baseline": None, "best": None,
            "pareto": []}
    return {**base, **extra}


def _write(tmp_path: Path, report: dict) -> Path:
    (tmp_path / "best.json").write_text(json.dumps(report))
    return tmp_path


def test_every_required_key_is_declared():
    assert set(REQUIRED) <= set(StudyReport.__annotations__)


def test_a_current_report_reads(tmp_path):
    assert load_report(_write(tmp_path, _report()))["study"] == "s"


def test_version_1_still_reads_and_an_unknown_version_is_one_line(tmp_path):
    assert 1 in READABLE
    assert load_report(_write(tmp_path, _report(schema_version=1)))["schema_version"] == 1
    with pytest.raises(BadInput, match=r"best.json: key 'schema_version': expected one of 1, 2, 3, 4, got 99"):
        load_report(_write(tmp_path, _report(schema_version=99)))


def test_a_missing_key_is_named(tmp_path):
    r = _report()
    del r["best"]
    with pytest.raises(BadInput, match=r"best.json: key .best.: missing"):
        load_report(_write(tmp_path, r))


def test_an_undeclared_key_in_the_current_version_is_named(tmp_path):
    with pytest.raises(BadInput, match=r"key 'speed_of_light': not a key of schema version 4"):
        load_report(_write(tmp_path, _report(speed_of_light=1)))


def test_with_served_returns_a_new_report_and_leaves_the_old_one_alone():
    old = _report(best={"trial": 3, "label": "ngram k=5"})
    new = with_served(old, {"speedup": float("nan"), "rounds": 3}, "agree")
    assert new["best"]["served"] == {"speedup": None, "rounds": 3}  # NaN is not JSON: null
    assert new["served_vs_claimed"] == "agree" and new["best"]["trial"] == 3
    assert "served" not in old["best"] and "served_vs_claimed" not in old
