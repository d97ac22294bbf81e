"""The machine-dependent paths, run both ways on any machine (issue 30).

What a study searches depends on the processor: vLLM's CPU attention stores an fp8 KV cache only
with AVX-512 or AMX, so the spaces offer ``kv_cache_dtype=fp8`` only there and say why elsewhere.
Here the platform is faked (tests/conftest.py's ``faked_cpu``: a /proc/cpuinfo with AVX-512 and
one without), so both kinds are checked on whichever machine runs the suite; the expectations of
other tests (the predict study's row count, tests/test_strategy.py) follow from the same spaces.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from autotune.run import hardware
from autotune.core.space import load_space, reload_space

from test_strategy import FP8_LEFT_OUT, quick_space_on


def _kv_choices(space) -> tuple:
    return next(p.choices for p in space.params if p.name == "kv_cache_dtype")


def test_the_platform_is_read_from_the_faked_cpuinfo(faked_cpu):
    """The fake reaches autotune.run.hardware's own read of /proc/cpuinfo (if that read moves, this fails
    rather than the other tests here silently checking the real machine twice)."""
    wide = faked_cpu == "avx512"
    assert hardware.cpu_features() == ({"avx512"} if wide else set())
    assert hardware.platform_tags() == ({"cpu", "cpu-avx512"} if wide else {"cpu"})
    said = hardware.describe()
    assert said["platform"] == "cpu" and said["tags"] == sorted(hardware.platform_tags())


@pytest.mark.parametrize("flags, features", [
    ("fpu sse4_2 avx2 fma", set()),
    ("fpu avx2 avx512f avx512bw", {"avx512"}),
    ("fpu avx2 amx_tile amx_bf16", {"amx"}),
    ("fpu avx2 avx512f amx_tile", {"avx512", "amx"}),
    ("fpu avx2 avx512bw avx512vl", set()),  # AVX-512 is avx512f; its extensions alone do not count
])
def test_cpu_features_from_the_flags_and_fp8_kv_with_either(monkeypatch, flags, features):
    text = f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    monkeypatch.setattr(hardware, "open", lambda path, *a, **k: io.StringIO(text), raising=False)
    assert hardware.cpu_features() == features
    space = load_space("quick", platform="cpu", models=set(), tags=hardware.platform_tags("cpu"))
    assert ("fp8" in _kv_choices(space)) == bool(features)
    assert (FP8_LEFT_OUT in space.dropped) == (not features)


def test_no_cpuinfo_means_no_features(monkeypatch):
    def refuse(*_a, **_k):
        raise OSError("no /proc here")

    monkeypatch.setattr(hardware, "open", refuse, raising=False)
    assert hardware.cpu_features() == set() and hardware.platform_tags("cpu") == {"cpu"}


def test_cuda_offers_fp8_kv_whatever_the_cpu(faked_cpu):
    assert hardware.platform_tags("cuda") == {"cuda"}
    space = load_space("quick", platform="cuda", models=set(), tags=hardware.platform_tags("cuda"))
    assert "fp8" in _kv_choices(space) and not any("kv_cache_dtype" in d for d in space.dropped)


@pytest.mark.parametrize("name", ["quick", "cpu"])
def test_spaces_offer_fp8_kv_exactly_with_avx512_and_say_why_not(faked_cpu, name):
    space = load_space(name, platform=hardware.detect(), models={"draft_model"}, tags=hardware.platform_tags())
    grid = space.grid()
    with_fp8 = [c for c in grid if c.params.get("kv_cache_dtype") == "fp8"]
    if faked_cpu == "avx512":
        assert _kv_choices(space) == ("auto", "fp8") and with_fp8 and FP8_LEFT_OUT not in space.dropped
    else:
        assert _kv_choices(space) == ("auto",) and not with_fp8 and FP8_LEFT_OUT in space.dropped
    assert not any(c.params.get("kv_cache_dtype") not in ("auto", "fp8") for c in grid)


def test_the_predict_studys_row_count_follows_the_platform(faked_cpu):
    """The quick space the predict study on the fake engine ranks (tests/test_strategy.py): none, ngram
    7 depths (2-8) x 2 lookups, draft_model 7 depths and, where Arctic Inference is installed, suffix 7
    depths x 2 tree depths x 2 spec factors x 2 min probabilities; twice that with fp8 KV."""
    from collections import Counter

    from test_strategy import quick_models

    space = quick_space_on(hardware.describe())
    per_method = {"none": 1, "ngram": 14, "draft_model": 7}
    if "arctic_inference" in quick_models():
        per_method["suffix"] = 56
    kv = {"avx512": 2, "no-avx512": 1}[faked_cpu]
    assert Counter(c.method for c in space.grid()) == {m: n * kv for m, n in per_method.items()}
    plain = quick_space_on({"platform": "cpu", "tags": ["cpu"]})
    assert len(space.grid()) == len(plain.grid()) * len(_kv_choices(space))


def test_search_says_why_fp8_kv_is_left_out(faked_cpu, tmp_path, monkeypatch):
    """What `autotune search` prints before any trial: the choices the platform rules out, with why."""
    from autotune.cli.search import SearchOptions, prepare

    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")  # "fake-model" is no model to fetch

    p = prepare(SearchOptions(workload=Path("examples/smoke.jsonl"), model="fake-model", draft_model="fake-draft",
                              space="quick", results=tmp_path))
    said = "\n".join(p.notes)
    assert p.platform == "cpu" and p.space.resolved["tags"] == sorted(hardware.platform_tags())
    assert (f"left out: {FP8_LEFT_OUT}" in said) == (faked_cpu == "no-avx512"), said
    assert [c.key() for c in p.space.grid()] == [c.key() for c in quick_space_on(hardware.describe()).grid()]


def test_a_study_reloads_its_own_space_on_either_kind_of_machine(faked_cpu):
    """`autotune predict` forecasts the space the study ran (its recorded tags), not this machine's:
    a study from an AVX-512 machine keeps its fp8 points on one without, and the other way round."""
    for tags in ({"cpu"}, {"cpu", "cpu-avx512"}):
        ran = load_space("quick", platform="cpu", models={"draft_model"}, tags=tags)
        again = reload_space(ran.resolved)
        assert [c.key() for c in again.grid()] == [c.key() for c in ran.grid()] and again.dropped == ran.dropped
