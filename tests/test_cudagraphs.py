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
    assert cov == {"mode": "FULL_AND_PIECEWISE", "query_len": 4, "ceiling": 32, "outside": [16], "runner": "v1"}
    assert coverage_line(cov) == ("decode outside CUDA graphs at batch 16: 16 x (k+1=4) = 64 tokens > capture "
                                  "ceiling 32 (FULL_AND_PIECEWISE); raise max_cudagraph_capture_size or lower the depth")
    # k=2 under FULL decode: sizes rounded up to multiples of 3 and kept under 32 (32 -> 33 dropped),
    # so the ceiling drops to 24 and a batch of 9 (27 tokens) falls outside
    assert decode_coverage(GRAPHS, k=2, batch_sizes=[8, 9]) == {"mode": "FULL_AND_PIECEWISE", "query_len": 3,
                                                                 "ceiling": 24, "outside": [9], "runner": "v1"}
    # Model Runner V2 skips that rounding: its PIECEWISE graphs keep the size 32, so 9 x 3 = 27 fits
    assert decode_coverage(GRAPHS, k=2, batch_sizes=[8, 9, 11], runner="v2")["outside"] == [11]
    # PIECEWISE keeps its sizes (no rounding): 9 x 3 = 27 fits under 32, 11 x 3 = 33 does not
    assert decode_coverage({**GRAPHS, "mode": "PIECEWISE"}, k=2, batch_sizes=[9, 11])["outside"] == [11]
    eager = decode_coverage({"mode": "NONE", "capture_sizes": [], "max_capture_size": 0}, k=0, batch_sizes=[1])
    assert coverage_line(eager) == "decode ran without CUDA graphs (cudagraph_mode NONE)"
    assert coverage_line(decode_coverage(GRAPHS, k=3, batch_sizes=[1, 8])) is None


# (mode, capture sizes, ceiling, k+1): the graph sets a decode step may meet, V1's rounding cases
# among them (sizes past a ceiling that is no multiple of k+1; a size that rounds past it).
V2_CASES = [("FULL_AND_PIECEWISE", [1, 2, 4, 8, 16, 24, 32], 32, 3), ("FULL_AND_PIECEWISE", [1, 2, 4, 8, 16, 24, 32], 32, 4),
            ("FULL_AND_PIECEWISE", [8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152,
                                    160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256, 272, 288, 304,
                                    320, 336, 352, 368, 384, 400, 416, 432, 448, 464, 480, 496, 512], 512, 3),
            ("FULL_DECODE_ONLY", [1, 2, 4, 8, 16, 24, 30], 30, 4), ("FULL_DECODE_ONLY", [4], 4, 3),
            ("FULL", [1, 2, 4, 8], 8, 3), ("PIECEWISE", [1, 2, 4, 8, 16], 16, 5), ("NONE", [], 0, 2)]


