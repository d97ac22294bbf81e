"""Generate the demo corpus: the seed workloads of this field, templated and seeded.

Four domains, each a prompt and the completion a well-behaved model would give:
e-commerce support conversations, JSON order records (edit a record), server-log
summaries and config files (edit a config). The edit tasks copy most of the prompt
into the output, which is where n-gram lookup speculation can win; the support
conversations are free text, where it mostly cannot.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

EOS = "</s>"

_NAMES = ["Alice", "Bob", "Carla", "Deepak", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
          "Kofi", "Lena", "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara"]
_PRODUCTS = ["wireless mouse", "usb cable", "laptop stand", "desk lamp", "coffee mug", "backpack",
             "water bottle", "phone case", "keyboard", "headphones", "monitor", "notebook"]
_SKUS = ["MS-100", "UC-220", "LS-310", "DL-450", "CM-120", "BP-700", "WB-330", "PC-510",
         "KB-800", "HP-900", "MN-240", "NB-050"]
_STATUSES = ["pending", "paid", "shipped", "delivered", "cancelled", "returned"]
_CITIES = ["Berlin", "Lisbon", "Austin", "Osaka", "Lagos", "Quito", "Oslo", "Pune", "Perth", "Lyon"]
_CARRIERS = ["DHL", "UPS", "FedEx", "USPS"]
_SERVICES = ["api", "auth", "billing", "search", "worker", "gateway"]
_LEVELS = ["INFO", "WARN", "ERROR"]
_EVENTS = {
    "INFO": ["request served", "cache hit", "user login", "job finished", "health check ok"],
    "WARN": ["slow query", "retrying request", "cache miss", "high memory"],
    "ERROR": ["connection refused", "timeout upstream", "disk full", "invalid token"],
}
_ISSUES = [
    ("late", "my order {order} has not arrived yet", "I checked order {order}: it shipped with {carrier} and should arrive in {days} days. Here is the tracking number {track}."),
    ("refund", "I want a refund for the {product} in order {order}", "I have started a refund for the {product} in order {order}. You will get {amount} dollars back within {days} days."),
    ("broken", "the {product} I got in order {order} is broken", "I am sorry the {product} arrived broken. I have sent a free replacement for order {order}; it ships with {carrier} in {days} days."),
    ("address", "can I change the address of order {order} to {city}", "Yes. The address of order {order} is now in {city}. The order has not shipped yet, so nothing else changes."),
    ("cancel", "please cancel order {order}", "Order {order} is cancelled. The {amount} dollars will be back on your card within {days} days."),
]


@dataclass(frozen=True)
class Example:
    """One corpus example: the prompt a user sends and the completion the model learns.

    Prompts end before the space that starts the completion: the byte-level BPE merges a space
    into the next word, so a prompt ending in a bare space would show the model a token
    boundary it never saw in training.
    """

    domain: str
    prompt: str
    completion: str


def _order(rng: random.Random) -> dict:
    n_items = rng.randint(1, 3)
    items = []
    for _ in range(n_items):
        i = rng.randrange(len(_PRODUCTS))
        items.append({"sku": _SKUS[i], "name": _PRODUCTS[i], "qty": rng.randint(1, 4),
                      "price": round(rng.uniform(3, 90), 2)})
    return {"order_id": f"A{rng.randint(1000, 9999)}", "customer": rng.choice(_NAMES),
            "city": rng.choice(_CITIES), "status": rng.choice(_STATUSES), "items": items}


def _json_edit(rng: random.Random) -> Example:
    order = _order(rng)
    edited = json.loads(json.dumps(order))
    kind = rng.randrange(3)
    if kind == 0:
        new = rng.choice([s for s in _STATUSES if s != order["status"]])
        edited["status"] = new
        instruction = f"set status to {new}"
    elif kind == 1:
        new = rng.choice([c for c in _CITIES if c != order["city"]])
        edited["city"] = new
        instruction = f"set city to {new}"
    else:
        qty = rng.randint(5, 9)
        edited["items"][0]["qty"] = qty
        instruction = f"set qty of {edited['items'][0]['sku']} to {qty}"
    prompt = f"### Edit the order record: {instruction}.\nInput: {json.dumps(order)}\nOutput:"
    return Example("json", prompt, " " + json.dumps(edited))


def _config(rng: random.Random) -> dict[str, str]:
    svc = rng.choice(_SERVICES)
    return {"service": svc, "port": str(rng.choice([8000, 8080, 9000, 5000, 3000])),
            "workers": str(rng.randint(1, 16)), "log_level": rng.choice(["debug", "info", "warn"]),
            "timeout_s": str(rng.choice([5, 10, 30, 60])), "region": rng.choice(["eu", "us", "ap"]),
            "cache": rng.choice(["on", "off"])}


def _render_config(cfg: dict[str, str]) -> str:
    return "".join(f"{k}: {v}\n" for k, v in cfg.items())


def _config_edit(rng: random.Random) -> Example:
    cfg = _config(rng)
    key = rng.choice(["port", "workers", "log_level", "timeout_s", "cache"])
    options = {"port": ["8000", "8080", "9000", "5000", "3000"], "workers": [str(i) for i in range(1, 17)],
               "log_level": ["debug", "info", "warn"], "timeout_s": ["5", "10", "30", "60"],
               "cache": ["on", "off"]}[key]
    new = rng.choice([o for o in options if o != cfg[key]])
    edited = dict(cfg, **{key: new})
    prompt = f"### Edit the config: set {key} to {new}.\nInput:\n{_render_config(cfg)}Output:\n"
    return Example("config", prompt, _render_config(edited).rstrip("\n"))


def _logs(rng: random.Random) -> Example:
    svc = rng.choice(_SERVICES)
    lines, counts = [], {"INFO": 0, "WARN": 0, "ERROR": 0}
    minute = rng.randint(0, 50)
    for i in range(rng.randint(4, 8)):
        lvl = rng.choices(_LEVELS, weights=[6, 3, 2])[0]
        counts[lvl] += 1
        lines.append(f"2026-11-{rng.randint(10, 28)} 10:{minute + i:02d} {lvl} {svc} {rng.choice(_EVENTS[lvl])}")
    errors = [ln.split(f" {svc} ", 1)[1] for ln in lines if " ERROR " in ln]
    summary = (f"Service {svc}: {counts['INFO']} info, {counts['WARN']} warn, {counts['ERROR']} error lines. "
               + (f"Errors: {', '.join(errors)}." if errors else "No errors."))
    prompt = "### Summarize the logs.\n" + "\n".join(lines) + "\nSummary:"
    return Example("logs", prompt, " " + summary)


def _support(rng: random.Random) -> Example:
    _, ask, answer = rng.choice(_ISSUES)
    fields = {"order": f"A{rng.randint(1000, 9999)}", "product": rng.choice(_PRODUCTS),
              "carrier": rng.choice(_CARRIERS), "days": str(rng.randint(2, 9)),
              "track": f"TR{rng.randint(100000, 999999)}", "amount": str(rng.randint(5, 300)),
              "city": rng.choice(_CITIES)}
    name = rng.choice(_NAMES)
    prompt = (f"### Support chat.\nCustomer: Hi, I am {name}, {ask.format(**fields)}.\nAgent:")
    return Example("support", prompt, f" Hello {name}. " + answer.format(**fields))


GENERATORS = {"json": _json_edit, "config": _config_edit, "logs": _logs, "support": _support}


def examples(n: int, *, seed: int, domains: tuple[str, ...] = tuple(GENERATORS)) -> list[Example]:
    """Return ``n`` examples drawn round-robin from ``domains``, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [GENERATORS[domains[i % len(domains)]](rng) for i in range(n)]


# Training mix: the edit tasks teach the model to copy from its prompt, which is what makes
# its output predictable by prompt lookup (ngram) and by a small draft.
TRAINING_MIX = ("json", "config", "json", "config", "logs", "support")
TRAINING_SEED, TRAINING_DOCS = 12345, 120000  # what scripts/train_demo_models.py trains on


def documents(n: int, *, seed: int, domains: tuple[str, ...] = TRAINING_MIX) -> list[str]:
    """Training documents: prompt, completion and the end-of-sequence marker."""
    return [e.prompt + e.completion + EOS for e in examples(n, seed=seed, domains=domains)]


def fresh_examples(n: int, *, seed: int, domains: tuple[str, ...] = tuple(GENERATORS)) -> list[Example]:
    """``n`` examples whose prompts the training set does not contain (a held-out set)."""
    seen = {e.prompt for e in examples(TRAINING_DOCS, seed=TRAINING_SEED, domains=TRAINING_MIX)}
    out: list[Example] = []
    rng_seed = seed
    while len(out) < n:
        out += [e for e in examples(n, seed=rng_seed, domains=domains) if e.prompt not in seen][:n - len(out)]
        rng_seed += 1_000_003
    return out
