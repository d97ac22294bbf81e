"""`autotune search` from its options to written results: the steps between the CLI and the study.

The CLI (autotune.cli.app) parses flags into a SearchOptions and draws progress; this module turns the
options into a workload, settings, a space and a StudyConfig, runs the study and writes the results.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, \
    TimeElapsedColumn, TimeRemainingColumn

from autotune import __version__

from autotune.core import attrs
from autotune.core.errors import BadInput
from autotune.measure.config import HOLDOUT_PAIRS, LOSSY_MIN_GAIN

# The engine every trial's worker runs. The CLI always runs vLLM; orchestration tests that drive the
# CLI swap in the FAKE engine by patching this name (monkeypatch.setattr), never
# through the environment, so no user setting can make the worker import another module.
ENGINE = "autotune.run.engine"


@dataclass(frozen=True)
class SearchOptions:
    """Every option of `autotune search` (see its --help), typed."""

    workload: Path
    model: str | None = None
    draft_model: str | None = None
    eagle_head: str | None = None
    eagle3_head: str | None = None
    space: str | None = None
    format: str = "auto"
    output_len: int | None = None
    turns: str | None = None
    drop_too_long: bool = False
    trials: int = 8
    strategy: str = "predict"
    instrument: str = "served"
    remeasure: bool = True
    pairs: int = HOLDOUT_PAIRS
    past_edge: bool = True
    prune: bool = True
    schedule: bool = True
    launcher: bool = True
    study: str | None = None
    storage: str | None = None
    results: Path = Path("results")
    objectives: str = "output_tok_s,e2e_ms_p50"
    concurrency: int | None = None  # None: not given (autotune.core.load.default_load)
    load: str | None = None
    levels: str | None = None
    repeats: int = 2
    max_repeats: int = 4
    slo: str | None = None
    warmup: int = 2
    trial_timeout: float | None = None  # None: 600 s, and at least 3x the baseline's wall time after it
    max_model_len: int | None = None
    dtype: str | None = None
    gpu_memory_utilization: float | None = None
    max_drift: float = 0.10
    lossless_tolerance: float = 0.02
    max_logprob_drift: float = 0.05
    lossy_min_gain: float = LOSSY_MIN_GAIN
    allow_unverified: bool = False
    samples: int = 64
    sample_tokens: int = 24
    seed: int = 0
    resume: bool = False
    warm_start: Path | None = None
    tries: tuple[str, ...] = ()
    trust_remote_code: bool = False
    workers: int = 1
    json: bool = False
    serve_flags: tuple[str, ...] = ()  # the user's `vllm serve` flags, after --
    serve_config: Path | None = None  # a YAML of them, as `vllm serve --config` reads it
    time_budget: float | None = None  # minutes (autotune.study.budget)
    confirm: bool = False  # then `autotune confirm`: its served rounds are the holdout (the study measures none)
    tolerance: float | None = None  # the gate's, for a warm start: holdout rounds until `check` can decide at it


@dataclass(frozen=True)
class Prepared:
    """What a search runs: the checked workload, the study's config, its space and devices."""

    workload: Any  # autotune.core.workload.Workload
    cfg: Any  # autotune.measure.config.StudyConfig
    space: Any  # autotune.core.space.SearchSpace
    platform: str
    envs: list[dict[str, str]]
    notes: list[str]  # lines to show before the study starts
    serve_env: dict[str, str] | None = None  # what serve.sh sets to serve the pick (the CPU binding of ranks)


def _settings(o: SearchOptions, platform: str) -> Any:
    from autotune import demo
    from autotune.core.candidate import Settings

    model, draft, max_len, dtype, eagle3 = o.model, o.draft_model, o.max_model_len, o.dtype, o.eagle3_head
    if model is None:
        if not demo.available():
            raise BadInput("--model: not given and the bundled demo models are missing "
                           "(run scripts/train_demo_models.py)")
        model, draft, max_len = str(demo.TARGET), draft or str(demo.DRAFT), max_len or demo.MAX_MODEL_LEN
        eagle3 = eagle3 or (str(demo.EAGLE3) if demo.eagle3_available() else None)
        dtype = dtype or demo.DTYPE
    gmu = o.gpu_memory_utilization if o.gpu_memory_utilization is not None else (0.3 if platform == "cpu" else None)
    return Settings(model=model, draft_model=draft, eagle_head=o.eagle_head, eagle3_head=eagle3, dtype=dtype,
                    max_model_len=max_len, gpu_memory_utilization=gmu, seed=o.seed,
                    trust_remote_code=o.trust_remote_code)


