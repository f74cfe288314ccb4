"""Replay decode records: why were drafts accepted, and what did relaxed acceptance cost?

Reads runs written by ``python -m lantern.generate`` (or :class:`lantern.engine.records.Decoded`
frames) and relates

* **ambiguity to acceptance** — the acceptance rate of draft tokens (committed / reached, see
  :mod:`lantern.engine.records`) binned by the ambiguity of the target distribution ``p`` at the drafted
  position: its top-1 probability and its entropy (nats), per method
  (:func:`acceptance_by_ambiguity`). LANTERN's premise (Jang et al., ICLR 2025, Sec. 3) is that
  flat ``p`` (low top-1, high entropy) is where exact speculative decoding rejects and where
  the latent neighbourhood recovers acceptance;
* **acceptance to image quality**, with distribution metrics (``--quality``: FID, KID,
  precision / recall, density / coverage per feature extractor with jackknife intervals, from
  :mod:`lantern.evaluate`, printed next to each run's acceptance rate, τ and step compression)
  and with proxies available offline (:func:`image_quality`, in :mod:`lantern.run_reader`):
  pixel MSE / PSNR (dB, data range 1) of an image against the reference run's image of the
  same index (same seed and condition; typically ``--method ar``), the fraction of tokens equal
  to the reference's and the first position where they differ; optionally
  (:func:`target_scores`) the target's own negative log-likelihood of the tokens under the
  conditional model (nats per token, temperature 1, no guidance) and, for class-conditional
  models, whether the target used as a Bayes classifier (argmax over classes of the
  conditional likelihood) recovers the image's class ("class consistency").

CLI::

    python -m lantern.replay runs/sd runs/lantern --reference runs/ar --out runs/replay
    python -m lantern.replay runs/sd runs/lantern-* --reference runs/ar --quality --extractors fmnist,mobilenet

writes ``acceptance_by_ambiguity.parquet``, ``image_quality.parquet``, ``quality.parquet`` (with
``--quality``; resumable parts in ``<out>/quality``), ``replay.png`` / ``.pdf`` (acceptance by
ambiguity; with ``--reference`` PSNR vs acceptance per image; with ``--quality`` FID and recall of
the first extractor against each run's τ, with their intervals) and prints the tables. The run
readers and proxies live in :mod:`lantern.run_reader`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from ambiguity import plots
from ambiguity.cli import (
    ArgumentParser,
    add_device_args,
    add_out_arg,
    add_progress_arg,
    check_out_dir,
    check_out_file,
    cli_main,
    nonneg_int,
    parse_mapping,
    positive_int,
)
from ambiguity.errors import UsageError
from ambiguity.io import ensure_writable_dir, write_table
from ambiguity.models.base import resolve_device
from ambiguity.models.registry import load_model
from ambiguity.runs import RunOptions
from lantern.evaluate import evaluate_runs
from lantern.quality.checks import check_run_names, parse_extractors
from lantern.quality.features import EXTRACTORS, OFFLINE
from lantern.quality.scoring import QualityProtocol
from lantern.quality.tables import speed_quality_table, wide_table
from lantern.run_reader import image_quality, load_run, reference_notes, run_label, target_scores

__all__ = [
    "ambiguity_bins",
    "acceptance_by_ambiguity",
    "with_wilson",
    "plot_replay",
    "quality_speed_frame",
    "build_parser",
    "run_quality",
    "main",
    "AMBIGUITY_COLUMNS",
]

AMBIGUITY_COLUMNS = {"p_top1": "top-1 probability of p", "p_entropy": "entropy of p (nats)"}


def ambiguity_bins(drafts, by: str = "p_top1", edges: Optional[Sequence[float]] = None, bins: int = 10):
    """Acceptance of reached draft tokens per bin of an ambiguity column.

    drafts: a drafts DataFrame (columns of :data:`lantern.engine.records.DRAFT_COLUMNS`); by:
    ``"p_top1"`` (probability) or ``"p_entropy"`` (nats); edges: bin edges (default ``bins``
    equal bins on [0, 1] for top-1, on [0, max entropy] for entropy). Returns a DataFrame with
    lo, hi, mid, drafts (reached draft tokens in the bin), committed, acceptance_rate
    (committed / drafts; NaN for an empty bin), mean_j_star and mean_p_gain (``p̃ - p``, the
    mass LANTERN moved onto accepted and rejected drafts alike). Raises UsageError for an
    unknown column.
    """
    if by not in AMBIGUITY_COLUMNS:
        raise UsageError(f"--by must be one of {', '.join(AMBIGUITY_COLUMNS)}, got {by!r}")
    d = drafts[drafts["reached"].astype(bool)]
    x = d[by].to_numpy(dtype=float)
    if edges is None:
        hi = 1.0 if by == "p_top1" else (math.ceil(2 * float(np.nanmax(x))) / 2 if len(x) else 1.0)
        edges = np.linspace(0.0, hi, bins + 1)
    edges = np.asarray(edges, dtype=float)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    rows = []
    for b in range(len(edges) - 1):
        sel = d[which == b]
        n = len(sel)
        rows.append(
            {
                "by": by,
                "lo": edges[b],
                "hi": edges[b + 1],
                "mid": 0.5 * (edges[b] + edges[b + 1]),
                "drafts": n,
                "committed": int(sel["committed"].sum()),
                "acceptance_rate": float(sel["committed"].mean()) if n else float("nan"),
                "mean_j_star": float(sel["j_star"].mean()) if n else float("nan"),
                "mean_p_gain": float((sel["p_tilde"] - sel["p_draft"]).mean()) if n else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def acceptance_by_ambiguity(runs: Mapping[str, object], by: Sequence[str] = ("p_top1", "p_entropy"), bins: int = 10):
    """:func:`ambiguity_bins` for several runs on shared edges: ``runs`` maps a label to a drafts
    DataFrame. Returns one long DataFrame with a ``method`` column (the label)."""
    frames = []
    for col in by:
        if col == "p_entropy":
            top = max((float(np.nanmax(d["p_entropy"])) for d in runs.values() if len(d)), default=1.0)
            edges = np.linspace(0.0, math.ceil(2 * top) / 2, bins + 1)
        else:
            edges = np.linspace(0.0, 1.0, bins + 1)
        for label, drafts in runs.items():
            frames.append(ambiguity_bins(drafts, col, edges).assign(method=label))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def with_wilson(bins: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """``bins`` (:func:`ambiguity_bins` rows: acceptance_rate, drafts) with the Wilson ``level``
    interval (:func:`lantern.quality.metrics.wilson_interval`) of each bin's acceptance rate as
    ``ci_low`` / ``ci_high`` (probabilities; NaN for an empty bin). Treats the reached drafts of a
    bin as independent 0/1 outcomes, which drafts of one image are not: read it as a lower bound
    on the uncertainty."""
    from lantern.quality.metrics import wilson_interval

    ci = [wilson_interval(r, int(n), level) for r, n in zip(bins["acceptance_rate"], bins["drafts"])]
    return bins.assign(ci_low=[c[0] for c in ci], ci_high=[c[1] for c in ci])


def quality_speed_frame(metrics: pd.DataFrame, runs: Sequence[Mapping], labels: Sequence[str]) -> pd.DataFrame:
    """``--quality``'s metric rows beside each run's speed: one row per (run, metric) with method
    (the replay label), metric, value, ci_low, ci_high, n and tau (the run's mean accepted length,
    bonus token counted; NaN where its summary has none). Rows of sets that are not among ``runs``
    (the reference run) are left out."""
    label_of = {str(r["path"]): lab for r, lab in zip(runs, labels)}
    tau_of = {str(r["path"]): r["summary"].get("tau", r["summary"].get("mean_accepted_length", np.nan)) for r in runs}
    rows = metrics[metrics["run"].isin(list(label_of))]
    return pd.DataFrame(
        {
            "method": rows["run"].map(label_of),
            "metric": rows["metric"],
            "value": rows["value"],
            "ci_low": rows["ci_low"],
            "ci_high": rows["ci_high"],
            "n": rows["n"],
            "tau": rows["run"].map(tau_of).astype(float),
        }
    ).reset_index(drop=True)


def _quality_panel(ax, speed: pd.DataFrame, metric: str, colors: Mapping) -> None:
    """One point per run: ``metric`` (with its interval) against the run's τ."""
    rows = speed[speed["metric"] == metric]
    for m in dict.fromkeys(rows["method"]):
        r = rows[rows["method"] == m]
        err = np.vstack([(r["value"] - r["ci_low"]).clip(lower=0), (r["ci_high"] - r["value"]).clip(lower=0)])
        ax.errorbar(r["tau"], r["value"], yerr=err, fmt="o", ms=3.5, capsize=2, color=colors[m], label=m)
    plots.interval_note(ax, rows["value"], rows["ci_low"], rows["ci_high"])
    name, _, extractor = metric.partition("_")
    n = int(rows["n"].max()) if len(rows) else 0
    ax.set_xlabel("τ (mean accepted length)")
    ax.set_ylabel(name.upper() if name in ("fid", "kid") else name)
    ax.set_title(f"{name.upper() if name in ('fid', 'kid') else name} ({extractor}, n = {n}) vs speed", fontsize=7)


