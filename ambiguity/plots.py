"""Figure helpers shared by every CLI of the toolkit: one style, image grids, PNG + PDF output.

Figures are built on :class:`matplotlib.figure.Figure` objects, not through ``pyplot``, so
nothing here changes the user's backend (headless runs need no display; in Jupyter a returned
figure still renders inline) and no global ``rcParams`` are touched: the house style is applied
with :func:`style` as a context manager while a figure is drawn and saved.

Typical use::

    from ambiguity import plots
    with plots.style():
        fig, ax = plots.new_figure()
        plots.histograms({"guided": x, "conditional": y}, ax=ax, xlabel="top-1 probability")
        plots.save_figure(fig, out / "top1")          # -> top1.png, top1.pdf
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from ambiguity.io import atomic_path

__all__ = [
    "STYLE",
    "PALETTE",
    "style",
    "new_figure",
    "save_figure",
    "image_grid",
    "histograms",
    "grid_heatmap",
    "color_for",
    "METHOD_COLORS",
    "method_color",
    "series_colors",
    "binned_rates",
    "interval_note",
    "mark_quick",
    "QUICK_MARK",
]

QUICK_MARK = "QUICK MODE: a handful of images per measurement; shows that the pipeline runs, not the real measurement"

# Paper-ready defaults: small fonts at 1:1 size for a single column (~3.3 in), TrueType fonts in PDFs.
STYLE: dict = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.2,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "axes.edgecolor": ".15",
    "axes.labelcolor": ".15",
    "text.color": ".15",
    "xtick.color": ".15",
    "ytick.color": ".15",
    "xtick.direction": "out",
    "ytick.direction": "out",
    "axes.grid": False,
    "axes.facecolor": "white",
    "figure.facecolor": "white",
    "axes.axisbelow": True,
    "font.family": ["sans-serif"],
    "font.sans-serif": ["DejaVu Sans", "Arial", "Liberation Sans", "sans-serif"],
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02,
    "figure.dpi": 100,
    "image.cmap": "viridis",
}

# Fixed colours for the quantities that recur across figures (seaborn's colour-blind palette).
PALETTE: dict[str, str] = {
    "guided": "#0173b2",
    "conditional": "#de8f05",
    "conditional-only": "#de8f05",
    "unconditional": "#029e73",
    "random": "#949494",
    "neighbourhood": "#cc78bc",
    "target": "#0173b2",
    "drafter": "#d55e00",
}
_CYCLE = ["#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494", "#ece133", "#56b4e9"]


def color_for(name: str, index: int = 0) -> str:
    """The house colour of a named quantity (see :data:`PALETTE`), else the ``index``-th cycle colour."""
    return PALETTE.get(name, _CYCLE[index % len(_CYCLE)])


# One fixed colour per decoding method, the same in every panel, figure and model (colour-blind
# palette plus two darker tones; the drafter families in blues / oranges, the Jacobi methods in
# green / purples, AR dark grey).
METHOD_COLORS: dict[str, str] = {
    "ar": "#4d4d4d",
    "profile": "#949494",
    "sd": "#56b4e9",
    "eagle-2": "#0173b2",
    "lantern": "#d55e00",
    "lantern-jsd": "#ca9161",
    "lantern++": "#de8f05",
    "sjd": "#029e73",
    "gsd": "#cc78bc",
    "scd": "#6a3d9a",
    "cool-sd": "#a6761d",
    "fly": "#fbafe4",
    "entropy-sd": "#66a61e",
    "sjd-pac": "#00441b",
    "zipar": "#e7298a",
    "pjd": "#7570b3",
}


def method_color(method: str) -> str:
    """The fixed colour of a decoding method (:data:`METHOD_COLORS`; ``"ar"``, ``"sd"``, ``"eagle-2"``,
    ``"lantern"``, ``"lantern-jsd"``, ``"lantern++"``, ``"sjd"``, ``"gsd"``, ``"scd"``, ``"profile"``);
    an unknown name gets a grey (``"#bbbbbb"``)."""
    return METHOD_COLORS.get(method, "#bbbbbb")


def series_colors(labels: Sequence[str]) -> dict[str, str]:
    """One colour per series label, for runs labelled by method and settings (e.g. ``"sd"``,
    ``"lantern k=64 δ=0.2"``): the :func:`method_color` of the method the label starts with (its
    first word) when no other label starts with the same method; otherwise (two LANTERN runs with
    different k, or an unknown method) the house cycle colours not taken, in label order."""
    labels = list(dict.fromkeys(labels))
    first = [str(lab).split(" ", 1)[0] for lab in labels]
    out = {lab: METHOD_COLORS[m] for lab, m in zip(labels, first) if m in METHOD_COLORS and first.count(m) == 1}
    spare = [c for c in _CYCLE if c not in out.values()] or _CYCLE
    for i, lab in enumerate(lab for lab in labels if lab not in out):
        out[lab] = spare[i % len(spare)]
    return out


def binned_rates(
    ax,
    bins,
    counts_ax=None,
    order: Optional[Sequence[str]] = None,
    colors: Optional[Mapping[str, str]] = None,
    min_count: int = 0,
    dodge: float = 0.12,
    series: str = "method",
    x: str = "mid",
    rate: str = "acceptance_rate",
    low: str = "ci_low",
    high: str = "ci_high",
    count: str = "drafts",
) -> dict:
    """A rate per bin with its interval, one series per method: points with asymmetric error bars
    ``[low, high]``, joined within a series, and optionally the count of each bin on ``counts_ax``.

    Args:
        ax: the Axes of the rates (its y range is set to [0, 1.02]: rates are probabilities).
        bins: tidy DataFrame, one row per (series, bin): columns ``series`` (the label, e.g. the
            method), ``x`` (bin centre), ``rate`` (the bin's rate, e.g. the acceptance rate of its
            reached drafts), ``low`` / ``high`` (its interval, ``low <= rate <= high``; NaN for an
            empty bin), ``count`` (the bin's trials, e.g. its reached drafts).
        counts_ax: an Axes (typically below ``ax``, sharing its x range) for the counts per bin,
            drawn as joined points in the series' colours; None draws no counts.
        order: the series to draw, in this order (default: every series in order of first appearance).
        colors: label -> colour (default :func:`method_color` of the label).
        min_count: bins with fewer than ``min_count`` trials are left out (and their counts too).
        dodge: shift between neighbouring series as a fraction of the bin width (the smallest gap
            between bin centres; 0.1 with a single bin), so that bars in one bin do not overlap.
    Returns {label: :class:`matplotlib.container.ErrorbarContainer`}, each carrying its label for a
    legend (drawn even when none of the series' bins is left, so the legend names every series).
    Raises ValueError naming the columns ``bins`` lacks.
    """
    missing = [c for c in (series, x, rate, low, high, count) if c not in bins.columns]
    if missing:
        raise ValueError(f"bins lacks the column(s) {', '.join(missing)}")
    labels = list(dict.fromkeys(bins[series])) if order is None else list(order)
    centres = np.unique(bins[x].to_numpy(dtype=float))
    centres = centres[np.isfinite(centres)]
    width = float(np.diff(centres).min()) if len(centres) > 1 else 0.1
    drawn = {}
    for j, lab in enumerate(labels):
        b = bins[(bins[series] == lab) & (bins[count] >= min_count)].sort_values(x)
        xs = b[x].to_numpy(dtype=float) + (j - (len(labels) - 1) / 2) * dodge * width
        r = b[rate].to_numpy(dtype=float)
        err = np.vstack([r - b[low].to_numpy(dtype=float), b[high].to_numpy(dtype=float) - r]) if len(b) else None
        color = colors[lab] if colors is not None else method_color(lab)
        drawn[lab] = ax.errorbar(
            xs, r, yerr=err, marker="o", ms=2.5, capsize=1.5, lw=0.9, elinewidth=0.6, label=lab, color=color
        )
        if counts_ax is not None:
            counts_ax.plot(xs, b[count].to_numpy(), marker="o", ms=2, lw=0.8, color=color)
    ax.set_ylim(0, 1.02)
    return drawn


@contextlib.contextmanager
def style() -> Iterator[None]:
    """Context manager applying :data:`STYLE` without leaking rcParams.

    The look is seaborn's "ticks" style, spelled out as rcParams so that drawing a figure does
    not pay seaborn's import time (seconds on a busy CPU); seaborn plotting functions can be
    used on the axes of :func:`new_figure` as usual.
    """
    import matplotlib

    with matplotlib.rc_context(STYLE):
        yield


def new_figure(nrows: int = 1, ncols: int = 1, width: float = 3.3, height: float = 2.4, **subplot_kw):
    """A headless figure with an ``nrows x ncols`` grid of axes; size in inches.

    Returns ``(fig, ax)`` with ``ax`` a single Axes for 1 x 1, else a numpy array of Axes
    (``squeeze`` as in matplotlib). Call inside :func:`style` for the house look.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, **subplot_kw)
    return fig, axes


# no creation date in the files: a regenerated figure is byte-identical when nothing changed
_METADATA = {"png": {"Creator": "lantern-ambiguity"}, "pdf": {"Creator": "lantern-ambiguity", "CreationDate": None}}


def save_figure(fig, path: str | Path, formats: Sequence[str] = ("png", "pdf"), dpi: int = 200) -> list[Path]:
    """Write ``fig`` as ``<path>.png`` and ``<path>.pdf`` (suffix of ``path`` ignored), atomically.

    Each file appears under its final name only once complete (:func:`ambiguity.io.atomic_path`).
    Returns the written paths. Raises OSError when the directory is not writable.
    """
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (".png", ".pdf", ".svg") else path
    written = []
    with style():
        for fmt in formats:
            target = stem.with_name(f"{stem.name}.{fmt}")
            with atomic_path(target) as tmp:
                fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight", pad_inches=0.02, metadata=_METADATA.get(fmt))
            written.append(target)
    return written


def interval_note(ax, values, lo, hi, y: float = 0.06) -> Optional[str]:
    """Say on the panel why its interval bars do not show: every interval of zero width (each
    jackknife resample gave the same value, e.g. recall 1 at small n) or none finite (too few
    images). values, lo, hi: sequences of the plotted points; y: height of the text's bottom in
    axes units. Returns the text written, or None."""
    v, a, b = (np.asarray(x, dtype=float) for x in (values, lo, hi))
    shown = np.isfinite(v)
    if not shown.any():
        return None
    if not (np.isfinite(a) & np.isfinite(b))[shown].any():
        text = "no intervals: too few images"
    elif np.all(np.abs(b - a)[shown & np.isfinite(a) & np.isfinite(b)] < 1e-12):
        text = "intervals of zero width: every jackknife\nresample gives the same value"
    else:
        return None
    ax.text(0.5, y, text, transform=ax.transAxes, ha="center", va="bottom", fontsize=5.5, color="0.35")
    return text


def mark_quick(fig, text: str = QUICK_MARK) -> None:
    """Write ``text`` in red across the top of ``fig``, above its title (a figure of a ``--quick`` run)."""
    fig.text(0.5, 1.0, text, ha="center", va="bottom", fontsize=6.5, color="#c0392b", fontweight="bold")


def _as_numpy_images(images) -> np.ndarray:
    """(B, C, H, W) tensor/array in [0, 1], C in {1, 3} -> (B, H, W, C) float numpy, clipped."""
    x = images.detach().float().cpu().numpy() if hasattr(images, "detach") else np.asarray(images, dtype=np.float32)
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"images must be (B, C, H, W) with C in {{1, 3}}, got shape {tuple(x.shape)}")
    return np.clip(x.transpose(0, 2, 3, 1), 0.0, 1.0)


