"""Prompt lengths in the model's tokens and the up-front context check (the demo model's tokenizer)."""

import json

import pytest

from autotune import demo
from autotune.core.context import fit, fit_model, load_tokenizer, model_context, prompt_tokens, sequence_bound, too_long
from autotune.core.errors import BadInput
from autotune.core.workload import Request, Workload, load_workload

pytestmark = pytest.mark.skipif(not demo.available(), reason="the demo models are not trained")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(demo.TARGET))


def test_model_context_is_max_model_len_or_the_config_bound():
    assert model_context(str(demo.TARGET), 512) == 512
    assert model_context(str(demo.TARGET), None) == 1024  # max_position_embeddings of its config.json
    assert model_context("no/such-model-here", None) is None


def test_prompt_tokens_render_messages_as_the_engine_does(tok):
    chat = Request(id="c", messages=({"role": "user", "content": "hi"},))
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt_tokens(tok, chat) == len(tok(rendered)["input_ids"])
    assert prompt_tokens(tok, Request(id="t", turns=("hi", "more"))) == prompt_tokens(tok, chat)  # the first turn
    assert prompt_tokens(tok, Request(id="p", prompt="hello world")) == len(tok("hello world")["input_ids"])


def test_a_conversation_is_bounded_with_every_earlier_answer_at_max_tokens(tok):
    one = sequence_bound(tok, Request(id="a", turns=("hi",), max_tokens=10))
    two = sequence_bound(tok, Request(id="b", turns=("hi", "again"), max_tokens=10))
    assert one[1] == two[1] == 10 and two[0] > one[0] + 10


def test_too_long_requests_are_named_with_their_lengths_or_dropped(tok):
    long = Request(id="241", prompt="word " * 1200)
    wl = Workload(path="w.jsonl", requests=(Request(id="ok", prompt="hi", max_tokens=8), long))
    n = prompt_tokens(tok, long)
    assert n > 1024 and [b.id for b in too_long(tok, wl, 1024)] == ["241"]
    with pytest.raises(BadInput) as e:
        fit(wl, tok, 1024, drop=False, source="max_model_len")
    assert str(e.value) == (f"w.jsonl: 1 of 2 requests do not fit the model's context of 1024 tokens (max_model_len): "
                            f"'241' ({n} prompt + 128 max_tokens); shorten them, lower max_tokens, raise "
                            "--max-model-len, or pass --drop-too-long")
    kept, dropped = fit(wl, tok, 1024, drop=True, source="max_model_len")
    assert [r.id for r in kept.requests] == ["ok"] and [d.id for d in dropped] == ["241"]
    with pytest.raises(BadInput, match="none of its 1 requests fits"):
        fit(Workload(path="w.jsonl", requests=(long,)), tok, 1024, drop=True, source="max_model_len")
    # prompt + max_tokens counts: a prompt that fits alone may not leave room for its output
    edge = Request(id="edge", prompt="hi", max_tokens=1024)
    assert [b.id for b in too_long(tok, Workload(path="w", requests=(edge,)), 1024)] == ["edge"]


def test_fit_model_warns_where_the_tokenizer_cannot_be_loaded(tmp_path):
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps({"prompt": "hi"}) + "\n")
    wl = load_workload(p)
    f = fit_model(wl, model=str(tmp_path / "no-model"), max_model_len=64)
    assert f.workload is wl and f.warning.startswith("could not load the tokenizer of")
    assert fit_model(wl, model=str(tmp_path / "no-model"), max_model_len=None).warning.startswith(
        "the context length of")


def test_messages_without_a_chat_template_are_bad_input(tok):
    bare = load_tokenizer(str(demo.TARGET))
    bare.chat_template = None
    with pytest.raises(BadInput, match="request 'c': cannot render its chat messages with the model's chat template"):
        prompt_tokens(bare, Request(id="c", messages=({"role": "user", "content": "hi"},)))
