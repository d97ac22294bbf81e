"""`autotune watch`: does the live traffic still fit the tuned config? One line per window.

Each window is the increase of vLLM's counters between two scrapes of the server's ``/metrics``
(autotune.gate.live), held against what the study measured and forecast for the deployed config
(autotune.gate.deployed): acceptance by position, mean accepted length, tokens per decode step (what the
speedup rests on: a proposer that stops finding drafts lowers it while the mean accepted length of
the drafts it does make may hold), and requests in flight. Any of them outside the study's interval
is drift (exit code errors.DRIFT), named with how far it moved, the deployed config's forecast
speedup at the live acceptance, and the measured config the forecast now prefers.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.core import errors
from autotune.gate.deployed import Band, Deployed
from autotune.core.errors import BadInput, Unreachable
from autotune.forecast.forecast import Forecast
from autotune.gate.live import Scrape, Window, fetch_metrics, parse_scrape, window
from autotune.core.study_report import clean  # JSON without NaN (as confirm writes it)

RETRY_EVERY_S = 5.0  # between tries while the server does not answer (within --retry-s)
LOAD_TOLERANCE = 0.5  # requests in flight beyond the measured levels by more than half: another batch size
OK, DRIFT, IDLE = "ok", "drift", "idle"
# Never ok on nothing: a busy window without a single draft (speculation off, a misconfigured server),
# or a metric the study gives no band for, is a verdict of its own, with drift's exit code.
NO_DRAFTS, NO_BAND = "no drafts", "no band"


@dataclass(frozen=True)
class Moved:
    """One compared metric: live against the study's band."""

    metric: str
    live: float
    study: float
    lo: float
    hi: float

    @property
    def change(self) -> float:
        return self.live / self.study - 1 if self.study else math.nan


@dataclass
class Verdict:
    status: str
    deployed: str
    window: Window
    compared: list[Moved] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)  # names of the metrics outside their band
    at_study: Forecast | None = None
    at_live: Forecast | None = None
    ranking: list[Forecast] = field(default_factory=list)
    measured_speedup: float | None = None
    basis: str = ""
    missing: list[str] = field(default_factory=list)  # "metric: why" for each metric without a band

    @property
    def exit_code(self) -> int:
        """DRIFT for what moved (or cannot be judged), IDLE for a window with no traffic (never 0: a
        watch pointed at the wrong server judged nothing), else OK."""
        if self.status == IDLE:
            return errors.IDLE
        return errors.DRIFT if self.status in (DRIFT, NO_DRAFTS, NO_BAND) else errors.OK

    @property
    def preferred(self) -> Forecast | None:
        return next((f for f in self.ranking if f.speedup is not None), None)

    def line(self) -> str:
        w = self.window
        head = f"{self.status}: {self.deployed}, {w.requests} requests in {w.seconds:.0f} s"
        if self.status == IDLE:
            return f"{head}: no output tokens, nothing to compare"
        if self.status == NO_DRAFTS:
            return (f"{head}: {w.generated} output tokens and no drafts: the server is not speculating "
                    f"(speculation off, or a misconfigured server); the deployed pick drafts up to {w.depth or '?'} "
                    "a step")
        by = {m.metric: m for m in self.compared}
        parts = [_text(by[name], name in self.moved) for name in ("mean accepted length", "tokens/step")
                 if name in by and (self.status != DRIFT or name in self.moved)]
        pos = [m for m in self.compared if m.metric.startswith("position")]
        if pos and (self.status != DRIFT or any(m.metric in self.moved for m in pos)):
            out = [m.metric.split()[1] for m in pos if m.metric in self.moved]
            parts.append("acceptance by position " + (
                f"{'/'.join(_f(m.study) for m in pos)} -> {'/'.join(_f(m.live) for m in pos)} "
                f"(outside at {', '.join(out)})" if out else '/'.join(_f(m.live) for m in pos)))
        if "in flight" in by and (self.status != DRIFT or "in flight" in self.moved):
            parts.append(_text(by["in flight"], "in flight" in self.moved))
        text = f"{head}: {', '.join(parts)}"
        if self.missing:
            text += "; no band to judge " + "; ".join(self.missing)
        if self.at_live is not None and self.at_live.speedup is not None:
            then = f"{self.at_study.speedup:.2f}x" if self.at_study and self.at_study.speedup else "?"
            text += f"; forecast {self.at_live.speedup:.2f}x at the live acceptance (study {then}"
            text += f", measured {self.measured_speedup:.2f}x)" if self.measured_speedup else ")"
            best = self.preferred
            if self.status == DRIFT and best is not None and best.key != self.at_live.key:
                text += f"; the forecast now prefers {best.label} ({best.speedup:.2f}x)"
            elif self.status == DRIFT:
                text += f"; still the forecast's best of the {len(self.ranking)} measured configs"
        elif self.at_live is not None:
            text += f"; no forecast ({self.at_live.basis})"
        return text

    def to_dict(self) -> dict[str, Any]:
        fc = lambda f: None if f is None else {"label": f.label, **f.to_dict()}  # noqa: E731
        w = self.window
        return clean({
            "status": self.status, "exit_code": self.exit_code, "deployed": self.deployed, "line": self.line(),
            "window": {**w.profile(), "in_flight": w.in_flight, "running": w.running, "waiting": w.waiting,
                       "output_tok_s": w.generated / w.seconds, "restarted": w.restarted, "depth": w.depth},
            "compared": [{"metric": m.metric, "live": m.live, "study": m.study, "lo": m.lo, "hi": m.hi,
                          "change": m.change, "moved": m.metric in self.moved} for m in self.compared],
            "moved": self.moved, "missing": self.missing, "basis": self.basis,
            "forecast": {"at_live": fc(self.at_live), "at_study": fc(self.at_study),
                         "measured": self.measured_speedup},
            "preferred": fc(self.preferred), "ranking": [fc(f) for f in self.ranking]})


