"""The checks of scripts/gpu_smoke.sh, on a study's results folder: each prints what it saw, and exits 1
with the surprise where a GPU run must not go on (tests/test_gpu_smoke_checks.py plants each case).

    python scripts/gpu_smoke_checks.py plan WORKLOAD --out PLAN.json [--space S] [--model M ...] [-- FLAGS]
    python scripts/gpu_smoke_checks.py study DIR --plan PLAN.json
    python scripts/gpu_smoke_checks.py ran DIR --platform cuda
    python scripts/gpu_smoke_checks.py graphs DIR --platform cuda
    python scripts/gpu_smoke_checks.py pick DIR
    python scripts/gpu_smoke_checks.py tp DIR --size 2

- ``plan``: the space the user gets, resolved by ``autotune search``'s own ``prepare`` on this machine,
  and every candidate of it built by vLLM's config code here (autotune.run.config_check; on a GPU the
  real CUDA platform): a candidate vLLM refuses or builds otherwise than it asks
  (autotune.core.engine_config) is the surprise. Then the trials to run: one per method and model
  runner the space offers (the baseline is the study's own), chosen from the space so that each
  CUDA-graph mode and each verification knob the space offers runs at least once, and one with
  every lossy knob (KV dtype, weights) at its lossy value. ``AUTOTUNE_SMOKE_METHODS`` (comma-separated)
  keeps those of some methods only.
- ``study``: the trials as planned: the baseline COMPLETE, every lossless trial COMPLETE and judged
  correct (status ``ok``), any other COMPLETE or failed with its reason; no drafter's trace failed
  (best.json ``strategy``) and every trial of a method the study forecasts carries its forecast.
- ``ran``: what each trial's engine ran, in vLLM's own words (its ``server.log``): the model runner
  it logged is the one the trial recorded (trials.csv ``model_runner``) and the one vLLM picks for
  its config here (autotune.core.runner); block verification ran on Model Runner V2 (V1 verifies it as
  standard); the CUDA-graph mode vLLM resolved is the trial's own.
- ``graphs``: vLLM's "Graph capturing finished" (vllm/v1/worker/gpu_model_runner.py and
  gpu/model_runner.py) in the baseline's own ``server.log`` (on CUDA; on CPU: that log exists).
- ``pick``: confirm served the pick and the baseline (best.json ``served``), and the pick is not the
  baseline (a speculative config won).
- ``tp``: every trial's server was started with tensor parallel ``--size`` (vLLM's own
  "non-default args" line in its ``server.log``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's autotune

from autotune.core import runner  # noqa: E402

LOSSY = {"kv_cache_dtype": ("auto",), "quantization": ("none",), "dtype": ("default",)}


class Surprise(Exception):
    """What a smoke run must not show; its message is the one line the script prints."""


def _trials(folder: Path) -> pd.DataFrame:
    path = folder / "trials.csv"
    if not path.is_file():
        raise Surprise(f"no trials.csv in {folder}")
    f = pd.read_csv(path)
    return f[f["role"].fillna("") != "re-measure"]


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _lossy(row: pd.Series) -> bool:
    return any(_text(row.get(f"param_{k}")) not in ("", *ok) for k, ok in LOSSY.items())


def study(folder: Path, trials: int, lossless: list[str]) -> list[str]:
    f = _trials(folder)
    seen = _outcomes(f, trials, lossless)
    return seen + _traces(folder) + _forecasts(f)


def _traces(folder: Path) -> list[str]:
    """Each drafter's trace over the baseline (what the forecasts read): failed is a surprise; a trace
    not run, with why (a head that does not fit, the DFlash trace on a GPU), is said."""
    strategy = (json.loads((folder / "best.json").read_text()).get("strategy") or {}) \
        if (folder / "best.json").is_file() else {}
    seen = []
    for name in ("draft_trace", "eagle3_trace", "dflash_trace"):
        t = strategy.get(name)
        if not t:
            continue
        why = str(t.get("failure") or "")
        if why and not why.startswith("not traced:"):
            raise Surprise(f"the {name.replace('_', ' ')} failed: {why}")
        seen.append(f"{name.replace('_', ' ')}: " + (why or f"ran ({t.get('wall_s')} s"
                                                      + (f" on {t['device']}" if t.get("device") else "") + ")"))
    return seen


# Methods the study forecasts from the baseline's own tokens (autotune.forecast.forecast.AcceptanceTable),
# where it has what it needs: a trial of one without its forecast says that forecast failed.
FORECAST = ("ngram", "draft_model", "eagle3", "suffix")


def _forecasts(f: pd.DataFrame) -> list[str]:
    col = "predicted_speedup" if "predicted_speedup" in f.columns else None
    seen = []
    for _, r in f.iterrows():
        method = _text(r.get("param_method"))
        if method not in FORECAST or str(r.get("param_parallel_drafting")) == "True" or r.get("role") == "baseline":
            continue
        got = r.get(col) if col else None
        if got is None or (isinstance(got, float) and math.isnan(got)):
            raise Surprise(f"trial {r['trial']} ({r['label']}) has no forecast: a {method} trial the study forecasts")
        seen.append(f"trial {r['trial']} {method}: forecast {float(got):.2f}x")
    return seen


def _outcomes(f: pd.DataFrame, trials: int, lossless: list[str]) -> list[str]:
    seen = []
    for _, r in f.iterrows():
        why = "" if r["state"] == "COMPLETE" else f": {_text(r.get('failure'))}"
        seen.append(f"trial {r['trial']} {r['label']} {r['state']} status={_text(r.get('status')) or '-'}"
                    f" runner={_text(r.get('model_runner')) or '-'}{why}")
    base = f[f["role"] == "baseline"]
    if base.empty or (base["state"] != "COMPLETE").any():
        raise Surprise(f"the baseline did not complete: {'; '.join(seen)}")
    for _, r in f.iterrows():
        method = _text(r.get("param_method"))
        if method in lossless and not _lossy(r) and (r["state"] != "COMPLETE" or _text(r.get("status")) != "ok"):
            raise Surprise(f"lossless trial {r['trial']} ({r['label']}) must complete and pass: state {r['state']}, "
                           f"status {_text(r.get('status')) or '-'}, verdict {_text(r.get('verdict')) or '-'}"
                           f"{', ' + _text(r.get('failure')) if _text(r.get('failure')) else ''}")
        if r["state"] != "COMPLETE" and not _text(r.get("failure")):
            raise Surprise(f"trial {r['trial']} ({r['label']}) {r['state']} without a reason")
    missing = [m for m in lossless if m not in set(f["param_method"].fillna(""))]
    if missing:
        raise Surprise(f"no trial of {', '.join(missing)}: {'; '.join(seen)}")
    if len(f) != trials:
        raise Surprise(f"expected {trials} trials, saw {len(f)}: {'; '.join(seen)}")
    return seen


def _baseline_log(folder: Path) -> Path:
    f = _trials(folder)
    base = f[f["role"] == "baseline"]
    if base.empty:
        raise Surprise("no baseline trial in trials.csv")
    return folder / "trials" / f"{int(base.iloc[0]['trial']):04d}" / "server.log"


def graphs(folder: Path, platform: str) -> list[str]:
    log = _baseline_log(folder)
    if not log.is_file():
        raise Surprise(f"the baseline's server.log is missing: {log}")
    if platform != "cuda":
        return [f"CPU run: the baseline's log {log} (no CUDA graphs on CPU)"]
    hits = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if "Graph capturing finished" in ln]
    if not hits:
        raise Surprise(f"no 'Graph capturing finished' in the baseline's own log {log}")
    return [hits[0]]


V2_LOG, V1_LOG = "Using V2 Model Runner", "using the V1 model runner instead"  # autotune.run.served_engine
MODE_LOG = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+):")  # the engine's resolved compilation config


def _logged(log: Path) -> tuple[str | None, str | None]:
    """(the model runner, the CUDA-graph mode) a trial's server.log says vLLM ran; None where it says none."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    ran = "v2" if V2_LOG in text else "v1" if V1_LOG in text else None
    modes = MODE_LOG.findall(text)
    return ran, (modes[-1] if modes else None)


