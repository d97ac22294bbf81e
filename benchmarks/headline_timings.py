"""The README's headline timings, re-measured as a newcomer meets them (issue 53), in one run.

A fresh clone of this checkout's commit (``git clone``, so nothing built here is reused but the pip
cache), then, each as a whole process and timed from outside:

- setup: ``bash scripts/setup.sh`` (the venv, vLLM for this machine, Arctic Inference's wheel);
- the demo: ``bash scripts/demo.sh`` (its search with ``--confirm``), its console read line by line
  with the time each line came: the study (until the summary before confirm) and confirm;
- the console as a user reads it (issue 60), piped as a log is (100 columns): its widest line, and the
  lines after the last trial (the summaries, confirm's stop), each summary's length;
- engine start: each trial's ``engine_init_s`` and whole wall from the demo's trials.csv, and
  confirm's servers' readiness (best.json's served rounds), forked from the launcher;
- the report: ``autotune report results/demo``, its wall and report.html's size (issue 60: under 1 MB).

The data file records the commit measured and the machine's kind; the README quotes it with both.
Under the machine-wide engine lock, so no other engine runs beside it.

    .venv/bin/python benchmarks/headline_timings.py [--out benchmarks/data/headline_timings.json]
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import csv
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune.results.summary import printed_end

ROOT = harness.ROOT


def timed(cmd: list[str], cwd: Path, log: Path) -> tuple[int, float, list[tuple[float, str]]]:
    """Run ``cmd`` under the engine lock; (exit code, wall from the lock's holding, timed lines)."""
    rc, start, end, lines = harness.run_locked_timed(cmd, log, cwd=cwd)
    return rc, end - start, lines


def console(lines_in) -> dict:
    """The demo's console as a user reads it: its widest line, the lines after the last trial's record
    (a record wraps onto lines of its own, up to the next blank line or summary rule), and each summary's
    lines (its rule and rows)."""
    lines = [x for x in lines_in if not x.startswith("rc=")]
    last = max((i for i, x in enumerate(lines) if x.startswith("trial ")), default=-1)
    end = next((i for i in range(last + 1, len(lines)) if not lines[i].strip() or lines[i].startswith("── ")),
               len(lines))
    # each summary's rule and rows, as the docs select them (a note after it, confirm's stop, is no row)
    summaries = [printed_end(lines, i) - i for i, x in enumerate(lines) if x.startswith("── ")]
    return {"columns": "a pipe (100: autotune.cli.edge.PIPE_WIDTH)", "widest": max(map(len, lines), default=0),
            "lines_after_last_trial": len(lines) - end, "summary_lines": summaries}


def main() -> int:
    ap = harness.parser(__doc__, out="headline_timings.json")
    ap.add_argument("--keep", action="store_true", help="keep the fresh clone (its path is printed)")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    where = Path(tempfile.mkdtemp(prefix="headline-"))
    clone = where / "autotune"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    data: dict = {"what": "the README's headline timings from a fresh clone: setup.sh, demo.sh (study, confirm), "
                          "engine and server starts", "commit": commit, "pip_cache": "as this machine has it"}
    rc, setup_s, _ = timed(["bash", "scripts/setup.sh"], clone, args.out.parent / "headline_setup.log")
    data["setup"] = {"rc": rc, "wall_s": round(setup_s, 1)}
    print(f"setup: rc={rc} {setup_s:.0f} s", flush=True)
    if rc == 0:
        rc, demo_s, lines = timed(["bash", "scripts/demo.sh"], clone, args.out.parent / "headline_demo.log")
        rules = [t for t, x in lines if x.startswith("── demo ")]  # each summary's rule: after the study, after confirm
        confirm_at = rules[0] if len(rules) > 1 else None
        first = lines[0][0] if lines else 0.0
        best = clone / "results" / "demo" / "best.json"
        served = (json.loads(best.read_text())["best"].get("served") or {}) if best.is_file() else {}
        ready = [r.get("ready_s") for r in served.get("per_round") or []]
        data["demo"] = {"rc": rc, "wall_s": round(demo_s, 1),
                        "study_s": round((confirm_at or lines[-1][0]) - first, 1) if lines else None,
                        "confirm_s": round(lines[-1][0] - confirm_at, 1) if confirm_at else None,
                        "confirm_server_ready_s": ready, "log": "headline_demo.log"}
        data["console"] = console(x for _, x in lines)
        trials = clone / "results" / "demo" / "trials.csv"
        if trials.is_file():
            rows = list(csv.DictReader(trials.open()))
            init = [float(r["engine_init_s"]) for r in rows if r.get("engine_init_s")]
            wall = [float(r["wall_s"]) for r in rows if r.get("wall_s")]
            data["engine"] = {"trials": len(rows), "median_engine_init_s": statistics.median(init) if init else None,
                              "max_engine_init_s": max(init) if init else None,
                              "median_trial_wall_s": statistics.median(wall) if wall else None}
        print(f"demo: rc={rc} {demo_s:.0f} s (study {data['demo']['study_s']} s, confirm {data['demo']['confirm_s']} s)",
              flush=True)
        rc, report_s, _ = timed([".venv/bin/autotune", "report", "results/demo"], clone, where / "report.log")
        page = clone / "results" / "demo" / "report" / "report.html"
        data["report"] = {"rc": rc, "wall_s": round(report_s, 1),
                          "html_bytes": page.stat().st_size if page.is_file() else None}
        print(f"report: rc={rc} {report_s:.0f} s, report.html {data['report']['html_bytes']} bytes", flush=True)
    harness.save(args.out, data)
    if args.keep:
        print(f"clone kept: {clone}")
    else:
        shutil.rmtree(where, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
