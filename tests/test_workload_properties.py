"""Property tests: any bytes or JSON fed to the loader give a valid workload or one clean BadInput."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.core.errors import BadInput
from autotune.measure.validate import check_expect
from autotune.core.workload import Workload, load_workload

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
fields = st.fixed_dictionaries({}, optional={
    "prompt": st.text(max_size=20) | json_values, "messages": json_values,
    "max_tokens": st.integers(-5, 2_000_000) | json_values, "temperature": st.floats() | json_values,
    "top_p": st.floats() | json_values, "seed": st.integers() | json_values, "stop": json_values,
    "id": json_values, "expect": json_values, "custom_id": st.text(max_size=5),
    "body": st.dictionaries(st.sampled_from(["messages", "prompt", "max_tokens", "temperature"]), json_values),
    "conversations": json_values, "category": st.text(max_size=5) | json_values, "question_id": json_values,
    "turns": st.lists(st.text(max_size=5) | json_values, max_size=3) | json_values, "reference": json_values})

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _load(tmp_path, data: bytes) -> None:
    p = tmp_path / "w.jsonl"
    p.write_bytes(data)
    try:
        wl = load_workload(p)
    except BadInput as e:
        msg = str(e)
        assert msg.startswith(str(p)) and "\n" not in msg
    else:
        assert isinstance(wl, Workload) and wl.requests
        assert all(r.max_tokens >= 1 and 0 <= r.temperature for r in wl.requests)


@SETTINGS
@given(data=st.binary(max_size=300))
def test_random_bytes(tmp_path, data):
    _load(tmp_path, data)


@SETTINGS
@given(lines=st.lists(json_values, min_size=1, max_size=4))
def test_random_json_lines(tmp_path, lines):
    _load(tmp_path, "\n".join(json.dumps(x) for x in lines).encode())


@SETTINGS
@given(lines=st.lists(fields, min_size=1, max_size=4))
def test_random_request_like_objects(tmp_path, lines):
    _load(tmp_path, "\n".join(json.dumps(x) for x in lines).encode())


# Expectations with the right keys and any values: refused at load, or checkable on any output.
expects = st.fixed_dictionaries({}, optional={"json": json_values, "regex": st.text(max_size=6) | json_values,
                                              "contains": st.text(max_size=4) | json_values})


@SETTINGS
@given(expect=expects)
def test_what_loads_is_checkable(tmp_path, expect):
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps({"prompt": "a", "expect": expect}) + "\n")
    try:
        wl = load_workload(p)
    except BadInput as e:
        assert str(e).startswith(f"{p}:1: 'expect") and "\n" not in str(e)
        return
    for text in ("", '{"a": 1}', "x" * 30):  # judging a candidate's output never raises
        check_expect(wl.requests[0].expect, text)
