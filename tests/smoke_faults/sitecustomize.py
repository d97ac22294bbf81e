"""Faults planted into scripts/gpu_smoke.sh's run by tests/test_gpu_smoke.py (this folder first on
PYTHONPATH: every Python process the script starts runs this at start, the study's launcher included,
whose forked workers inherit what it patched). ``AUTOTUNE_SMOKE_FAULT``:

- ``trace``: the EAGLE-3 head's trace raises (on CPU it runs in the study's own process);
- ``runner``: each served trial records Model Runner V2 whatever vLLM's log says (on CPU it says V1).

Unset: nothing is patched. The third fault (a candidate vLLM refuses at config) is a space file.
"""

import os

_FAULT = os.environ.get("AUTOTUNE_SMOKE_FAULT")

if _FAULT == "trace":
    import autotune.forecast.eagle3_trace as _trace

    def _raises(*args, **kwargs):
        raise RuntimeError("planted: the trace raised")

    _trace.trace = _raises
elif _FAULT == "runner":
    import autotune.run.served_engine as _served

    _served.model_runner = lambda vllm_config, log=None: {"runner": "v2", "from": "planted"}
