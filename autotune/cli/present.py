"""What the CLI shows: the study's live progress, the Pareto and category tables, the search
summary, the workload tables. Presentation only: it reads finished records (a StudyReport, an
inspection summary) and never runs anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from autotune.results.text import claim_line, edge_line, headline, schedule_line, stopped_line

WORKER_LOG_TAIL = 20  # lines of a failed trial's worker.log shown with --verbose


class RichProgress:
    """Draws the study: one bar over trials (with ETA), the running trial's phase in its label.

    ``logs``: the study's results folder, to show a failed trial's worker.log (--verbose).
    """

    def __init__(self, progress: Progress, task: Any, logs: Path | None = None, load: str | None = None) -> None:
        self.p, self.task, self.label, self.logs, self.load = progress, task, "", logs, load

    def trial_started(self, number: int, label: str) -> None:
        self.label = f"trial {number}: {label}"
        self.p.update(self.task, description=f"{self.label} [dim]starting worker")

    def trial_event(self, number: int, event: dict[str, Any]) -> None:
        phase = event.get("phase")
        text = {"engine": "starting engine", "warmup": "warming up", "measure": "measuring",
                "samples": "sampling for the distribution test", "score": "scoring log-probs"}.get(phase)
        if phase == "progress":
            text = f"measuring window {event.get('window', 1)}/{event.get('windows', 1)}: {event['done']}/{event['total']}"
        if text:
            self.p.update(self.task, description=f"{self.label} [dim]{text}")

    def trial_finished(self, number: int, label: str, summary: str) -> None:
        # wrapped at the console's width (at most 100 columns in a log): a trial's line starts "trial N"
        if self.load and summary[:1].isdigit():  # a figure names the load it was measured at
            summary = f"{self.load}: {summary}"
        self.p.console.print(f"trial {number:>3} {label:<40} {summary}", highlight=False, markup=False)
        if self.logs is not None and summary.startswith("failed"):
            from autotune.study.trials import trial_dir
            from autotune.run.worker import WORKER_LOG

            self._show_log(trial_dir(self.logs, number) / WORKER_LOG)
        self.p.advance(self.task)

    def note(self, text: str) -> None:
        self.p.console.print(text, highlight=False, markup=False)

    def _show_log(self, path: Path) -> None:
        try:
            lines = path.read_text(errors="replace").splitlines()[-WORKER_LOG_TAIL:]
        except OSError as e:
            lines = [f"(not readable: {e.strerror})"]
        self.p.console.print(f"  worker log: {path} (last {len(lines)} lines)", highlight=False, markup=False)
        for line in lines:
            self.p.console.print(f"  | {line}", style="dim", highlight=False, markup=False)


def verdict_text(v: dict[str, Any]) -> str:
    """"ok", or why not: the failed check, or the checks that did not run ("unverified")."""
    if v.get("status", "ok" if v["passed"] else "failed") == "ok":
        return "ok"
    return v["reason"]


def _float_or_nan(x: Any, fmt: str) -> str:
    return "-" if x is None or x != x else format(x, fmt)


def _interval(s: dict[str, Any]) -> str:
    lo, hi = s.get("output_tok_s_lo"), s.get("output_tok_s_hi")
    return "" if lo is None or hi is None or lo != lo else f" [{lo:.2f}-{hi:.2f}]"


def _unit(s: dict[str, Any]) -> str:
    """What an interval is over, short, for a table cell: paired instances or one instance's windows."""
    if _interval(s) == "":
        return ""
    return f" ({s['output_tok_s_pairs']} pairs)" if s.get("output_tok_s_pairs") else " (windows)"


