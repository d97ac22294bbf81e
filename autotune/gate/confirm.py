"""Confirm the pick the way users run it: serve the exported command, measure it with vLLM's own client.

A study measures each config on one or two engine instances (served by default, `--instrument`);
the served figure moves from one server instance to the next by more than the windows inside one
instance show (benchmarks/data/served_gap*.json). So this step:

- serves the pick with ``serve.sh`` as written and the baseline through the same launcher
  (``confirm/baseline.sh``, built by the same ``serve_script``), in rounds of one pair each, in the
  study's one ABBA order (autotune.measure.intervals.abba: baseline, pick | pick, baseline | ...), so
  that a drift over the run weighs on both sides alike; a new server instance each, one after
  another: a server starting beside the measured one slowed it by 7-19% in each of 3 pairs on 2 cores
  (benchmarks/data/confirm_overlap.json), and both up at once, blocks interleaved, spread as much
  block to block (log sd 0.19) while the idle one moved the two sides apart (pick 0.88x, baseline
  1.15x its alone speed: benchmarks/data/confirm_interleave.json); rounds come two at a time until the served speedup
  resolves to ``--resolution`` (autotune.measure.sequential), and each server is measured in passes
  until ``--min-pass-s`` measured seconds, its caches emptied between passes (autotune.vllm_cli);
- starts each server and client forked from autotune's launcher (autotune.run.launcher; the
  study's own when `search --confirm` runs, else one started here), which has imported vLLM once:
  the same `vllm serve` command, arguments and environment, each server a new instance of its
  own with its own engine core and CPU worker, ready in about 2 s instead of 30-35 s on 2 cores
  (benchmarks/data/launcher_start.json: tok/s forked over fresh 1.01, 0.79-1.26, inside fresh
  instances' own spread). A script autotune did not write, or ``launcher=False`` (`--no-launcher`),
  runs as a new process, as users start it; each round records which (``started``);
- measures each with ``vllm bench serve`` (run through ``python -m autotune.vllm_cli bench serve``,
  which also works on the CPU build) on the study's workload and load, each round's JSON kept; the
  client starts beside its server and waits for ``/health`` after its own imports (10-16 s);
- reports the served speedup over rounds as pairs: exp(mean log(pick / baseline tok/s)) with a 95%
  t-interval on those log ratios (autotune.measure.intervals: a bootstrap over 3 rounds does not
  reach its coverage), into best.json as the pick's figure (the served rounds are the holdout: they
  come after the choice and cannot change it), beside the study's claim (its selection phase's
  measured ratio), with confirm's resolution and why its rounds stopped.

Every server starts in its own session; the ready-wait tells a crash (the process exited) from a
timeout; the whole process group is ended (SIGTERM, then SIGKILL) and checked to be gone
(autotune.serve.servers). What the client sends is autotune.serve.bench_client; the verdict and the comparison
`check` makes are autotune.serve.served.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.core.errors import BadInput
from autotune.gate.served_rounds import (CONFIRM_DIR, SECTION, SIDES, RoundResult, read_passes, served_figure,
                                        served_numbers, standing, tok_s_by_side, update_markdown, write_failure)
from autotune.measure.intervals import abba
from autotune.measure.sequential import MAX_ROUNDS, MAX_S, TARGET, Sequential
from autotune.run import launcher as run_launcher
from autotune.serve.bench_client import DEFAULT_WARMUPS, ClientPlan, _num, client_plan
from autotune.serve.served import verdict
from autotune.serve.servers import (BENCH_TIMEOUT_S, HOST, READY_TIMEOUT_S, ServeFailed, client_started, finish_client,
                                    free_port, serving)
from autotune.vllm_cli import PASSES_ENV, WAIT_FOR, WAIT_FOR_S, WARMUP_ENV, pass_name

DATASET = "workload.jsonl"  # the workload as `vllm bench serve --dataset-name custom` reads it
# Measured seconds per side and round at least: passes of the workload on one server, its caches
# emptied between them, until they add up to this (a 2-s pass is within reach of one scheduler hiccup).
MIN_PASS_S = 6.0
MAX_PASSES = 8
Say = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# The step


def _launcher(python: str) -> list[str]:
    """The launcher serve.sh uses on the CPU build; it runs vLLM's own subcommands on any build."""
    return [python, "-m", "autotune.vllm_cli"]


