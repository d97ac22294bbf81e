"""Declarative search spaces (YAML) with conditional parameters and platform awareness.

A space file looks like::

    name: cpu
    baseline: {method: none, enforce_eager: false}
    params:
      method:
        choices: [none, ngram, {value: draft_model, needs: draft_model}]
      num_speculative_tokens: {int: [1, 5], when: {method: [ngram, draft_model]}}
      kv_cache_dtype: {choices: [auto, {value: fp8, platforms: [cpu-avx512, cpu-amx, cuda]}]}

``when`` makes a parameter exist only for some values of another (the ngram window only for
ngram); ``platforms`` (``cpu``, ``cpu-avx512``, ``cpu-amx``, ``cuda``) and ``needs`` drop a
choice the platform, the processor or the user's models cannot run,
and the dropped choices are reported, never silently merged with another config.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from autotune.core.candidate import KEYS, METHODS, Candidate
from autotune.core.errors import BadInput

_PARAM_KEYS = {"choices", "int", "float", "when", "step", "log"}
_CHOICE_KEYS = {"value", "platforms", "needs"}
_TOP_KEYS = {"name", "description", "baseline", "params"}


class Suggester(Protocol):
    """The part of ``optuna.Trial`` a space needs (kept as a protocol so this module needs no optuna)."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...
    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...
    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False) -> float: ...


@dataclass(frozen=True)
class Param:
    name: str
    choices: tuple[Any, ...] | None = None
    int_range: tuple[int, int] | None = None
    float_range: tuple[float, float] | None = None
    step: float | None = None
    log: bool = False
    when: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def active(self, chosen: dict[str, Any]) -> bool:
        return all(chosen.get(k) in v for k, v in self.when.items())

    def values(self) -> tuple[Any, ...]:
        """Every value a grid visits: the choices, the ints by step, a float range's ends and middle."""
        if self.choices is not None:
            return self.choices
        if self.int_range is not None:
            return tuple(range(self.int_range[0], self.int_range[1] + 1, int(self.step or 1)))
        assert self.float_range is not None
        lo, hi = self.float_range
        return (lo, (lo + hi) / 2, hi) if hi > lo else (lo,)

    def suggest(self, trial: Suggester) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.int_range is not None:
            return trial.suggest_int(self.name, *self.int_range, step=int(self.step or 1), log=self.log)
        assert self.float_range is not None
        return trial.suggest_float(self.name, *self.float_range, step=self.step, log=self.log)


@dataclass(frozen=True)
class SearchSpace:
    """A resolved space: only choices the platform and the user's models can run."""

    name: str
    params: tuple[Param, ...]
    baseline: dict[str, Any]
    dropped: tuple[str, ...] = ()  # human-readable notes on what the platform/models ruled out
    resolved: dict[str, Any] = field(default_factory=dict)  # source, platform, tags, models: to load it again

    def suggest(self, trial: Suggester) -> Candidate:
        chosen: dict[str, Any] = {}
        for p in self.params:  # declaration order: a condition's parent comes first
            if p.active(chosen):
                chosen[p.name] = p.suggest(trial)
        return Candidate(chosen)

    def grid(self) -> list[Candidate]:
        """Every point of the space, in declaration order (a condition's parent first): the grid
        that ``--strategy grid`` walks and ``--strategy predict`` ranks."""
        points: list[dict[str, Any]] = [{}]
        for p in self.params:
            points = [{**c, p.name: v} if p.active(c) else c for c in points
                      for v in (p.values() if p.active(c) else (None,))]
        seen: dict[str, Candidate] = {}
        for c in map(Candidate, points):
            seen.setdefault(c.key(), c)
        return list(seen.values())

    def baseline_candidate(self) -> Candidate:
        return Candidate(dict(self.baseline))

    def baseline_trial_params(self) -> dict[str, Any]:
        """Baseline values for the parameters Optuna will ask for (for ``enqueue_trial``)."""
        base = self.baseline
        return {p.name: base[p.name] for p in self.params if p.name in base and p.active(base)}


def _fail(src: str, key: str, expected: str, got: Any) -> BadInput:
    return BadInput(f"{src}: key '{key}': expected {expected}, got {got!r}")


# What each ``needs:`` name asks of the study, as a dropped choice's note says it.
_HINTS = {"mtp_layers": "a model with MTP layers",
          "moe_layers": "a mixture-of-experts model",
          "sampled_requests": "sampled requests (temperature > 0) in the workload",
          "arctic_inference": "Arctic Inference: pip install arctic-inference, or scripts/setup.sh",
          "dflash_drafter": "a --draft-model whose config says dflash (a DFlash block drafter)",
          "dspark_drafter": "a --draft-model whose config says dspark (a DSpark block drafter)",
          "parallel_drafting_head": "an EAGLE head trained for parallel drafting (P-EAGLE)",
          # autotune.core.runner.needs: vLLM's V1 rejection sampler reads no `block` (it would verify standard)
          "model_runner_v2": "Model Runner V2 (vLLM's CUDA build, VLLM_USE_V2_MODEL_RUNNER not 0): "
                             "Model Runner V1 verifies it as standard"}


