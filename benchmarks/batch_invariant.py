"""Check: does vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``) run on this build (issue 50)?

If it made a speculative engine's greedy outputs equal to the baseline's bit for bit, autotune could
offer a strict mode: any differing token a fault, no numerics threshold. This starts the demo target
(``--dtype``) with the mode on, as a study's baseline worker would (in-process engine core), and
records whether it starts and serves, and if not the failure, the requests' errors and the worker
log's last traceback frames; then, if it served, whether ngram k=3's greedy outputs equal the
baseline's with the mode on. Saved to
``--out`` (benchmarks/data/batch_invariant_cpu.json). Engines: run it under the engine lock.

    flock /tmp/autotune-engine.lock .venv/bin/python benchmarks/batch_invariant.py
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import tempfile
from pathlib import Path
from typing import Any

from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.core.workload import load_workload
from autotune.measure.config import StudyConfig
from autotune.run.engine import UNTIMED_ENV
from autotune.run.evaluate import trial_job
from autotune.run.worker import run_trial

MODE = {"VLLM_BATCH_INVARIANT": "1"}


def attempt(name: str, params: dict[str, Any], cfg: StudyConfig, wl: Any, root: Path) -> dict[str, Any]:
    out = run_trial(trial_job(Candidate(params), wl, cfg), root / name, timeout_s=600, env={**UNTIMED_ENV, **MODE})
    log = Path(out.log_path).read_text(errors="replace").splitlines()
    body = [ln.split("]", 1)[-1].strip() for ln in log]  # vLLM's "(EngineCore ...) ERROR ... [core.py:N]" prefix off
    first = next((i for i, ln in enumerate(body) if ln.split(":")[0].endswith("Error")
                  and not ln.startswith("EngineDeadError")), None)  # the root cause, before the engine died
    frames = [] if first is None else [ln for ln in body[:first] if ln.startswith("File ")][-3:] + [body[first]]
    got: dict[str, Any] = {"started": out.raw is not None, "failure": out.failure, "root_cause": frames}
    if out.raw is not None:  # the engine started; each request's error, where it failed
        recs = out.raw["windows"][0]["requests"]
        got["outputs"] = {r["id"]: r["token_ids"] for r in recs}
        got["request_errors"] = sorted({(r["error"] or "")[:300] for r in recs if r["error"]})
        got["served"] = all(r["token_ids"] and not r["error"] for r in recs)
    return got


def main() -> None:
    ap = harness.parser(__doc__, out="batch_invariant_cpu.json")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="batch_invariant-"))
    wl = load_workload("examples/smoke.jsonl")
    cfg = StudyConfig(name="batch_invariant", results_dir=root, repeats=1, warmup=0, samples=0,
                      settings=Settings(model=str(demo.TARGET), dtype=args.dtype, max_model_len=demo.MAX_MODEL_LEN,
                                        kv_cache_memory_bytes=demo.KV_CACHE_BYTES))
    result: dict[str, Any] = {"dtype": args.dtype, "env": MODE, "workload": "examples/smoke.jsonl"}
    result["baseline"] = attempt("baseline", {"method": "none", "enforce_eager": True}, cfg, wl, root)
    if result["baseline"].get("served"):
        ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
                 "enforce_eager": True}
        result["ngram"] = attempt("ngram", ngram, cfg, wl, root)
        result["identical"] = result["ngram"].get("outputs") == result["baseline"].get("outputs")
    harness.save(args.out, result)
    b = result["baseline"]
    print(f"baseline with {MODE}: started={b['started']}, served={b.get('served')}, failure={b['failure']}, "
          f"request errors={b.get('request_errors')}, root cause={b['root_cause']}")


if __name__ == "__main__":
    main()
