"""`autotune report` and trials.parquet, on results of a study run with the FAKE engine (tests/fake_engine.py).

The report reads saved files only; one test runs it in a process where vLLM cannot be imported,
another opens the page in headless Chromium and looks at the screenshot. With
``AUTOTUNE_REPORT_SCREENSHOT=docs/report-screenshot.png`` in its environment that test also saves the
screenshot there: the docs' picture of the report is this page.
"""

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from autotune.core.candidate import Settings
from autotune.cli.app import app
from autotune.results.charts import MIN_TRIALS_FOR_IMPORTANCE
from autotune.results.report import importance_chart, write_report
from autotune.results.files import write_results
from autotune.core.space import load_space
from autotune.measure.config import StudyConfig
from autotune.study.loop import run_study
from autotune.core.workload import load_workload

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CHROMIUM = "/usr/bin/chromium"
TITLES = ("Pareto front: output_tok_s vs e2e_ms_p50", "Speedup over the baseline by method and depth",
          "Acceptance by draft position", "Parameter importances")
MAX_PAGE_BYTES = 1_000_000  # a page to share: issue 60's bound (plotly.js inlined made it 4.9 MB)
SCREENSHOT_ENV = "AUTOTUNE_REPORT_SCREENSHOT"
runner = CliRunner()


def colours(img):
    """How many distinct RGB colours an image (floats in [0, 1], from imread) has."""
    rgb = (img[..., :3] * 255).astype(np.uint32)
    return len(np.unique(rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2]))


def ngram(k, kv="auto", q="none"):
    return {"method": "ngram", "num_speculative_tokens": k, "kv_cache_dtype": kv, "quantization": q}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A finished fake study: baseline, ngram k=2..4, a drifting (infeasible) fp8 config, a crash."""
    out = tmp_path_factory.mktemp("results") / "fake"
    with pytest.MonkeyPatch.context() as mp:  # as conftest's fake_engine_env, once for the module
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
        cfg = StudyConfig(name="fake", results_dir=out, settings=Settings(model="fake-model"), n_trials=6,
                          trial_timeout_s=20, engine_module="fake_engine", repeats=1, warmup=0, samples=0)
        space = load_space("tests/data/fake_space.yaml", platform="cpu", models=set())
        study = run_study(cfg, load_workload("examples/smoke.jsonl"), space,
                          enqueue=[ngram(2), ngram(3), ngram(4), ngram(4, kv="fp8"), ngram(2, q="crash")])
        write_results(study, out, settings=cfg.settings, platform={"platform": "cpu", "vllm": "fake"},
                      objectives=list(cfg.objectives), storage_url=cfg.storage_url)
    _served(out)
    return out


def _served(out: Path) -> None:
    """The pick's served figure, written by confirm's own writer; the rounds' numbers are a stand-in
    (no server here: tests/test_confirm.py runs those), so the report shows the served bar and point."""
    import json

    from autotune.gate import confirm
    from autotune.serve.served import verdict

    claim = json.loads((out / "best.json").read_text())["best"]["speedup"]
    claimed = (claim["output_tok_s"], claim.get("output_tok_s_lo"), claim.get("output_tok_s_hi"))
    figure = (round(claimed[0] * 0.97, 2), round(claimed[0] * 0.92, 2), round(claimed[0] * 1.02, 2))
    served = {"rounds": 4, "speedup": figure[0], "speedup_lo": figure[1], "speedup_hi": figure[2], "resolution": 0.05,
              "interval_unit": "served rounds", "stopped": "the served interval resolves +-5%, under the 10% asked",
              "servers": "forked", "baseline_output_tok_s": [100.0, 98.0, 103.0, 99.0],
              "pick_output_tok_s": [100.0 * figure[0], 98.0 * figure[0], 103.0 * figure[0], 99.0 * figure[0]],
              "client": {"notes": []}, "claimed": dict(zip(("speedup", "lo", "hi"), claimed))}
    confirm._record(out, served, verdict(figure, claimed, resolution=0.05, rounds=4))


def test_trials_parquet_holds_the_csv_table(results):
    csv = pd.read_csv(results / "trials.csv")
    parquet = pd.read_parquet(results / "trials.parquet")
    assert list(parquet.columns) == list(csv.columns) and len(parquet) == len(csv) == 6
    assert list(parquet["state"]) == ["COMPLETE"] * 5 + ["FAIL"]
    assert parquet.loc[5, "failure"].startswith("RuntimeError: fake engine init failed")
    assert parquet["correct"].tolist()[:5] == [True, True, True, True, False]
    # The CSV loses types and reads empty text as missing: compare both as text, missing as "".
    def text(frame):
        return frame.map(lambda v: "" if pd.isna(v) else str(v))
    pd.testing.assert_frame_equal(text(parquet), text(csv))


@pytest.fixture(scope="module")
def site(results, tmp_path_factory):
    """`autotune report RESULTS -o SITE`, once for the module."""
    out = tmp_path_factory.mktemp("site")
    r = runner.invoke(app, ["report", str(results), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stdout.split() == [w for f in ("report.html", "pareto.png", "speedup.png", "prediction.png", "acceptance.png",
                                            "importance.png") for w in ("wrote", str(out / f))]
    return out


def test_report_writes_html_and_pngs(site):
    out = site
    names = sorted(p.name for p in out.iterdir())
    assert names == ["acceptance.png", "importance.png", "pareto.png", "prediction.png", "report.html", "speedup.png"]
    page = (out / "report.html").read_text()
    for title in TITLES:
        assert title in page, title
    assert page.count("<svg") == 5  # each plot inline, as the PNG beside it draws it
    assert ">baseline</text>" in page  # the baseline is marked on the front, as text
    assert re.search(r"<use [^>]*><title>trial 0: none</title></use>", page)  # a point's details: its tooltip
    for png in (n for n in names if n.endswith(".png")):
        img = imread(out / png)
        assert img.shape[0] > 300 and img.shape[1] > 500
        assert colours(img) > 20, png  # something was drawn


def test_the_page_is_small_and_opens_offline(site):
    """One file to share: under 1 MB, nothing fetched and nothing loaded twice (no script at all, no
    image data: the plots are inline SVG, the PNGs files beside it)."""
    raw = (site / "report.html").read_bytes()
    assert len(raw) < MAX_PAGE_BYTES, len(raw)
    page = raw.decode()
    assert "<script" not in page and "src=" not in page and "url(http" not in page and "data:image" not in page
    assert not re.findall(r'href="(?!#)(?![\w.-]+\.png")', page)  # links: the PNGs beside it, or in-page


def _text(page: str) -> str:
    """The page's visible text, one space between words (SVG text included)."""
    return " ".join(html.unescape(re.sub(r"<title>.*?</title>|<[^>]+>", " ", page, flags=re.S)).split())