def _parse_choices(src: str, name: str, raw: Any, platform: str, tags: set[str], models: set[str],
                   dropped: list[str]) -> tuple[Any, ...]:
    if not isinstance(raw, list) or not raw:
        raise _fail(src, f"params.{name}.choices", "a non-empty list", raw)
    out = []
    for item in raw:
        if isinstance(item, dict):
            if set(item) - _CHOICE_KEYS or "value" not in item:
                raise _fail(src, f"params.{name}.choices", f"plain values or objects with keys {sorted(_CHOICE_KEYS)}", item)
            value, platforms, needs = item["value"], item.get("platforms"), item.get("needs")
            if platforms is not None and not tags & set(platforms):
                dropped.append(f"{name}={value} (needs {' or '.join(platforms)}; this is {platform})")
                continue
            needs = [needs] if isinstance(needs, str) else list(needs or [])
            if not all(isinstance(n, str) for n in needs):
                raise _fail(src, f"params.{name}.choices", "needs: a name or a list of names", item)
            missing = [n for n in needs if n not in models]
            if missing:
                dropped.append(f"{name}={value} (needs {' and '.join(_HINTS.get(n, f'--{n}'.replace('_', '-')) for n in missing)})")
                continue
        else:
            value = item
        if name == "method" and value not in METHODS:
            raise _fail(src, "params.method.choices", f"methods from {list(METHODS)}", value)
        out.append(value)
    return tuple(out)


def _range(src: str, key: str, raw: Any, kind: type) -> tuple[Any, Any]:
    if (not isinstance(raw, list) or len(raw) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw)
            or (kind is int and not all(isinstance(v, int) for v in raw)) or raw[0] > raw[1]):
        raise _fail(src, key, f"[low, high] with low <= high ({kind.__name__}s)", raw)
    return kind(raw[0]), kind(raw[1])


def _contains(p: Param, value: Any) -> bool:
    if value is None or isinstance(value, bool) != isinstance((p.choices or (0,))[0], bool):
        return p.choices is not None and value in p.choices
    if p.choices is not None:
        return value in p.choices
    lo, hi = p.int_range or p.float_range  # type: ignore[misc]
    return isinstance(value, (int, float)) and lo <= value <= hi


def parse_space(data: Any, *, src: str, platform: str, models: set[str],
                tags: set[str] | None = None) -> SearchSpace:
    """Validate a loaded YAML document and resolve it for ``platform`` and the available ``models``.

    ``tags``: what ``platforms:`` entries may match (``cpu``, ``cpu-avx512``, ``cuda``, ...);
    default: the platform name alone.
    """
    tags = tags or {platform}
    if not isinstance(data, dict):
        raise BadInput(f"{src}: expected a mapping with keys {sorted(_TOP_KEYS)}, got {type(data).__name__}")
    if set(data) - _TOP_KEYS:
        raise _fail(src, sorted(set(data) - _TOP_KEYS)[0], f"one of {sorted(_TOP_KEYS)} (unknown key)", "it")
    raw_params = data.get("params")
    if not isinstance(raw_params, dict) or "method" not in raw_params:
        raise _fail(src, "params", "a mapping of parameters that includes 'method'", raw_params)
    dropped: list[str] = []
    params: list[Param] = []
    gone: set[str] = set()  # knobs of which no choice runs here: a knob that depends on one never applies
    for name, spec in raw_params.items():
        if name not in KEYS:
            raise _fail(src, f"params.{name}", f"a known parameter ({', '.join(KEYS)})", name)
        if not isinstance(spec, dict) or set(spec) - _PARAM_KEYS:
            raise _fail(src, f"params.{name}", f"a mapping with keys from {sorted(_PARAM_KEYS)}", spec)
        kinds = [k for k in ("choices", "int", "float") if k in spec]
        if len(kinds) != 1:
            raise _fail(src, f"params.{name}", "exactly one of 'choices', 'int', 'float'", spec)
        when_raw = spec.get("when", {})
        if not isinstance(when_raw, dict) or not all(isinstance(v, list) for v in when_raw.values()):
            raise _fail(src, f"params.{name}.when", "a mapping of parameter to list of values", when_raw)
        for parent in when_raw:
            if parent not in {p.name for p in params} | gone:
                raise _fail(src, f"params.{name}.when", "parameters declared above this one", parent)
        when = {k: tuple(v) for k, v in when_raw.items()}
        if set(when) & gone:
            gone.add(name)
            dropped.append(f"{name} (it applies only with {', '.join(sorted(set(when) & gone))}, left out here)")
            continue
        if kinds[0] == "choices":
            choices = _parse_choices(src, name, spec["choices"], platform, tags, models, dropped)
            if not choices:  # the platform has none of this knob: leave it out
                gone.add(name)
                dropped.append(f"{name} (no choice runs on {platform})")
                continue
            params.append(Param(name, choices=choices, when=when))
        elif kinds[0] == "int":
            params.append(Param(name, int_range=_range(src, f"params.{name}.int", spec["int"], int),
                                step=spec.get("step"), log=bool(spec.get("log", False)), when=when))
        else:
            params.append(Param(name, float_range=_range(src, f"params.{name}.float", spec["float"], float),
                                step=spec.get("step"), log=bool(spec.get("log", False)), when=when))
    baseline = data.get("baseline", {"method": "none"})
    if not isinstance(baseline, dict) or baseline.get("method", "none") != "none":
        raise _fail(src, "baseline", "a mapping with method: none (the baseline never speculates)", baseline)
    if set(baseline) - set(KEYS):
        raise _fail(src, "baseline", f"keys from {list(KEYS)}", sorted(set(baseline) - set(KEYS))[0])
    known = {p.name: p for p in params}
    baseline = {k: v for k, v in {"method": "none", **baseline}.items() if k in known}
    for p in params:
        if p.active(baseline) and not _contains(p, baseline.get(p.name)):
            raise _fail(src, f"baseline.{p.name}", f"a value of params.{p.name} (the baseline needs every knob set)",
                        baseline.get(p.name))
    return SearchSpace(name=str(data.get("name", Path(src).stem)), params=tuple(params),
                       baseline=baseline, dropped=tuple(dropped),
                       resolved={"source": src, "platform": platform, "tags": sorted(tags), "models": sorted(models)})


