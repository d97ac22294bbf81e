"""Figures in README.md and docs/*.md against the data files they come from (CONTRIBUTING, "Figures in
the docs", defines the anchor and what counts as a figure).

An anchor follows its figure: `6.9 min<!-- data: demo_time_no_avx512.json#/runs/1/wall_s|/60 -->`. FILE
is under benchmarks/data/ unless it holds a slash; the path is a JSON Pointer (RFC 6901) where `*`
takes every element; then operations: min, max, median, len, *N, /N. The figure is the last number
before the anchor on its line, and must equal the value within its printed rounding (half a unit of
its last digit).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ANCHOR = re.compile(r"<!-- data: (\S+?)#(\S*) -->")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
# A figure: a number with a unit (s, min, ms, h, tok/s, x, %, GB...). Versions, counts and option
# defaults carry none of these and are not figures.
FIGURE = re.compile(r"(?<![\w.\-/=@])(?:±|\+-)?\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:x\b|%|\s?(?:s|min|ms|h|tok/s|"
                    r"GB|MB|KB|GiB|MiB)\b)")
# Settings the README states (thresholds, tolerances), not measurements: each phrase must still be there.
SETTINGS = ("a significant 3%", "within 10% of the leader", "until a 10% resolution", "--tolerance 5%")
NO_DATA = "no saved data"


def value(source: str, pointer: str) -> Any:
    """The value an anchor names: FILE#/json/pointer|op|op."""
    path, *ops = pointer.split("|")
    file = ROOT / source if "/" in source else DATA / source
    node: Any = json.loads(file.read_text())
    nodes, many = [node], False
    for part in [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]] if path else []:
        if part == "*":
            nodes, many = [x for n in nodes for x in (n.values() if isinstance(n, dict) else n)], True
        else:
            nodes = [n[int(part)] if isinstance(n, list) else n[part] for n in nodes]
    node = nodes if many else nodes[0]
    for op in ops:
        if op in ("min", "max", "len"):
            node = {"min": min, "max": max, "len": len}[op](node)
        elif op == "median":
            node = statistics.median(node)
        elif op[0] in "*/":
            node = node * float(op[1:]) if op[0] == "*" else node / float(op[1:])
        else:
            raise ValueError(f"{source}#{pointer}: unknown operation {op!r}")
    return node


def anchored(text: str) -> list[tuple[int, str, str, str, str]]:
    """(line, printed figure, file, pointer, text before) for every anchor, outside nothing: anchors in
    code blocks are checked too."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in ANCHOR.finditer(line):
            before = ANCHOR.sub("", line[:m.start()])
            numbers = NUMBER.findall(before)
            out.append((n, numbers[-1] if numbers else "", m.group(1), m.group(2), before))
    return out


def mismatches(text: str, name: str) -> list[str]:
    """Each anchored figure that does not match its file, in one line."""
    bad = []
    for n, printed, source, pointer, _ in anchored(text):
        where = f"{name}:{n}: {printed or '(no number)'} <- {source}#{pointer}"
        if not printed:
            bad.append(f"{where}: no figure before the anchor")
            continue
        try:
            got = float(value(source, pointer))
        except (OSError, KeyError, IndexError, ValueError, TypeError) as e:
            bad.append(f"{where}: {type(e).__name__}: {e}")
            continue
        decimals = len(printed.split(".")[1]) if "." in printed else 0
        if not math.isfinite(got) or abs(abs(got) - abs(float(printed))) > 0.5 * 10 ** -decimals + 1e-9:
            bad.append(f"{where}: the file says {got:.6g}")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_anchored_figures_match_their_files(doc):
    assert mismatches(doc.read_text(), doc.name) == []


def test_a_planted_wrong_figure_is_caught():
    good = "forked: 2 s<!-- data: launcher_start.json#/summary/engine_init_s_median/launched -->"
    assert mismatches(good, "x.md") == []
    wrong = good.replace("2 s", "3 s")
    assert mismatches(wrong, "x.md") == ["x.md:1: 3 <- launcher_start.json#/summary/engine_init_s_median/launched: "
                                         "the file says 2.065"]
    assert mismatches(good.replace("2 s", "2.2 s"), "x.md") and not mismatches(good.replace("2 s", "2.07 s"), "x.md")
    assert "KeyError" in mismatches(good.replace("launched", "lunched"), "x.md")[0]


def test_operations_and_wildcards():
    ready = value("demo_time_no_avx512.json", "/runs/*/confirm_ready_s")
    assert len(ready) == 2 and value("demo_time_no_avx512.json", "/runs/0/confirm_ready_s|max") == max(ready[0])
    assert value("demo_time_no_avx512.json", "/runs/1/wall_s|/60") == pytest.approx(413.3 / 60)


def _prose(text: str) -> list[tuple[int, str]]:
    """README lines outside fenced code blocks, inline code removed."""
    lines, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((n, re.sub(r"`[^`]*`", "", line)))
    return lines


def unanchored(text: str) -> list[str]:
    """Figures in prose that carry no anchor, on lines that do not say "no saved data"."""
    bad = []
    for n, line in _prose(text):
        if NO_DATA in line:
            continue
        for phrase in SETTINGS:
            line = line.replace(phrase, "")
        for m in FIGURE.finditer(line):
            rest = line[m.end():].lstrip("*")
            if not rest.startswith("<!-- data:"):
                bad.append(f"README.md:{n}: {m.group(0)!r} has no anchor and the line does not say {NO_DATA!r}")
    return bad


def test_every_readme_figure_has_its_source():
    text = (ROOT / "README.md").read_text()
    assert all(p in text for p in SETTINGS), [p for p in SETTINGS if p not in text]
    assert unanchored(text) == []
    assert unanchored("took 27 min 41 s once.") and not unanchored(f"took 27 min 41 s once ({NO_DATA}).")


def test_sample_output_in_the_readme_is_from_its_log():
    """A fenced block after a line naming a saved log holds only that log's lines (elided with ...)."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"`(benchmarks/data/[\w.-]+\.(?:log|txt))`[^\n]*\n\n```text\n(.*?)```", text, re.S)
    blocks += [(f"benchmarks/data/{log}", block) for log, block in LOG_BLOCK.findall(text)]
    assert blocks
    for log, block in blocks:
        saved = " ".join((ROOT / log).read_text().split())
        for line in block.splitlines():
            for part in line.split("..."):
                part = " ".join(part.split()).strip("( )")
                assert len(part) < 4 or part in saved, f"{log}: {part!r} is not in the log"


