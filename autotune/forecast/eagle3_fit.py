"""Whether the EAGLE-3 trace (autotune.forecast.eagle3_trace), or a DFlash drafter's
(autotune.forecast.dflash_drafter, CPU only for now), can run here, decided before anything is loaded.

Read from files' headers only (config.json, the safetensors headers; autotune.forecast.eagle3_format
reads the head as vLLM does): a head or target that is neither a local folder nor a hub id in the
local Hugging Face cache, a head the trace cannot follow (another speculators algorithm, more than one
layer, a RoPE it does not compute), a target that is not a Llama, or a target too large for where the
trace runs, each gives one line saying why, and eagle3 is then measured without a forecast.

Where it runs: on CPU in the CLI's process, the target in float32 (an 8B target is ~32 GB there, so
the RAM available decides); on a GPU in a worker of its own on the worker's device, in the dtype vLLM
serves the target in (``gpu_dtype``), so the device's memory decides.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from autotune.core import snapshots
from autotune.forecast.eagle3_format import (file_bytes, param_count, read_head, rope_parameters,
                                             safetensors_header)

FLOAT32 = 4  # bytes per parameter as the CPU trace loads them
HEADROOM = 1.25  # activations of the target's teacher-forced pass and the head, over the weights
_HALF = {"float16": "float16", "half": "float16", "bfloat16": "bfloat16", "float32": "float32", "float": "float32"}

__all__ = ["available_ram", "dflash_why_not", "gpu_dtype", "trace_dtype", "param_count", "safetensors_header", "why_not"]


def available_ram() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gpu_dtype(target_cfg: dict[str, Any], setting: str | None = None) -> str:
    """The dtype vLLM serves the target in on a GPU: ``--dtype`` where given, else the checkpoint's,
    float32 checkpoints in bfloat16 (``vllm/config/model.py`` ``_resolve_auto_dtype``: CUDA's first
    supported dtype on compute capability 8.0 and later)."""
    if setting and setting in _HALF:
        return _HALF[setting]
    got = _HALF.get(str(target_cfg.get("dtype") or target_cfg.get("torch_dtype") or "bfloat16"), "bfloat16")
    return "bfloat16" if got == "float32" else got


def trace_dtype(target: str, setting: str | None = None) -> str:
    """``gpu_dtype`` for a target named as the study names it (a folder or a cached hub id)."""
    t = snapshots.folder(target)
    try:
        cfg = json.loads((t / "config.json").read_text()) if t is not None else {}
    except (OSError, ValueError):
        cfg = {}
    return gpu_dtype(cfg, setting)


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def why_not(head: str, target: str, *, ram_bytes: int | None = None, device: str = "cpu",
            device_bytes: int | None = None, dtype: str | None = None) -> str | None:
    """Why the trace cannot run for ``head`` over ``target``, or None. On ``device`` "cpu":
    ``ram_bytes`` is the RAM it may use (default: what the machine has available now); on "cuda":
    ``device_bytes`` is one GPU's memory and ``dtype`` the study's ``--dtype``."""
    h = snapshots.folder(head)
    if h is None:
        return (f"the EAGLE-3 head {head} is neither a local folder nor in the local Hugging Face cache "
                "(the trace downloads nothing; fetch it first, e.g. `hf download`)")
    fmt = read_head(h)
    if isinstance(fmt, str):
        return f"the EAGLE-3 head {head}: {fmt}"
    t, tcfg = _target(target)
    if t is None:
        return tcfg
    vocab = tcfg.get("vocab_size")
    if fmt.names and fmt.draft_vocab != vocab and not fmt.owns("lm_head"):
        return (f"the EAGLE-3 head {head} drafts over {fmt.draft_vocab} tokens (draft_vocab_size) but has no lm_head "
                f"of its own for them (the target has {vocab})")
    # a pytorch_model.bin head is sized by its file (2 bytes a parameter: its float16/bfloat16)
    return _fits(target, t, tcfg, param_count(h) if fmt.names else file_bytes(fmt) // 2, ram_bytes=ram_bytes,
                 device=device, device_bytes=device_bytes, dtype=dtype)


def _target(target: str) -> tuple[Path | None, Any]:
    """(the target's local folder, its config), or (None, why not)."""
    t = snapshots.folder(target)
    if t is None:
        return None, f"the target {target} is neither a local folder nor in the local Hugging Face cache"
    try:
        tcfg = json.loads((t / "config.json").read_text())
    except (OSError, ValueError) as e:
        return None, (f"the target {target} has no readable local config.json ({type(e).__name__}); "
                      "the trace loads it locally")
    if tcfg.get("model_type") != "llama":
        return None, f"the target {target} is a {tcfg.get('model_type')!r} model; the trace loads Llama targets only"
    return t, tcfg


def _fits(target: str, t: Path, tcfg: dict[str, Any], extra: int, *, ram_bytes: int | None, device: str,
          device_bytes: int | None, dtype: str | None) -> str | None:
    """Whether the target and ``extra`` parameters (the drafter's) fit where the trace runs."""
    try:
        tparams = param_count(t)
        params = tparams + extra
    except (OSError, ValueError, struct.error) as e:
        return f"the target {target}: safetensors headers unreadable ({type(e).__name__}: {e})"
    if tparams == 0:
        return f"the target {target} has no safetensors weights the trace could size before loading"
    if device != "cpu":
        want = gpu_dtype(tcfg, dtype)
        need = int(params * (FLOAT32 if want == "float32" else 2) * HEADROOM)
        if device_bytes is None or need > device_bytes:
            have = "unknown" if device_bytes is None else _size(device_bytes)
            return (f"the trace would load {params / 1e9:.2f}B parameters in {want} (~{_size(need)}) onto one GPU "
                    f"of {have}")
        return None
    need = int(params * FLOAT32 * HEADROOM)
    ram = available_ram() if ram_bytes is None else ram_bytes
    if ram is None or need > ram:
        have = "unknown" if ram is None else _size(ram)
        return (f"the trace would load {params / 1e9:.2f}B parameters in float32 (~{_size(need)}) "
                f"into this process; RAM available: {have}")
    return None


def dflash_why_not(drafter: str, target: str, *, ram_bytes: int | None = None) -> str | None:
    """Why the DFlash trace (autotune.forecast.dflash_drafter.trace, on CPU) cannot run for
    ``drafter`` over ``target``, or None: a drafter the mirror does not compute (the speculators
    format, sliding windows, a vocabulary or embedding of its own, a RoPE other than default), or a
    target that is not a local Llama or does not fit in RAM in float32."""
    d = snapshots.folder(drafter)
    if d is None:
        return f"the DFlash drafter {drafter} is neither a local folder nor in the local Hugging Face cache"
    try:
        cfg = json.loads((d / "config.json").read_text())
        names = {n for f in sorted(d.glob("*.safetensors")) for n in safetensors_header(f)}
    except (OSError, ValueError, struct.error) as e:
        return f"the DFlash drafter {drafter}: config.json or safetensors unreadable ({type(e).__name__})"
    flash = cfg.get("dflash_config") or {}
    if cfg.get("speculators_config") is not None or "DFlashDraftModel" not in (cfg.get("architectures") or []):
        return f"the DFlash drafter {drafter} is not a DFlashDraftModel checkpoint, which the trace computes"
    own = sorted({n.split(".")[0] for n in names} & {"lm_head", "d2t", "embed_tokens", "mask_embedding"})
    if flash.get("use_swa") or cfg.get("layer_types") or cfg.get("attention_bias") or own or not names \
            or "mask_token_id" not in flash or "target_layer_ids" not in flash:
        why = f"carries {', '.join(own)}" if own else \
            "uses sliding windows or biases, or has no weights, mask token or target layers"
        return f"the DFlash drafter {drafter} {why}, which the trace does not compute"
    if rope_parameters(cfg)["rope_type"] != "default":
        return f"the DFlash drafter {drafter}: RoPE {rope_parameters(cfg)['rope_type']!r}; the trace computes default"
    t, tcfg = _target(target)
    if t is None:
        return tcfg
    return _fits(target, t, tcfg, param_count(d), ram_bytes=ram_bytes, device="cpu", device_bytes=None, dtype=None)
