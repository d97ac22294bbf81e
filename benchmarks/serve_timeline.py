"""Benchmark: one ``vllm serve`` start of the demo target's baseline, its log lines stamped with the
seconds since the start, to show where the start goes (which process imports vLLM when). Route
listings and shutdown noise are left out.

    .venv/bin/python benchmarks/serve_timeline.py [--out benchmarks/data/serve_timeline.txt]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune import demo  # noqa: E402
from autotune.core.candidate import Candidate, Settings  # noqa: E402
from autotune.serve.export import serve_argv  # noqa: E402
from autotune.serve.servers import HOST, end_pgid, free_port, healthy  # noqa: E402

KEEP = ("Triton is installed", "Initializing a V1 LLM engine", "ompmultiprocessing.py:185] \tlocal_rank",
        "Starting to load model", "Loading weights took", "KV cache size", "Application startup complete",
        "non-default args", "Started server process")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/data/serve_timeline.txt"))
    a = ap.parse_args()
    settings = Settings(model=str(demo.TARGET), dtype=demo.DTYPE, max_model_len=demo.MAX_MODEL_LEN,
                        gpu_memory_utilization=0.3)
    argv = serve_argv(Candidate({"method": "none", "enforce_eager": True}).engine_kwargs(settings))
    port, lines = free_port(), []
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-u", "-m", "autotune.vllm_cli", "serve", *argv, "--host", HOST,
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            if any(k in line for k in KEEP):
                lines.append(f"{time.perf_counter() - t0:7.2f}  {line.rstrip()[:160]}")

    threading.Thread(target=read, daemon=True).start()
    try:
        while not healthy(f"http://{HOST}:{port}/health"):
            if proc.poll() is not None:
                raise SystemExit("vllm serve exited before it was ready")
            time.sleep(0.1)
        lines.append(f"{time.perf_counter() - t0:7.2f}  healthy")
    finally:
        end_pgid(proc.pid)
    a.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"saved {a.out}")


if __name__ == "__main__":
    main()
