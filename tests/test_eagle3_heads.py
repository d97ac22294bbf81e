"""The EAGLE-3 heads users have (issue 51): EAGLE-3's own layout, a head with its own lm_head over a
smaller draft vocabulary and d2t/t2d maps (pytorch_model.bin, yuhuili's), the speculators format
(RedHatAI's, with Llama 3.1's llama3 RoPE scaling), and a hub id read from the local Hugging Face
cache, each written here at the demo target's shape (tests/eagle3_heads.py): each is traced and
forecast; a converted head drafts what the bundled head drafts; the config, the RoPE and the
vocabulary map are vLLM's own (its config loader and rotary embedding, on CPU); on a GPU the trace is
a worker job on the worker's device in the served dtype (the job run here on CPU)."""

from __future__ import annotations

import json

import pytest

from autotune import demo
from autotune.core import attrs
from autotune.forecast import eagle3_fit
from autotune.forecast.forecast import AcceptanceTable

torch = pytest.importorskip("torch")
import eagle3_heads  # noqa: E402 - tests/ is on the path

pytestmark = pytest.mark.skipif(not demo.eagle3_available(), reason="no shipped head")
DEPTH = 3


def _pairs(n: int = 3, seed: int = 7) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(4, 1000, (12 + 5 * i,), generator=g).tolist(),
             torch.randint(4, 1000, (20 + 3 * i,), generator=g).tolist() + [2]) for i in range(n)]


def _outputs(pairs):
    return [{"id": f"r{i}", "prompt_token_ids": p, "token_ids": o} for i, (p, o) in enumerate(pairs)]


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """Random heads in every layout, and a hub id for the speculators one in a cache of its own."""
    root = tmp_path_factory.mktemp("heads")
    keep = list(range(0, 1042, 2)) + [2]  # a draft vocabulary of about half the target's
    tensors = eagle3_heads.random_tensors(1)
    out = {"eagle3": eagle3_heads.write(root / "eagle3", "eagle3", tensors),
           "d2t": eagle3_heads.write(root / "d2t", "d2t", tensors, keep=sorted(set(keep))),
           "speculators": eagle3_heads.write(root / "spec", "speculators", tensors, keep=sorted(set(keep)),
                                             rope_scaling=eagle3_heads.LLAMA31_ROPE)}
    eagle3_heads.hub_cache(root / "cache", "someone/llama-eagle3-speculator", out["speculators"])
    eagle3_heads.hub_cache(root / "cache", "someone/demo-target", demo.TARGET)
    return out, root / "cache"


@pytest.mark.parametrize("layout", ["eagle3", "d2t", "speculators", "hub"])
def test_a_head_in_each_layout_is_traced_and_forecast(heads, layout, monkeypatch):
    from huggingface_hub import constants as hf_constants

    from autotune.forecast.eagle3_trace import trace

    paths, cache = heads
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    head = "someone/llama-eagle3-speculator" if layout == "hub" else str(paths[layout])
    target = "someone/demo-target" if layout == "hub" else str(demo.TARGET)  # head and target from the cache
    assert eagle3_fit.why_not(head, target, ram_bytes=2**40) is None
    pairs = _pairs()
    chains = trace(pairs, depth=DEPTH, head_dir=head, target_dir=target, threads=2)
    assert [len(c["drafts"]) for c in chains] == [len(o) - 1 for _, o in pairs]
    assert all(len(d) == DEPTH for c in chains for d in c["drafts"])
    if layout in ("d2t", "speculators", "hub"):  # drafts in the target's ids, from the draft vocabulary only
        assert {t for c in chains for d in c["drafts"] for t in d} <= set(range(0, 1042, 2)) | {2}
    outputs = _outputs(pairs)
    table = AcceptanceTable(outputs, None, 1024, eagle3={o["id"]: c for o, c in zip(outputs, chains)})
    got = table.get({"method": "eagle3", "num_speculative_tokens": DEPTH})
    assert got is not None and got.drafts > 0


