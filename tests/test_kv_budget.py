"""The KV cache autotune asks vLLM for on CPU: sized from the models and the study's load."""

from __future__ import annotations

import json
from pathlib import Path

from autotune import demo
from autotune.core.kv_budget import FLOOR, MARGIN, kv_bytes_per_token, kv_cache_bytes, most_in_flight
from autotune.core.load import LoadPattern


def _model(tmp_path: Path, name: str, **config) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def test_bytes_per_token_from_the_config(tmp_path):
    # the demo target: 4 layers x 4 KV heads x 64 dims, keys and values, float32 (vLLM's log: 8 KiB a token)
    assert kv_bytes_per_token(str(demo.TARGET)) == 2 * 4 * 4 * 64 * 4 == 8192
    # grouped-query attention, head_dim from hidden_size / heads
    gqa = _model(tmp_path, "gqa", num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_size=896)
    assert kv_bytes_per_token(gqa) == 2 * 24 * 2 * 64 * 4
    # a multimodal config keeps its text model's sizes under text_config
    mm = _model(tmp_path, "mm", text_config={"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 32})
    assert kv_bytes_per_token(mm) == 2 * 2 * 8 * 32 * 4
    assert kv_bytes_per_token(_model(tmp_path, "odd", model_type="mamba")) is None
    assert kv_bytes_per_token(str(tmp_path / "absent")) is None


def test_budget_covers_every_model_in_flight_with_margin(tmp_path):
    t, d = str(demo.TARGET), str(demo.DRAFT)
    one = kv_cache_bytes([t, d], 1024, 16)
    assert one == (8192 + kv_bytes_per_token(d)) * 1024 * 16 * MARGIN
    assert kv_cache_bytes([t], 1024, 1) == FLOOR  # tiny needs get the floor
    assert kv_cache_bytes([t, str(tmp_path / "absent")], 1024, 16) is None  # unknown: keep vLLM's share
    assert kv_cache_bytes([t], 0, 16) is None
    # the constant tests use for the demo pair by hand holds all three models at 16 in flight
    assert kv_cache_bytes([t, d, str(demo.EAGLE3)], demo.MAX_MODEL_LEN, 16) <= demo.KV_CACHE_BYTES


def test_most_in_flight_by_load():
    assert most_in_flight([LoadPattern("concurrency", concurrency=4)], 32, samples=0) == 4
    assert most_in_flight([LoadPattern("concurrency", concurrency=1)], 32, samples=64) == 8  # the draws
    assert most_in_flight([LoadPattern("concurrency", concurrency=1), LoadPattern("ramp", concurrency=16)],
                          32, samples=0) == 16
    for open_loop in (LoadPattern("batch"), LoadPattern("poisson", rate=2.0), LoadPattern("replay")):
        assert most_in_flight([open_loop], 40, samples=0) == 40  # every request may be in flight


def test_search_sizes_the_kv_cache_on_cpu_and_keeps_a_given_share(faked_cpu, tmp_path):
    """`autotune search` on CPU asks vLLM for the study's KV (exported with the pick) instead of
    0.3 of RAM; a user's --gpu-memory-utilization is theirs and is kept."""
    from autotune.cli.search import SearchOptions, prepare
    from autotune.serve.export import serve_argv

    opts = dict(workload=Path("examples/json_edit.jsonl"), space="quick", results=tmp_path, levels="1,16")
    s = prepare(SearchOptions(**opts)).cfg.settings
    assert s.gpu_memory_utilization is None
    assert s.kv_cache_memory_bytes == kv_cache_bytes([str(demo.TARGET), str(demo.DRAFT), str(demo.EAGLE3)],
                                                     demo.MAX_MODEL_LEN, 16)
    from autotune.core.candidate import Candidate

    argv = serve_argv(Candidate({"method": "none"}).engine_kwargs(s))
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(s.kv_cache_memory_bytes)
    given = prepare(SearchOptions(**opts, gpu_memory_utilization=0.5)).cfg.settings
    assert given.gpu_memory_utilization == 0.5 and given.kv_cache_memory_bytes is None
