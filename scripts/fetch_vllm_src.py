"""Fetch a vLLM release's Python source (the PyPI sdist's ``vllm/`` package) into a folder, never installed.

tests/test_gpu_space_vllm.py imports it in place of the installed vLLM (first on PYTHONPATH, in a
subprocess, the CUDA build's compiled ops stubbed) to build every gpu-space candidate with the next
release's config code. scripts/setup.sh runs it once; the sdist's hash is the one PyPI's index gives.

    python scripts/fetch_vllm_src.py 0.33.0 build/vllm-src/0.33.0
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

INDEX = "https://pypi.org/simple/vllm/"


def sdist_url(version: str) -> tuple[str, str]:
    """The sdist's URL and sha256, from PyPI's simple index (PEP 691 JSON)."""
    req = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        files = json.load(r)["files"]
    want = f"vllm-{version}.tar.gz"
    for f in files:
        if f["filename"] == want:
            return f["url"], f["hashes"]["sha256"]
    raise SystemExit(f"fetch_vllm_src: {want} is not on {INDEX}")


def fetch(version: str, dest: Path) -> None:
    url, sha = sdist_url(version)
    with urllib.request.urlopen(url, timeout=300) as r:
        data = r.read()
    if hashlib.sha256(data).hexdigest() != sha:
        raise SystemExit(f"fetch_vllm_src: {url}: sha256 differs from the index's")
    prefix = f"vllm-{version}/vllm/"
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(f"vllm-{version}/"):]
        tar.extractall(tmp, members=members, filter="data")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    print(f"vLLM {version}'s source ({len(members)} entries of {url.rsplit('/', 1)[1]}) in {dest}")


if __name__ == "__main__":
    fetch(sys.argv[1], Path(sys.argv[2]))
