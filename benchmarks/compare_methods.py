"""Every decoding method of the toolkit on one protocol: one table, one figure, the published numbers beside.

    python benchmarks/compare_methods.py --model embedded --num-images 500 --timing-images 4 --batch-size 32

The methods: AR, SD, EAGLE-2, LANTERN, LANTERN++, SJD, GSD, SCD and the 2025-2026 plug-ins that are
registered (:data:`lantern.methods.registry.METHODS`; :func:`configs`), at the paper's sampling
(CFG 3, temperature 1, top-k 2000 mapped to the codebook; LANTERN k 1000 mapped, δ 0.1; text
models: no guidance or filters). Per method, on the same conditions and per-image seeds: tokens per
target forward, τ (mean accepted length, bonus counted), acceptance rate of reached drafts, latency
speed-up over AR at batch 1 (interleaved rounds, :mod:`lantern.timing`), throughput at batch
``--batch-size`` B (images per second of each method decoding B images per target forward, AR at
batch B in the same interleaved rounds: median and spread over ``--throughput-rounds``, and the
per-round ratio to AR), the exact per-step distortion (mean ``TVD(out, p)`` of one verification:
LANTERN / LANTERN++ on the (p, q) pairs of the drafter along AR samples, :mod:`lantern.distortion`;
GSD on the (p, q) pairs its own decodes judged, :func:`lantern.rules.jacobi.gsd_output_distribution`;
0 for the lossless methods), the target's NLL of the images (nats per token, conditional model at
temperature 1) and class consistency (the target's Bayes class decision equals the label; c2i) on the
first ``--target-images`` images with 95 % intervals, the acceptance rate by the target's top-1
probability (:func:`lantern.replay.ambiguity_bins`, with reached drafts per bin and Wilson
intervals, :func:`lantern.replay.with_wilson`; drawn by :func:`ambiguity.plots.binned_rates`) and,
for image models, FID / KID / precision / recall of the ``--num-images`` images against
``--reference`` with the ``fmnist`` extractor (:func:`lantern.evaluate.score_images`: jackknife
intervals). The statistics use ``--num-images`` images (decoded ``--batch-size`` at a time: the same
samples as one at a time, :mod:`lantern.engine.loop`), the latency timing the first
``--timing-images`` of them, the throughput ``--throughput-images`` images (default 2 B) per round.
Every method keeps its colour of :data:`ambiguity.plots.METHOD_COLORS` in every panel and figure.
Writes ``--out``/compare_methods_<model>.{csv,md}``, ``compare_methods_<model>_ambiguity.csv``,
``compare_methods_<model>_throughput.csv`` (one row per method and round) and the figure
``--figure`` (default ``<out>/compare_methods_<model>.{png,pdf}``); the ``.md`` ends with the
published numbers of each method (``benchmarks/published_methods.csv``). ``--out`` defaults to the
untracked ``runs/benchmarks/compare_methods``; the committed tables and figures are ``--out
benchmarks/results --figure figures/compare_methods_<model>``. A stopped run resumes: each method's
decode results are saved when it is done (``<out>/compare_methods_<model>.parts/``, :class:`Parts`) and a
rerun with the same options reads them; the timings are measured again.
Wall-clock numbers depend on the machine (and its load); the ratios are what to read.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path
from typing import NamedTuple, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from ambiguity import plots
from ambiguity.cli import (
    ArgumentParser,
    add_guidance_arg,
    add_out_arg,
    check_out_dir,
    check_out_file,
    cli_main,
    nonneg_int,
    positive_int,
    seed_int,
)
from ambiguity.conditions import generation_conditions
from ambiguity.errors import UsageError
from ambiguity.io import write_json
from ambiguity.models.registry import get_spec, load_model
from ambiguity.sampling import SamplingConfig, default_guidance
from lantern.distortion import chain_place_tvds, real_pairs, step_tvds
from lantern.drafter.model import load_drafter
from lantern.engine.decode import DecodeConfig, decode, neighbour_table
from lantern.engine.loop import run
from lantern.evaluate import score_images
from lantern.methods.jacobi.method import Jacobi
from lantern.methods.registry import METHODS
from lantern.methods.tree.spec import TreeSpec
from lantern.paper.config import map_to_codebook
from lantern.quality.metrics import wilson_interval
from lantern.quality.scoring import QualityProtocol
from lantern.quality.tables import flat_scores
from lantern.replay import ambiguity_bins, with_wilson
from lantern.rules.acceptance import RELAXATIONS, AcceptanceRule
from lantern.rules.divergences import tvd
from lantern.rules.jacobi import entropy_acceptance, gsd_output_distribution, one_step_output
from lantern.run_reader import target_scores
from lantern.timing import interleaved_timing, speedup_table

ROOT = Path(__file__).resolve().parents[1]

RULE = AcceptanceRule()
QUALITY = ("fid", "kid", "precision", "recall")
PUBLISHED = ROOT / "benchmarks" / "published_methods.csv"
# the paper's sampling and LANTERN setting (LlamaGen's 16384-code codebook; k and top-k mapped)
PAPER_CFG, PAPER_TOP_K, PAPER_K, PAPER_DELTA = 3.0, 2000, 1000, 0.1
# the 2025-2026 plug-ins at their official defaults, compared when registered
NEW_METHODS = ("cool-sd", "fly", "entropy-sd", "sjd-pac", "zipar", "pjd")
NAMES = ("ar", "sd", "eagle-2", "lantern", "lantern++", "sjd", "gsd", "scd", *NEW_METHODS)


def bins_table(bins: pd.DataFrame) -> pd.DataFrame:
    """One row per top-1 bin, one column per method, cells ``rate [lo, hi] (n)`` (n: reached drafts)."""
    cell = [
        f"{r:.2f} [{lo:.2f}, {hi:.2f}] ({n})" if n else "—"
        for r, lo, hi, n in zip(bins["acceptance_rate"], bins["ci_low"], bins["ci_high"], bins["drafts"])
    ]
    t = bins.assign(cell=cell, bin=[f"{lo:.1f}-{hi:.1f}" for lo, hi in zip(bins["lo"], bins["hi"])])
    return t.pivot_table(index="bin", columns="method", values="cell", aggfunc="first", sort=False)


def throughput_table(timing: pd.DataFrame, baseline: str = "ar") -> pd.DataFrame:
    """Per configuration (index ``config``), from :func:`lantern.timing.interleaved_timing` rows at one
    batch size: ``images_per_s`` (median over rounds of images / wall second) with its spread
    ``images_per_s_min`` / ``_max``; ``vs_ar``: the median per-round ratio of its images/s to the
    ``baseline``'s in the same round, with ``vs_ar_min`` / ``vs_ar_max``; ``rounds``."""
    t = timing.assign(images_per_s=timing["images"] / timing["seconds"])
    base = t[t["config"] == baseline].set_index("round")["images_per_s"]
    t = t.assign(vs_ar=t["images_per_s"] / t["round"].map(base).astype(float))
    g = t.groupby("config", sort=False)
    return pd.DataFrame(
        {
            "images_per_s": g["images_per_s"].median(),
            "images_per_s_min": g["images_per_s"].min(),
            "images_per_s_max": g["images_per_s"].max(),
            "vs_ar": g["vs_ar"].median(),
            "vs_ar_min": g["vs_ar"].min(),
            "vs_ar_max": g["vs_ar"].max(),
            "rounds": g["images_per_s"].count(),
        }
    )


