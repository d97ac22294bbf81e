"""Benchmark: both servers up at once, blocks interleaved: does the served ratio keep its value and lose its spread? (issue 49)

`autotune confirm` serves the pick and the baseline one after another, a new server each, so each
round's ratio carries whatever moved between the two servers' passes (fresh instance, machine state)
and each round pays two starts. The other design: both servers up, measured in blocks in ABBA order
on the same machine state, the idle one beside. This measures, on a finished study folder:

- per pair of instances, ``--blocks`` blocks in ABBA order with both servers up (each block one
  server's passes of the workload until ``min_pass_s`` measured seconds, its caches emptied first), so
  that the spread of the block ratios inside a pair can be set beside the spread of the pairs' ratios;
- the idle server's effect on each side: every pair also measures its first server alone before the
  second starts, and its second server alone after the first has ended (the roles swap from pair to
  pair), so ``beside / alone`` is read on both sides, and the ratio's bias as their quotient.

    .venv/bin/python benchmarks/confirm_interleave.py RESULTS [--pairs 4] [--blocks 8] [--out ...]
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import harness
from autotune.core.study_report import load_report
from autotune.gate import confirm
from autotune.gate.served_rounds import read_passes
from autotune.measure.intervals import abba
from autotune.run import launcher as run_launcher
from autotune.serve.servers import client_started, finish_client, free_port, serving
from autotune.serve.warmup import warm_up
from autotune.vllm_cli import PASSES_ENV, pass_name, reset_caches


def main() -> None:
    ap = harness.parser(__doc__, out="confirm_interleave.json")
    ap.add_argument("results")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--min-pass-s", type=float, default=6.0)
    args = ap.parse_args()
    results = Path(args.results)
    report = load_report(results)
    wl = confirm.read_workload(report)
    st = confirm.setup(results, report, wl)
    out = st.out / "interleave"
    out.mkdir(exist_ok=True)
    rows: list[dict[str, Any]] = []
    t_start = time.monotonic()

    def block(side: str, url: str, tag: str, phase: str, pair: int) -> None:
        reset_caches(url, drafter=st.stateful[side])
        for stale in out.glob(f"{tag}.*"):
            stale.unlink()
        env = {**st.env, PASSES_ENV: json.dumps({"min_s": args.min_pass_s, "max": confirm.MAX_PASSES,
                                                 "drafter": st.stateful[side]})}
        log = out / f"{tag}.bench.log"
        t0 = time.monotonic()
        with client_started([*st.client, "--base-url", url, "--save-result", "--result-dir", str(out),
                             "--result-filename", f"{tag}.json", "--label", tag], log_path=log, env=env,
                            start=confirm.starter(True)) as c:
            finish_client(c, log_path=log)
        files = [out / pass_name(f"{tag}.json", k) for k in range(1, confirm.MAX_PASSES + 1)]
        data = read_passes([f for f in files if f.is_file()], expected=len(st.plan.rows))
        rows.append({"pair": pair, "side": side, "phase": phase, "tag": tag,
                     "output_tok_s": round(float(data["output_throughput"]), 2),
                     "measured_s": round(float(data["duration"]), 2), "block_s": round(time.monotonic() - t0, 2),
                     "t_s": round(time.monotonic() - t_start, 1)})
        print(json.dumps(rows[-1]), flush=True)

    def start(stack: ExitStack, side: str, pair: int) -> str:
        port = free_port()
        fork = side in st.commands
        argv, env = st.server(side, port, fork=fork)
        srv = stack.enter_context(serving(argv, port=port, log_path=out / f"pair-{pair}-{side}.log", env=env,
                                          start=confirm.starter(fork)))
        warm_up(srv.base_url, report["best"]["engine_kwargs"]["model"], st.plan.warmup)
        return srv.base_url

    with run_launcher.active(True, python=sys.executable):
        for p in range(1, args.pairs + 1):
            first, second = ("baseline", "pick") if p % 2 else ("pick", "baseline")
            with ExitStack() as outer:
                urls = {first: start(outer, first, p)}
                block(first, urls[first], f"p{p}-{first}-alone", "alone", p)
                with ExitStack() as inner:
                    urls[second] = start(inner, second, p)
                    for b in range(1, args.blocks // 2 + 1):
                        for side in abba(b, (first, second)):
                            block(side, urls[side], f"p{p}-b{b}-{side}", "beside", p)
                    outer.close()  # the first server ends; the second is measured alone
                    block(second, urls[second], f"p{p}-{second}-alone", "alone", p)

    summary = summarise(rows)
    print(json.dumps(summary, indent=1))
    harness.save(args.out, {"results": str(results), "pairs": args.pairs, "blocks": args.blocks,
                            "min_pass_s": args.min_pass_s, "rows": rows, "summary": summary})


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    pairs = sorted({r["pair"] for r in rows})
    out: dict[str, Any] = {"pairs": []}
    for p in pairs:
        beside = [r for r in rows if r["pair"] == p and r["phase"] == "beside"]
        pick = [r["output_tok_s"] for r in beside if r["side"] == "pick"]
        base = [r["output_tok_s"] for r in beside if r["side"] == "baseline"]
        logs = [math.log(a / b) for a, b in zip(pick, base)]
        alone = {r["side"]: r["output_tok_s"] for r in rows if r["pair"] == p and r["phase"] == "alone"}
        out["pairs"].append({
            "pair": p, "block_log_ratios": [round(x, 4) for x in logs],
            "ratio": round(math.exp(statistics.fmean(logs)), 4) if logs else None,
            "block_log_sd": round(statistics.stdev(logs), 4) if len(logs) > 1 else None,
            "beside_over_alone": {s: round(statistics.fmean(pick if s == "pick" else base) / alone[s], 4)
                                  for s in alone}})
    ratios = [math.log(x["ratio"]) for x in out["pairs"] if x["ratio"]]
    out["pair_log_sd"] = round(statistics.stdev(ratios), 4) if len(ratios) > 1 else None
    sds = [x["block_log_sd"] for x in out["pairs"] if x["block_log_sd"] is not None]
    out["within_pair_block_log_sd"] = round(math.sqrt(statistics.fmean([s * s for s in sds])), 4) if sds else None
    bo = {s: [x["beside_over_alone"][s] for x in out["pairs"] if s in x["beside_over_alone"]]
          for s in ("pick", "baseline")}
    out["beside_over_alone_median"] = {s: round(statistics.median(v), 4) for s, v in bo.items() if v}
    return out


if __name__ == "__main__":
    main()
