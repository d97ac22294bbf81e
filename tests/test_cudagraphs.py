"""CUDA graphs that apply (autotune.measure.cudagraphs): no bundled space forces eager on a GPU, and a
trial's decode at the study's batch sizes x (k+1) is checked against the capture sizes vLLM resolved.
No GPU: vLLM's own CompilationConfig rule is the reference, and the CUDA platform's config is faked."""

from types import SimpleNamespace

import pytest

from autotune.core.candidate import Candidate, Settings
from autotune.core.load import LoadPattern
from autotune.core.space import bundled_spaces, load_space
from autotune.measure.config import StudyConfig
from autotune.measure.cudagraphs import coverage_line, decode_coverage, spec_capture_sizes
from autotune.run.evaluate import measure
from autotune.run.served_engine import resolved_cudagraphs

ALL_NEEDS = {"draft_model", "eagle_head", "eagle3_head", "mtp_layers", "moe_layers", "sampled_requests",
             "arctic_inference"}


@pytest.mark.parametrize("name", sorted(bundled_spaces()))
def test_no_bundled_space_forces_eager_on_a_gpu(name):
    sp = load_space(name, platform="cuda", models=ALL_NEEDS, tags={"cuda"})
    eager = next((p for p in sp.params if p.name == "enforce_eager"), None)
    assert eager is None or False in eager.values(), f"space {name} offers only eager on CUDA"
    assert sp.baseline.get("enforce_eager") is not True, f"space {name}'s baseline is eager on CUDA"


def test_the_quick_space_stays_eager_on_cpu():
    sp = load_space("quick", platform="cpu", models=set(), tags={"cpu"})
    assert sp.baseline["enforce_eager"] is True
    assert next(p for p in sp.params if p.name == "enforce_eager").values() == (True,)


@pytest.mark.parametrize("sizes, ceiling, q", [([1, 2, 4, 8, 16, 24, 32], 32, 4), ([1, 2, 4, 8, 16, 24, 32], 32, 3),
                                               ([1, 2, 4], 4, 6), ([1, 2, 4, 8], 8, 1), ([512], 512, 5)])
def test_the_spec_rounding_is_vllms_own(sizes, ceiling, q):
    from vllm.config.compilation import CompilationConfig

    cc = CompilationConfig(cudagraph_capture_sizes=list(sizes), max_cudagraph_capture_size=ceiling)
    try:
        cc.adjust_cudagraph_sizes_for_spec_decode(q)
    except ValueError:  # vLLM refuses: no size fits k+1 under the ceiling
        assert spec_capture_sizes(sizes, ceiling, q) == []
        return
    assert spec_capture_sizes(sizes, ceiling, q) == cc.cudagraph_capture_sizes


GRAPHS = {"mode": "FULL_AND_PIECEWISE", "capture_sizes": [1, 2, 4, 8, 16, 24, 32], "max_capture_size": 32}


def test_decode_past_the_capture_ceiling_is_outside_the_graphs():
    cov = decode_coverage(GRAPHS, k=3, batch_sizes=[1, 8, 16])  # 4, 32 and 64 tokens a step
    assert cov == {"mode": "FULL_AND_PIECEWISE", "query_len": 4, "ceiling": 32, "outside": [16]}
    assert coverage_line(cov) == ("decode outside CUDA graphs at batch 16: 16 x (k+1=4) = 64 tokens > capture "
                                  "ceiling 32 (FULL_AND_PIECEWISE); raise max_cudagraph_capture_size or lower the depth")
    # k=2 under FULL decode: sizes rounded up to multiples of 3 and kept under 32 (32 -> 33 dropped),
    # so the ceiling drops to 24 and a batch of 9 (27 tokens) falls outside
    assert decode_coverage(GRAPHS, k=2, batch_sizes=[8, 9]) == {"mode": "FULL_AND_PIECEWISE", "query_len": 3,
                                                                 "ceiling": 24, "outside": [9]}
    # PIECEWISE keeps its sizes (no rounding): 9 x 3 = 27 fits under 32, 11 x 3 = 33 does not
    assert decode_coverage({**GRAPHS, "mode": "PIECEWISE"}, k=2, batch_sizes=[9, 11])["outside"] == [11]
    eager = decode_coverage({"mode": "NONE", "capture_sizes": [], "max_capture_size": 0}, k=0, batch_sizes=[1])
    assert coverage_line(eager) == "decode ran without CUDA graphs (cudagraph_mode NONE)"
    assert coverage_line(decode_coverage(GRAPHS, k=3, batch_sizes=[1, 8])) is None


def test_the_graphs_are_read_from_the_resolved_compilation_config():
    fake_cuda = SimpleNamespace(compilation_config=SimpleNamespace(
        cudagraph_mode=SimpleNamespace(name="FULL_AND_PIECEWISE"), cudagraph_capture_sizes=[1, 2, 4],
        max_cudagraph_capture_size=4))
    assert resolved_cudagraphs(fake_cuda) == {"mode": "FULL_AND_PIECEWISE", "capture_sizes": [1, 2, 4],
                                              "max_capture_size": 4}
    assert resolved_cudagraphs(None) is None


def _window():
    req = {"id": "a", "start": 0.0, "end": 1.0, "chunks": [[0.1, 1], [0.2, 1]], "token_ids": [1, 2], "text": "x",
           "finish_reason": "length", "error": None, "prompt_tokens": 3}
    return {"window_s": 1.0, "requests": [req], "spec_counters": {
        "vllm:spec_decode_num_drafts": 0, "vllm:spec_decode_num_draft_tokens": 0,
        "vllm:spec_decode_num_accepted_tokens": 0, "vllm:spec_decode_num_accepted_tokens_per_pos": []}}


def test_a_trial_records_its_decode_coverage_at_every_load_level(tmp_path):
    cfg = StudyConfig(name="g", results_dir=tmp_path, settings=Settings(model="m"),
                      load=LoadPattern("concurrency", concurrency=4),
                      extra_loads=(LoadPattern("concurrency", concurrency=16),))
    raw = {"windows": [_window()], "levels": {"concurrency=16": [_window()]}, "cudagraphs": GRAPHS}
    cand = Candidate({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2})
    m = measure(raw, [{"id": "a", "sampling": {}}], cand, cfg)
    assert m["cudagraph_decode"]["outside"] == [16]  # 16 x 4 = 64 > 32; 4 x 4 = 16 fits
    del raw["cudagraphs"]  # the CPU platform records none: nothing to say
    assert "cudagraph_decode" not in measure(raw, [{"id": "a", "sampling": {}}], cand, cfg)
