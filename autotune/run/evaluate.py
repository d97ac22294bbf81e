"""Run, score, judge: a candidate's job -> its raw run -> a measurement and a verdict.

One function for what a trial does between Optuna's ask and tell, so that the study, the
benchmarks and the correctness tests run and judge a candidate the same way. No Optuna here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.core.candidate import Candidate
from autotune.measure.categories import by_category
from autotune.measure.config import StudyConfig
from autotune.measure.coalescing import step_tokens
from autotune.measure.metrics import at_level, measure_run
from autotune.measure.objectives import objective_values
from autotune.core.records import Job, JobRequest, Measurement, RawRun
from autotune.measure.slo import goodput
from autotune.measure.every_token import judge_greedy
from autotune.measure.nearties import Threshold, run_dtype
from autotune.measure.numerics import Numerics, measure_numerics, numerics_for, widen
from autotune.measure.validate import Unspeculated, Verdict, verdict
from autotune.measure.cudagraphs import coverage_line
from autotune.core.runner import runners_differ
from autotune.run.worker import OnEvent, TrialOutcome, run_trial
from autotune.core.workload import UNCATEGORIZED, Workload, expand_turns

# The verdict's constraints, in Verdict.constraints order (<= 0 is feasible, as Optuna's).
CONSTRAINTS = ("token_disagreement_over_budget", "expectation_regressions", "incomplete",
               "distribution_shift", "logprob_drift_over_budget", "unverified")


@dataclass(frozen=True)
class Reference:
    """What candidates are judged against: the baseline's outputs, sampled draws and scores."""

    outputs: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[str, list[list[int]]] = field(default_factory=dict)
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The baseline's margins where a fresh instance of it flipped against it, under the cap: they
    # widen the near-tie threshold (autotune.measure.numerics.widen); empty until such an instance ran.
    floor: tuple[float, ...] = ()
    runner: str | None = None  # the model runner the baseline's engine ran ("v1", "v2"; None: not recorded)
    # The study's measured numerics (autotune.measure.numerics.Numerics.to_dict(); None: a study from
    # before they were measured, judged by the dtype's rounding alone).
    numerics: dict[str, Any] | None = None

    def paths(self) -> dict[str, list[int]]:
        """Request id -> the baseline's output tokens (greedy or sampled), which a candidate scores
        teacher-forced."""
        return {rid: s["token_ids"] for rid, s in self.scores.items()}


@dataclass(frozen=True)
class Evaluation:
    """A measured and judged candidate (``failure`` set: the run cannot be scored)."""

    measurement: Measurement
    verdict: Verdict
    reference: Reference  # this run's outputs, kept when it is the baseline
    constraints: dict[str, float]
    slo_missed: list[str]
    values: list[float]  # the objectives, in StudyConfig.objectives order
    failure: str | None = None
    base_runner: str | None = None  # the baseline's model runner, when this is a candidate

    def summary(self) -> str:
        """One line for the person watching."""
        if self.failure:
            return f"failed: {self.failure}"
        m, v = self.measurement, self.verdict
        return (f"{m['output_tok_s']:.1f} ± {m['output_tok_s_mad']:.1f} tok/s, e2e p50 {m['e2e_ms_p50']:.0f} ms, "
                + ({"ok": "correct", "unverified": f"UNVERIFIED ({v.reason})"}.get(v.status, f"INCORRECT: {v.reason}"))
                + (f"; misses SLO {', '.join(self.slo_missed)}" if self.slo_missed else "")
                + (f"; PREEMPTED {m['preemptions']} request(s): the KV cache ({m.get('kv_cache_blocks') or '?'} blocks) "
                   "ran short, so this config was measured below what it serves with room" if m.get("preemptions")
                   else "")
                + (f"; {graphs}" if (graphs := coverage_line(m.get("cudagraph_decode") or {})) else "")
                + (f"; {differ}" if (differ := runners_differ(m.get("model_runner"), self.base_runner)) else ""))


