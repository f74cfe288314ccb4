"""Outputs of drafter training: the test accuracy per epoch as a figure (LANTERN Fig. 2b's
top-1, with the paper's drafters as reference lines) and as a text table."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ambiguity import plots
from ambiguity.io import read_table
from lantern.drafter.objective import KS

__all__ = ["PAPER_TOP1", "plot_accuracy", "plot_topk_curves", "summary"]

# LANTERN (arXiv 2410.03355) Sec. 3 / Fig. 2b: top-1 test accuracy of EAGLE drafters.
PAPER_TOP1 = {"LlamaGen (paper)": 0.3880, "Anole (paper)": 0.2760}


def plot_accuracy(table, path: str | Path, title: str = "", references: Optional[dict] = None) -> list[Path]:
    """Top-1/2/3 test accuracy (%) per epoch (epoch 0 = random init) as PNG (200 dpi) + PDF.

    ``table``: a DataFrame from :func:`train_drafter` (or the Parquet path). ``references``:
    label -> top-1 fraction drawn as dashed lines (default :data:`PAPER_TOP1`; ``{}`` for none).
    Returns the written paths.
    """
    df = read_table(table) if isinstance(table, (str, Path)) else table
    refs = PAPER_TOP1 if references is None else references
    with plots.style():
        fig, ax = plots.new_figure(width=4.2, height=3.0)
        plot_topk_curves(ax, df, markersize=3)
        for (label, value), style in zip(refs.items(), ("--", ":", "-.")):
            ax.axhline(100 * value, color="0.45", ls=style, lw=0.9, label=f"{label} top-1")
        ax.set_xticks(list(df["epoch"]))
        ax.set_xticklabels(["init" if e == 0 else str(e) for e in df["epoch"]])
        ax.set_xlabel("epoch")
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_title(title or "Drafter test accuracy (target top-1 in drafter top-k)", fontsize=9)
        ax.legend(fontsize=7, loc="best")
        return plots.save_figure(fig, Path(path))


def plot_topk_curves(ax, table, markersize: float) -> None:
    """Draw the top-1/2/3 (:data:`~lantern.drafter.objective.KS`) test accuracy (%) per epoch of a
    training table (a DataFrame with ``epoch`` and ``top1``, ``top2``, ``top3`` fractions) on the
    matplotlib axes ``ax``: one line with round markers of ``markersize`` points per k, labelled
    ``top-k``. Raises KeyError when a column is missing."""
    for i, k in enumerate(KS):
        ax.plot(
            table["epoch"],
            100 * table[f"top{k}"],
            marker="o",
            markersize=markersize,
            color=plots.color_for(f"top-{k}", i),
            label=f"top-{k}",
        )


def summary(table) -> str:
    """The accuracy table as text: epoch, top-1/2/3 (%), test CE (nats), train loss, seconds."""
    df = table.copy()
    for k in KS:
        df[f"top-{k} %"] = (100 * df[f"top{k}"]).round(2)
    df["test CE"] = df["test_ce"].round(3)
    df["train loss"] = [f"{v:.4f}" if v == v else "-" for v in df["train_loss"]]  # before training: none
    df["s"] = df["seconds"].round(0).astype(int)
    df["epoch"] = ["init" if e == 0 else str(e) for e in df["epoch"]]
    return df[["epoch", "top-1 %", "top-2 %", "top-3 %", "test CE", "train loss", "s"]].to_string(index=False)


# --------------------------------------------------------------------------- CLI
