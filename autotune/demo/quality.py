"""Does the demo target do the corpus tasks? Checks that read only the prompt and the output.

Each check derives what a correct answer must contain from the prompt itself (the record and the
asked edit, the log lines, the customer's question), so it works on any prompt file made from
``autotune.demo.corpus`` (the bundled examples, a fresh seeded set, a user's edited copy).
Used by the training script (its exact-edit log), ``benchmarks/demo_quality.py`` and the tests.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from autotune.demo.corpus import _CITIES, _PRODUCTS, EOS

_JSON_EDIT = re.compile(r"^### Edit the order record: set (.+?)\.\nInput: (\{.*\})\nOutput:$", re.S)
_CONFIG_EDIT = re.compile(r"^### Edit the config: set (\w+) to (\S+)\.\nInput:\n(.*)Output:\n$", re.S)
_QTY = re.compile(r"^qty of (\S+) to (\d+)$")
_SUMMARY = re.compile(r"^Service (\w+): (\d+) info, (\d+) warn, (\d+) error lines\.")


@dataclass(frozen=True)
class TaskResult:
    """One output judged: its domain, whether it did the task, and why not."""

    domain: str
    ok: bool
    reason: str = ""
    fields: float | None = None  # json/config edits: the share of the expected fields the output got right


def _clean(output: str) -> str:
    return output.split(EOS, 1)[0].strip()


def _parse_config(text: str) -> dict[str, str] | None:
    pairs = {}
    for line in text.strip().splitlines():
        key, sep, value = line.partition(": ")
        if not sep:
            return None
        pairs[key.strip()] = value.strip()
    return pairs


def _leaves(x: object, path: str = "") -> dict[str, object]:
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in _leaves(val, f"{path}.{key}").items()}
    if isinstance(x, list):
        return {k: v for i, val in enumerate(x) for k, v in _leaves(val, f"{path}[{i}]").items()}
    return {path: x}


def _share(got: object, want: object) -> float:
    g, w = _leaves(got), _leaves(want)
    return sum(g.get(k) == v for k, v in w.items()) / len(w) if w else 1.0


def _check_json(m: re.Match, output: str) -> TaskResult:
    instruction, record = m.group(1), json.loads(m.group(2))
    if qty := _QTY.match(instruction):
        sku, value = qty.group(1), int(qty.group(2))
        for item in record["items"]:
            if item["sku"] == sku:
                item["qty"] = value
                break
    else:
        key, _, value = instruction.partition(" to ")
        record[key] = value
    try:
        got = json.loads(_clean(output))
    except ValueError:
        return TaskResult("json", False, "output is not JSON", 0.0)
    if got == record:
        return TaskResult("json", True, "", 1.0)
    wrong = sorted(k for k, v in _leaves(record).items() if _leaves(got).get(k) != v)
    return TaskResult("json", False, f"record differs from the asked edit at {', '.join(wrong[:4])}",
                      _share(got, record))


def _check_config(m: re.Match, output: str) -> TaskResult:
    key, value, body = m.group(1), m.group(2), m.group(3)
    want = _parse_config(body) or {}
    want[key] = value
    got = _parse_config(_clean(output))
    if got is None:
        return TaskResult("config", False, "output is not key: value lines", 0.0)
    return TaskResult("config", got == want, "" if got == want else "config differs from the asked edit",
                      _share(got, want))


def _check_logs(prompt: str, output: str) -> TaskResult:
    lines = [ln for ln in prompt.splitlines()[1:-1] if ln.strip()]
    counts = {"INFO": 0, "WARN": 0, "ERROR": 0}
    services = set()
    for ln in lines:
        parts = ln.split()
        if len(parts) >= 4 and parts[2] in counts:
            counts[parts[2]] += 1
            services.add(parts[3])
    m = _SUMMARY.match(_clean(output))
    if m is None:
        return TaskResult("logs", False, "no 'Service S: N info, N warn, N error lines.' summary")
    got = (m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)))
    want = (next(iter(services)) if len(services) == 1 else "?", counts["INFO"], counts["WARN"], counts["ERROR"])
    return TaskResult("logs", got == want, "" if got == want else f"summary says {got}, the log has {want}")


def _check_support(question: str, output: str) -> TaskResult:
    text = _clean(output)
    need = re.findall(r"\bA\d{4}\b", question)
    need += [p for p in _PRODUCTS if p in question] + [c for c in _CITIES if c in question]
    missing = [n for n in need if n not in text]
    return TaskResult("support", not missing, f"answer does not name {', '.join(missing)}" if missing else "")


def check(prompt: str, output: str) -> TaskResult:
    """Judge one output against what its prompt asks (a corpus prompt, or a chat question)."""
    if m := _JSON_EDIT.match(prompt):
        return _check_json(m, output)
    if m := _CONFIG_EDIT.match(prompt):
        return _check_config(m, output)
    if prompt.startswith("### Summarize the logs.\n"):
        return _check_logs(prompt, output)
    if prompt.startswith("### Support chat.\nCustomer: "):
        prompt = prompt.split("Customer: ", 1)[1]
    return _check_support(prompt, output)


def rates(results: list[TaskResult]) -> dict[str, float]:
    """Share of outputs that did their task, per domain, plus ``edit`` (json and config together)."""
    out: dict[str, float] = {}
    for domain in sorted({r.domain for r in results}):
        mine = [r for r in results if r.domain == domain]
        out[domain] = sum(r.ok for r in mine) / len(mine)
    edits = [r for r in results if r.domain in ("json", "config")]
    if edits:
        out["edit"] = sum(r.ok for r in edits) / len(edits)
    for domain in ("json", "config"):  # how close the misses are: the share of fields right
        mine = [r.fields for r in results if r.domain == domain and r.fields is not None]
        if mine:
            out[f"{domain}_fields"] = sum(mine) / len(mine)
    return out