def image_grid(
    images,
    ncol: int = 8,
    row_labels: Optional[Sequence[str]] = None,
    titles: Optional[Sequence[str]] = None,
    title: Optional[str] = None,
    cell: float = 0.6,
    label_width: float = 0.9,
    gap: float = 0.03,
):
    """A grid figure of images, filled row by row, drawn as one mosaic (fast for hundreds of images).

    Args:
        images: (B, C, H, W) float tensor or array in [0, 1]; C = 1 (shown in grey) or 3.
        ncol: images per row; the number of rows is ``ceil(B / ncol)``.
        row_labels: one text per row, written left of the row (e.g. class names).
        titles: one short text per image, written above it (cut to fit the cell width).
        title: figure title (e.g. the sampling settings).
        cell: width of one image in inches; label_width: inches reserved for row labels;
        gap: white space between images in inches.
    Returns a :class:`matplotlib.figure.Figure`. Raises ValueError for a bad shape or for a
    number of row labels that does not match the rows.
    """
    from matplotlib.figure import Figure

    x = _as_numpy_images(images)
    B, H, W, C = x.shape
    ncol = max(1, min(int(ncol), B))
    nrow = math.ceil(B / ncol)
    if row_labels is not None and len(row_labels) != nrow:
        raise ValueError(f"{len(row_labels)} row labels for {nrow} rows")
    inch = cell / W  # inches per pixel
    g = max(1, int(round(gap / inch)))  # gap in pixels
    t = int(math.ceil(0.12 / inch)) if titles is not None else 0  # room above each image for a title
    canvas = np.ones((nrow * (H + t + g) - g, ncol * (W + g) - g, 3), dtype=np.float32)
    for i in range(B):
        r, c = divmod(i, ncol)
        y0, x0 = r * (H + t + g) + t, c * (W + g)
        canvas[y0 : y0 + H, x0 : x0 + W] = x[i] if C == 3 else x[i][..., :1]
    left = label_width if row_labels is not None else 0.0
    top = 0.3 if title else 0.0
    fig_w, fig_h = canvas.shape[1] * inch + left, canvas.shape[0] * inch + top
    with style():
        fig = Figure(figsize=(fig_w, fig_h))
        ax = fig.add_axes((left / fig_w, 0.0, 1 - left / fig_w, 1 - top / fig_h))
        ax.imshow(canvas, interpolation="nearest", aspect="equal")
        ax.set_axis_off()
        if titles is not None:
            fit = max(3, int(cell / 0.045))  # characters of a 5 pt font that fit in one cell
            for i in range(B):
                r, c = divmod(i, ncol)
                text = str(titles[i])
                text = text if len(text) <= fit else text[: fit - 1] + "…"
                ax.text(
                    c * (W + g) + W / 2,
                    r * (H + t + g) + t - 0.5,
                    text,
                    ha="center",
                    va="bottom",
                    fontsize=5,
                    clip_on=False,
                )
        if row_labels is not None:
            for r, label in enumerate(row_labels):
                ax.text(
                    -2 * g, r * (H + t + g) + t + H / 2, str(label), ha="right", va="center", fontsize=7, clip_on=False
                )
        if title:
            fig.text(0.5, 1 - 0.05 / fig_h, title, ha="center", va="top", fontsize=8)
    return fig