def configs(vocab_size: int, width: int = 16) -> dict:
    """The compared methods: LANTERN and LANTERN++ at the paper's k (1000 of 16384 codes, mapped to
    ``vocab_size``), LANTERN's δ 0.1, LANTERN++'s λ 2; EAGLE-2's official dynamic tree; the Jacobi
    methods' and the new plug-ins' official defaults (those registered in
    :data:`lantern.methods.registry.METHODS`), but ZipAR's window and PJD's row offset at half a row
    of ``width`` tokens (their official 8 is a whole row of ``embedded``: plain AR / row by row)."""
    k = map_to_codebook(PAPER_K, vocab_size)
    found = {
        "ar": DecodeConfig.of("ar"),
        "sd": DecodeConfig.of("sd", gamma=4),
        "eagle-2": DecodeConfig.of("sd", tree=TreeSpec()),
        "lantern": DecodeConfig.of("lantern", gamma=4, k=k, delta=PAPER_DELTA),
        "lantern++": DecodeConfig.of("lantern++", gamma=4, k=k, lam=RULE.lam),
        "sjd": DecodeConfig.of("sjd"),
        "gsd": DecodeConfig.of("gsd"),
        "scd": DecodeConfig.of("scd"),
    }
    for name in NEW_METHODS:  # their official defaults; the drafted ones on LANTERN's chain of 4
        if name in METHODS:
            found[name] = DecodeConfig.of(name, gamma=4) if METHODS[name].drafter else DecodeConfig.of(name)
    half = max(1, width // 2)
    if "zipar" in found:
        found["zipar"] = DecodeConfig.of("zipar", window=half)
    if "pjd" in found:
        found["pjd"] = DecodeConfig.of("pjd", rows=min(8, width), offset=half)
    return found


def paper_sampling(kind: str, vocab_size: int, cfg: Optional[float]) -> SamplingConfig:
    """The paper's sampling for image models (CFG 3 unless ``cfg``, temperature 1, top-k 2000 mapped
    to the codebook); text models: temperature 1, no guidance (unless ``cfg``), no filters."""
    if kind == "text":
        return SamplingConfig(guidance=cfg if cfg is not None else default_guidance(kind), temperature=1.0)
    top_k = map_to_codebook(PAPER_TOP_K, vocab_size)
    return SamplingConfig(guidance=cfg if cfg is not None else PAPER_CFG, temperature=1.0, top_k=top_k)


def target_row(model, images: pd.DataFrame, limit: int) -> dict:
    """The target's NLL (nats per token; mean and 95 % normal interval over images) and, for c2i
    models, class consistency (fraction, 95 % Wilson interval) of the first ``limit`` images
    (:func:`lantern.run_reader.target_scores`)."""
    sc = target_scores(model, images.head(limit))
    nll = sc["nll"].to_numpy(dtype=float)
    half = 1.959963984540054 * nll.std(ddof=1) / np.sqrt(len(nll)) if len(nll) > 1 else float("nan")
    row = {"target_nll": nll.mean(), "target_nll_lo": nll.mean() - half, "target_nll_hi": nll.mean() + half}
    if "consistent" in sc:
        c = sc["consistent"].to_numpy(dtype=float)
        lo, hi = wilson_interval(float(c.mean()), len(c))
        row.update(class_consistency=c.mean(), class_consistency_lo=lo, class_consistency_hi=hi)
    return row


def published_table(path=PUBLISHED) -> pd.DataFrame:
    """The published numbers of each method (``benchmarks/published_methods.csv``: method, source,
    model, setting, speedup, tau, fid, note)."""
    return pd.read_csv(path, dtype=str).fillna("")


def jacobi_distortion(model, conditions, sampling, config, seed) -> float:
    """Mean exact TVD(out, p) of one verification of a lossy Jacobi rule (GSD; entropy-aware SJD)
    over the (p, q) pairs its own decodes judged (:func:`lantern.rules.jacobi.gsd_output_distribution`,
    :func:`lantern.rules.jacobi.one_step_output`)."""
    vals = []
    for i, c in enumerate(conditions):
        pairs = []
        run(model, Jacobi(config, model, pairs=pairs), [c], sampling, np.array([i]), seed)
        p = torch.stack([a for a, _ in pairs]).double()
        q = torch.stack([b for _, b in pairs]).double()
        if config.method == "gsd":
            out = gsd_output_distribution(p, q, config.group, config.prob_gap)
        else:
            out = one_step_output(p, q, entropy_acceptance(p, q, config.entropy_alpha, config.entropy_floor))
        vals.append(tvd(out, p))
    return float(torch.cat(vals).mean())


def quality_row(pixels, reference: str, bootstrap: int) -> dict:
    """FID / KID / precision / recall (fmnist features) of decoded images (N, C, H, W) in [0, 1]
    against ``reference`` -> ``{metric: value, metric_lo, metric_hi}`` (jackknife intervals over
    min(bootstrap, N) groups, :func:`lantern.evaluate.score_images`)."""
    q = score_images(pixels, reference=reference, extractors=["fmnist"], protocol=QualityProtocol(bootstrap=bootstrap))
    return {k: v for k, v in flat_scores(q).items() if k.split("_")[0] in QUALITY}


def _speed_panel(ax, table: pd.DataFrame, colors: list, batch_size: int) -> None:
    """Bars of tokens per target forward, latency speed-up at batch 1 and (when the table has it)
    throughput against AR at ``batch_size`` with its spread over rounds."""
    methods = list(table.index)
    x = np.arange(len(table))
    measures = [("tokens_per_forward", "tokens / target forward", dict(alpha=0.35))]
    measures.append(("speedup", "latency speed-up vs AR (batch 1)", {}))
    if "throughput_vs_ar" in table.columns:
        measures.append(
            ("throughput_vs_ar", f"throughput vs AR (batch {batch_size})", dict(hatch="////", edgecolor="w"))
        )
    w = 0.8 / len(measures)
    for k, (col, label, kw) in enumerate(measures):
        off = (k - (len(measures) - 1) / 2) * w
        ax.bar(x + off, table[col], w, color=colors, lw=0, **kw)
        ax.bar([np.nan], [np.nan], color="0.45", label=label, **kw)  # legend key in grey
    if "throughput_vs_ar" in table.columns:  # the spread over rounds
        k = len(measures) - 1
        v = table["throughput_vs_ar"]
        ax.errorbar(
            x + (k - (len(measures) - 1) / 2) * w,
            v,
            yerr=np.vstack([v - table["throughput_vs_ar_min"], table["throughput_vs_ar_max"] - v]),
            fmt="none",
            ecolor="k",
            elinewidth=0.6,
            capsize=1.2,
        )
    ax.set_xticks(x, methods, rotation=40, ha="right")
    for tick, c in zip(ax.get_xticklabels(), colors):
        tick.set_color(c)
    ax.axhline(1, color="k", lw=0.5)
    top = table[[c for c, _, _ in measures] + (["throughput_vs_ar_max"] if len(measures) == 3 else [])]
    ax.set_ylim(0, 1.35 * float(np.nanmax(top.to_numpy(dtype=float))))
    ax.set_ylabel("ratio (AR = 1)")
    ax.legend(frameon=False, fontsize=6, loc="upper left")
    ax.set_title("speed", fontsize=8)


def _acceptance_panels(fig, acc, cnt, bins: pd.DataFrame, methods: list, min_drafts: int, level: float) -> None:
    """Acceptance rate by the target's top-1 probability (``acc``) over the reached drafts per bin
    (``cnt``), with the figure's legend of the methods."""
    named = [m for m in methods if m in set(bins["method"])]
    plots.binned_rates(acc, bins, cnt, named, min_count=min_drafts)
    acc.set_xlim(0, 1)
    acc.set_ylabel("acceptance rate of reached drafts")
    acc.set_title(f"acceptance vs ambiguity ({100 * level:g} % Wilson)", fontsize=8)
    handles, labels = acc.get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=len(labels),
        fontsize=6,
        frameon=False,
        title="acceptance panel: method",
        title_fontsize=6,
    )
    cnt.set_xlim(0, 1)
    cnt.set_yscale("log")
    cnt.set_xlabel("target top-1 probability at the draft's position")
    cnt.set_ylabel("reached drafts\nper bin")


