"""The study's models on this machine before any clock starts, and the baseline's time limit from their size.

At GPU scale a model's download is minutes, and inside a trial it would count against the baseline's
time limit (a timed-out baseline ends the study). So ``search`` fetches the target, the draft and the
EAGLE heads first, into the Hugging Face cache vLLM reads (or ``--download-dir``), the files vLLM's
default loader would fetch (``DefaultModelLoader._prepare_weights``, vllm/model_executor/model_loader/
default_loader.py: the weight map of ``model.safetensors.index.json``, else the first of
``*.safetensors``, ``*.bin``, ``*.pt`` the repo has; ``consolidated*.safetensors`` for Mistral's
format) and the small config and tokenizer files beside them: no download the engine would not do
anyway. A local folder is used as it is; with ``HF_HUB_OFFLINE=1`` a hub id must be in the cache
already (one line, exit 2, if not). One line says what is ready, with its size.

Without ``--trial-timeout``, the baseline's limit is sized from those weights and the platform
(``baseline_timeout``): loading, compiling and CUDA-graph capture grow with the model. Its per-GB
terms are a bound chosen to be generous, not measured (no GPU run yet); ``--trial-timeout`` sets it.
No vLLM import (huggingface_hub only).
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core import snapshots
from autotune.core.errors import BadInput

GB = 1e9
WEIGHTS = ("*.safetensors", "*.bin", "*.pt")  # vLLM's order for load_format auto/hf (and its .pt fall-back)
SMALL = ("*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py")  # config, tokenizer, remote code
INDEX = "model.safetensors.index.json"
BASE_TIMEOUT_S = 600.0  # the limit before this module: it holds every CPU run of the demo models
# Seconds per GB of weights for load + compile + graph capture + the replay's slower steps, by
# platform; a tensor-parallel rank count adds half that per extra rank (more processes to start and
# synchronise). Not measured on a GPU: chosen generous (an 8B bf16 target: 16 GB -> 1080 s on CUDA).
PER_GB_S = {"cuda": 30.0, "cpu": 120.0}


@dataclass(frozen=True)
class Ready:
    """One model as the engines will load it."""

    role: str  # "target", "draft", "EAGLE head", "EAGLE-3 head"
    name: str  # as the user gave it
    path: str  # the local folder vLLM reads
    weight_bytes: int
    source: str  # "local folder", "HF cache", "fetched in 2m10s"


def _size(folder: Path) -> int:
    """Bytes of the weight files vLLM would load from ``folder`` (every file, where it has none)."""
    for pattern in WEIGHTS:
        found = [p for p in folder.glob(pattern) if p.is_file()]
        if found:
            return sum(p.stat().st_size for p in found)
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def weight_patterns(files: list[str], read_index: Any = None) -> list[str]:
    """The weight files vLLM's default loader fetches from a repo of ``files`` (as patterns or names):
    Mistral's consolidated files where present, the safetensors index's weight map, else the first
    of ``WEIGHTS`` that matches. ``read_index()``: the index's JSON text, fetched only when present."""
    if fnmatch.filter(files, "consolidated*.safetensors"):
        return ["consolidated*.safetensors", "consolidated.safetensors.index.json"]
    if INDEX in files and read_index is not None:
        weight_map = json.loads(read_index()).get("weight_map") or {}
        if weight_map:
            return sorted(set(weight_map.values())) + [INDEX]
    for pattern in WEIGHTS:
        if fnmatch.filter([f for f in files if "/" not in f], pattern):
            return [pattern]
    return []


def _offline() -> bool:
    import huggingface_hub.constants as hf

    return bool(hf.HF_HUB_OFFLINE)


