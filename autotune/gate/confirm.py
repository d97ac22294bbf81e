"""Confirm the pick the way users run it: serve the exported command, measure it with vLLM's own client.

A study measures each config on one or two engine instances (served by default, `--instrument`);
the served figure moves from one server instance to the next by more than the windows inside one
instance show (benchmarks/data/served_gap*.json). So this step:

- serves the pick with ``serve.sh`` as written and the baseline through the same launcher
  (``confirm/baseline.sh``, built by the same ``serve_script``), in rounds of one pair each, in
  ABBA order (baseline, pick | pick, baseline | baseline, pick ...: ``round_order``), so that a
  drift over the run (the machine warming, another job) weighs on both sides alike, as the study's
  re-measurement does; a new server instance each, one after another: a server starting beside
  the measured one slowed it by 7-19% in each of 3 pairs on 2 cores
  (benchmarks/data/confirm_overlap.json);
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
  reach its coverage), beside the study's claim, with confirm's resolution, into best.json.

Every server starts in its own session; the ready-wait tells a crash (the process exited) from a
timeout; the whole process group is ended (SIGTERM, then SIGKILL) and checked to be gone
(autotune.serve.servers). What the client sends is autotune.serve.bench_client; the verdict and the comparison
`check` makes are autotune.serve.served.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune.core.errors import BadInput
from autotune.run import launcher as run_launcher
from autotune.serve.bench_client import DEFAULT_WARMUPS, ClientPlan, _num, _scaled, client_plan, read_bench
from autotune.serve.served import served_line, verdict
from autotune.serve.servers import (BENCH_TIMEOUT_S, HOST, READY_TIMEOUT_S, ServeFailed, client_started, finish_client,
                                    free_port, serving)
from autotune.vllm_cli import WAIT_FOR, WAIT_FOR_S, WARMUP_ENV

CONFIRM_DIR = "confirm"  # under the results folder: scripts, dataset, server logs, bench results
DATASET = "workload.jsonl"  # the workload as `vllm bench serve --dataset-name custom` reads it
DEFAULT_ROUNDS = 3
SIDES = ("baseline", "pick")
Say = Callable[[str], None]


@dataclass(frozen=True)
class RoundResult:
    """One server instance measured by one ``vllm bench serve`` run."""

    round: int
    side: str
    output_tok_s: float
    tpot_ms_p50: float | None
    ttft_ms_p50: float | None
    e2e_ms_p50: float | None
    acceptance_rate: float | None  # accepted / drafted tokens, from the server's counters (speculative side)
    mean_accepted_length: float | None
    completed: int
    duration_s: float
    ready_s: float  # from start to a healthy /health
    started: str  # the server: "forked" from autotune's launcher, or "fresh" (a new process)
    server_pid: int  # also its process-group id, ended and checked empty after the round
    result_file: str  # relative to the results folder
    server_log: str
    bench_log: str


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(statistics.median(vals)) if vals else None


def round_order(n: int) -> tuple[str, str]:
    """Round ``n``'s sides in ABBA order: odd rounds baseline first, even rounds pick first. Over
    two rounds each side sits once early and once late, so a linear drift cancels in the ratio
    (always baseline first, a machine slowing over the run would favour the pick in every round)."""
    return SIDES if n % 2 else (SIDES[1], SIDES[0])


def _side_summary(rounds: list[RoundResult]) -> dict[str, Any]:
    return {"output_tok_s": _median([r.output_tok_s for r in rounds]),
            "tpot_ms_p50": _median([r.tpot_ms_p50 for r in rounds]),
            "ttft_ms_p50": _median([r.ttft_ms_p50 for r in rounds]),
            "e2e_ms_p50": _median([r.e2e_ms_p50 for r in rounds]),
            "acceptance_rate": _median([r.acceptance_rate for r in rounds]),
            "mean_accepted_length": _median([r.mean_accepted_length for r in rounds])}


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


SECTION = "## Served (vllm serve + vllm bench serve)"


def _update_markdown(results_dir: Path, report: dict[str, Any]) -> None:
    """Replace (or add) the served section of report.md."""
    path = results_dir / "report.md"
    if not path.is_file():
        return
    text = path.read_text()
    head = text.split("\n" + SECTION + "\n")[0].rstrip("\n") + "\n"
    sv = report["best"]["served"]
    lines = ["", SECTION, "", served_line(report) or ""]
    if not sv.get("failure"):
        lines += ["", "| round | baseline tok/s | pick tok/s |", "|---|---|---|"]
        lines += [f"| {i + 1} | {b:.1f} | {p:.1f} |"
                  for i, (b, p) in enumerate(zip(sv["baseline_output_tok_s"], sv["pick_output_tok_s"]))]
        lines += ["", f"Result files: `{CONFIRM_DIR}/`."] + [f"- note: {n}" for n in sv["client"]["notes"]]
    path.write_text(head + "\n".join(lines) + "\n")


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

    def rel(self, q: Path) -> str:
        return str(Path(q).relative_to(self.results_dir))


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
    return _Setup(results_dir, out, plan, scripts, client, {"AUTOTUNE_PYTHON": python, **(env or {})}, platform,
                  commands)


def setup(results_dir: Path, report: dict[str, Any], wl: Any, *, warmups: int = DEFAULT_WARMUPS,
          python: str = sys.executable) -> _Setup:
    """What confirm serves and sends for a results folder, for a benchmark to drive its own rounds
    (benchmarks/client_gap.py): the dataset, both serve scripts, the client's command."""
    return _setup(results_dir, report, wl, warmups=warmups, python=python)