def pareto_caption(report: dict[str, Any], noisy: bool) -> str:
    """What the Pareto table's speedups are over, their intervals' units, and what "(noisy)" asks of the user."""
    from autotune.measure.metrics import NOISY_SHARE

    base = report.get("baseline") or {}
    pooled = f", pooled over {base['engines']} engines" if (base.get("engines") or 1) > 1 else ""
    text = (f"speedup: over trial {base.get('trial')}, the baseline's record{pooled}; 95% interval over (N pairs) of "
            "fresh instances measured side by side in the selection rounds, the selecting trial left out, or over "
            "(windows) of one instance, far narrower than instances differ; the pick's figure is the best: line's")
    if noisy:
        text += (f". (noisy): the trial's windows spread more than {NOISY_SHARE:.0%} of their median even after "
                 "--max-repeats windows: its windows interval is loose; raise --max-repeats, and quote best:'s "
                 "figure (fresh engines), never a noisy row's")
    return text


def pareto_table(report: dict[str, Any]) -> Table:
    """The Pareto front with each config's speedup over the baseline's record (named), pooled records
    marked (and the pick, where lossless first chose it over a faster lossy config on the front)."""
    rows = ([report["baseline"]] if report.get("baseline") else []) + \
        [e for e in report["pareto"] if not report.get("baseline") or e["trial"] != report["baseline"]["trial"]]
    best = (report.get("best") or {}).get("trial")
    if best is not None and best not in {e["trial"] for e in rows}:  # lossless first: the pick may be off the front
        rows.append(report["best"])
    noisy = any(e["measurement"].get("noisy") for e in rows)
    t = Table(title=f"Pareto front: {', '.join(report['objectives'])} ({report.get('load')})",
              caption=pareto_caption(report, noisy))
    over = f"speedup over #{report['baseline']['trial']}" if report.get("baseline") else "speedup"
    for col in ("trial", "config", "tok/s", over, "e2e p50 ms", "tpot p50 ms", "accept", "verdict"):
        # fold, not "draft_…": a narrow terminal breaks a long config or number, never cuts it short.
        t.add_column(col, justify="right" if col not in ("config", "verdict") else "left", overflow="fold")
    for e in rows:
        m, s = e["measurement"], e["speedup"] or {}
        pooled = f" (pooled: {e['engines']} engines)" if (e.get("engines") or 1) > 1 else ""
        name = e["label"] + (" (baseline)" if e is report.get("baseline") else "") + \
            (" *best*" if e["trial"] == best else "") + pooled
        tps = _float_or_nan(m["output_tok_s"], ".1f") + (f" ±{m['output_tok_s_mad']:.1f}" if "output_tok_s_mad" in m else "")
        t.add_row(str(e["trial"]), name + (" [yellow](noisy)[/yellow]" if m.get("noisy") else ""), tps,
                  _float_or_nan(s.get("output_tok_s"), ".2f") + "x" + ("" if e is report.get("baseline") else
                                                                       _interval(s) + _unit(s)),
                  _float_or_nan(m["e2e_ms_p50"], ".0f"),
                  _float_or_nan(m["tpot_ms_p50"], ".1f"), _float_or_nan(m.get("acceptance_rate"), ".2f"),
                  verdict_text(e["verdict"]))
    return t


