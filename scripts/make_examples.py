"""Write the example workloads in examples/ from the demo corpus generator (seeded, reproducible).

    python scripts/make_examples.py
"""

from __future__ import annotations

import json
from pathlib import Path

from autotune.demo.corpus import examples

OUT = Path(__file__).resolve().parent.parent / "examples"


def write(name: str, rows: list[dict]) -> None:
    path = OUT / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{path}: {len(rows)} requests")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    # Repetitive: edit a JSON record or a config file; the output copies most of the prompt.
    rows = []
    for i, e in enumerate(examples(32, seed=777, domains=("json", "config"))):
        row = {"id": f"edit-{i:02d}", "prompt": e.prompt, "max_tokens": 192, "temperature": 0.0}
        if e.domain == "json":
            row["expect"] = {"json": True}
        rows.append(row)
    write("json_edit.jsonl", rows)
    # Conversational: support chats through the chat template, and log summaries.
    rows = []
    for i, e in enumerate(examples(24, seed=778, domains=("support",))):
        ask = e.prompt.split("Customer: ", 1)[1].split("\nAgent: ", 1)[0]
        rows.append({"id": f"chat-{i:02d}", "messages": [{"role": "user", "content": ask}],
                     "max_tokens": 96, "temperature": 0.0})
    write("support_chat.jsonl", rows)
    # A quick smoke workload: a few requests of each kind, short outputs (used by tests).
    rows = []
    for i, e in enumerate(examples(6, seed=779, domains=("json", "config", "logs"))):
        rows.append({"id": f"smoke-{i}", "prompt": e.prompt, "max_tokens": 48, "temperature": 0.0})
    write("smoke.jsonl", rows)


if __name__ == "__main__":
    main()