def test_the_claimed_served_collation_matches_its_sources():
    """benchmarks/data/claimed_served.json gathers every saved demo run's claim and served speedup; each
    entry must be what its source file says, and its summary what the entries give."""
    data = json.loads((DATA / "claimed_served.json").read_text())
    ratios = []
    for run in data["runs"]:
        claimed, served = value(run["file"], run["claimed"]), value(run["file"], run["served"])
        assert (claimed, served) == (run["claimed_value"], run["served_value"]), run
        assert run["ratio"] == pytest.approx(claimed / served)
        ratios.append(claimed / served)
    s = data["summary"]
    assert (s["runs"], s["min"], s["max"]) == (len(ratios), min(ratios), max(ratios))
    assert s["median"] == pytest.approx(statistics.median(ratios))
    assert s["outside_25pct"] == sum(abs(r - 1) > 0.25 for r in ratios)
    assert s["within_5pct"] == sum(abs(r - 1) <= 0.05 for r in ratios)
    saved = {p.name for p in DATA.glob("*.json") if "claimed" in p.read_text() and p.name != "claimed_served.json"}
    listed = {r["file"] for r in data["runs"]} | {k.split("#")[0] for k in data.get("not_runs", {})}
    assert saved <= listed  # no saved run left out unannounced (a file with none says why in not_runs)


LOG_BLOCK = re.compile(r"<!-- log: (\S+?)(?: select: .*?)? -->\n```text\n(.*?)```", re.S)


def foreign_lines(text: str) -> list[str]:
    """Lines of each fenced block tagged `<!-- log: FILE -->` (FILE under benchmarks/data/) that are not
    in that log, compared with runs of spaces closed up and `...` marking an elision."""
    bad = []
    for log, block in LOG_BLOCK.findall(text):
        saved = " ".join((DATA / log).read_text().split())
        for line in block.splitlines():
            for part in line.split("..."):
                part = " ".join(part.split()).strip("( )")
                if len(part) >= 4 and part not in saved:
                    bad.append(f"{log}: {part!r}")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_tagged_sample_output_is_from_its_log(doc):
    assert foreign_lines(doc.read_text()) == []


def test_a_planted_foreign_line_is_caught():
    block = "<!-- log: demo_time_launched_no_avx512.log -->\n```text\ntrial   0 none eager {} tok/s\n```\n"
    assert foreign_lines(block.format("73.2 ± 0.8")) == []
    assert foreign_lines(block.format("93.2 ± 0.8"))