def models_ready(o: SearchOptions, p: Prepared) -> Prepared:
    """``p`` with its models fetched before any clock starts (autotune.run.model_fetch: one line says
    so) and, without --trial-timeout, the trial time limit sized from their weights and the platform.
    The fake engine of the orchestration tests loads no model: nothing is fetched."""
    if p.cfg.engine_module != "autotune.run.engine":
        return p
    from autotune.run import model_fetch

    flags = p.cfg.settings.serve_flags
    ready = model_fetch.fetch(p.cfg.settings, flags)
    tp = int(flags.get("tensor_parallel_size") or 1)
    limit = None if o.trial_timeout else model_fetch.baseline_timeout(model_fetch.weight_bytes(ready), p.platform, tp)
    cfg = replace(p.cfg, trial_timeout_s=limit) if limit is not None else p.cfg
    return replace(p, cfg=cfg, notes=[*p.notes, escape(model_fetch.ready_line(ready, limit, p.platform, tp))])


def _workload_needs(wl: Any) -> set[str]:
    """What a space's ``needs:`` can ask of the workload: sampled requests, for the verification knobs
    (block verification, probabilistic drafts) that change nothing on a greedy request."""
    return {"sampled_requests"} if wl.greedy_share < 1.0 else set()


def prepare(o: SearchOptions) -> Prepared:
    """Check every input (exit 2 on bad input) before any engine starts."""
    from autotune.run import devices, hardware, platform_check
    from autotune.measure.config import StudyConfig
    from autotune.core.context import fit_model
    from autotune.core.kv_budget import kv_cache_bytes, most_in_flight
    from autotune.core.load import default_load, level_loads, parse_levels, parse_load
    from autotune.measure.objectives import normalize_objectives, validate_objectives
    from autotune.measure.slo import parse_slos
    from autotune.core.space import load_space
    from autotune.measure.validate import Tolerances
    from autotune.core.workload import load_workload

    platform_check.check()  # the installed vLLM fits this machine, or one line and exit 2
    wl = load_workload(o.workload, format=o.format, output_len=o.output_len, turns=o.turns)
    levels = parse_levels(o.levels) if o.levels else ()
    if levels and (o.load or o.concurrency is not None):
        raise BadInput("--levels: its first level is the study's own load; leave out --load and --concurrency")
    chosen = None  # no load given: the workload's arrivals, else one in flight, said in one line
    if not (o.load or levels or o.concurrency is not None):
        text, chosen = default_load([r.arrival_s for r in wl.requests])
    else:
        text = o.load or f"concurrency={levels[0] if levels else o.concurrency}"
    load = parse_load(text, seed=o.seed)
    if load.kind == "replay" and any(r.arrival_s is None for r in wl.requests):
        missing = next(r.id for r in wl.requests if r.arrival_s is None)
        raise BadInput(f"--load replay: request {missing!r} of {wl.path} has no 'arrival_s' to replay")
    objectives = tuple(x.strip() for x in o.objectives.split(",") if x.strip())
    validate_objectives(objectives)
    objectives, extra_loads = normalize_objectives(objectives, load)
    extra_loads = level_loads(levels, load, extra_loads)
    platform = hardware.detect()
    settings = _settings(o, platform)
    from autotune.cli.serving import apply_serving_flags, parse_serving_flags
    from autotune.core.runner import needs as runner_needs, runner_lines

    flags = parse_serving_flags(o, settings)
    if ENGINE == "autotune.run.engine":  # the models' configs before the space reads them (the FAKE engine loads none)
        from autotune.run import model_fetch

        model_fetch.configs_first(settings, flags.values)

    sp = load_space(o.space or ("gpu" if platform == "cuda" else "cpu"), platform=platform,
                    models=settings.available_models() | _workload_needs(wl) | runner_needs(platform, os.environ),
                    tags=hardware.platform_tags(platform))
    from autotune.core.target_space import fit_to_target

    settings, sp, flags, flag_notes = apply_serving_flags(o, settings, sp, flags)
    from autotune.core.structured import tool_refusal

    refused = tool_refusal(wl.requests, flags.values, o.instrument)
    if refused:
        raise BadInput(refused)
    sp, target_notes = fit_to_target(sp, settings.model, tensor_parallel=flags.tensor_parallel_size)
    from autotune.core.candidate import model_configs
    from autotune.core.drafters import unsearched

    target_notes += unsearched(settings, model_configs)
    target_notes += runner_lines([m for p in sp.params if p.name == "method" for m in p.values()],
                                 platform=platform, env=os.environ)
    fitted = fit_model(wl, model=settings.model, max_model_len=settings.max_model_len, tokenizer=settings.tokenizer,
                       trust_remote_code=o.trust_remote_code, drop=o.drop_too_long)
    if platform == "cpu" and o.gpu_memory_utilization is None:  # KV for what the study holds, not 0.3 of RAM
        kv = kv_cache_bytes([m for m in (settings.model, settings.draft_model, settings.eagle_head,
                                         settings.eagle3_head) if m], fitted.context or 0,
                            most_in_flight([load, *extra_loads], len(fitted.workload.requests), o.samples)
                            * max(r.n for r in fitted.workload.requests))  # n completions: n sequences each
        if kv is not None:
            settings = replace(settings, gpu_memory_utilization=None, kv_cache_memory_bytes=kv)
    name = o.study or Path(o.workload).stem
    cfg = StudyConfig(name=name, results_dir=o.results / name, settings=settings, objectives=objectives,
                      n_trials=o.trials, storage=o.storage, load=load, extra_loads=extra_loads, repeats=o.repeats,
                      max_repeats=o.max_repeats, warmup=o.warmup, slos=parse_slos(o.slo),
                      trial_timeout_s=o.trial_timeout or 600.0, timeout_from_baseline=o.trial_timeout is None,
                      time_budget_s=o.time_budget * 60 if o.time_budget is not None else None, seed=o.seed, samples=o.samples, sample_tokens=o.sample_tokens,
                      lossy_min_gain=o.lossy_min_gain,
                      **({"gate_tolerance": o.tolerance} if o.tolerance is not None else {}),
                      strategy=o.strategy, remeasure=o.remeasure, pairs=0 if o.confirm else o.pairs, past_edge=o.past_edge, prune=o.prune, schedule=o.schedule, launcher=o.launcher,
                      instrument=o.instrument,
                      tolerances=Tolerances(lossless=o.lossless_tolerance, max_drift=o.max_drift,
                                            max_logprob_drift=o.max_logprob_drift,
                                            allow_unverified=o.allow_unverified),
                      engine_module=ENGINE)
    notes = [*([escape(chosen)] if chosen else []), *(f"workload: {escape(n)}" for n in wl.notes), *flag_notes, *(f"  [dim]left out: {escape(n)}[/dim]" for n in sp.dropped),
             *(f"  [dim]{escape(n)}[/dim]" for n in target_notes)]
    envs, bound = devices.bind_ranks(devices.partition(o.workers, platform, flags.devices_per_engine), platform,
                                     flags.devices_per_engine)
    if bound:
        notes.append(escape(bound))
    if fitted.warning:
        notes.append(f"[yellow]warning:[/yellow] {escape(fitted.warning)}")
    if fitted.dropped:
        notes.append(f"--drop-too-long: dropped {len(fitted.dropped)} request(s) over the context of {fitted.context} "
                     f"tokens, e.g. {escape(str(fitted.dropped[0]))}; {len(fitted.workload.requests)} left")
    if platform == "cuda":  # every worker's engine fits its devices' free memory, or one line and exit 2
        from autotune.run import gpu_memory

        gpu_memory.preflight(envs, settings.gpu_memory_utilization, devices=flags.devices_per_engine)
    # serve.sh serves the pick alone on this host: every core this process may use, split between ranks.
    serve_env = devices.bind_ranks([{}], platform, flags.devices_per_engine)[0][0] if bound else None
    return Prepared(fitted.workload, cfg, sp, platform, envs, notes, serve_env)


