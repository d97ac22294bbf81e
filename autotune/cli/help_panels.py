"""`search --help` in panels: which panel each option sits in, which options the default page shows,
and `--help-all` for the rest.

The table lives here, apart from the option declarations in search_command, so that an option added
there needs one line here (tests/test_help_panels.py fails on an option with no panel). Typer's own
`rich_help_panel` and `hidden` carry the result; this module only fills them in.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand

WORKLOAD = "Workload"
MODEL = "Model and serving"
SEARCH = "Search"
MEASUREMENT = "Measurement"
CORRECTNESS = "Correctness"
OUTPUT = "Output and storage"
HELP = "Help"
PANELS = (WORKLOAD, MODEL, SEARCH, MEASUREMENT, CORRECTNESS, OUTPUT, HELP)

# Each search option's panel, by parameter name. DAY_ONE are shown by the default --help (at most 24,
# --help and --help-all among them); the others are expert or benchmark knobs, listed by --help-all.
SEARCH_PANELS: dict[str, str] = {
    "format": WORKLOAD, "concurrency": WORKLOAD, "levels": WORKLOAD, "load": WORKLOAD,
    "turns": WORKLOAD, "output_len": WORKLOAD, "drop_too_long": WORKLOAD,
    "model": MODEL, "draft_model": MODEL, "eagle3_head": MODEL, "eagle_head": MODEL, "trust_remote_code": MODEL,
    "max_model_len": MODEL, "dtype": MODEL, "gpu_memory_utilization": MODEL, "serve_config": MODEL,
    "config": SEARCH, "space": SEARCH, "candidates": SEARCH, "trials": SEARCH, "strategy": SEARCH, "try_": SEARCH,
    "resume": SEARCH, "warm_start": SEARCH, "workers": SEARCH, "seed": SEARCH, "time_budget": SEARCH,
    # The switches that are on by default, together: their --no- forms take a column of their own, which
    # leaves room at 80 columns beside short names only (Model's --gpu-memory-utilization is long, and
    # Measurement's help cites benchmarks/data/served_gap*.json, a 32-character word).
    "remeasure": SEARCH, "past_edge": SEARCH, "prune": SEARCH, "schedule": SEARCH, "launcher": SEARCH,
    "objectives": MEASUREMENT, "slo": MEASUREMENT, "instrument": MEASUREMENT, "repeats": MEASUREMENT,
    "max_repeats": MEASUREMENT, "warmup": MEASUREMENT, "trial_timeout": MEASUREMENT, "pairs": MEASUREMENT,
    "max_drift": CORRECTNESS, "lossless_tolerance": CORRECTNESS, "max_logprob_drift": CORRECTNESS,
    "lossy_min_gain": CORRECTNESS, "allow_unverified": CORRECTNESS, "samples": CORRECTNESS,
    "sample_tokens": CORRECTNESS,
    "results": OUTPUT, "confirm": OUTPUT, "json_": OUTPUT, "explain_": OUTPUT, "study": OUTPUT, "storage": OUTPUT,
    "help_all_": HELP,
}
# The default page (issue 60): every flag the README's, the demo's and docs' commands use (the study,
# its results and storage, --resume, --warm-start, --try, --slo, --workers, the load --levels, the
# budget in candidates and minutes, --confirm), the model flags a GPU user needs before the first
# engine starts (dtype, context, memory share, remote code; issue 52) and --explain, which the summary
# names. On --help-all: the workload's --format (read by default), --concurrency (one level is
# --levels N), --config, --strategy, the correctness
# bounds (the checks run with their defaults) and the measurement knobs. help_all_ and Click's help
# make 24 (tests/test_search_help.py).
DAY_ONE = frozenset({"explain_", "levels", "model", "draft_model", "eagle3_head", "trust_remote_code",
                     "max_model_len", "dtype", "gpu_memory_utilization", "space", "candidates", "try_", "resume",
                     "warm_start", "workers", "time_budget", "objectives", "slo", "results", "confirm", "study",
                     "storage", "help_all_"})


class PanelledCommand(TyperCommand):
    """A command whose options sit in the panels of SEARCH_PANELS, in PANELS' order; flags show no
    `<bool>` type, and those off by default no --no- form; options outside DAY_ONE are hidden from
    --help (shown by --help-all)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            _place(p)
        order = {name: i for i, name in enumerate(PANELS)}
        self.params.sort(key=lambda p: order.get(getattr(p, "rich_help_panel", None) or "", -1))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        # A flag off by default shows its name alone: its --no- form (which turns off what a --config file
        # turned on, and still parses) would take a column that leaves no room for names at 80 columns.
        off = [(p, p.secondary_opts) for p in self.params if _off_by_default(p) and p.secondary_opts]
        for p, _ in off:
            p.secondary_opts = []
        try:
            super().format_help(ctx, formatter)
        finally:
            for p, opts in off:
                p.secondary_opts = opts

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.rich_help_panel, option.metavar = HELP, ""
        return option


def _place(p: Any) -> None:
    if p.name in SEARCH_PANELS:
        p.rich_help_panel = SEARCH_PANELS[p.name]
        p.hidden = p.name not in DAY_ONE
    if getattr(p, "is_flag", False):
        p.metavar = ""  # a flag takes no value: Typer would print <bool>
        if _off_by_default(p):
            p.show_default = False  # "[default: no-json]" says only that a flag is off unless given


def _off_by_default(p: Any) -> bool:
    return bool(getattr(p, "is_flag", False)) and p.default is False


def help_all(ctx: typer.Context, value: bool) -> None:
    """--help-all: the help page with the hidden options shown too, then exit."""
    if not value or ctx.resilient_parsing:
        return
    hidden = [p for p in ctx.command.params if getattr(p, "hidden", False)]
    for p in hidden:
        p.hidden = False
    try:
        typer.echo(ctx.get_help(), color=ctx.color)
    finally:
        for p in hidden:  # the command object outlives this call in tests
            p.hidden = True
    ctx.exit()


def choices(kind: Any) -> str:
    """The metavar of an option parsed into the Enum ``kind`` by autotune.cli.edge._choice: its choices."""
    return "|".join(m.value for m in kind)
