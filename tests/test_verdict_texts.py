"""Statements about measurements in the CLI's own text, checked against the data files they cite."""

import json
from pathlib import Path

from autotune.cli.search_command import INSTRUMENT_HELP

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data"


def test_instrument_help_quotes_the_served_gap_files_and_claims_no_bias_they_do_not_show():
    """The help used to say the in-process instrument "overstates speedups"; served_gap*.json show
    its claim/served ratio on both sides of 1, run to run. The help quotes them, in the files' order."""
    ratios = []
    for f in sorted(DATA.glob("served_gap*.json")):
        r = json.loads(f.read_text())["summary"].get("inproc", {}).get("claim_over_served")
        if r is not None:
            ratios.append(f"{r:.2f}")
    assert len(ratios) == 3 and min(map(float, ratios)) < 1 < max(map(float, ratios))
    assert f"{', '.join(ratios[:-1])} and {ratios[-1]} in three runs" in INSTRUMENT_HELP
    assert "benchmarks/data/served_gap*.json" in INSTRUMENT_HELP and "overstate" not in INSTRUMENT_HELP
    assert "no bias told apart" in INSTRUMENT_HELP