def _hub(role: str, name: str, *, revision: str | None, cache_dir: str | None, weights: bool = True) -> Ready:
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    if _offline():
        try:
            path = snapshot_download(name, revision=revision, cache_dir=cache_dir, local_files_only=True)
        except LocalEntryNotFoundError:
            raise BadInput(f"{role} {name}: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set: "
                           f"fetch it first (huggingface-cli download {name}) or unset HF_HUB_OFFLINE") from None
        return Ready(role, name, path, _size(Path(path)), "HF cache")
    t0 = time.monotonic()
    try:
        patterns: list[str] = []
        if weights:
            files = HfApi().list_repo_files(name, revision=revision)
            patterns = weight_patterns(files, lambda: Path(hf_hub_download(name, INDEX, revision=revision,
                                                                              cache_dir=cache_dir)).read_text())
        path = snapshot_download(name, revision=revision, cache_dir=cache_dir, allow_patterns=[*patterns, *SMALL])
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadInput(f"{role} {name}: neither a local folder nor a model the Hugging Face hub gives ({why})") from None
    took = time.monotonic() - t0
    return Ready(role, name, path, _size(Path(path)), f"ready in {int(took // 60)}m{int(took % 60):02d}s")


def fetch(settings: Any, flags: dict[str, Any] | None = None, *, weights: bool = True) -> list[Ready]:
    """The target, draft and heads of ``settings`` on this machine (see the module docstring);
    ``flags``: the user's serving flags (their ``revision``, ``download_dir``). ``weights=False``: only
    the small files (config.json, tokenizer), which the search space and the prompts' check read
    before any weight is fetched (``configs_first``)."""
    flags = flags or {}
    out = []
    for role, name in (("target", settings.model), ("draft", settings.draft_model),
                       ("EAGLE head", settings.eagle_head), ("EAGLE-3 head", settings.eagle3_head)):
        if not name:
            continue
        if os.path.isdir(name):
            out.append(Ready(role, name, name, _size(Path(name)), "local folder"))
            continue
        out.append(_hub(role, name, revision=flags.get("revision") if role == "target" else None,
                        cache_dir=flags.get("download_dir"), weights=weights))
        snapshots.remember(name, out[-1].path)  # what reads it before vLLM looks there (a download dir, a revision)
    return out


def configs_first(settings: Any, flags: dict[str, Any] | None = None) -> None:
    """Before the search space is resolved: each hub id's config.json and tokenizer files in the cache,
    where autotune.core.candidate.model_configs reads them (a pre-quantized target, MTP layers, a
    P-EAGLE head, each drafter's method) and the prompts' lengths are checked. Without it a first run
    with hub ids resolved another space than the second (issue 59); the weights come after
    (``fetch``). A local folder is read as it is; offline, a hub id not cached is bad input here."""
    fetch(settings, flags, weights=False)


def weight_bytes(ready: list[Ready]) -> int:
    return sum(r.weight_bytes for r in ready)


def baseline_timeout(weights: int, platform: str, tensor_parallel: int = 1) -> float:
    """The baseline's time limit when the user gave none: ``BASE_TIMEOUT_S`` plus ``PER_GB_S`` per GB of
    the study's weights, half again per extra tensor-parallel rank."""
    per_gb = PER_GB_S.get(platform, PER_GB_S["cuda"]) * (1 + 0.5 * max(tensor_parallel - 1, 0))
    return round(BASE_TIMEOUT_S + per_gb * weights / GB)


def _short(name: str) -> str:
    """A model as a line names it: a hub id as given, a long local path by its last two parts (the
    demo's absolute paths took four lines of the console)."""
    parts = Path(name).parts
    return name if len(name) <= 40 or len(parts) <= 2 else str(Path("…", *parts[-2:]))


def ready_line(ready: list[Ready], limit: float | None = None, platform: str = "", tensor_parallel: int = 1) -> str:
    """One line: each model ready before any clock starts, its weights' size and where it came from;
    and the baseline's time limit where it was sized here."""
    said = "; ".join(f"{r.role} {_short(r.name)} {r.weight_bytes / GB:.2f} GB ({r.source})" for r in ready)
    line = f"models ready before any clock starts: {said}"
    if limit is not None:
        line += (f"; the baseline's time limit {limit:.0f} s, sized from {weight_bytes(ready) / GB:.2f} GB on "
                 f"{platform}{f' at tensor parallel {tensor_parallel}' if tensor_parallel > 1 else ''} "
                 "(--trial-timeout sets it)")
    return line
