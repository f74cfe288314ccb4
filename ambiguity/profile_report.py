"""Outputs of ``python -m ambiguity.profile``: figures, the final table and summary, the printed table.

Files under ``--out`` (each written atomically; ``summary.json`` last, so its presence means
the run is complete):

* ``tokens.parquet``: one row per (image, token position); see :func:`ambiguity.profile.batch_table`.
* ``summary.json``: means and quantiles, token count, model facts, settings, seed, versions, wall time.
* ``top1_distribution.{png,pdf}``: histograms of top-1 probability and top-10 mass, guided vs
  conditional-only (LANTERN Fig. 2 style).
* ``top1_by_position.{png,pdf}``: mean top-1 probability at each position of the token grid.
* ``images.{png,pdf}``: the generated images (or VQ reconstructions of the real ones).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from ambiguity import plots
from ambiguity.io import atomic_path, write_json, write_table
from ambiguity.models.base import TokenModel

__all__ = [
    "plot_distributions",
    "plot_position_means",
    "plot_images",
    "write_outputs",
    "format_summary",
    "print_summary",
    "TABLE_FILE",
    "SUMMARY_FILE",
    "FIGURES",
    "OUTPUTS",
]

TABLE_FILE, SUMMARY_FILE = "tokens.parquet", "summary.json"
FIGURES = ("top1_distribution", "top1_by_position", "images")
OUTPUTS = (TABLE_FILE, SUMMARY_FILE, "samples.txt") + tuple(f"{f}.{x}" for f in FIGURES for x in ("png", "pdf"))

_DISTS = (("guided", "guided"), ("cond", "conditional-only"))


def _settings_line(summary: dict) -> str:
    s = summary["sampling"]
    parts = [
        summary["model"]["model"],
        "real images (teacher-forced)" if summary["source"] == "dataset" else "generated",
        f"cfg {s['guidance']:g}",
        f"temperature {s['temperature']:g}" if s["temperature"] else "greedy",
    ]
    if s["top_k"]:
        parts.append(f"top-k {s['top_k']}")
    if s["top_p"] < 1:
        parts.append(f"top-p {s['top_p']:g}")
    return ", ".join(parts)


def _guided(summary: dict) -> bool:
    return summary["sampling"]["guidance"] != 1.0


def plot_distributions(table, summary: dict):
    """Figure: histograms of top-1 probability (left) and top-10 mass (right), guided vs conditional-only.

    With cfg 1 the two distributions are identical and only the guided one is drawn.
    Returns a matplotlib Figure (6.8 x 2.4 in, two panels).
    """
    with plots.style():
        fig, axes = plots.new_figure(1, 2, width=6.8, height=2.4)
        for ax, stat, label in zip(axes, ("top1", "top10"), ("top-1 probability", "top-10 mass")):
            dists = _DISTS if _guided(summary) else _DISTS[:1]
            samples = {name: table[f"{d}_{stat}"].to_numpy() for d, name in dists}
            plots.histograms(samples, ax=ax, xlabel=label)
        fig.suptitle(_settings_line(summary) + ("" if _guided(summary) else " (no guidance: guided = conditional)"))
    return fig


def plot_position_means(table, grid: tuple[int, int], summary: dict):
    """Figure: mean top-1 probability at each token position, as an (h, w) heatmap per distribution.

    For a one-row grid (text models) a line over positions instead. Returns a Figure.
    """
    h, w = grid
    dists = _DISTS if _guided(summary) else _DISTS[:1]
    means = {name: table.groupby("position")[f"{d}_top1"].mean().reindex(range(h * w)).to_numpy() for d, name in dists}
    with plots.style():
        if h == 1:
            fig, ax = plots.new_figure(width=4.0, height=2.4)
            for i, (name, m) in enumerate(means.items()):
                ax.plot(np.arange(w), m, color=plots.color_for(name, i), label=name)
            ax.set_xlabel("token position")
            ax.set_ylabel("mean top-1 probability")
            ax.legend()
        else:
            lo = float(np.nanmin([np.nanmin(m) for m in means.values()]))
            hi = float(np.nanmax([np.nanmax(m) for m in means.values()]))
            fig, axes = plots.new_figure(1, len(means), width=3.2 * len(means), height=2.8, squeeze=False)
            for ax, (name, m) in zip(axes[0], means.items()):
                plots.grid_heatmap(
                    m.reshape(h, w), ax=ax, title=f"{name}", cbar_label="mean top-1 probability", vmin=lo, vmax=hi
                )
        fig.suptitle(_settings_line(summary))
    return fig


def plot_images(model: TokenModel, table, summary: dict, max_images: int | None = None):
    """Figure: a grid of the profiled images, decoded from their tokens with ``model.decode_codes``.

    Shows the first ``max_images`` (default 64 for images up to 64 px, else 16) with their
    condition as title. Raises NotImplementedError when the model cannot decode.
    """
    h, w = model.grid
    C, H, W = model.image_shape
    if max_images is None:
        max_images = 64 if max(H, W) <= 64 else 16
    n = int(min(max_images, summary["images"]))
    sub = table[table["image"] < n].sort_values(["image", "position"])
    codes = torch.tensor(sub["token"].to_numpy(), dtype=torch.long).view(n, h, w).to(model.device)
    pix = torch.cat([model.decode_codes(codes[i : i + 16]).float().cpu() for i in range(0, n, 16)])
    titles = sub.groupby("image", sort=True)["condition"].first().tolist()
    title = _settings_line(summary) + (" (VQ reconstructions)" if summary["source"] == "dataset" else "")
    return plots.image_grid(
        pix, ncol=8 if n > 16 else 4, titles=titles, title=title, cell=0.6 if max(H, W) <= 64 else 1.2
    )


def write_outputs(
    model: TokenModel, table, summary: dict, out: str | Path, figures: bool = True, started: float | None = None
) -> tuple[list[Path], list[str]]:
    """Write figures, ``tokens.parquet`` and (last) ``summary.json`` under ``out``, each atomically.

    Returns (written paths, notes), a note for each figure that was skipped (e.g. a model
    that cannot decode tokens to pixels, or ``figures=False``). ``summary["files"]`` lists the
    written file names; with ``started`` (a ``time.perf_counter()`` value) ``summary["wall_time_s"]``
    becomes the seconds from then until the summary is written.
    """
    out = Path(out)
    files: list[Path] = []
    notes: list[str] = []
    if figures:
        files += _write_figures(model, table, summary, out, notes)
    else:
        notes.append("figures skipped (--no-figures)")
    files.append(write_table(table, out / TABLE_FILE))
    summary["files"] = sorted(p.name for p in files) + [SUMMARY_FILE]
    summary["notes"] = notes
    if started is not None:
        summary["wall_time_s"] = round(time.perf_counter() - started, 3)
    files.append(write_json(summary, out / SUMMARY_FILE))
    return files, notes


def _write_figures(model: TokenModel, table, summary: dict, out: Path, notes: list[str]) -> list[Path]:
    files: list[Path] = []
    files += plots.save_figure(plot_distributions(table, summary), out / "top1_distribution")
    files += plots.save_figure(plot_position_means(table, model.grid, summary), out / "top1_by_position")
    if model.kind == "text":
        files += _write_text_samples(model, table, out, notes)
    elif model.can_decode:
        try:
            files += plots.save_figure(plot_images(model, table, summary), out / "images")
        except NotImplementedError as exc:
            notes.append(f"images.png skipped: {exc}")
    else:
        notes.append(f"images.png skipped: {model.name} cannot decode tokens to pixels (no VQ decoder weights)")
    return files


def _write_text_samples(model: TokenModel, table, out: Path, notes: list[str], max_samples: int = 16) -> list[Path]:
    """Text models have no images: write the first passages, detokenised, to ``samples.txt``."""
    if not hasattr(model, "decode"):
        notes.append(f"no images for the text model {model.name}, and it has no detokeniser for samples.txt")
        return []
    first = sorted(table["image"].unique())[:max_samples]
    rows = table[table["image"].isin(first)].sort_values(["image", "position"])
    seqs = [torch.tensor(g["token"].to_numpy(), dtype=torch.long) for _, g in rows.groupby("image", sort=True)]
    texts = model.decode(torch.stack(seqs)) if seqs else []
    path = out / "samples.txt"
    with atomic_path(path) as tmp:
        Path(tmp).write_text("".join(f"--- passage {i} ---\n{t}\n" for i, t in zip(first, texts)))
    return [path]


_ROWS = (
    ("top1", "top-1 probability", "{:.3f}"),
    ("top10", "top-10 mass", "{:.3f}"),
    ("entropy", "entropy (nats)", "{:.3f}"),
    ("chosen_prob", "chosen-token probability", "{:.3f}"),
    ("chosen_rank", "chosen-token rank", "{:.1f}"),
)


def format_summary(summary: dict) -> str:
    """The compact table printed at the end of a run: mean and median of every statistic,
    guided and conditional-only, plus the share of chosen tokens that were the top-1 token."""
    st = summary["stats"]
    m = summary["model"]
    head = (
        f"{m['model']} ({m['kind']}, {'x'.join(map(str, m['grid']))} tokens, {m['vocab_size']} codes): "
        f"{summary['images']} images, {summary['tokens']} tokens; {_settings_line(summary).split(', ', 1)[1]}"
    )
    lines = [
        head,
        f"{'':26s}{'guided':>17s}{'conditional-only':>20s}",
        f"{'':26s}{'mean':>9s}{'median':>8s}{'mean':>12s}{'median':>8s}",
    ]
    for key, label, fmt in _ROWS:
        g, c = st[f"guided_{key}"], st[f"cond_{key}"]
        lines.append(
            f"{label:26s}{fmt.format(g['mean']):>9s}{fmt.format(g['median']):>8s}"
            f"{fmt.format(c['mean']):>12s}{fmt.format(c['median']):>8s}"
        )
    lines.append(
        f"{'chosen token is top-1':26s}{st['guided_chosen_is_top1']['mean']:>9.3f}{'':8s}"
        f"{st['cond_chosen_is_top1']['mean']:>12.3f}"
    )
    b = summary["batches"]
    lines.append(f"wall time {summary['wall_time_s']:.1f} s ({b['computed']} batches computed, {b['resumed']} resumed)")
    return "\n".join(lines)


def print_summary(summary: dict, out: str | Path, files: list[Path], notes: list[str]) -> None:
    """Print :func:`format_summary`, any notes, and where the files went (stdout)."""
    print(format_summary(summary))
    for n in notes:
        print(f"note: {n}")
    names = sorted({p.name for p in files})
    print(f"wrote {Path(out)}/: " + ", ".join(names))
