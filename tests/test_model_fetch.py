"""Trial clocks for GPU scale (issue 51): the study's models are on this machine before any clock
starts (autotune.run.model_fetch), said in one line with their size; without --trial-timeout the
baseline's limit is sized from them; a timed-out baseline names --trial-timeout and the time it had.
No network: local folders, a Hugging Face cache laid out on disk, and the hub's client faked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import demo
from autotune.cli.app import app
from autotune.core.candidate import Settings
from autotune.core.errors import BadInput
from autotune.run import model_fetch

SHA = "0123456789abcdef0123456789abcdef01234567"


def _cache(hub: Path, repo: str, files: dict[str, bytes]) -> None:
    root = hub / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(SHA)
    for name, data in files.items():
        (root / "snapshots" / SHA / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "snapshots" / SHA / name).write_bytes(data)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf

    hub = tmp_path / "hub"
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(hub))
    return hub


def test_a_local_folder_and_a_cached_hub_id_are_ready_with_their_size_offline(offline_hub):
    _cache(offline_hub, "acme/tiny", {"config.json": b"{}", "model-00001.safetensors": b"x" * 3000,
                                      "model-00002.safetensors": b"x" * 2000})
    ready = model_fetch.fetch(Settings(model="acme/tiny", draft_model=str(demo.DRAFT)))
    assert [(r.role, r.source, r.weight_bytes) for r in ready] == [
        ("target", "HF cache", 5000), ("draft", "local folder", (demo.DRAFT / "model.safetensors").stat().st_size)]
    line = model_fetch.ready_line(ready, 700, "cuda")
    assert line.startswith("models ready before any clock starts: target acme/tiny 0.00 GB (HF cache); draft ")
    assert line.endswith("the baseline's time limit 700 s, sized from "
                         f"{model_fetch.weight_bytes(ready) / 1e9:.2f} GB on cuda (--trial-timeout sets it)")
    with pytest.raises(BadInput, match="^target acme/other: not in the local Hugging Face cache, and HF_HUB_OFFLINE"):
        model_fetch.fetch(Settings(model="acme/other"))


@pytest.mark.parametrize("files, index, want", [
    (["config.json", INDEX := "model.safetensors.index.json", "a.safetensors", "b.safetensors",
      "original/consolidated.pth"], {"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}},
     ["a.safetensors", "b.safetensors", "model.safetensors.index.json"]),
    (["config.json", "model.safetensors", "pytorch_model.bin"], None, ["*.safetensors"]),
    (["config.json", "pytorch_model.bin"], None, ["*.bin"]),
    (["params.json", "consolidated.safetensors", "model.safetensors"], None,
     ["consolidated*.safetensors", "consolidated.safetensors.index.json"]),
])
def test_the_weights_fetched_are_the_ones_vllms_default_loader_reads(files, index, want):
    assert model_fetch.weight_patterns(files, (lambda: json.dumps(index)) if index else None) == want


def test_a_hub_id_is_fetched_with_those_patterns_into_the_cache_vllm_reads(tmp_path, monkeypatch):
    import huggingface_hub
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", False)
    asked = {}
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "model.safetensors").write_bytes(b"x" * 4096)

    class Api:
        def list_repo_files(self, name, revision=None):
            return ["config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json"]

    def snapshot_download(name, revision=None, cache_dir=None, allow_patterns=None, **kw):
        asked.update(name=name, revision=revision, cache_dir=cache_dir, allow_patterns=allow_patterns, **kw)
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    (r,) = model_fetch.fetch(Settings(model="acme/big"), {"revision": "v2", "download_dir": "/data/hf"})
    assert asked == {"name": "acme/big", "revision": "v2", "cache_dir": "/data/hf",
                     "allow_patterns": ["*.safetensors", *model_fetch.SMALL]}  # not the .bin copy
    assert (r.path, r.weight_bytes) == (str(snap), 4096) and r.source.startswith("ready in 0m0")


def test_the_baselines_limit_grows_with_the_weights_platform_and_ranks():
    assert model_fetch.baseline_timeout(0, "cpu") == 600  # the limit before: the demo's runs
    assert model_fetch.baseline_timeout(16e9, "cuda") == 1080  # an 8B bf16 target
    assert model_fetch.baseline_timeout(16e9, "cuda", tensor_parallel=2) == 1320
    assert model_fetch.baseline_timeout(1e9, "cpu") == 720


def test_search_says_the_models_are_ready_and_sizes_the_baselines_limit(tmp_path):
    from autotune.cli.search import SearchOptions, models_ready, prepare

    o = SearchOptions(workload=Path("examples/smoke.jsonl"), space="tests/data/fake_space.yaml", results=tmp_path)
    p = models_ready(o, prepare(o))
    weights = sum((m / "model.safetensors").stat().st_size for m in (demo.TARGET, demo.DRAFT))
    weights += (demo.EAGLE3 / "model.safetensors").stat().st_size if demo.eagle3_available() else 0
    want = model_fetch.baseline_timeout(weights, p.platform)
    assert p.cfg.trial_timeout_s == want and p.cfg.timeout_from_baseline
    (line,) = [n for n in p.notes if n.startswith("models ready before any clock starts: target ")]
    assert f"the baseline's time limit {want:.0f} s" in line
    o = SearchOptions(workload=Path("examples/smoke.jsonl"), space="tests/data/fake_space.yaml", results=tmp_path,
                      trial_timeout=42.0)
    given = models_ready(o, prepare(o))
    assert given.cfg.trial_timeout_s == 42.0 and not given.cfg.timeout_from_baseline


def test_a_timed_out_baseline_names_trial_timeout_and_the_time_it_had(tmp_path, monkeypatch, fake_engine_env):
    monkeypatch.setattr("autotune.cli.search.ENGINE", "fake_engine")
    space = tmp_path / "hang.yaml"
    space.write_text("name: hang\nbaseline: {method: none, quantization: hang}\n"
                     "params:\n  method: {choices: [none]}\n  quantization: {choices: [hang]}\n")
    r = CliRunner().invoke(app, ["search", "examples/smoke.jsonl", "--model", "fake-model", "--space", str(space),
                                 "--results", str(tmp_path / "res"), "--trials", "1", "--samples", "0",
                                 "--repeats", "1", "--max-repeats", "0", "--no-remeasure", "--no-launcher",
                                 "--trial-timeout", "3"])
    assert r.exit_code != 0
    assert "timeout: no result after 3s (worker ended); the baseline had 3 s (set by --trial-timeout): give it " \
           "more with --trial-timeout SECONDS" in " ".join(r.output.split()), r.output