def _rows(page: str) -> list[dict[str, tuple[str, str]]]:
    """The trials table: each row as {trials.csv column: (the cell's text, its tooltip)}."""
    table = page[page.index("<h2>Trials"):]
    keys = re.findall(r'<th title="([^"]*)">', table)
    cell = re.compile(r'<td(?: class="t")?(?: title="([^"]*)")?>([^<]*)</td>')
    return [{k: (html.unescape(text), html.unescape(tip)) for k, (tip, text) in zip(keys, cell.findall(r))}
            for r in re.findall(r"<tr>(<td.*?)</tr>", table, flags=re.S)]


def test_numbers_and_verdicts_read_as_people_write_them(site, results):
    page = (site / "report.html").read_text()
    text = _text(page[page.index("<h2>Trials"):])
    assert not re.search(r"\d[eE][+-]\d", text) and "None" not in text and " nan" not in text.lower()
    rows = {r["trial"][0]: r for r in _rows(page)}
    frame = pd.read_parquet(results / "trials.parquet").set_index("trial")
    assert len(rows) == len(frame) == 6
    for n, r in rows.items():
        assert re.fullmatch(r"\d{1,3}(,\d{3})*|—", r["output_tok_s"][0]), r["output_tok_s"]
        assert r["output_tok_s"][0] == "—" or float(r["output_tok_s"][0].replace(",", "")) == \
            pytest.approx(frame.loc[int(n), "output_tok_s"], abs=0.5)
    reason = frame.loc[0, "verdict"]
    assert reason.startswith("ok (near-tie threshold")  # the validator's words for the baseline ...
    assert rows["0"]["verdict"] == ("correct (lossless: the reference)", reason)  # ... a person's, the rest a tooltip
    assert rows["1"]["verdict"] == ("correct (lossless)", "")
    drift = next(r for r in rows.values() if "kv=fp8" in r["label"][0])
    assert drift["verdict"][0].startswith("wrong: log-prob drift") and drift["verdict"][1].startswith("log-prob drift")
    crash = next(r for r in rows.values() if "q=crash" in r["label"][0])
    assert crash["state"][0] == "failed" and crash["failure"][0].startswith("RuntimeError: fake engine init failed")
    assert [r["failure"][0] for r in rows.values()].count("—") == 5  # no failure: a dash, not None


def test_figures_are_formatted_for_people():
    from autotune.results.table import number, speedup, trials_html

    assert [number(v) for v in (1116.4, 295.1, 16.33, 2.891, 0.98, None, float("nan"))] == \
        ["1,116", "295", "16.3", "2.89", "0.98", "—", "—"]
    assert speedup(2.891, 1.46, 5.71) == "2.89x [1.46-5.71]" and speedup(1.0) == "1.00x"
    frame = pd.DataFrame([{"trial": 3, "state": "COMPLETE", "role": "candidate", "label": "ngram k=3", "pareto": True,
                           "correct": True, "status": "ok", "verdict": "ok", "output_tok_s": 1116.4,
                           "e2e_ms_p50": 1234.5, "speedup_output_tok_s": 1.12e3, "failure": None}])
    table = trials_html(frame, {"baseline": {"trial": 0, "label": "none"}})
    assert "<td>1,116</td><td>1,234</td><td>1,120x</td>" in table and "<td>yes</td>" in table
    assert "e+0" not in table and "None" not in table and "correct (lossless)" in table