def _bundled_drafts(pairs):
    from autotune.forecast.eagle3_trace import trace

    return trace(pairs, depth=DEPTH, threads=2)


@pytest.mark.parametrize("layout", ["d2t", "speculators"])
def test_a_converted_head_drafts_what_the_bundled_head_drafts(tmp_path, layout):
    """The bundled head's weights in another layout, with a draft vocabulary holding every token the
    bundled head drafts here (and only every other one of the rest): the same chains, token for
    token. Fails where a layout's names, its norms' order or the d2t map were read otherwise."""
    from autotune.forecast.eagle3_trace import trace

    pairs = _pairs(4, seed=11)
    want = _bundled_drafts(pairs)
    used = {t for c in want for d in c["drafts"] for t in d}
    keep = sorted(used | set(range(1, 1042, 2)))
    head = eagle3_heads.write(tmp_path / layout, layout, eagle3_heads.bundled_tensors(), keep=keep,
                              norm_before_residual=False)
    assert eagle3_fit.why_not(str(head), str(demo.TARGET), ram_bytes=2**40) is None
    assert trace(pairs, depth=DEPTH, head_dir=head, threads=2) == want
    # the speculators format's own default (norm before the residual) is another head: other drafts
    if layout == "speculators":
        spec = json.loads((head / "config.json").read_text())
        del spec["norm_before_residual"]
        (head / "config.json").write_text(json.dumps(spec))
        assert trace(pairs, depth=DEPTH, head_dir=head, threads=2) != want


def test_the_layouts_read_as_vllms_config_loader_reads_them(heads):
    """vLLM's own ``get_config`` (the SpeculatorsConfig path for the speculators format) gives the
    layer config, flags and RoPE the trace builds its head from."""
    from vllm.transformers_utils.config import get_config

    from autotune.forecast.eagle3_format import read_head

    for layout in ("eagle3", "d2t", "speculators"):
        path = heads[0][layout]
        fmt = read_head(path)
        hf = get_config(str(path), trust_remote_code=False)
        assert fmt.draft_vocab == (getattr(hf, "draft_vocab_size", None) or hf.vocab_size), layout
        assert fmt.norm_before_residual == bool(getattr(hf, "norm_before_residual", False)), layout
        assert fmt.rope == hf.rope_parameters, layout
        assert list(fmt.aux_layers or ()) == list(getattr(hf, "eagle_aux_hidden_state_layer_ids", None) or ()), layout
        for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "rms_norm_eps"):
            assert fmt.cfg[k] == getattr(hf, k), (layout, k)
    assert heads[0]["speculators"] and read_head(heads[0]["speculators"]).rope["rope_type"] == "llama3"


@pytest.mark.parametrize("rope_parameters", [{"rope_type": "default", "rope_theta": 10000.0},
                                             {**eagle3_heads.LLAMA31_ROPE, "rope_theta": 500000.0}])
