"""Regenerate the docs' sample output from a saved run (issue 53: docs from this commit's output).

A fenced block in README.md or docs/*.md tagged

    <!-- log: demo_round6.log select: trial   0 | [summary 2] -->

holds, for each selector in order, the first line of benchmarks/data/demo_round6.log not taken yet
that starts with it (runs of spaces closed up), or for ``[summary N]`` the run's N-th summary whole.
This script rewrites every such block from its log;
with --log and --results it first saves a run as that log and its best.json files beside it:

    .venv/bin/python scripts/docs_output.py --log run.log --results RESULTS/demo --name demo_round6
    .venv/bin/python scripts/docs_output.py          # only rewrite the blocks from the saved logs

tests/test_docs_figures.py checks both ways: each tagged block is what this script writes from its
log, and the saved log's summary lines are what the current code prints from the saved best.json
(so a changed format fails until a new run is saved).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TAGGED = re.compile(r"(<!-- log: (\S+?)(?: select: (.*?))? -->\n```text\n)(.*?)(```)", re.S)


def _flat(line: str) -> str:
    return " ".join(line.split())


SUMMARY = re.compile(r"^\[summary (\d+)\]$")  # a selector for a run's Nth summary, whole (autotune.results.summary)


def summary_block(lines: list[str], n: int) -> list[int]:
    """The line numbers of the log's ``n``-th summary: its rule (``── study ──``) and its rows (a label
    of autotune.results.summary in its column, or a wrapped row's continuation)."""
    sys.path.insert(0, str(ROOT))
    from autotune.results.summary import printed_end

    rules = [i for i, x in enumerate(lines) if x.startswith("── ")]
    if len(rules) < n:
        raise LookupError(f"the log has {len(rules)} summaries, not {n}")
    return list(range(rules[n - 1], printed_end(lines, rules[n - 1])))


# A line that starts a record of its own: a trial, a note with its label, a summary's rule or row, a
# left-out choice, a blank. Any other line continues the record above it (wrapped at 100 columns).
RECORD = re.compile(r"^(trial +\d|[a-z][\w -]*: |── |  left out: |autotune \d|$)")


def record(lines: list[str], at: int) -> list[int]:
    """Line ``at`` and the lines its record wrapped onto."""
    end = at + 1
    while end < len(lines) and not RECORD.match(lines[end]):
        end += 1
    return list(range(at, end))


def select(log_text: str, selectors: list[str]) -> list[str]:
    """For each selector, the first unused log line starting with it (spaces closed up), as logged; a
    ``[summary N]`` selector gives the run's N-th summary whole."""
    lines = log_text.splitlines()
    used: set[int] = set()
    out = []
    for sel in selectors:
        if m := SUMMARY.match(sel.strip()):
            block = summary_block(lines, int(m.group(1)))
            used.update(block)
            out += [lines[i].rstrip() for i in block]
            continue
        want = _flat(sel)
        hit = next((i for i, line in enumerate(lines) if i not in used and _flat(line).startswith(want)), None)
        if hit is None:
            raise LookupError(f"no line starting {sel!r} in the log")
        whole = record(lines, hit)  # a record wrapped at 100 columns comes whole
        used.update(whole)
        out += [lines[i].rstrip() for i in whole]
    return out


def render(text: str) -> str:
    """``text`` with every tagged block that has selectors rewritten from its log."""

    def block(m: re.Match[str]) -> str:
        head, log, selectors, _body, tail = m.groups()
        if not selectors:
            return m.group(0)
        chosen = select((DATA / log).read_text(), [s.strip() for s in selectors.split(" | ")])
        return head + "\n".join(chosen) + "\n" + tail

    return TAGGED.sub(block, text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, help="a run's console output, saved under benchmarks/data/ as the --name log")
    ap.add_argument("--results", type=Path, help="its results folder: best.json saved as NAME_best.json")
    ap.add_argument("--study-best", type=Path, help="best.json as the search left it, before confirm "
                                                    "(saved as NAME_study_best.json)")
    ap.add_argument("--name", default="demo_round6")
    args = ap.parse_args()
    if args.log:
        shutil.copyfile(args.log, DATA / f"{args.name}.log")
    if args.results:
        shutil.copyfile(args.results / "best.json", DATA / f"{args.name}_best.json")
    if args.study_best:
        shutil.copyfile(args.study_best, DATA / f"{args.name}_study_best.json")
    for doc in DOCS:
        text = doc.read_text()
        try:
            new = render(text)
        except (LookupError, OSError) as e:
            print(f"{doc.relative_to(ROOT)}: {e}", file=sys.stderr)
            return 1
        if new != text:
            doc.write_text(new)
            print(f"rewrote {doc.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
