"""Confirm's served rounds as records: one server instance measured by ``vllm bench serve`` (its passes
combined), the served numbers best.json keeps, the pick's figure they make (the served rounds are the
holdout: measured after the choice, they cannot change it), and report.md's served section.
"""

from __future__ import annotations

import json
import shlex
import statistics
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune.measure.coalescing import stream_coalesced
from autotune.serve.bench_client import _num, _scaled, bench_requests, read_bench
from autotune.serve.served import served_line

CONFIRM_DIR = "confirm"  # under the results folder: scripts, dataset, server logs, bench results
SIDES = ("baseline", "pick")
SECTION = "## Served (vllm serve + vllm bench serve)"


@dataclass(frozen=True)
class RoundResult:
    """One server instance measured by ``vllm bench serve``: its passes on the same server combined
    (tokens over seconds, every pass starting with empty caches: autotune.vllm_cli)."""

    round: int
    side: str
    output_tok_s: float
    tpot_ms_p50: float | None
    ttft_ms_p50: float | None
    e2e_ms_p50: float | None
    acceptance_rate: float | None  # accepted / drafted tokens, from the server's counters (speculative side)
    mean_accepted_length: float | None
    completed: int
    duration_s: float  # the measured seconds, every pass together
    ready_s: float  # from start to a healthy /health
    started: str  # the server: "forked" from autotune's launcher, or "fresh" (a new process)
    server_pid: int  # also its process-group id, ended and checked empty after the round
    result_file: str  # relative to the results folder (its first pass's file where it ran several)
    server_log: str
    bench_log: str
    passes: int = 1
    pass_tok_s: tuple[float, ...] = ()  # each pass's output tok/s
    # why tpot_ms_p50 is None: every pass's stream delivered tokens in bursts (autotune.measure.coalescing)
    tpot_not_measured: str | None = None


def read_passes(files: list[Path], *, expected: int) -> dict[str, Any]:
    """One server's passes (``vllm bench serve --save-result`` JSONs, each checked complete) as one
    result: output tok/s = every pass's output tokens over every pass's seconds; medians of the
    latencies; the acceptance over every pass. TPOT only from the passes whose stream timed tokens
    (``coalesced_pass``); where none did, ``tpot_not_measured`` says why."""
    runs = [read_bench(f, expected=expected) for f in files]
    bursts = [coalesced_pass(r) for r in runs]
    timed = [r for r, why in zip(runs, bursts) if why is None]
    tokens = sum(float(r.get("total_output_tokens") or r["output_throughput"] * r["duration"]) for r in runs)
    seconds = sum(float(r.get("duration") or 0.0) for r in runs)

    def med(key: str, scale: float = 1.0, of: list[dict[str, Any]] = runs) -> float | None:
        vals = [_scaled(r.get(key), scale) for r in of]
        vals = [v for v in vals if v is not None]
        return float(statistics.median(vals)) if vals else None

    return {"output_throughput": tokens / seconds if seconds > 0 else float(runs[0]["output_throughput"]),
            "duration": seconds, "completed": sum(int(r["completed"]) for r in runs),
            "median_tpot_ms": med("median_tpot_ms", of=timed), "median_ttft_ms": med("median_ttft_ms"),
            "tpot_not_measured": None if timed else f"tokens reached the client in bursts ({len(runs)} of "
                                                    f"{len(runs)} passes)",
            "median_e2el_ms": med("median_e2el_ms"),
            # vllm bench serve reports the acceptance rate in percent
            "acceptance_rate": med("spec_decode_acceptance_rate", 0.01),
            "acceptance_length": med("spec_decode_acceptance_length"),
            "pass_tok_s": tuple(float(r["output_throughput"]) for r in runs)}


def coalesced_pass(data: dict[str, Any]) -> str | None:
    """Why one pass's stream did not time its tokens (autotune.measure.coalescing.stream_coalesced on its
    requests' chunk times, read from ``--save-detailed``), or None where it did or cannot be judged (a result
    saved without per-request detail keeps its TPOT, as before the rule)."""
    requests = bench_requests(data)
    return None if requests is None else stream_coalesced(requests)


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(statistics.median(vals)) if vals else None


def _side_summary(rounds: list[RoundResult]) -> dict[str, Any]:
    unmeasured = [r for r in rounds if r.tpot_ms_p50 is None and r.tpot_not_measured]
    return {"output_tok_s": _median([r.output_tok_s for r in rounds]),
            "tpot_ms_p50": _median([r.tpot_ms_p50 for r in rounds]),  # the rounds whose streams timed tokens
            "tpot_not_measured": f"tokens reached the client in bursts in every pass of {len(rounds)} round(s)"
            if rounds and len(unmeasured) == len(rounds) else None,
            "ttft_ms_p50": _median([r.ttft_ms_p50 for r in rounds]),
            "e2e_ms_p50": _median([r.e2e_ms_p50 for r in rounds]),
            "acceptance_rate": _median([r.acceptance_rate for r in rounds]),
            "mean_accepted_length": _median([r.mean_accepted_length for r in rounds])}


