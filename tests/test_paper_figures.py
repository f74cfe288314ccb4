"""What the paper's and the tools' figures say in the image: the QUICK mark, the reason interval
bars do not show (zero width, too few images), F.1's band rule."""

from types import SimpleNamespace

import matplotlib
import numpy as np
import pandas as pd

from ambiguity import plots
from ambiguity.runs import RunDir
from lantern.paper.config import PaperConfig
from lantern.paper.context import Context
from lantern.paper.experiments import plot_f1
from lantern.paper.methods import savefig
from lantern.paper.quality_speed import plot_quality_speed

matplotlib.use("Agg")


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.texts] + [t.get_text() for ax in fig.axes for t in ax.texts]


def test_quick_figures_are_marked_in_the_image(tmp_path):
    for quick in (True, False):
        ctx = Context(PaperConfig(quick=quick), RunDir(tmp_path / str(quick), {}, command="test"))
        with plots.style():
            fig, _ = plots.new_figure()
        assert savefig(ctx, fig, "fig9", "fig9") == "fig9/fig9.png"
        assert (plots.QUICK_MARK in _texts(fig)) is quick
        assert (tmp_path / str(quick) / "fig9" / "fig9.png").is_file()


def test_interval_note_says_why_bars_do_not_show():
    with plots.style():
        fig, ax = plots.new_figure()
    zero = "intervals of zero width: every jackknife\nresample gives the same value"
    assert plots.interval_note(ax, [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]) == zero
    assert plots.interval_note(ax, [0.5, 0.7], [np.nan, np.nan], [np.nan, np.nan]) == "no intervals: too few images"
    assert plots.interval_note(ax, [0.5, 0.7], [0.4, 0.7], [0.6, 0.7]) is None  # one bar shows
    assert _texts(fig) == [zero, "no intervals: too few images"]


def test_fig5_recall_panels_say_their_intervals_have_zero_width():
    rows = []
    for name, k, delta, speed, tau in (
        ("ar", np.nan, np.nan, 1.0, 1.0),
        ("eagle2", np.nan, np.nan, 1.5, 2.5),
        ("lantern-a", 19, 0.1, 2.0, 3.0),
        ("lantern-b", 19, 0.4, 2.5, 3.5),
    ):
        rows.append(
            {
                "name": name,
                "k": k,
                "delta": delta,
                "speedup": speed,
                "tau": tau,
                "images": 4,
                "fid_fmnist": 90 + tau,
                "fid_fmnist_lo": 60.0,
                "fid_fmnist_hi": 130.0,
                "recall_fmnist": 1.0,
                "recall_fmnist_lo": 1.0,
                "recall_fmnist_hi": 1.0,
            }
        )
    fig = plot_quality_speed(pd.DataFrame(rows), SimpleNamespace(primary="embedded"))
    notes = {ax.get_title(): [t.get_text() for t in ax.texts] for ax in fig.axes}
    zero = "intervals of zero width: every jackknife\nresample gives the same value"
    assert notes["recall (fmnist features)"] == [zero, "the same value for every method"]
    assert notes["FID (fmnist features)"] == []


def test_f1_title_says_where_its_bands_start():
    c = pd.DataFrame({"n": [1, 2, 5, 6], "speedup": [1.0, 1.2, 1.3, 1.25], "ci_low": 1.0, "ci_high": 1.5})
    fig = plot_f1({"EAGLE-2": c, "LANTERN": c.assign(speedup=c["speedup"] + 0.5)}, [1, 2, 5, 6], 6, "embedded")
    assert fig.axes[0].get_title() == (
        "embedded, temperature 1: speed-up on the first n images\n"
        "bands: 95 % bootstrap over the images, from n = 5 on (fewer: too few to resample)"
    )