def histograms(
    samples: Mapping[str, np.ndarray],
    ax=None,
    xlabel: str = "",
    bins: int = 50,
    value_range: tuple[float, float] | None = (0.0, 1.0),
    density: bool = True,
    show_mean: bool = True,
):
    """Overlaid step histograms of several samples, in the house colours, with dashed mean lines.

    Args:
        samples: name -> 1-D array of values (e.g. ``{"guided": ..., "conditional": ...}``).
        ax: Axes to draw on (a new 3.3 x 2.4 in figure when None).
        bins / value_range: shared bins so the curves are comparable; density: normalise to area 1.
    Returns the Axes. The legend shows each sample's mean.
    """
    if ax is None:
        _, ax = new_figure()
    arrays = {k: np.asarray(v, dtype=np.float64).ravel() for k, v in samples.items()}
    lo, hi = (
        value_range
        if value_range is not None
        else (
            min(float(a.min()) for a in arrays.values() if a.size),
            max(float(a.max()) for a in arrays.values() if a.size),
        )
    )
    edges = np.linspace(lo, hi, bins + 1)
    for i, (name, a) in enumerate(arrays.items()):
        if a.size == 0:
            continue
        c = color_for(name, i)
        ax.hist(
            a,
            bins=edges,
            density=density,
            histtype="step",
            color=c,
            linewidth=1.2,
            label=f"{name} (mean {a.mean():.3f})",
        )
        if show_mean:
            ax.axvline(a.mean(), color=c, linestyle="--", linewidth=0.8)
    ax.set_xlim(lo, hi)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density" if density else "count")
    ax.legend(loc="best", frameon=True, framealpha=0.85, edgecolor="none")
    return ax


