"""Near-tie flips against faults: the dtype's rounding and the first divergence (autotune.measure.nearties)
on hand-built values, and studies on the FAKE engine (tests/fake_engine.py, AUTOTUNE_FAKE_FLIPS) that plant
flips and faults, judged at every token (autotune.measure.every_token) against the numerics the
baseline measured (autotune.measure.numerics)."""

import json

import pandas as pd
import pytest

from autotune.core.candidate import Settings
from autotune.core.space import load_space
from autotune.core.workload import load_workload
from autotune.measure.config import StudyConfig
from autotune.measure.nearties import FAULT, NEAR, UNSCORED, Threshold, dtype_threshold, first_flip
from autotune.measure.validate import Tolerances, verdict
from autotune.results.files import write_results
from autotune.study.loop import run_study

BF16 = dtype_threshold("bfloat16")


def test_the_threshold_is_twice_one_logits_rounding_per_dtype():
    assert BF16.value == pytest.approx(2 * 32 * 2 ** -8) and "bfloat16" in BF16.source
    assert dtype_threshold("torch.float16").value == pytest.approx(2 * 32 * 2 ** -11)
    assert dtype_threshold("float32").value == pytest.approx(2 * 32 * 2 ** -24)
    unknown = dtype_threshold(None)
    assert unknown.value == BF16.value and "not known" in unknown.source


def _score(path, margins):
    """Teacher-forced scores of ``path``: the runner-up (token + 100) ``margins[i]`` nats below."""
    return {"token_ids": path, "logprobs": [-0.1] * len(path),
            "top": [[[t, -0.1], [t + 100, -0.1 - m]] for t, m in zip(path, margins)]}


@pytest.mark.parametrize("cand,margin,kind", [
    ([1, 2, 103, 9], 0.05, NEAR),  # the runner-up, nearly tied
    ([1, 2, 103, 9], 2.0, FAULT),  # the runner-up, 2 nats below
    ([1, 2, 7, 9], 0.05, FAULT),  # not in the baseline's top 5 at all
    ([1, 2], 0.05, UNSCORED),  # stopped early: no token to weigh
])
def test_a_flip_is_judged_at_its_first_divergence(cand, margin, kind):
    ref = [1, 2, 3, 4]
    flip = first_flip("r", cand, ref, _score(ref, [3.0, 3.0, margin, 3.0]), BF16)
    assert flip.kind == kind and flip.position == 2
    assert first_flip("r", ref, ref, None, BF16) is None
    assert first_flip("r", [1, 9], ref, None, BF16).kind == UNSCORED  # not scored: token agreement judges it


def _greedy(n, tokens=40):
    reqs = [{"id": f"r{i}", "sampling": {"temperature": 0.0, "max_tokens": tokens}, "expect": {}} for i in range(n)]
    base = [{"id": f"r{i}", "token_ids": list(range(i, i + tokens)), "text": "", "finish_reason": "length", "chunks": 1,
             "error": None} for i in range(n)]
    return reqs, base


def _study(tmp_path, monkeypatch, flips, n=32, candidate=None, **kw):
    monkeypatch.setenv("AUTOTUNE_FAKE_FLIPS", json.dumps(flips))
    tmp_path.mkdir(parents=True, exist_ok=True)
    wl = tmp_path / "greedy.jsonl"
    wl.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": 32, "temperature": 0}) + "\n"
                          for i in range(n)))
    c = StudyConfig(name="flips", results_dir=tmp_path / "flips", settings=Settings(model="fake-model"),
                    n_trials=2, trial_timeout_s=20, engine_module="fake_engine", **kw)
    space = load_space("tests/data/fake_space.yaml", platform="cpu", models=set())
    cand = candidate or {"method": "ngram", "num_speculative_tokens": 4, "kv_cache_dtype": "auto",
                         "quantization": "none"}
    study = run_study(c, load_workload(str(wl)), space, enqueue=[cand])
    return c, study, study.trials[1].user_attrs["verdict"]


def test_a_lossless_candidate_flipping_at_near_ties_on_3_of_32_is_accepted(tmp_path, fake_engine_env, monkeypatch):
    """Each flip followed by the target's own continuation (its own scores say so): every token within
    numerics; token agreement 0.953, which the agreement rule (>= 0.98) rejected."""
    c, study, v = _study(tmp_path, monkeypatch, {"near": [3, 11, 20]})
    assert v["token_agreement"] < 0.98
    assert v["passed"] and v["near_ties"] == 3 and v["flip_faults"] == 0, v["reason"]
    assert v["reason"].startswith("ok (3/32 greedy outputs differ: 3 within numerics at every token, 0 not")
    assert v["excused_positions"] == 3 and v["excused_p"] > 0.01 and v["judged_positions"] == 32 * 32
    report = write_results(study, c.results_dir, settings=c.settings, platform={"platform": "cpu"},
                           objectives=list(c.objectives), storage_url=c.storage_url)
    assert report["best"]["trial"] == 1 and report["best"]["verdict"]["near_ties"] == 3
    row = pd.read_csv(c.results_dir / "trials.csv").iloc[1]
    assert (row["outputs_differ"], row["near_ties"], row["flip_faults"]) == (3, 3, 0)
    assert "rounding at logit scale" in row["near_tie_source"]
    # The threshold the baseline measured, kept in the study with its source: the fake's decodes drift
    # 0.02 at every position, under bfloat16's rounding at the assumed scale (its dtype is unknown).
    numerics = study.user_attrs["numerics"]
    assert numerics["threshold"]["value"] == pytest.approx(0.25) and numerics["drift"]["max"] == pytest.approx(0.02)
    assert "decode-vs-prefill drift" in numerics["threshold"]["source"] and "assumed" in numerics["threshold"]["source"]
    assert study.trials[0].user_attrs["verdict"]["near_tie_source"] == numerics["threshold"]["source"]


