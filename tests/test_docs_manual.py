"""The README as the manual (CONTRIBUTING, "Writing docs"): at most 15 KB, depth in docs/, and every
relative link in README.md and docs/*.md reaching its file and, with a `#fragment`, a heading there.

15 KB is measured as the file's bytes, anchors included (15,000 bytes: the docs' KB is 1,000 bytes).
A fragment is GitHub's heading id: lower case, punctuation other than `-` and `_` dropped, spaces
to `-`, a repeated heading's id suffixed `-1`, `-2`, ...
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_BYTES = 15_000
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def heading_ids(text: str) -> set[str]:
    """GitHub's ids of a Markdown file's headings (outside fenced code)."""
    ids: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def broken_links(text: str, source: Path) -> list[str]:
    """Each relative link in `text` (a file at `source`) whose file or heading does not exist, one line each."""
    bad = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not checked here
            continue
        path, _, fragment = target.partition("#")
        file = (source.parent / path).resolve() if path else source
        if not file.exists():
            bad.append(f"{source.name}: {target}: no such file")
        elif fragment and file.suffix == ".md" and fragment not in heading_ids(file.read_text() if path else text):
            bad.append(f"{source.name}: {target}: no heading #{fragment} in {file.name}")
    return bad


def test_the_readme_is_at_most_15_kb():
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes, over {MAX_README_BYTES}: move depth to docs/"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    assert broken_links(doc.read_text(), doc) == []


def test_the_readme_maps_every_docs_page():
    """Every page of docs/ is reachable from the README (its map of docs/)."""
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text())}
    assert [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked] == []


def test_a_planted_broken_link_is_caught():
    good = "[gpu](docs/gpu.md#time) and [top](#a-heading)\n\n## A heading\n"
    assert broken_links(good, README) == []
    assert broken_links(good.replace("gpu.md#", "gpus.md#"), README) == ["README.md: docs/gpus.md#time: no such file"]
    assert broken_links(good.replace("#time", "#timing"), README) == [
        "README.md: docs/gpu.md#timing: no heading #timing in gpu.md"]
    assert broken_links("```\n[x](nowhere.md)\n```\n", README) == []  # links in code are not links


def test_heading_ids_follow_github():
    text = "# Time to a pick: predict, grid and `vllm bench`\n## Where an engine's start goes\n## Watch\n## Watch\n"
    assert heading_ids(text) == {"time-to-a-pick-predict-grid-and-vllm-bench", "where-an-engines-start-goes",
                                 "watch", "watch-1"}
