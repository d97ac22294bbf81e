"""vLLM 0.32's Model Runner V2 ngram speculator, run on CPU tensors: ``NgramGPUSpeculator.propose``
(vllm/v1/worker/gpu/spec_decode/ngram/speculator.py) and its two Triton kernels, under Triton's
interpreter (``TRITON_INTERPRET=1``). Run as a subprocess by tests/test_predict_runners.py, so the
patched Triton never reaches another test.

The CPU build of vLLM turns Triton off (no CPU backend: ``vllm.triton_utils.HAS_TRITON`` False, and
``triton.jit`` a no-op placeholder), so before the speculator's module is imported the real Triton is
put where it looks (``vllm.triton_utils``): its kernels are then real ``@triton.jit`` functions,
which the interpreter runs with numpy. One shim: Triton 3.9's interpreter gives the finalize kernel's
``slot_valid`` mask (``(k_iota < tokens_avail) & write_ok & k_in_range``, a scalar boolean among
vectors) as int32, which its masked load refuses ("mask has unsupported dtype"); it is cast to bool,
what the compiled kernel's i1 mask is. Input: a JSON file of jobs, each {"rows": [token lists],
"min_n", "max_n", "k", "max_model_len"}; output (stdout, last line): for each job the drafts, one
list of k tokens a row.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402

import vllm.triton_utils as triton_utils  # noqa: E402

triton_utils.HAS_TRITON, triton_utils.triton, triton_utils.tl = True, triton, tl
_load = interpreter.InterpreterBuilder.create_masked_load


def _bool_mask_load(self, ptrs, mask, other, *args, **kwargs):
    if mask.data.dtype != np.bool_:
        mask = interpreter.TensorHandle(mask.data.astype(bool), tl.int1)
    return _load(self, ptrs, mask, other, *args, **kwargs)


interpreter.InterpreterBuilder.create_masked_load = _bool_mask_load

from types import SimpleNamespace as NS  # noqa: E402

from vllm.v1.worker.gpu.spec_decode.ngram.speculator import NgramGPUSpeculator  # noqa: E402


def propose(rows: list[list[int]], min_n: int, max_n: int, k: int, max_model_len: int) -> list[list[int]]:
    """V2's drafts for each row (its prompt + output so far; the last token the one just sampled)."""
    config = NS(speculative_config=NS(prompt_lookup_min=min_n, prompt_lookup_max=max_n, num_speculative_tokens=k),
                scheduler_config=NS(max_num_seqs=len(rows)), model_config=NS(max_model_len=max_model_len))
    tokens = torch.zeros((len(rows), max_model_len), dtype=torch.int32)  # RequestState.all_token_ids
    for i, row in enumerate(rows):
        tokens[i, :len(row)] = torch.tensor(row, dtype=torch.int32)
    states = NS(all_token_ids=NS(gpu=tokens),
                total_len=NS(gpu=torch.tensor([len(r) for r in rows], dtype=torch.int32)))
    spec = NgramGPUSpeculator(config, torch.device("cpu"), states)
    last = torch.tensor([[r[-1]] for r in rows], dtype=torch.int64)  # RequestState.last_sampled_tokens
    batch = NS(num_reqs=len(rows), idx_mapping=torch.arange(len(rows), dtype=torch.int64))
    num_sampled = torch.ones(len(rows), dtype=torch.int32)  # a decode step: one token was sampled
    out = spec.propose(batch, None, None, None, None, num_sampled, None, last, None, None, None)
    return out.tolist()


if __name__ == "__main__":
    jobs = json.loads(open(sys.argv[1]).read())
    print(json.dumps([propose(j["rows"], j["min_n"], j["max_n"], j["k"], j["max_model_len"]) for j in jobs]))