def _render_with(model: str, *, trust_remote_code: bool) -> Callable[[list[dict[str, str]]], str]:
    tok = None

    def render(messages: list[dict[str, str]]) -> str:
        from autotune.core.workload import chat_text

        nonlocal tok
        if tok is None:
            from autotune.core.context import load_tokenizer

            tok = load_tokenizer(model, trust_remote_code=trust_remote_code)
        return chat_text(tok, messages)

    return render


def _load_workload(report: dict[str, Any], workload: Any, *, fmt: str, output_len: int | None, turns: str | None,
                   drop_too_long: bool) -> Any:
    from autotune.core.workload import Workload, load_workload

    if isinstance(workload, Workload):
        return workload
    path = workload if workload is not None else report.get("workload")
    if path is None:
        raise BadInput("best.json: key 'workload': no workload path recorded; pass the workload file")
    if workload is None and not Path(path).exists():
        raise BadInput(f"best.json: key 'workload': {path}: no such file from here (run from the folder the "
                       "study ran in, or pass the workload file)")
    wl = load_workload(path, format=fmt, output_len=output_len, turns=turns)
    if drop_too_long:  # as the study did: requests over the model's context are left out
        from autotune.core.context import fit_model

        kw = report["best"]["engine_kwargs"]
        wl = fit_model(wl, model=kw["model"], max_model_len=kw.get("max_model_len"), tokenizer=kw.get("tokenizer"),
                       trust_remote_code=bool(kw.get("trust_remote_code")), drop=True).workload
    return wl


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


@dataclass(frozen=True)
class _Setup:
    """Everything the rounds need: where files go, the scripts to serve, the client's command."""

    results_dir: Path
    out: Path
    plan: ClientPlan
    scripts: dict[str, Path]
    client: list[str]
    env: dict[str, str]
    platform: str
    commands: dict[str, list[str]]  # `vllm serve` as the launcher can fork it, for scripts autotune wrote
    stateful: dict[str, bool]  # a side whose proposer keeps state across requests (suffix): reset between passes
    baseline_command: str
    asks: dict[str, tuple[float | None, int]]  # each side's (gpu_memory_utilization, devices): the wait on CUDA
    dataset_name: str = DATASET

    def rel(self, q: Path) -> str:
        return str(Path(q).relative_to(self.results_dir))

    def server(self, side: str, port: int, *, fork: bool, hooks: bool = True) -> tuple[list[str], dict[str, str]]:
        """``side``'s server command on ``port`` (forked from the launcher, or its script run as written)
        and its environment. Measuring hooks, never part of the served config: the dev endpoints that
        empty the prefix cache between passes, and (``hooks``) for a stateful proposer the worker
        method that empties its cache (autotune.run.vllm_ext)."""
        from autotune.run.vllm_ext import QUALNAME

        ext = ["--worker-extension-cls", QUALNAME] if hooks and self.stateful[side] else []
        head = [*self.commands[side]] if fork else ["bash", str(self.scripts[side])]
        return [*head, *ext, "--host", HOST, "--port", str(port)], {**self.env, "VLLM_SERVER_DEV_MODE": "1"}


