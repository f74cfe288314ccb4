"""Report items: one figure or table per paper item, with the published values next to ours.

An :class:`Item` is what an experiment returns: its tables (``ours``, ``published`` and any
extra), the figures it drew, the settings that decided the numbers and notes. :func:`save_item`
writes each table as CSV + Markdown under ``<run>/<item>/`` and keeps the item as a checked part
of the run (so a resumed run does not recompute it); :func:`write_report` assembles
``report.md`` from every finished item.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from ambiguity.io import atomic_path
from ambiguity.runs import Part, RunDir

__all__ = ["Item", "compact", "markdown_table", "save_item", "load_item", "item_of", "item_unit", "write_report"]


@dataclass
class Item:
    """One paper item. name: short key (``"fig2a"``); title: what it shows (with the paper's
    figure/table number); tables: {"ours": ..., "published": ..., ...} DataFrames; figures:
    PNG paths relative to the run directory (a PDF sits next to each); settings: what decided
    the numbers; notes: caveats (quick mode, mapped k, cells that are not available); seconds:
    wall time of computing it (decoding sessions included when it was the first to need them;
    None when unknown)."""

    name: str
    title: str
    tables: dict = field(default_factory=dict)
    figures: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    seconds: Optional[float] = None


def compact(df: pd.DataFrame, digits: int = 4) -> pd.DataFrame:
    """The table as the report shows it: ``x`` with ``x_lo``/``x_hi`` (or ``x_q25``/``x_q75``) as
    one cell ``"x [lo, hi]"``, numbers to ``digits`` significant digits, internal (``name``) and
    empty columns dropped. The CSV next to it keeps every column."""
    out = df.drop(columns=[c for c in ("name",) if c in df.columns])
    out = out[[c for c in out.columns if not out[c].isna().all()]]
    num = lambda v: "" if v is None or pd.isna(v) else (f"{v:.{digits}g}" if isinstance(v, float) else str(v))
    for c in list(out.columns):
        for lo, hi in ((f"{c}_lo", f"{c}_hi"), (f"{c}_q25", f"{c}_q75")):
            if lo in out.columns and hi in out.columns:
                out[c] = [
                    num(v) if pd.isna(a) or pd.isna(b) else f"{num(v)} [{num(a)}, {num(b)}]"
                    for v, a, b in zip(out[c], out[lo], out[hi])
                ]
                out = out.drop(columns=[lo, hi])
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c]):
            out[c] = [num(v) for v in out[c]]
    return out


def markdown_table(df: pd.DataFrame, digits: int = 4) -> str:
    """A DataFrame as a GitHub Markdown table (:func:`compact`)."""
    if df is None or not len(df):
        return "_(empty)_"
    return compact(df, digits).to_markdown(index=False)


def save_item(run: RunDir, item: Item) -> None:
    """Write the item's tables (CSV + Markdown) and keep the item as the part ``item_<name>``."""
    folder = run.path / item.name
    folder.mkdir(parents=True, exist_ok=True)
    for key, df in item.tables.items():
        with atomic_path(folder / f"{item.name}_{key}.csv") as tmp:
            df.to_csv(tmp, index=False)
        with atomic_path(folder / f"{item.name}_{key}.md") as tmp:
            tmp.write_text(markdown_table(df) + "\n")
    tables = {k: _parquet_safe(v) for k, v in item.tables.items()}
    run.write_part(
        *item_unit(item.name),
        tables=tables,
        meta={
            "title": item.title,
            "figures": list(item.figures),
            "settings": _plain(item.settings),
            "notes": list(item.notes),
            "seconds": item.seconds,
        },
    )


def item_unit(name: str) -> tuple[str, dict]:
    """Name and content of the part that keeps the item ``name``."""
    return f"item_{name}", {"item": name}


def load_item(run: RunDir, name: str) -> Optional[Item]:
    """The finished item ``name`` (None when it was not computed, or its part is damaged)."""
    return item_of(run, run.read_part(*item_unit(name)))


def item_of(run: RunDir, part: Optional[Part]) -> Optional[Item]:
    """The item kept in ``part`` (None for no part, or when one of its figure files is missing)."""
    if part is None:
        return None
    name, m = part.holds["item"], part.meta
    if any(not (run.path / f).is_file() for f in m.get("figures", [])):
        return None  # a figure file is missing: draw the item again
    return Item(
        name, m["title"], dict(part.tables), list(m["figures"]), dict(m["settings"]), list(m["notes"]), m.get("seconds")
    )


def write_report(path: Path, items: Sequence[Item], header: str, settings: dict) -> Path:
    """``report.md``: the header, every item (figures, our table, the published values, settings,
    notes) and the run's settings."""
    lines = [header, ""]
    for it in items:
        lines += [f"## {it.title}", ""]
        lines += [f"![{it.name}]({f})" for f in it.figures] + ([""] if it.figures else [])
        for key, df in it.tables.items():
            label = {"ours": "Ours", "published": "Published"}.get(key, key.replace("_", " ").capitalize())
            lines += [f"**{label}**", "", markdown_table(df), ""]
        if "published" not in it.tables:
            lines += ["**Published**: not published as numbers (see notes).", ""]
        if it.settings:
            lines += ["Settings: " + "; ".join(f"{k} = {_fmt(v)}" for k, v in it.settings.items()), ""]
        lines += [f"- {n}" for n in it.notes] + ([""] if it.notes else [])
    lines += ["## Run settings", "", "```json", json.dumps(_plain(settings), indent=2), "```", ""]
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines))
    return path


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x) for x in v)
    return str(v)


def _plain(x):
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.floating, np.integer, np.bool_)):
        return x.item()
    return x


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Object columns of mixed types as strings (Parquet wants one type per column)."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            out[c] = out[c].map(lambda v: None if v is None or (isinstance(v, float) and np.isnan(v)) else str(v))
    return out