def plot_replay(
    bins,
    quality=None,
    path: str | Path = "figures/lantern_replay",
    min_drafts: int = 20,
    level: float = 0.95,
    speed: Optional[pd.DataFrame] = None,
) -> list[Path]:
    """Acceptance rate vs top-1 probability and vs entropy of p per method, with the Wilson
    ``level`` interval of each bin (:func:`lantern.quality.metrics.wilson_interval` over its
    reached drafts, which treats drafts as independent: within one image they are not, so read
    it as a lower bound on the uncertainty) and, below, the reached drafts per bin;
    bins with fewer than ``min_drafts`` drafts are left out. When ``quality`` (image_quality rows
    with a ``method`` column) is given, PSNR against the reference vs per-image acceptance rate;
    when ``speed`` (:func:`quality_speed_frame` of ``--quality``'s rows) is given, FID and recall of
    its first extractor against each run's τ, with their jackknife intervals.
    Each run in its method's colour (:func:`ambiguity.plots.series_colors`); the panels are drawn by
    :func:`ambiguity.plots.binned_rates` with :func:`with_wilson`. One legend below the panels. PNG + PDF."""
    import matplotlib.ticker as mticker

    cols = [c for c in AMBIGUITY_COLUMNS if c in set(bins["by"])]
    n = len(cols) + (quality is not None and len(quality) > 0)
    methods = list(dict.fromkeys(bins["method"]))
    colors = plots.series_colors(methods + ([] if quality is None else list(quality["method"])))
    panels = _speed_metrics(speed)
    n += len(panels)
    with plots.style():
        fig, axes = plots.new_figure(
            2, n, width=2.6 * n, height=3.6, squeeze=False, gridspec_kw={"height_ratios": [2.2, 1]}
        )
        for j, metric in enumerate(panels):
            _quality_panel(axes[0, n - len(panels) + j], speed, metric, colors)
            axes[1, n - len(panels) + j].set_visible(False)
        for c, col in enumerate(cols):
            ax, cnt = axes[0, c], axes[1, c]
            plots.binned_rates(
                ax, with_wilson(bins[bins["by"] == col], level), cnt, methods, colors, min_count=min_drafts
            )
            ax.set_ylabel("acceptance rate")
            ax.set_title(f"acceptance vs {AMBIGUITY_COLUMNS[col]}", fontsize=7)
            cnt.set_ylim(bottom=0)
            cnt.yaxis.set_major_locator(mticker.MaxNLocator(3, integer=True))
            cnt.set_ylabel("reached drafts\nper bin")
            cnt.set_xlabel(AMBIGUITY_COLUMNS[col])
            if col == "p_top1":
                ax.set_xlim(0, 1)
                cnt.set_xlim(0, 1)
            else:
                cnt.set_xlim(*ax.get_xlim())
        if quality is not None and len(quality):
            ax = axes[0, len(cols)]
            for m in dict.fromkeys(quality["method"]):
                q = quality[(quality["method"] == m) & np.isfinite(quality["psnr"])]
                ax.scatter(q["acceptance_rate"], q["psnr"], s=6, color=colors[m], alpha=0.7)
            ax.set_xlabel("acceptance rate of the image")
            ax.set_ylabel("PSNR vs reference (dB)")
            ax.set_title("per image: PSNR vs acceptance", fontsize=7)
            axes[1, len(cols)].set_visible(False)
        fig.suptitle(
            f"Acceptance by ambiguity of the target's p (bars: {100 * level:g} % Wilson intervals per bin; "
            f"bins with >= {min_drafts} drafts)"
            + (f"; image quality vs τ with {100 * level:g} % jackknife intervals" if panels else ""),
            fontsize=7.5,
        )
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=6, frameon=False)
        return plots.save_figure(fig, path)