def _start(forked: bool) -> Any:
    """How a round's processes start: through the launcher (which falls back to Popen, saying why,
    for what it cannot fork exactly) or as new processes."""
    from autotune.serve.servers import popen

    if not forked:
        return popen

    def through_launcher(argv: list[str], env: dict[str, str], log_path: Path) -> Any:
        log_path.write_text("")  # the launcher appends
        return run_launcher.launch(argv, env=env, log_path=log_path)

    return through_launcher


def _round(st: _Setup, n: int, rounds: int, side: str, *, ready_timeout_s: float, bench_timeout_s: float,
           forked: bool, say: Say) -> RoundResult:
    """One new server of ``side``, measured by one ``vllm bench serve`` run, then ended."""
    tag, out = f"round-{n}-{side}", st.out
    fork = forked and side in st.commands
    start = _start(fork)
    for stale in out.glob(f"{tag}.*"):
        stale.unlink()
    port = free_port()
    base_url = f"http://{HOST}:{port}"
    say(f"confirm round {n}/{rounds} {side}: starting {st.rel(st.scripts[side])} on port {port}"
        + (" (forked from the launcher)" if fork else ""))
    server_argv = ([*st.commands[side], "--host", HOST, "--port", str(port)] if fork
                   else ["bash", str(st.scripts[side]), "--host", HOST, "--port", str(port)])
    client_log = out / f"{tag}.bench.log"
    # The client starts with the server and sends its first request once /health answers
    # (autotune.vllm_cli, AUTOTUNE_WAIT_FOR); started fresh, its imports (10-16 s) overlap the server's start.
    # and warms the server on requests outside the measured set (autotune.serve.warmup)
    wait = {WAIT_FOR: f"{base_url}/health", WAIT_FOR_S: f"{ready_timeout_s:g}",
            WARMUP_ENV: json.dumps(st.plan.warmup)}
    with client_started([*st.client, "--base-url", base_url, "--save-result", "--result-dir", str(out),
                         "--result-filename", f"{tag}.json", "--label", tag, "--metadata", f"side={side}",
                         f"round={n}"], log_path=client_log, env={**st.env, **wait}, start=start) as client, \
            serving(server_argv, port=port, log_path=out / f"{tag}.log", env=st.env, ready_timeout_s=ready_timeout_s,
                    what=f"the {side} server ({st.rel(st.scripts[side])}, round {n})", start=start) as server:
        finish_client(client, log_path=client_log, timeout_s=bench_timeout_s)
    started = "forked" if isinstance(server.process, run_launcher.Launched) else "fresh"
    data = read_bench(out / f"{tag}.json", expected=len(st.plan.rows))
    r = RoundResult(round=n, side=side, output_tok_s=float(data["output_throughput"]),
                    tpot_ms_p50=_num(data.get("median_tpot_ms")), ttft_ms_p50=_num(data.get("median_ttft_ms")),
                    e2e_ms_p50=_num(data.get("median_e2el_ms")),
                    # vllm bench serve reports the acceptance rate in percent
                    acceptance_rate=_scaled(data.get("spec_decode_acceptance_rate"), 0.01),
                    mean_accepted_length=_num(data.get("spec_decode_acceptance_length")),
                    completed=int(data["completed"]), server_pid=server.pid,
                    duration_s=float(data.get("duration") or 0.0), ready_s=round(server.ready_s, 2), started=started,
                    result_file=f"{CONFIRM_DIR}/{tag}.json", server_log=f"{CONFIRM_DIR}/{tag}.log",
                    bench_log=f"{CONFIRM_DIR}/{tag}.bench.log")
    say(f"confirm round {n}/{rounds} {side}: {r.output_tok_s:.1f} output tok/s "
        f"(tpot p50 {r.tpot_ms_p50 or float('nan'):.1f} ms; server ready in {r.ready_s:.0f} s)")
    return r


