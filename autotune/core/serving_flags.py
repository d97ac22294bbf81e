"""The user's own `vllm serve` flags (issue 41): fixed in every trial, exported with the pick.

vLLM's parser reads them (autotune.run.serving_flags, before any engine starts); what comes back is
plain data, a ``ServingFlags``: the flags that differ from vLLM's defaults, keyed by vLLM's own
argument names (``tensor_parallel_size``, ``enable_prefix_caching``, ...), values as JSON. They join
every candidate's engine arguments (autotune.core.candidate.Settings.serve_flags), so the served
command, the in-process engine, confirm and serve.sh all carry them, and the study's fingerprint
holds them.

A flag that collides with autotune's own work follows one rule each (``collisions``): one for a knob
the space searches removes that knob; one autotune owns, or one duplicating autotune's own option,
is bad input naming the option to use.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.core.errors import BadInput

# Flags autotune sets itself for every trial: the user cannot fix them.
OWNED = {"model": "--model (autotune's, before --)", "model_tag": "--model (autotune's, before --)",
         "speculative_config": "the search space (method, num_speculative_tokens, ...) or --try",
         "compilation_config": "the search space (cudagraph_mode)",
         "host": "nothing: autotune picks where each trial listens", "port": "nothing: autotune picks where each "
         "trial listens", "seed": "--seed (autotune's, before --)"}
# Flags that duplicate an option of autotune's (the option sets the baseline too): the option, given
# before `--` with the same value. The KV cache's size in bytes has no option of its own: autotune
# sizes it, from --gpu-memory-utilization or from the study's requests in flight.
KV_BYTES = "kv_cache_memory_bytes"
DUPLICATES = {"dtype": "--dtype", "max_model_len": "--max-model-len",
              "gpu_memory_utilization": "--gpu-memory-utilization", KV_BYTES: "--gpu-memory-utilization",
              "trust_remote_code": "--trust-remote-code"}
# Flags whose values parallelize one engine over several devices (the CPU binding, --workers x TP).
PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def flag(name: str) -> str:
    """vLLM's argument name as its flag: ``max_num_seqs`` -> ``--max-num-seqs``."""
    return "--" + name.replace("_", "-")


def as_option(option: str, value: Any) -> str:
    """An option as typed on the command line: ``--max-model-len 512``, ``--trust-remote-code``."""
    if value is True:
        return option
    return f"{option} {value}"


@dataclass(frozen=True)
class ServingFlags:
    """The user's serving flags as vLLM parsed them: the non-default ones, JSON values.

    ``served_only``: those that are not engine arguments (the API server's own, such as
    ``--chat-template``): the served instrument, confirm and serve.sh carry them; the in-process
    instrument, which has no API server, cannot.
    """

    values: dict[str, Any] = field(default_factory=dict)
    served_only: tuple[str, ...] = ()
    source: str = ""  # where they came from, for messages: "after --", "--serve-config FILE"

    def _int(self, name: str) -> int:
        value = self.values.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1

    @property
    def tensor_parallel_size(self) -> int:
        return self._int("tensor_parallel_size")

    @property
    def pipeline_parallel_size(self) -> int:
        return self._int("pipeline_parallel_size")

    @property
    def data_parallel_size(self) -> int:
        return self._int("data_parallel_size")

    @property
    def devices_per_engine(self) -> int:
        """Devices one engine spans: tensor x pipeline x data parallel (vLLM's world size on one node)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def __bool__(self) -> bool:
        return bool(self.values)


def fixed_values(flags: ServingFlags, knobs: set[str]) -> dict[str, tuple[Any, str]]:
    """The space's knobs the flags fix, each with the value every trial then has and why: a flag
    named for the knob, or one that decides it in vLLM's config (issue 59):

    - ``--enforce-eager``: vLLM runs every ``cudagraph_mode`` as NONE (``VllmConfig.__post_init__``), so
      three graph modes would be one engine under three labels;
    - adaptive verification (dspark): vLLM refuses it without full CUDA graphs (under
      ``--enforce-eager``), under pipeline parallelism and with LoRA
      (``VllmConfig._validate_adaptive_verification``)."""
    out: dict[str, tuple[Any, str]] = {n: (flags.values[n], f"fixed by {flag(n)}") for n in flags.values if n in knobs}
    v = flags.values
    if v.get("enforce_eager") is True and "cudagraph_mode" in knobs:
        out["cudagraph_mode"] = ("NONE", "--enforce-eager: vLLM runs every cudagraph_mode as NONE")
    why = ("--enforce-eager (adaptive verification needs full CUDA graphs)" if v.get("enforce_eager") is True else
           "--pipeline-parallel-size > 1" if (v.get("pipeline_parallel_size") or 1) > 1 else
           "--enable-lora" if v.get("enable_lora") else None)
    if why and "enable_adaptive_verification" in knobs:
        out["enable_adaptive_verification"] = (False, f"vLLM refuses it under {why}")
    return out


def collisions(flags: ServingFlags, knobs: set[str]) -> list[str]:
    """The space's knobs the flags fix (to be removed from the space); BadInput for a flag autotune
    owns or one duplicating an option of autotune's, naming what to use instead."""
    where = f" ({flags.source})" if flags.source else ""
    for name in flags.values:
        if name in OWNED:
            raise BadInput(f"{flag(name)}{where}: autotune sets this itself in every trial; use {OWNED[name]}")
        if name == KV_BYTES:
            raise BadInput(f"{flag(name)}{where}: autotune sizes the KV cache itself (on CPU from the study's "
                           "requests in flight); to set its share of memory, give --gpu-memory-utilization "
                           "before `--`")
        if name in DUPLICATES:
            raise BadInput(f"{flag(name)}{where}: autotune has this option itself (it sets the baseline and every "
                           f"trial alike): give it before `--` as {as_option(DUPLICATES[name], flags.values[name])}")
    return sorted(name for name in flags.values if name in knobs)
