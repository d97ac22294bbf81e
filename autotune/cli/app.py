"""The command line: search, export, serve, confirm, predict, check, watch, report, workload.

Commands parse flags and print; the work is in the floors below. The app and its error edge live
in autotune.cli.edge; each module here registers its commands on it when imported.
"""

from __future__ import annotations

# Importing a command module registers its commands on the app, in this order in --help.
from autotune.cli import search_command  # noqa: F401
from autotune.cli import commands  # noqa: F401  (isort: skip)
from autotune.cli import workload_commands  # noqa: F401
from autotune.cli.edge import app

__all__ = ["app", "main"]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