def ran(folder: Path, platform: str) -> list[str]:
    f = _trials(folder)
    seen = []
    for _, r in f[f["state"] == "COMPLETE"].iterrows():
        method = _text(r.get("param_method")) or "none"
        spec = None if method == "none" else {"method": method, **(
            {"parallel_drafting": True} if str(r.get("param_parallel_drafting")) == "True" else {})}
        want, why = runner.expected(spec, triton=runner.has_triton(platform), env=os.environ)
        recorded = _text(r.get("model_runner"))
        log = folder / "trials" / f"{int(r['trial']):04d}" / "server.log"
        logged, mode = _logged(log)
        where = f"trial {r['trial']} ({r['label']})"
        if logged is None:
            raise Surprise(f"{where}: its server.log names no model runner ({log})")
        if recorded != logged:
            raise Surprise(f"{where}: recorded {recorded or 'no runner'}, but vLLM's log says {logged} ({log})")
        if logged != want:
            raise Surprise(f"{where}: vLLM ran {logged}, autotune expects {want} ({why})")
        if _text(r.get("param_rejection_sample_method")) == "block" and logged != runner.V2:
            raise Surprise(f"{where}: recorded verify=block, but vLLM ran Model Runner V1, which verifies it as standard")
        asked = _text(r.get("param_cudagraph_mode"))
        if asked and mode != asked:
            raise Surprise(f"{where}: recorded cudagraph_mode {asked}, but vLLM's log says {mode or 'none'} ({log})")
        seen.append(f"trial {r['trial']} {r['label']}: {logged}" + (f", {mode}" if mode else ""))
    return seen


