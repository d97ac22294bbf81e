"""The test suite's own rules (tests/conftest.py)."""

import subprocess
import sys


def test_a_test_not_marked_engine_cannot_start_vllm():
    # Worker and server processes are where the engine runs; in an unmarked test they cannot import it.
    r = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not marked `engine`" in r.stderr, r.stderr
