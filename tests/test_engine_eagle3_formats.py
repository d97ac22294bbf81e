"""A head in the layout users have, on the real vLLM engine (CPU build): the bundled head's weights in
the speculators format (vllm-project/speculators' ``layers.0.*``, ``transformer_layer_config``), with
its own embedding, an lm_head over a draft vocabulary smaller than the target's and ``d2t``/``t2d``
maps, and Llama 3.1's ``llama3`` RoPE scaling, as RedHatAI's Llama-3.1 heads are
(tests/eagle3_heads.py). vLLM drafts with it, and the forecast (autotune.forecast.eagle3_trace, which
reads that layout as vLLM's loader does) says vLLM's acceptance, position by position.

One engine (eagle3 at depth K); its greedy outputs are the target's (lossless, as
tests/test_engine_eagle3.py checks for the bundled head), so the forecast replays along them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune import demo

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "examples" / "json_edit.jsonl"
K = 4
EDITS = 16  # of the 32: enough drafts to tell the layouts' readings apart (0 accepted with d2t ignored)


def _draft_vocabulary() -> list[int]:
    """The workload's prompt tokens (an edit copies its record) and every third other id: about
    half the target's vocabulary, so d2t maps most draft ids to other target ids."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(demo.TARGET)
    used = {t for line in WORKLOAD.read_text().splitlines() if line.strip()
            for t in tok(json.loads(line)["prompt"])["input_ids"]}
    return sorted(used | set(range(0, 1042, 3)) | {2})


def test_a_speculators_head_with_its_own_vocabulary_and_llama3_rope_is_forecast_as_vllm_drafts(
        tmp_path, engine_launcher):
    if not demo.eagle3_available():
        pytest.skip("no shipped EAGLE-3 head")
    import eagle3_heads
    from test_engine_eagle3 import mean_accepted_length, run_engine

    from autotune.forecast import eagle3_fit
    from autotune.forecast.eagle3_trace import trace
    from autotune.forecast.forecast import AcceptanceTable

    keep = _draft_vocabulary()
    head = eagle3_heads.write(tmp_path / "speculators-head", "speculators", eagle3_heads.bundled_tensors(), keep=keep,
                              norm_before_residual=False, rope_scaling=eagle3_heads.LLAMA31_ROPE)
    assert len(keep) < 1042 and eagle3_fit.why_not(str(head), str(demo.TARGET), ram_bytes=2**40) is None
    workload = tmp_path / "edits.jsonl"
    workload.write_text("".join(WORKLOAD.read_text().splitlines(keepends=True)[:EDITS]))
    eagle = run_engine(K, {"json_edit": workload}, tmp_path, head=head)["json_edit"]
    c = eagle["counters"]
    outputs = eagle["outputs"]
    pairs = [(o["prompt_token_ids"], o["token_ids"]) for o in outputs]
    chains = dict(zip((o["id"] for o in outputs), trace(pairs, depth=K, head_dir=head, threads=2)))
    drafted = {t for ch in chains.values() for d in ch["drafts"] for t in d}
    assert drafted <= set(keep) and drafted - set(range(len(keep)))  # target ids through d2t, not draft ids
    said = AcceptanceTable(outputs, None, 1024, eagle3=chains).get({"method": "eagle3", "num_speculative_tokens": K})
    print(f"k={K}: forecast {said.mean_accepted_length:.4f} per position {list(said.per_pos)}; vLLM "
          f"{mean_accepted_length(c):.4f} per position {c.get('vllm:spec_decode_num_accepted_tokens_per_pos')}")
    assert mean_accepted_length(c) > 1.5, c  # the converted head still drafts what the target says
    assert said.mean_accepted_length == pytest.approx(mean_accepted_length(c), rel=0.03), (said.to_dict(), c)
    assert said.drafts == pytest.approx(c["vllm:spec_decode_num_drafts"], rel=0.03)
    assert list(said.per_pos) == pytest.approx(c["vllm:spec_decode_num_accepted_tokens_per_pos"], rel=0.02, abs=2)
