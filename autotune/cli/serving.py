"""The user's `vllm serve` flags (after ``--``, or ``--serve-config``) applied to a search before it starts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rich.markup import escape

from autotune.core.serving_flags import ServingFlags, collisions, fixed_values, flag


def parse_serving_flags(o: Any, settings: Any) -> ServingFlags:
    """``o.serve_flags`` / ``o.serve_config`` read by vLLM's parser (BadInput, exit 2, on a flag it refuses)."""
    if not o.serve_flags and o.serve_config is None:
        return ServingFlags()
    from autotune.run.serving_flags import parse

    return parse(settings.model, list(o.serve_flags), o.serve_config)


def apply_serving_flags(o: Any, settings: Any, space: Any, flags: ServingFlags | None = None
                        ) -> tuple[Any, Any, ServingFlags, list[str]]:
    """The serving flags (``flags``, or parsed from ``o``: ``parse_serving_flags``) applied: BadInput
    (exit 2) on one that collides (autotune.core.serving_flags.collisions), the knobs they fix removed
    from ``space`` and fixed in ``settings``; with the lines to show before the study starts."""
    flags = parse_serving_flags(o, settings) if flags is None else flags
    if not flags.values:
        return settings, space, flags, []
    from autotune.core.space import without

    knobs = {p.name for p in space.params}
    collisions(flags, knobs)  # BadInput for a flag autotune owns or duplicates
    fixed = fixed_values(flags, knobs)
    values = dict(flags.values)
    if "tokenizer" in values:  # the prompts' lengths are checked with it too (autotune.core.context)
        settings = replace(settings, tokenizer=values.pop("tokenizer"))
    space = without(space, sorted(fixed), "fixed by your serving flags", values={k: v for k, (v, _) in fixed.items()})
    settings = replace(settings, serve_flags=values)
    shown = " ".join(f"{flag(k)}={v}" for k, v in flags.values.items())
    notes = [f"serving flags ({escape(flags.source)}): {escape(shown)}, in every trial and in serve.sh"]
    notes += [f"{flag(k)}: fixed by your serving flags, so the space no longer searches {k}" if k in flags.values
              else f"{k}: not searched: {escape(why)}" for k, (_, why) in fixed.items()]
    if flags.served_only:
        notes.append(f"[dim]{escape(', '.join(map(flag, flags.served_only)))}: the API server's, so only "
                     "--instrument served and confirm carry them[/dim]")
    return settings, space, flags, notes
