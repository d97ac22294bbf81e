import json

import pytest

from autotune.core.errors import BadInput
from autotune.core.workload import load_workload


def write(tmp_path, text, name="w.jsonl", mode="w"):
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def test_native_form_fields(tmp_path):
    p = write(tmp_path, json.dumps({"id": "a", "prompt": "hi", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9,
                                    "seed": 3, "stop": "\n", "arrival_s": 1.5, "expect": {"json": True}}) + "\n"
              + json.dumps({"messages": [{"role": "user", "content": "yo"}]}) + "\n")
    wl = load_workload(p)
    a, b = wl.requests
    assert a.sampling() == {"max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "ignore_eos": False,
                            "seed": 3, "stop": ["\n"]}
    assert a.arrival_s == 1.5 and a.expect == {"json": True} and not a.greedy
    assert b.id == "1" and b.messages == ({"role": "user", "content": "yo"},) and b.greedy and b.max_tokens == 128


def test_bom_and_crlf_are_valid(tmp_path):
    p = write(tmp_path, b'\xef\xbb\xbf{"prompt": "a"}\r\n{"prompt": "b"}\r\n')
    assert [r.prompt for r in load_workload(p).requests] == ["a", "b"]


@pytest.mark.parametrize("text, fragment", [
    ('{"prompt": "a"}\nnot json\n', ":2: not valid JSON"),
    ('{"max_tokens": 3}\n', ":1: expected exactly one of 'prompt'"),
    ('{"prompt": 5}\n', ":1: 'prompt' must be a non-empty string"),
    ('{"prompt": "a", "max_tokens": -1}\n', ":1: 'max_tokens' must be in [1, 1e+06], got -1"),
    ('{"prompt": "a", "max_tokens": 10000000}\n', ":1: 'max_tokens' must be in"),
    ('{"prompt": "a", "max_tokens": "10"}\n', ":1: 'max_tokens' must be an integer"),
    ('{"prompt": "a", "temperature": true}\n', ":1: 'temperature' must be a number"),
    ('{"prompt": "a", "colour": 1}\n', ":1: unknown field 'colour'"),
    ('{"prompt": "a"}\n[1, 2]\n', ":2: expected a JSON object, got list"),
    ('[1, 2]\n', "[0]: expected a JSON object, got int"),
    ('{"custom_id": "a", "body": 5}\n', ":1: 'body' must be an object"),
    ('{"conversations": [{"from": "gpt", "value": "hi"}]}\n', ":1: 'conversations' has no human turn"),
    ('{"conversations": [{"from": "alien", "value": "hi"}]}\n', ":1: 'conversations[0]' must have 'from'"),
    ('{"prompt": "' + "x" * (8 * 1024 * 1024 + 1) + '"}\n', ":1: line is 8388623 characters long; expected at most 8388608"),
    ('{"prompt": ' + "[" * 100000 + "]" * 100000 + '}\n', ":1: "),
    ('{"prompt": "a", "expect": {"xml": true}}\n', ":1: 'expect' must be an object"),
    ('{"prompt": "a", "expect": {"regex": "(a"}}\n',
     ":1: 'expect.regex' must be a valid regular expression (Python re), got '(a': missing ), unterminated subpattern"),
    ('{"prompt": "a", "expect": {"regex": 5}}\n', ":1: 'expect.regex' must be a string (a Python regular expression), got int 5"),
    ('{"prompt": "a", "expect": {"contains": ["x"]}}\n', ":1: 'expect.contains' must be a non-empty string, got list ['x']"),
    ('{"prompt": "a", "expect": {"contains": ""}}\n', ":1: 'expect.contains' must be a non-empty string, got str ''"),
    ('{"prompt": "a", "expect": {"json": "yes"}}\n', ":1: 'expect.json' must be true or false, got str 'yes'"),
    ('{"prompt": "a"}\n{"prompt": "b", "expect": {"json": 1}}\n', ":2: 'expect.json' must be true or false, got int 1"),
    ('{"messages": [{"role": "user"}]}\n', ":1: 'messages[0].content' must be a string"),
    ('{"prompt": "a", "id": "x"}\n{"prompt": "b", "id": "x"}\n', "request id 'x' appears more than once"),
    ('\n\n', ": no requests"),
    ('{"question_id": 1, "category": "math"}\n', ":1: 'turns' is missing"),
    ('{"question_id": 1, "turns": []}\n', ":1: 'turns' must be a non-empty list of strings"),
    ('{"question_id": 1, "turns": "hi"}\n', ":1: 'turns' must be a non-empty list of strings"),
    ('{"question_id": 1, "turns": ["hi", 5]}\n', ":1: 'turns[1]' must be a string, got int 5"),
    ('{"question_id": 1, "turns": ["hi", "  "]}\n', ":1: 'turns[1]' is empty"),
    ('{"question_id": 1, "turns": ["hi"], "category": 7}\n', ":1: 'category' must be a non-empty string"),
    ('{"question_id": 1, "turns": ["hi"], "colour": 1}\n', ":1: unknown field 'colour'"),
    ('{"prompt": "a", "turns": ["b"]}\n', ":1: expected exactly one of 'prompt' (string), 'messages' (chat list) or 'turns'"),
    ('{"id": "a", "turns": ["x", "y"]}\n{"id": "a#turn2", "prompt": "z"}\n', "request id 'a#turn2' appears more than once"),
])
def test_bad_input_names_file_and_line(tmp_path, text, fragment):
    p = write(tmp_path, text)
    with pytest.raises(BadInput) as e:
        load_workload(p)
    assert str(e.value).startswith(str(p)) and fragment in str(e.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        load_workload(tmp_path / "nope.jsonl")
    with pytest.raises(BadInput, match="is a directory"):
        load_workload(tmp_path)


def test_examples_load():
    for name in ("json_edit", "support_chat", "smoke"):
        wl = load_workload(f"examples/{name}.jsonl")
        assert len(wl.requests) >= (20 if name != "smoke" else 6)


def test_every_format_gives_the_same_requests():
    native = load_workload("tests/data/formats/native.jsonl")
    batch = load_workload("tests/data/formats/openai_batch.jsonl")
    share = load_workload("tests/data/formats/sharegpt.json", output_len=None)
    assert batch.requests == native.requests
    # ShareGPT carries no sampling settings: the same conversations, with the defaults.
    assert [(r.id, r.messages) for r in share.requests] == [(r.id, r.messages) for r in native.requests]
    assert load_workload("tests/data/formats/sharegpt.json", format="sharegpt").requests == share.requests


def test_vllm_bench_custom_takes_output_len():
    wl = load_workload("tests/data/formats/bench_custom.jsonl", format="vllm-bench", output_len=64)
    assert [r.max_tokens for r in wl.requests] == [64, 64] and wl.requests[0].prompt.startswith("### Edit")


def test_unknown_format_flag(tmp_path):
    with pytest.raises(BadInput, match="--format: expected one of auto, native"):
        load_workload("examples/smoke.jsonl", format="csv")


QUESTIONS = "tests/data/formats/questions.jsonl"  # Spec-Bench / MT-Bench form: question_id, category, turns


def test_question_files_send_the_first_turn_by_default():
    wl = load_workload(QUESTIONS)  # detected by question_id
    assert [r.id for r in wl.requests] == ["81", "82", "111", "112", "161", "162"]
    assert wl.categories == ["editing", "math", "rag"] and wl.requests[2].category == "math"
    first = wl.requests[0]
    assert first.turns is None and first.messages == ({"role": "user", "content": first.messages[0]["content"]},)
    assert first.messages[0]["content"].startswith("Edit the config")
    assert load_workload(QUESTIONS, format="questions").requests == wl.requests


def test_question_files_replay_all_turns_and_convert_keeps_them(tmp_path):
    wl = load_workload(QUESTIONS, turns="all")
    assert [len(r.turns) for r in wl.requests] == [2, 1, 2, 1, 1, 2]
    assert wl.requests[2].turns[1] == "And what is that number divided by 391?"  # MT-Bench's 'reference' is not sent
    out = write(tmp_path, "".join(json.dumps(r.to_json()) + "\n" for r in wl.requests), name="native.jsonl")
    assert load_workload(out).requests == wl.requests  # native 'turns' replay every turn
    assert [r.turns for r in load_workload(out, turns="first").requests] == [None] * 6
    with pytest.raises(BadInput, match="--turns: expected one of first, all, got 'two'"):
        load_workload(QUESTIONS, turns="two")


def test_category_is_kept_by_every_reader(tmp_path):
    native = write(tmp_path, json.dumps({"prompt": "a", "category": "code"}) + "\n", name="n.jsonl")
    batch = write(tmp_path, json.dumps({"custom_id": "x", "body": {"prompt": "a", "metadata": {"category": "rag"}}})
                  + "\n" + json.dumps({"custom_id": "y", "metadata": {"category": "math"}, "body": {"prompt": "b"}})
                  + "\n", name="b.jsonl")
    share = write(tmp_path, json.dumps([{"id": "s", "source": "sharegpt_gpt4",
                                         "conversations": [{"from": "human", "value": "hi"}]},
                                        {"id": "t", "category": "chat", "source": "x",
                                         "conversations": [{"from": "human", "value": "yo"}]},
                                        {"id": "u", "conversations": [{"from": "human", "value": "yo"}]}]),
                  name="s.json")
    assert [r.category for r in load_workload(native).requests] == ["code"]
    assert [r.category for r in load_workload(batch).requests] == ["rag", "math"]
    assert [r.category for r in load_workload(share).requests] == ["sharegpt_gpt4", "chat", None]


def test_turns_expand_to_one_job_request_per_turn():
    from autotune.core.workload import expand_turns

    reqs = [{"id": "q", "turns": ["a", "b"], "sampling": {}, "expect": {"contains": "x"}, "category": "c"},
            {"id": "p", "prompt": "z", "sampling": {}, "expect": {}}]
    assert [(r["id"], r["expect"], r.get("category"), "turns" in r) for r in expand_turns(reqs)] == [
        ("q", {}, "c", False), ("q#turn2", {"contains": "x"}, "c", False), ("p", {}, None, False)]


def test_valid_expectations_load_and_are_checked(tmp_path):
    from autotune.measure.validate import check_expect

    p = write(tmp_path, '{"prompt": "a", "expect": {"regex": "^\\\\d+$", "contains": "4", "json": false}}\n')
    expect = load_workload(p).requests[0].expect
    assert check_expect(expect, "42") == [] and check_expect(expect, "x") == ["regex", "contains"]