# Package data (pyproject.toml), so an installed copy (wheel, pipx) has them too, not only a checkout.
SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"


def bundled_spaces() -> dict[str, Path]:
    """Spaces shipped in the package's ``autotune/search_spaces/``, by name."""
    return {f.stem: f for f in sorted(SPACES_DIR.glob("*.yaml"))}


def reload_space(resolved: dict[str, Any]) -> SearchSpace:
    """The space a study ran, from its ``resolved`` record (the same choices, on any machine)."""
    sp = load_space(resolved["source"], platform=resolved["platform"], models=set(resolved["models"]),
                    tags=set(resolved["tags"]))
    return without(sp, resolved.get("fixed") or [], "", values=resolved.get("fixed_values"))


def without(sp: SearchSpace, names: list[str], why: str, *, values: dict[str, Any] | None = None) -> SearchSpace:
    """``sp`` without the knobs ``names`` (the user fixed them with serving flags: every trial has
    the user's value), each noted as left out ``why``; recorded in ``resolved`` to reload it so.

    ``values``: the value each fixed knob has in every trial, where known. A knob that applies only at
    other values of a fixed one never applies, so it goes too (adaptive verification under the user's
    --enforce-eager, which runs every cudagraph_mode as NONE); a condition the value meets is dropped."""
    values = dict(values or {})
    gone = [n for n in names if any(p.name == n for p in sp.params)]
    if not gone:
        return sp
    params: list[Param] = []
    unmet: list[str] = []
    for p in sp.params:
        if p.name in gone or p.name in unmet:
            continue
        if any(k in gone and k in values and values[k] not in v for k, v in p.when.items()) or \
                any(k in unmet for k in p.when):
            unmet.append(p.name)
            continue
        params.append(replace(p, when={k: v for k, v in p.when.items() if k not in gone}))
    notes = [f"{n} ({why})" for n in gone if why]
    notes += [f"{n} (applies only at other values of {', '.join(sorted(k for k in _when(sp, n) if k in gone or k in unmet))}"
              " than those fixed)" for n in unmet if why]
    return replace(sp, params=tuple(params), baseline={k: v for k, v in sp.baseline.items() if k not in gone + unmet},
                   dropped=(*sp.dropped, *notes),
                   resolved={**sp.resolved, "fixed": sorted({*sp.resolved.get("fixed", []), *gone}),
                             **({"fixed_values": {**sp.resolved.get("fixed_values", {}),
                                                  **{k: values[k] for k in gone if k in values}}}
                                if any(k in values for k in gone) else {})})


def _when(sp: SearchSpace, name: str) -> dict[str, tuple[Any, ...]]:
    return next((p.when for p in sp.params if p.name == name), {})


def load_space(name_or_path: str, *, platform: str, models: set[str], tags: set[str] | None = None) -> SearchSpace:
    """Load a bundled space by name (``cpu``, ``gpu``, ...) or a YAML file by path."""
    spaces = bundled_spaces()
    path = spaces.get(name_or_path) or Path(name_or_path)
    if not path.is_file():
        raise BadInput(f"{name_or_path}: no such search space; expected a YAML file or one of {sorted(spaces)}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8-sig"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise BadInput(f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text; expected a YAML search space") from None
    sp = parse_space(data, src=str(path), platform=platform, models=models, tags=tags)
    # A bundled space by its name (the package may live elsewhere next time), a file by its full path.
    source = name_or_path if name_or_path in spaces else str(path.resolve())
    return replace(sp, resolved={**sp.resolved, "source": source})
