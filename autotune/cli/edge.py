"""The edge every command shares: the Typer app, its consoles, flag parsing into one-line errors, and
the one place where errors become exit codes."""

from __future__ import annotations

import errno
import os
import traceback
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from autotune import __version__
from autotune.core import errors
from autotune.core.errors import AutotuneError, BadInput
from autotune.core.formats import FORMATS

console = Console()
err = Console(stderr=True)
_verbose = False  # --verbose, set by the app's callback; read through verbose()
# Piped, or in a CI log, Rich would take 80 columns; there lines wrap at 100, at a word, so that a log
# reads as a terminal does (issue 60: a log's lines ran to 436 characters). COLUMNS, where set, wins.
PIPE_WIDTH = 100

WorkloadFormat = Enum("WorkloadFormat", {f.replace("-", "_"): f for f in FORMATS}, type=str)  # type: ignore[misc]
WorkloadFormat.__doc__ = "The workload file formats autotune reads (autotune.core.formats)."


class Turns(str, Enum):
    first = "first"
    all = "all"


class Strategy(str, Enum):
    predict = "predict"
    grid = "grid"
    tpe = "tpe"
    random = "random"


class ExportFormat(str, Enum):
    command = "command"
    yaml = "yaml"
    json = "json"


def _choice(kind: type[Enum], value: str, flag: str) -> Any:
    """``value`` as a member of ``kind``, or one line naming the flag and the choices (exit 2).
    (Typer's own Enum parsing would print a multi-line usage box instead.)"""
    try:
        return kind(value)
    except ValueError:
        raise BadInput(f"{flag}: expected one of {', '.join(m.value for m in kind)}, got {value!r}") from None


class Instrument(str, Enum):
    served = "served"
    inprocess = "inprocess"


def _instrument(value: str) -> str:
    return _choice(Instrument, value, "--instrument").value


def _workload_format(value: str) -> str:
    return _choice(WorkloadFormat, value, "--format").value


def _turns(value: str | None) -> str | None:
    return None if value is None else _choice(Turns, value, "--turns").value


def _signals() -> tuple[type[BaseException], ...]:
    # Typer's own exits and usage errors; before Typer 0.24 its usage errors were click's.
    base = getattr(typer, "TyperException", None)
    if base is None:
        from click import ClickException as base
    return typer.Exit, typer.Abort, base


class _Edge(TyperGroup):
    """Every command's errors become exit codes here, the one edge: an AutotuneError is its one
    line (exit 2 for bad input), anything else an internal error (exit 3, apart from a regression's
    or a failed study's 1); --verbose adds the traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except AutotuneError as e:
            _fail(e)
        except Exception as e:
            if isinstance(e, _signals()) or getattr(e, "errno", None) == errno.EPIPE:
                raise
            _internal(e)


# Listed in `autotune --help`, from the one table (autotune.core.errors.EXIT_CODES).
EXIT_CODES_HELP = "Exit codes:\n" + "\n".join(f"{code} {what}" for code, what in errors.EXIT_CODES.items())

app = typer.Typer(cls=_Edge, add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Find the fastest [b]correct[/b] vLLM configuration for your own workload.",
                  epilog=EXIT_CODES_HELP)


def _version(value: bool) -> None:
    if value:
        console.print(f"autotune {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False,
          verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show tracebacks and worker logs.")] = False
          ) -> None:
    global _verbose
    _verbose = verbose
    for c in (console, err):
        _fit(c)


def _fit(c: Console) -> None:
    """A terminal's own width; elsewhere (a pipe, a file, a CI log) 100 columns."""
    columns = os.environ.get("COLUMNS", "")
    c.width = int(columns) if columns.isdigit() else (None if c.is_terminal else PIPE_WIDTH)  # type: ignore[assignment]


def _fail(e: AutotuneError) -> None:
    if _verbose:  # called in the except block: the traceback is the one being handled
        traceback.print_exc(file=err.file)
    err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
    raise typer.Exit(e.exit_code) from None


def _internal(e: Exception) -> None:
    """An exception no module meant for the user: a bug. One line (where it was raised), or with
    --verbose the whole traceback."""
    if _verbose:
        traceback.print_exc(file=err.file)
        hint = ""
    else:
        last = traceback.extract_tb(e.__traceback__)[-1]
        hint = f" (at {Path(last.filename).name}:{last.lineno} in {last.name}; --verbose shows the traceback)"
    err.print(f"[red]error:[/red] internal error: {escape(f'{type(e).__name__}: {e}{hint}')}", highlight=False,
              soft_wrap=True)
    raise typer.Exit(errors.INTERNAL) from None


_TURNS_HELP = ("Multi-turn requests: 'first' sends the first turn only, 'all' replays every turn as a "
               "conversation, each after the model's own answer. Default: first for question files, all for "
               "native 'turns'.")




def _newest_results(root: Path = Path("results")) -> Path:
    found = sorted(root.glob("*/best.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise BadInput(f"{root}: no results found (expected {root}/<study>/best.json; run `autotune search` first)")
    return found[-1].parent


def _chosen(results: Path | None, what: str) -> dict[str, Any]:
    """The chosen config's report entry of a results folder (default: the newest under ./results)."""
    return _chosen_report(results, what)["best"]


def _chosen_report(results: Path | None, what: str) -> Any:
    """The StudyReport of a results folder that has a chosen config (default: the newest under ./results)."""
    from autotune.core.study_report import load_report

    results = results or _newest_results()
    report = load_report(results)
    if not report.get("best"):
        raise BadInput(f"{results}: the study found no feasible configuration to {what}")
    return report




def verbose() -> bool:
    return _verbose