def run_search(o: SearchOptions, say: Console, *, verbose: bool = False) -> dict[str, Any]:
    """Run the study the options describe and write its results; return the StudyReport (best.json)."""
    from autotune.run import hardware
    from autotune.cli.present import RichProgress
    from autotune.results.files import write_results
    from autotune.study.loop import run_study

    p = models_ready(o, prepare(o))
    say.print(f"autotune {__version__}: {len(p.workload.requests)} requests from {p.workload.path}, space "
              f"'{p.space.name}' on {p.platform}, model {p.cfg.settings.model}"
              + (f", {len(p.envs)} workers" if len(p.envs) > 1 else ""), highlight=False)
    for note in p.notes:
        say.print(note, highlight=False)
    enqueue = [parse_try(t, p.space) for t in o.tries]
    deployed = None
    if o.warm_start is not None:
        deployed, more = warm_start(o.warm_start, p.space, p.cfg.settings, p.workload.path, say)
        enqueue += more
    from autotune.measure.sequential import MAX_ROUNDS
    from autotune.study.plan import plan_of

    study_plan = plan_of(p.cfg, deployed=deployed is not None, confirm_rounds=MAX_ROUNDS if o.confirm else 0)
    say.print(study_plan.line(), highlight=False)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=say, transient=True) as progress:
        task = progress.add_task("starting", total=p.cfg.n_trials)
        show = RichProgress(progress, task, p.cfg.results_dir if verbose else None, load=p.cfg.load.label)
        st = run_study(p.cfg, p.workload, p.space, progress=show, resume=o.resume, enqueue=enqueue,
                       deployed=deployed, worker_envs=p.envs, study_plan=study_plan)
    if o.warm_start is not None:
        st.set_user_attr(attrs.WARM_START, {"from": str(o.warm_start)})
    return write_results(st, p.cfg.results_dir, settings=p.cfg.settings, platform=hardware.describe(),
                         objectives=list(p.cfg.objectives), storage_url=p.cfg.storage_url, serve_env=p.serve_env)


