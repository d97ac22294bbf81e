"""`autotune watch` against a real `vllm serve` of a study's pick (vLLM CPU build, the demo pair).

A short study on examples/json_edit.jsonl (the baseline and an ngram pick, in-process), its pick
served as `autotune serve` serves it, then two windows of `watch --once`, each while traffic of one
kind runs through the whole window at concurrency 1 (a client loop, stopped after the window):
- the study's own kind of request (json_edit: edits that copy their input): ok, exit 0;
- support chats (examples/support_chat.jsonl: answers that copy little of the prompt, so ngram finds
  few drafts): drift, exit 5, naming the acceptance that moved and the forecast at it.
The shared study (conftest.study_dir) is not reused: its pick may be the draft model, and the
lines checked here name an ngram pick of two measured configs.
"""

from __future__ import annotations

import faulthandler
import json
import sys
import tempfile
import threading
import time
import urllib.request
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from autotune.cli.app import app
from autotune.serve.servers import HOST, free_port, serving

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parent.parent
PICK = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
        "kv_cache_dtype": "auto", "quantization": "none", "enforce_eager": True}
WINDOW_S = "8"  # tens of requests of the demo pair on 2 cores


@pytest.fixture(scope="module")
def served(tmp_path_factory, engine_launcher):
    """(results folder, server URL): the short study's pick, served by `autotune serve`, which has
    answered a completion with text (the only test of `autotune serve` on the real engine)."""
    tmp = tmp_path_factory.mktemp("watch")
    r = CliRunner().invoke(app, ["search", "examples/json_edit.jsonl", "--space", "tests/data/engine_space.yaml",
                                 "--trials", "2", "--try", json.dumps(PICK), "--results", str(tmp), "--study", "w",
                                 "--repeats", "1", "--max-repeats", "0", "--warmup", "1", "--samples", "0",
                                 "--no-remeasure", "--no-schedule", "--instrument", "inprocess",
                                 "--trial-timeout", "300"])
    print(r.output)
    assert r.exit_code == 0, r.output
    results = tmp / "w"
    assert json.loads((results / "best.json").read_text())["best"]["candidate"]["method"] == "ngram"
    port = free_port()
    argv = [sys.executable, "-m", "autotune.cli.app", "serve", str(results), "--host", HOST, "--port", str(port)]
    with serving(argv, port=port, log_path=tmp / "server.log", what="autotune serve") as server:
        _send(server.base_url, _requests("examples/json_edit.jsonl")[:2])  # ngram's JIT compile: before any window
        # `autotune serve` hands back the pick as a working server: a completion with text
        out = _complete(server.base_url, {**_requests("examples/smoke.jsonl")[0], "max_tokens": 24})
        assert out["choices"][0]["text"].strip() and out["usage"]["completion_tokens"] > 0, out
        yield results, server.base_url


def _requests(path: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / path).read_text().splitlines() if line.strip()]


def _send(url: str, rows: list[dict], stop: threading.Event | None = None) -> int:
    """Send ``rows`` one at a time (cycling until ``stop`` is set, when given); the number sent."""
    sent = 0
    while True:
        for row in rows:
            if stop is not None and stop.is_set():
                return sent
            _complete(url, row)
            sent += 1
        if stop is None:
            return sent


