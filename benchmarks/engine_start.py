"""Benchmark: where a served trial's engine start goes (issue 28, "pay the import once").

A served trial's ``engine_init_s`` is the time from starting the candidate's ``vllm serve`` to its
first healthy ``/health``. Meanwhile the trial's own worker imports vLLM too, to resolve the same
arguments with vLLM's parser and config (token budget, resolved speculation) and to load the
tokenizer. On a 2-core machine the two compete. This measures, on the demo target's baseline config
(eager), in alternating rounds:

- ``import_vllm_s``: a fresh ``python -c "import vllm"``;
- ``worker_side_s``: a fresh process doing what the worker does besides serving (import vLLM,
  ``create_engine_config`` of the serve arguments, load the tokenizer);
- ``serve_alone_s``: ``vllm serve`` (through autotune's CPU stand-in) to healthy, nothing else running;
- ``serve_with_worker_s``: the same while the worker side runs beside it, as a trial does today.

- ``inprocess_start_s``: vLLM's AsyncLLM started in a fresh process as an in-process trial starts it
  (engine core and CPU worker spawned, each importing vLLM), from after ``import vllm`` to ready;
- ``inprocess_one_process_s``: the same with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engine core and
  worker in the one process), as autotune starts engines that time nothing (a draft's trace); each
  then takes a teacher-forced prompt-logprob pass of the draft model, and ``same_argmax`` says
  whether the two gave the same argmax at every position.

``serve_with_worker_s - serve_alone_s`` is what the worker's own vLLM import costs the start on this
machine; ``worker_side_s`` what a worker process that had imported vLLM once would no longer pay.

    .venv/bin/python benchmarks/engine_start.py [--rounds 3] [--out benchmarks/data/engine_start.json]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
from autotune import demo
from autotune.core.candidate import Candidate, Settings
from autotune.serve.export import serve_argv
from autotune.serve.servers import HOST, end_pgid, free_port, healthy

WORKER_SIDE = """
import json, sys
from vllm.usage.usage_lib import UsageContext
from autotune.vllm_cli import engine_args_from_serve
from autotune.core.context import load_tokenizer
argv = json.loads(sys.argv[1])
engine_args_from_serve(argv).create_engine_config(UsageContext.OPENAI_API_SERVER)
load_tokenizer(argv[0])
"""


IN_PROCESS = """
import asyncio, json, sys, time
from autotune import demo
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
rows = [json.loads(x) for x in open("examples/json_edit.jsonl").read().splitlines()[:6]]


async def go():
    t0 = time.perf_counter()
    e = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(demo.DRAFT), dtype=demo.DTYPE, enforce_eager=True,
                                                  max_model_len=demo.MAX_MODEL_LEN, gpu_memory_utilization=0.3))
    start = time.perf_counter() - t0
    p = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False,
                       output_kind=RequestOutputKind.FINAL_ONLY)
    argmax = []
    for i, r in enumerate(rows):
        ids = e.get_tokenizer().encode(r["prompt"])
        async for f in e.generate(TokensPrompt(prompt_token_ids=ids), p, f"r{i}"):
            pass
        argmax.append([list(d)[-1] for d in f.prompt_logprobs[1:]])
    e.shutdown()
    print("RESULT " + json.dumps({"start_s": start, "argmax": argmax}))


if __name__ == "__main__":
    asyncio.run(go())
"""


def _in_process(one_process: bool) -> dict:
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if one_process else "1"}
    with tempfile.NamedTemporaryFile("w", suffix=".py") as f:  # spawn re-imports __main__: a file, not -c
        f.write(IN_PROCESS)
        f.flush()
        got = subprocess.run([sys.executable, f.name], capture_output=True, text=True, env=env, check=True,
                             cwd=harness.ROOT)
    return json.loads(next(ln for ln in got.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])


def _timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _serve(argv: list[str], log: Path, *, beside: list[str] | None = None) -> float:
    """Seconds from starting ``vllm serve`` to a healthy /health (with ``beside`` run meanwhile)."""
    port = free_port()
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "autotune.vllm_cli", "serve", *argv, "--host", HOST,
                                 "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    side = subprocess.Popen(beside, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if beside else None
    try:
        while not healthy(f"http://{HOST}:{port}/health"):
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited: see {log}")
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"vllm serve not ready after 600 s: see {log}")
            time.sleep(0.1)
        return time.perf_counter() - t0
    finally:
        if side is not None:
            side.wait()
        end_pgid(proc.pid)


def main() -> None:
    ap = harness.parser(__doc__, out="engine_start.json", summary=True)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    settings = Settings(model=str(demo.TARGET), dtype=demo.DTYPE, max_model_len=demo.MAX_MODEL_LEN,
                        gpu_memory_utilization=0.3)
    argv = serve_argv(Candidate({"method": "none", "enforce_eager": True}).engine_kwargs(settings))
    worker = [sys.executable, "-c", WORKER_SIDE, json.dumps(argv)]
    got: dict[str, list[float]] = {k: [] for k in ("import_vllm_s", "worker_side_s", "serve_alone_s",
                                                   "serve_with_worker_s", "inprocess_start_s",
                                                   "inprocess_one_process_s")}
    same_argmax = True
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = ["alone", "with"] if r % 2 == 0 else ["with", "alone"]  # ABBA across rounds
            got["import_vllm_s"].append(_timed([sys.executable, "-c", "import vllm"]))
            got["worker_side_s"].append(_timed(worker))
            for kind in order:
                log = Path(tmp) / f"serve-{r}-{kind}.log"
                key = "serve_alone_s" if kind == "alone" else "serve_with_worker_s"
                got[key].append(_serve(argv, log, beside=worker if kind == "with" else None))
            runs = {one: _in_process(one) for one in ([False, True] if r % 2 == 0 else [True, False])}
            got["inprocess_start_s"].append(runs[False]["start_s"])
            got["inprocess_one_process_s"].append(runs[True]["start_s"])
            same_argmax = same_argmax and runs[False]["argmax"] == runs[True]["argmax"]
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in got.items()), flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    out = {"rounds": a.rounds, "seconds": got, "median_s": med,
           "worker_import_cost_s": med["serve_with_worker_s"] - med["serve_alone_s"],
           "ratio_serve_with_worker_to_alone": med["serve_with_worker_s"] / med["serve_alone_s"],
           "ratio_one_process_to_inprocess_start": med["inprocess_one_process_s"] / med["inprocess_start_s"],
           "same_argmax": same_argmax}
    harness.save(a.out, out, indent=2)
    print(json.dumps({k: out[k] for k in ("median_s", "worker_import_cost_s", "ratio_serve_with_worker_to_alone",
                                          "ratio_one_process_to_inprocess_start", "same_argmax")},
                     indent=2))


if __name__ == "__main__":
    main()
