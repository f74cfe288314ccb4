"""Speed next to quality for a δ/k sweep: one tidy table and one figure.

:func:`sweep_frame` joins the metric rows of :func:`lantern.evaluate.evaluate_runs` with each
run's decoding settings (method, k, δ) and speed (acceptance rate α, mean accepted length τ with
the bonus token, step compression, from the run's ``summary.json``); :func:`plot_quality_sweep`
draws τ and the chosen metrics against δ, one line per k with the 95 % intervals as bars,
SD (dashed), AR (dotted) and real-data sets (dash-dotted, the floor) at the sweep's n as
horizontal lines, titled panels and one legend below them, in the house style
(:mod:`ambiguity.plots`, PNG + PDF); :func:`replot` redraws it from saved results.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from ambiguity import plots

__all__ = ["sweep_frame", "sweep_settings", "plot_quality_sweep", "replot", "DEFAULT_PANELS", "TITLES"]

DEFAULT_PANELS = ("fid", "precision", "recall")
_SPEED = ("acceptance_rate", "tau", "tokens_per_forward")
_OLD_SPEED = {"tau": "mean_accepted_length", "tokens_per_forward": "step_compression"}  # earlier records' names


def sweep_frame(df: pd.DataFrame, record: dict) -> pd.DataFrame:
    """Metric rows (run, metric, value, ci_low, ci_high, ...) with columns kind, method, k, delta
    and the speed columns of each run (NaN where a run has none, e.g. a data set)."""
    info = {}
    for r in record["runs"]:
        rule = r.get("rule") or {}
        speed = r.get("speed") or {}
        info[r["spec"]] = {
            "kind": r.get("kind"),
            "method": r.get("method") or r.get("kind"),
            "k": rule.get("k") if r.get("method", "").startswith("lantern") else np.nan,
            "delta": rule.get("delta") if r.get("method", "").startswith("lantern") else np.nan,
            **{c: speed.get(c, speed.get(_OLD_SPEED.get(c, c), np.nan)) for c in _SPEED},
        }
    extra = pd.DataFrame([info[s] for s in df["run"]], index=df.index)
    return pd.concat([df, extra], axis=1)


def sweep_settings(frame: pd.DataFrame) -> int:
    """How many distinct LANTERN settings (k, δ) a :func:`sweep_frame` holds (a sweep figure needs 2 or more)."""
    lan = frame[frame["method"] == "lantern"]
    return len(lan[["k", "delta"]].drop_duplicates())


TITLES = {
    "fid": "FID",
    "kid": "KID",
    "precision": "precision",
    "recall": "recall",
    "density": "density",
    "coverage": "coverage",
}


def _metric_label(metric: str) -> tuple[str, str]:
    """``fid_fmnist`` -> (``FID``, ``FID (fmnist features)``): the axis label and the panel title."""
    name, _, extractor = metric.partition("_")
    short = TITLES.get(name, name.replace("_", " "))
    return short, short + (f" ({extractor} features)" if extractor else "")


def _panel(ax, frame: pd.DataFrame, metric: str, speed: bool) -> None:
    lan = frame[frame["method"] == "lantern"]
    col = "tau" if speed else "value"
    rows = lan.drop_duplicates("run") if speed else lan[lan["metric"] == metric]
    ks = sorted(rows["k"].dropna().unique())
    step = float(np.diff(sorted(rows["delta"].dropna().unique())).min()) if rows["delta"].nunique() > 1 else 0.1
    for j, k in enumerate(ks):
        line = rows[rows["k"] == k].sort_values("delta")
        err = (
            None
            if speed
            else np.vstack(
                [(line["value"] - line["ci_low"]).clip(lower=0), (line["ci_high"] - line["value"]).clip(lower=0)]
            )
        )
        dodge = (j - (len(ks) - 1) / 2) * 0.15 * step  # side by side, so the bars of two k do not hide each other
        ax.errorbar(
            line["delta"] + dodge,
            line[col],
            yerr=err,
            marker="o",
            ms=3,
            capsize=2,
            lw=1.1,
            label=f"LANTERN k={int(k)}",
            color=plots.color_for("", j),
        )
    n = rows["n"].mode().iloc[0] if "n" in rows and len(rows) else None
    for method, ls in (("sd", "--"), ("ar", ":"), ("dataset", "-.")):
        sub = frame[frame["method"] == method]
        if n is not None and "n" in sub:
            sub = sub[sub["n"] == n]  # baselines at the sweep's sample size only
        sub = sub.drop_duplicates("run") if speed else sub[sub["metric"] == metric]
        if len(sub) and np.isfinite(sub[col].iloc[0]):
            name = {"dataset": "real data (same n)", "sd": "SD (lossless)"}.get(method, method.upper())
            ax.axhline(float(sub[col].iloc[0]), ls=ls, color="0.35", lw=0.9, label=name)
    ax.set_xlabel("δ (TVD bound)")
    if speed:
        ax.set_ylabel("τ (bonus token counted)")
        ax.set_title("mean accepted length", fontsize=7)
    else:
        short, title = _metric_label(metric)
        ax.set_ylabel(short)
        ax.set_title(title, fontsize=7)


def plot_quality_sweep(
    frame: pd.DataFrame,
    path: str | Path,
    extractors: Optional[Sequence[str]] = None,
    panels: Sequence[str] = DEFAULT_PANELS,
    title: Optional[str] = None,
) -> list[Path]:
    """τ and ``panels`` metrics (per extractor) vs δ from a :func:`sweep_frame`, each panel titled,
    95 % intervals as bars, one legend below the panels; ``title``: the figure's title (default:
    the sweep's n). Returns the files."""
    extractors = list(extractors or [e for e in dict.fromkeys(frame["extractor"]) if e])
    metrics = [f"{m}_{e}" for e in extractors for m in panels if f"{m}_{e}" in set(frame["metric"])]
    n = 1 + len(metrics)
    ncol = min(n, 4)
    nrow = int(np.ceil(n / ncol))
    height = 1.9 * nrow + 0.7
    lan = frame[frame["method"] == "lantern"]
    size = int(lan["n"].mode().iloc[0]) if "n" in lan and len(lan) else None
    with plots.style():
        fig, axes = plots.new_figure(nrow, ncol, width=1.95 * ncol, height=height, squeeze=False)
        flat = axes.ravel()
        _panel(flat[0], frame, "", speed=True)
        for ax, m in zip(flat[1:], metrics):
            _panel(ax, frame, m, speed=False)
        for ax in flat[n:]:
            ax.set_visible(False)
        fig.suptitle(
            title
            or (
                "LANTERN δ/k sweep against the real images"
                + (f" (n = {size} images per run)" if size else "")
                + "; bars: 95 % intervals"
            ),
            fontsize=8,
        )
        handles, labels = flat[1 if n > 1 else 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=6, frameon=False)
        return plots.save_figure(fig, path)


def replot(metrics: str | Path, evaluation: str | Path, path: str | Path, title: Optional[str] = None) -> list[Path]:
    """Redraw a sweep figure from an evaluation's saved files: ``metrics.parquet`` rows and the
    ``evaluation.json`` record (its ``runs``), e.g. the committed ``benchmarks/results/quality``."""
    import json

    df = pd.read_parquet(metrics)
    record = json.loads(Path(evaluation).read_text())
    return plot_quality_sweep(sweep_frame(df, record), path, title=title)
