"""The models' configs are on this machine before the search space is resolved (issue 59, defect 4).

A first run with hub ids not yet cached resolved the space from nothing: a pre-quantized target kept
the ``quantization`` knob (vLLM refuses fp8 on top of an fp8 checkpoint), MTP was not offered, a
P-EAGLE head was not detected. ``search`` now fetches each hub id's config.json and tokenizer files
(autotune.run.model_fetch.configs_first) before it reads them, so a first run resolves the space a
second run does. No network: the hub's client is FAKED, writing into a Hugging Face cache on disk
laid out as huggingface_hub lays it out; the platform is faked as CUDA (NVML faked) so that the gpu
space, where MTP and fp8 weights live, is the one resolved.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest

from autotune.cli.search import SearchOptions, models_ready, prepare
from autotune.run import gpu_memory, hardware, model_fetch
from test_gpu_memory import FakeNVML
from test_gpu_space_valid import _DEEPSEEK_MTP, _LLAMA

SHA = "0123456789abcdef0123456789abcdef01234567"
# What the fake hub holds: a DeepSeek-V3-style target with two MTP layers in fp8, and a P-EAGLE head.
REPOS = {
    "acme/mtp-fp8": {"config.json": {**_DEEPSEEK_MTP, "num_nextn_predict_layers": 2,
                                     "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}},
                     "model.safetensors": "x" * 5000},
    "acme/llama-peagle3": {"config.json": {**_LLAMA, "architectures": ["LlamaForCausalLMEagle3"], "pard_token": 3},
                         "model.safetensors": "x" * 1000},
}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A fake hub over an empty cache; returns the list of fetches asked (repo, patterns)."""
    import huggingface_hub
    import huggingface_hub.constants as hf

    cache = tmp_path / "hub"
    asked: list[tuple[str, tuple[str, ...]]] = []
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)  # transformers' own lookups stay off the network
    monkeypatch.setattr(model_fetch, "_offline", lambda: False)  # autotune's fetch goes to the (fake) hub

    class Api:
        def __init__(self, *args, **kwargs):  # vLLM's parser makes one too
            pass

        def snapshot_download(self, repo_id, **_):
            """vLLM's parser resolving the model (offline here): a folder with its config, in no cache."""
            seen = tmp_path / "vllm-parser" / repo_id
            seen.mkdir(parents=True, exist_ok=True)
            (seen / "config.json").write_text(json.dumps(REPOS[repo_id]["config.json"]))
            return str(seen)

        def list_repo_files(self, name, revision=None):
            return list(REPOS[name])

    def snapshot_download(name, revision=None, cache_dir=None, allow_patterns=None, **_):
        asked.append((name, tuple(allow_patterns or ())))
        root = Path(cache_dir or cache) / f"models--{name.replace('/', '--')}"  # as the hub's client lays it out
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / (revision or "main")).write_text(SHA)
        snap = root / "snapshots" / SHA
        snap.mkdir(parents=True, exist_ok=True)
        for file, body in REPOS[name].items():
            if any(fnmatch.fnmatch(file, p) for p in allow_patterns or ["*"]):
                (snap / file).write_text(body if isinstance(body, str) else json.dumps(body))
        return str(snap)

    # vLLM's parser asks its one shared HfApi (vllm.transformers_utils.repo_utils.hf_api), made by
    # whichever test came first in this process: it is the fake here, and the real one after
    from vllm.transformers_utils import repo_utils

    monkeypatch.setattr(repo_utils, "_hf_api", Api())
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(hardware, "detect", lambda: "cuda")
    monkeypatch.setattr(gpu_memory, "_nvml", lambda: FakeNVML((80, 79, [])))
    return asked


def _shape(space) -> tuple:
    return space.dropped, tuple((p.name, p.choices, p.int_range, tuple(sorted(p.when.items()))) for p in space.params)


def test_a_first_run_with_hub_ids_resolves_the_space_a_second_run_does(tmp_path, hub):
    o = SearchOptions(workload=Path("examples/smoke.jsonl"), model="acme/mtp-fp8", eagle3_head="acme/llama-peagle3",
                      max_model_len=1024, results=tmp_path / "results")
    first = prepare(o)
    # the configs came before the space: small files only (config.json, tokenizer), no weights yet
    assert [name for name, _ in hub] == ["acme/mtp-fp8", "acme/llama-peagle3"]
    assert all("*.safetensors" not in patterns for _, patterns in hub)
    names = {p.name for p in first.space.params}
    methods = next(p.choices for p in first.space.params if p.name == "method")
    assert "quantization" not in names  # the checkpoint is fp8 already: vLLM refuses fp8 on top of it
    assert "mtp" in methods and "eagle3" in methods
    assert next(p.choices for p in first.space.params if p.name == "parallel_drafting") == (False, True)
    mtp_depths = [p.int_range for p in first.space.params if p.name == "num_speculative_tokens"
                  and p.when.get("method") == ("mtp",)]
    assert mtp_depths == [(1, 2)]  # the model's two MTP layers
    assert any("already quantized (fp8" in n for n in first.notes)
    models_ready(o, first)  # the first run's weights
    assert hub[-2:] == [("acme/mtp-fp8", ("*.safetensors", *model_fetch.SMALL)),
                        ("acme/llama-peagle3", ("*.safetensors", *model_fetch.SMALL))]
    second = prepare(o)
    assert _shape(second.space) == _shape(first.space)
    assert [c.key() for c in second.space.grid()] == [c.key() for c in first.space.grid()]


def test_the_fake_engine_fetches_nothing(tmp_path, hub, monkeypatch):
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    prepare(SearchOptions(workload=Path("examples/smoke.jsonl"), model="fake-model", space="tests/data/fake_space.yaml",
                          results=tmp_path / "results"))
    assert hub == []


def test_a_first_run_into_a_download_dir_at_a_revision_reads_the_configs_fetched_there(tmp_path, hub):
    """vLLM's --download-dir and --revision: the configs are fetched there, and the space is read from
    there (the default cache's ``main`` holds nothing): the same space as from the default cache."""
    plain = prepare(SearchOptions(workload=Path("examples/smoke.jsonl"), model="acme/mtp-fp8",
                                  eagle3_head="acme/llama-peagle3", max_model_len=1024, results=tmp_path / "r0"))
    import shutil

    shutil.rmtree(tmp_path / "hub")  # nothing in the default cache now
    models = tmp_path / "models"
    o = SearchOptions(workload=Path("examples/smoke.jsonl"), model="acme/mtp-fp8", eagle3_head="acme/llama-peagle3",
                      max_model_len=1024, results=tmp_path / "r1",
                      serve_flags=("--download-dir", str(models), "--revision", "v2"))
    got = prepare(o)
    assert (models / "models--acme--mtp-fp8" / "refs" / "v2").is_file()
    assert not (tmp_path / "hub").exists()
    assert "quantization" not in {p.name for p in got.space.params}  # read from the download dir's fp8 config
    assert _shape(got.space) == _shape(plain.space)
    from autotune.core import snapshots

    assert snapshots.folder("acme/llama-peagle3") == models / "models--acme--llama-peagle3" / "snapshots" / SHA
