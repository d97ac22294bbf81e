"""KV cache size and preemptions per trial: read from vLLM's /metrics, diffed around windows, summed
into the measurement, a column of trials.csv and a flag on the trial's line (FAKE engine for the study)."""

import csv
import json

from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.measure.metrics import measure_run, pool
from autotune.run.replay import diff_counters
from autotune.run.served_engine import PREEMPTIONS, kv_cache_blocks, parse_counters

# The lines vLLM 0.32's PrometheusStatLogger writes for these (vllm/v1/metrics/loggers.py), abridged.
METRICS = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",engine="0",num_gpu_blocks="3",num_cpu_blocks="None"} 1.0
"""


def test_preemptions_and_kv_blocks_from_a_metrics_page():
    got = parse_counters(METRICS)
    assert got[PREEMPTIONS] == 3
    assert kv_cache_blocks(METRICS) == 3
    assert kv_cache_blocks("# nothing here\n") is None
    before = {**parse_counters(""), PREEMPTIONS: 1}
    assert diff_counters(before, got)[PREEMPTIONS] == 2


def _window(preempted):
    req = {"id": "a", "start": 0.0, "end": 1.0, "chunks": [[0.1, 1], [0.2, 1]], "token_ids": [1, 2], "text": "x",
           "finish_reason": "length", "error": None, "prompt_tokens": 3}
    counters = {"vllm:spec_decode_num_drafts": 0, "vllm:spec_decode_num_draft_tokens": 0,
                "vllm:spec_decode_num_accepted_tokens": 0, "vllm:spec_decode_num_accepted_tokens_per_pos": []}
    if preempted is not None:
        counters[PREEMPTIONS] = preempted
    return {"window_s": 1.0, "requests": [req], "spec_counters": counters}


def test_a_measurement_counts_every_windows_preemptions_and_pools_them():
    raw = {"windows": [_window(2), _window(1)], "levels": {"c=8": [_window(4)]}, "kv_cache_blocks": 3}
    m = measure_run(raw)
    assert (m["preemptions"], m["kv_cache_blocks"]) == (7, 3)
    again = measure_run({"windows": [_window(0)], "kv_cache_blocks": 5})
    assert (again["preemptions"], again["kv_cache_blocks"]) == (0, 5)
    pooled = pool(m, again)
    assert (pooled["preemptions"], pooled["kv_cache_blocks"]) == (7, 5)
    old = measure_run({"windows": [_window(None)]})  # a record from before, or an engine that does not say
    assert old["preemptions"] is None and old["kv_cache_blocks"] is None


def test_a_trial_measured_with_preemptions_is_flagged_in_its_line_and_trials_csv(tmp_path, monkeypatch,
                                                                                  fake_engine_env):
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    monkeypatch.setenv("AUTOTUNE_FAKE_PREEMPTIONS", "2")  # each speculating window preempts 2 requests
    monkeypatch.setenv("COLUMNS", "1000")  # each record whole on one line, to read it (a pipe wraps at 100)
    ngram = '{"method": "ngram", "num_speculative_tokens": 3, "kv_cache_dtype": "auto", "quantization": "none"}'
    r = CliRunner().invoke(app, ["search", "examples/smoke.jsonl", "--model", "fake-model", "--results", str(tmp_path),
                                 "--samples", "0", "--repeats", "1", "--space", "tests/data/fake_space.yaml",
                                 "--trials", "2", "--try", ngram, "--no-remeasure"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stdout.splitlines() if "PREEMPTED" in ln]
    assert len(lines) == 1 and "ngram k=3" in lines[0], r.stdout
    assert "PREEMPTED 2 request(s): the KV cache (64 blocks) ran short" in lines[0]
    rows = {row["label"]: row for row in csv.DictReader(open(tmp_path / "smoke" / "trials.csv"))}
    assert rows["ngram k=3"]["preemptions"] == "2" and rows["ngram k=3"]["kv_cache_blocks"] == "64"
    base = next(row for row in rows.values() if row["role"] == "baseline")
    assert base["preemptions"] == "0"
    assert json.loads((tmp_path / "smoke" / "best.json").read_text())