def _speed_metrics(speed: Optional[pd.DataFrame]) -> list[str]:
    """The quality metrics drawn against speed: FID and recall of the first extractor."""
    if speed is None or not len(speed):
        return []
    metrics = list(dict.fromkeys(speed["metric"]))
    extractor = next((m.partition("_")[2] for m in metrics if m.startswith("fid_")), None)
    return [m for m in (f"fid_{extractor}", f"recall_{extractor}") if m in metrics]


def run_quality(runs: Sequence[Mapping], reference: Optional[Mapping], args, out: Path) -> pd.DataFrame:
    """``--quality``: distribution metrics of every run (and of the reference run) against
    ``--quality-reference`` via :func:`lantern.evaluate.evaluate_runs` (parts in ``out/quality``);
    prints them next to each run's speed, and each run's difference to the reference run with a
    paired jackknife interval (runs of the same size), and returns the metric rows."""
    names = parse_extractors(args.extractors)
    weights = parse_mapping(args.weights, list(EXTRACTORS), "--weights", must_exist=False)
    specs = [str(r["path"]) for r in runs] + ([str(reference["path"])] if reference is not None else [])
    base = str(reference["path"]) if reference is not None else None
    df, rec = evaluate_runs(
        list(dict.fromkeys(specs)),
        QualityProtocol(reference=args.quality_reference, bootstrap=args.bootstrap),
        names,
        weights,
        RunOptions(out=out / "quality", progress=not getattr(args, "no_progress", True)),
        device=resolve_device(args.device),
        paired_with=base,
    )
    print(
        f"image quality against {args.quality_reference} (n = {int(df['n'].max())} images per run, "
        f"jackknife over min({args.bootstrap}, n) groups, {int(100 * 0.95)} % intervals):"
    )
    with pd.option_context("display.width", 250, "display.max_columns", 50):
        print(speed_quality_table(df, rec).to_string())
        if rec["paired"]:
            pt = pd.DataFrame(rec["paired"]).rename(columns={"diff": "value"})
            print(f"difference to the reference run {base} (paired jackknife over image indices):")
            print(wide_table(pt, ("fid", "kid", "precision", "recall")).to_string())
    for note in rec["notes"]:
        print(f"note: {note}")
    return df


