"""Tables of evaluation results: one row per run with ``value [lo, hi]`` cells, speed beside
quality, paired differences to a baseline run, and flat rows for sweep tables.

Inputs are the long metric frames of :func:`lantern.evaluate.evaluate_runs` (columns run, label,
metric, extractor, value, ci_low, ci_high, n, bootstrap) and its record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np
import pandas as pd

from lantern.quality.scoring import paired_differences

__all__ = ["paired_table", "wide_table", "speed_quality_table", "flat_scores", "SPEED"]


def paired_table(df: pd.DataFrame, boot: dict, base: str, level: float = 0.95) -> pd.DataFrame:
    """Differences of every set's metrics to the set ``base`` (a spec) with paired bootstrap
    jackknife intervals (:func:`lantern.quality.scoring.paired_differences`); sets of another n are left out.
    Columns: run, label, baseline, metric, diff, ci_low, ci_high, p_greater, n."""
    rows = []
    b = df[df["run"] == base].set_index("metric")
    for (run, label), sub in df[df["run"] != base].groupby(["run", "label"], sort=False):
        for r in sub.to_dict(orient="records"):
            m = r["metric"]
            if m not in b.index or int(b.loc[m, "n"]) != int(r["n"]):
                continue
            d = paired_differences(
                {"value": b.loc[m, "value"], "resamples": boot[base].get(m, [])},
                {"value": r["value"], "resamples": boot[run].get(m, [])},
                level,
            )
            rows.append({"run": run, "label": label, "baseline": base, "metric": m, **d, "n": int(r["n"])})
    return pd.DataFrame(rows)


def _cell(r) -> str:
    v, lo, hi = r["value"], r["ci_low"], r["ci_high"]
    fmt = (lambda z: f"{z:.4f}") if abs(v) < 10 else (lambda z: f"{z:.2f}")
    return fmt(v) + (f" [{fmt(lo)}, {fmt(hi)}]" if np.isfinite(lo) else "")


def wide_table(df: pd.DataFrame, metrics: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """One row per run (label), one column per metric (all, or those whose name starts with one
    of ``metrics``), cells ``value [lo, hi]``, and n."""
    if metrics is not None:
        df = df[[any(m.startswith(k + "_") or m == k for k in metrics) for m in df["metric"]]]
    cells = df.assign(cell=[_cell(r) for r in df.to_dict(orient="records")])
    wide = cells.pivot_table(index="label", columns="metric", values="cell", aggfunc="first", sort=False)
    wide.insert(0, "n", cells.groupby("label", sort=False)["n"].max())
    return wide[["n"] + [c for c in dict.fromkeys(df["metric"]) if c in wide.columns]]


SPEED = {"acceptance_rate": "α", "tau": "τ", "tokens_per_forward": "tok/fwd"}


def speed_quality_table(
    df: pd.DataFrame, record: dict, metrics: Sequence[str] = ("fid", "kid", "precision", "recall")
) -> pd.DataFrame:
    """Speed next to quality: per run, acceptance rate α, τ (bonus counted) and step compression
    from its summary, then ``metrics`` of every extractor (cells ``value [lo, hi]``)."""
    wide = wide_table(df, metrics)
    speed = {r["label"]: r.get("speed") or {} for r in record["runs"]}
    for i, (key, short) in enumerate(SPEED.items()):
        wide.insert(1 + i, short, [speed.get(lab, {}).get(key, np.nan) for lab in wide.index])
    return wide


def flat_scores(scores: dict) -> dict:
    """:func:`score_images` output -> one flat row: ``{metric: value, metric_lo: ..., metric_hi: ...}``
    (for a sweep table such as ``benchmarks/results/decoding.parquet``)."""
    row = {}
    for name, v in scores.items():
        if isinstance(v, dict) and "value" in v:
            row[name], row[f"{name}_lo"], row[f"{name}_hi"] = v["value"], v["ci_low"], v["ci_high"]
    return row
