"""TEST ONLY: vLLM 0.32's rejection sampler with its CPU ``expand`` kernel mended.

On a worker's PYTHONPATH, every process of that worker (vLLM's engine core included) imports this
first. It replaces ``vllm.utils.cpu_triton_utils._expand_kernel_impl``, which writes into
``_ensure_int64(output)``, an int64 *copy* of a float output, so the target's draft-position
temperatures and top-p are left uninitialized (tests/test_engine_correctness.py,
test_draft_model_sampling_is_flagged_on_vllm_0_32_cpu), with the same expansion in plain torch,
written into ``output`` itself. Nothing else changes: the rest of vLLM's rejection sampler is
what the distribution test then judges. Never used by autotune itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

TARGET = "vllm.utils.cpu_triton_utils"
MARK = "autotune tests: vLLM's CPU expand kernel mended (tests/vllm_cpu_expand_fix)"


def _expand_kernel_impl(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
                        MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803 (the kernel's own name)
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    vals = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(vals, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


class _Mend(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        self.inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        module._expand_kernel_impl = _expand_kernel_impl
        module.MENDED_BY_AUTOTUNE_TESTS = True
        print(MARK, file=sys.stderr, flush=True)  # in the worker's log: the mend reached this process


sys.meta_path.insert(0, _Mend())