def _complete(url: str, row: dict) -> dict:
    """One greedy request (a completion, or a chat where ``row`` has messages); the server's answer."""
    chat = "messages" in row
    body = {"model": _model(url), "max_tokens": row["max_tokens"], "temperature": 0.0,
            **({"messages": row["messages"]} if chat else {"prompt": row["prompt"]})}
    req = urllib.request.Request(url + ("/v1/chat/completions" if chat else "/v1/completions"),
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        return json.load(r)


def _model(url: str, _cache: dict = {}) -> str:  # noqa: B006 - one lookup per server
    if url not in _cache:
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
            _cache[url] = json.load(r)["data"][0]["id"]
    return _cache[url]


SLOW_S = 60  # one --once window of 8 s takes ~10 s here in-process


def _watch(results: Path, url: str, *extra: str) -> Result:
    """`autotune watch --once` in this process (a process of its own starts in seconds idle, but took
    15-55 s here beside a busy server). CI's run at 7f48401 spent 11 and 5 minutes in the --json
    window's call, which no run here repeated (10 runs, alone and after the suffix tests): a call past
    SLOW_S has every thread's stack written (faulthandler) and said in a warning, which CI's summary
    shows, so the next one says where it waited."""
    with tempfile.TemporaryFile("w+") as stacks:
        faulthandler.dump_traceback_later(SLOW_S, file=stacks)
        t0 = time.monotonic()
        try:
            r = CliRunner().invoke(app, ["watch", str(results), "--url", url, "--interval", WINDOW_S, "--once", *extra])
        finally:
            faulthandler.cancel_dump_traceback_later()
        took = time.monotonic() - t0
        if took > SLOW_S:
            stacks.seek(0)
            warnings.warn(f"watch --once {' '.join(extra)} took {took:.0f} s; the threads at {SLOW_S} s:\n"
                          f"{stacks.read()[-6000:]}", stacklevel=2)
    return r


def _watch_during(results: Path, url: str, workload: str) -> tuple[int, str, dict]:
    """`watch --once` (text, then --json on the next window) while ``workload``'s requests run."""
    stop = threading.Event()
    client = threading.Thread(target=_send, args=(url, _requests(workload), stop), daemon=True)
    client.start()
    try:
        text = _watch(results, url)
        as_json = _watch(results, url, "--json")
    finally:
        stop.set()
        client.join(timeout=120)
    print(text.output)
    assert text.exit_code == as_json.exit_code, (text.output, as_json.output)
    return text.exit_code, text.output.strip(), json.loads(as_json.output)


def test_watch_says_ok_on_the_studys_traffic_and_drift_on_chats(served):
    results, url = served
    code, line, data = _watch_during(results, url, "examples/json_edit.jsonl")
    assert code == 0 and line.startswith("ok: ngram k=3"), line
    assert data["status"] == "ok" and data["window"]["requests"] >= 5 and not data["moved"], data
    assert "forecast" in line and "tokens/step" in line

    code, line, data = _watch_during(results, url, "examples/support_chat.jsonl")
    assert code == 5 and line.startswith("drift: ngram k=3"), line
    assert "tokens/step" in data["moved"] and "tokens/step" in line and " -> " in line, line
    tps = next(m for m in data["compared"] if m["metric"] == "tokens/step")
    assert tps["live"] < tps["lo"] and tps["change"] < -0.3, tps
    # The forecast at the live acceptance: below the study's, and it names what it now prefers.
    # The text and the JSON are two windows of live traffic, so the figures are checked against the
    # JSON's own line (same window); the text line only for its shape.
    live, then = data["forecast"]["at_live"]["speedup"], data["forecast"]["at_study"]["speedup"]
    assert live < then and f"forecast {live:.2f}x at the live acceptance" in data["line"], data["line"]
    assert "x at the live acceptance" in line, line
    assert "the forecast now prefers " in line or "still the forecast's best of the 2 measured" in line, line
    # Whether ngram still beats the baseline at the live acceptance depends on how much the chats
    # drafted in that window (1.14x in one CI run, below 1x in others): the line must name the
    # ranking's own head, whichever it is.
    ranking = [f for f in data["ranking"] if f["speedup"] is not None]
    assert data["preferred"]["label"] == max(ranking, key=lambda f: f["speedup"])["label"], data["ranking"]
    if data["preferred"]["label"] == data["deployed"]:
        assert "still the forecast's best of the 2 measured configs" in data["line"], data["line"]
    else:
        assert f"the forecast now prefers {data['preferred']['label']}" in data["line"], data["line"]
