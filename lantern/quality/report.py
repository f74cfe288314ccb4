"""Speed next to quality for a δ/k sweep: one tidy table and one figure.

:func:`sweep_frame` joins the metric rows of :func:`lantern.evaluate.evaluate_runs` with each
run's decoding settings (method, k, δ) and speed (acceptance rate α, mean accepted length τ with
the bonus token, step compression, from the run's ``summary.json``); :func:`plot_quality_sweep`
draws τ and the chosen metrics against δ, one line per k with the bootstrap intervals as bars,
SD (dashed), AR (dotted) and real-data sets (dash-dotted, the floor) at the sweep's n as
horizontal lines, in the house style (:mod:`ambiguity.plots`, PNG + PDF).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from ambiguity import plots

__all__ = ["sweep_frame", "plot_quality_sweep", "DEFAULT_PANELS"]

DEFAULT_PANELS = ("fid", "precision", "recall")
_SPEED = ("acceptance_rate", "tau", "tokens_per_forward")


def sweep_frame(df: pd.DataFrame, record: dict) -> pd.DataFrame:
    """Metric rows (run, metric, value, ci_low, ci_high, ...) with columns kind, method, k, delta
    and the speed columns of each run (NaN where a run has none, e.g. a data set)."""
    info = {}
    for r in record["runs"]:
        rule = r.get("rule") or {}
        speed = r.get("speed") or {}
        info[r["spec"]] = {"kind": r.get("kind"), "method": r.get("method") or r.get("kind"),
                           "k": rule.get("k") if r.get("method", "").startswith("lantern") else np.nan,
                           "delta": rule.get("delta") if r.get("method", "").startswith("lantern") else np.nan,
                           **{c: speed.get(c, np.nan) for c in _SPEED}}
    extra = pd.DataFrame([info[s] for s in df["run"]], index=df.index)
    return pd.concat([df, extra], axis=1)


def _panel(ax, frame: pd.DataFrame, metric: str, speed: bool) -> None:
    lan = frame[frame["method"] == "lantern"]
    col = "tau" if speed else "value"
    rows = lan.drop_duplicates("run") if speed else lan[lan["metric"] == metric]
    for j, k in enumerate(sorted(rows["k"].dropna().unique())):
        line = rows[rows["k"] == k].sort_values("delta")
        err = None if speed else np.vstack([line["value"] - line["ci_low"], line["ci_high"] - line["value"]])
        ax.errorbar(line["delta"], line[col], yerr=err, marker="o", ms=3, capsize=2, lw=1.1,
                    label=f"LANTERN k={int(k)}", color=plots.color_for("", j))
    n = rows["n"].mode().iloc[0] if "n" in rows and len(rows) else None
    for method, ls in (("sd", "--"), ("ar", ":"), ("dataset", "-.")):
        sub = frame[frame["method"] == method]
        if n is not None and "n" in sub:
            sub = sub[sub["n"] == n]  # baselines at the sweep's sample size only
        sub = sub.drop_duplicates("run") if speed else sub[sub["metric"] == metric]
        if len(sub) and np.isfinite(sub[col].iloc[0]):
            name = {"dataset": "real data (same n)"}.get(method, method.upper())
            ax.axhline(float(sub[col].iloc[0]), ls=ls, color="0.35", lw=0.9, label=name)
    ax.set_xlabel("δ (TVD)")
    ax.set_ylabel("τ (+bonus token)" if speed else metric)


def plot_quality_sweep(frame: pd.DataFrame, path: str | Path, extractors: Optional[Sequence[str]] = None,
                       panels: Sequence[str] = DEFAULT_PANELS) -> list[Path]:
    """τ and ``panels`` metrics (per extractor) vs δ from a :func:`sweep_frame`. Returns the files."""
    extractors = list(extractors or [e for e in dict.fromkeys(frame["extractor"]) if e])
    metrics = [f"{m}_{e}" for e in extractors for m in panels if f"{m}_{e}" in set(frame["metric"])]
    n = 1 + len(metrics)
    ncol = min(n, 4)
    nrow = int(np.ceil(n / ncol))
    with plots.style():
        fig, axes = plots.new_figure(nrow, ncol, width=1.9 * ncol, height=1.8 * nrow, squeeze=False)
        flat = axes.ravel()
        _panel(flat[0], frame, "", speed=True)
        for ax, m in zip(flat[1:], metrics):
            _panel(ax, frame, m, speed=False)
        for ax in flat[n:]:
            ax.set_visible(False)
        flat[1 if n > 1 else 0].legend(loc="best", fontsize=6)
        return plots.save_figure(fig, path)
