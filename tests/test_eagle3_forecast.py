"""EAGLE-3 forecast: the head's chained drafts (what vLLM drafts) and their replay into vLLM's counters."""

import json

import pytest

from autotune.forecast.forecast import AcceptanceTable
from autotune.forecast.predict import Eagle3Trace, eagle3_acceptance, eagle3_traces

torch = pytest.importorskip("torch")


def _random_head(seed: int = 0):
    from autotune.demo.eagle3 import head_config
    from autotune.forecast.eagle3_trace import Eagle3Head

    torch.manual_seed(seed)
    cfg = head_config({"hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
                       "rms_norm_eps": 1e-5, "vocab_size": 50, "max_position_embeddings": 256,
                       "rope_parameters": {"rope_theta": 10000.0}}, intermediate_size=48)
    head = Eagle3Head(cfg, torch.randn(50, 32))
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return head.eval()


def test_training_unroll_matches_the_chained_drafts_vllm_makes():
    """Step j of the training unroll at position a + j - 1, fed the chain's own earlier drafts as the
    tokens, is the chain's j-th draft: the training graph is vLLM's drafting, position by position."""
    from autotune.forecast.eagle3_trace import chained_drafts

    head = _random_head()
    t, depth = 24, 4
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 50, (t,), generator=g).tolist()
    aux = torch.randn(t, 3 * 32, generator=g)
    for a in (3, 10, 17):
        seen: list = []
        chain = chained_drafts(head, tokens, aux, [a], depth, logits=seen)[0]
        fed = list(tokens)
        fed[a + 2:a + 1 + depth] = chain[:depth - 1]  # an accepted chain: the sequence is the drafts
        with torch.no_grad():
            steps = head.unroll(torch.tensor([fed]), aux[None], depth)
        assert [int(steps[j][0, a + j].argmax()) for j in range(depth)] == chain
        for j in range(depth):  # the same numbers, not only the same choices
            torch.testing.assert_close(steps[j][0, a + j], seen[0][j], rtol=1e-4, atol=1e-4)
        # And the anchor's own tokens are all it reads: the same chain from the fed sequence.
        assert chained_drafts(head, fed, aux, [a], depth)[0] == chain


def test_every_anchors_chain_at_once_is_each_chain_alone():
    """Chains advanced together (one step for all anchors at a time) are the chains drafted one
    anchor at a time: no anchor reads another's keys, or a position past its own."""
    from autotune.forecast.eagle3_trace import chained_drafts

    head = _random_head(4)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 50, (40,), generator=g).tolist()
    aux = torch.randn(40, 96, generator=g)
    starts, depth = [0, 5, 6, 20, 37, 2], 5
    together: list = []
    chains = chained_drafts(head, tokens, aux, starts, depth, logits=together)
    for a, chain, seen in zip(starts, chains, together):
        alone: list = []
        assert chained_drafts(head, tokens, aux, [a], depth, logits=alone)[0] == chain
        for j in range(depth):
            torch.testing.assert_close(seen[j], alone[0][j], rtol=1e-5, atol=1e-5)
    assert chained_drafts(head, tokens, aux, [], depth) == []


def test_chained_drafts_differ_from_teacher_forcing():
    """The second draft reads the head's own state, not the target's: a replay that teacher-forced
    every position would be another (wrong) proposer."""
    from autotune.forecast.eagle3_trace import chained_drafts

    head = _random_head(2)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 50, (40,), generator=g).tolist()
    aux = torch.randn(40, 96, generator=g)
    chains = chained_drafts(head, tokens, aux, list(range(0, 38)), 2)
    firsts = [c[0] for c in chains]
    assert any(chains[a][1] != firsts[a + 1] for a in range(37))


