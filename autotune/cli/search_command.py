"""`autotune search`: its forty options, parsed into SearchOptions for autotune.cli.search."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from autotune.cli import edge
from autotune.cli.config_file import load_config
from autotune.cli.edge import (_TURNS_HELP, Strategy, Turns, _choice, _instrument, _turns,
                               _workload_format, app, console, err)
from autotune.cli.help_panels import PanelledCommand, choices, help_all
from autotune.core import errors
from autotune.core.formats import FORMATS
from autotune.measure.config import HOLDOUT_PAIRS, LOSSY_MIN_GAIN
from autotune.cli.present import explain, print_summary
from autotune.run.launcher import held as launcher_held


# What benchmarks/data/served_gap*.json measured (tests/test_verdict_texts.py checks the figures against
# the files): the in-process claim over the served figure, run by run; it changes sign, so no bias
# of the in-process instrument can be told apart from instance noise (docs/findings.md).
INSTRUMENT_HELP = ("How each trial is measured: served (the candidate's exported `vllm serve` command, driven "
                   "over HTTP: the number users get) or inprocess (vLLM's AsyncLLM in the worker: no HTTP "
                   "serving per request; its claim over the served figure was 1.07, 1.15 and 0.90 in three "
                   "runs, benchmarks/data/served_gap*.json: no bias told apart from the spread between "
                   "instances).")


@app.command(cls=PanelledCommand, epilog="Examples:\n\n  autotune search examples/json_edit.jsonl\n\n"
             "  autotune search traffic.jsonl --model meta-llama/Llama-3.1-8B-Instruct --candidates 30\n\n"
             "  autotune search traffic.jsonl --model M -- --tensor-parallel-size 2 --enable-prefix-caching")
def search(
    workload: Annotated[Path, typer.Argument(metavar="WORKLOAD", help="Workload JSONL (native form; see README).")],
    config: Annotated[Optional[Path], typer.Option(
        metavar="FILE", is_eager=True, callback=load_config,
        help="YAML of these options (candidates: 8, space: quick); flags given here win (--no-confirm "
             "too).")] = None,
    help_all_: Annotated[bool, typer.Option("--help-all", is_eager=True, callback=help_all, expose_value=False,
                                            help="Show every option, the expert ones too, and exit.")] = False,
    model: Annotated[Optional[str], typer.Option(
        metavar="MODEL", help="Target model (path or HF id). Default: the bundled demo pair.",
        envvar="AUTOTUNE_MODEL")] = None,
    draft_model: Annotated[Optional[str], typer.Option(metavar="MODEL", help="Draft model for method draft_model.",
                                                       envvar="AUTOTUNE_DRAFT_MODEL")] = None,
    eagle_head: Annotated[Optional[str], typer.Option(metavar="HEAD", help="EAGLE draft head (GPU).")] = None,
    eagle3_head: Annotated[Optional[str], typer.Option(
        metavar="HEAD", help="EAGLE-3 head for --model (the demo pair brings one; CPU or GPU): forecast from its "
                             "trace, then measured.")] = None,
    space: Annotated[Optional[str], typer.Option(
        metavar="NAME|FILE", help="Search space: bundled name (cpu, gpu, quick) or YAML file. Default: the "
                                  "platform's.", envvar="AUTOTUNE_SPACE")] = None,
    format: Annotated[str, typer.Option("--format", metavar="FORMAT", help=f"Workload format: {', '.join(FORMATS)} "
                                                                           "(questions: Spec-Bench, MT-Bench).")] = "auto",
    output_len: Annotated[Optional[int], typer.Option(metavar="N", min=1, help="max_tokens for requests that set none "
                                                      "(vllm-bench files carry prompts only).")] = None,
    turns: Annotated[Optional[str], typer.Option(metavar=choices(Turns), help=_TURNS_HELP)] = None,
    drop_too_long: Annotated[bool, typer.Option(help="Leave out requests whose prompt + max_tokens exceed the "
                                                     "model's context (default: refuse them, exit 2).")] = False,
    candidates: Annotated[Optional[int], typer.Option(metavar="N", min=1, help="Candidates to measure (default 8); "
                                                      "the plan line says what runs on top.")] = None,
    trials: Annotated[Optional[int], typer.Option(metavar="N", min=1, hidden=True,
                                                  help="The old name of --candidates.")] = None,
    # NAME, its choices in the help: a|b|c metavars as long as these widen the page past 80 columns
    strategy: Annotated[str, typer.Option(metavar="NAME", help="How candidates are chosen: predict (forecast each "
                                          "from the baseline's tokens, measure what can win), grid (in order), tpe "
                                          "or random (Optuna's samplers).")] = "predict",
    instrument: Annotated[str, typer.Option(metavar="NAME", help=INSTRUMENT_HELP)] = "served",
    remeasure: Annotated[bool, typer.Option("--remeasure/--no-remeasure", help="After the candidates, measure "
                                            "on fresh engines: the leader and a runner-up within 10% side by side "
                                            "(selection rounds, which may change the choice), then the pick and the "
                                            "baseline in holdout rounds after the choice is final, which its figure "
                                            "comes from. Off: no figure, the measured ratio only.")] = True,
    pairs: Annotated[int, typer.Option(metavar="N", min=2, help="Holdout rounds: the pick and the baseline side by "
                                       "side on fresh engines in ABBA order after the choice is final; the pick's "
                                       "figure is a t-interval over these pairs alone (an even number balances the "
                                       "order). With --confirm the served rounds are the holdout "
                                       "instead.")] = HOLDOUT_PAIRS,
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
    launcher: Annotated[bool, typer.Option("--launcher/--no-launcher", help="Fork each trial's worker and "
                                           "its vllm serve from one process that has imported vLLM, instead "
                                           "of starting each fresh (same processes and arguments; a start of "
                                           "seconds instead of tens); with --confirm, its servers and clients "
                                           "too.")] = True,
    study: Annotated[Optional[str], typer.Option(metavar="NAME",
                                                 help="Study name. Default: the workload's file name.")] = None,
    storage: Annotated[Optional[str], typer.Option(
        metavar="URL", help="Optuna storage URL. Default: sqlite in the results folder.",
        envvar="AUTOTUNE_STORAGE")] = None,
    results: Annotated[Path, typer.Option(metavar="DIR", help="Results root; files go to RESULTS/STUDY/.",
                                          envvar="AUTOTUNE_RESULTS")] = Path("results"),
    objectives: Annotated[str, typer.Option(metavar="LIST", help="Comma-separated objectives, primary first; "
                                            "METRIC@LEVEL scores a metric at another load level, measured on the "
                                            "same engine (e.g. output_tok_s@1,output_tok_s@16).")
                          ] = "output_tok_s,e2e_ms_p50",
    concurrency: Annotated[Optional[int], typer.Option(metavar="N", min=1, help="Requests in flight (closed loop); "
                                                       "shorthand for --load concurrency=N. Default (no --load, "
                                                       "--levels or --concurrency): replay the workload's "
                                                       "arrival_s where every request has one, else 1, said "
                                                       "in one line.")] = None,
    load: Annotated[Optional[str], typer.Option(metavar="PATTERN", help="Load pattern: concurrency=N, batch, "
                                                "poisson=RATE (req/s), replay (the workload's arrival_s) or ramp=N "
                                                "(in flight rising from 1 to N and back).")] = None,
    levels: Annotated[Optional[str], typer.Option(metavar="LIST", help="Requests in flight the service will see, "
                                                  "e.g. 8 or 1,8: every trial measured at each level; with two or "
                                                  "more, the pick's method gets a depth per batch size where it "
                                                  "holds at every level.")] = None,
    repeats: Annotated[int, typer.Option(metavar="N", min=1,
                                         help="Measured windows per trial (median and MAD reported).")] = 2,
    max_repeats: Annotated[int, typer.Option(metavar="N", min=0, help="Re-measure a candidate whose throughput "
                                             "spread (MAD) is over 3%, up to this many windows in all (0: "
                                             "never).")] = 4,
    slo: Annotated[Optional[str], typer.Option(metavar="LIST", help="SLOs as constraints, e.g. "
                                               "'ttft_ms_p95<=500,e2e_ms_p50<=2000'; a config that misses one is "
                                               "never on the Pareto front (a TPOT or ITL bound only where the stream "
                                               "timed tokens).")] = None,
    warmup: Annotated[int, typer.Option(metavar="N", min=0, help="Unmeasured warm-up requests per engine.")] = 2,
    trial_timeout: Annotated[Optional[float], typer.Option(
        metavar="SEC", min=1, help="Seconds before a trial is ended and failed. Default: 600, and for trials after "
                                   "the baseline at least 3x the baseline's own wall time (an engine start at GPU "
                                   "scale takes minutes).")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(metavar="N",
                                                         help="Context length, vLLM's --max-model-len.")] = None,
    dtype: Annotated[Optional[str], typer.Option(metavar="DTYPE", help="Model dtype, passed to vLLM (default: vLLM's "
                                                 "auto; float32 for the demo pair).")] = None,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(
        metavar="SHARE", help="vLLM's share of GPU memory (on CPU: of host RAM for the KV cache; default there: the "
                              "KV cache sized to the study's requests in flight).")] = None,
    max_drift: Annotated[float, typer.Option(metavar="SHARE", min=0, max=1, help="Allowed token disagreement for "
                                             "lossy configs (used where log-probs are not measured).")] = 0.10,
    lossless_tolerance: Annotated[float, typer.Option(
        metavar="SHARE", min=0, max=1, help="Allowed disagreement for speculation-only configs.")] = 0.02,
    max_logprob_drift: Annotated[float, typer.Option(
        metavar="NATS", min=0, help="Allowed mean |log-prob change| (nats/token) of the baseline's greedy tokens "
                                    "for lossy configs; where log-probs are measured it replaces "
                                    "--max-drift.")] = 0.05,
    lossy_min_gain: Annotated[float, typer.Option(
        metavar="SHARE", min=0, help="Lossless first: a lossy pick (KV dtype, dtype, quantization) must beat the "
                                     "best lossless config by more than this share, its 95% interval above it; "
                                     "else the lossless config is the pick.")] = LOSSY_MIN_GAIN,
    allow_unverified: Annotated[bool, typer.Option(help="Let a candidate whose applicable checks did not run "
                                                       "(\"unverified\") be the pick.")] = False,
    samples: Annotated[int, typer.Option(metavar="N", min=0, help="Draws per sampled request for the distribution "
                                         "test against the baseline (0: skip the test).")] = 64,
    sample_tokens: Annotated[int, typer.Option(metavar="N", min=1, help="Tokens per draw: the test compares the "
                                               "first token, the first three jointly and the later tokens and "
                                               "token pairs, so a fault that starts late is seen.")] = 24,
    seed: Annotated[int, typer.Option(metavar="N", help="Sampler and engine seed.")] = 0,
    resume: Annotated[bool, typer.Option(help="Continue an existing study of the same name.")] = False,
    warm_start: Annotated[Optional[Path], typer.Option(
        metavar="PATH", help="Old results (folder or best.json): re-measure its pick and Pareto set first.",
        envvar="AUTOTUNE_WARM_START")] = None,
    try_: Annotated[Optional[list[str]], typer.Option(
        "--try", metavar="JSON", help="A config to measure first, as JSON of space parameters, e.g. "
                      "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'; knobs left out take the "
                      "space's baseline values and vLLM's verification defaults. Repeatable.")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow model repos to run their own code.")] = False,
    workers: Annotated[int, typer.Option(metavar="N", min=1, envvar="AUTOTUNE_WORKERS",
                                         help="Trials run in parallel, each on its own share of this host's "
                                              "devices (GPUs, or CPU cores). More hosts: the same --study and "
                                              "--storage on each (--resume to join).")] = 1,
    confirm: Annotated[bool, typer.Option("--confirm/--no-confirm", help="Then serve the pick and the baseline "
                                          "as exported, in rounds until 10% resolution (autotune confirm): "
                                          "the served speedup is the pick's figure.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the results (best.json) as JSON on stdout; "
                                                       "progress goes to stderr.")] = False,
    explain_: Annotated[bool, typer.Option("--explain", help="After the summary, every figure with its basis: "
                                                             "the Pareto front, the claim, the resolution, the "
                                                             "edges, the schedule (report.md has them too).")] = False,
    serve_config: Annotated[Optional[Path], typer.Option(
        metavar="FILE", help="Your `vllm serve` flags as YAML (as `vllm serve --config` reads it); "
                             "flags after -- win.")] = None,
    time_budget: Annotated[Optional[float], typer.Option(
        metavar="MIN", min=0.1, help="Minutes for the study: no new candidate once the time left cannot hold one "
                                     "more and the pick's re-measurement (at the median trial's cost); what is "
                                     "left out is said.")] = None,
    serve_flags: Annotated[Optional[list[str]], typer.Argument(metavar="-- VLLM_SERVE_FLAGS...",
        help="Your `vllm serve` flags, e.g. -- -tp 2 --enable-prefix-caching: read by vLLM's parser, in "
             "every trial, confirm and serve.sh; a searched knob they set leaves the space.",
        show_default=False)] = None,
) -> None:
    """Search for the fastest correct vLLM config for WORKLOAD and write results/<study>/."""
    from autotune.cli.search import SearchOptions, run_search

    if trials is not None:  # the old name keeps working, said once
        err.print("[yellow]note:[/yellow] --trials is now --candidates (it counts candidates; the plan line says "
                  "the engine runs in all)", highlight=False)
        candidates = candidates or trials
    opts = SearchOptions(workload=workload, model=model, draft_model=draft_model, eagle_head=eagle_head,
                         eagle3_head=eagle3_head, space=space, format=_workload_format(format), output_len=output_len,
                         turns=_turns(turns), drop_too_long=drop_too_long, trials=candidates or 8,
                         strategy=_choice(Strategy, strategy, "--strategy").value, remeasure=remeasure, pairs=pairs, past_edge=past_edge, prune=prune, schedule=schedule,
                         launcher=launcher,
                         instrument=_instrument(instrument),
                         study=study, storage=storage, results=results, objectives=objectives,
                         concurrency=concurrency, load=load, levels=levels, repeats=repeats, max_repeats=max_repeats, slo=slo,
                         warmup=warmup, trial_timeout=trial_timeout, max_model_len=max_model_len, dtype=dtype,
                         gpu_memory_utilization=gpu_memory_utilization, max_drift=max_drift,
                         lossless_tolerance=lossless_tolerance, max_logprob_drift=max_logprob_drift,
                         lossy_min_gain=lossy_min_gain, allow_unverified=allow_unverified, samples=samples,
                         sample_tokens=sample_tokens, seed=seed, resume=resume,
                         warm_start=warm_start, tries=tuple(try_ or ()), trust_remote_code=trust_remote_code,
                         workers=workers, json=json_, serve_flags=tuple(serve_flags or ()),
                         serve_config=serve_config, time_budget=time_budget, confirm=confirm)
    say = err if json_ else console  # --json: stdout carries the JSON only
    # With --confirm, the study's launcher (started once, 10-25 s) also forks confirm's servers
    with launcher_held() if confirm else contextlib.nullcontext():
        try:
            report = run_search(opts, say, verbose=edge.verbose())
        except KeyboardInterrupt:
            err.print("[yellow]interrupted:[/yellow] the running trial is recorded as failed; "
                      "continue with the same command and --resume")
            raise typer.Exit(errors.INTERRUPTED) from None
        out = opts.results / report["study"]
        if not json_:
            if explain_:
                explain(say, report, out)
            print_summary(say, report, out, confirming=confirm)
        if confirm and report.get("best"):
            report = _confirm_after_search(out, opts, say, show=not json_, explain_=explain_)
    if json_:
        print(json.dumps(report, indent=2))
    if not report.get("best"):
        raise typer.Exit(errors.FAILED)


def _confirm_after_search(out: Path, opts: Any, say: Console, *, show: bool, explain_: bool = False) -> dict[str, Any]:
    """`search --confirm`: serve the pick and the baseline (autotune confirm) behind a progress bar
    (--verbose: a line a round), then the summary again, its figure the served one; the updated report."""
    from autotune.cli.present import confirm_progress
    from autotune.gate.confirm import confirm as run_confirm
    from autotune.core.study_report import load_report
    from autotune.serve.served import served_line

    try:
        with confirm_progress(say) as (lines, on_round):
            run_confirm(out, workload=opts.workload, format=opts.format, output_len=opts.output_len, turns=opts.turns,
                        drop_too_long=opts.drop_too_long, launcher=opts.launcher, say=lines, on_round=on_round)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted:[/yellow] the study's results are written; servers ended")
        raise typer.Exit(errors.INTERRUPTED) from None
    report = load_report(out)
    if show:
        if explain_:
            say.print(served_line(report), highlight=False, markup=False)
        print_summary(say, report, out)
    return report
