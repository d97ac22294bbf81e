"""The ngram forecast per model runner (issue 51): on a GPU vLLM 0.32 runs ngram on Model Runner V2,
whose ``NgramGPUSpeculator`` proposes differently from V1's proposer (the CPU build's). The replay
(autotune.forecast.predict.ngram_proposal, ``runner="v2"``) is held to vLLM's own V2 code: its
``propose`` and Triton kernels run on CPU tensors under Triton's interpreter (tests/ngram_v2.py), on
rows that tell V1 from V2 and on random ones; and, where Triton cannot run, to a table transcribed
from that code (its lines cited). The V1 rule is held to vLLM's V1 function in tests/test_predict.py."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core.runner import V1, V2
from conftest import config_code_pythonpath
from autotune.forecast.forecast import AcceptanceTable
from autotune.forecast.predict import ngram_acceptance, ngram_proposal

HERE = Path(__file__).resolve().parent
L = 128  # max_model_len of the rows below

# (tokens, min_n, max_n, k, V2's draft, V1's draft, what the row tells apart), from
# vllm/v1/worker/gpu/spec_decode/ngram/speculator.py (vLLM 0.32.0):
# - l. 70-71: a match starts at pos <= seq_len - n - 1 (it ends before the last token);
# - l. 82-86: the score n * (L + 1) + pos + 1, maxed: the longest n, then the rightmost pos;
# - l. 130: the draft starts at best_pos + best_n; l. 132, 139: a slot holds a copied token only
#   while slot < seq_len - draft_start and there is a match;
# - l. 145-147: every other slot holds the last sampled token (the row's last).
DISTINGUISHING = [
    ([1, 2, 9, 1, 2, 8, 1, 2], 2, 3, 3, [8, 1, 2], [9, 1, 2], "a tie between match positions: V2 the latest"),
    ([1, 2, 3, 1, 2, 3, 1, 2], 2, 3, 5, [3, 1, 2, 2, 2], [3, 1, 2], "fewer than k tokens after the match"),
    ([9, 8, 7, 6], 2, 3, 3, [6, 6, 6], [], "no match: V2 still drafts k, the last token"),
    ([5], 2, 3, 2, [5, 5], [], "shorter than min_n"),
    ([4, 4, 4, 4], 2, 3, 4, [4, 4, 4, 4], [4], "a self-overlapping match, then the fill"),
    ([7, 1, 2, 3, 7, 1, 2, 5, 7, 1, 2], 1, 3, 2, [5, 7], [3, 7], "the longest n first, then the latest of it"),
]


def _random_rows(seed: int, n: int = 24) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5) for _ in range(rng.randint(1, 60))] for _ in range(n)]


JOBS = [(2, 3, 3), (1, 1, 4), (1, 5, 6), (3, 4, 2)]


def _vllm_v2(jobs: list[dict]) -> list[list[list[int]]]:
    """vLLM's own V2 proposals for each job (tests/ngram_v2.py, a subprocess under TRITON_INTERPRET=1)."""
    pytest.importorskip("triton")
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ngram_v2_{os.getpid()}.json"
    path.write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": config_code_pythonpath()}
    try:
        r = subprocess.run([sys.executable, str(HERE / "ngram_v2.py"), str(path)], capture_output=True, text=True,
                           env=env, timeout=600)
    finally:
        path.unlink(missing_ok=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_v2_ngram_replay_is_vllms_own_v2_speculator():
    """The same drafts as vLLM's NgramGPUSpeculator.propose, its Triton kernels interpreted on CPU:
    on the rows that tell V1 from V2, and on random low-entropy rows at several lookups and depths."""
    jobs = [{"rows": [r[0]], "min_n": r[1], "max_n": r[2], "k": r[3], "max_model_len": L} for r in DISTINGUISHING]
    jobs += [{"rows": _random_rows(seed), "min_n": lo, "max_n": hi, "k": k, "max_model_len": L}
             for seed, (lo, hi, k) in enumerate(JOBS)]
    got = _vllm_v2(jobs)
    for job, drafts in zip(jobs, got):
        for row, draft in zip(job["rows"], drafts):
            mine = ngram_proposal(row, job["min_n"], job["max_n"], job["k"], L, V2)
            assert mine == draft, (row, job["min_n"], job["max_n"], job["k"])
    for (tokens, lo, hi, k, v2, v1, what), (drafts,) in zip(DISTINGUISHING, got[:len(DISTINGUISHING)]):
        assert drafts == v2, what  # the table below is vLLM's V2, as run
        assert ngram_proposal(tokens, lo, hi, k, L, V1) == v1 != v2, what  # and V1 proposes otherwise


@pytest.mark.parametrize("row", DISTINGUISHING, ids=[r[-1] for r in DISTINGUISHING])
def test_the_v2_ngram_replay_on_the_rows_transcribed_from_vllms_source(row):
    """Without Triton: the same rows, each draft transcribed from the kernel's lines (cited above)."""
    tokens, lo, hi, k, v2, v1, _ = row
    assert ngram_proposal(tokens, lo, hi, k, L, V2) == v2
    assert ngram_proposal(tokens, lo, hi, k, L, V1) == v1


def test_the_replay_counts_what_v2_drafts_every_step():
    """V2 drafts k tokens every decode step, matched or not: more drafts and draft tokens than V1
    over the same tokens, and a repeated last token accepted where V1 had no draft at all."""
    prompt, output = [1, 2, 3, 4], [7] * 10  # no 3-gram recurs until four 7s are out
    v1 = ngram_acceptance([(prompt, output)], k=3, min_n=3, max_n=3, max_model_len=L, runner=V1)
    v2 = ngram_acceptance([(prompt, output)], k=3, min_n=3, max_n=3, max_model_len=L, runner=V2)
    assert v2.drafts == v2.steps and v2.draft_tokens == 3 * v2.steps  # every step drafts k
    assert v1.drafts < v1.steps  # V1: no draft until 7 7 7 recurs
    assert v2.accepted > v1.accepted and v2.tokens_per_step > v1.tokens_per_step


def test_the_forecast_replays_ngram_on_the_baselines_runner():
    outputs = [{"id": "a", "prompt_token_ids": [1, 2, 3, 4], "token_ids": [9, 9, 9, 9, 5]}]
    params = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    on = {r: AcceptanceTable(outputs, None, L, ngram_runner=r).get(params) for r in (V1, V2)}
    assert on[V1] == ngram_acceptance([([1, 2, 3, 4], [9, 9, 9, 9, 5])], k=3, min_n=2, max_n=3, max_model_len=L)
    assert on[V2] == ngram_acceptance([([1, 2, 3, 4], [9, 9, 9, 9, 5])], k=3, min_n=2, max_n=3, max_model_len=L,
                                      runner=V2)
    assert on[V1] != on[V2]
