"""The bundled demo target does the corpus tasks (real vLLM engine, greedy).

Every figure autotune reports on the demo is measured on this pair, so it must behave like the
models users tune: asked to edit a record, it copies the record and changes the asked field. A
retrain that loses the skill fails here. The same checks, with more sets, are
benchmarks/demo_quality.py.

Held at issue 11's bar: at least 90% of the edits (JSON records and configs) come back exactly
the input with the asked change, on the bundled examples and on a fresh set the training never
saw; and, with a margin under what the shipped pair does (README, "The demo model pair"), config
edits exact, JSON records exact and field by field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from demo_quality import judged, outputs  # noqa: E402

from autotune.demo.corpus import fresh_examples  # noqa: E402

pytestmark = pytest.mark.engine
EDIT_EXACT = 0.90  # issue 11's bar; measured (benchmarks/demo_quality.py): 93.8% on the examples, 96.8% fresh
CONFIG_EXACT = 0.90  # measured: 100% on the examples and on a fresh set
JSON_EXACT = 0.75  # measured: 87.5% on the examples, 94.1% on a fresh set
JSON_FIELDS = 0.95  # share of a JSON record's fields right; measured: 99%


@pytest.fixture(scope="module")
def quality(tmp_path_factory, engine_launcher):
    work = tmp_path_factory.mktemp("quality")
    fresh = work / "fresh.jsonl"
    rows = [{"id": f"fresh-{i:02d}", "prompt": e.prompt, "max_tokens": 192, "temperature": 0.0}
            for i, e in enumerate(fresh_examples(32, seed=31337, domains=("json", "config")))]
    fresh.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # One engine for both sets (each request's id says its set): an engine start saved.
    both = work / "both.jsonl"
    both.write_text((ROOT / "examples" / "json_edit.jsonl").read_text() + fresh.read_text())
    run = outputs(both, {"method": "none"}, work / "both")
    out = {}
    for name, fresh_ids in (("examples", False), ("fresh", True)):
        part = {**run, "texts": {k: v for k, v in run["texts"].items() if k.startswith("fresh-") == fresh_ids}}
        out[name] = judged(part)
        assert out[name]["n"] == 32  # 32 examples; 32 fresh prompts
    print({name: q["rates"] for name, q in out.items()})
    return out


@pytest.mark.parametrize("name", ["examples", "fresh"])
def test_the_target_returns_the_input_with_exactly_the_asked_edit(quality, name):
    assert quality[name]["rates"]["edit"] >= EDIT_EXACT, quality[name]["failures"]


@pytest.mark.parametrize("name", ["examples", "fresh"])
def test_the_target_returns_the_config_with_exactly_the_asked_edit(quality, name):
    assert quality[name]["rates"]["config"] >= CONFIG_EXACT, quality[name]["failures"]


@pytest.mark.parametrize("name", ["examples", "fresh"])
def test_the_target_copies_the_json_record_it_edits(quality, name):
    assert quality[name]["rates"]["json_fields"] >= JSON_FIELDS, quality[name]["failures"]
    assert quality[name]["rates"]["json"] >= JSON_EXACT, quality[name]["failures"]
