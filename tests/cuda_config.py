"""Build VllmConfigs as on a CUDA machine (capability 9.0), with no GPU: run as a subprocess by
tests/test_gpu_space_cuda.py, so the patched platform never leaks into another test.

The CUDA build as it is: it has Triton, so ``HAS_TRITON`` is patched to True where vLLM's config
reads it (``vllm.config.vllm``), and vLLM picks its model runner as on a GPU: Model Runner V2 unless
the config uses a feature V2 lacks (``VllmConfig.use_v2_model_runner``). Not through
``VLLM_USE_V2_MODEL_RUNNER=1``, which would skip that check. The CPU build of vLLM lacks the CUDA
build's compiled ops (``vllm._C_stable_libtorch``, imported by ``vllm/platforms/cuda.py``): an empty
module stands in, which is enough for config code (no kernel runs). The platform's device queries
are answered as an H100's would be. Input: a JSON file of engine keyword arguments, and the
platform (``cuda``, or ``cpu``: the CPU platform with Triton present, for the EAGLE family, whose
draft inspection needs the CUDA build's flash-attention extensions here; the runner choice reads no
platform); output (stdout, last line): one JSON record each.
"""

import copy
import json
import sys
import types

sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")

import vllm.config.speculative as speculative  # noqa: E402
import vllm.config.vllm as vllm_config  # noqa: E402
import vllm.platforms as platforms  # noqa: E402
from vllm.platforms.cpu import CpuPlatform  # noqa: E402
from vllm.platforms.cuda import CudaPlatform  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402


class FakeHopper(CudaPlatform):
    """The CUDA platform with its device queries faked (capability 9.0, 80 GiB, one device)."""

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability(9, 0)

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "NVIDIA H100 80GB HBM3 (faked)"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return 80 * 2**30

    @classmethod
    def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
        return True

    @classmethod
    def device_count(cls) -> int:
        return 1


def fake_cuda(architectures: list[str] = ()) -> None:
    """This process's vLLM as the CUDA build on an H100, for config code: what must be imported under
    the CPU platform first is, then the platform is switched. ``architectures``: inspected first
    (vLLM's model-info cache; under the faked platform the inspection of an EAGLE/MTP draft would
    import the CUDA build's flash-attention extensions, which the CPU wheel lacks). The model loader
    is imported first for the same reason (fp8 quantization's config imports it, and its attention
    modules ask the platform at import)."""
    from vllm.model_executor.models import registry

    # in this process, under the CPU platform, rather than one vLLM import per architecture
    # (vLLM's own subprocess: seconds each, on every run that starts from an empty cache)
    registry._run_in_subprocess = lambda fn: fn()
    for arch in architectures:
        assert registry.ModelRegistry._try_inspect_model_cls(arch) is not None, arch
    import vllm.model_executor.model_loader  # noqa: F401 - imported under the CPU platform (see above)

    platforms._current_platform = FakeHopper()
    vllm_config.HAS_TRITON = True  # the CUDA build has Triton: vLLM chooses its runner as on a GPU
    speculative.has_arctic_inference = lambda: True  # suffix: its config values are what is checked


def check(src: str, dst: str, architectures: str = "") -> None:
    """autotune.run.config_check over the engine arguments in ``src`` (a JSON list) under the faked
    CUDA platform; records to ``dst``, and the vLLM that built them on the last stdout line."""
    fake_cuda([a for a in architectures.split(",") if a])
    import vllm

    from autotune.run import config_check

    config_check.main([src, dst])
    print(json.dumps({"vllm": vllm.__version__, "from": vllm.__file__,
                      "platform": type(platforms.current_platform).__name__}))


def main(path: str, platform: str = "cuda") -> None:
    # The model loader under the CPU platform first: vLLM's model-info cache imports it when it saves an
    # inspection (an empty cache, as on a fresh machine), and under the faked platform its attention
    # modules would import the CUDA build's flash-attention extensions.
    import vllm.model_executor.model_loader  # noqa: F401
    from vllm.model_executor.models import registry

    # inspections in this process (vLLM's own: a subprocess each, ~10 s on an empty cache), under the CPU
    # platform: the architectures of the kwargs below, before the platform is switched
    registry._run_in_subprocess = lambda fn: fn()
    for kw in json.loads(open(path).read()):
        for model in {kw["model"], (kw.get("speculative_config") or {}).get("model")} - {None}:
            try:
                archs = json.loads(open(f"{model}/config.json").read()).get("architectures") or []
            except OSError:
                continue
            for arch in archs:
                registry.ModelRegistry._try_inspect_model_cls(arch)

    # set before vLLM's engine modules are imported: some bind the platform when they load
    platforms._current_platform = FakeHopper() if platform == "cuda" else CpuPlatform()
    vllm_config.HAS_TRITON = True  # the CUDA build has Triton: vLLM chooses its runner as on a GPU
    speculative.has_arctic_inference = lambda: True  # suffix: its config values are what is checked
    from vllm.engine.arg_utils import AsyncEngineArgs

    out = []
    for kw in json.loads(open(path).read()):
        rec: dict = {}
        try:
            vc = AsyncEngineArgs(**kw).create_engine_config()
            cc = vc.compilation_config
            sc = vc.speculative_config
            rec = {"platform": type(platforms.current_platform).__name__, "device": str(vc.device_config.device),
                   "mode": cc.cudagraph_mode.name, "sizes": list(cc.cudagraph_capture_sizes or []),
                   "max": cc.max_cudagraph_capture_size, "k": sc.num_speculative_tokens if sc else 0,
                   "runner": "v2" if vc.use_v2_model_runner else "v1",
                   "v2_unsupported": vc._get_v2_model_runner_unsupported_features(),
                   "draft_tp": sc.draft_parallel_config.tensor_parallel_size
                   if sc is not None and sc.draft_parallel_config is not None else None}
            # What the GPU worker does next under FULL decode graphs: V1 rounds the capture sizes to
            # multiples of k+1 (CompilationConfig.resolve_cudagraph_mode_and_sizes); V2 does not.
            if rec["k"] and cc.cudagraph_mode.decode_mode().name == "FULL" and rec["runner"] == "v1":
                again = copy.deepcopy(cc)
                again.adjust_cudagraph_sizes_for_spec_decode(rec["k"] + 1)
                rec["spec_sizes"] = list(again.cudagraph_capture_sizes)
        except Exception as e:  # noqa: BLE001 - each refusal is a record
            rec = {"error": f"{type(e).__name__}: " + " | ".join(str(e).splitlines()[:3])[:400]}
        out.append(rec)
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        check(*sys.argv[2:5])
    else:
        main(*sys.argv[1:3])
