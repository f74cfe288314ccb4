"""Cross-model ambiguity comparison: LANTERN's Fig. 2 on any set of models.

LANTERN's first finding (Jang et al., ICLR 2025, Sec. 3, Fig. 2): visual AR models spread their
next-token probability far more thinly than text LLMs (average top-1 probability 0.206 and
top-10 mass 0.520 for LlamaGen, 0.064 / 0.204 for Anole), and EAGLE drafters trained for them
are less accurate (38.80 % and 27.60 % top-1 test accuracy). This module profiles several
models with the same settings (:func:`ambiguity.profile.profile`) and puts the numbers side by
side, with bootstrap confidence intervals over images (or text passages).

    python -m ambiguity.compare                        # the embedded image model vs its text twin
    python -m ambiguity.compare --models embedded,text-twin,anole --weights anole=/ckpt/Anole-7b

Outputs under ``--out`` (default ``runs/compare``), all written atomically:

* ``<model>/tokens.parquet`` + ``<model>/summary.json``: the per-token table of each model
  (``<model>/shards`` make an interrupted profile resume; a finished model is not reloaded);
* ``compare.parquet``: one row per model: mean top-1 probability, top-10 mass and entropy
  (nats) with their bootstrap CIs, conditional-only means, drafter test accuracy;
* ``per_image.parquet``: per (model, image) means, what the bootstrap resamples;
* ``compare_ambiguity.{png,pdf}`` (means with CIs and per-token distributions) and
  ``compare_drafter.{png,pdf}`` (drafter test accuracy per epoch, for models with an accuracy
  table) in ``--figures`` (default: ``--out``).

Drafter accuracy tables are LANTERN artefacts: ``python -m lantern.drafter.comparison`` runs this same
comparison with the shipped drafters' tables found automatically (``ambiguity`` never reads
``lantern``'s files); here they are given with ``--drafter-accuracy MODEL=FILE``.

Settings: ``--cfg`` applies to image models (c2i/t2i); text models have no condition to guide
and always run at scale 1. The default scale is 1 for every model (each model's own
distribution), temperature 1, no top-k / top-p.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from ambiguity import plots
from ambiguity.cli import (
    ArgumentParser,
    add_data_arg,
    add_device_args,
    add_run_args,
    add_sampling_args,
    check_out_dir,
    cli_main,
    device_from_args,
    parse_mapping,
    positive_int,
    print_written,
    safe_name,
    seed_int,
    shown_path,
    unit_float,
)
from ambiguity.conditions import fashion_mnist_subset, generation_conditions
from ambiguity.errors import FieldError, UsageError
from ambiguity.io import ensure_writable_dir, read_table, write_json, write_table
from ambiguity.memory import check_count
from ambiguity.models.registry import get_spec, load_model
from ambiguity.profile import profile_model
from ambiguity.runs import RunOptions
from ambiguity.sampling import SamplingConfig
from ambiguity.stats import bootstrap_mean_ci

__all__ = [
    "PAPER",
    "CompareSettings",
    "parse_models",
    "bootstrap_ci",
    "per_image_means",
    "drafter_accuracy",
    "profile_one",
    "summary_row",
    "compare_models",
    "plot_ambiguity",
    "plot_drafter",
    "format_table",
    "main",
    "AccuracyLookup",
]

# model name -> path of its drafter accuracy table (or None): how lantern.drafter.comparison supplies its artefacts
AccuracyLookup = Callable[[str], Optional[Path]]

# LANTERN (arXiv 2410.03355) Sec. 3 / Fig. 2: averages over generated images; drafter top-1 test accuracy.
PAPER = [
    {"model": "LlamaGen (paper)", "kind": "t2i", "top1": 0.206, "top10": 0.520, "drafter_top1": 0.3880},
    {"model": "Anole (paper)", "kind": "t2i", "top1": 0.064, "top10": 0.204, "drafter_top1": 0.2760},
]
DEFAULT_MODELS = ("embedded", "embedded-16", "text-twin")  # two image geometries and the text twin
STATS = ("top1", "top10", "entropy")


@dataclass
class CompareSettings:
    """Everything that makes two profiles comparable (stored with each model's results).

    ``sampling`` applies to image models; text models use it with guidance 1.
    ``source``: ``"generate"`` (sample, default) or ``"dataset"`` (teacher-force real images /
    held-out passages). ``n_boot`` bootstrap resamples, ``level`` the CI coverage.
    """

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    num_images: int = 64
    batch_size: int = 32
    seed: int = 0
    source: str = "generate"
    n_boot: int = 2000
    level: float = 0.95

    def __post_init__(self):
        if self.num_images < 2:
            raise FieldError(
                "CompareSettings",
                "num_images",
                f"must be >= 2 (a bootstrap needs several images), got {self.num_images}",
            )
        if self.batch_size < 1:
            raise FieldError("CompareSettings", "batch_size", f"must be >= 1, got {self.batch_size}")
        if self.source not in ("generate", "dataset"):
            raise FieldError("CompareSettings", "source", f"must be generate or dataset, got {self.source!r}")
        if self.n_boot < 1:
            raise FieldError("CompareSettings", "n_boot", f"must be >= 1, got {self.n_boot}")
        check_count(self.n_boot, 3 * 8 * self.num_images, "--bootstrap", f"the resamples of {self.num_images} images")
        if not 0 < self.level < 1:
            raise FieldError("CompareSettings", "level", f"must be in (0, 1), got {self.level}")

    def sampling_for(self, kind: str) -> SamplingConfig:
        """The sampling settings a model of ``kind`` runs with (text: no guidance)."""
        s = self.sampling
        return SamplingConfig(1.0, s.temperature, s.top_k, s.top_p) if kind == "text" else s

    def record(self) -> dict:
        d = asdict(self)
        d["sampling"] = self.sampling.as_dict()
        return d


# --------------------------------------------------------------------------- arguments
def parse_models(text: str) -> list[str]:
    """``"embedded,text-twin"`` -> names; each must be a registry name or hf:<repo> (UsageError)."""
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names:
        raise UsageError("--models is empty; pass names like embedded,text-twin")
    if len(set(names)) != len(names):
        raise UsageError(f"--models names a model twice ({text}); list each once")
    for n in names:
        get_spec(n)  # raises a one-line UsageError for unknown names
    return names


# --------------------------------------------------------------------------- statistics
def bootstrap_ci(
    values: np.ndarray, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean and percentile-bootstrap CI of per-image values (n,) float -> (mean, low, high).

    Resamples the n images with replacement ``n_boot`` times with
    ``numpy.random.default_rng(seed).integers(0, n, (n_boot, n))`` and takes the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles (numpy's linear interpolation) of the
    resampled means (Efron & Tibshirani, 1993, ch. 13). Same inputs and seed -> same interval.
    Raises ValueError for an empty input.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    lo, hi = bootstrap_mean_ci(v, None, n_boot, seed, level)
    return float(v.mean()), lo, hi


def per_image_means(table):
    """Per-token profile table -> one row per image: means of guided/cond top-1, top-10, entropy.

    Columns: image, then ``top1``, ``top10``, ``entropy`` (guided: the distribution sampled from)
    and ``cond_top1``, ``cond_top10``, ``cond_entropy`` (conditional-only).
    """
    cols = {s: (f"guided_{s}", "mean") for s in STATS}
    cols.update({f"cond_{s}": (f"cond_{s}", "mean") for s in STATS})
    return table.groupby("image", sort=True).agg(**cols).reset_index()


def drafter_accuracy(path: Optional[str | Path], given: bool = True):
    """A drafter accuracy table (written by ``python -m lantern.drafter.train``), or None without one.

    One row per epoch (0 = random init), columns ``epoch``, ``top1``, ``top2``, ``top3``
    (fractions). ``given``: the user named the file, so a missing file is an error (else None).
    Raises UsageError for a missing (given) or unreadable file.
    """
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        if given:
            raise UsageError(f"drafter accuracy table {p} does not exist; check --drafter-accuracy")
        return None
    try:
        df = read_table(p)
    except Exception as exc:  # pyarrow raises many types for damaged files
        raise UsageError(
            f"cannot read drafter accuracy table {p} ({exc}); retrain with python -m lantern.drafter.train"
        ) from None
    if not {"epoch", "top1"} <= set(df.columns):
        raise UsageError(f"{p} has no epoch/top1 columns; pass a table written by python -m lantern.drafter.train")
    return df.sort_values("epoch").reset_index(drop=True)


# --------------------------------------------------------------------------- profiling
def _dataset_inputs(model, settings: CompareSettings, data: Optional[str]):
    """(tokens or None, images or None, conditions) for ``--source dataset``."""
    if hasattr(model, "dataset_sequences"):
        tokens, conds = model.dataset_sequences(settings.num_images, settings.seed)
        return tokens, None, conds
    if model.kind == "c2i":
        images, conds = fashion_mnist_subset(model, settings.num_images, settings.seed, None, data)
        return None, images, conds
    raise UsageError(
        f"--source dataset is not available for {model.name} in the comparison; "
        f"use --source generate (or python -m ambiguity.profile --images DIR)"
    )


def profile_one(
    name: str,
    settings: CompareSettings,
    out: Optional[Path],
    weights: Optional[Path] = None,
    device="auto",
    dtype=None,
    data: Optional[str] = None,
    overwrite: bool = False,
    progress: bool = True,
    model=None,
):
    """Profile one model (resumable) -> (per-token DataFrame, summary dict).

    With ``out``: a finished model (``out/tokens.parquet`` + ``summary.json`` of the same
    settings and the same :meth:`~ambiguity.models.base.TokenModel.weights_digest`) is read back
    without profiling again (the model loads only to read its digest: weights retrained in place
    are profiled anew, never reused); otherwise :func:`ambiguity.profile.profile` runs with
    ``out`` as its shard directory and the two files are written atomically. ``model``: an
    already loaded TokenModel (Jupyter, tests) instead of loading ``name``. Raises UsageError
    (unknown name, absent weights, results of other settings or weights in ``out``).
    """
    record = {"name": name, "weights": str(weights) if weights else None, **settings.record()}
    if model is None:
        model = load_model(name, weights=weights, device=device, dtype=dtype)
    if out is not None and not overwrite and (out / "tokens.parquet").is_file() and (out / "summary.json").is_file():
        summary = json.loads((out / "summary.json").read_text())
        stored = summary.get("model", {}).get("weights_digest")
        if summary.get("compare") == json.loads(json.dumps(record, default=str)) and stored in (
            None,  # a summary written before the digest was recorded: cannot be checked
            model.weights_digest(),
        ):
            return read_table(out / "tokens.parquet"), summary
    sampling = settings.sampling_for(model.kind)
    tokens = images = None
    if settings.source == "dataset":
        tokens, images, conditions = _dataset_inputs(model, settings, data)
    else:
        conditions = generation_conditions(model, settings.num_images, settings.seed)
    table, summary = profile_model(
        model,
        conditions,
        sampling,
        num_images=settings.num_images,
        batch_size=settings.batch_size,
        seed=settings.seed,
        tokens=tokens,
        images=images,
        settings=record,
        options=RunOptions(out, overwrite, progress),
    )
    summary["compare"] = record
    if out is not None:
        write_table(table, out / "tokens.parquet")
        write_json(summary, out / "summary.json")
    return table, summary


def summary_row(name: str, table, summary: dict, settings: CompareSettings, accuracy=None) -> dict:
    """One row of ``compare.parquet``: facts, means with bootstrap CIs, drafter accuracy.

    Keys: model, kind, source, guidance, temperature, top_k, top_p, images, tokens, vocab_size,
    parameters, ``<stat>``/``<stat>_lo``/``<stat>_hi`` for top1, top10, entropy (guided),
    ``cond_<stat>`` means, drafter_top1 / drafter_top2 / drafter_top3 (last epoch, fractions),
    drafter_top1_random (epoch 0) and drafter_epochs (NaN / 0 without a table).
    """
    m = summary["model"]
    per = per_image_means(table)
    row = {
        "model": name,
        "kind": m.get("kind"),
        "source": summary.get("source"),
        **summary["sampling"],
        "images": int(per.shape[0]),
        "tokens": int(len(table)),
        "vocab_size": m.get("vocab_size"),
        "parameters": m.get("parameters"),
    }
    for s in STATS:
        mean, lo, hi = bootstrap_ci(per[s].to_numpy(), settings.n_boot, settings.seed, settings.level)
        row.update({s: mean, f"{s}_lo": lo, f"{s}_hi": hi, f"cond_{s}": float(per[f"cond_{s}"].mean())})
    nan = float("nan")
    if accuracy is not None and len(accuracy):
        last, first = accuracy.iloc[-1], accuracy.iloc[0]
        row.update({f"drafter_top{k}": float(last.get(f"top{k}", nan)) for k in (1, 2, 3)})
        row.update(drafter_top1_random=float(first["top1"]), drafter_epochs=int(last["epoch"]))
    else:
        row.update(drafter_top1=nan, drafter_top2=nan, drafter_top3=nan, drafter_top1_random=nan, drafter_epochs=0)
    return row


# --------------------------------------------------------------------------- figures
def plot_ambiguity(rows, tables: dict, level: float = 0.95, paper: bool = True):
    """Fig. 2 (a) style: mean top-1 probability and top-10 mass per model with bootstrap CIs
    (paper values as grey reference bars), and violins of the per-token top-1 / top-10 values.
    Returns a matplotlib Figure (7 x 2.4 in)."""
    import seaborn as sns  # plotting libraries load only when a figure is drawn

    with plots.style():
        fig, axes = plots.new_figure(1, 3, width=7.0, height=2.4)
        df = pd.DataFrame(rows)
        ref = pd.DataFrame(PAPER) if paper else pd.DataFrame(columns=["model", "top1", "top10"])
        names = list(df["model"]) + list(ref["model"])
        x = np.arange(len(names))
        for j, (stat, label) in enumerate((("top1", "top-1 probability"), ("top10", "top-10 mass"))):
            off, c = (j - 0.5) * 0.38, plots.color_for("", j)
            mx = x[: len(df)] + off
            err = np.array([df[stat] - df[f"{stat}_lo"], df[f"{stat}_hi"] - df[stat]])
            axes[0].bar(
                mx, df[stat], width=0.38, color=c, yerr=err, capsize=2, error_kw={"linewidth": 0.8}, label=label
            )
            px = x[len(df) :] + off
            if len(ref):
                axes[0].bar(
                    px,
                    ref[stat],
                    width=0.38,
                    color=c,
                    alpha=0.35,
                    hatch="///",
                    edgecolor="white",
                    linewidth=0,
                    label="paper values (light)" if j == 0 else None,
                )
            for xi, v in zip(np.concatenate([mx, px]), list(df[stat]) + list(ref[stat])):
                axes[0].text(xi, v + 0.02, f"{v:.2f}", ha="center", va="bottom", fontsize=5.5)
        axes[0].set_xticks(x, names, rotation=20, ha="right")
        axes[0].set_ylim(0, 1.3)
        axes[0].set_yticks(np.linspace(0, 1, 6))
        axes[0].set_ylabel("average over tokens")
        axes[0].legend(loc="upper center", ncol=2, fontsize=5.5, columnspacing=0.8, handlelength=1.2)
        axes[0].set_title(f"means, {int(level * 100)}% bootstrap CI over images")
        long = pd.concat(
            [
                pd.DataFrame(
                    {
                        "model": n,
                        "top-1 probability": t["guided_top1"].to_numpy(),
                        "top-10 mass": t["guided_top10"].to_numpy(),
                    }
                )
                for n, t in tables.items()
            ]
        )
        for ax, col in zip(axes[1:], ("top-1 probability", "top-10 mass")):
            sns.violinplot(
                data=long,
                x="model",
                y=col,
                hue="model",
                cut=0,
                density_norm="width",
                inner="quart",
                linewidth=0.6,
                palette=[plots.color_for("", i + 2) for i in range(len(tables))],
                legend=False,
                ax=ax,
            )
            ax.set_ylim(0, 1)
            ax.set_xlabel("")
            ax.set_title(f"per-token {col}")
            ax.tick_params(axis="x", rotation=20)
    return fig


def plot_drafter(accuracies: dict, paper: bool = True):
    """Fig. 2 (b) style: drafter top-1 test accuracy (%) per epoch for each model with a table
    (epoch 0 = random init), paper values as dashed lines. Returns a Figure, or None when no
    model has an accuracy table."""
    have = {n: a for n, a in accuracies.items() if a is not None and len(a)}
    if not have:
        return None
    with plots.style():
        fig, ax = plots.new_figure(width=3.3, height=2.4)
        for i, (name, acc) in enumerate(have.items()):
            ax.plot(
                acc["epoch"],
                100 * acc["top1"],
                marker="o",
                markersize=3,
                color=plots.color_for("", i + 2),
                label=f"{name} ({100 * acc['top1'].iloc[-1]:.1f}%)",
            )
        if paper:
            for r, ls in zip(PAPER, ("--", ":")):
                ax.axhline(
                    100 * r["drafter_top1"],
                    color="#777777",
                    linestyle=ls,
                    linewidth=0.8,
                    label=f"{r['model']} ({100 * r['drafter_top1']:.1f}%)",
                )
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch (0 = random init)")
        ax.set_ylabel("drafter top-1 test accuracy (%)")
        ax.set_ylim(0, 100)
        ax.legend(loc="best")
    return fig


def format_table(rows, paper: bool = True, level: float = 0.95) -> str:
    """The summary printed at the end: one line per model (and the paper's values), in columns as
    wide as their widest cell (header or value), two spaces apart; names and intervals left-aligned,
    numbers right-aligned, so every line has the same width."""
    pct = int(round(level * 100))
    head = ["model", "kind", "images", f"top-1 [{pct}% CI]", f"top-10 [{pct}% CI]", "entropy", "drafter top-1"]
    right = (False, False, True, False, False, True, True)
    table = [head]
    for r in rows:
        acc = r.get("drafter_top1", float("nan"))
        table.append(
            [
                str(r["model"]),
                str(r["kind"]),
                str(int(r["images"])),
                f"{r['top1']:.3f} [{r['top1_lo']:.3f}, {r['top1_hi']:.3f}]",
                f"{r['top10']:.3f} [{r['top10_lo']:.3f}, {r['top10_hi']:.3f}]",
                f"{r['entropy']:.2f}",
                f"{100 * acc:.2f}% (ep {r['drafter_epochs']})" if acc == acc else "n/a",
            ]
        )
    for r in PAPER if paper else ():
        table.append(
            [r["model"], r["kind"], "", f"{r['top1']:.3f}", f"{r['top10']:.3f}", "", f"{100 * r['drafter_top1']:.2f}%"]
        )
    widths = [max(len(line[c]) for line in table) for c in range(len(head))]
    text = [
        "  ".join(cell.rjust(w) if r else cell.ljust(w) for cell, w, r in zip(line, widths, right)) for line in table
    ]
    return "\n".join([text[0], "-" * len(text[0]), *text[1:]])


# --------------------------------------------------------------------------- driver
def compare_models(
    models: Sequence,
    settings: Optional[CompareSettings] = None,
    *,
    weights: Optional[dict] = None,
    out: Optional[str | Path] = None,
    figures: Optional[str | Path] = None,
    device="auto",
    dtype=None,
    data: Optional[str] = None,
    accuracy_paths: Optional[dict] = None,
    accuracy_lookup: Optional[AccuracyLookup] = None,
    overwrite: bool = False,
    paper: bool = True,
    progress: bool = True,
):
    """Profile every model with the same settings and compare them (the Python entry point).

    Args:
        models: registry names, or loaded TokenModels (their ``.name`` is used).
        settings: :class:`CompareSettings` (default: 64 images, no guidance, temperature 1).
        weights: {name: checkpoint path}; out: results directory (None: nothing written);
        figures: where the two figures go (default ``out``; None with no ``out``: not drawn).
        accuracy_paths: {name: drafter accuracy table}; accuracy_lookup: name -> table path (or
            None) for models not in ``accuracy_paths`` (``lantern.drafter.comparison`` passes the shipped
            drafters' tables).
    Returns (compare DataFrame (one row per model, see :func:`summary_row`), {name: per-token table}).
    Raises UsageError for unknown models, absent weights, or an ``out`` holding other settings.
    """
    settings = settings or CompareSettings()
    weights, accuracy_paths = weights or {}, accuracy_paths or {}
    out = ensure_writable_dir(out) if out is not None else None
    rows, tables, accuracies, per_rows = [], {}, {}, []
    for item in models:
        model = None if isinstance(item, str) else item
        name = item if isinstance(item, str) else item.name
        sub = out / safe_name(name) if out is not None else None
        table, summary = profile_one(
            name, settings, sub, weights.get(name), device, dtype, data, overwrite, progress, model=model
        )
        tables[name] = table
        given = name in accuracy_paths
        path = accuracy_paths[name] if given else (accuracy_lookup(name) if accuracy_lookup is not None else None)
        accuracies[name] = drafter_accuracy(path, given)
        rows.append(summary_row(name, table, summary, settings, accuracies[name]))
        per_rows.append(per_image_means(table).assign(model=name))
    result = pd.DataFrame(rows)
    fig_dir = Path(figures) if figures is not None else out
    if out is not None:
        write_table(result, out / "compare.parquet")
        write_table(pd.concat(per_rows, ignore_index=True), out / "per_image.parquet")
    if fig_dir is not None:
        ensure_writable_dir(fig_dir)
        plots.save_figure(plot_ambiguity(rows, tables, settings.level, paper), fig_dir / "compare_ambiguity")
        fig = plot_drafter(accuracies, paper)
        if fig is not None:
            plots.save_figure(fig, fig_dir / "compare_drafter")
    return result, tables


def build_parser(prog: str = "python -m ambiguity.compare") -> ArgumentParser:
    p = ArgumentParser(
        prog=prog,
        description="Compare next-token ambiguity across models (LANTERN Fig. 2): average top-1 "
        "probability and top-10 mass with bootstrap CIs, and drafter test accuracy.",
    )
    p.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help="comma-separated registry names or hf:<repo> (default: %(default)s)",
    )
    p.add_argument(
        "--weights",
        action="append",
        default=None,
        metavar="MODEL=PATH",
        help="checkpoint file or directory per model, e.g. anole=/ckpt/Anole-7b (repeatable)",
    )
    p.add_argument(
        "--drafter-accuracy",
        action="append",
        default=None,
        metavar="MODEL=PATH",
        help="drafter accuracy table per model (python -m lantern.drafter.comparison finds the shipped ones)",
    )
    add_device_args(p)
    p.add_argument("--figures", default=None, help="directory for compare_*.png/pdf (default: --out)")
    p.add_argument("--num-images", type=positive_int, default=64, help="images (text passages) per model (default: 64)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="images per batch (default: 32)")
    p.add_argument("--seed", type=seed_int, default=0, help="sampling, subset and bootstrap seed (default: 0)")
    p.add_argument(
        "--source",
        choices=("generate", "dataset"),
        default="generate",
        help="generate: sample; dataset: teacher-force real images / held-out text (default: generate)",
    )
    add_data_arg(p, "Fashion-MNIST directory for --source dataset on the embedded model")
    add_sampling_args(p, guidance=1.0, guidance_help="guidance scale for image models, 1 = none (default: 1)")
    p.add_argument(
        "--bootstrap", type=positive_int, default=2000, help="bootstrap resamples over images (default: 2000)"
    )
    p.add_argument("--level", type=unit_float, default=0.95, help="confidence level of the intervals (default: 0.95)")
    p.add_argument("--no-paper", action="store_true", help="leave the paper's reference values out of figures/table")
    add_run_args(p, "results directory (default: runs/compare)")
    return p


@cli_main
def main(
    argv: Optional[list[str]] = None,
    accuracy_lookup: Optional[AccuracyLookup] = None,
    prog: str = "python -m ambiguity.compare",
) -> int:
    """CLI entry point; returns 0, or 2 with one line on stderr for bad input (UsageError).

    ``accuracy_lookup``/``prog``: how ``python -m lantern.drafter.comparison`` reuses this command with the
    shipped drafter accuracy tables."""
    args = build_parser(prog).parse_args(argv)
    t0 = time.perf_counter()
    # Validate everything before loading a model or writing a file.
    models = parse_models(args.models)
    weights = parse_mapping(args.weights, models, "--weights")
    acc = parse_mapping(args.drafter_accuracy, models, "--drafter-accuracy")
    sampling = SamplingConfig(guidance=args.cfg, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    settings = CompareSettings(
        sampling, args.num_images, args.batch_size, args.seed, args.source, args.bootstrap, args.level
    )
    device, dtype = device_from_args(args)
    if args.figures is not None:
        check_out_dir(args.figures, "--figures")
    out = ensure_writable_dir(check_out_dir(args.out or "runs/compare"))
    result, _ = compare_models(
        models,
        settings,
        weights=weights,
        out=out,
        figures=args.figures,
        device=device,
        dtype=dtype,
        data=args.data,
        accuracy_paths=acc,
        accuracy_lookup=accuracy_lookup,
        overwrite=args.overwrite,
        paper=not args.no_paper,
        progress=not args.no_progress,
    )
    print(format_table(result.to_dict("records"), paper=not args.no_paper, level=args.level))
    s = settings.sampling
    print(
        f"settings: {args.source}, {args.num_images} images/passages per model, cfg {s.guidance} (image models; "
        f"text 1), temperature {s.temperature}, top-k {s.top_k}, top-p {s.top_p}, seed {args.seed}, "
        f"{args.bootstrap} bootstrap resamples; {time.perf_counter() - t0:.1f} s"
    )
    fig_dir = Path(args.figures) if args.figures else out
    print_written(
        [out / "compare.parquet", out / "per_image.parquet", out / "<model>" / "tokens.parquet"],
        f"; figures in {shown_path(fig_dir / 'compare_*.png')}/pdf",
    )
    if accuracy_lookup is None and not acc:
        print(
            "note: drafter accuracy is n/a without --drafter-accuracy; "
            "python -m lantern.drafter.comparison adds the shipped drafters' tables"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
