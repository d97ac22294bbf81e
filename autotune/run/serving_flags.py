"""The user's `vllm serve` flags, read by vLLM's own serve parser before any engine starts.

``vllm serve`` builds its parser with ``make_arg_parser`` (vllm.entrypoints.launchers.cli_args) and
its engine with ``AsyncEngineArgs.from_cli_args``; this does the same and stops there, short of
``create_engine_config``, which needs the hardware (tensor parallel 4 must parse on a 2-core CPU).
What comes back is plain data (autotune.core.serving_flags.ServingFlags): the flags that differ
from vLLM's defaults, so the study's parent, which never imports vLLM otherwise, keeps nothing of it
but these values. Imported only when the user gives flags (its import costs ~8 s on 2 cores), and
with the parent's environment put back afterwards: vLLM's import sets variables (LD_LIBRARY_PATH,
TORCHINDUCTOR_CACHE_DIR, ...) that every worker's environment would otherwise inherit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from autotune.core.errors import BadInput
from autotune.core.serving_flags import DUPLICATES, OWNED, ServingFlags, flag
from autotune.serve.export import serve_argv

# Not flags of the user's server: the model (autotune's --model), the config file (read into flags).
_NOT_FLAGS = ("model_tag", "config")


@contextlib.contextmanager
def _quiet_import() -> Iterator[None]:
    """vLLM imported without its start-up log lines, and the environment left as it was."""
    before = dict(os.environ)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def _cli_args() -> Any:
    """vLLM's serve argument module: vllm.entrypoints.launchers.cli_args (0.32), common.cli_args (0.33)."""
    try:
        import vllm.entrypoints.launchers.cli_args as cli_args
    except ImportError:
        import vllm.entrypoints.common.cli_args as cli_args  # type: ignore[no-redef]
    return cli_args


def _parser() -> Any:
    with _quiet_import():
        make_arg_parser = _cli_args().make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))

    def refuse(message: str) -> None:  # argparse prints usage and exits; one line instead
        raise BadInput(f"serving flags: {message}")

    parser.error = refuse
    return parser


def _json(value: Any) -> Any:
    """A parsed value as JSON (as vLLM's own "non-default args" line shows config objects)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _json(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    dump = getattr(value, "model_dump", None)
    return _json(dump(mode="json")) if dump is not None else str(value)


def _non_default(parser: Any, argv: list[str]) -> tuple[dict[str, Any], Any]:
    try:
        args = parser.parse_args(argv)
        defaults = vars(parser.parse_args(argv[:1]))
    except BadInput:
        raise
    except (ValueError, AssertionError, OSError, yaml.YAMLError) as e:  # vLLM's --config reader
        raise BadInput(f"serving flags: {e}") from None
    values = {k: _json(v) for k, v in vars(args).items() if k not in _NOT_FLAGS and v != defaults.get(k)}
    return values, args


def _check_config(path: Path) -> None:
    """The --serve-config file as vLLM's --config reader wants it, or one line saying what is wrong."""
    if not path.is_file():
        raise BadInput(f"--serve-config {path}: no such file; expected a YAML of `vllm serve` flags")
    if path.suffix not in (".yaml", ".yml"):
        raise BadInput(f"--serve-config {path}: expected a .yaml or .yml file (as `vllm serve --config` reads)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise BadInput(f"--serve-config {path}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(data, dict):
        raise BadInput(f"--serve-config {path}: expected a mapping of `vllm serve` flags (e.g. "
                       f"tensor-parallel-size: 2), got {type(data).__name__}")


def parse(model: str, argv: list[str] | tuple[str, ...] = (), serve_config: Path | None = None) -> ServingFlags:
    """The serving flags in ``argv`` (what follows ``--``) and ``serve_config`` (a YAML of flags, as
    ``vllm serve --config`` reads it; ``argv`` wins where both set a flag), as `vllm serve MODEL` would
    take them. BadInput (one line naming the flag) for a flag vLLM does not know or a value it refuses."""
    if serve_config is not None:
        _check_config(Path(serve_config))
    source = " and ".join(filter(None, [f"--serve-config {serve_config}" if serve_config else "",
                                        "after --" if argv else ""]))
    parser = _parser()
    full = [model, *(["--config", str(serve_config)] if serve_config is not None else []), *argv]
    values, args = _non_default(parser, full)
    args.model = model  # as `vllm serve MODEL` does (ServeSubcommand.cmd): every check sees the user's model
    with _quiet_import():
        from vllm.engine.arg_utils import AsyncEngineArgs
        validate_parsed_serve_args = _cli_args().validate_parsed_serve_args
    try:
        validate_parsed_serve_args(args)
        AsyncEngineArgs.from_cli_args(args)
    except Exception as e:  # noqa: BLE001 - vLLM's own refusal of a value (VLLMValidationError, ValueError, ...)
        said = str(e).splitlines()[0] if str(e) else type(e).__name__
        if type(e).__name__ == "LocalEntryNotFoundError":  # HF_HUB_OFFLINE: vLLM resolves the model from the cache
            said = f"model {model}: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set ({said})"
        raise BadInput(f"serving flags ({source}): {said}") from None
    # The served command renders them (autotune.serve.export.serve_argv): each must come back the same.
    # (A flag autotune sets itself is refused by name: autotune.core.serving_flags.collisions.)
    carried = {k: v for k, v in values.items() if k not in OWNED and k not in DUPLICATES}
    try:
        again, _ = _non_default(parser, serve_argv({"model": model, **carried}))
    except BadInput:
        again = {}
    for name in carried:
        if again.get(name) != values[name]:
            raise BadInput(f"{flag(name)} ({source}): autotune cannot carry this flag into the served command "
                           f"(it reads back as {again.get(name)!r}, not {values[name]!r})")
    engine = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    return ServingFlags(values=values, served_only=tuple(sorted(k for k in values if k not in engine)),
                        source=source)