def build_parser() -> ArgumentParser:
    """The argument parser of ``python -m lantern.replay``."""
    ap = ArgumentParser(
        prog="python -m lantern.replay",
        description="Relate acceptance of draft tokens to the ambiguity of p and to image quality.",
    )
    ap.add_argument("runs", nargs="+", help="run directories written by python -m lantern.generate")
    ap.add_argument("--reference", default=None, help="run to compare images with (same --seed, usually --method ar)")
    ap.add_argument("--bins", type=positive_int, default=10, help="bins per ambiguity axis (default: 10)")
    ap.add_argument(
        "--scores", action="store_true", help="also load the target to score tokens (NLL, class consistency for c2i)"
    )
    add_device_args(ap, dtype=False, what="for --scores")
    add_out_arg(ap, "output directory (default: runs/replay)", default="runs/replay")
    ap.add_argument("--figure", default=None, help="figure path without suffix (default: <out>/replay)")
    ap.add_argument(
        "--quality",
        action="store_true",
        help="FID, KID, precision/recall, density/coverage of every run (lantern.evaluate)",
    )
    ap.add_argument(
        "--quality-reference",
        default="fashion-mnist:test",
        help="reference set of --quality (default: fashion-mnist:test)",
    )
    ap.add_argument(
        "--extractors",
        default=None,
        help=f"feature extractors of --quality (default: {','.join(OFFLINE)}, mobilenet only when its "
        f"weights are found)",
    )
    ap.add_argument("--weights", action="append", default=None, metavar="NAME=PATH", help="extractor weights")
    ap.add_argument(
        "--bootstrap", type=nonneg_int, default=100, help="jackknife groups of --quality's intervals (default: 100)"
    )
    add_progress_arg(ap)  # bars of --quality's feature extraction
    return ap


