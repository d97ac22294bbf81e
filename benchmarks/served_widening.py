"""Would widening the served interval by the study's selection rounds (as the holdout's figure is,
autotune.measure.pairs.holdout_interval) have told more on the real engine? The saved demo runs.

The holdout's figure is widened by how far its pairs lie from the pick's selection rounds: a second
block of pairs measured at another time, for a machine state that persists. Tried for confirm's
served rounds too (3a5941a, reverted). This reads every saved run of claim_vs_served.json and
claim_vs_served_s4.json that had two selection rounds (the claim's unit "paired instances": its
interval is the t-interval over those two pairs, so their two log ratios follow from it) and
computes the served interval as confirm does (a paired t-interval at the sequential rule's level)
and widened by those two pairs; beside them the run's holdout figure, measured after the choice
too. No engine: the saved numbers only.

Run: .venv/bin/python benchmarks/served_widening.py
Writes benchmarks/data/served_widening.json.
"""

from __future__ import annotations

import harness  # first: this checkout's autotune on the path

import json
import math

from autotune.measure.intervals import paired_t, resolution, t_quantile
from autotune.measure.pairs import holdout_interval
from autotune.measure.sequential import LEVEL


def two_pairs(claimed: float, hi: float) -> list[float]:
    """The two selection-round log ratios behind a t-interval over 2 pairs with this centre and top."""
    sd = math.log(hi / claimed) / t_quantile(1, 0.95) * math.sqrt(2)
    return [math.log(claimed) - sd / math.sqrt(2), math.log(claimed) + sd / math.sqrt(2)]


def main() -> None:
    ap = harness.parser(__doc__, out="served_widening.json", summary=True)
    args = ap.parse_args()
    rows = []
    for name in ("claim_vs_served.json", "claim_vs_served_s4.json"):
        for r in json.loads((harness.DATA / name).read_text())["rows"]:
            if ((r["selection"].get("rounds") or 0) != 2 or not str(r.get("claimed_unit", "")).startswith("paired")
                    or not r.get("claimed_hi")):
                continue  # no two pairs to read back (other rounds, or no interval saved with the claim)
            pairs = list(zip(r["pick_tok_s"], r["baseline_tok_s"]))
            _, lo, hi, n = paired_t(r["pick_tok_s"], r["baseline_tok_s"], level=LEVEL)
            _, wlo, whi, _ = holdout_interval(pairs, two_pairs(r["claimed"], r["claimed_hi"]), level=LEVEL)
            rows.append({"file": name, "run": r["run"], "pick": r["pick"], "selection_rounds_ratio": r["claimed"],
                         "holdout_figure": r["figure"], "served": r["served"], "served_rounds": n,
                         "plain_resolution": resolution(lo, hi), "widened_resolution": resolution(wlo, whi)})
            print(f"{name} run {r['run']}: selection {r['claimed']:.2f}x, holdout {r['figure']:.2f}x, served "
                  f"{r['served']:.2f}x; served resolution {rows[-1]['plain_resolution']:.0%} plain, "
                  f"{rows[-1]['widened_resolution']:.0%} widened", flush=True)
    blown = [x for x in rows if x["widened_resolution"] > 2 * x["plain_resolution"]]
    harness.save(args.out, {"what": "confirm's served interval on saved demo runs with 2 selection rounds, as "
                                    "confirm computes it and widened by those rounds (holdout_interval)",
                            "level": LEVEL, "rows": rows,
                            "summary": {"runs": len(rows), "widened_over_twice": len(blown),
                                        "widened_resolutions_over_twice": [x["widened_resolution"] for x in blown],
                                        "their_plain_resolutions": [x["plain_resolution"] for x in blown]}})


if __name__ == "__main__":
    main()
