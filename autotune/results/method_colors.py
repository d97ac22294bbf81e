"""One colour per speculative method, the same in every chart (HTML and PNG), and colours for what is
not a method (objectives, metrics, reference lines) that no method uses."""

from __future__ import annotations

import zlib

# matplotlib's tab10 (plotly's D3) hues, each given to one method for good; none is the baseline.
METHOD_COLORS = {"none": "#000000", "ngram": "#1f77b4", "suffix": "#ff7f0e", "draft_model": "#2ca02c",
                 "eagle3": "#d62728", "eagle": "#9467bd", "mtp": "#8c564b", "dflash": "#e377c2", "dspark": "#bcbd22"}
_SPARE = ("#aec7e8", "#ffbb78")  # a method autotune does not know yet (tab20's light hues): one of these, by its name
# Not a method: greys and a teal, in this order.
OTHER_COLORS = ("#4d4d4d", "#999999", "#17becf", "#c7c7c7", "#666666")


def method_color(method: str) -> str:
    """The colour of ``method`` in every chart."""
    return METHOD_COLORS.get(method) or _SPARE[zlib.crc32(method.encode()) % len(_SPARE)]


def other_color(i: int) -> str:
    """The i-th colour for a series that is not a method."""
    return OTHER_COLORS[i % len(OTHER_COLORS)]