def pick(folder: Path) -> list[str]:
    best = json.loads((folder / "best.json").read_text())
    b, base = best.get("best") or {}, best.get("baseline") or {}
    served = b.get("served") or {}
    if not served or served.get("speedup") is None or not math.isfinite(float(served["speedup"])):
        raise Surprise("no served numbers in best.json (confirm did not serve the pick)")
    if b.get("label") == base.get("label") or b.get("trial") == base.get("trial"):
        raise Surprise(f"confirm's pick is the baseline ({b.get('label')}): no speculative config won")
    return [f"pick {b.get('label')}: served speedup {served.get('speedup')}, servers {served.get('servers')}"]


def tp(folder: Path, size: int) -> list[str]:
    logs = sorted((folder / "trials").glob("*/server.log"))
    if not logs:
        raise Surprise(f"no server.log under {folder / 'trials'}")
    seen = []
    for log in logs:
        lines = re.findall(r"non-default args: (\{.*\})", log.read_text(errors="replace"))
        sizes = [int(m.group(1)) if (m := re.search(r"'tensor_parallel_size': (\d+)", ln)) else 1 for ln in lines]
        if not sizes or any(s != size for s in sizes):
            raise Surprise(f"{log}: tensor_parallel_size {sizes or 'not logged'}, expected {size}")
        seen.append(f"{log.parent.name}: tensor_parallel_size {size}")
    return seen


# Knobs whose every value the plan runs at least once where the space offers it, besides the method.
COVER = ("cudagraph_mode", "rejection_sample_method", "draft_sample_method", "enable_adaptive_verification",
         "parallel_drafting")


def _typical(c) -> tuple:
    """How far a candidate is from a plain first trial: depth 3, lookup 2..4, the middle of the rest."""
    k = c.params.get("num_speculative_tokens")
    return (abs((k or 3) - 3), abs((c.params.get("prompt_lookup_max") or 4) - 4),
            abs((c.params.get("prompt_lookup_min") or 2) - 2))


def choose(space, settings, *, platform: str, env, methods: set[str] | None = None) -> list:
    """One candidate per (method, model runner) the space offers (the baseline's own left to the study),
    picked so that each value of ``COVER`` the space offers runs once; then one with every lossy knob
    at its lossy value (a lossless method's trial stays lossless, so its verdict is exact)."""
    grid = space.grid()
    base = space.baseline
    groups: dict[tuple[str, str], list] = {}
    for c in grid:
        if c.lossy or c.method == "none":  # the baseline is the study's own trial
            continue
        spec = c.engine_kwargs(settings).get("speculative_config")
        groups.setdefault((c.method, runner.expected(spec, triton=runner.has_triton(platform), env=env)[0]), []).append(c)
    def items(c) -> set[tuple[str, object]]:
        return {(k, c.params[k]) for k in COVER if k in c.params}

    # a value few methods offer (adaptive verification: dspark alone) weighs more than a common one
    offered: dict[tuple[str, object], int] = {}
    for cands in groups.values():
        for item in set().union(*map(items, cands)):
            offered[item] = offered.get(item, 0) + 1
    from autotune.core.candidate import SPEC_DEFAULTS

    # the baseline's graph mode, and vLLM's defaults (what a trial that sets nothing runs), count as run
    covered = {(k, v) for k, v in {**SPEC_DEFAULTS, **base}.items() if k in COVER}
    out = []
    for key in sorted(groups):
        if methods and key[0] not in methods:
            continue
        best = min(groups[key], key=lambda c: (-sum(1 / offered[i] for i in items(c) - covered), _typical(c)))
        covered |= items(best)
        out.append(best)
    lossy = [c for c in grid if c.method == "none" and c.lossy]
    if lossy and (not methods or "lossy" in methods):
        out.append(max(lossy, key=lambda c: sum(c.params.get(k) != base.get(k) for k in c.params)))
    return out