def served_numbers(report: dict[str, Any], setup: Any, done: list[RoundResult], *, warmups: int, stopped: str,
                   min_pass_s: float, level: float = 0.95) -> dict[str, Any]:
    """The served numbers as best.json keeps them (``best.served``), beside the study's claim.
    ``setup``: confirm's (its scripts, client and notes); ``stopped``: why the rounds stopped."""
    from autotune.measure.intervals import UNIT_ROUNDS, paired_t, resolution
    from autotune.run import hardware

    by = {s: sorted((r for r in done if r.side == s), key=lambda r: r.round) for s in SIDES}
    pick_tps, base_tps = [r.output_tok_s for r in by["pick"]], [r.output_tok_s for r in by["baseline"]]
    # Round n's pick against round n's baseline; ``level``: the t level that covers 95% under the
    # sequential rule that stopped the rounds (autotune.measure.sequential.LEVEL)
    speedup, lo, hi, n = paired_t(pick_tps, base_tps, level=level)
    claimed = report["best"].get("speedup") or {}
    return {
        "rounds": n, "order": [f"{r.side}" for r in done], "warmups": warmups, "stopped": stopped, "t_level": level,
        "min_pass_s": min_pass_s, "passes": {s: [r.passes for r in by[s]] for s in SIDES},
        "servers": "+".join(sorted({r.started for r in done})),  # forked, fresh, or forked+fresh
        "pick_output_tok_s": pick_tps, "baseline_output_tok_s": base_tps,
        "speedup": speedup, "speedup_lo": _num(lo), "speedup_hi": _num(hi), "interval_unit": UNIT_ROUNDS,
        "resolution": resolution(_num(lo), _num(hi)),
        "pick": _side_summary(by["pick"]), "baseline": _side_summary(by["baseline"]),
        "claimed": {"speedup": _num(claimed.get("output_tok_s")), "lo": _num(claimed.get("output_tok_s_lo")),
                    "hi": _num(claimed.get("output_tok_s_hi")), "unit": claimed.get("output_tok_s_unit")},
        "per_round": [asdict(r) for r in done],
        "files": {"dataset": f"{CONFIRM_DIR}/{setup.dataset_name}", "baseline_script": setup.rel(setup.scripts["baseline"]),
                  "pick_script": setup.rel(setup.scripts["pick"]), "results": [r.result_file for r in done],
                  "server_logs": [r.server_log for r in done]},
        "command": report.get("serve_command"), "baseline_command": setup.baseline_command,
        "client": {"command": shlex.join(setup.client), "notes": setup.plan.notes},
        "vllm_version": hardware.vllm_version(), "platform": setup.platform,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def served_figure(served: dict[str, Any], load: str | None) -> dict[str, Any]:
    """best.json's ``figure`` from the served rounds: the headline once confirm ran."""
    from autotune.measure.intervals import UNIT_ROUNDS

    n = int(served.get("rounds") or 0)
    ok = n >= 2 and served.get("speedup_lo") is not None
    return {"source": "served", "status": "measured" if ok else "not measured",
            "why": None if ok else f"{n} served round(s): no interval from fewer than 2",
            "speedup": served.get("speedup"), "lo": served.get("speedup_lo"), "hi": served.get("speedup_hi"),
            "pairs": n, "unit": UNIT_ROUNDS, "resolution": served.get("resolution"), "load": load,
            "stopped": f"stopped: {served['stopped']}" if served.get("stopped") else None}


def update_markdown(results_dir: Path, report: dict[str, Any]) -> None:
    """Replace (or add) the served section of report.md, and its ``best:`` line with the served figure."""
    from autotune.results.text import headline

    path = results_dir / "report.md"
    if not path.is_file():
        return
    text = path.read_text()
    head = text.split("\n" + SECTION + "\n")[0].rstrip("\n") + "\n"
    lines_before = head.splitlines()
    head = "\n".join(f"**{headline(report)}.**" if x.startswith(("**best:", "**pick:")) else x
                     for x in lines_before) + "\n"
    sv = report["best"]["served"]
    lines = ["", SECTION, "", f"**{headline(report)}.**", "", served_line(report) or ""]
    if not sv.get("failure"):
        lines += ["", "| round | baseline tok/s | pick tok/s |", "|---|---|---|"]
        lines += [f"| {i + 1} | {b:.1f} | {p:.1f} |"
                  for i, (b, p) in enumerate(zip(sv["baseline_output_tok_s"], sv["pick_output_tok_s"]))]
        lines += ["", f"Result files: `{CONFIRM_DIR}/`."] + [f"- note: {n}" for n in sv["client"]["notes"]]
    path.write_text(head + "\n".join(lines) + "\n")


def write_failure(out: Path, e: Exception) -> None:
    (out / "failure.json").write_text(json.dumps({"error": type(e).__name__, "message": str(e)}, indent=2) + "\n")


def tok_s_by_side(done: list[RoundResult]) -> dict[str, list[float]]:
    """Each side's output tok/s, round by round (round n's pick pairs with round n's baseline)."""
    return {s: [r.output_tok_s for r in sorted(done, key=lambda r: r.round) if r.side == s] for s in SIDES}


def standing(done: list[RoundResult], rule: Any, elapsed_s: float) -> dict[str, Any]:
    """Where confirm stands after the rounds ``done`` (``rule``: its autotune.measure.sequential.Sequential):
    rounds a side, the served speedup over the complete pairs with its interval and resolution (None
    before two pairs), against the target and the time allowed."""
    from autotune.measure.intervals import paired_t, resolution as relative

    tps = tok_s_by_side(done)
    n = min(len(tps["pick"]), len(tps["baseline"]))
    x, lo, hi, _ = paired_t(tps["pick"][:n], tps["baseline"][:n], level=rule.level) if n else (None, None, None, 0)
    return {"round": done[-1].round if done else 0, "side": done[-1].side if done else None, "pairs": n,
            "speedup": x, "lo": lo if n >= 2 else None, "hi": hi if n >= 2 else None,
            "resolution": relative(lo, hi) if n >= 2 else None, "target": rule.target, "rounds": rule.rounds,
            "max_rounds": rule.max_rounds, "elapsed_s": elapsed_s, "max_s": rule.max_s}