def test_a_lossless_candidate_with_one_confident_flip_is_rejected(tmp_path, fake_engine_env, monkeypatch):
    _, _, v = _study(tmp_path, monkeypatch, {"confident": [20]})
    assert v["token_agreement"] >= 0.98  # the agreement rule let it through: a fault all the same
    assert not v["passed"] and v["flip_faults"] == 1 and v["near_ties"] == 0
    assert "1/32 greedy outputs differ: 0 within numerics at every token, 1 not (first: request" in v["reason"]
    assert "at token 16 (margin 3 nats))" in v["reason"]


def test_a_near_tie_flip_then_junk_is_rejected(tmp_path, fake_engine_env, monkeypatch):
    """Its first divergence is a near-tie (0.01 nats): the first-divergence rule passed it. The token
    after it is 3 nats under the target's own choice."""
    _, _, v = _study(tmp_path, monkeypatch, {"junk": [7]})
    assert not v["passed"] and v["flip_faults"] == 1, v["reason"]
    assert "at token 17 (margin 3 nats)" in v["reason"]


def test_drafts_accepted_at_near_ties_are_rejected_by_their_count(tmp_path, fake_engine_env, monkeypatch):
    """Twelve outputs flip 0.1 nats under the top (a fault accepting near-tied drafts would): every
    token within the threshold, but the baseline's decodes moved no log-prob past 0.02, so numerics
    predict almost no such flips."""
    _, _, v = _study(tmp_path, monkeypatch, {"near_accept": list(range(0, 32, 3)) + [31]})
    assert not v["passed"] and v["flip_faults"] == 0 and v["near_ties"] == 12, v["reason"]
    assert v["excused_positions"] == 12 and v["excused_p"] < 1e-6
    assert "too many excused positions for numerics alone (12 excused position(s) in 1024" in v["reason"]


def test_a_lossy_configs_speculation_is_judged_by_the_same_rule(tmp_path, fake_engine_env, monkeypatch):
    """Against the same config without speculation, every token scored by its own engine."""
    lossy = {"method": "ngram", "num_speculative_tokens": 4, "kv_cache_dtype": "fp8", "quantization": "none"}
    tol = Tolerances(max_logprob_drift=0.1)  # the fake's fp8 drifts 0.08 nats/token: within this budget
    _, _, v = _study(tmp_path / "a", monkeypatch, {"near": [3, 11, 20]}, candidate=lossy, tolerances=tol)
    assert v["passed"] and v["near_ties"] == 3, v["reason"]
    _, _, v = _study(tmp_path / "b", monkeypatch, {"confident": [20]}, candidate=lossy, tolerances=tol)
    assert not v["passed"] and v["flip_faults"] == 1
    assert "against the same config without speculation" in v["reason"]
    _, _, v = _study(tmp_path / "c", monkeypatch, {"junk": [20]}, candidate=lossy, tolerances=tol)
    assert not v["passed"] and v["flip_faults"] == 1


def test_threshold_given_overrides_the_dtype():
    reqs, base = _greedy(4)
    scores = {r["id"]: _score(r["token_ids"], [0.5] * 40) for r in base}
    cand = [dict(r) for r in base]
    cand[0] = {**base[0], "token_ids": base[0]["token_ids"][:30] + [base[0]["token_ids"][30] + 100] + [0] * 9}
    assert not verdict(reqs, cand, base, lossy=False, tol=Tolerances(), base_scores=scores, dtype="bfloat16").passed
    own = {"r0": {"token_ids": cand[0]["token_ids"], "logprobs": [-0.1] * 40,
                  "top": [[[t, -0.1]] if i != 30 else [[1, 0.4], [t, -0.1]] for i, t in enumerate(cand[0]["token_ids"])]}}
    wide = Threshold(0.6, "test")
    assert verdict(reqs, cand, base, lossy=False, tol=Tolerances(), base_scores=scores, own_scores=own,
                   threshold=wide).passed


def test_a_baseline_that_does_not_reproduce_itself_at_3_nats_widens_nothing_and_is_reported(
        tmp_path, fake_engine_env, monkeypatch):
    """The re-measurement's baseline instance flips 3 nats against the first, above the cap (twice the
    measured threshold): not numerics, so it widens nothing (before, it widened the threshold to 3 nats,
    for every verdict after it); it is a finding, in its verdict and in the study."""
    from autotune.study.record import _reference
    from autotune.study.view import StudyView

    _, study, _ = _study(tmp_path, monkeypatch, {"fresh_baseline": [5]}, remeasure=True)
    again = [t for t in study.trials if t.user_attrs.get("role") in ("re-measure", "holdout")
             and 0 in (t.user_attrs.get("remeasure_of"), t.user_attrs.get("holdout_of"))]
    v = again[0].user_attrs["verdict"]
    assert v["passed"] and "widened" not in v["near_tie_source"], v["reason"]
    finding = "the baseline does not reproduce itself at margin 3 nats, request '5'"
    assert any(f.startswith(finding) for f in v["numerics_findings"]) and finding in v["reason"]
    # each fresh baseline instance (the holdout's rounds) reports its own flip; none widens
    found = study.user_attrs["numerics_findings"]
    assert study.user_attrs["numerics_floor"] == [] and len(found) == len(again)
    assert all(f.startswith(finding) for f in found)
    assert _reference(StudyView.of(study)).floor == ()