def warm_start(path: Path, space: Any, settings: Any, workload: str, say: Console
                ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The old pick (re-measured first, as the deployed config) and the rest of its Pareto set, as
    parameter sets; report what changed since. Knobs the old results do not name take the space's
    baseline values, so the re-measured config is the deployed one, not a sampler's variation."""
    from autotune.run import hardware
    from autotune.core.study_report import load_report
    from autotune.study.trials import SCHEDULE_KEY

    old = load_report(path)
    names = {p.name for p in space.params}
    methods = next(x.choices for x in space.params if x.name == "method")
    picks = ([old["best"]] if old.get("best") else []) + list(old.get("pareto") or [])
    params: list[dict[str, Any]] = []
    for e in picks:
        # A depth schedule is no space parameter but part of the config: a deployed schedule is
        # re-measured as deployed, not as its fixed depth.
        p = exactly({k: v for k, v in e["candidate"].items() if k in names or k == SCHEDULE_KEY}, space)
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


def parse_try(text: str, space: Any) -> dict[str, Any]:
    try:
        params = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"--try: not valid JSON ({e.msg} at column {e.colno}): {text!r}") from None
    from autotune.study.trials import SCHEDULE_KEY
    from autotune.study.schedule import check_ranges

    names = {p.name for p in space.params}
    if not isinstance(params, dict) or set(params) - names - {SCHEDULE_KEY}:
        bad = sorted(set(params) - names - {SCHEDULE_KEY})[0] if isinstance(params, dict) else params
        raise BadInput(f"--try: key {bad!r}: expected parameters of space '{space.name}' "
                       f"({', '.join(sorted(names))}) or {SCHEDULE_KEY}")
    for name, value in params.items():  # a value the space left out here would run as another config, or fail
        left = next((d for d in space.dropped if d.startswith(f"{name}={value} (")), None)
        if left is not None:
            raise BadInput(f"--try: key {name!r}: {value!r} is left out of space '{space.name}' here: {left}")
    if SCHEDULE_KEY in params:  # a depth schedule of the user's: judged as the study's own would be
        why = check_ranges(params[SCHEDULE_KEY], params.get("num_speculative_tokens"))
        if why:
            raise BadInput(f"--try: key {SCHEDULE_KEY!r}: {why}")
    return exactly(params, space)


def exactly(params: dict[str, Any], space: Any) -> dict[str, Any]:
    """The config given, not a sampler's variation of it (``--try``, a warm start's old configs):
    knobs left out take the baseline's values, and a verification knob the baseline has no say in
    (it does not speculate) takes vLLM's own."""
    from autotune.core.candidate import SPEC_DEFAULTS

    given = {**space.baseline_trial_params(), **params}
    for p in space.params:
        if p.name not in given and p.name in SPEC_DEFAULTS and p.active(given) and SPEC_DEFAULTS[p.name] in p.values():
            given[p.name] = SPEC_DEFAULTS[p.name]
    return given


