import pytest

from autotune.core.errors import BadInput
from autotune.measure.slo import SLO, goodput, parse_slos


def test_parse_forms():
    assert parse_slos("ttft_ms_p95<=500,tpot_p50<=40ms, e2e_p99<=2s,output_tok_s>=100") == (
        SLO("ttft_ms_p95", "<=", 500), SLO("tpot_ms_p50", "<=", 40), SLO("e2e_ms_p99", "<=", 2000),
        SLO("output_tok_s", ">=", 100))
    assert parse_slos(None) == ()


@pytest.mark.parametrize("text, fragment", [
    ("ttft<500", "expected METRIC<=VALUE"), ("speed_p50<=3", "unknown metric 'speed_p50'"),
    ("ttft_ms_p95<=-5", "cannot be met"), ("ttft_ms_p95>=100", "cannot be met"), ("output_tok_s<=5", "cannot be met"),
    ("ttft_ms_p95<=0", "cannot be met"),
])
def test_bad_or_impossible_slos(text, fragment):
    with pytest.raises(BadInput, match="--slo") as e:
        parse_slos(text)
    assert fragment in str(e.value)


def test_violation_sign_and_goodput():
    s = SLO("ttft_ms_p95", "<=", 100)
    assert s.violation(50) < 0 < s.violation(150)
    assert SLO("output_tok_s", ">=", 10).violation(20) < 0
    ok = {"start": 0.0, "chunks": [[0.05, 1], [0.15, 4]], "finish_reason": "stop", "error": None}
    slow = {"start": 0.0, "chunks": [[0.2, 1], [0.3, 4]], "finish_reason": "stop", "error": None}
    cut = {"start": 0.0, "chunks": [[0.05, 1]], "finish_reason": None, "error": None}
    assert goodput([ok, slow, cut], (s,)) == pytest.approx(1 / 3)
    assert goodput([ok, slow], ()) == 1.0