def category_table(entry: dict[str, Any]) -> Table:
    """A report entry's speedup over the baseline by request category, biggest gain first."""
    from autotune.results.text import category_table as rows

    t = Table(title=f"By category: trial {entry['trial']} {entry['label']} against the baseline")
    for col in ("category", "requests", "tok/s", "speedup", "tpot p50 ms", "tpot speedup", "accepted len", "accept"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for r in rows(entry):
        t.add_row(r["category"], str(r["requests"]), _float_or_nan(r["output_tok_s"], ".1f"),
                  _float_or_nan(r["speedup"], ".2f") + "x", _float_or_nan(r["tpot_ms_p50"], ".1f"),
                  _float_or_nan(r["tpot_speedup"], ".2f") + "x", _float_or_nan(r["mean_accepted_length"], ".2f"),
                  _float_or_nan(r["acceptance_rate"], ".2f"))
    return t


def print_summary(say: Console, report: dict[str, Any], out: Path, *, confirming: bool = False) -> None:
    """The short summary a run ends with (autotune.results.summary): at most 12 lines, none wider than
    the terminal or 100 columns, each figure once, the one to quote on its ``quote:`` line."""
    from autotune.results.summary import summary

    width = say.width if say.width else 100
    say.print(f"{'── ' + report.get('study', 'study') + ' ':─<{min(width, 100)}}", highlight=False, markup=False)
    for line in summary(report, out, width=width, confirming=confirming, max_lines=11):  # 12 with the rule above
        say.print(line, highlight=False, markup=False, soft_wrap=True)


class ConfirmBar:
    """Confirm as progress, not a log: one bar over confirm's time (or its --rounds), its label the
    round and the served figure so far with its resolution against the target (gate.served_rounds.standing)."""

    def __init__(self, progress: Progress) -> None:
        self.p = progress
        self.task = progress.add_task("confirm: starting the first server", total=1.0)

    def __call__(self, st: dict[str, Any]) -> None:
        figure = "served: -" if st["speedup"] is None else f"served {st['speedup']:.2f}x"
        if st["lo"] is not None:
            figure += f" [{st['lo']:.2f}-{st['hi']:.2f}] +-{st['resolution']:.0%} (target +-{st['target']:.0%})"
        if st["rounds"]:
            done = st["pairs"] / st["rounds"]
        else:
            done = max(st["elapsed_s"] / st["max_s"] if st["max_s"] else 0.0, st["pairs"] / st["max_rounds"])
        self.p.update(self.task, completed=min(done, 1.0),
                      description=f"confirm round {st['round']} ({st['side']} done): {figure}")


@contextmanager
def confirm_progress(say: Console) -> Iterator[tuple[Any, Any]]:
    """(lines, on_round) for autotune.gate.confirm.confirm: with --verbose every round's lines and no
    bar; else a bar (ConfirmBar), and of the lines only the one that says why confirm stopped."""
    from autotune.cli.edge import verbose

    def line(text: str) -> None:
        say.print(text, highlight=False, markup=False)

    if verbose():
        yield line, None
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20), TimeElapsedColumn())
    with Progress(*columns, console=say, transient=True) as progress:
        bar = ConfirmBar(progress)
        yield (lambda text: line(text) if text.startswith("confirm: stopped") else None), bar


def explain(say: Console, report: dict[str, Any], out: Path) -> None:
    """`--explain`: every figure with its basis, as before the summary (the front, the claim, the
    resolution, the edges, the schedule, the pick by category); docs/reading-the-output.md reads each."""
    say.print(pareto_table(report))
    if stopped := stopped_line(report):
        say.print(stopped, highlight=False, markup=False)
    if (report.get("best") or {}).get("speedup_by_category"):
        say.print(category_table(report["best"]))
    if report.get("best"):
        b = report["best"]
        say.print(headline(report), highlight=False, markup=False)
        if claim := claim_line(report):
            say.print(claim, highlight=False, markup=False)
        if report.get("lossless_first"):
            say.print(f"lossless first: {report['lossless_first']['reason']}", highlight=False)
        for e in report.get("edge") or []:
            say.print(edge_line(e, b["label"]), highlight=False)
        if report.get("resolution"):
            from autotune.measure.resolution import Resolution

            say.print(Resolution(**report["resolution"]).line(), highlight=False)
        if report.get("schedule"):
            say.print(schedule_line(report["schedule"]), highlight=False)
        if (report.get("started") or {}).get("mixed"):
            say.print(f"engines: {report['started']['mixed']}", highlight=False)
        say.print(f"serve it: {out / 'serve.sh'}", highlight=False)
    say.print(f"results: {out}/ (trials.csv, trials.parquet, pareto.csv, best.json, serve.sh, report.md); "
              f"plots: autotune report {out}", highlight=False)


def _num_text(x: float) -> str:
    """A count as an integer (3010, never 3.01e+03); a share or a fraction of a count with 3 digits."""
    if float(x).is_integer() or abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}"