def _setup(results_dir: Path, report: dict[str, Any], wl: Any, *, warmups: int, python: str) -> _Setup:
    """Write the dataset and the baseline's serve script; build the client's command."""
    from autotune.run import hardware
    from autotune.serve.export import serve_argv, serve_script, written_by_export

    best, base = report["best"], report["baseline"]
    platform = (report.get("platform") or {}).get("platform") or hardware.detect()
    kw = best["engine_kwargs"]
    plan = client_plan(list(wl.requests), load=report.get("load"), warmups=warmups,
                       render=_render_with(kw.get("tokenizer") or kw["model"],
                                           trust_remote_code=bool(kw.get("trust_remote_code"))))
    out = results_dir / CONFIRM_DIR
    out.mkdir(exist_ok=True)
    dataset = out / DATASET
    dataset.write_text("".join(json.dumps(r) + "\n" for r in plan.rows))
    scripts = {"baseline": out / "baseline.sh", "pick": results_dir / "serve.sh"}
    env = report.get("serve_env") or None  # the CPU binding of tensor-parallel ranks, for both sides
    scripts["baseline"].write_text(serve_script(base["engine_kwargs"], platform=platform, python=python, env=env))
    if not scripts["pick"].is_file():  # results copied without it: the same script, from best.json
        scripts["pick"] = out / "pick.sh"
        scripts["pick"].write_text(serve_script(kw, platform=platform, python=python, env=env))
        plan.notes.append("serve.sh was missing; served confirm/pick.sh, written from best.json's engine kwargs")
    for sh in scripts.values():
        sh.chmod(0o755)
    kwargs = {"baseline": base["engine_kwargs"], "pick": kw}
    commands = {side: [*_launcher(python), "serve", *serve_argv(kwargs[side])]
                for side, sh in scripts.items() if written_by_export(sh.read_text(), kwargs[side], platform=platform, env=env)}
    if "pick" not in commands:
        plan.notes.append(f"{scripts['pick'].name} is not the command autotune wrote for best.json's engine kwargs: "
                          "served as written, each round a new process")
    client = [*_launcher(python), "bench", "serve", "--model", kw["model"],
              *(["--served-model-name", kw["served_model_name"][0]] if kw.get("served_model_name") else []),
              *(["--tokenizer", kw["tokenizer"]] if kw.get("tokenizer") else []),
              *(["--trust-remote-code"] if kw.get("trust_remote_code") else []),
              "--dataset-path", str(dataset), *plan.flags]
    from autotune.run.vllm_ext import needs_reset
    from autotune.serve.export import command

    from autotune.run.gpu_memory import asked_by

    return _Setup(results_dir, out, plan, scripts, client, {"AUTOTUNE_PYTHON": python, **(env or {})}, platform,
                  commands, {side: needs_reset(kwargs[side]) for side in kwargs}, command(base["engine_kwargs"]),
                  {side: asked_by({"engine_kwargs": kwargs[side]}) for side in kwargs})


def setup(results_dir: Path, report: dict[str, Any], wl: Any, *, warmups: int = DEFAULT_WARMUPS,
          python: str = sys.executable) -> _Setup:
    """What confirm serves and sends for a results folder, for a benchmark to drive its own rounds
    (benchmarks/client_gap.py): the dataset, both serve scripts, the client's command."""
    return _setup(results_dir, report, wl, warmups=warmups, python=python)


def read_workload(report: dict[str, Any], workload: Any = None) -> Any:
    """The workload confirm serves for ``report`` (best.json's own, read as the study read it), for a
    benchmark that drives its own rounds (benchmarks/confirm_interleave.py)."""
    return _load_workload(report, workload, fmt="auto", output_len=None, turns=None, drop_too_long=False)


def starter(forked: bool) -> Any:
    """How a round's processes start: through the launcher (which falls back to Popen, saying why,
    for what it cannot fork exactly) or as new processes."""
    from autotune.serve.servers import popen

    if not forked:
        return popen

    def through_launcher(argv: list[str], env: dict[str, str], log_path: Path) -> Any:
        log_path.write_text("")  # the launcher appends
        return run_launcher.launch(argv, env=env, log_path=log_path)

    return through_launcher


def _memory_released(st: _Setup, n: int, side: str) -> None:
    """On a GPU, wait until the devices ``side``'s server will use have the memory it asks for, as a
    trial's worker does (autotune.run.worker): the other side's server, ended a moment ago, may still
    be giving it back, and vLLM refuses to start short of it. ServeFailed (the round fails) if not."""
    if st.platform != "cuda":
        return
    from autotune.run import gpu_memory

    utilization, devices = st.asks[side]
    why = gpu_memory.wait_released(st.env, utilization, devices=devices, timeout_s=gpu_memory.RELEASE_TIMEOUT_S)
    if why is not None:
        raise ServeFailed(f"the {side} server ({st.rel(st.scripts[side])}, round {n}) was not started: {why}")


