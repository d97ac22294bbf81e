"""Build VllmConfigs for speculative candidates, as the CPU build does or (``--cuda``) as the CUDA build
does: run as a subprocess by tests/test_methods_valid.py, so the patched platform never leaks.

``--cuda``: the CUDA platform faked as tests/cuda_config.py fakes it (capability 9.0, its compiled ops
stubbed) and Triton present (``HAS_TRITON`` in ``vllm.config.vllm``, which the CUDA wheel has and the
CPU wheel lacks), so vLLM picks its model runner as on a GPU (``VllmConfig.use_v2_model_runner``:
V2 unless a feature it lacks is asked for). Before the platform is faked, each architecture's model
info is inspected under the CPU platform (vLLM caches it by the model file's hash; under the faked
CUDA platform the inspection would import the flash-attention extensions the CPU wheel lacks).

Input: a JSON file of engine keyword arguments and the architectures to inspect; output (stdout, last
line): one JSON record per candidate: the runner, the method and parallel drafting vLLM settled on,
or the error.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(path: str, cuda: bool) -> None:
    job = json.loads(Path(path).read_text())
    from vllm.model_executor.models import registry
    from vllm.model_executor.models.registry import ModelRegistry

    registry._run_in_subprocess = lambda fn: fn()  # in this process (a vLLM import each otherwise), under CPU
    for arch in job["architectures"]:  # under the CPU platform: the model-info cache
        assert ModelRegistry._try_inspect_model_cls(arch) is not None, arch
    if cuda:
        import cuda_config  # noqa: F401 - stubs vllm._C_stable_libtorch
        import vllm.config.vllm as vllm_config
        import vllm.platforms as platforms

        vllm_config.HAS_TRITON = True
        platforms._current_platform = cuda_config.FakeHopper()
    from vllm.engine.arg_utils import AsyncEngineArgs
    import vllm.platforms as platforms

    out = []
    for kw in job["kwargs"]:
        try:
            vc = AsyncEngineArgs(**kw).create_engine_config()
            sc = vc.speculative_config
            out.append({"platform": type(platforms.current_platform).__name__,
                        "runner": "V2" if vc.use_v2_model_runner else "V1",
                        "method": sc.method if sc else "none", "k": sc.num_speculative_tokens if sc else 0,
                        "parallel_drafting": bool(sc and sc.parallel_drafting),
                        "adaptive": bool(sc and sc.enable_adaptive_verification)})
        except Exception as e:  # noqa: BLE001 - each refusal is a record
            out.append({"error": f"{type(e).__name__}: " + " | ".join(str(e).splitlines()[:3])[:400]})
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], "--cuda" in sys.argv[2:])
