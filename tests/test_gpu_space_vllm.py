"""Every candidate the gpu space can draw, built by vLLM's own config code under a faked CUDA
platform (issue 59; DESIGN.md's platform, rule 1): what vLLM refuses or silently changes, the space
does not offer.

The space is the one a user gets: ``autotune search``'s own ``prepare`` resolves it on a faked CUDA
host (the platform and NVML faked) for each kind of drafter the demo and the tests provide, in
bfloat16, at tensor parallel 1 and 2 and with and without the user's ``--enforce-eager`` (their
serving flags), over a workload with a sampled request (so the verification knobs are offered). Each
distinct candidate's engine arguments go to vLLM's ``AsyncEngineArgs(...).create_engine_config()``
(autotune.run.config_check) in a subprocess where tests/cuda_config.py fakes the CUDA build as it is
(an H100's device queries, Triton present, so Model Runner V2 as vLLM chooses it). Each build is held
to what the candidate asked for and autotune expects (autotune.core.engine_config.mismatches: the
graph mode kept, method, depth and verification kept, block verification never on Model Runner V1,
the runner autotune.core.runner expects), and no two candidates may build one config
(``collapsed``: three graph modes under --enforce-eager were one engine under three labels).

vLLM 0.32.0 is the installed one; the same enumeration runs against vLLM 0.33.0's config code
where scripts/setup.sh fetched its source (build/vllm-src/0.33.0, the PyPI sdist's ``vllm/``,
imported in place of the installed package with the CUDA build's compiled ops stubbed). What a GPU
adds (kernels, graph capture, the attention backends' choices) is untested here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import demo
from autotune.cli.search import SearchOptions, prepare
from autotune.core.engine_config import collapsed, mismatches
from autotune.run import gpu_memory, hardware
from conftest import ROOT, config_code_pythonpath
from test_gpu_memory import FakeNVML
from test_gpu_space_valid import _DEEPSEEK_MTP, _LLAMA
from test_methods_valid import PLACEHOLDERS

HERE = Path(__file__).resolve().parent
VLLM_033 = ROOT / "build" / "vllm-src" / "0.33.0"  # scripts/setup.sh (the sdist's vllm/ package)
FLAGS = {"tp1": (), "tp2": ("--tensor-parallel-size", "2"), "eager": ("--enforce-eager",),
         "tp2 eager": ("--tensor-parallel-size", "2", "--enforce-eager")}
# Architectures vLLM inspects for these models and their drafts (inspected under the CPU platform first).
ARCHS = ("LlamaForCausalLM", "LlamaForCausalLMEagle3", "EagleLlamaForCausalLM", "Eagle3LlamaForCausalLM",
         "Qwen3ForCausalLM", "Qwen3DSparkModel", "DFlashDraftModel", "DeepseekV3ForCausalLM", "DeepSeekMTPModel")


def _placeholders(root: Path) -> dict[str, str]:
    """config.json-only models for the drafters the demo lacks (no weights: config code reads none)."""
    cfgs = {"eagle-head": _LLAMA,  # an EAGLE-1 head (vLLM rewrites it to EagleLlamaForCausalLM)
            "p-eagle3": {**json.loads((demo.EAGLE3 / "config.json").read_text()), "pard_token": 3},
            "qwen3-target": PLACEHOLDERS["qwen3-target"], "dspark": PLACEHOLDERS["dspark-qwen3"],
            "mtp1": _DEEPSEEK_MTP,
            "mtp2-fp8": {**_DEEPSEEK_MTP, "num_nextn_predict_layers": 2,
                         "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}}
    for name, cfg in cfgs.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "config.json").write_text(json.dumps(cfg))
    return {name: str(root / name) for name in cfgs}


def _studies(m: dict[str, str]) -> dict[str, tuple[dict[str, str], set[str]]]:
    """Each kind of drafter a user may bring, as `autotune search`'s model options, and the methods
    whose whole grid that study covers (the drafter's own; the first also those that need none)."""
    return {"draft, eagle, eagle3": ({"model": str(demo.TARGET), "draft_model": str(demo.DRAFT),
                                      "eagle_head": m["eagle-head"], "eagle3_head": str(demo.EAGLE3)},
                                     {"none", "ngram", "suffix", "draft_model", "eagle", "eagle3"}),
            "dflash, p-eagle": ({"model": str(demo.TARGET), "draft_model": str(demo.DFLASH),
                                 "eagle3_head": m["p-eagle3"]}, {"dflash", "eagle3"}),
            "dspark": ({"model": m["qwen3-target"], "draft_model": m["dspark"]}, {"dspark"}),
            "mtp": ({"model": m["mtp1"]}, {"mtp"}),
            "mtp x2, fp8 checkpoint": ({"model": m["mtp2-fp8"]}, {"mtp"})}


def _ends(space, c) -> bool:
    """Whether each numeric knob of ``c`` sits at an end of its range (the thinned grid)."""
    for p in space.params:
        if (p.int_range or p.float_range) and p.active(c.params) and p.name in c.params:
            vals = p.values()
            if c.params[p.name] not in (vals[0], vals[-1]):
                return False
    return True


def enumerate_gpu_space(tmp_path: Path, monkeypatch) -> list[tuple[str, str, dict]]:
    """(study, candidate label, engine kwargs) for every distinct candidate of the gpu space as
    ``prepare`` resolves it in each context, for each study's own methods (the methods that need no
    drafter in the first study: elsewhere they differ by the target alone). Every combination of the
    categorical knobs (graph mode, KV dtype, quantization, verification, adaptive and parallel
    drafting) is built in every context, with the numeric ones (depths, lookup windows, suffix bounds)
    at their ends; the numeric ones whole at tensor parallel 1 without flags at the space's baseline
    engine knobs (whose combinations with the rest are built at the ends)."""
    monkeypatch.setattr(hardware, "detect", lambda: "cuda")
    monkeypatch.setattr(gpu_memory, "_nvml", lambda: FakeNVML(*[(80, 79, [])] * 2))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    workload = tmp_path / "sampled.jsonl"
    lines = (ROOT / "examples/smoke.jsonl").read_text().splitlines()
    workload.write_text("\n".join([*lines, json.dumps({**json.loads(lines[0]), "id": "sampled-0",
                                                        "temperature": 0.8})]) + "\n")
    models = _placeholders(tmp_path / "models")
    out, seen = [], set()
    for study, (given, own) in _studies(models).items():
        for flags_name, flags in FLAGS.items():
            p = prepare(SearchOptions(workload=workload, dtype="bfloat16", max_model_len=1024, serve_flags=flags,
                                      results=tmp_path / "results", **given))
            engine = {k: v for k, v in p.space.baseline.items() if k != "method"}
            mine = [c for c in p.space.grid() if c.method in own]
            whole = [c for c in mine if flags_name == "tp1" and all(c.params.get(k) == v for k, v in engine.items())]
            for c in whole + [c for c in mine if _ends(p.space, c)]:
                kw = c.engine_kwargs(p.cfg.settings)
                key = json.dumps(kw, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out.append((f"{study} [{flags_name}]", c.label, kw))
    return out


def _build(kwargs: list[dict], tmp_path: Path, vllm_src: Path | None = None) -> tuple[list[dict], dict]:
    src, dst = tmp_path / "kwargs.json", tmp_path / "built.json"
    src.write_text(json.dumps(kwargs))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_USE_V2_MODEL_RUNNER"}  # vLLM's choice, not a user's
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(vllm_src) if vllm_src else "", str(ROOT),
                                                      config_code_pythonpath()]))
    r = subprocess.run([sys.executable, str(HERE / "cuda_config.py"), "--check", str(src), str(dst), ",".join(ARCHS)],
                       capture_output=True, text=True, env=env, timeout=1200)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(dst.read_text()), json.loads(r.stdout.strip().splitlines()[-1])


