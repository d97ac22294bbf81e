"""`search --help` as a new user reads it (issue 60): at 80 columns the default page shows every flag
that the `search` commands of README.md, scripts/demo.sh and docs/ use, in at most 24 options; no
name or word is cut (Rich's "…") on it or on --help-all; flags show no type.

Which options the default page shows is autotune/cli/help_panels.DAY_ONE, and why: the flags those
commands use (read from the files here, so a command added with a new flag fails this test until the
flag is on the page), the model flags a GPU user needs before the first engine starts (--dtype,
--max-model-len, --gpu-memory-utilization, --trust-remote-code), --explain (the summary names it),
--help-all and --help. The rest (the workload's --format, read by default; the load pattern and
--concurrency, which one --levels N gives; the correctness bounds; the measurement knobs; --config,
--strategy) are on --help-all.
"""

from __future__ import annotations

import re
from pathlib import Path

import click.testing
import pytest
import typer
from typer.testing import CliRunner

import autotune.cli.search
from autotune.cli.app import app
from autotune.core.errors import BadInput

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()
NARROW = {"COLUMNS": "80"}
# Lab notes keep their commands as they were run (docs/findings.md: --trials, --candidates' old name).
LAB_NOTES = {"findings.md"}


def _search_commands(text: str) -> list[str]:
    """The `search` commands of a Markdown text (code spans and fenced blocks; shell continuations
    joined, comments left out), each up to its `--`: the flags after it are vLLM's."""
    found = []
    for span in re.findall(r"```.*?```|`[^`]+`", text, flags=re.S):
        body = re.sub(r"\\\n\s*", " ", span.strip("`"))
        for line in body.splitlines() if span.startswith("```") else [body.replace("\n", " ")]:
            m = re.search(r"(?:^|[\s/])search\s(.*)", line)
            if m and not line.lstrip().startswith("#"):
                found.append(m.group(1).split(" -- ")[0])
    return found


def _documented_flags() -> dict[str, set[str]]:
    """Each flag the `search` commands of README.md, scripts/demo.sh and docs/*.md use: the files using it."""
    flags: dict[str, set[str]] = {}
    demo = ROOT / "scripts" / "demo.sh"
    texts = {"README.md": (ROOT / "README.md").read_text(), "demo.sh": f"```\n{demo.read_text()}\n```"}
    texts |= {f.name: f.read_text() for f in sorted((ROOT / "docs").glob("*.md")) if f.name not in LAB_NOTES}
    for name, text in texts.items():
        for command in _search_commands(text):
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command):
                flags.setdefault(flag, set()).add(name)
    return flags


def _page(*args: str, env: dict[str, str] = NARROW) -> str:
    r = runner.invoke(app, ["search", *args], env=env)
    assert r.exit_code == 0, r.output
    return r.stdout


def _rows(page: str) -> list[str]:
    """The first long name of each option row."""
    return re.findall(r"^│ (--[a-z0-9-]+)", page, flags=re.M)


def _options() -> list:
    return [p for p in typer.main.get_command(app).commands["search"].params if p.param_type_name == "option"]


def test_default_page_shows_every_flag_the_docs_commands_use():
    documented = _documented_flags()
    # the reading finds the commands: the flags issue 60 found missing, the demo's and the README's
    assert {"--study", "--try", "--slo", "--resume", "--warm-start", "--confirm", "--levels", "--candidates",
            "--storage", "--workers", "--model"} <= set(documented), sorted(documented)
    shown = _rows(_page("--help"))
    missing = {flag: sorted(where) for flag, where in documented.items() if flag not in shown}
    assert not missing, f"used in these files' search commands but not on `search --help`: {missing}"
    assert len(shown) <= 24, shown


@pytest.mark.parametrize("columns", ["80", "120"])
@pytest.mark.parametrize("page", ["--help", "--help-all"])
def test_no_name_or_word_is_cut(page, columns):
    out = _page(page, env={"COLUMNS": columns})
    assert "…" not in out, "\n".join(line for line in out.splitlines() if "…" in line)
    assert max(len(line) for line in out.splitlines()) <= int(columns)
    for p in _options():  # a switch on by default keeps its --no- form whole, on its own row
        if p.secondary_opts and p.default is True and p.opts[0] in _rows(out):
            assert re.search(rf"^│ {p.opts[0]}\s+{p.secondary_opts[0]}\s", out, flags=re.M), p.opts[0]


def test_help_all_lists_every_option_at_80_columns():
    shown = _rows(_page("--help-all"))
    assert sorted(shown) == sorted({p.opts[0] for p in _options()} | {"--help"})


@pytest.mark.parametrize("page", ["--help", "--help-all"])
def test_flags_show_no_type(page):
    """A flag's row goes from its names straight to its help: no <bool>, BOOLEAN or other type between."""
    out = _page(page)
    assert not re.search(r"<bool|BOOL", out, flags=re.I)
    flags = [p for p in _options() if p.is_flag and p.opts[0] in _rows(out)]
    assert len(flags) >= (4 if page == "--help" else 10)
    for p in flags:
        row = next(line for line in out.splitlines() if re.match(rf"│ {p.opts[0]}\s", line))
        rest = row[1:].replace(p.opts[0], "", 1)
        for name in p.secondary_opts:
            rest = rest.replace(name, "", 1)
        assert rest.split()[0] == p.help.split()[0], row


def test_off_switches_the_page_leaves_out_still_parse(tmp_path, monkeypatch):
    """The page shows a flag that is off by default without its --no- form (room at 80 columns); the
    form still turns off what a --config file turned on, after the page was drawn."""
    got = []

    def record(opts, *a, **k):
        got.append(opts)
        raise BadInput("recorded")
    monkeypatch.setattr(autotune.cli.search, "run_search", record)
    config = tmp_path / "search.yaml"
    config.write_text("confirm: true\nresume: true\ntrust-remote-code: true\n")
    command = typer.main.get_command(app)  # one command object (Typer builds one a call): the page drawn on it first
    on_it = click.testing.CliRunner()
    out = on_it.invoke(command, ["search", "--help-all"], env=NARROW).stdout
    assert "--no-confirm" in out  # named by --config's help
    assert not re.search(r"--no-(resume|trust-remote-code)\b", out)
    r = on_it.invoke(command, ["search", "examples/smoke.jsonl", "--config", str(config), "--no-confirm",
                               "--no-trust-remote-code"])
    assert r.exit_code == 2 and "recorded" in r.output, r.output
    assert (got[0].confirm, got[0].resume, got[0].trust_remote_code) == (False, True, False)