def _quality_panels(fa, pr, table: pd.DataFrame, colors: list) -> None:
    """FID (``fa``) and precision / recall (``pr``) per method with their jackknife intervals."""
    methods = list(table.index)
    x = np.arange(len(table))
    fid, fid_lo, fid_hi = table["fid_fmnist"], table["fid_fmnist_lo"], table["fid_fmnist_hi"]
    for j in range(len(x)):
        fa.errorbar(
            x[j],
            fid.iloc[j],
            yerr=[[fid.iloc[j] - fid_lo.iloc[j]], [fid_hi.iloc[j] - fid.iloc[j]]],
            fmt="o",
            ms=3,
            capsize=2,
            color=colors[j],
        )
    fa.set_xticks(x, [])
    fa.set_ylabel("FID (fmnist features)")
    fa.set_title("image quality (95 % jackknife)", fontsize=8)
    for k, (metric, marker, fill) in enumerate((("precision", "o", "full"), ("recall", "s", "none"))):
        v = table[f"{metric}_fmnist"]
        lo, hi = v - table[f"{metric}_fmnist_lo"], table[f"{metric}_fmnist_hi"] - v
        for j in range(len(x)):
            pr.errorbar(
                x[j] + (k - 0.5) * 0.25,
                v.iloc[j],
                yerr=[[lo.iloc[j]], [hi.iloc[j]]],
                fmt=marker,
                fillstyle=fill,
                ms=2.8,
                capsize=1.5,
                color=colors[j],
            )
        pr.plot([], [], marker, fillstyle=fill, color="0.45", ms=2.8, label=metric)  # legend key
    pr.set_xticks(x, methods, rotation=40, ha="right", fontsize=6)
    for tick, c in zip(pr.get_xticklabels(), colors):
        tick.set_color(c)
    pr.set_ylim(0, 1.05)
    pr.set_ylabel("precision / recall")
    pr.legend(frameon=False, fontsize=5.5, ncol=2, loc="lower left")


