"""The DFlash forecast (issue 51): a block drafter mirrored in torch (autotune.forecast.dflash_drafter)
drafts each block from the target's states up to its anchor and one token, so every decode step of a
request is replayed at once; a study traces its drafter at each depth the space searches (on CPU) and
forecasts dflash from it; what the mirror does not compute, or a GPU study, is said in one line.
The mirror against vLLM's own counters: tests/test_engine_dflash.py."""

from __future__ import annotations

import json
import types

import pytest

from autotune import demo
from autotune.core import attrs
from autotune.core.candidate import Settings
from autotune.forecast.forecast import AcceptanceTable
from autotune.forecast.predict import Eagle3Trace, eagle3_acceptance

torch = pytest.importorskip("torch")
SPACE = """name: dflash-only
baseline: {method: none, kv_cache_dtype: auto}
params:
  method: {choices: [none, {value: dflash, needs: dflash_drafter}]}
  num_speculative_tokens: {int: [2, 3], when: {method: [dflash]}}
  kv_cache_dtype: {choices: [auto]}
"""


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    """A random DFlash drafter at the demo target's shape, in the layout vLLM loads."""
    from autotune.demo.dflash import drafter_config
    from autotune.forecast.dflash_drafter import DFlashDrafter

    torch.manual_seed(3)
    cfg = drafter_config(json.loads((demo.TARGET / "config.json").read_text()), intermediate_size=64)
    d = DFlashDrafter(cfg, torch.randn(cfg["vocab_size"], cfg["hidden_size"]))
    for p in d.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.3)
    path = tmp_path_factory.mktemp("dflash") / "drafter"
    d.save(path)
    return path


def test_a_block_reads_only_the_context_up_to_its_anchor_and_every_anchor_at_once_is_each_alone(drafter):
    from autotune.forecast.dflash_drafter import block_drafts, load_drafter

    d = load_drafter(drafter, torch.randn(1042, 256))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, 1000, (40,), generator=g).tolist()
    aux = torch.randn(40, 3 * 256, generator=g)
    starts, k = [3, 10, 11, 25, 37], 4
    together = block_drafts(d, tokens, aux, starts, k)
    assert [block_drafts(d, tokens, aux, [a], k)[0] for a in starts] == together
    for a, block in zip(starts, together):  # what lies past token a + 1 changes nothing
        cut = a + 2
        later = tokens[:cut] + torch.randint(4, 1000, (40 - cut,), generator=g).tolist()
        other = torch.cat([aux[:cut], torch.randn(40 - cut, 768, generator=g)])
        assert block_drafts(d, later, other, [a], k)[0] == block
    # non-causal: a block's later mask slots shape its earlier ones (a chain's first drafts would not move)
    deeper = block_drafts(d, tokens, aux, starts, 6)
    assert any(b6[:k] != b for b6, b in zip(deeper, together))


def test_the_table_replays_dflash_at_the_traced_depths_only():
    outputs = [{"id": "r0", "prompt_token_ids": [1, 2], "token_ids": [10, 11, 12, 13, 14, 15]}]
    blocks = {"2": [[11, 12], [12, 0], [13, 14], [14, 15], [15, 9]], "3": [[11, 12, 13], [12, 13, 0], [13, 14, 15],
                                                                           [14, 15, 1], [15, 1, 1]]}
    table = AcceptanceTable(outputs, None, 1024, dflash={"r0": {"drafts": blocks, "beyond": []}})
    for k in (2, 3):
        got = table.get({"method": "dflash", "num_speculative_tokens": k})
        assert got == eagle3_acceptance([Eagle3Trace((1, 2), (10, 11, 12, 13, 14, 15),
                                                     tuple(tuple(b) for b in blocks[str(k)]))], k=k)
    assert table.get({"method": "dflash", "num_speculative_tokens": 4}) is None
    why = table.why_not("dflash", {"method": "dflash", "num_speculative_tokens": 4})
    assert why == "dflash: the drafter was traced at k=2, 3; other depths are measured"
    assert "not traced" in AcceptanceTable(outputs, None, 1024).why_not("dflash")


