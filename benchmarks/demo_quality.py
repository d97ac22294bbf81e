"""Benchmark: does the demo target do the corpus tasks? Real engine, greedy (not a test).

Runs the bundled target through the same worker path a study uses (no speculation, one window at
concurrency 8) on the bundled examples and on a fresh seeded set that the training never saw, and
judges every output with ``autotune.demo.quality``: json/config edits must equal the input with
exactly the asked change (compared parsed), log summaries must count the log's lines, support
answers must name the question's order, product and city. Then the draft's acceptance (draft_model
k=3 and ngram k=3 lookup 2..4 on json_edit, vLLM's counters, one window each).

    .venv/bin/python benchmarks/demo_quality.py [--fresh 64] [--no-speculation] [--pair DIR]

``--pair`` judges a retrained pair (a folder with ``target/`` and ``draft/``, as
``scripts/train_demo_models.py --out`` writes) before it replaces the bundled one.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.demo.corpus import fresh_examples
from autotune.demo.quality import check, rates
from autotune.core.load import LoadPattern
from autotune.measure.config import StudyConfig
from autotune.run.evaluate import run_and_evaluate
from autotune.core.workload import load_workload

FRESH_SEED = 2027


def fresh_workload(path: Path, n: int) -> Path:
    """A JSONL workload of ``n`` held-out corpus prompts (all four domains), greedy."""
    rows = [{"id": f"fresh-{i:03d}", "prompt": e.prompt, "max_tokens": 192, "temperature": 0.0}
            for i, e in enumerate(fresh_examples(n, seed=FRESH_SEED))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def outputs(workload: Path, params: dict[str, Any], work: Path, *, concurrency: int = 8,
            pair: Path = demo.MODELS) -> dict[str, Any]:
    """One worker run of the demo target on ``workload``: texts by request id, and the measurement."""
    wl = load_workload(workload)
    # the KV cache a study sizes for the demo (0.3 of the host's RAM zero-filled costs seconds a start)
    settings = Settings(model=str(pair / "target"), draft_model=str(pair / "draft"), max_model_len=demo.MAX_MODEL_LEN,
                        kv_cache_memory_bytes=demo.KV_CACHE_BYTES, dtype=demo.DTYPE)
    cfg = StudyConfig(name="quality", results_dir=work, settings=settings, load=LoadPattern(concurrency=concurrency),
                      repeats=1, warmup=2, samples=0, trial_timeout_s=900)
    out, ev = run_and_evaluate(Candidate({**params, "enforce_eager": True}), wl, cfg, work / Candidate(params).method)
    if ev is None:
        raise SystemExit(f"{workload}: the engine run failed: {out.failure}")
    prompts = {r.id: {"prompt": r.prompt, "messages": r.messages} for r in wl.requests}
    return {"texts": {o["id"]: o["text"] for o in ev.reference.outputs}, "prompts": prompts,
            "measurement": ev.measurement}


def judged(run: dict[str, Any]) -> dict[str, Any]:
    results, failures = [], []
    for rid, text in run["texts"].items():
        req = run["prompts"][rid]
        prompt = req.get("prompt") or req["messages"][-1]["content"]
        r = check(prompt, text)
        results.append(r)
        if not r.ok:
            failures.append(f"{rid}: {r.reason}")
    return {"rates": rates(results), "n": len(results), "failures": failures}


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--fresh", type=int, default=64, help="held-out corpus prompts (all four domains)")
    ap.add_argument("--no-speculation", action="store_true", help="skip the acceptance runs")
    ap.add_argument("--pair", type=Path, default=demo.MODELS, help="a pair's folder (target/, draft/)")
    args = ap.parse_args()
    pair = args.pair.resolve()
    print(f"pair: {pair}")
    work = Path(tempfile.mkdtemp())
    sets = {"examples/json_edit.jsonl": Path("examples/json_edit.jsonl"),
            "examples/support_chat.jsonl": Path("examples/support_chat.jsonl"),
            f"fresh set (seed {FRESH_SEED}, {args.fresh})": fresh_workload(work / "fresh.jsonl", args.fresh)}
    t0 = time.monotonic()
    for name, path in sets.items():
        j = judged(outputs(path, {"method": "none"}, work / path.stem, pair=pair))
        shown = ", ".join(f"{k} {v:.1%}" for k, v in j["rates"].items())
        print(f"{name}: {j['n']} requests: {shown}")
        for f in j["failures"][:5]:
            print(f"    {f}")
    if not args.no_speculation:
        for params in ({"method": "draft_model", "num_speculative_tokens": 3},
                       {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                        "prompt_lookup_max": 4}):
            m = outputs(sets["examples/json_edit.jsonl"], params, work / "spec", concurrency=1,
                        pair=pair)["measurement"]
            pos = " ".join(f"{x:.3f}" for x in m["acceptance_by_pos"])
            print(f"{Candidate(params).label} on json_edit: acceptance {m['acceptance_rate']:.3f}, mean accepted "
                  f"length {m['mean_accepted_length']:.2f}, by position {pos}")
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