def _f(x: float) -> str:
    return f"{x:.2f}" if math.isfinite(x) else "-"


def _text(m: Moved, moved: bool) -> str:
    if not moved and m.metric == "in flight":  # below the band is fine down to one at a time
        return f"{m.metric} {_f(m.live)} (study {_f(m.study)})"
    if not moved:
        return f"{m.metric} {_f(m.live)} (study {_f(m.lo)}-{_f(m.hi)})"
    change = f"{m.change:+.0%}, " if math.isfinite(m.change) else "no live value, "
    return f"{m.metric} {_f(m.study)} -> {_f(m.live)} ({change}outside {_f(m.lo)}-{_f(m.hi)})"


def judge(d: Deployed, w: Window) -> Verdict:
    """The window against the deployed config's study: ok, drift (naming what moved) or idle."""
    if w.depth and d.depth and w.depth != d.depth:
        raise BadInput(f"the server drafts up to {w.depth} tokens a step, the deployed pick of {d.results} "
                       f"({d.label}) {d.depth}: is the server running this pick?")
    v = Verdict(IDLE, d.label, w, measured_speedup=((d.report.get("best") or {}).get("speedup") or {})
                .get("output_tok_s"))
    if w.idle:
        return v
    if w.drafts <= 0:
        v.status = NO_DRAFTS
        return v
    exp = d.expected(w.requests)
    live = w.acceptance()
    rows = [Moved(f"position {i + 1}", x, b.value, b.lo, b.hi) for i, (x, b) in enumerate(zip(w.by_position(), exp.by_pos))]
    rows.append(_row("mean accepted length", live.mean_accepted_length, exp.mean_accepted_length))
    if exp.tokens_per_step is not None:
        rows.append(_row("tokens/step", live.tokens_per_step, exp.tokens_per_step))
    else:
        v.missing.append(f"tokens/step ({d.note or 'the study replays no per-step figure'})")
    v.missing += [f"{r.metric} (the study replayed no drafts for it)" for r in rows if not _band(r).known]
    rows = [r for r in rows if _band(r).known]
    levels = d.in_flight()
    if levels:
        lo, hi = min(levels), max(levels)
        band = Band(hi, lo / (1 + LOAD_TOLERANCE), hi * (1 + LOAD_TOLERANCE))
        row = _row("in flight", w.in_flight, band)
        # an idle or lightly used server batches one request at a time: as many as a level of one
        moved = not band.holds(max(w.in_flight, 1.0))
        v.compared, v.moved = rows + [row], [r.metric for r in rows if not _holds(r)] + (["in flight"] if moved else [])
    else:
        v.compared, v.moved = rows, [r.metric for r in rows if not _holds(r)]
    v.status = DRIFT if v.moved else NO_BAND if v.missing else OK
    v.basis = exp.basis
    v.at_study, v.at_live, v.ranking = d.forecasts(live)
    return v


def _row(name: str, live: float, b: Band) -> Moved:
    return Moved(name, live, b.value, b.lo, b.hi)


def _band(m: Moved) -> Band:
    return Band(m.study, m.lo, m.hi)


def _holds(m: Moved) -> bool:
    return _band(m).holds(m.live)


def parse_interval(text: str) -> float:
    """``60``, ``60s``, ``2m`` -> seconds."""
    t = text.strip().lower()
    scale = 60.0 if t.endswith("m") else 1.0
    try:
        value = float(t.rstrip("sm")) * scale
    except ValueError:
        raise BadInput(f"--interval: expected seconds like 60, 60s or 2m, got {text!r}") from None
    if not value > 0:
        raise BadInput(f"--interval: expected a positive duration, got {text!r}")
    return value


def take(url: str, retry_s: float = 0.0) -> Scrape:
    """One scrape; a server that does not answer is tried again every RETRY_EVERY_S for ``retry_s``
    seconds (a restart, a brief outage), then Unreachable: its own exit code, not bad input."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            return parse_scrape(fetch_metrics(url), time.monotonic(), where=url.rstrip("/") + "/metrics")
        except Unreachable as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unreachable(f"{e}; tried for {retry_s:g} s (--retry-s)") from None
            time.sleep(min(RETRY_EVERY_S, left))


def watch(d: Deployed, url: str, *, interval_s: float, once: bool, say: Callable[[str], None],
          as_json: bool = False, profile: Path | None = None, retry_s: float = 0.0, allow_idle: bool = False) -> int:
    """Judge a window every ``interval_s`` (``once``: one window, then its exit code; an idle window's
    is errors.IDLE unless ``allow_idle``).

    With --once the window is two scrapes ``interval_s`` apart, never one scrape against zero: the
    counters are totals since the server started, so against zero the window would hold its
    warm-up and all traffic since start (yesterday's mix too), not what it serves now."""
    prev = take(url, retry_s)
    while True:
        time.sleep(interval_s)
        cur = take(url, retry_s)
        v = judge(d, window(prev, cur))
        prev = cur
        say(json.dumps(v.to_dict()) if as_json else v.line())
        if profile is not None and not v.window.idle:
            profile.write_text(json.dumps(clean({"deployed": d.label, "candidate": d.params, "url": url,
                                                  "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                  **v.window.profile()}), indent=2) + "\n")
        if once:
            return errors.OK if allow_idle and v.status == IDLE else v.exit_code