def trial_job(cand: Candidate, workload: Workload, cfg: StudyConfig, reference: Reference | None = None) -> Job:
    """The plain-data job a worker runs: engine kwargs, requests, replay settings (and, for a
    candidate, the baseline's output tokens to score)."""
    reqs: list[JobRequest] = []
    chat = workload.endpoint == "chat"  # every request through /v1/chat/completions, as confirm's client sends them
    for r in workload.requests:
        req: dict[str, Any] = {"id": r.id, "prompt": r.prompt, "messages": list(r.messages) if r.messages else None,
                               "turns": list(r.turns) if r.turns else None, "category": r.category,
                               "sampling": r.sampling(), "expect": r.expect, "arrival_s": r.arrival_s,
                               "render": r.render_kwargs() or None, "chat": r.chat_body() if chat else None}
        reqs.append({k: v for k, v in req.items()  # type: ignore[misc]
                     if v is not None or k not in ("prompt", "messages", "turns", "category", "arrival_s", "render",
                                                   "chat")})
    job: Job = {"engine_kwargs": cand.engine_kwargs(cfg.settings), "requests": reqs,
                "replay": {"load": cfg.load.to_dict(), "extra_loads": [x.to_dict() for x in cfg.extra_loads],
                           "repeats": cfg.repeats, "max_repeats": cfg.max_repeats, "warmup": cfg.warmup,
                           "samples": cfg.samples, "sample_tokens": cfg.sample_tokens,
                           "instrument": cfg.instrument},
                "engine_module": cfg.engine_module}
    if reference is not None:
        # Only a lossy config's verdict reads log-probs (autotune.measure.validate): a lossless one
        # skips the scoring pass (its empty reference scores nothing) unless cfg.score_lossless.
        job["reference"] = reference.paths() if cand.lossy or cfg.score_lossless else {}
        # Every greedy output that differs from the baseline's is scored teacher-forced by the
        # candidate's own engine (autotune.run.replay.score_own), so that each of its tokens is
        # judged; a lossy config's speculation is judged against its unspeculated run, which runs
        # after it, so it scores every greedy output (None: whatever the reference).
        greedy = {r["id"] for r in expand_turns(reqs) if r["sampling"].get("temperature", 0) == 0}
        twin = cand.lossy and "speculative_config" in job["engine_kwargs"]
        job["judge"] = {o["id"]: None if twin else o["token_ids"] for o in reference.outputs if o["id"] in greedy}
        # A lossy config's speculation cannot be judged against the baseline: its outputs move on
        # purpose, and its drift is scored in a prefill that verifies no draft. So the worker also
        # runs it without speculation, and speculation is held to the lossless rules against that
        # (autotune.measure.validate). Run here rather than reused from a trial: the study may never
        # measure that config, and one window plus the draws cost less than a trial.
        if cand.lossy and "speculative_config" in job["engine_kwargs"]:
            job["unspeculated"] = unspeculated_job(job)
    else:  # the baseline: its decodes' drift against its prefill is the study's numerics
        job["drift"] = True
    return job


def unspeculated_job(job: Job) -> Job:
    """The reference a lossy config's speculation is judged against: the same engine without
    speculation, replaying the same requests at the same load (batching moves numerics, so both
    are batched alike) and drawing the same samples. It judges outputs, not speed: one window, no
    extra load levels, and nothing to score (an empty ``reference``: the drift is the candidate's own
    against the baseline). The worker runs it in a process of its own (autotune.run.worker.run_trial)."""
    kw = {k: v for k, v in job["engine_kwargs"].items() if k != "speculative_config"}
    replay = {**job["replay"], "extra_loads": [], "repeats": 1, "max_repeats": 1}
    return {**{k: v for k, v in job.items() if k not in ("unspeculated", "reference", "judge")},  # type: ignore[typeddict-item]
            "engine_kwargs": kw, "replay": replay, "reference": {}}


def measure(raw: RawRun, requests: list[JobRequest], cand: Candidate, cfg: StudyConfig) -> Measurement:
    """Every load level's metrics (``metric@level`` for the extra ones), goodput, and by category."""
    m = measure_run(raw)
    # a TPOT bound applies only in a window whose stream timed tokens (step: the most tokens a step gives)
    m["goodput_windows"] = [goodput(w["requests"], cfg.slos, step=step_tokens(w.get("spec_counters")))
                            for w in raw["windows"]]
    m["goodput"] = min(m["goodput_windows"])  # the worst window: an SLO must hold in every replay
    m["remeasured_windows"] = max(0, m["windows"] - cfg.repeats)
    if raw.get("cudagraphs"):  # on CUDA: did decode at the study's batch sizes x (k+1) run under graphs
        from autotune.measure.cudagraphs import decode_coverage

        spec = cand.engine_kwargs(cfg.settings).get("speculative_config") or {}
        batches = [x.concurrency for x in (cfg.load, *cfg.extra_loads) if x.kind in ("concurrency", "ramp")]
        m["cudagraph_decode"] = decode_coverage(raw["cudagraphs"], int(spec.get("num_speculative_tokens") or 0), batches,
                                                raw.get("model_runner"), spec.get("num_speculative_tokens_per_batch_size"))
    if raw.get("model_runner"):  # as the engine reported it (autotune.core.runner)
        m["model_runner"] = raw["model_runner"]
    for level in cfg.extra_loads:
        at = measure_run({"windows": raw["levels"][level.label]})
        m.update(at_level(at, level.label))
        m["incomplete"] += at["incomplete"]
    turns = expand_turns(requests)  # the engine returns one record per turn of a conversation
    if any("category" in r for r in turns):
        spec = cand.engine_kwargs(cfg.settings).get("speculative_config")
        categories = {r["id"]: r.get("category", UNCATEGORIZED) for r in turns}
        m["by_category"] = by_category(raw["windows"], categories, spec.get("num_speculative_tokens") if spec else 0)
    return m


