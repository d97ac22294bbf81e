"""`search --config FILE`: a YAML file of search's own options, as `vllm serve --config` takes vLLM's.

Keys are the long options without dashes (`candidates: 8`, `space: quick`, `past-edge: false`; `_` and
`-` alike), and `workload`. The file fills the command's default_map, so a flag given on the
command line, or an option's AUTOTUNE_* environment variable, still wins over it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from autotune.core.errors import BadInput

# Not settable from the file: the file itself, and the help pages.
_NOT_KEYS = {"config", "help_all", "help"}


def load_config(ctx: typer.Context, value: Path | None) -> Path | None:
    """Eager callback of --config: read FILE into ctx.default_map, each key checked and converted."""
    if value is None or ctx.resilient_parsing:
        return value
    try:
        data = yaml.safe_load(value.read_text())
    except OSError as e:
        raise BadInput(f"--config {value}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"--config {value}: not YAML{where}") from None
    if data is None:
        return value
    if not isinstance(data, dict):
        raise BadInput(f"--config {value}: expected a mapping of option: value, got {type(data).__name__}")
    params = _params_by_key(ctx)
    defaults: dict[str, Any] = dict(ctx.default_map or {})
    for key, raw in data.items():
        param = params.get(str(key).replace("_", "-"))
        if param is None:
            raise BadInput(f"--config {value}: key {key!r} is not an option of `autotune {ctx.info_name}` "
                           f"(expected long options without dashes, e.g. candidates, space, strategy)")
        try:  # the option's own conversion and range, as the command line gets them
            param.get_runtime_param().coerce(raw, param=param, ctx=ctx)
        except typer.BadParameter as e:
            raise BadInput(f"--config {value}: key {key!r}: {e.message}") from None
        defaults[param.name] = raw
    ctx.default_map = defaults
    return value


def _params_by_key(ctx: typer.Context) -> dict[str, Any]:
    """Each option by its long name without dashes (`try`, `past-edge`), and the workload argument by name."""
    keys: dict[str, Any] = {}
    for p in ctx.command.params:
        if p.name in _NOT_KEYS:
            continue
        longs = [o[2:] for o in p.opts if o.startswith("--")]
        for key in longs or [p.name.replace("_", "-")]:
            keys[key] = p
    return keys