def _served(report: dict[str, Any], st: _Setup, done: list[RoundResult], *, rounds: int, warmups: int
            ) -> dict[str, Any]:
    """The served numbers as best.json keeps them, beside the study's claim."""
    from autotune.run import hardware
    from autotune.measure.intervals import UNIT_ROUNDS, paired_t, resolution

    by = {s: sorted((r for r in done if r.side == s), key=lambda r: r.round) for s in SIDES}
    pick_tps, base_tps = [r.output_tok_s for r in by["pick"]], [r.output_tok_s for r in by["baseline"]]
    speedup, lo, hi, _ = paired_t(pick_tps, base_tps)  # round n's pick against round n's baseline
    claimed = report["best"].get("speedup") or {}
    return {
        "rounds": rounds, "order": [f"{r.side}" for r in done], "warmups": warmups,
        "servers": "+".join(sorted({r.started for r in done})),  # forked, fresh, or forked+fresh
        "pick_output_tok_s": pick_tps, "baseline_output_tok_s": base_tps,
        "speedup": speedup, "speedup_lo": _num(lo), "speedup_hi": _num(hi), "interval_unit": UNIT_ROUNDS,
        "resolution": resolution(_num(lo), _num(hi)),
        "pick": _side_summary(by["pick"]), "baseline": _side_summary(by["baseline"]),
        "claimed": {"speedup": _num(claimed.get("output_tok_s")), "lo": _num(claimed.get("output_tok_s_lo")),
                    "hi": _num(claimed.get("output_tok_s_hi"))},
        "per_round": [asdict(r) for r in done],
        "files": {"dataset": f"{CONFIRM_DIR}/{DATASET}", "baseline_script": st.rel(st.scripts["baseline"]),
                  "pick_script": st.rel(st.scripts["pick"]), "results": [r.result_file for r in done],
                  "server_logs": [r.server_log for r in done]},
        "command": report.get("serve_command"), "baseline_command": _command(report["baseline"]["engine_kwargs"]),
        "client": {"command": shlex.join(st.client), "notes": st.plan.notes},
        "vllm_version": hardware.vllm_version(), "platform": st.platform,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def confirm(results_dir: str | Path, *, rounds: int = DEFAULT_ROUNDS, warmups: int = DEFAULT_WARMUPS,
            workload: Any = None, format: str = "auto", output_len: int | None = None, turns: str | None = None,
            drop_too_long: bool = False, python: str | None = None, ready_timeout_s: float = READY_TIMEOUT_S,
            bench_timeout_s: float = BENCH_TIMEOUT_S, launcher: bool = True, say: Say | None = None) -> dict[str, Any]:
    """Serve the pick (``serve.sh``) and the baseline in rounds in ABBA order, a new server each,
    measure each with ``vllm bench serve``, and write the served numbers into best.json.

    ``launcher``: fork servers and clients from autotune's launcher (the one running, else one
    started for this step); False starts each as a new process, as users start `vllm serve`.

    ``workload``: a ``Workload``, a path, or None for best.json's ``workload``; ``format``,
    ``output_len``, ``turns`` and ``drop_too_long`` read it as `autotune search` did. ``python``:
    the interpreter for the launcher (default ``$AUTOTUNE_PYTHON`` or this one). Returns the
    ``served`` object now under ``best`` in best.json. Raises BadInput for results that cannot be
    confirmed, ServeFailed (exit 1) when a server or the client fails; best.json then records the
    failure under ``best.served.failure``.
    """
    from autotune.core.study_report import load_report

    if rounds < 1:
        raise BadInput(f"--rounds: expected at least 1, got {rounds}")
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
    try:
        with run_launcher.active(launcher, python=python):
            forked = launcher and bool(os.environ.get(run_launcher.ENV_KEY))  # else it did not start (said)
            for n in range(1, rounds + 1):
                for side in round_order(n):  # ABBA: a drift over the run weighs on both sides alike
                    done.append(_round(st, n, rounds, side, ready_timeout_s=ready_timeout_s,
                                       bench_timeout_s=bench_timeout_s, forked=forked, say=say))
    except ServeFailed as e:
        (st.out / "failure.json").write_text(json.dumps({"error": type(e).__name__, "message": str(e)}, indent=2)
                                             + "\n")
        _record(results_dir, {"failure": str(e), "rounds_done": [asdict(r) for r in done],
                              "files": {"failure": f"{CONFIRM_DIR}/failure.json"}}, None)
        raise
    (st.out / "failure.json").unlink(missing_ok=True)
    served = _served(report, st, done, rounds=rounds, warmups=warmups)
    claimed = served["claimed"]
    line = verdict((served["speedup"], served["speedup_lo"], served["speedup_hi"]),
                   (claimed["speedup"], claimed["lo"], claimed["hi"]), resolution=served["resolution"],
                   rounds=rounds) if claimed["speedup"] is not None else None
    _record(results_dir, served, line)
    return served


def _command(engine_kwargs: dict[str, Any]) -> str:
    from autotune.serve.export import command

    return command(engine_kwargs)


def _record(results_dir: Path, served: dict[str, Any], line: str | None) -> None:
    """Write ``served`` under ``best`` and the one-line verdict at the top of best.json (keys the
    StudyReport declares), and the served section of report.md."""
    from autotune.core.study_report import dumps, load_report, with_served

    path = results_dir / "best.json"
    report = with_served(load_report(path), served, line)
    _write_atomic(path, dumps(report))
    _update_markdown(results_dir, report)