def test_eagle3_acceptance_walks_steps_like_the_engine():
    # Output o0..o5; the chain after o[:i+1] drafts for o[i+1]...
    out = (10, 11, 12, 13, 14, 15)
    drafts = ((11, 12, 99), (12, 13, 14), (13, 0, 0), (14, 15, 7), (15, 1, 1))
    t = Eagle3Trace((1, 2), out, drafts)
    a = eagle3_acceptance([t], k=3)
    # pos 1: drafts[0] = (11, 12, 99) -> 2 accepted, advance 3 -> pos 4: drafts[3] = (14, 15, 7) ->
    # o4, o5 accepted, and the output ends there.
    assert (a.drafts, a.draft_tokens, a.accepted, a.per_pos, a.steps) == (2, 6, 4, (2, 2, 0), 2)
    assert a.mean_accepted_length == 3.0
    assert eagle3_acceptance([t], k=1).accepted == 3  # every first draft is right: 1 + the bonus a step
    # Traced less deep than asked: the missing tokens are drafted, never accepted.
    short = Eagle3Trace((1, 2), out, tuple(d[:1] for d in drafts))
    assert eagle3_acceptance([short], k=3).accepted == eagle3_acceptance([short], k=1).accepted



def test_drafts_past_an_accepted_end_count_as_vllm_counts_them():
    """vLLM checks a draft past an accepted end-of-sequence against the target's next choice and
    counts it before cutting the output at the end: the trace says what the target would say there."""
    out = (10, 11, 2)  # ends in end-of-sequence (2)
    drafts = ((11, 2, 7), (2, 7, 8))
    plain = eagle3_acceptance([Eagle3Trace((1,), out, drafts)], k=3)
    past = eagle3_acceptance([Eagle3Trace((1,), out, drafts, beyond=(7, 5, 5))], k=3)
    assert (plain.accepted, plain.per_pos) == (2, (1, 1, 0))
    assert (past.accepted, past.per_pos) == (3, (1, 1, 1))  # 7 after the end: the target's choice too
    assert past.steps == plain.steps == 1 and past.tokens == plain.tokens == 3


def test_acceptance_table_replays_eagle3_from_its_trace():
    outputs = [{"id": "r0", "prompt_token_ids": [1, 2], "token_ids": [10, 11, 12, 13, 14, 15]}]
    chains = {"r0": {"drafts": [[11, 12, 99], [12, 13, 14], [13, 0, 0], [14, 15, 7], [15, 1, 1]], "beyond": []}}
    table = AcceptanceTable(outputs, None, 1024, eagle3=chains)
    got = table.get({"method": "eagle3", "num_speculative_tokens": 3})
    assert got is not None and got.mean_accepted_length == 3.0
    assert got == eagle3_acceptance(eagle3_traces(outputs, chains), k=3)
    assert table.get({"method": "eagle3", "num_speculative_tokens": 4}) is None  # traced 3 deep only
    assert AcceptanceTable(outputs, None, 1024).get({"method": "eagle3", "num_speculative_tokens": 2}) is None
    assert "eagle3" in AcceptanceTable(outputs, None, 1024).why_not("eagle3")