def _docs_output():
    """scripts/docs_output.py as a module: the one writer of the tagged sample blocks."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_output", ROOT / "scripts" / "docs_output.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_sample_blocks_are_what_the_script_writes_from_the_saved_run(doc):
    """Each block tagged with selectors is scripts/docs_output.py's output from its saved log: a new saved
    run, then the script, regenerates the docs' sample output."""
    text = doc.read_text()
    assert _docs_output().render(text) == text


def test_the_readme_and_the_walkthrough_quote_this_rounds_run():
    for doc in (ROOT / "README.md", ROOT / "docs" / "reading-the-output.md"):
        assert "<!-- log: demo_round6.log select: " in doc.read_text(), doc.name


def test_the_saved_runs_summary_is_what_this_code_prints():
    """The round-6 demo's console (benchmarks/data/demo_round6.log, a fresh clone's scripts/demo.sh) ends
    in the summary this commit's code prints from the run's own best.json (autotune.results.summary, as
    a pipe prints it: 100 columns, its rule above); a format change fails here until a new run is saved."""
    from pathlib import Path as P

    from autotune.results.summary import summary

    mod = _docs_output()
    log = (DATA / "demo_round6.log").read_text().splitlines()
    final = json.loads((DATA / "demo_round6_best.json").read_text())
    printed = [log[i] for i in mod.summary_block(log, 2)]
    assert printed[0].startswith("── demo ") and len(printed[0]) == 100
    assert [x.rstrip() for x in printed[1:]] == summary(final, P("results/demo"), width=100, max_lines=11)
    # the summary before confirm carried the ratio the pick was chosen on, the claim best.json keeps
    first = " ".join(log[i] for i in mod.summary_block(log, 1))
    assert f"chosen on: {final['best']['speedup']['output_tok_s']:.2f}x" in first


def test_a_changed_sample_block_or_a_missing_line_is_caught():
    mod = _docs_output()
    log = "a b\ntrial   0 none  eager 1 tok/s\nbest: x\n"
    assert mod.select(log, ["trial 0", "best:"]) == ["trial   0 none  eager 1 tok/s", "best: x"]
    with pytest.raises(LookupError):
        mod.select(log, ["served:"])


def _in_log(line: str, log: str) -> bool:
    return " ".join(line.split()) in " ".join(log.split())


def test_the_saved_run_is_in_the_current_format():
    """The saved demo run's summary lines are what this commit's code prints from the run's own best.json
    (as the search left it, then after confirm): a format change fails here until a new run is saved
    (scripts/docs_output.py)."""
    from autotune.measure.resolution import Resolution
    from autotune.results.text import claim_line, headline, stopped_line
    from autotune.serve.served import served_line

    log = (DATA / "demo_round5.log").read_text()
    study = json.loads((DATA / "demo_round5_study_best.json").read_text())
    final = json.loads((DATA / "demo_round5_best.json").read_text())
    lines = [headline(study), claim_line(study), served_line(final)]
    if study.get("resolution"):
        lines.append(Resolution(**study["resolution"]).line())
    if (study.get("strategy") or {}).get("stopped"):
        lines.append(stopped_line(study))
    assert all(lines)
    assert [x for x in lines if not _in_log(x, log)] == []
    # a changed word in any of them is caught
    assert not _in_log(headline(study).replace("best:", "pick:"), log)


def test_the_readme_timings_name_their_commit_and_machine_and_are_recent():
    """The README's headline timings (benchmarks/headline_timings.py) carry the commit they were measured
    at and the machine's kind, and that commit is at most 10 commits touching autotune/ or scripts/
    old (issue 53): a change past that re-measures them."""
    import subprocess

    data = json.loads((DATA / "headline_timings.json").read_text())
    readme = (ROOT / "README.md").read_text()
    commit = data["commit"]
    assert f"`{commit[:7]}`" in readme and "headline_timings.json" in readme
    kind = "AVX-512" if data["machine"].get("avx512") else "without AVX-512"
    timing_line = next(line for line in readme.splitlines() if "headline_timings.json#/setup" in line)
    assert kind in readme[readme.index(timing_line) - 400:readme.index(timing_line) + 600]
    out = subprocess.run(["git", "rev-list", "--count", f"{commit}..HEAD", "--", "autotune", "scripts"], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"this checkout has no history back to {commit[:7]} (a shallow clone): {out.stderr.strip()}")
    assert int(out.stdout) <= 10, f"{out.stdout.strip()} commits touching autotune/ or scripts/ since the timings"
