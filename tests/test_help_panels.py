"""`search --help` in panels and `search --config FILE`, without an engine (run_search is replaced by a
recorder where a test gets that far).

The option checks are generic: they walk the command's parameters, so an option added on another
branch is held to them too (its panel goes into autotune/cli/help_panels.SEARCH_PANELS).
"""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

import autotune.cli.search
from autotune.cli.app import app
from autotune.cli.help_panels import PANELS
from autotune.core.errors import BadInput

runner = CliRunner()
WIDE = {"COLUMNS": "120"}


def _search_command():
    return typer.main.get_command(app).commands["search"]


def _options():
    return [p for p in _search_command().params if p.param_type_name == "option"]


def test_default_page_fits_ten_minutes():
    r = runner.invoke(app, ["search", "--help"], env=WIDE)
    assert r.exit_code == 0, r.output
    shown = re.findall(r"^│ (--[a-z0-9-]+)", r.stdout, flags=re.M)
    assert "--help-all" in shown and "--candidates" in shown and "--trials" not in shown and "--warmup" not in shown
    # what a GPU user needs on day one (issue 52), within the page's 24 options (issue 60)
    assert {"--dtype", "--max-model-len", "--gpu-memory-utilization", "--time-budget", "--levels"} <= set(shown)
    assert len(shown) <= 24, shown
    assert len(r.stdout.splitlines()) <= 80
    titles = [t for t in re.findall(r"^╭─ (.+?) ─", r.stdout, flags=re.M) if t != "Arguments"]
    assert titles == [t for t in PANELS if t in titles] and len(titles) >= 5, titles  # PANELS' order


def test_every_option_has_a_panel_and_help_all_shows_the_hidden_ones():
    command = _search_command()
    for p in _options():
        assert getattr(p, "rich_help_panel", None) in PANELS, f"{p.opts[0]} has no panel (help_panels.SEARCH_PANELS)"
    r = runner.invoke(app, ["search", "--help-all"], env=WIDE)
    assert r.exit_code == 0, r.output
    shown = set(re.findall(r"^│ (--[a-z0-9-]+)", r.stdout, flags=re.M))
    assert {p.opts[0] for p in _options()} <= shown
    assert "<bool>" not in r.stdout  # a flag takes no value
    assert any(p.hidden for p in command.params)  # --help-all unhid them for its own page only


def _refused_choices(tmp_path, monkeypatch, flag):
    """The choices `search --FLAG bogus` names in its one-line refusal, or None where it takes any value."""
    monkeypatch.setattr(autotune.cli.search, "run_search", lambda *a, **k: (_ for _ in ()).throw(BadInput("reached")))
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", flag, "bogus-value", "--results", str(tmp_path)])
    m = re.search(re.escape(flag) + r": expected one of (.+?), got 'bogus-value'", r.output)
    return m and m.group(1).split(", ")


def test_every_choice_option_shows_its_choices(tmp_path, monkeypatch):
    """An option that refuses a value with "expected one of A, B" lists A and B on the help page (its
    metavar or its help); an option Typer parses as a choice shows them by itself."""
    seen = 0
    for p in _options():
        if p.type_descriptor.is_choice:  # Typer's own choice (Enum, Literal): shown as a|b by Typer
            continue
        if p.is_flag or p.type_descriptor.annotation is not str:
            continue
        refused = _refused_choices(tmp_path, monkeypatch, p.opts[0])
        if refused:
            seen += 1
            page = f"{p.metavar or ''} {p.help or ''}"
            assert all(c in page for c in refused), f"{p.opts[0]}: choices {refused} not on the help page"
    assert seen >= 4  # --format, --turns, --strategy, --instrument


def _recorded(monkeypatch):
    got = []

    def record(opts, *a, **k):
        got.append(opts)
        raise BadInput("recorded")
    monkeypatch.setattr(autotune.cli.search, "run_search", record)
    return got


def test_config_file_sets_options_and_flags_win(tmp_path, monkeypatch):
    got = _recorded(monkeypatch)
    config = tmp_path / "search.yaml"
    config.write_text("trials: 5\nspace: quick\nstrategy: grid\npast-edge: false\nmax_repeats: 0\n"
                      "try: ['{\"method\": \"ngram\"}']\n")
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--config", str(config), "--trials", "3"])
    assert r.exit_code == 2 and "recorded" in r.output, r.output
    opts = got[0]
    assert (opts.trials, opts.space, opts.strategy, opts.past_edge, opts.max_repeats) == (3, "quick", "grid", False, 0)
    assert opts.tries == ('{"method": "ngram"}',)


@pytest.mark.parametrize("text, fragment", [
    ("trials: 5\nwarp: 9\n", "search.yaml: key 'warp' is not an option of `autotune search`"),
    ("trials: many\n","search.yaml: key 'trials': Input should be a valid integer"),
    ("- trials\n", "search.yaml: expected a mapping of option: value, got list"),
    ("trials: [\n", "search.yaml: not YAML at line"),
    ("config: other.yaml\n", "key 'config' is not an option"),
])
def test_bad_config_file_is_one_line_naming_the_file_and_key(tmp_path, monkeypatch, text, fragment):
    got = _recorded(monkeypatch)
    config = tmp_path / "search.yaml"
    config.write_text(text)
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--config", str(config)])
    assert r.exit_code == 2 and fragment in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not got
