"""The REAL engine (autotune.run.engine) with a planted fault, for tests/test_engine_correctness.py.

Named as the study's engine (``StudyConfig(engine_module="faulty_engine")``) and given the fault as
JSON in ``AUTOTUNE_TEST_FAULT`` (the worker's environment), it rewrites the sampling parameters of
every request the adapter streams, in-process or served, and otherwise runs vLLM unchanged:
``temperature_scale`` samples hotter or colder than asked, ``top_p`` ignores the asked top-p of
sampled requests, ``max_tokens_cap`` truncates outputs. ``accept_within`` (nats) plants a fault in
vLLM's acceptance instead: a greedy request's draft token is accepted where the target's log-prob
of it is within that much of its top token's (vLLM accepts the top token alone), by raising its
logit above the top before vLLM's own greedy rejection runs. It acts in the engine core, so it
needs the core in the worker's process (autotune.run.engine.UNTIMED_ENV). Nothing in autotune/
knows of faults.
"""

from __future__ import annotations

import json
import os
from typing import Any

from autotune.run import engine as real
from autotune.run import served_engine

ENV = "AUTOTUNE_TEST_FAULT"


def plant(sampling: dict[str, Any], fault: dict[str, Any]) -> dict[str, Any]:
    out = dict(sampling)
    if out.get("temperature", 0) > 0:
        out["temperature"] = out["temperature"] * fault.get("temperature_scale", 1.0)
        if "top_p" in fault:
            out["top_p"] = fault["top_p"]
    if "max_tokens_cap" in fault:
        out["max_tokens"] = min(out["max_tokens"], fault["max_tokens_cap"])
    return out


def _faulty(cls: type, fault: dict[str, Any]) -> None:
    stream = cls.stream

    def faulty_stream(self, prompt: Any, sampling: dict[str, Any], rid: str) -> Any:
        return stream(self, prompt, plant(sampling, fault), rid)

    cls.stream = faulty_stream


def accept_within(margin: float) -> None:
    """Plant the near-tie acceptance fault in vLLM's rejection sampler (this process's)."""
    import torch
    import vllm.v1.sample.rejection_sampler as rs

    sample = rs.rejection_sample

    def faulty(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
               bonus_token_ids, sampling_metadata, *args, **kwargs):
        lp = target_logits.float().log_softmax(-1)
        gap = lp.max(-1).values - lp.gather(-1, draft_token_ids.long().unsqueeze(-1)).squeeze(-1)
        per_req = torch.repeat_interleave(torch.arange(len(num_draft_tokens), device=gap.device),
                                          torch.tensor(num_draft_tokens, device=gap.device))
        greedy = torch.ones_like(gap, dtype=torch.bool) if sampling_metadata.all_greedy else \
            sampling_metadata.temperature[per_req] == 0
        hit = ((gap > 0) & (gap < margin) & greedy).nonzero().squeeze(-1)
        if len(hit):
            target_logits = target_logits.clone()
            target_logits[hit, draft_token_ids[hit].long()] = target_logits[hit].max(-1).values + 1.0
            print(f"faulty_engine: accepted drafts {[round(float(g), 4) for g in gap[hit]]} nats under the top",
                  flush=True)
        return sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                      target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs)

    rs.rejection_sample = faulty


def run_job(job: dict[str, Any], phase: Any) -> dict[str, Any]:
    fault = json.loads(os.environ.get(ENV) or "null")
    if fault and "accept_within" in fault:
        accept_within(float(fault["accept_within"]))
    elif fault:
        for cls in (real.InProcess, served_engine.ServedEngine):
            _faulty(cls, fault)
    return real.run_job(job, phase)
