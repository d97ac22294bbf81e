"""The report's chart rules, read from the charts' data (autotune.results.charts.Chart), not from pixels:
one colour per method across charts, intervals on every speedup, the pick marked with why, superseded
trials faded, the served figure beside the claim. The frame and report are built by hand here, as
autotune.study.pareto.trials_frame and best.json lay them out."""

from __future__ import annotations

import pandas as pd
import pytest

from autotune.results.charts import (INTERVAL, acceptance_chart, category_chart, pareto_chart, prediction_chart,
                                     speedup_chart)
from autotune.results.draw import figure, to_png, to_svg
from autotune.results.method_colors import METHOD_COLORS, OTHER_COLORS, method_color


def _row(trial, method, k, tps, ms, speedup, *, role="candidate", correct=True, pareto=False, kv="auto",
         superseded_by=None, predicted=None):
    lo, hi = (speedup * 0.95, speedup * 1.05) if speedup else (None, None)
    p_lo, p_hi = (predicted * 0.9, predicted * 1.1) if predicted else (None, None)
    return {"trial": trial, "state": "COMPLETE", "role": role, "label": f"{method} k={k} kv={kv}",
            "param_method": method, "param_num_speculative_tokens": k, "param_kv_cache_dtype": kv,
            "output_tok_s": tps, "e2e_ms_p50": ms, "speedup_output_tok_s": speedup,
            "speedup_output_tok_s_lo": lo, "speedup_output_tok_s_hi": hi, "predicted_speedup": predicted,
            "predicted_lo": p_lo, "predicted_hi": p_hi, "correct": correct, "pareto": pareto,
            "superseded_by": superseded_by, "slo_missed": None, "acceptance_by_pos": "0.8 0.6" if k else ""}


@pytest.fixture
def study():
    frame = pd.DataFrame([
        _row(0, "none", 0, 100.0, 90.0, 1.0, role="baseline"),
        _row(1, "ngram", 3, 150.0, 70.0, 1.5, superseded_by=5, predicted=1.45),  # first engine, re-measured in 5
        _row(2, "suffix", 4, 140.0, 72.0, 1.4, predicted=1.3),
        _row(3, "ngram", 3, 158.0, 66.0, 1.58, kv="fp8", pareto=True),  # lossy, faster: passed over
        _row(4, "eagle3", 2, 90.0, 95.0, 0.9, correct=False),
        _row(5, "ngram", 3, 152.0, 68.0, 1.52, pareto=True, predicted=1.45),  # the pick, pooled
    ])
    report = {"objectives": ["output_tok_s", "e2e_ms_p50"],
              "best": {"trial": 5, "label": "ngram k=3 kv=auto", "candidate": {"method": "ngram",
                       "num_speculative_tokens": 3, "kv_cache_dtype": "auto"},
                       "speedup": {"output_tok_s": 1.52, "output_tok_s_lo": 1.47, "output_tok_s_hi": 1.56},
                       "served": {"speedup": 1.31, "speedup_lo": 1.2, "speedup_hi": 1.4}},
              "lossless_first": {"passed_over": 3, "label": "ngram k=3 kv=fp8", "gain_lo": 0.99, "gain_hi": 1.08,
                                 "min_gain": 0.03, "reason": "ngram k=3 kv=fp8 is lossy ..."}}
    return frame, report


def _charts(frame, report):
    return [pareto_chart(frame, report), speedup_chart(frame, report), prediction_chart(frame, report),
            acceptance_chart(frame), category_chart(report)]


def test_one_colour_per_method_in_every_chart(study):
    seen = {}
    for chart in _charts(*study):
        for s in chart.series:
            if s.method is None:
                assert s.color not in METHOD_COLORS.values(), f"{chart.slug}: {s.name} takes a method's colour"
            else:
                assert seen.setdefault(s.method, s.color) == s.color == method_color(s.method), (chart.slug, s.name)
    assert {"ngram", "suffix", "eagle3", "none"} <= set(seen)
    assert len(set(METHOD_COLORS.values())) == len(METHOD_COLORS)
    assert not set(OTHER_COLORS) & set(METHOD_COLORS.values())


def test_every_speedup_carries_its_interval_and_its_unit(study):
    frame, report = study
    for chart in (speedup_chart(frame, report), prediction_chart(frame, report)):
        assert INTERVAL in chart.y_title and "x the baseline's output tok/s" in chart.y_title
        for s in chart.series:
            if s.method is not None:
                assert s.error and len(s.error) == len(s.y), (chart.slug, s.name)
                assert all(lo <= y <= hi for y, (lo, hi) in zip(s.y, s.error)), (chart.slug, s.name)
    forecast = [s for s in prediction_chart(frame, report).series if s.method == "suffix"][0]
    assert forecast.x_error == [(pytest.approx(1.17), pytest.approx(1.43))]


def test_pareto_marks_the_pick_with_why_and_fades_superseded_trials(study):
    frame, report = study
    chart = pareto_chart(frame, report)
    pick = [s for s in chart.series if s.name.startswith("pick")]
    assert len(pick) == 1 and (pick[0].x, pick[0].y) == ([68.0], [152.0]) and pick[0].text == ["pick"]
    assert "lossless first" in pick[0].name and "#3" in pick[0].name
    faded = [s for s in chart.series if s.opacity < 1]
    assert [(s.method, s.x) for s in faded] == [("ngram", [70.0])]  # trial 1, superseded by 5
    bright = [x for s in chart.series if s.opacity == 1 and s.kind == "markers" for x in s.x]
    assert 70.0 not in bright
    front = [s for s in chart.series if s.kind == "lines"][0]
    assert front.x == [66.0, 68.0]  # the lossy trial 3 is on the front; the pick is marked apart from it