def _dist_text(d: dict[str, float]) -> str:
    return "  ".join(f"{k} {_num_text(d[k])}" for k in ("p50", "p90", "min", "max"))


def inspect_table(info: dict[str, Any]) -> Table:
    t = Table(title=f"{info['file']}: {info['requests']} requests", show_header=False)
    if info["prompt_tokens"] is not None:
        by = ("the demo model's tokenizer; give --model for yours" if info.get("tokenizer_source") == "demo"
              else f"{info['tokenizer']}'s tokenizer")
        t.add_row("prompt tokens", _dist_text(info["prompt_tokens"]) + f"  (counted with {escape(by)})")
    for key in ("prompt_words", "prompt_chars", "max_tokens", "prompt_repetition"):
        t.add_row(key.replace("_", " "), _dist_text(info[key]))
    t.add_row("sampling", f"{info['greedy']} greedy, {info['sampled']} sampled ({info['seeded']} seeded)")
    t.add_row("chat requests", f"{info['chat_requests']} ({info['multi_turn_requests']} multi-turn)")
    t.add_row("with expectations", str(info["with_expectations"]))
    if info.get("structured_outputs") or info.get("n_over_1") or info.get("with_tools"):
        t.add_row("replayed as logged", f"{info['structured_outputs']} with structured outputs, {info['n_over_1']} "
                  f"with n > 1, {info['with_tools']} with tools; sent to "
                  + ("/v1/chat/completions" if info.get("endpoint") == "chat" else "/v1/completions"))
    a = info["arrivals"]
    t.add_row("arrivals", "none (replayed closed-loop)" if a is None else
              f"{a['timed']} timed over {a['span_s']:.1f} s")
    t.add_row("ngram lookup", f"{info['ngram_hint']} ({info['edit_like_requests']} edit-like requests)")
    if info.get("load"):
        t.add_row("load to tune at", f"{escape(info['load']['search'])} ({escape(info['load']['why'])})")
    if info["too_long"] is not None:
        bad = info["too_long"]
        t.add_row("over the context", f"none (context {info['context']} tokens)" if not bad else
                  f"[red]{len(bad)}[/red] over {info['context']} tokens, e.g. {bad[0]['id']!r} "
                  f"({bad[0]['prompt_tokens']} prompt + {bad[0]['max_tokens']} max_tokens)")
    return t


def categories_table(info: dict[str, Any]) -> Table:
    unit = "tokens" if info["prompt_tokens"] is not None else "words"
    t = Table(title="By category")
    for col in ("category", "requests", "turns", f"prompt {unit} p50", f"prompt {unit} max", "max_tokens p50"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for name, c in info["categories"].items():
        d = c["prompt_tokens"] if unit == "tokens" else c["prompt_words"]
        t.add_row(name, str(c["requests"]), str(c["turns"]), f"{d['p50']:.0f}", f"{d['max']:.0f}",
                  f"{c['max_tokens']['p50']:.0f}")
    return t


def prediction_table(rows: list[dict[str, Any]], title: str) -> Table:
    """`autotune predict`: forecast beside measured, best forecast first."""
    t = Table(title=title)
    for col, just in (("config", "left"), ("predicted", "right"), ("tokens/step", "right"), ("step cost", "right"),
                      ("measured", "right"), ("basis", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        pred = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x [{r['lo']:.2f}-{r['hi']:.2f}]"
        tps = "-" if r["tokens_per_step"] is None else f"{r['tokens_per_step']:.2f}"
        cost = "-" if r["step_cost"] is None else f"{r['step_cost']:.2f}"
        if r["failed"]:
            meas = "[red]failed[/red]"
        elif r["measured"] is None:
            meas = ""
        else:
            meas = f"{r['measured']:.2f}x [{r['measured_lo']:.2f}-{r['measured_hi']:.2f}]" + \
                ("" if r["correct"] else " [red]incorrect[/red]")
        t.add_row(escape(r["label"]), pred, tps, cost, meas, escape(r["basis"]))
    return t
