"""Where a model named by a hub id lies on this machine.

autotune fetches each hub id where vLLM will read it (autotune.run.model_fetch): the user's
``--download-dir`` and ``--revision`` when given, else the default Hugging Face cache at ``main``.
What reads a model's files before vLLM does (its config.json for the space, a head's weights for the
EAGLE-3 trace) must look where it was fetched: the default cache's ``main`` misses a model fetched
into a download dir or at another revision, and a first run with those flags resolved another space
than vLLM then served (issue 59, defect 4). ``remember`` is told each fetched folder; ``folder`` reads
it first. The record is this process's: a worker is handed folders, not hub ids.
"""

from __future__ import annotations

from pathlib import Path

_fetched: dict[str, Path] = {}


def remember(name: str, folder: str | Path) -> None:
    """``name`` (a hub id) was fetched into ``folder`` (its snapshot)."""
    _fetched[name] = Path(folder)


def fetched(name: str) -> Path | None:
    """The folder ``name`` was fetched into by this process, or None."""
    return _fetched.get(name)


def folder(name: str) -> Path | None:
    """``name`` as a local folder: itself, the folder it was fetched into, or a hub id's snapshot in the
    default Hugging Face cache (HF_HOME / HF_HUB_CACHE as huggingface_hub reads them); None when none
    has it."""
    p = Path(name)
    if p.is_dir():
        return p
    if name in _fetched and _fetched[name].is_dir():
        return _fetched[name]
    if p.is_absolute() or name.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, not a repo id, no huggingface_hub: not here
        return None
