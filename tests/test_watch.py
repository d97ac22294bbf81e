"""`autotune watch` without an engine: recorded /metrics pages, hand-built study records.

tests/data/watch/*.txt are real pages of `vllm serve` (vLLM 0.32.0 CPU build, the demo target, ngram
k=3 lookup 2..4), trimmed to the metric families watch reads: at start, after 4 json_edit requests,
after 4 support_chat requests more. The real-engine test is tests/test_engine_watch.py.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.core import errors
from autotune.cli.app import app
from autotune.gate.deployed import Deployed, project
from autotune.core.errors import BadInput, Unreachable
from autotune.forecast.forecast import AcceptanceTable, Model, Observation
from autotune.gate.live import fetch_metrics, parse_scrape, window
from autotune.forecast.predict import Acceptance
from autotune.serve.servers import free_port
from autotune.gate.watch import DRIFT, IDLE, NO_BAND, NO_DRAFTS, OK, judge, parse_interval

DATA = Path(__file__).resolve().parent / "data" / "watch"
PAGES = {n: (DATA / f"{n}.txt").read_text() for n in ("start", "edit", "chat")}
BASE = {"method": "none", "kv_cache_dtype": "auto", "quantization": "none", "enforce_eager": True}
PICK = {**BASE, "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
LABEL = "ngram k=3 lookup=2..4 eager"
runner = CliRunner()


def scrape(name: str, t: float = 0.0):
    return parse_scrape(PAGES[name], t)


def edit_window():
    return window(scrape("start", 0.0), scrape("edit", 10.0))


def chat_window():
    return window(scrape("edit", 0.0), scrape("chat", 10.0))


def _report(best: dict | None) -> dict:
    return {"schema_version": 1, "study": "w", "load": "concurrency=1", "concurrency": 1, "best": best}


def _best(**measured) -> dict:
    m = {"acceptance_by_pos": [0.97, 0.92, 0.83], "mean_accepted_length": 3.72, "req_s": 10.0, "e2e_ms_mean": 95.0,
         **measured}
    return {"label": LABEL, "candidate": PICK, "measurement": m, "speedup": {"output_tok_s": 2.0}}


def _per_request() -> list[Acceptance]:
    """Edits as the recorded window shows them: 11 drafts and 13 decode steps a request."""
    shapes = [(11, 10, 9), (11, 11, 10), (10, 10, 9), (11, 10, 9), (11, 11, 9), (11, 10, 10)] * 4
    return [Acceptance(11, 33, sum(p), p, 1 + 13 + sum(p), 13, 1) for p in shapes]


def deployed(tmp_path: Path, **measured) -> Deployed:
    """The pick with the study's per-request acceptance (as a replay gives it), no step-cost model."""
    reqs = _per_request()
    pooled = sum(reqs, Acceptance())
    return Deployed(tmp_path, _report(_best(**measured)), dict(PICK), LABEL, _best(**measured)["measurement"],
                    per_request=reqs, pooled=pooled)


# ---------------------------------------------------------------------------------------- live counters


def test_a_window_is_the_increase_between_two_recorded_scrapes():
    w = edit_window()
    assert (w.drafts, w.draft_tokens, w.accepted, w.per_pos) == (44, 132, 121, (43, 41, 37))
    assert (w.generated, w.requests, w.depth, w.restarted) == (177, 4, 3, False)
    assert w.steps == 177 - 4 - 121  # each request's first token is its prefill's
    assert w.acceptance().tokens_per_step == pytest.approx((177 - 4) / 52)
    c = chat_window()
    assert (c.drafts, c.accepted, c.per_pos, c.requests) == (8, 11, (4, 4, 3), 4)


def test_a_restarted_server_counts_from_its_start():
    w = window(scrape("chat", 0.0), scrape("edit", 10.0))  # every counter went down
    assert w.restarted and (w.drafts, w.per_pos, w.generated) == (44, (43, 41, 37), 177)


@pytest.mark.parametrize("page, says", [
    ("".join(ln for ln in PAGES["edit"].splitlines(True) if "spec_decode" not in ln),
     "no speculative-decoding metrics"),
    ("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n", "no vLLM metrics"),
    ("<html>not found</html>\n", "not Prometheus text"),
])
def test_pages_without_what_watch_reads_are_bad_input(page, says):
    with pytest.raises(BadInput, match=says):
        parse_scrape(page, 0.0, where="http://h:1/metrics")


