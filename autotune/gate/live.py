"""A running vLLM server's counters: scrape ``/metrics``, and diff two scrapes into a window.

vLLM's counters are cumulative since the server started (Prometheus counters): what traffic does
*now* is the increase between two scrapes, as Prometheus' ``increase()`` computes it. A counter
that went down means the server restarted between the scrapes; then, as ``increase()`` does, the
second scrape's value is the window's. The speculative counters are read with the one parser the
served instrument uses (autotune.run.served_engine.parse_counters, prometheus_client's text parser);
the few others a window needs (tokens generated, requests started, their latency, the running and
waiting gauges) are read the same way here. No vLLM import: a server is reached over HTTP only.
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from autotune.core.errors import BadInput, Unreachable
from autotune.forecast.predict import Acceptance
from autotune.run.served_engine import PER_POS, SPEC_COUNTERS, parse_counters

SCRAPE_TIMEOUT_S = 10.0
GENERATED = "vllm:generation_tokens"  # counter: output tokens, speculative ones included
STARTED = "vllm:time_to_first_token_seconds"  # histogram: its count is the requests that got a first token
LATENCY = "vllm:e2e_request_latency_seconds"  # histogram: its sum over a window / the window = mean in flight
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"  # gauges


@dataclass(frozen=True)
class Scrape:
    """One ``/metrics`` page: the counters a window needs, and the gauges at that moment."""

    t: float  # seconds (any clock; only differences are used)
    spec: dict[str, Any]  # parse_counters' result: drafts, draft tokens, accepted, per position
    generated: float = 0.0
    started: float = 0.0
    latency_s: float = 0.0
    running: float = 0.0
    waiting: float = 0.0


def parse_scrape(text: str, t: float, *, where: str = "/metrics") -> Scrape:
    """A Scrape from Prometheus text; BadInput when it is not vLLM's or has no speculative metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise BadInput(f"{where}: not Prometheus text ({str(e)[:120]})") from None
    names = {f.name for f in families}
    if not any(n.startswith("vllm:") for n in names):
        raise BadInput(f"{where}: no vLLM metrics (vllm:*) on the page: is it a vLLM server?")
    if not all(n in names for n in SPEC_COUNTERS):
        raise BadInput(f"{where}: no speculative-decoding metrics (vllm:spec_decode_*): the server runs "
                       "without speculation, so there is nothing to compare with the tuned config")
    got = {GENERATED + "_total": 0.0, STARTED + "_count": 0.0, LATENCY + "_sum": 0.0, RUNNING: 0.0, WAITING: 0.0}
    for fam in families:
        for s in fam.samples:
            if s.name in got:  # summed over label sets (engines, models)
                got[s.name] += s.value
    return Scrape(t, parse_counters(text), got[GENERATED + "_total"], got[STARTED + "_count"],
                  got[LATENCY + "_sum"], got[RUNNING], got[WAITING])


def fetch_metrics(url: str, *, timeout_s: float = SCRAPE_TIMEOUT_S) -> str:
    """The text of ``URL/metrics``; Unreachable (one line) when the server does not answer (refused,
    timed out, HTTP 5xx: an outage or a restart, which `watch` retries), BadInput when it answers
    something else than a vLLM server would (HTTP 4xx) or the URL is malformed."""
    if not url.startswith(("http://", "https://")):
        raise BadInput(f"--url: expected http://HOST:PORT (the vLLM server), got {url!r}")
    target = url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as r:
            return r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        if e.code >= 500:
            raise Unreachable(f"{target}: HTTP {e.code} ({e.reason}): the server is not serving") from None
        raise BadInput(f"{target}: HTTP {e.code} ({e.reason}): is it a vLLM server?") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise Unreachable(f"{target}: cannot reach the server ({reason})") from None


@dataclass(frozen=True)
class Window:
    """What the server did between two scrapes."""

    seconds: float
    drafts: int
    draft_tokens: int
    accepted: int
    per_pos: tuple[int, ...]
    generated: int  # output tokens
    requests: int  # requests that got their first token in the window
    in_flight: float  # mean requests in flight (Little's law: finished requests' latency / window)
    running: float  # the gauges at the window's end
    waiting: float
    restarted: bool = False  # a counter went down: the server restarted, the window starts at its start
    depth: int = 0  # the server's draft depth: how many positions vLLM counts

    @property
    def idle(self) -> bool:
        return self.generated <= 0

    @property
    def steps(self) -> int:
        """Decode steps: output tokens after each request's first (its prefill's), less the
        accepted draft tokens (a step emits its accepted drafts plus one)."""
        return max(self.generated - self.requests - self.accepted, 0)

    def acceptance(self) -> Acceptance:
        """The window in the replay's terms (autotune.forecast.predict.Acceptance), for the step-cost model."""
        return Acceptance(self.drafts, self.draft_tokens, self.accepted, self.per_pos, self.generated,
                          self.steps, self.requests)

    def by_position(self) -> list[float]:
        return [a / self.drafts for a in self.per_pos] if self.drafts else [math.nan] * len(self.per_pos)

    def profile(self) -> dict[str, Any]:
        """The window's per-position counts: an acceptance profile (``watch --profile``)."""
        a = self.acceptance()
        return {"seconds": round(self.seconds, 3), "requests": self.requests, "output_tokens": self.generated,
                "decode_steps": self.steps, "drafts": self.drafts, "draft_tokens": self.draft_tokens,
                "accepted": self.accepted, "accepted_per_pos": list(self.per_pos),
                "acceptance_by_pos": self.by_position(), "mean_accepted_length": a.mean_accepted_length,
                "tokens_per_step": a.tokens_per_step}


def _increase(new: float, old: float) -> tuple[float, bool]:
    return (new - old, False) if new >= old else (new, True)


def window(a: Scrape, b: Scrape) -> Window:
    """The increase of every counter from scrape ``a`` to ``b`` (``b`` alone after a restart)."""
    restarted = any(b.spec[n] < a.spec[n] for n in SPEC_COUNTERS) or b.generated < a.generated
    old = Scrape(a.t, {n: 0 for n in SPEC_COUNTERS} | {PER_POS: []}) if restarted else a
    diff = {n: _increase(b.spec[n], old.spec[n])[0] for n in SPEC_COUNTERS}
    pos_b, pos_a = b.spec[PER_POS], old.spec[PER_POS] or [0] * len(b.spec[PER_POS])
    per_pos = tuple(int(x - y) for x, y in zip(pos_b, pos_a)) if len(pos_a) == len(pos_b) else tuple(pos_b)
    seconds = max(b.t - a.t, 1e-9)
    return Window(seconds=seconds, drafts=int(diff[SPEC_COUNTERS[0]]), draft_tokens=int(diff[SPEC_COUNTERS[1]]),
                  accepted=int(diff[SPEC_COUNTERS[2]]), per_pos=per_pos,
                  generated=int(_increase(b.generated, old.generated)[0]),
                  requests=int(_increase(b.started, old.started)[0]),
                  in_flight=_increase(b.latency_s, old.latency_s)[0] / seconds,
                  running=b.running, waiting=b.waiting, restarted=restarted, depth=len(pos_b))
