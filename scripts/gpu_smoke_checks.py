"""The checks of scripts/gpu_smoke.sh, on a study's results folder: each prints what it saw, and exits 1
with the surprise where a GPU run must not go on (tests/test_gpu_smoke_checks.py plants each case).

    python scripts/gpu_smoke_checks.py study DIR --trials 4 --lossless ngram,eagle3
    python scripts/gpu_smoke_checks.py graphs DIR --platform cuda
    python scripts/gpu_smoke_checks.py runners DIR --platform cuda
    python scripts/gpu_smoke_checks.py pick DIR
    python scripts/gpu_smoke_checks.py tp DIR --size 2

- ``study``: the trials as expected: the baseline COMPLETE, every trial of a lossless method
  (speculation without a lossy knob) COMPLETE and judged correct (status ``ok``), any other trial
  COMPLETE or failed with its reason; ``--trials`` trials besides re-measurements.
- ``graphs``: vLLM's "Graph capturing finished" (vllm/v1/worker/gpu_model_runner.py and
  gpu/model_runner.py) in the baseline's own ``server.log`` (on CUDA; on CPU: that log exists).
- ``runners``: each trial's model runner, as its engine reported it (trials.csv ``model_runner``),
  is the one vLLM picks for its method here (autotune.core.runner): on CUDA, V2 but for suffix.
- ``pick``: confirm served the pick and the baseline (best.json ``served``), and the pick is not the
  baseline (a speculative config won).
- ``tp``: every trial's server was started with tensor parallel ``--size`` (vLLM's own
  "non-default args" line in its ``server.log``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's autotune

from autotune.core import runner  # noqa: E402

LOSSY = {"kv_cache_dtype": ("auto",), "quantization": ("none",), "dtype": ("default",)}


class Surprise(Exception):
    """What a smoke run must not show; its message is the one line the script prints."""


def _trials(folder: Path) -> pd.DataFrame:
    path = folder / "trials.csv"
    if not path.is_file():
        raise Surprise(f"no trials.csv in {folder}")
    f = pd.read_csv(path)
    return f[f["role"].fillna("") != "re-measure"]


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _lossy(row: pd.Series) -> bool:
    return any(_text(row.get(f"param_{k}")) not in ("", *ok) for k, ok in LOSSY.items())


def study(folder: Path, trials: int, lossless: list[str]) -> list[str]:
    f = _trials(folder)
    seen = []
    for _, r in f.iterrows():
        why = "" if r["state"] == "COMPLETE" else f": {_text(r.get('failure'))}"
        seen.append(f"trial {r['trial']} {r['label']} {r['state']} status={_text(r.get('status')) or '-'}"
                    f" runner={_text(r.get('model_runner')) or '-'}{why}")
    base = f[f["role"] == "baseline"]
    if base.empty or (base["state"] != "COMPLETE").any():
        raise Surprise(f"the baseline did not complete: {'; '.join(seen)}")
    for _, r in f.iterrows():
        method = _text(r.get("param_method"))
        if method in lossless and not _lossy(r) and (r["state"] != "COMPLETE" or _text(r.get("status")) != "ok"):
            raise Surprise(f"lossless trial {r['trial']} ({r['label']}) must complete and pass: state {r['state']}, "
                           f"status {_text(r.get('status')) or '-'}, verdict {_text(r.get('verdict')) or '-'}"
                           f"{', ' + _text(r.get('failure')) if _text(r.get('failure')) else ''}")
        if r["state"] != "COMPLETE" and not _text(r.get("failure")):
            raise Surprise(f"trial {r['trial']} ({r['label']}) {r['state']} without a reason")
    missing = [m for m in lossless if m not in set(f["param_method"].fillna(""))]
    if missing:
        raise Surprise(f"no trial of {', '.join(missing)}: {'; '.join(seen)}")
    if len(f) != trials:
        raise Surprise(f"expected {trials} trials, saw {len(f)}: {'; '.join(seen)}")
    return seen


def _baseline_log(folder: Path) -> Path:
    f = _trials(folder)
    base = f[f["role"] == "baseline"]
    if base.empty:
        raise Surprise("no baseline trial in trials.csv")
    return folder / "trials" / f"{int(base.iloc[0]['trial']):04d}" / "server.log"


def graphs(folder: Path, platform: str) -> list[str]:
    log = _baseline_log(folder)
    if not log.is_file():
        raise Surprise(f"the baseline's server.log is missing: {log}")
    if platform != "cuda":
        return [f"CPU run: the baseline's log {log} (no CUDA graphs on CPU)"]
    hits = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if "Graph capturing finished" in ln]
    if not hits:
        raise Surprise(f"no 'Graph capturing finished' in the baseline's own log {log}")
    return [hits[0]]


def runners(folder: Path, platform: str) -> list[str]:
    f = _trials(folder)
    seen = []
    for _, r in f[f["state"] == "COMPLETE"].iterrows():
        method = _text(r.get("param_method")) or "none"
        want, why = runner.expected(None if method == "none" else {"method": method},
                                    triton=runner.has_triton(platform), env=os.environ)
        got = _text(r.get("model_runner"))
        if got != want:
            raise Surprise(f"trial {r['trial']} ({r['label']}) ran {got or 'no recorded runner'}, expected {want} ({why})")
        seen.append(f"trial {r['trial']} {method}: {got}")
    return seen


def pick(folder: Path) -> list[str]:
    best = json.loads((folder / "best.json").read_text())
    b, base = best.get("best") or {}, best.get("baseline") or {}
    served = b.get("served") or {}
    if not served or served.get("speedup") is None or not math.isfinite(float(served["speedup"])):
        raise Surprise("no served numbers in best.json (confirm did not serve the pick)")
    if b.get("label") == base.get("label") or b.get("trial") == base.get("trial"):
        raise Surprise(f"confirm's pick is the baseline ({b.get('label')}): no speculative config won")
    return [f"pick {b.get('label')}: served speedup {served.get('speedup')}, servers {served.get('servers')}"]


def tp(folder: Path, size: int) -> list[str]:
    logs = sorted((folder / "trials").glob("*/server.log"))
    if not logs:
        raise Surprise(f"no server.log under {folder / 'trials'}")
    seen = []
    for log in logs:
        lines = re.findall(r"non-default args: (\{.*\})", log.read_text(errors="replace"))
        sizes = [int(m.group(1)) if (m := re.search(r"'tensor_parallel_size': (\d+)", ln)) else 1 for ln in lines]
        if not sizes or any(s != size for s in sizes):
            raise Surprise(f"{log}: tensor_parallel_size {sizes or 'not logged'}, expected {size}")
        seen.append(f"{log.parent.name}: tensor_parallel_size {size}")
    return seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=["study", "graphs", "runners", "pick", "tp"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--trials", type=int, default=0)
    ap.add_argument("--lossless", default="")
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--size", type=int, default=2)
    a = ap.parse_args(argv)
    try:
        seen = {"study": lambda: study(a.folder, a.trials, [m for m in a.lossless.split(",") if m]),
                "graphs": lambda: graphs(a.folder, a.platform), "runners": lambda: runners(a.folder, a.platform),
                "pick": lambda: pick(a.folder), "tp": lambda: tp(a.folder, a.size)}[a.check]()
    except Surprise as e:
        print(e)
        return 1
    print("\n".join(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
