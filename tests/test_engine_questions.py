"""A multi-turn question file on the real vLLM engine (CPU build) with the demo pair: each later
turn is rendered through the model's chat template after the model's own answer, every turn is
judged against the baseline's, and results come back by category. Smoke-sized: 2 trials, 16 tokens.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.core.study_report import load_report
from autotune.run.engine import UNTIMED_ENV

pytestmark = pytest.mark.engine
NGRAM = ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2, '
         '"kv_cache_dtype": "auto", "quantization": "none", "enforce_eager": true}')


def test_question_file_replays_turns_and_reports_by_category(tmp_path, monkeypatch):
    for k, v in UNTIMED_ENV.items():  # outputs and counters only, never speed: one process per engine
        monkeypatch.setenv(k, v)
    r = CliRunner().invoke(app, ["search", "tests/data/formats/questions.jsonl", "--turns", "all", "--output-len", "16",
                                 "--space", "tests/data/engine_space.yaml", "--trials", "2", "--try", NGRAM,
                                 "--results", str(tmp_path), "--study", "q", "--repeats", "1", "--max-repeats", "0",
                                 "--warmup", "1", "--samples", "0", "--trial-timeout", "300", "--no-remeasure",
                                 # vLLM's per-request acceptance (asserted below) reaches only an in-process engine
                                 "--instrument", "inprocess", "--explain"])  # the table by category: --explain
    print(r.output)
    assert r.exit_code == 0, r.output
    out = tmp_path / "q"
    frame = pd.read_csv(out / "trials.csv").set_index("trial")
    # 6 questions, 9 turns: each a request; greedy and lossless, later turns included.
    assert (frame["completed"] == 9).all() and frame.loc[1, "correct"] and frame.loc[1, "token_agreement"] == 1.0
    # The second turn's prompt is the conversation so far: longer than the first turn's.
    window = json.loads((out / "trials" / "0001" / "result.json").read_text())["windows"][0]
    recs = {x["id"]: x for x in window["requests"]}
    assert recs["81#turn2"]["prompt_tokens"] > recs["81"]["prompt_tokens"] + len(recs["81"]["token_ids"])
    # vLLM's per-request acceptance adds up to its global counters over the window.
    assert sum(x["spec_decode"]["num_accepted_draft_tokens"] for x in window["requests"]) == \
        window["spec_counters"]["vllm:spec_decode_num_accepted_tokens"]
    cats = pd.read_csv(out / "by_category.csv").set_index(["trial", "category"])
    assert sorted({c for _, c in cats.index}) == ["editing", "math", "rag"]
    assert (cats.loc[1, "acceptance_source"] == "vllm").all()
    best = load_report(out)["best"]
    for c in ("editing", "math", "rag"):
        print(f"{c}: accepted length {cats.loc[(1, c), 'mean_accepted_length']:.3f}, "
              f"speedup {cats.loc[(1, c), 'speedup_output_tok_s']:.2f}")
    print(f"vLLM counters (all requests): {frame.loc[1, 'mean_accepted_length']:.3f}")
    if best["trial"] == 1:
        assert "By category: trial 1" in r.output