def _round(st: _Setup, n: int, side: str, *, ready_timeout_s: float, bench_timeout_s: float, forked: bool,
           min_pass_s: float, say: Say) -> RoundResult:
    """One new server of ``side``, measured by ``vllm bench serve`` in passes until ``min_pass_s``
    measured seconds (its caches emptied between passes: autotune.vllm_cli), then ended."""
    tag, out = f"round-{n}-{side}", st.out
    fork = forked and side in st.commands
    start = starter(fork)
    for stale in out.glob(f"{tag}.*"):
        stale.unlink()
    port = free_port()
    base_url = f"http://{HOST}:{port}"
    say(f"confirm round {n} {side}: starting {st.rel(st.scripts[side])} on port {port}"
        + (" (forked from the launcher)" if fork else ""))
    server_argv, server_env = st.server(side, port, fork=fork, hooks=min_pass_s > 0)
    _memory_released(st, n, side)
    client_log = out / f"{tag}.bench.log"
    # The client starts with the server and sends its first request once /health answers
    # (autotune.vllm_cli, AUTOTUNE_WAIT_FOR); started fresh, its imports (10-16 s) overlap the server's start,
    # and it warms the server on requests outside the measured set (autotune.serve.warmup)
    wait = {WAIT_FOR: f"{base_url}/health", WAIT_FOR_S: f"{ready_timeout_s:g}",
            WARMUP_ENV: json.dumps(st.plan.warmup),
            PASSES_ENV: json.dumps({"min_s": min_pass_s, "max": MAX_PASSES if min_pass_s > 0 else 1,
                                    "drafter": st.stateful[side]})}
    with client_started([*st.client, "--base-url", base_url, "--save-result", "--result-dir", str(out),
                         "--result-filename", f"{tag}.json", "--label", tag, "--metadata", f"side={side}",
                         f"round={n}"], log_path=client_log, env={**st.env, **wait}, start=start) as client, \
            serving(server_argv, port=port, log_path=out / f"{tag}.log", env=server_env,
                    ready_timeout_s=ready_timeout_s,
                    what=f"the {side} server ({st.rel(st.scripts[side])}, round {n})", start=start) as server:
        finish_client(client, log_path=client_log, timeout_s=bench_timeout_s)
    started = "forked" if isinstance(server.process, run_launcher.Launched) else "fresh"
    files = [out / pass_name(f"{tag}.json", k) for k in range(1, MAX_PASSES + 1)]
    data = read_passes([f for f in files if f.is_file()] or [files[0]], expected=len(st.plan.rows))
    r = RoundResult(round=n, side=side, output_tok_s=float(data["output_throughput"]),
                    tpot_ms_p50=_num(data.get("median_tpot_ms")), ttft_ms_p50=_num(data.get("median_ttft_ms")),
                    e2e_ms_p50=_num(data.get("median_e2el_ms")), acceptance_rate=data["acceptance_rate"],
                    mean_accepted_length=data["acceptance_length"], completed=int(data["completed"]),
                    server_pid=server.pid, duration_s=float(data.get("duration") or 0.0),
                    ready_s=round(server.ready_s, 2), started=started,
                    result_file=f"{CONFIRM_DIR}/{pass_name(f'{tag}.json', 1)}", server_log=f"{CONFIRM_DIR}/{tag}.log",
                    bench_log=f"{CONFIRM_DIR}/{tag}.bench.log", passes=len(data["pass_tok_s"]),
                    pass_tok_s=data["pass_tok_s"], tpot_not_measured=data.get("tpot_not_measured"))
    tpot = ("tpot not measured: bursts" if r.tpot_not_measured else "no tpot" if r.tpot_ms_p50 is None
            else f"tpot p50 {r.tpot_ms_p50:.1f} ms")
    say(f"confirm round {n} {side}: {r.output_tok_s:.1f} output tok/s over {r.duration_s:.1f} s in {r.passes} "
        f"pass(es) ({tpot}; server ready in {r.ready_s:.0f} s)")
    return r