def test_the_heads_rope_is_vllms(rope_parameters):
    """Llama 3.1's llama3 scaling (and plain RoPE) as vLLM's get_rope applies it, on CPU."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from autotune.forecast.eagle3_head import inv_freq, rope

    heads_, dim, t = 4, 64, 300
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(t, heads_ * dim, generator=g), torch.randn(t, heads_ * dim, generator=g)
    pos = torch.arange(t) * 37  # far positions, where llama3's low-frequency scaling shows
    with set_current_vllm_config(VllmConfig()):
        ref = get_rope(dim, 131072, True, dict(rope_parameters), torch.float32)
        rq, rk = ref.forward_native(pos, q.clone(), k.clone())
    freqs = inv_freq(rope_parameters, dim)
    for x, want in ((q, rq), (k, rk)):
        got = rope(x.view(t, heads_, dim).transpose(0, 1), pos, freqs).transpose(0, 1).reshape(t, -1)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    if rope_parameters["rope_type"] == "llama3":  # plain RoPE is another embedding there
        plain = rope(q.view(t, heads_, dim).transpose(0, 1), pos, inv_freq({"rope_theta": 500000.0}, dim))
        assert not torch.allclose(plain.transpose(0, 1).reshape(t, -1), rq, atol=1e-3)


def test_on_a_gpu_the_trace_is_a_worker_job_on_the_workers_device(heads, monkeypatch, tmp_path):
    """Where vLLM runs on CUDA (faked: the platform, NVML's 80 GiB and the worker), the study sends
    the trace to a worker with the worker's devices, in the dtype vLLM serves the target in; the job
    itself, run here on CPU, traces what the in-process trace does."""
    import types

    from optuna.trial import TrialState

    from autotune.core.candidate import Settings
    from autotune.core.space import load_space
    from autotune.forecast import eagle3_trace
    from autotune.run import gpu_memory, hardware, worker
    from autotune.study import head_trace
    from autotune.study.view import StudyView

    pairs = _pairs(2)
    outputs = _outputs(pairs)
    base = types.SimpleNamespace(number=0, datetime_start="t", state=TrialState.COMPLETE,
                                 user_attrs={attrs.OUTPUTS: outputs, attrs.ROLE: attrs.BASELINE})
    study = types.SimpleNamespace(study_name="g", user_attrs={}, directions=[], get_trials=lambda deepcopy=False: [base])
    study.set_user_attr = study.user_attrs.__setitem__
    monkeypatch.setattr(hardware, "detect", lambda: "cuda")
    monkeypatch.setattr(gpu_memory, "read", lambda ids, count=1: [gpu_memory.Device(ids[0], 80 * 2**30, 79 * 2**30, ())])
    sent = {}

    def run_trial(job, workdir, *, timeout_s, env=None, **_):
        sent.update(job=job, env=env, workdir=workdir)
        spec = job["eagle3_trace"]
        local = {**job, "eagle3_trace": {**spec, "device": "cpu", "dtype": "float32"}}  # no GPU here
        return types.SimpleNamespace(raw=eagle3_trace.run_job(local, lambda *a: None), failure=None)

    monkeypatch.setattr(worker, "run_trial", run_trial)
    space = load_space("quick", platform="cuda", models={"eagle3_head"})
    head = str(heads[0]["speculators"])
    cfg = types.SimpleNamespace(settings=Settings(model=str(demo.TARGET), eagle3_head=head), results_dir=tmp_path,
                                trial_timeout_s=60)
    line = head_trace.ensure_eagle3_trace(study, StudyView.of(study), space, cfg, env={"CUDA_VISIBLE_DEVICES": "3"})
    assert line is None, line
    spec = sent["job"]["eagle3_trace"]
    assert sent["env"] == {"CUDA_VISIBLE_DEVICES": "3"} and sent["job"]["engine_module"] == eagle3_trace.__name__
    assert (spec["device"], spec["dtype"], spec["head"]) == ("cuda", "bfloat16", head)  # the demo's float32 served in bf16
    kept = study.user_attrs[attrs.EAGLE3_TRACE]
    assert kept["device"] == "cuda"
    assert [kept["traces"][o["id"]] for o in outputs] == eagle3_trace.trace(pairs, depth=spec["depth"], head_dir=head)


def test_the_target_is_built_on_its_device_shard_by_shard_as_transformers_loads_it():
    """The GPU trace's loader (no accelerate, no whole copy in host RAM), run on CPU: transformers' model."""
    from autotune.forecast.eagle3_trace import load_on, load_target

    ids = torch.tensor([[1, 40, 41, 42, 43]])
    want = load_target(demo.TARGET, dtype=torch.bfloat16)(input_ids=ids).logits
    got = load_on(demo.TARGET, dtype=torch.bfloat16, device="cpu")(input_ids=ids).logits
    assert torch.equal(got, want)