def test_unreachable_server_and_bad_url_are_one_line_each():
    with pytest.raises(Unreachable, match=r"^http://127\.0\.0\.1:\d+/metrics: cannot reach the server"):
        fetch_metrics(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(BadInput, match="--url: expected http://HOST:PORT"):
        fetch_metrics("127.0.0.1:8000")


@pytest.mark.parametrize("text, seconds", [("60", 60.0), ("60s", 60.0), ("2m", 120.0), ("0.5", 0.5)])
def test_parse_interval(text, seconds):
    assert parse_interval(text) == seconds


@pytest.mark.parametrize("text", ["soon", "0", "-5s"])
def test_bad_interval(text):
    with pytest.raises(BadInput, match="--interval"):
        parse_interval(text)


# ---------------------------------------------------------------------------------------- the comparison


def test_the_studys_kind_of_traffic_is_ok(tmp_path):
    v = judge(deployed(tmp_path), edit_window())
    assert (v.status, v.exit_code, v.moved) == (OK, errors.OK, [])
    assert v.line().startswith(f"ok: {LABEL}, 4 requests in 10 s: mean accepted length 3.75 (study ")


def test_chats_drift_and_the_line_names_what_moved_and_by_how_much(tmp_path):
    v = judge(deployed(tmp_path), chat_window())
    assert (v.status, v.exit_code) == (DRIFT, errors.DRIFT)
    assert {"tokens/step", "mean accepted length", "position 1"} <= set(v.moved)
    tps = next(m for m in v.compared if m.metric == "tokens/step")
    assert tps.live == pytest.approx(93 / 82) and tps.live < tps.lo and tps.change < -0.5
    line = v.line()
    assert line.startswith(f"drift: {LABEL}, 4 requests in 10 s: mean accepted length 3.77 -> 2.38 (-37%, outside 3.65-3.89), ")
    assert "tokens/step 3.35 -> 1.13 (-66%, outside 3.24-3.44)" in line
    assert "acceptance by position 0.98/0.94/0.85 -> 0.50/0.50/0.38 (outside at 1, 2, 3)" in line


def test_few_requests_widen_the_interval(tmp_path):
    d = deployed(tmp_path)
    one, many = d.expected(1).tokens_per_step, d.expected(100).tokens_per_step
    assert one.lo < many.lo <= many.value <= many.hi < one.hi
    # but never below the study's own sampling error: its 24 requests estimate the value too
    huge = d.expected(100_000).tokens_per_step
    assert huge.hi - huge.lo > 0.5 * (many.hi - many.lo)


def test_load_beyond_the_measured_level_is_drift(tmp_path):
    w = edit_window()
    busy = type(w)(**{**w.__dict__, "in_flight": 6.0, "waiting": 3.0})
    v = judge(deployed(tmp_path), busy)
    assert v.status == DRIFT and v.moved == ["in flight"]
    assert "in flight 0.95 -> 6.00 (+532%, outside 0.63-1.42)" in v.line()
    # a lightly used server batches one request at a time, as the study at concurrency 1 did
    quiet = type(w)(**{**w.__dict__, "in_flight": 0.1})
    assert judge(deployed(tmp_path), quiet).status == OK


def test_without_per_request_acceptance_the_measured_values_and_a_tolerance(tmp_path):
    d = deployed(tmp_path)
    d.per_request, d.pooled, d.note = [], None, "no study storage at w/study.db (pass --storage): no forecast"
    v = judge(d, chat_window())
    assert v.status == DRIFT and "tokens/step" not in {m.metric for m in v.compared}
    assert "+-15%" in v.basis


def test_a_missing_band_is_never_ok_and_says_which(tmp_path):
    """Without the study's storage there is no tokens/step band: the study's kind of traffic used to
    be 'ok' on acceptance alone, though tokens/step is what the speedup rests on. Now: exit 5, named."""
    d = deployed(tmp_path)
    d.per_request, d.pooled, d.note = [], None, "no study storage at w/study.db (pass --storage): no forecast"
    v = judge(d, edit_window())
    assert (v.status, v.exit_code, v.moved) == (NO_BAND, errors.DRIFT, [])
    assert v.missing == ["tokens/step (no study storage at w/study.db (pass --storage): no forecast)"]
    assert v.line().startswith(f"no band: {LABEL}, 4 requests in 10 s: mean accepted length 3.75 (study 3.16-4.28)")
    assert v.line().endswith("; no band to judge tokens/step (no study storage at w/study.db (pass --storage): "
                             "no forecast)")
    # A measured value that is not a number is no band either (it used to hold any live value).
    nan = deployed(tmp_path, mean_accepted_length=float("nan"))
    nan.per_request, nan.pooled = [], None
    assert any(m.startswith("mean accepted length") for m in judge(nan, edit_window()).missing)


def test_a_live_value_that_is_not_a_number_holds_no_band():
    from autotune.gate.deployed import Band

    b = Band(3.0, 2.5, 3.5)
    assert b.holds(3.0) and not b.holds(float("nan")) and not Band(float("nan"), 2.5, 3.5).holds(3.0)


def _no_drafts(w):
    """The window as a server with speculation off shows it: tokens generated, not one draft."""
    return type(w)(**{**w.__dict__, "drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": (0, 0, 0)})


@pytest.mark.parametrize("replay", [True, False])
def test_a_busy_window_without_drafts_is_no_drafts_exit_5(tmp_path, replay):
    """A server that generated tokens but drafted none (speculation off, misconfigured) used to be
    'ok' without the study's storage (every NaN live value counted as inside its band)."""
    d = deployed(tmp_path)
    if not replay:
        d.per_request, d.pooled = [], None
    v = judge(d, _no_drafts(edit_window()))
    assert (v.status, v.exit_code) == (NO_DRAFTS, errors.DRIFT)
    assert v.line() == (f"no drafts: {LABEL}, 4 requests in 10 s: 177 output tokens and no drafts: the server is "
                        "not speculating (speculation off, or a misconfigured server); the deployed pick drafts up "
                        "to 3 a step")


def test_an_idle_window_is_not_judged(tmp_path):
    v = judge(deployed(tmp_path), window(scrape("edit", 0.0), scrape("edit", 60.0)))
    assert (v.status, v.exit_code) == (IDLE, errors.IDLE)  # never 0: a watch of the wrong server judged nothing
    assert v.line() == f"idle: {LABEL}, 0 requests in 60 s: no output tokens, nothing to compare"


def test_a_server_running_another_depth_is_bad_input(tmp_path):
    d = deployed(tmp_path)
    d.params["num_speculative_tokens"] = 5
    with pytest.raises(BadInput, match="the server drafts up to 3 tokens a step, .* 5: is the server running this pick"):
        judge(d, edit_window())


# ---------------------------------------------------------------------------------------- forecasts


def _model() -> Model:
    """The step-cost model of a study whose outputs copy their prompts (ngram accepts most drafts)."""
    body = list(range(100, 140))
    outputs = [{"id": f"r{i}", "prompt_token_ids": [1, 2, *body, 3], "token_ids": [*body[i:], 4]} for i in range(8)]
    table = AcceptanceTable(outputs, None, 1024)
    return Model(table, [Observation(BASE, 1.0, 1.0, 1.0), Observation(PICK, 2.2, 2.0, 2.4)], BASE, 0.1)


def test_the_forecast_at_live_acceptance_falls_and_now_prefers_no_speculation(tmp_path):
    d = deployed(tmp_path)
    d.model, d.observations = _model(), [Observation(BASE, 1.0, 1.0, 1.0), Observation(PICK, 2.2, 2.0, 2.4)]
    at_study, at_live, ranking = d.forecasts(edit_window().acceptance())
    assert at_live.speedup > 1.5 and ranking[0].label == LABEL
    v = judge(d, chat_window())
    assert v.at_live.speedup < 1.0 < v.at_study.speedup
    assert v.preferred.label == "none eager" and v.preferred.speedup == pytest.approx(1.0)
    assert (f"; forecast {v.at_live.speedup:.2f}x at the live acceptance (study {v.at_study.speedup:.2f}x, "
            "measured 2.00x); the forecast now prefers none eager (1.00x)") in v.line()


def test_other_depths_of_the_deployed_method_get_the_live_acceptance_projected():
    live = edit_window().acceptance()
    assert project(live, 3) == project(live, 3)  # deterministic
    same = project(live, 3)
    assert same.tokens_per_step == pytest.approx(live.tokens_per_step)
    shallow, deep = project(live, 1), project(live, 6)
    assert 1 < shallow.tokens_per_step < live.tokens_per_step < deep.tokens_per_step < 1 + 6
    assert shallow.per_pos[0] == pytest.approx(same.per_pos[0])


# ---------------------------------------------------------------------------------------- the command


@pytest.fixture
def server():
    """A stand-in for a vLLM server: each GET /metrics answers the next recorded page."""
    pages: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (pages.pop(0) if pages else "").encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", pages
    httpd.shutdown()


def _results(tmp_path: Path, best: dict | None) -> Path:
    d = tmp_path / "w"
    d.mkdir()
    (d / "best.json").write_text(json.dumps(_report(best)))
    return d


class Clock:
    """time for autotune.gate.watch: a sleep passes at once, and the window is as long as asked."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    strftime = staticmethod(time.strftime)


def test_cli_once_ok_then_drift_with_json_and_a_profile(tmp_path, server, monkeypatch):
    url, pages = server
    monkeypatch.setattr("autotune.gate.watch.time", Clock())
    results = _results(tmp_path, _best())
    pages += [PAGES["start"], PAGES["edit"]]
    r = runner.invoke(app, ["watch", str(results), "--url", url, "--interval", "10", "--once"])
    assert r.exit_code == errors.DRIFT, r.output  # no study.db: no tokens/step band, so never ok
    assert r.output.startswith(f"no band: {LABEL}, 4 requests in 10 s: mean accepted length 3.75 (study 3.16-4.28)")
    assert "no band to judge tokens/step (no study storage at " in r.output
    # With the study's replay (as study.db gives it): ok.
    monkeypatch.setattr("autotune.gate.deployed.load_deployed", lambda *a, **k: deployed(results))
    pages += [PAGES["start"], PAGES["edit"]]
    r = runner.invoke(app, ["watch", str(results), "--url", url, "--interval", "10", "--once"])
    assert r.exit_code == errors.OK and r.output.startswith(f"ok: {LABEL}, 4 requests in 10 s: "), r.output
    pages += [PAGES["edit"], PAGES["chat"]]
    profile = tmp_path / "profile.json"
    r = runner.invoke(app, ["watch", str(results), "--url", url, "--interval", "10", "--once", "--json",
                            "--profile", str(profile)])
    assert r.exit_code == errors.DRIFT, r.output
    data = json.loads(r.output)
    assert data["status"] == "drift" and data["line"].startswith("drift: ") and "mean accepted length" in data["moved"]
    assert data["forecast"]["at_live"] is None  # no study storage: no step-cost model
    saved = json.loads(profile.read_text())
    assert (saved["drafts"], saved["accepted_per_pos"], saved["deployed"]) == (8, [4, 4, 3], LABEL)


@pytest.mark.parametrize("case, says", [
    ("no_spec", "no speculative-decoding metrics"),
    ("no_pick", "no deployed pick in best.json"),
    ("no_results", "no such results file"),
    ("not_speculative", r"the deployed pick \(none eager\) runs without speculation"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, server, case, says):
    url, pages = server
    best = {"no_pick": None, "not_speculative": {**_best(), "candidate": BASE, "label": "none eager"}}
    results = _results(tmp_path, best.get(case, _best()))
    if case == "no_spec":
        pages.append("".join(ln for ln in PAGES["edit"].splitlines(True) if "spec_decode" not in ln))
    if case == "no_results":
        results = tmp_path / "missing"
    r = runner.invoke(app, ["watch", str(results), "--url", url, "--interval", "0.01", "--once"])
    assert r.exit_code == errors.BAD_INPUT, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output, r.output
    assert re.search(says, r.output.strip()), r.output


def test_an_unreachable_server_is_retried_then_its_own_exit_code(tmp_path, monkeypatch):
    """A brief outage used to end watch as bad input (exit 2) at once. Now it is tried again for
    --retry-s seconds; a server back within them is watched on, one that stays away is exit 6."""
    clock = Clock()
    monkeypatch.setattr("autotune.gate.watch.time", clock)
    results = _results(tmp_path, _best())
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = runner.invoke(app, ["watch", str(results), "--url", url, "--interval", "10", "--once", "--retry-s", "12"])
    assert r.exit_code == errors.UNREACHABLE == 6, r.output
    assert re.fullmatch(r"error: http://127\.0\.0\.1:\d+/metrics: cannot reach the server \(.*\); tried for 12 s "
                        r"\(--retry-s\)", r.output.strip()), r.output
    assert clock.now == pytest.approx(12)  # it kept trying for the time asked, no longer
    # Down for two tries (refused, then a 503 while it restarts), then back: the window is judged.
    answers = [Unreachable("refused"), Unreachable("HTTP 503"), PAGES["start"], PAGES["edit"]]

    def flaky(u, **k):
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    monkeypatch.setattr("autotune.gate.watch.fetch_metrics", flaky)
    monkeypatch.setattr("autotune.gate.deployed.load_deployed", lambda *a, **k: deployed(results))
    r = runner.invoke(app, ["watch", str(results), "--url", url, "--interval", "10", "--once", "--retry-s", "60"])
    assert r.exit_code == errors.OK and r.output.startswith("ok: "), r.output
    assert "6 unreachable (watch)" in runner.invoke(app, ["--help"]).output.replace("\n", " ")


# ---------------------------------------------------------------------------------------- a saved study


def test_a_saved_study_gives_the_model_the_replays_and_the_load(tmp_path, monkeypatch, fake_engine_env):
    """A real results folder and Optuna storage (trials on the FAKE engine, whose outputs never
    repeat, so ngram replays to no drafts): live acceptance far above the study's is drift too,
    and the forecast at it rises."""
    from autotune.gate.deployed import load_deployed

    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    r = runner.invoke(app, ["search", "examples/smoke.jsonl", "--space", "tests/data/fake_space_ok.yaml",
                            "--trials", "2", "--study", "dep", "--try", '{"method": "ngram", "num_speculative_tokens": 3}',
                            "--model", "fake-model", "--samples", "0", "--results", str(tmp_path), "--no-remeasure"])
    assert r.exit_code == 0, r.output
    d = load_deployed(tmp_path / "dep")
    assert d.label == "ngram k=3" and d.model is not None and not d.note
    assert len(d.per_request) == 6 and d.pooled.drafts == 0 and d.pooled.tokens_per_step == 1.0
    assert d.in_flight() and all(0.5 < x <= 1.05 for x in d.in_flight())  # concurrency 1
    v = judge(d, edit_window())
    assert v.status == DRIFT and v.moved == ["tokens/step"]
    assert v.at_live.speedup > v.at_study.speedup and v.ranking[0].label == "ngram k=3"
    with pytest.raises(BadInput, match="--storage: no study 'dep'"):
        load_deployed(tmp_path / "dep", storage=f"sqlite:///{tmp_path / 'other.db'}")


@pytest.mark.parametrize("params", [PICK, {**PICK, "method": "suffix", "prompt_lookup_max": None,
                                           "prompt_lookup_min": None}])
def test_per_request_replays_add_up_to_the_studys_replay(params):
    """ngram's requests replay alone; suffix decoding's share one cache, each request after the ones
    before it, so that they add up to the whole workload's replay too."""
    from autotune.gate.deployed import per_request
    from autotune.forecast.predict import suffix_available

    if params["method"] == "suffix" and not suffix_available():
        pytest.skip("Arctic Inference is not installed")
    params = {k: v for k, v in params.items() if v is not None}
    table = _model().table
    reqs = per_request(table, params)
    assert len(reqs) == 8 and sum(reqs, Acceptance()) == table.get(params)
    if params["method"] == "suffix":  # a later request drafts from the earlier ones' responses
        assert reqs[-1].accepted > per_request(replace_outputs(table, table.outputs[-1:]), params)[0].accepted


def replace_outputs(table, outputs):
    from dataclasses import replace

    return replace(table, outputs=outputs, _cache={})