def confirm(results_dir: str | Path, *, rounds: int | None = None, resolution: float = TARGET,
            max_rounds: int = MAX_ROUNDS, max_s: float | None = MAX_S, min_pass_s: float = MIN_PASS_S,
            warmups: int = DEFAULT_WARMUPS, workload: Any = None, format: str = "auto", output_len: int | None = None,
            turns: str | None = None, drop_too_long: bool = False, python: str | None = None,
            ready_timeout_s: float = READY_TIMEOUT_S, bench_timeout_s: float = BENCH_TIMEOUT_S, launcher: bool = True,
            say: Say | None = None, on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Serve the pick (``serve.sh``) and the baseline in rounds in ABBA order, a new server each,
    measure each with ``vllm bench serve`` (passes until ``min_pass_s`` measured seconds), and write
    the served numbers into best.json, with the pick's figure from them: the served rounds are the
    holdout, measured after the choice. Rounds come two at a time until the served speedup's
    resolution is ``resolution`` or better, ``max_rounds``, or ``max_s`` seconds
    (autotune.measure.sequential); ``rounds``: exactly that many instead.

    ``launcher``: fork servers and clients from autotune's launcher (the one running, else one
    started for this step); False starts each as a new process, as users start `vllm serve`.

    ``workload``: a ``Workload``, a path, or None for best.json's ``workload``; ``format``,
    ``output_len``, ``turns`` and ``drop_too_long`` read it as `autotune search` did. ``python``:
    the interpreter for the launcher (default ``$AUTOTUNE_PYTHON`` or this one). ``say``: each round's
    lines (a log); ``on_round``: after each round, where confirm stands (``standing``: a progress
    bar's numbers). Returns the
    ``served`` object now under ``best`` in best.json. Raises BadInput for results that cannot be
    confirmed, ServeFailed (exit 1) when a server or the client fails; best.json then records the
    failure under ``best.served.failure``.
    """
    import time

    from autotune.core.study_report import load_report

    if rounds is not None and rounds < 1:
        raise BadInput(f"--rounds: expected at least 1, got {rounds}")
    t0 = time.monotonic()  # --max-minutes counts the whole step: setup and launcher too
    rule = Sequential(target=resolution, max_rounds=max_rounds, max_s=max_s, rounds=rounds)
    say = say or (lambda _line: None)
    p = Path(results_dir)
    results_dir = p.parent if p.name == "best.json" else p
    report = load_report(results_dir)
    best, base = report.get("best"), report.get("baseline")
    if not best:
        raise BadInput(f"{results_dir}: the study found no feasible configuration to confirm")
    if not base or "engine_kwargs" not in base:
        raise BadInput(f"{results_dir}/best.json: key 'baseline': no baseline engine kwargs to serve beside the pick")
    python = python or os.environ.get("AUTOTUNE_PYTHON") or sys.executable
    wl = _load_workload(report, workload, fmt=format, output_len=output_len, turns=turns, drop_too_long=drop_too_long)
    st = _setup(results_dir, report, wl, warmups=warmups, python=python)
    done: list[RoundResult] = []
    stopped = None
    try:
        with run_launcher.active(launcher, python=python):
            forked = launcher and bool(os.environ.get(run_launcher.ENV_KEY))  # else it did not start (said)
            first, n = time.monotonic() - t0, 0  # seconds before the first round
            while stopped is None:
                n += 1
                for side in abba(n, SIDES):  # ABBA: a drift over the run weighs on both sides alike
                    done.append(_round(st, n, side, ready_timeout_s=ready_timeout_s, bench_timeout_s=bench_timeout_s,
                                       forked=forked, min_pass_s=min_pass_s, say=say))
                    if on_round is not None:
                        on_round(standing(done, rule, time.monotonic() - t0))
                tps = tok_s_by_side(done)
                stopped = rule.stop(tps["pick"], tps["baseline"], time.monotonic() - t0, first)
    except ServeFailed as e:
        write_failure(st.out, e)
        _record(results_dir, {"failure": str(e), "rounds_done": [asdict(r) for r in done],
                              "files": {"failure": f"{CONFIRM_DIR}/failure.json"}}, None)
        raise
    (st.out / "failure.json").unlink(missing_ok=True)
    say(f"confirm: stopped after {n} round(s): {stopped}")
    served = served_numbers(report, st, done, warmups=warmups, stopped=stopped, min_pass_s=min_pass_s,
                            level=rule.level)
    claimed = served["claimed"]
    line = verdict((served["speedup"], served["speedup_lo"], served["speedup_hi"]),
                   (claimed["speedup"], claimed["lo"], claimed["hi"]), resolution=served["resolution"],
                   rounds=n) if claimed["speedup"] is not None else None
    _record(results_dir, served, line)
    return served


def _record(results_dir: Path, served: dict[str, Any], line: str | None) -> None:
    """Write ``served`` under ``best``, the pick's figure from it (``figure``: the served rounds are the
    holdout; a failed confirm leaves no figure) and the one-line verdict at the top of best.json (keys the
    StudyReport declares), and the served section of report.md."""
    from autotune.core.study_report import dumps, load_report, with_served

    path = results_dir / "best.json"
    report = with_served(load_report(path), served, line)
    if served.get("failure"):
        report["figure"] = {**(report.get("figure") or {}), "source": "served", "status": "not measured",
                            "why": f"confirm failed: {served['failure']}", "speedup": None, "lo": None, "hi": None}
    else:
        report["figure"] = served_figure(served, report.get("load"))
    _write_atomic(path, dumps(report))
    update_markdown(results_dir, report)
