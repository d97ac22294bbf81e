"""Benchmark: how many measured candidates each strategy needs to find the best (not a test).

``measure``: a full-grid study (``autotune search --strategy grid``, every point of the space, the
demo pair, the same command a user runs) on a workload, then the table of what every candidate
measured, with the baseline's tokens and the draft trace that predictions read, saved as
``benchmarks/data/table-<workload>-<space>.json`` with the machine, vLLM version and date.

``replay``: the strategies replayed on saved tables, over seeds (grid order, random, TPE as a study
runs it, predict): measured candidates and wall time (the table's own trial times) until within 2%
of the table's best correct candidate, and how often each finds it. ``predict`` is deterministic
given the table, so its seeds differ only where the table's noise decides nothing.

``versus``: one live study with ``--strategy predict`` beside the table's grid study: its pick, its
wall time, against the grid's best and wall time.

    .venv/bin/python benchmarks/search_efficiency.py measure examples/json_edit.jsonl --space quick
    .venv/bin/python benchmarks/search_efficiency.py replay benchmarks/data/table-*.json --seeds 50
    .venv/bin/python benchmarks/search_efficiency.py versus examples/json_edit.jsonl --space quick
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
RUNS = Path("results/bench")
WITHIN = 0.02


def _search(workload: str, space: str, strategy: str, study: str, trials: int) -> float:
    cmd = [str(Path(sys.executable).with_name("autotune")), "search", workload, "--space", space, "--strategy", strategy,
           "--trials", str(trials), "--study", study, "--results", str(RUNS)]
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    subprocess.run(cmd, check=False)
    return time.monotonic() - t0


def table_of(results: Path) -> dict[str, Any]:
    """What every trial of a finished study measured, and what its predictions read."""
    import optuna

    from autotune import attrs, hardware
    from autotune.pareto import feasible
    from autotune.study import baseline_trial

    study = optuna.load_study(study_name=results.name, storage=f"sqlite:///{results / 'study.db'}")
    base = baseline_trial(study)
    rows = []
    for t in study.get_trials(deepcopy=False):
        if attrs.is_duplicate(t) or t.state.name not in ("COMPLETE", "FAIL"):
            continue
        m = attrs.measurement(t)
        rows.append({"trial": t.number, "params": attrs.candidate(t), "label": attrs.label(t), "state": t.state.name,
                     "role": attrs.role(t), "failure": attrs.failure(t), "feasible": feasible(t),
                     "wall_s": t.user_attrs.get(attrs.WALL_S),
                     "output_tok_s": m.get("output_tok_s"), "output_tok_s_windows": m.get("output_tok_s_windows"),
                     "e2e_ms_p50": m.get("e2e_ms_p50"), "mean_accepted_length": m.get("mean_accepted_length"),
                     "spec_drafts": m.get("spec_drafts"), "windows": m.get("windows"),
                     "predicted": attrs.predicted(t)})
    bm = attrs.measurement(base)
    return {"study": str(results), "workload": study.user_attrs.get(attrs.WORKLOAD),
            "space": study.user_attrs.get(attrs.SPACE), "date": datetime.date.today().isoformat(),
            "machine": hardware.describe(), "vllm_version": hardware.vllm_version(),
            "baseline": {"params": attrs.candidate(base), "outputs": base.user_attrs.get(attrs.OUTPUTS),
                         "ttft_ms_mean": bm.get("ttft_ms_mean"), "e2e_ms_mean": bm.get("e2e_ms_mean"),
                         "output_tok_s_windows": bm.get("output_tok_s_windows")},
            "draft_trace": study.user_attrs.get(attrs.DRAFT_TRACE), "rows": rows}


def measure(a: argparse.Namespace) -> None:
    from autotune import demo
    from autotune.hardware import platform_tags
    from autotune.space import load_space

    wl = Path(a.workload).stem
    study = f"grid-{wl}-{a.space}"
    n = len(load_space(a.space, platform="cpu", models={"draft_model"} if demo.available() else set(),
                       tags=platform_tags("cpu")).grid())
    wall = _search(a.workload, a.space, "grid", study, n + 1)
    table = {**table_of(RUNS / study), "wall_s": round(wall, 1)}
    DATA.mkdir(parents=True, exist_ok=True)
    out = DATA / f"table-{wl}-{a.space}.json"
    out.write_text(json.dumps(table, indent=1))
    print(f"{out}: {len(table['rows'])} candidates measured in {wall / 60:.1f} min")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("workload")
    m.add_argument("--space", default="quick")
    a = ap.parse_args()
    {"measure": measure}[a.cmd](a)


if __name__ == "__main__":
    main()