def grid_heatmap(
    values: np.ndarray,
    ax=None,
    title: str = "",
    cbar_label: str = "",
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool | None = None,
):
    """Heatmap of a per-position statistic over the (h, w) token grid (row 0 at the top).

    Args:
        values: (h, w) array, e.g. mean top-1 probability at each token position.
        annotate: write the values in the cells (default: when the grid has at most 16 x 16 cells).
    Returns the Axes (with a colour bar labelled ``cbar_label``).
    """
    if ax is None:
        _, ax = new_figure(width=3.0, height=2.6)
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"values must be (h, w), got shape {v.shape}")
    im = ax.imshow(v, cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest", aspect="equal")
    ax.figure.colorbar(im, ax=ax, label=cbar_label, shrink=0.9)
    h, w = v.shape
    if annotate is None:
        annotate = h <= 16 and w <= 16
    if annotate:
        size = 5 if max(h, w) <= 8 else 3.5
        shade = np.asarray(im.norm(v))  # position of each value on the colour bar, 0..1
        for r in range(h):
            for c in range(w):
                ax.text(
                    c,
                    r,
                    _short(v[r, c]),
                    ha="center",
                    va="center",
                    fontsize=size,
                    color="white" if shade[r, c] < 0.6 else "black",
                )
    ax.set_xticks(range(0, w, max(1, w // 8)))
    ax.set_yticks(range(0, h, max(1, h // 8)))
    ax.set_xlabel("token column")
    ax.set_ylabel("token row")
    if title:
        ax.set_title(title)
    return ax


def _short(x: float) -> str:
    """Compact cell label: ``.41`` for 0.41, ``1.0`` for 1.0, ``12`` for 12.3."""
    if not np.isfinite(x):
        return ""
    t = f"{x:.2f}"
    if t.startswith("0."):
        return t[1:]
    return f"{x:.1f}" if abs(x) < 10 else f"{x:.0f}"
