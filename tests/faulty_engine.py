"""The REAL engine (autotune.run.engine) with a planted fault, for tests/test_engine_correctness.py.

Named as the study's engine (``StudyConfig(engine_module="faulty_engine")``) and given the fault as
JSON in ``AUTOTUNE_TEST_FAULT`` (the worker's environment), it rewrites the sampling parameters of
every request the adapter streams, in-process or served, and otherwise runs vLLM unchanged:
``temperature_scale`` samples hotter or colder than asked, ``top_p`` ignores the asked top-p of
sampled requests, ``max_tokens_cap`` truncates outputs. Nothing in autotune/ knows of faults.
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


def run_job(job: dict[str, Any], phase: Any) -> dict[str, Any]:
    fault = json.loads(os.environ.get(ENV) or "null")
    if fault:
        for cls in (real.InProcess, served_engine.ServedEngine):
            _faulty(cls, fault)
    return real.run_job(job, phase)