def plot_comparison(
    table: pd.DataFrame,
    bins: pd.DataFrame,
    title: str,
    path,
    min_drafts: int = 20,
    level: float = 0.95,
    batch_size: int = 8,
) -> list:
    """Speed per method (tokens per target forward, latency speed-up at batch 1 and, when the table
    has ``throughput_vs_ar``, throughput against AR at ``batch_size`` with its spread over rounds);
    acceptance rate by the target's top-1 probability with its Wilson intervals (``bins``: ``ci_low`` /
    ``ci_high`` of :func:`lantern.replay.with_wilson`, drawn by :func:`ambiguity.plots.binned_rates`)
    and the reached drafts per bin below; for image models FID and precision / recall with their
    jackknife intervals. Bins with fewer than ``min_drafts`` reached drafts are left out. Each
    method has its :func:`ambiguity.plots.method_color` in every panel. PNG + PDF."""
    has_q = "fid_fmnist" in table.columns
    ncol = 3 if has_q else 2
    with plots.style():
        fig = plt.figure(figsize=(3.4 * ncol, 4.8), layout="constrained")
        gs = fig.add_gridspec(2, ncol, height_ratios=[2.2, 1])
        colors = [plots.method_color(m) for m in table.index]
        _speed_panel(fig.add_subplot(gs[:, 0]), table, colors, batch_size)
        acc, cnt = fig.add_subplot(gs[0, 1]), fig.add_subplot(gs[1, 1])
        _acceptance_panels(fig, acc, cnt, bins, list(table.index), min_drafts, level)
        if has_q:
            _quality_panels(fig.add_subplot(gs[0, 2]), fig.add_subplot(gs[1, 2]), table, colors)
        fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() / 0.06)), fontsize=8)  # ~0.06 in a character
        return plots.save_figure(fig, path)