def _study(outputs):
    base = types.SimpleNamespace(number=0, datetime_start="t", state=None,
                                 user_attrs={attrs.OUTPUTS: outputs, attrs.ROLE: attrs.BASELINE})
    from optuna.trial import TrialState

    base.state = TrialState.COMPLETE
    study = types.SimpleNamespace(study_name="d", user_attrs={}, directions=[], get_trials=lambda deepcopy=False: [base])
    study.set_user_attr = study.user_attrs.__setitem__
    return study


def test_a_study_traces_its_dflash_drafter_at_each_depth_and_forecasts_it(drafter, tmp_path, monkeypatch):
    from autotune.core.space import load_space
    from autotune.run import hardware
    from autotune.study.head_trace import ensure_eagle3_trace
    from autotune.study.strategy import forecast_for
    from autotune.study.view import StudyView

    (tmp_path / "space.yaml").write_text(SPACE)
    settings = Settings(model=str(demo.TARGET), draft_model=str(drafter))
    space = load_space(str(tmp_path / "space.yaml"), platform="cpu", models=settings.available_models())
    outputs = [{"id": "a", "prompt_token_ids": [1, 40, 41, 42], "token_ids": [43, 44, 45, 46, 2]},
               {"id": "b", "prompt_token_ids": [1, 50, 51], "token_ids": [52, 53, 54]}]
    study = _study(outputs)
    cfg = types.SimpleNamespace(settings=settings, results_dir=tmp_path, trial_timeout_s=60)
    assert ensure_eagle3_trace(study, StudyView.of(study), space, cfg) is None
    got = study.user_attrs[attrs.DFLASH_TRACE]
    assert got["depths"] == [2, 3] and "failure" not in got, got
    assert {k: len(v) for k, v in got["traces"]["a"]["drafts"].items()} == {"2": 4, "3": 4}
    assert len(got["traces"]["a"]["beyond"]) == 3 and got["traces"]["b"]["beyond"] == []  # a ended in </s>
    f = forecast_for(StudyView.of(study), space, {"method": "dflash", "num_speculative_tokens": 3,
                                                  "kv_cache_dtype": "auto"}, 1024)
    assert f is not None and f.speedup is not None and "tokens/step replayed" in f.basis, f
    # on a GPU: measured, said in one line
    monkeypatch.setattr(hardware, "detect", lambda: "cuda")
    study = _study(outputs)
    line = ensure_eagle3_trace(study, StudyView.of(study), space, cfg)
    assert line == ("dflash forecast skipped: the DFlash trace runs on CPU only (yet); dflash is measured "
                    "without one")


def test_what_the_dflash_trace_cannot_follow_is_refused_in_one_line(drafter, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from autotune.forecast.eagle3_fit import dflash_why_not

    assert dflash_why_not(str(drafter), str(demo.TARGET), ram_bytes=2**40) is None
    own = tmp_path / "own"
    shutil.copytree(drafter, own)
    state = load_file(str(own / "model.safetensors"))
    save_file({**state, "lm_head.weight": torch.zeros(1042, 256, dtype=torch.float16)}, str(own / "model.safetensors"))
    spec = tmp_path / "spec"
    shutil.copytree(drafter, spec)
    (spec / "config.json").write_text(json.dumps({"speculators_model_type": "dflash", "speculators_config": {}}))
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    for d, t, words in ((own, demo.TARGET, "carries lm_head"), (spec, demo.TARGET, "not a DFlashDraftModel"),
                        (drafter, qwen, "loads Llama targets only"), ("z-lab/x-DFlash", demo.TARGET, "neither a local"),
                        (drafter, demo.TARGET, "RAM available: 0.0 GiB")):
        why = dflash_why_not(str(d), str(t), ram_bytes=1 if "RAM" in words else 2**40)
        assert why is not None and words in why and "\n" not in why, why