def test_the_served_figure_stands_beside_the_claim(study):
    frame, report = study
    bars = speedup_chart(frame, report).series
    served = [s for s in bars if s.hatch]
    assert len(served) == 1 and served[0].y == [1.31] and served[0].x == ["3"] and served[0].error == [(1.2, 1.4)]
    claim = [s for s in bars if s.name == "the pick, claimed by the study"]
    assert len(claim) == 1 and claim[0].x == ["3"] and claim[0].y == [1.52] and claim[0].error == [(1.47, 1.56)]
    points = [s for s in prediction_chart(frame, report).series if s.text == ["served"]]
    assert len(points) == 1 and points[0].x == [1.45] and points[0].y == [1.31]
    del report["best"]["served"]  # no confirm: no served figure
    assert not [s for s in _charts(frame, report)[1].series if s.hatch]


def test_charts_draw_as_png_and_inline_svg(study, tmp_path):
    for chart in _charts(*study):
        if chart.series:
            svg = to_svg(chart)
            assert svg.startswith("<svg") and chart.title in svg and svg == to_svg(chart)  # text as text; same bytes
            assert len(svg) < 100_000, (chart.slug, len(svg))
            to_png(chart, tmp_path / f"{chart.slug}.png")
            assert (tmp_path / f"{chart.slug}.png").stat().st_size > 10_000


def _pick_bars(chart, label):
    """The study's own bars (not the served one) that draw the config ``label``."""
    return [(s.name, x) for s in chart.series if not s.hatch for x, h in zip(s.x, s.hover or []) if label in h]


def test_the_speedup_chart_draws_the_picks_bar_once(study):
    frame, report = study
    label = report["best"]["label"]
    alone = frame[frame["trial"] != 3]  # the pick the fastest at its method and depth, its bar the claim's
    chart = speedup_chart(alone, report)
    assert _pick_bars(chart, label) == [("the pick, claimed by the study", "3")]
    full = speedup_chart(frame, report)  # a faster (lossy) config at the pick's depth: its own bar stays
    assert _pick_bars(full, label) == [("the pick, claimed by the study", "3")]
    assert [y for s in full.series if s.name == "ngram" for x, y in zip(s.x, s.y) if x == "3"] == [1.58]
    del report["best"]["served"]  # no confirm: the pick is its method's bar, once
    assert _pick_bars(speedup_chart(alone, report), label) == [("ngram", "3")]


def test_importance_labels_read_level_and_never_touch(tmp_path):
    """Long parameter names (suffix decoding's) as the importance chart draws them: horizontal bars,
    each name on its own line, inside the figure."""
    import optuna
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from autotune.results.charts import importance_chart

    names = ["num_speculative_tokens", "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor",
             "suffix_decoding_min_token_prob", "prompt_lookup_max", "kv_cache_dtype"]
    dist = optuna.distributions.IntDistribution(0, 9)
    study = optuna.create_study(study_name="long", storage=f"sqlite:///{tmp_path / 'study.db'}",
                                directions=["maximize", "minimize"])
    for i in range(8):
        values = {n: (i * (j + 3)) % 10 for j, n in enumerate(names)}
        study.add_trial(optuna.trial.create_trial(params=values, distributions={n: dist for n in names},
                                                  values=[values[names[0]] + 0.1 * values[names[1]], values[names[2]]]))
    chart = importance_chart(tmp_path, {"study": "long", "objectives": ["output_tok_s", "e2e_ms_p50"]})
    assert sorted(chart.categories) == sorted(names)
    fig = figure(chart)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    labels = [t for t in ax.get_yticklabels() + ax.get_xticklabels() if t.get_text() in names]
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert len(boxes) == len(names)
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert all(b.x0 >= 0 and b.y0 >= 0 and b.x1 <= fig.bbox.width and b.y1 <= fig.bbox.height for b in boxes)


def test_category_speedups_carry_their_interval(study):
    _, report = study
    cats = {"edit": {"requests": 4, "output_tok_s": 300.0, "tpot_ms_p50": 3.0, "mean_accepted_length": 3.1},
            "chat": {"requests": 4, "output_tok_s": 120.0, "tpot_ms_p50": 8.0, "mean_accepted_length": 1.4}}
    report["best"].update(measurement={"by_category": cats}, speedup_by_category={
        "edit": {"output_tok_s": 2.5, "output_tok_s_lo": 2.2, "output_tok_s_hi": 2.9, "tpot_ms_p50": 2.4},
        "chat": {"output_tok_s": 1.1, "output_tok_s_lo": 0.9, "output_tok_s_hi": 1.3, "tpot_ms_p50": 1.0}})
    chart = category_chart(report)
    assert INTERVAL in chart.y_title
    assert chart.series[0].y == [2.5, 1.1] and chart.series[0].error == [(2.2, 2.9), (0.9, 1.3)]
    for v in report["best"]["speedup_by_category"].values():  # an older best.json: no interval, and said so
        del v["output_tok_s_lo"], v["output_tok_s_hi"]
    chart = category_chart(report)
    assert chart.series[0].error is None and "none" in chart.note
