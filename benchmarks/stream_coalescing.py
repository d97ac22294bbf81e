"""Analysis: is the baseline's served throughput bimodal, and does the stream's coalescing explain it?

On 2 cores, `vllm serve`'s API process either keeps up with the engine and sends each generated
token as its own SSE chunk (TPOT at the client ~2-3 ms), or falls behind and merges many tokens
into one chunk (TPOT ~0). A speculative config emits several tokens a step, so it sends few chunks
either way; the baseline sends one a token. This reads the folders `benchmarks/pick_stability.py`
left (each run's `demo/best.json`: the baseline's windows in the study, every engine instance, and
`confirm`'s rounds served with `vllm bench serve`) and relates each baseline window's throughput
to its TPOT p50. No engine runs here:

    .venv/bin/python benchmarks/stream_coalescing.py /tmp/pick_stability-XXXX [--out benchmarks/data/stream_coalescing.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

COALESCED_MS = 0.5  # a client TPOT p50 below this: tokens arrived merged, not one a chunk


def rows(folder: Path) -> list[dict]:
    out = []
    for best in sorted(folder.glob("run*/demo/best.json")):
        r = json.loads(best.read_text())
        run = best.parts[-3]
        m = (r.get("baseline") or {}).get("measurement") or {}
        for tok, tpot in zip(m.get("output_tok_s_windows") or [], m.get("tpot_ms_p50_windows") or []):
            out.append({"run": run, "source": "study window", "output_tok_s": tok, "tpot_ms_p50": tpot})
        for p in ((r.get("best") or {}).get("served") or {}).get("per_round") or []:
            if p["side"] == "baseline":
                out.append({"run": run, "source": "confirm round", "output_tok_s": p["output_tok_s"],
                            "tpot_ms_p50": p["tpot_ms_p50"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", default="benchmarks/data/stream_coalescing.json")
    args = ap.parse_args()
    data = rows(args.folder)
    groups = {"coalesced": [d["output_tok_s"] for d in data if d["tpot_ms_p50"] < COALESCED_MS],
              "one token a chunk": [d["output_tok_s"] for d in data if d["tpot_ms_p50"] >= COALESCED_MS]}
    summary = {k: {"n": len(v), "median_tok_s": statistics.median(v) if v else None,
                   "min": min(v) if v else None, "max": max(v) if v else None} for k, v in groups.items()}
    if all(groups.values()):
        summary["coalesced_over_streamed"] = summary["coalesced"]["median_tok_s"] / summary["one token a chunk"]["median_tok_s"]
    for d in data:
        print(f"{d['run']:<5} {d['source']:<14} {d['output_tok_s']:7.1f} tok/s  tpot p50 {d['tpot_ms_p50']:6.3f} ms")
    print(json.dumps(summary, indent=2))
    Path(args.out).write_text(json.dumps({"coalesced_below_ms": COALESCED_MS, "rows": data, "summary": summary},
                                         indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
