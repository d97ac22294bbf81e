"""The command line: search, export, serve, confirm, predict, check, watch, report, workload.

Commands parse flags and print; the work is in the floors below. The app and its error edge live
in autotune.cli.edge; each module here registers its commands on it when imported.
"""

from __future__ import annotations

import signal

# Importing a command module registers its commands on the app, in this order in --help.
from autotune.cli import search_command  # noqa: F401
from autotune.cli import commands  # noqa: F401  (isort: skip)
from autotune.cli import workload_commands  # noqa: F401
from autotune.cli.edge import app

__all__ = ["app", "main"]


def main() -> None:
    # SIGTERM (a CI job cancelled, `kill`, a container stopped) ends a command as Ctrl-C does:
    # each command's KeyboardInterrupt path ends the engines and servers it started (they run in
    # sessions of their own, which a signal to this process alone never reaches) and records
    # the running trial as interrupted, so `--resume` continues.
    signal.signal(signal.SIGTERM, _as_ctrl_c)
    app()


def _as_ctrl_c(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