def test_the_page_serves_the_pick_as_export_prints_it(site, results):
    from autotune.core.study_report import load_report
    from autotune.serve.export import explained_command

    page = (site / "report.html").read_text()
    shown = re.search(r'<pre class="command">(.*?)</pre>', page, flags=re.S).group(1)
    assert html.unescape(shown) == explained_command(load_report(results))
    assert "-m autotune.vllm_cli serve fake-model" in html.unescape(shown)  # a CPU study: the launcher
    assert f"```\n{html.unescape(shown)}```" in (results / "report.md").read_text()  # report.md: the same one


def test_report_defaults_to_results_report_folder(results):
    r = runner.invoke(app, ["report", str(results / "best.json")])
    assert r.exit_code == 0, r.output
    assert (results / "report" / "report.html").is_file() and (results / "report" / "pareto.png").is_file()


def test_report_reads_trials_csv_when_there_is_no_parquet(results, tmp_path):
    old = tmp_path / "old"  # results written before trials.parquet existed
    shutil.copytree(results, old, ignore=shutil.ignore_patterns("trials.parquet", "report", "trials"))
    files = write_report(old)
    assert [f.name for f in files] == ["report.html", "pareto.png", "speedup.png", "prediction.png", "acceptance.png",
                                         "importance.png"]
    assert ">baseline</text>" in (old / "report" / "report.html").read_text()


def test_report_runs_where_vllm_cannot_be_imported(results, tmp_path):
    code = (
        "import sys\n"
        "class Block:\n"
        "    tried = []\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('vllm', 'torch'):\n"
        "            Block.tried.append(name); raise ImportError(name + ' is not installed here')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from autotune.cli.app import app\n"
        f"try:\n    app(['report', {str(results)!r}, '-o', {str(tmp_path)!r}])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "assert not Block.tried and 'autotune.run.engine' not in sys.modules, (Block.tried, 'autotune.run.engine')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "report.html").is_file()


@pytest.mark.parametrize("setup, fragment", [
    ("missing", "missing: no such results folder"),
    ("empty", "best.json: no such results file"),
    ("no_trials", "no trials.parquet or trials.csv"),
    ("bad_trials", "trials.csv: expected columns"),
])
def test_bad_results_exit_2_with_one_line(results, tmp_path, setup, fragment):
    folder = tmp_path / setup
    if setup != "missing":
        folder.mkdir()
    if setup in ("no_trials", "bad_trials"):
        shutil.copy(results / "best.json", folder)
    if setup == "bad_trials":
        (folder / "trials.csv").write_text("a,b\n1,2\n")
    r = runner.invoke(app, ["report", str(folder)])
    assert r.exit_code == 2, r.output
    assert len(r.stderr.strip().splitlines()) <= 3 and fragment in " ".join(r.stderr.split()), r.stderr
    assert not (folder / "report").exists()


def test_too_few_trials_give_a_note_instead_of_importances(tmp_path):
    study = optuna.create_study(study_name="few", storage=f"sqlite:///{tmp_path / 'study.db'}",
                                directions=["maximize", "minimize"])
    k_range = optuna.distributions.IntDistribution(0, 5)
    for k in range(MIN_TRIALS_FOR_IMPORTANCE - 1):
        study.add_trial(optuna.trial.create_trial(params={"k": k}, distributions={"k": k_range},
                                                  values=[k, 1.0 / (k + 1)]))
    chart = importance_chart(tmp_path, {"study": "few", "objectives": ["output_tok_s", "e2e_ms_p50"]})
    assert not chart.series and chart.note.startswith("Too few trials for parameter importances: 3 first measurements")


def test_report_help_has_examples():
    r = runner.invoke(app, ["report", "--help"])
    assert r.exit_code == 0 and "Examples" in r.stdout


@pytest.mark.skipif(not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
                    reason=f"{CHROMIUM} not installed (CI installs it: apt-get install chromium fonts-liberation)")
def test_report_renders_in_headless_chromium(site, tmp_path):
    shot = tmp_path / "screenshot.png"
    # --disable-dev-shm-usage: containers often have a 64 MB /dev/shm, too small for a renderer.
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
                        "--window-size=1400,2000", f"--screenshot={shot}", (site / "report.html").as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and shot.is_file(), p.stderr[-2000:]
    img = imread(shot)[..., :3]
    assert img.shape[:2] == (2000, 1400)
    assert colours(img) > 100  # plots, not a blank or error page
    assert (img.min(axis=2) < 0.9).mean() > 0.02  # a few per cent of the page is ink
    if os.environ.get(SCREENSHOT_ENV):  # the docs' picture of the report, from this page
        shutil.copy(shot, os.environ[SCREENSHOT_ENV])