def replot(model: str, batch_size: int = 8, out: Path = Path("benchmarks/results"), figure=None) -> int:
    """Redraw ``figure`` (default ``out/compare_methods_<model>``) from ``out/compare_methods_<model>.csv``,
    ``_ambiguity.csv`` and the first line of the ``.md`` (the sample sizes, as the figure's title):
    e.g. after the palette changed, without decoding again. Raises UsageError when the table is missing."""
    out = Path(out)
    path = out / f"compare_methods_{model}.csv"
    if not path.exists():
        raise UsageError(f"{path} does not exist; run benchmarks/compare_methods.py --model {model} --out {out} first")
    table = pd.read_csv(path, index_col="method")
    amb = out / f"compare_methods_{model}_ambiguity.csv"
    bins = pd.read_csv(amb) if amb.exists() else pd.DataFrame(columns=["method"])
    md = out / f"compare_methods_{model}.md"
    title = md.read_text().splitlines()[0] if md.exists() else model
    plot_comparison(table, bins, title, Path(figure or out / f"compare_methods_{model}"), batch_size=batch_size)
    return 0


def build_parser() -> ArgumentParser:
    """The ``compare_methods.py`` options."""
    ap = ArgumentParser(prog="compare_methods.py", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--num-images", type=positive_int, default=32, help="images for the statistics and quality")
    ap.add_argument("--timing-images", type=positive_int, default=4, help="the first N of them for the latency timing")
    ap.add_argument("--rounds", type=positive_int, default=1, help="interleaved rounds of the batch-1 latency timing")
    ap.add_argument("--batch-size", type=positive_int, default=8, help="B of the throughput timing (1: no throughput)")
    ap.add_argument(
        "--throughput-images", type=positive_int, default=None, help="images per method and round at batch B (2 B)"
    )
    ap.add_argument("--throughput-rounds", type=positive_int, default=3, help="interleaved rounds at batch B")
    ap.add_argument("--seed", type=seed_int, default=0)
    add_guidance_arg(ap)
    ap.add_argument(
        "--reference",
        default="fashion-mnist:test@1000",
        help="reference set of FID / KID / precision / recall (image models)",
    )
    ap.add_argument("--bootstrap", type=positive_int, default=32, help="jackknife groups of the quality intervals")
    ap.add_argument("--no-quality", action="store_true")
    ap.add_argument(
        "--distortion-images",
        type=positive_int,
        default=32,
        help="images whose (p, q) pairs give the exact per-step distortion: the drafter's along the AR samples "
        "(LANTERN, LANTERN++, Cool-SD, FLy) and the pairs GSD and entropy-aware SJD judge (batch 1)",
    )
    ap.add_argument(
        "--target-images",
        type=nonneg_int,
        default=None,
        help="images whose target NLL and class consistency are scored (default: all; 0: none)",
    )
    ap.add_argument("--only", default=None, help="comma-separated subset of methods (ar always included)")
    ap.add_argument("--replot", action="store_true", help="only redraw --figure from the tables saved in --out")
    ap.add_argument(
        "--figure",
        default=None,
        metavar="STEM",
        help="figure path without suffix (.png and .pdf; default: <out>/compare_methods_<model>; the committed "
        "ones: figures/compare_methods_<model>)",
    )
    add_out_arg(
        ap,
        "results directory of the tables (default: runs/benchmarks/compare_methods; the committed ones: "
        "benchmarks/results)",
        default=str(ROOT / "runs" / "benchmarks" / "compare_methods"),
    )
    return ap


def check_args(args) -> None:
    """Refuse ``--only`` naming an unknown method and quality on fewer than 4 images (UsageError)."""
    if args.only:
        known = [n for n in NAMES if n not in NEW_METHODS or n in METHODS]
        unknown = sorted(set(args.only.split(",")) - set(known))
        if unknown:
            raise UsageError(f"unknown method {unknown[0]!r} in --only; choose from {', '.join(known)}")
    if not args.no_quality and args.num_images < 4:
        raise UsageError(
            f"quality needs --num-images >= 4 (precision / recall use k = 3 neighbours), "
            f"got {args.num_images}; pass more images or --no-quality"
        )


class Plan(NamedTuple):
    """What one comparison decodes: the sampling settings; ``conditions`` for the statistics and
    quality, the first ``timed`` of them for the latency timing over ``rounds`` rounds at batch 1;
    ``throughput`` (the first ``n_tp`` of the pool) for ``throughput_rounds`` rounds at
    ``batch_size`` (None at batch 1: no throughput timing); whether image quality is scored.
    (A NamedTuple, not a dataclass: the tests load this script from its file, outside sys.modules.)"""

    sampling: SamplingConfig
    conditions: list
    timed: list
    rounds: int
    throughput: Optional[list]
    throughput_rounds: int
    batch_size: int
    quality: bool


def make_plan(args, model) -> Plan:
    """The :class:`Plan` of the options for the loaded ``model``."""
    kind = get_spec(args.model).kind
    sampling = paper_sampling(kind, model.vocab_size, args.cfg)
    n_tp = args.throughput_images or 2 * args.batch_size
    pool = generation_conditions(model, max(args.num_images, n_tp), args.seed, None, None)
    conditions = pool[: args.num_images]
    timed = conditions[: max(1, min(args.timing_images, len(conditions)))]
    quality = not args.no_quality and kind != "text" and model.can_decode
    throughput = pool[:n_tp] if args.batch_size > 1 else None
    return Plan(sampling, conditions, timed, args.rounds, throughput, args.throughput_rounds, args.batch_size, quality)


def time_methods(model, cfgs: dict, plan: Plan, drafter, seed: int):
    """(latency speed-ups per method at batch 1, throughput rows of every round or None, the
    :func:`throughput_table` of them or None): interleaved rounds, :mod:`lantern.timing`."""
    timing = interleaved_timing(
        model, cfgs, plan.sampling, plan.timed, [(0, len(plan.timed))] * plan.rounds, drafter, seed=seed, progress=True
    )
    speed = speedup_table(timing).set_index("config")
    if plan.throughput is None:
        return speed, None, None
    n_tp = len(plan.throughput)
    tp_timing = interleaved_timing(  # every method batches (chains, trees, Jacobi windows)
        model,
        cfgs,
        plan.sampling,
        plan.throughput,
        [(0, n_tp)] * plan.throughput_rounds,
        drafter,
        seed=seed,
        progress=True,
        batch_size=plan.batch_size,
        desc=f"throughput at batch {plan.batch_size}",
    )
    return speed, tp_timing, throughput_table(tp_timing)


class Parts:
    """Each finished method's decode results, kept under ``--out`` so that a stopped run resumes.

    One folder per set of the options that change the decodes (model, images, seed, guidance,
    batch size, target images, quality and its reference), ``<out>/compare_methods_<model>.parts/<key>/``;
    each method's results are one JSON file written atomically when the method is done (the AR
    tokens, which the distortion reads, come with AR's). A rerun with the same options reads
    them instead of decoding again; the timings are measured again on every run.
    """

    def __init__(self, out: Path, args):
        keys = (
            "model",
            "num_images",
            "seed",
            "cfg",
            "batch_size",
            "target_images",
            "no_quality",
            "reference",
            "bootstrap",
        )
        key = json.dumps({k: getattr(args, k) for k in keys}, sort_keys=True, default=str)
        self.dir = Path(out) / f"compare_methods_{args.model}.parts" / hashlib.sha1(key.encode()).hexdigest()[:12]
        self.key = key

    def load(self, name: str) -> Optional[dict]:
        """The saved results of method ``name``, or None."""
        path = self.dir / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def save(self, name: str, results: dict) -> None:
        write_json({"options": self.key, **results}, self.dir / f"{name}.json")


def method_row(name: str, stats: dict, speed: pd.DataFrame, tp: Optional[pd.DataFrame]) -> dict:
    """The table row of method ``name`` from its decode statistics (:func:`decode_stats`) and timings."""
    row = {"method": name, **{k: stats[k] for k in ("tokens_per_forward", "tau", "acceptance_rate")}}
    row.update(speedup=speed.loc[name, "speedup"], ms_per_image=speed.loc[name, "ms_per_image"])
    if tp is not None:
        have = name in tp.index
        for col in ("images_per_s", "images_per_s_min", "images_per_s_max", "vs_ar", "vs_ar_min", "vs_ar_max"):
            key = col if col.startswith("images") else f"throughput_{col}"
            row[key] = tp.loc[name, col] if have else float("nan")
    row.update({k: v for k, v in stats.items() if k not in ("tokens_per_forward", "tau", "acceptance_rate")})
    return row


def decode_stats(model, name: str, c: DecodeConfig, plan: Plan, drafter, args) -> dict:
    """Decode the plan's conditions with one method -> its statistics, target and quality columns,
    acceptance bins (records) and, for AR, the tokens (JSON-ready: :class:`Parts`)."""
    d = decode(  # statistics and quality in batches: each image's tokens come from its own stream
        model,
        plan.conditions,
        c,
        plan.sampling,
        drafter if c.speculative else None,
        seed=args.seed,
        pixels=plan.quality,
        batch_size=args.batch_size,
    )
    summary = d.summary()
    stats = {k: float(summary[k]) for k in ("tokens_per_forward", "tau", "acceptance_rate")}
    if args.target_images != 0 and model.kind != "text":
        images = pd.DataFrame(
            {"image": range(len(d.tokens)), "codes": list(d.tokens.numpy()), "condition": plan.conditions}
        )
        stats.update(target_row(model, images, args.target_images or len(plan.conditions)))
    if plan.quality:
        stats.update(quality_row(d.pixels, args.reference, args.bootstrap))
    _, drafts, _ = d.frames()
    bins = with_wilson(ambiguity_bins(drafts, "p_top1", np.linspace(0, 1, 11))) if len(drafts) else None
    return {
        "stats": {k: float(v) for k, v in stats.items()},
        "bins": None if bins is None else bins.to_dict("records"),
        "tokens": d.tokens.numpy() if name == "ar" else None,
    }


def decode_methods(model, cfgs: dict, plan: Plan, drafter, speed, tp, args, parts: Parts):
    """Decode the plan's conditions with every method (or read what an earlier run with the same
    options saved, :class:`Parts`) -> (rows, acceptance bins per method, AR tokens)."""
    rows, bins = [], []
    ar_tokens = None
    for name, c in cfgs.items():
        got = parts.load(name)
        if got is None:
            got = decode_stats(model, name, c, plan, drafter, args)
            parts.save(name, got)
        else:
            print(f"{name}: read from {parts.dir}", flush=True)
        if got["tokens"] is not None:
            ar_tokens = torch.as_tensor(np.asarray(got["tokens"], dtype=np.int64))
        if got["bins"] is not None:
            bins.append(pd.DataFrame(got["bins"]).assign(method=name))
        row = method_row(name, got["stats"], speed, tp)
        rows.append(row)
        print(name, {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    return rows, bins, ar_tokens


def relaxed_distortion(model, drafter, ar_tokens, plan: Plan, nb, cfgs: dict, distortion_images: int) -> dict:
    """Mean exact TVD(out, p) of one verification of every relaxed chain rule in ``cfgs`` (LANTERN,
    LANTERN++, ...; :func:`lantern.distortion.step_tvds`; Cool-SD and FLy by their place in the chain)
    over the drafter's (p, q) pairs along the first ``distortion_images`` AR samples -> {method: value}."""
    relaxed = {n: c.rule for n, c in cfgs.items() if c.rule is not None and c.rule.relaxed and c.tree is None}
    placed = {n: c for n, c in cfgs.items() if c.rule is not None and c.rule.method in RELAXATIONS}
    if not relaxed and not placed:
        return {}
    n = distortion_images
    p, q = real_pairs(model, drafter, ar_tokens[:n], plan.conditions[:n], plan.sampling)
    found = {}
    for name, c in placed.items():  # Cool-SD, FLy: the mean over a chain's places (FLy's window pass: beta^W)
        beta = float(torch.minimum(p, q).sum(-1).mean())  # SD's mean acceptance probability on these pairs
        window = beta**c.rule.fly_window if c.rule.method == "fly" else None
        found[name] = float(chain_place_tvds(p.double(), q.double(), c.rule, c.gamma, window).mean())
    for name, t in zip(relaxed, step_tvds(p, q, nb, list(relaxed.values()))):
        found[name] = float(t.mean())
    return found


def markdown(args, plan: Plan, table: pd.DataFrame, bins: pd.DataFrame) -> str:
    """The ``.md`` report: the sample sizes, the table, the quality intervals and the acceptance bins."""
    tp = plan.throughput is not None
    head = (
        f"{args.model}: statistics{' and quality' if plan.quality else ''} over {len(plan.conditions)} images, timing "
        f"over the first {len(plan.timed)} x {args.rounds} interleaved rounds at batch 1"
        + (
            f", throughput (images/s at batch {args.batch_size}, median [min, max] over {args.throughput_rounds} "
            f"interleaved rounds of {len(plan.throughput)} images; throughput_vs_ar: median per-round ratio to AR "
            f"at the same batch)"
            if tp
            else ""
        )
        + f"; cfg {plan.sampling.guidance:g}, temperature 1, top-k {plan.sampling.top_k or 'off'}, {_machine()}"
    )
    bounded = [c for c in table.columns if c.split("_")[0] in QUALITY or c.endswith(("_lo", "_hi"))]
    parts = [head, table.drop(columns=bounded).to_markdown(floatfmt=".3g")]
    target = [c for c in ("target_nll", "class_consistency") if c in table.columns]
    if target:
        cells = {
            m: [f"{table.loc[m, c]:.4g} [{table.loc[m, c + '_lo']:.4g}, {table.loc[m, c + '_hi']:.4g}]" for c in target]
            for m in table.index
        }
        n = args.target_images or len(plan.conditions)
        parts += [
            f"The target's view of the images (first {n} per method): NLL in nats per token under the conditional "
            f"model at temperature 1 (95 % normal interval) and class consistency (95 % Wilson interval):",
            pd.DataFrame.from_dict(cells, orient="index", columns=target).to_markdown(),
        ]
    if plan.quality:
        cells = {
            m: [
                f"{table.loc[m, f'{k}_fmnist']:.4g} [{table.loc[m, f'{k}_fmnist_lo']:.4g}, "
                f"{table.loc[m, f'{k}_fmnist_hi']:.4g}]"
                for k in QUALITY
            ]
            for m in table.index
        }
        qt = pd.DataFrame.from_dict(cells, orient="index", columns=[f"{k}_fmnist" for k in QUALITY])
        parts += [
            f"Image quality against {args.reference}, fmnist features, {len(plan.conditions)} images per method, "
            f"95 % jackknife intervals over min({args.bootstrap}, n) groups:",
            qt.to_markdown(),
        ]
    if len(bins):
        parts += [
            "Acceptance rate of reached drafts by the target's top-1 probability at the draft's position: "
            "rate [95 % Wilson interval] (reached drafts):",
            bins_table(bins).to_markdown(),
        ]
    if PUBLISHED.exists():
        parts += [
            "Published numbers (speed-up over each paper's own AR baseline; their models, not ours):",
            published_table().to_markdown(index=False),
        ]
    return "\n\n".join(parts) + "\n"


def _machine() -> str:
    """Where the timings ran: the CUDA device's name, else the CPU threads torch used."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    threads = torch.get_num_threads()
    return f"CPU, {threads} thread{'s' if threads > 1 else ''}"


def figure_title(args, plan: Plan) -> str:
    """The figure's title: the sample sizes of the statistics, latency and throughput."""
    return (
        f"{args.model}: {len(plan.conditions)} images (latency: first {len(plan.timed)} x {args.rounds} rounds at "
        f"batch 1"
        + (
            f"; throughput: {len(plan.throughput)} images x {args.throughput_rounds} rounds at batch {args.batch_size}"
            if plan.throughput is not None
            else ""
        )
        + f"), CFG {plan.sampling.guidance:g}, temperature 1, {_machine()}"
    )


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    out = check_out_dir(args.out)
    figure = Path(args.figure) if args.figure else Path(out) / f"compare_methods_{args.model}"
    check_out_file(figure, "--figure")
    if args.replot:
        return replot(args.model, args.batch_size, out, figure)
    check_args(args)
    model = load_model(args.model)
    plan = make_plan(args, model)
    cfgs = configs(model.vocab_size, int(tuple(getattr(model, "grid", (1, 16)))[-1]))
    if args.only:
        keep = {"ar", *args.only.split(",")}
        cfgs = {k: v for k, v in cfgs.items() if k in keep}
    drafter = load_drafter(model, None)
    speed, tp_timing, tp = time_methods(model, cfgs, plan, drafter, args.seed)
    nb = neighbour_table(model, cfgs["lantern"]) if "lantern" in cfgs else None
    rows, bins, ar_tokens = decode_methods(model, cfgs, plan, drafter, speed, tp, args, Parts(out, args))
    table = pd.DataFrame(rows).set_index("method")
    table.insert(5, "distortion_tvd", 0.0)
    if nb is not None and ar_tokens is not None:
        for name, value in relaxed_distortion(
            model, drafter, ar_tokens, plan, nb, cfgs, args.distortion_images
        ).items():
            table.loc[name, "distortion_tvd"] = value
    for name in ("gsd", "entropy-sd"):
        if name in cfgs:
            table.loc[name, "distortion_tvd"] = jacobi_distortion(
                model, plan.conditions[: args.distortion_images], plan.sampling, cfgs[name].params, args.seed
            )
    for name in ("zipar", "pjd"):  # lossy as a joint law (rows decoded together), no per-step TVD
        if name in table.index:
            table.loc[name, "distortion_tvd"] = float("nan")
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / f"compare_methods_{args.model}.csv")
    b = pd.concat(bins, ignore_index=True) if bins else pd.DataFrame()
    if len(b):
        b.to_csv(out / f"compare_methods_{args.model}_ambiguity.csv", index=False)
    if tp is not None:
        tp_timing.assign(batch_size=args.batch_size).to_csv(
            out / f"compare_methods_{args.model}_throughput.csv", index=False
        )
    md = markdown(args, plan, table, b)
    (out / f"compare_methods_{args.model}.md").write_text(md)
    print(md)
    plot_comparison(table, b, figure_title(args, plan), figure, batch_size=args.batch_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
