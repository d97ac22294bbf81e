"""Whether the EAGLE-3 trace (autotune.forecast.eagle3_trace) can run here, decided before anything is loaded.

The trace loads the target with transformers' ``LlamaForCausalLM`` in float32 and the head from one
``model.safetensors`` whose tensors are exactly the layer vLLM runs, sharing the target's embedding
and lm_head (the bundled head's format). It runs in the CLI's own process, so a target the RAM
cannot hold must never reach it: an 8B target is ~32 GB in float32. Read here from files' headers
only (config.json, the safetensors headers): a hub id, another format (the speculators format,
a head with its own ``lm_head`` and vocabulary maps ``d2t``/``t2d``), a target that is not a Llama,
or a target larger than the available RAM, each gives one line saying why, and eagle3 is then
measured without a forecast.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

FLOAT32 = 4  # bytes per parameter as the trace loads them
HEADROOM = 1.25  # activations of the target's teacher-forced pass and the head, over the weights
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1}
_OWN_VOCAB = ("lm_head", "d2t", "t2d", "embed_tokens")  # a head with these drafts in a vocabulary of its own


def safetensors_header(path: Path) -> dict[str, dict]:
    """The tensors a .safetensors file declares (name -> dtype, shape, offsets), read from its header only."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100_000_000:
            raise ValueError(f"{path}: not a safetensors file (header of {n} bytes)")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def param_count(folder: Path) -> int:
    """Parameters of a checkpoint folder's safetensors files, from their headers."""
    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        for t in safetensors_header(f).values():
            n = 1
            for d in t.get("shape", []):
                n *= int(d)
            total += n
    return total


def available_ram() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def why_not(head: str, target: str, *, ram_bytes: int | None = None) -> str | None:
    """Why the trace cannot run for ``head`` over ``target`` here, or None. ``ram_bytes``: the RAM it
    may use (default: what the machine has available now)."""
    h, t = Path(head), Path(target)
    if not h.is_dir():
        return f"the EAGLE-3 head {head} is not a local folder (a hub id?): the trace reads a local checkpoint"
    try:
        cfg = json.loads((h / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"the EAGLE-3 head {head} has no readable config.json ({type(e).__name__})"
    if "speculators_config" in cfg or "speculators_model_type" in cfg:
        return f"the EAGLE-3 head {head} is in the speculators format, which the trace does not read"
    if not (h / "model.safetensors").is_file():
        return f"the EAGLE-3 head {head} has no model.safetensors (the only checkpoint file the trace reads)"
    try:
        names = set(safetensors_header(h / "model.safetensors"))
    except (OSError, ValueError, struct.error) as e:
        return f"the EAGLE-3 head {head}: model.safetensors unreadable ({type(e).__name__}: {e})"
    own = sorted({k for n in names for k in _OWN_VOCAB if n.split(".")[0] == k or n.startswith(f"model.{k}")})
    if own:
        return (f"the EAGLE-3 head {head} carries {', '.join(own)} (a vocabulary of its own), which the trace "
                "does not read")
    try:
        tcfg = json.loads((t / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"the target {target} has no readable local config.json ({type(e).__name__}); the trace loads it locally"
    if tcfg.get("model_type") != "llama":
        return f"the target {target} is a {tcfg.get('model_type')!r} model; the trace loads Llama targets only"
    try:
        params = param_count(t) + param_count(h)
    except (OSError, ValueError, struct.error) as e:
        return f"the target {target}: safetensors headers unreadable ({type(e).__name__}: {e})"
    if params == 0:
        return f"the target {target} has no safetensors weights the trace could size before loading"
    need = int(params * FLOAT32 * HEADROOM)
    ram = available_ram() if ram_bytes is None else ram_bytes
    if ram is None or need > ram:
        have = "unknown" if ram is None else f"{ram / 2**30:.1f} GiB"
        return (f"the trace would load {params / 1e9:.2f}B parameters in float32 (~{need / 2**30:.1f} GiB) "
                f"into this process; RAM available: {have}")
    return None