def _judge(cands: list[tuple[str, str, dict]], built: list[dict]) -> list[str]:
    bad = [f"{study}: {label}: {'; '.join(why)}" for (study, label, kw), b in zip(cands, built)
           if (why := mismatches(kw, b, platform="cuda", env={}))]
    for study in dict.fromkeys(s for s, *_ in cands):
        mine = [(kw, b, label) for (s, label, kw), b in zip(cands, built) if s == study]
        bad += [f"{study}: {line}" for line in collapsed(*zip(*mine))]
    return bad


@pytest.fixture(scope="module")
def candidates(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        return enumerate_gpu_space(tmp_path_factory.mktemp("gpu-space"), mp)


def test_vllm_0_32_builds_every_candidate_of_the_gpu_space_as_asked(candidates, tmp_path):
    built, where = _build([kw for *_, kw in candidates], tmp_path)
    assert where["platform"] == "FakeHopper" and where["vllm"].startswith("0.32.0"), where
    bad = _judge(candidates, built)
    assert not bad, f"{len(bad)} of {len(candidates)} candidates:\n" + "\n".join(bad[:30])
    # what the enumeration reached: every method, graph mode and verification knob, both runners
    spec = [b["spec"] for b in built if "spec" in b]
    assert {s["method"] for s in spec} == {"ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp", "dflash", "dspark"}
    assert {b["mode"] for b in built} == {"FULL_AND_PIECEWISE", "PIECEWISE", "NONE"}
    assert {s["rejection_sample_method"] for s in spec} == {"standard", "block"}
    assert {s["draft_sample_method"] for s in spec} == {"greedy", "probabilistic"}
    assert {s["adaptive"] for s in spec} == {False, True} and any(s["parallel_drafting"] for s in spec)
    assert {b["runner"] for b in built} == {"v1", "v2"} and {b["tp"] for b in built} == {1, 2}
    assert {b["kv_cache_dtype"] for b in built} == {"auto", "fp8"} and "fp8" in {b["quantization"] for b in built}
    assert len(candidates) >= 500
    print(f"\nvLLM {where['vllm']} (faked CUDA): {len(candidates)} distinct engine configs of the gpu space built, "
          f"0 refused, 0 changed; {len({s for s, *_ in candidates})} study contexts")


def test_what_the_space_leaves_out_vllm_would_refuse_or_change(tmp_path):
    """The check is not vacuous: candidates the space now leaves out, built the same way, are refused
    or changed (what 54ab4cd's space offered)."""
    base = {"model": str(demo.TARGET), "dtype": "bfloat16", "max_model_len": 1024}
    m = _placeholders(tmp_path / "models")
    dspark = {**base, "model": m["qwen3-target"], "speculative_config": {
        "method": "dspark", "model": m["dspark"], "num_speculative_tokens": 3, "enable_adaptive_verification": True}}
    planted = [
        ("adaptive under PIECEWISE", {**dspark, "compilation_config": {"cudagraph_mode": "PIECEWISE"}}, "refused"),
        ("adaptive under --enforce-eager", {**dspark, "enforce_eager": True}, "refused"),
        ("graph mode under --enforce-eager", {**base, "enforce_eager": True,
                                             "compilation_config": {"cudagraph_mode": "PIECEWISE"}}, "ran as NONE"),
        ("block on suffix (V1)", {**base, "speculative_config": {"method": "suffix", "num_speculative_tokens": 3,
                                                                 "rejection_sample_method": "block"}}, "Model Runner V1"),
        ("mtp k=3 over 2 layers", {**base, "model": m["mtp2-fp8"], "speculative_config": {
            "method": "mtp", "num_speculative_tokens": 3}}, "divisible by n_predict"),
    ]
    built, _ = _build([kw for _, kw, _ in planted], tmp_path)
    for (what, kw, why), b in zip(planted, built):
        said = "; ".join(mismatches(kw, b, platform="cuda", env={}))
        assert why in said, (what, said, b)


@pytest.mark.skipif(not VLLM_033.is_dir() and os.environ.get("CI") != "true",
                    reason="vLLM 0.33.0's source not fetched (scripts/setup.sh puts it in build/vllm-src)")
def test_vllm_0_33_builds_every_candidate_of_the_gpu_space_as_asked(candidates, tmp_path):
    assert VLLM_033.is_dir(), "scripts/setup.sh did not fetch vLLM 0.33.0's source (build/vllm-src/0.33.0)"
    built, where = _build([kw for *_, kw in candidates], tmp_path, VLLM_033)
    assert where["vllm"].startswith("0.33.0") and where["from"].startswith(str(VLLM_033)), where
    bad = _judge(candidates, built)
    assert not bad, f"{len(bad)} of {len(candidates)} candidates:\n" + "\n".join(bad[:30])
    print(f"\nvLLM {where['vllm']} config code ({where['from']}, faked CUDA): {len(candidates)} distinct engine "
          "configs of the gpu space built, 0 refused, 0 changed")