def plan(workload: Path, out: Path, options: dict, flags: list[str]) -> list[str]:
    """See the module docstring: every candidate at config, then the trials to run, written to ``out``."""
    import tempfile

    from autotune.cli.search import SearchOptions, prepare
    from autotune.core.engine_config import collapsed, mismatches
    from autotune.core.errors import BadInput
    from autotune.run.config_check import built

    try:
        p = prepare(SearchOptions(workload=workload, serve_flags=tuple(flags), results=Path(tempfile.mkdtemp()),
                                  **{k: v for k, v in options.items() if v is not None}))
    except BadInput as e:
        raise Surprise(f"autotune search would not start: {e}") from None
    grid = p.space.grid()
    kwargs = [c.engine_kwargs(p.cfg.settings) for c in grid]
    builds = built(kwargs)
    bad = [f"{c.label}: {'; '.join(why)}" for c, kw, b in zip(grid, kwargs, builds)
           if (why := mismatches(kw, b, platform=p.platform, env=os.environ))]
    bad += collapsed(kwargs, builds, [c.label for c in grid])
    if bad:
        raise Surprise(f"{len(bad)} of {len(grid)} candidates of space '{p.space.name}' at config: {bad[0]}")
    wanted = {m for m in os.environ.get("AUTOTUNE_SMOKE_METHODS", "").split(",") if m}
    chosen = choose(p.space, p.cfg.settings, platform=p.platform, env=os.environ, methods=wanted or None)
    if not chosen:
        raise Surprise(f"the space '{p.space.name}' offers no trial to run here besides the baseline")
    lossless = sorted({c.method for c in chosen if not c.lossy})
    out.write_text(json.dumps({"tries": [c.params for c in chosen], "labels": [c.label for c in chosen],
                               "trials": len(chosen) + 1, "lossless": lossless, "space": p.space.name,
                               "candidates": len(grid)}, indent=1))
    return [f"{len(grid)} candidates of space '{p.space.name}' built by vLLM's config code on {p.platform}: none "
            f"refused or changed", *(f"plan: {c.label}" for c in chosen)]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=["plan", "study", "graphs", "ran", "pick", "tp"])
    ap.add_argument("folder", type=Path, help="the results folder (plan: the workload)")
    ap.add_argument("--trials", type=int, default=0)
    ap.add_argument("--lossless", default="")
    ap.add_argument("--plan", type=Path, help="study: the trials and lossless methods from `plan`'s file")
    ap.add_argument("--out", type=Path, help="plan: where the plan goes")
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--size", type=int, default=2)
    for opt in ("space", "model", "draft-model", "eagle-head", "eagle3-head", "dtype"):
        ap.add_argument(f"--{opt}")
    a = ap.parse_args(argv)
    if a.plan is not None:
        planned = json.loads(a.plan.read_text())
        a.trials, a.lossless = planned["trials"], ",".join(planned["lossless"])
    options = {k: getattr(a, k) for k in ("space", "model", "draft_model", "eagle_head", "eagle3_head", "dtype")}
    try:
        seen = {"plan": lambda: plan(a.folder, a.out, options, flags),
                "study": lambda: study(a.folder, a.trials, [m for m in a.lossless.split(",") if m]),
                "graphs": lambda: graphs(a.folder, a.platform), "ran": lambda: ran(a.folder, a.platform),
                "pick": lambda: pick(a.folder), "tp": lambda: tp(a.folder, a.size)}[a.check]()
    except Surprise as e:
        print(e)
        return 1
    print("\n".join(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
