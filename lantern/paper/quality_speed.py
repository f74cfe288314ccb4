"""Fig. 5's plot: image quality against speed-up and mean accepted length over the (k, δ) grid,
drawn from the method rows of :func:`lantern.paper.methods.method_rows` (the item is
:func:`lantern.paper.experiments.fig5`; the generic figure helpers are :mod:`ambiguity.plots`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ambiguity import plots
from lantern.paper.context import Context
from lantern.quality.report import TITLES

__all__ = ["METRIC_TITLES", "DELTA_MARKERS", "plot_quality_speed"]

METRIC_TITLES = TITLES  # one table of metric names: lantern.quality.report's


def _metric_title(metric: str) -> str:
    """``fid_fmnist`` -> ``FID (fmnist features)``."""
    name, _, extractor = metric.partition("_")
    return METRIC_TITLES.get(name, name) + (f" ({extractor} features)" if extractor else "")


DELTA_MARKERS = "osDvP^<>"


def _bars(rows: pd.DataFrame, metric: str, lo, hi):
    """Error-bar lengths (2, len(rows)) of ``metric`` from the interval columns ``lo`` / ``hi`` (None without)."""
    if lo is None or hi is None:
        return None
    return np.vstack([(rows[metric] - lo[rows.index]).clip(lower=0), (hi[rows.index] - rows[metric]).clip(lower=0)])


def _panel(ax, df: pd.DataFrame, metric: str, x: str, marker_of: dict) -> None:
    """One Fig. 5 panel: ``metric`` against ``x`` (``"speedup"`` or ``"tau"``), LANTERN lines per k
    through their δ markers, AR and EAGLE-2 in grey, each point with its interval (or a note why none shows)."""
    grid = df[df["name"].str.startswith("lantern")]
    ks = sorted(grid["k"].dropna().unique())
    lo, hi = df.get(f"{metric}_lo"), df.get(f"{metric}_hi")
    for ci, k in enumerate(ks):
        col = plots.color_for(f"k{k}", ci)
        d = grid[grid["k"] == k].sort_values("delta")
        ax.plot(d[x], d[metric], color=col, lw=1.0, zorder=2)
        for delta, r in d.groupby("delta"):
            ax.errorbar(
                r[x],
                r[metric],
                yerr=_bars(r, metric, lo, hi),
                fmt=marker_of[delta],
                color=col,
                markersize=3.5,
                capsize=1.5,
                elinewidth=0.6,
                zorder=3,
            )
    for name, marker in (("ar", "X"), ("eagle2", "*")):
        r = df[df["name"] == name]
        if len(r):
            ax.errorbar(
                r[x],
                r[metric],
                yerr=_bars(r, metric, lo, hi),
                fmt=marker,
                color="0.3",
                markersize=4.5,
                capsize=1.5,
                elinewidth=0.6,
                zorder=3,
            )
    values = pd.concat([df[metric]] + [c for c in (lo, hi) if c is not None]).dropna()
    same = len(values) and float(values.max() - values.min()) < 1e-9
    missing = [np.nan] * len(df)
    plots.interval_note(
        ax,
        df[metric],
        missing if lo is None else lo,
        missing if hi is None else hi,
        y=0.7 if same else 0.06,
    )  # above the line when the one-value note is below
    if same:  # one value for every method
        v = float(values.iloc[0])
        ax.set_ylim(v - 0.5, v + 0.5)
        ax.set_yticks([v])
        ax.text(
            0.5,
            0.12,
            "the same value for every method",
            transform=ax.transAxes,
            ha="center",
            fontsize=5.5,
            color="0.35",
        )
    ax.set_xlabel(
        "speed-up over AR (ratio of total latencies)"
        if x == "speedup"
        else "mean accepted length τ (bonus token counted)"
    )
    ax.set_ylabel(METRIC_TITLES.get(metric.split("_")[0], metric))
    ax.set_title(_metric_title(metric), fontsize=7)


def _legend_handles(ks, deltas, marker_of: dict) -> list:
    """Fig. 5's legend: a line per k, a marker per δ, AR and EAGLE-2."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=plots.color_for(f"k{k}", ci), lw=1.0, label=f"LANTERN k={int(k)}")
        for ci, k in enumerate(ks)
    ]
    handles += [
        Line2D([], [], color="0.45", marker=marker_of[d], ls="none", markersize=3.5, label=f"δ={d:g}") for d in deltas
    ]
    handles += [
        Line2D([], [], color="0.3", marker=m, ls="none", markersize=4.5, label=label)
        for m, label in (("X", "AR"), ("*", "EAGLE-2 (lossless)"))
    ]
    return handles


def plot_quality_speed(df: pd.DataFrame, ctx: Context):
    """Fig. 5: one row per quality metric (title: metric and extractor), speed-up (ratio of total
    latencies) and τ along x; LANTERN: one line per k (colour) through its δ values (marker shape,
    so coinciding points never overprint text), each point with its 95 % interval (the table's ci
    columns); AR and EAGLE-2 as grey markers; one legend below the panels. ``df``: method rows
    (:func:`lantern.paper.methods.method_rows`) of AR, EAGLE-2 and the LANTERN grid; ``ctx`` names the
    primary model in the title. Returns the matplotlib figure."""
    metrics = [
        m for m in df.columns if m.split("_")[0] in ("fid", "precision", "recall") and not m.endswith(("_lo", "_hi"))
    ]
    rows = max(1, len(metrics))
    height = 1.9 * rows + 0.6
    grid = df[df["name"].str.startswith("lantern")]
    ks = sorted(grid["k"].dropna().unique())
    deltas = sorted(grid["delta"].dropna().unique())
    marker_of = {d: DELTA_MARKERS[i % len(DELTA_MARKERS)] for i, d in enumerate(deltas)}

    with plots.style():
        fig, axes = plots.new_figure(rows, 2, width=6.0, height=height)
        axes = np.atleast_2d(axes)
        for i, metric in enumerate(metrics):
            for j, x in enumerate(("speedup", "tau")):
                _panel(axes[i, j], df, metric, x, marker_of)
        n = int(df["images"].max()) if "images" in df and df["images"].notna().any() else None
        fig.suptitle(
            f"{ctx.primary}: quality vs speed over δ and k (temperature 1"
            + (f", {n} images per method" if n else "")
            + "; bars: 95 % intervals)",
            fontsize=8,
        )
        handles = _legend_handles(ks, deltas, marker_of)
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize=6, frameon=False)
    return fig