@pytest.mark.parametrize("mode, sizes, ceiling, q", V2_CASES)
def test_the_v2_coverage_is_vllms_own_v2_graph_manager(mode, sizes, ceiling, q):
    """Model Runner V2's graph manager (vllm/v1/worker/gpu/cudagraph_utils.py), run on CPU: which
    uniform decode batches ``dispatch`` gives a graph, from the descriptors ``_init_candidates``
    builds, against autotune's V2 rule; and V1's rule, which rounds every size, where they differ."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    max_reqs = 256
    # a stand-in holding what _init_candidates and dispatch read (no GPU, no distributed state)
    m = SimpleNamespace(compilation_config=SimpleNamespace(cudagraph_capture_sizes=list(sizes),
                                                           max_cudagraph_capture_size=ceiling),
                        cudagraph_mode=CUDAGraphMode[mode], max_num_reqs=max_reqs, decode_query_len=q,
                        vllm_config=SimpleNamespace(speculative_config=None,
                                                    cache_config=SimpleNamespace(use_kda_recoverssm=False)),
                        varlen_decode=False, lora_capture_cases=[0], _candidates={}, _capture_descs={},
                        _graphs_captured=True, _maybe_ubatch_twin=lambda desc: None,
                        _resolve_effective_loras=lambda n: 0)
    CudaGraphManager._init_candidates(m)
    batches = list(range(1, max(sizes, default=1) // q + 3))
    graphed = {c for c in batches
               if CudaGraphManager.dispatch(m, c, c * q, q, 0, max_query_len=q).cg_mode != CUDAGraphMode.NONE}
    graphs = {"mode": mode, "capture_sizes": sizes, "max_capture_size": ceiling}
    outside = decode_coverage(graphs, k=q - 1, batch_sizes=batches, runner="v2")["outside"]
    assert sorted(set(batches) - graphed) == outside


# (mode, capture sizes, ceiling, k, schedule): a depth schedule lowers the depth as the batch grows
SCHEDULE_CASES = [("FULL_AND_PIECEWISE", [1, 2, 4, 8, 16, 24, 32], 32, 4, [[1, 2, 4], [3, 6, 2], [9, 256, 0]]),
                  ("FULL_DECODE_ONLY", [1, 2, 4, 8, 16, 24, 30], 30, 3, [[1, 4, 3], [5, 256, 1]]),
                  ("FULL_AND_PIECEWISE", [8, 16, 24, 32, 40, 48, 56, 64], 64, 5, [[1, 1, 5], [2, 8, 3], [12, 256, 1]])]


@pytest.mark.parametrize("mode, sizes, ceiling, k, schedule", SCHEDULE_CASES)
def test_a_depth_schedules_coverage_is_vllms_own_v2_graph_manager(mode, sizes, ceiling, k, schedule):
    """Under a depth schedule (num_speculative_tokens_per_batch_size) V2 captures FULL decode graphs for
    every depth the schedule gives (issue 59: autotune held every batch to k+1): each batch is
    dispatched at its own depth's query length by vLLM's graph manager, run on CPU, and the dense
    depth lookup is vLLM's own (build_dynamic_sd_schedule_lookup)."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    from autotune.measure.cudagraphs import depth_at

    max_reqs = 64
    dense = build_dynamic_sd_schedule_lookup(schedule, vllm_max_batch_size=max_reqs, vllm_num_speculative_tokens=k)
    assert [depth_at(schedule, c, k) for c in range(1, max_reqs + 1)] == dense[1:]
    spec = SimpleNamespace(uses_dynamic_speculative_decoding=lambda: True, num_speculative_tokens_per_batch_size=schedule)
    m = SimpleNamespace(compilation_config=SimpleNamespace(cudagraph_capture_sizes=list(sizes),
                                                           max_cudagraph_capture_size=ceiling),
                        cudagraph_mode=CUDAGraphMode[mode], max_num_reqs=max_reqs, decode_query_len=k + 1,
                        vllm_config=SimpleNamespace(speculative_config=spec, num_speculative_tokens=k,
                                                    cache_config=SimpleNamespace(use_kda_recoverssm=False)),
                        varlen_decode=False, lora_capture_cases=[0], _candidates={}, _capture_descs={},
                        _graphs_captured=True, _maybe_ubatch_twin=lambda desc: None,
                        _resolve_effective_loras=lambda n: 0)
    CudaGraphManager._init_candidates(m)
    batches = list(range(1, max_reqs + 1))
    graphed = set()
    for c in batches:
        q = dense[c] + 1
        if CudaGraphManager.dispatch(m, c, c * q, q, 0, max_query_len=q).cg_mode != CUDAGraphMode.NONE:
            graphed.add(c)
    graphs = {"mode": mode, "capture_sizes": sizes, "max_capture_size": ceiling}
    cov = decode_coverage(graphs, k=k, batch_sizes=batches, runner="v2", schedule=schedule)
    assert sorted(set(batches) - graphed) == cov["outside"]
    # held to k+1 alone (before issue 59), the deep batches read as outside where vLLM graphs them
    assert decode_coverage(graphs, k=k, batch_sizes=batches, runner="v2")["outside"] != cov["outside"]
    if cov["outside"]:
        c = cov["outside"][0]
        assert f"at batch {c}: {c} x (k+1={dense[c] + 1})" in coverage_line(cov)


def test_v2_covers_batches_that_v1s_rounding_leaves_out():
    """512 rounds up to 513 for k+1 = 3 and is dropped by V1, whose ceiling falls to 498 (496 -> 498):
    batches of 167 to 170 decode outside V1's graphs; V2 keeps 512 for its PIECEWISE graphs."""
    graphs = {"mode": "FULL_AND_PIECEWISE", "capture_sizes": V2_CASES[2][1], "max_capture_size": 512}
    assert decode_coverage(graphs, k=2, batch_sizes=list(range(160, 172)))["outside"] == [167, 168, 169, 170, 171]
    assert decode_coverage(graphs, k=2, batch_sizes=list(range(160, 172)), runner="v2")["outside"] == [171]


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
