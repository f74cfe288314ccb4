"""ambiguity.plots: binned rates with interval bars (the acceptance-vs-ambiguity panels of
lantern.replay and benchmarks/compare_methods.py) and the colour of each series."""

from __future__ import annotations

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest

from ambiguity import plots
from ambiguity.plots import METHOD_COLORS


def _bars(container) -> np.ndarray:
    """(n, 4) rows x_low, y_low, x_high, y_high of the error bars of one ErrorbarContainer."""
    segments = [s for c in container.lines[2] for s in c.get_segments()]  # no collection without bars
    return np.array([np.ravel(s) for s in segments]).reshape(-1, 4)


def test_binned_rates_draws_each_series_with_the_frames_intervals_and_counts():
    bins = pd.DataFrame(
        {  # lantern's rows out of x order; sd's 0.75 bin and all of ar's have fewer than 20 trials
            "method": ["sd", "sd", "lantern", "lantern", "ar"],
            "mid": [0.25, 0.75, 0.75, 0.25, 0.25],
            "acceptance_rate": [0.5, 0.8, 0.9, 0.6, 1.0],
            "ci_low": [0.4, 0.6, 0.85, 0.45, 0.5],
            "ci_high": [0.7, 0.9, 0.95, 0.7, 1.0],
            "drafts": [50, 10, 200, 30, 4],
        }
    )
    with plots.style():
        fig, (ax, cnt) = plots.new_figure(2, 1)
        drawn = plots.binned_rates(ax, bins, cnt, min_count=20)
    assert list(drawn) == ["sd", "lantern", "ar"] and list(ax.containers) == list(drawn.values())
    # bin width 0.5, dodge 0.12 of it between neighbouring series: sd -0.06, lantern 0, ar +0.06
    sd, lantern, ar = (_bars(drawn[m]) for m in ("sd", "lantern", "ar"))
    np.testing.assert_allclose(sd, [[0.19, 0.4, 0.19, 0.7]])
    np.testing.assert_allclose(lantern, [[0.25, 0.45, 0.25, 0.7], [0.75, 0.85, 0.75, 0.95]])
    assert ar.size == 0 and drawn["ar"].get_label() == "ar"  # no bin left, still in the legend
    line = drawn["lantern"].lines[0]
    np.testing.assert_allclose(line.get_xydata(), [[0.25, 0.6], [0.75, 0.9]])  # joined left to right
    counts = {mcolors.to_hex(c.get_color()): c.get_ydata().tolist() for c in cnt.lines}
    assert counts == {METHOD_COLORS["sd"]: [50], METHOD_COLORS["lantern"]: [30, 200], METHOD_COLORS["ar"]: []}
    for m, c in drawn.items():
        assert mcolors.to_hex(c.lines[0].get_color()) == METHOD_COLORS[m]
    assert ax.get_ylim() == (0, 1.02)
    # order and colours given: one series, in red, in the middle of its bin
    with plots.style():
        fig, ax = plots.new_figure()
        drawn = plots.binned_rates(ax, bins, order=["lantern"], colors={"lantern": "#ff0000"})
    assert list(drawn) == ["lantern"] and len(ax.containers) == 1
    np.testing.assert_allclose(_bars(drawn["lantern"])[:, 0], [0.25, 0.75])
    assert mcolors.to_hex(drawn["lantern"].lines[0].get_color()) == "#ff0000"
    with pytest.raises(ValueError, match="ci_low, ci_high"):
        plots.binned_rates(ax, bins.drop(columns=["ci_low", "ci_high"]))


def test_series_colors_keep_method_colours_unless_a_method_repeats():
    labels = ["sd", "lantern k=64 δ=0.2", "lantern k=8 δ=0.1", "mystery", "lantern++ k=64 λ=2"]
    c = plots.series_colors(labels)
    assert c["sd"] == METHOD_COLORS["sd"] and c["lantern++ k=64 λ=2"] == METHOD_COLORS["lantern++"]
    # two LANTERN runs and an unknown method: three further colours, distinct from the two above
    rest = [c[k] for k in ("lantern k=64 δ=0.2", "lantern k=8 δ=0.1", "mystery")]
    assert len(set(rest)) == 3 and not set(rest) & {METHOD_COLORS["sd"], METHOD_COLORS["lantern++"]}
    assert plots.series_colors(["eagle-2", "eagle-2"]) == {"eagle-2": METHOD_COLORS["eagle-2"]}


def test_plot_replay_draws_wilson_bars_in_method_colours(tmp_path, monkeypatch):
    """lantern.replay's panels: per ambiguity column one ErrorbarContainer per run, bars at
    with_wilson's interval, in the run's method colour."""
    from lantern import replay
    from lantern.quality.metrics import wilson_interval

    # sd: 30 reached drafts at top-1 0.15 (entropy 2.5), 12 committed; lantern: 40 at 0.85 (entropy 0.5), 36
    drafts = {
        "sd": pd.DataFrame({"p_top1": 0.15, "p_entropy": 2.5, "committed": [1] * 12 + [0] * 18}),
        "lantern k=64 δ=0.2": pd.DataFrame({"p_top1": 0.85, "p_entropy": 0.5, "committed": [1] * 36 + [0] * 4}),
    }
    drafts = {k: d.assign(reached=True, j_star=0, p_tilde=0.0, p_draft=0.0) for k, d in drafts.items()}
    bins = replay.acceptance_by_ambiguity(drafts, bins=10)
    figs = []
    monkeypatch.setattr(replay.plots, "save_figure", lambda fig, path: figs.append(fig) or [])
    replay.plot_replay(bins, path=tmp_path / "r")
    top1, entropy = figs[0].axes[0], figs[0].axes[1]
    # bins of width 0.1 (top-1) and 0.25 nats (entropy on [0, 2.5]); the two runs 0.12 of a bin apart
    for ax, x_sd, x_lantern, shift in ((top1, 0.15, 0.85, 0.006), (entropy, 2.375, 0.625, 0.015)):
        sd, lantern = ax.containers
        lo, hi = wilson_interval(0.4, 30)
        np.testing.assert_allclose(_bars(sd), [[x_sd - shift, lo, x_sd - shift, hi]])
        lo, hi = wilson_interval(0.9, 40)
        np.testing.assert_allclose(_bars(lantern), [[x_lantern + shift, lo, x_lantern + shift, hi]])
        assert mcolors.to_hex(sd.lines[0].get_color()) == METHOD_COLORS["sd"]
        assert mcolors.to_hex(lantern.lines[0].get_color()) == METHOD_COLORS["lantern"]