def _print_scores(runs, ref, labels, args, out: Path) -> None:
    """``--scores``: the target's NLL (and class consistency) of every run's tokens, printed and saved."""
    s = (ref or runs[0])["summary"].get("settings", {})
    model = load_model(
        s.get("model", "embedded"), weights=s.get("weights"), device=args.device, image_size=s.get("image_size")
    )
    scores = pd.concat(
        [target_scores(model, r["images"]).assign(method=lab) for lab, r in zip(labels, runs)]
        + ([target_scores(model, ref["images"]).assign(method="reference")] if ref else []),
        ignore_index=True,
    )
    write_table(scores, out / "target_scores.parquet")
    cols = ["nll"] + (["consistent"] if "consistent" in scores else [])
    print(scores.groupby("method")[cols].mean().to_string(float_format="%.4g"))


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    """``python -m lantern.replay RUN [RUN ...] [--reference RUN]``: tables + figure (module docstring)."""
    args = build_parser().parse_args(argv)
    if args.bins > 1000:
        raise UsageError(f"--bins must be at most 1000 (bins of the ambiguity axes), got {args.bins}")
    out = check_out_dir(args.out)
    if args.figure is not None:
        check_out_file(args.figure, "--figure")
    check_run_names(args.runs)
    runs = [load_run(r) for r in args.runs]
    ref = load_run(args.reference) if args.reference else None
    out = ensure_writable_dir(out)
    labels = [run_label(r["summary"]) for r in runs]
    labels = [f"{lab} ({r['path'].name})" if labels.count(lab) > 1 else lab for lab, r in zip(labels, runs)]
    bins = acceptance_by_ambiguity({lab: r["drafts"] for lab, r in zip(labels, runs)}, bins=args.bins)
    write_table(bins, out / "acceptance_by_ambiguity.parquet")
    quality = None
    if ref is not None:
        for lab, r in zip(labels, runs):
            for note in reference_notes(r, ref):
                print(f"note: {lab}: {note}")
        quality = pd.concat(
            [image_quality(r, ref).assign(method=lab) for lab, r in zip(labels, runs)], ignore_index=True
        )
    if args.scores:
        _print_scores(runs, ref, labels, args, out)
    if quality is not None:
        write_table(quality, out / "image_quality.parquet")
        table = quality.assign(identical=quality["mse"] == 0, psnr=quality["psnr"].replace([np.inf], np.nan))
        print("per method, means over images (psnr over the non-identical images, dB):")
        print(
            table.groupby("method")[
                ["acceptance_rate", "tau", "tokens_per_forward", "mse", "psnr", "token_match", "identical"]
            ]
            .mean()
            .to_string(float_format="%.4g")
        )
    speed = None
    if args.quality:
        metrics = run_quality(runs, ref, args, out)
        write_table(metrics, out / "quality.parquet")
        speed = quality_speed_frame(metrics, runs, labels)
    wide = bins.pivot_table(index=["by", "mid"], columns="method", values="acceptance_rate")
    print(wide.to_string(float_format="%.3f"))
    files = plot_replay(bins, quality, args.figure or out / "replay", speed=speed)
    print(
        f"wrote {out}/acceptance_by_ambiguity.parquet"
        + (", image_quality.parquet" if quality is not None else "")
        + (", quality.parquet" if args.quality else "")
        + f", {', '.join(str(f) for f in files)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