def test_shipped_head_is_an_eagle3_checkpoint_vllm_reads():
    from autotune.demo.eagle3 import HEAD

    if not (HEAD / "model.safetensors").is_file():
        pytest.skip("no shipped head")
    from safetensors import safe_open

    cfg = json.loads((HEAD / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == cfg["vocab_size"]  # no d2t / t2d maps
    with safe_open(str(HEAD / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        fc = f.get_tensor("fc.weight")
    assert "midlayer.hidden_norm.weight" in names and not any("embed_tokens" in n or "lm_head" in n for n in names)
    assert fc.shape == (cfg["hidden_size"], len(cfg["eagle_aux_hidden_state_layer_ids"]) * cfg["target_hidden_size"])
    assert (HEAD / "model.safetensors").stat().st_size < 8_000_000


@pytest.mark.parametrize("name", ["cpu", "quick"])
def test_cpu_and_quick_spaces_search_eagle3_with_a_head(name):
    from autotune.core.candidate import Settings
    from autotune.core.space import load_space
    from autotune.study.strategy import needs_trace

    s = load_space(name, platform="cpu", models={"draft_model", "eagle3_head"})
    assert "eagle3" in next(p for p in s.params if p.name == "method").choices
    grid = [c for c in s.grid() if c.method == "eagle3"]
    assert grid and all("num_speculative_tokens" in c.params and "prompt_lookup_max" not in c.params for c in grid)
    kw = grid[0].engine_kwargs(Settings(model="/m/t", eagle3_head="/m/h"))
    assert kw["speculative_config"]["method"] == "eagle3" and kw["speculative_config"]["model"] == "/m/h"
    # No head: left out, and the search says what would bring it in.
    s = load_space(name, platform="cpu", models={"draft_model"})
    assert "eagle3" not in next(p for p in s.params if p.name == "method").choices
    assert "method=eagle3 (needs --eagle3-head)" in s.dropped
    # A study over the space with a head traces it (and without a draft model, only it).
    with_head = load_space(name, platform="cpu", models={"eagle3_head"})
    assert needs_trace(with_head, Settings(model="/m/t", eagle3_head="/m/h"))
    assert not needs_trace(with_head, Settings(model="/m/t"))


def test_the_demo_search_offers_the_shipped_head():
    from autotune import demo
    from autotune.cli.search import SearchOptions, _settings

    if not demo.eagle3_available():
        pytest.skip("no shipped head")
    s = _settings(SearchOptions(workload="examples/smoke.jsonl"), "cpu")
    assert s.eagle3_head == str(demo.EAGLE3) and "eagle3_head" in s.available_models()
    assert _settings(SearchOptions(workload="x", model="/m/t"), "cpu").eagle3_head is None  # a user's model: theirs to give


def test_a_study_traces_the_head_once_and_its_forecast_reads_it():
    """strategy.trace_eagle3 on a stand-in study: the head's trace over the baseline's outputs is
    kept in the study as deep as the space searches, and eagle3 then has a replayed forecast."""
    import types

    from autotune import demo

    from autotune.core import attrs
    from autotune.core.candidate import Settings
    from autotune.core.space import load_space
    from autotune.study.strategy import trace_draft
    from optuna.trial import TrialState

    from autotune.study.view import StudyView

    if not demo.eagle3_available():
        pytest.skip("no shipped head")
    outputs = [{"id": "a", "prompt_token_ids": [1, 40, 41, 42], "token_ids": [43, 44, 45, 46, 2]},
               {"id": "b", "prompt_token_ids": [1, 50, 51], "token_ids": [52, 53, 54]}]

    base = types.SimpleNamespace(number=0, datetime_start="t", state=TrialState.COMPLETE,
                                 user_attrs={attrs.OUTPUTS: outputs, attrs.ROLE: attrs.BASELINE})

    class Study:  # a study of the baseline alone, as the trace reads and keeps it
        study_name, user_attrs, directions = "s", {}, []

        def get_trials(self, deepcopy=False):
            return [base]

        def set_user_attr(self, k, v):
            self.user_attrs[k] = v

    study = Study()
    space = load_space("quick", platform="cpu", models={"eagle3_head"})
    cfg = types.SimpleNamespace(settings=Settings(model=str(demo.TARGET), eagle3_head=str(demo.EAGLE3)))
    # no draft model: only the head is traced
    assert trace_draft(study, StudyView.of(study), space, cfg, {}, None) is None
    got = study.user_attrs[attrs.EAGLE3_TRACE]
    top = max(int(v) for p in space.params if p.name == "num_speculative_tokens" for v in p.values())
    assert top == 8  # the quick space's top depth: the chains are traced that deep
    assert "failure" not in got and got["depth"] == top and attrs.DRAFT_TRACE not in study.user_attrs
    assert [len(got["traces"][i]["drafts"]) for i in "ab"] == [4, 2]
    assert len(got["traces"]["a"]["beyond"]) == top and got["traces"]["b"]["beyond"] == []  # a ended in </s>
    table = AcceptanceTable(outputs, None, 1024, eagle3=got["traces"])
    assert table.get({"method": "eagle3", "num_speculative_tokens": 5}).drafts >= 1