def slo_constraints(m: Measurement, cfg: StudyConfig) -> tuple[dict[str, float], list[str]]:
    """Each SLO as an Optuna constraint on measurement ``m`` (``slo:TEXT``, <= 0 met), and the SLOs missed."""
    constraints = {f"slo:{slo.text}": slo.violation(m[slo.metric]) for slo in cfg.slos}
    return constraints, [slo.text for slo in cfg.slos if constraints[f"slo:{slo.text}"] > 0]


def evaluate(raw: RawRun, requests: list[JobRequest], cand: Candidate, cfg: StudyConfig,
             reference: Reference | None, *, second_baseline: bool = False) -> Evaluation:
    """Measure and judge one raw run (``reference`` None: this is the baseline; ``second_baseline``:
    a fresh instance of the baseline, whose flips against the first are numerics by definition and
    widen the near-tie threshold, its own verdict's first)."""
    m = measure(raw, requests, cand, cfg)
    records = raw["windows"][0]["requests"]  # every window replays the same requests
    # prompt_token_ids: vLLM's own tokenization, from which autotune.forecast.predict replays acceptance.
    outputs = [{"id": r["id"], "token_ids": r["token_ids"], "text": r["text"], "finish_reason": r["finish_reason"],
                "error": r["error"], "chunks": len(r["chunks"]), "prompt_token_ids": r.get("prompt_token_ids")}
               for r in records]
    base = reference  # None for the baseline itself
    dtype = run_dtype(raw.get("dtype"), cand.engine_kwargs(cfg.settings))
    if base is None:  # the baseline measures the study's numerics, and checks its own decodes against them
        numerics = measure_numerics(dtype, raw.get("scores"), raw.get("decode_logprobs"))
        threshold = numerics.threshold
    else:
        numerics = numerics_for(Numerics.from_dict(base.numerics), dtype, base.scores)
        threshold = widen(numerics.threshold, numerics.cap, [("", m) for m in base.floor]).threshold
    turns = expand_turns(requests)

    def judge(th: Threshold, findings: tuple[str, ...] = (), self_check: bool = False) -> Verdict:
        return verdict(turns, records, None if base is None else base.outputs, lossy=cand.lossy,
                       tol=cfg.tolerances, samples=raw.get("samples"),
                       base_samples=None if base is None else base.samples, scores=raw.get("scores"),
                       base_scores=None if base is None else base.scores, speculative=cand.method != "none",
                       unspeculated=_unspeculated(raw), threshold=th,
                       own_scores=raw.get("scores") if base is None else raw.get("own_scores"),
                       numerics=numerics, findings=findings, self_check=self_check or base is None)
    if second_baseline and base is not None:  # its flips under the cap widen the threshold, those above are findings
        at_cap = judge_greedy(turns, {r["id"]: r for r in records}, {r["id"]: r for r in base.outputs},
                              raw.get("own_scores"), base.scores, Threshold(numerics.cap, "the cap"), numerics,
                              alpha=cfg.tolerances.alpha)
        wide = widen(threshold, numerics.cap, list(at_cap.flips))
        v = judge(wide.threshold, wide.findings, self_check=True)
    else:
        v = judge(threshold)
    slos, missed = slo_constraints(m, cfg)
    constraints = {**dict(zip(CONSTRAINTS, v.constraints)), **slos}
    # a TPOT/ITL objective the stream did not time is left out (its worst value: it never wins), not a failure
    values, left_out = objective_values(m, cfg.objectives)
    failure = None
    if m["incomplete"]:
        failure = f"incomplete run: {m['incomplete']} of {m['requests']} requests did not finish ({v.reason})"
    elif any(not math.isfinite(x) for o, x in zip(cfg.objectives, values) if o not in left_out):
        failure = f"objective not measurable: {dict(zip(cfg.objectives, values))}"
    own = Reference(outputs, raw.get("samples") or {}, raw.get("scores") or {},
                    numerics=numerics.to_dict() if base is None else None)
    return Evaluation(m, v, own, constraints, missed, values, failure,
                      base_runner=base.runner if base is not None else None)


def _unspeculated(raw: RawRun) -> Unspeculated | None:
    """The reference run of a lossy config's speculation (autotune.run.worker), as the verdict reads it."""
    u = raw.get("unspeculated")
    if u is None:
        return None
    return Unspeculated(outputs=u.get("outputs", []), samples=u.get("samples", {}), error=u.get("error"))


def run_and_evaluate(cand: Candidate, workload: Workload, cfg: StudyConfig, workdir: Path, *,
                     reference: Reference | None = None, env: dict[str, str] | None = None,
                     on_event: OnEvent | None = None) -> tuple[TrialOutcome, Evaluation | None]:
    """A candidate end to end, as a study trial runs it, outside any study (benchmarks, tests)."""
    job = trial_job(cand, workload, cfg, reference)
    outcome = run_trial(job, workdir, timeout_s=cfg.trial_timeout_s, env=env or {}, on_event=on_event)
    if outcome.raw is None:
        return outcome, None
    return outcome, evaluate(outcome.raw, job["requests"], cand, cfg, reference)
