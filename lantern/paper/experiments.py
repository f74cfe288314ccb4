"""The paper's items, one function each: ``fn(ctx) -> Item`` (see :mod:`lantern.paper`).

Decoding experiments share three sessions of the primary image model
(:mod:`lantern.paper.sessions`): temperature 1 (AR, EAGLE-2 and LANTERN at the paper's setting
for ``main_images`` images; the (k, δ) grid, the neighbour-metric and JSD variants for the first
``grid_images``), temperature 0 (AR, EAGLE-2, LANTERN for ``greedy_images``), and small
sessions for Fig. 2a/2b and the distortion item (AR alone for ``pairs_images``: the first images
of the temperature-1 session). EAGLE-2 is lossless speculative decoding with the EAGLE-2 dynamic tree;
LANTERN uses the same tree. Every speed-up is a ratio of latencies timed interleaved after a
warm-up (:mod:`lantern.timing`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
import torch

from ambiguity import plots
from ambiguity.analyses.interchangeability import plot_psnr, replacement_rows, run_interchangeability
from ambiguity.compare import CompareSettings, compare, plot_ambiguity
from ambiguity.errors import UsageError
from ambiguity.io import read_table
from lantern.decoding import DecodeConfig, neighbour_table
from lantern.distortion import distortion_table, real_pairs
from lantern.drafter import accuracy_table_path, shipped_drafter_path
from lantern.paper import published as P
from lantern.paper.context import Context
from lantern.paper.report import Item
from lantern.paper.sessions import (
    Method,
    Session,
    SessionData,
    batch_note,
    pixels,
    quality,
    run_session,
    sampling_for,
    session_batch_size,
)
from lantern.quality.scoring import Protocol
from lantern.timing import speedup_curve
from lantern.trees import TreeSpec

__all__ = ["EXPERIMENTS", "TITLES"]

QUALITY = ("fid", "kid", "precision", "recall")


# --------------------------------------------------------------------------- methods and sessions
def _tree(ctx: Context) -> TreeSpec:
    total, depth, top_k = ctx.config.tree
    return TreeSpec("dynamic", total_tokens=total, depth=depth, top_k=top_k)


def _eagle2(ctx: Context, drafter: str = "trained", rounds: Optional[int] = None, name: str = "eagle2") -> Method:
    return Method(
        name,
        DecodeConfig.of("sd", tree=_tree(ctx)),
        "EAGLE-2" + (" (random-init drafter)" if drafter == "random-init" else ""),
        drafter,
        rounds,
    )


TABLE3_MATRIX = "codebook-raw"  # the official code's neighbour table: distances on the stored codebook weights


def _lantern(
    ctx: Context,
    model: str,
    k_paper: int,
    delta: float,
    rounds: Optional[int] = None,
    metric: str = "l2",
    method: str = "lantern",
    matrix: str = "codebook",
) -> Method:
    k = ctx.k(model, k_paper)
    raw = matrix == "codebook-raw"
    tag = (
        {"lantern": "", "lantern-jsd": "jsd-"}[method]
        + ("" if metric == "l2" else f"{metric}-")
        + ("raw-" if raw else "")
    )
    label = (
        f"LANTERN{' (JSD)' if method == 'lantern-jsd' else ''} k={k} δ={delta:g}"
        + (f" {metric}" if metric != "l2" or raw else "")
        + (" (raw codebook)" if raw else "")
    )
    config = DecodeConfig.of(method, tree=_tree(ctx), k=k, delta=delta, metric=metric, matrix=matrix)
    return Method(
        f"lantern-{tag}k{k}-d{delta:g}",
        config,
        label,
        "trained",
        rounds,
        {"k": k, "k_paper": k_paper, "delta": delta, "metric": metric, "matrix": matrix, "bound": method},
    )


def _main_methods(ctx: Context, temperature: float) -> list[Method]:
    c, m = ctx.config, ctx.primary
    out = [Method("ar", DecodeConfig.of("ar"), "AR"), _eagle2(ctx), _lantern(ctx, m, c.paper_k, c.paper_delta)]
    if temperature == 0:
        return out
    grid = [_lantern(ctx, m, k, d, c.grid_images) for k in c.ks for d in c.deltas]
    grid.append(_lantern(ctx, m, c.paper_k, c.f2_delta, c.grid_images))
    # Table 3's neighbour metrics on the raw codebook weights, as the official code measures them
    # (on the l2-normalised codebook l2 and cosine order neighbours identically); random needs no geometry
    grid += [
        _lantern(ctx, m, c.paper_k, c.paper_delta, c.grid_images, metric, matrix=TABLE3_MATRIX)
        for metric in ("l2", "cosine")
    ]
    grid.append(_lantern(ctx, m, c.paper_k, c.paper_delta, c.grid_images, "random"))
    grid += [_lantern(ctx, m, c.paper_k, d, c.grid_images, method="lantern-jsd") for d in c.jsd_deltas]
    names = {x.name for x in out}
    for g in grid:  # the paper setting is already a main method; keep each method once
        if g.name not in names:
            out.append(g)
            names.add(g.name)
    return out


def main_session(ctx: Context, temperature: float) -> Optional[SessionData]:
    """The primary model's session at ``temperature`` (cached per process)."""
    if temperature not in ctx.sessions:
        n = ctx.config.main_images if temperature else ctx.config.greedy_images
        s = Session(
            f"{ctx.primary}-T{temperature:g}", ctx.primary, temperature, tuple(_main_methods(ctx, temperature)), n
        )
        ctx.sessions[temperature] = run_session(ctx, s)
    return ctx.sessions[temperature]


def _lantern_name(
    ctx: Context, k_paper: int, delta: float, metric: str = "l2", method: str = "lantern", matrix: str = "codebook"
) -> str:
    return _lantern(ctx, ctx.primary, k_paper, delta, metric=metric, method=method, matrix=matrix).name


def _speed_row(data: SessionData, method: str, n: Optional[int] = None) -> dict:
    sp = data.speed(n).set_index("config")
    if method not in sp.index:
        return {}
    r = sp.loc[method]
    # the headline (ratio of totals) stands alone; its spread is shown as median [quartiles] of the per-image ratios
    return {
        "speedup": r["speedup"],
        "per_image_speedup": r["speedup_median"],
        "per_image_speedup_q25": r["speedup_q25"],
        "per_image_speedup_q75": r["speedup_q75"],
        "ms_per_image": r["ms_per_image"],
        "ar_ms_per_forward": r["baseline_ms_per_forward"],
        # a wall-clock gain larger than the step compression points at a slow baseline loop
        "flag": "speed-up > tokens per forward" if r["speedup_exceeds_tokens_per_forward"] else None,
    }


def _quality_row(ctx: Context, data: SessionData, method: str, n: int) -> dict:
    if not ctx.model(data.session.model).can_decode:
        return {}
    scores = quality(ctx, data, method, n)
    row = {}
    for metric, v in scores.items():
        if metric.split("_")[0] in QUALITY:
            row[metric] = v["value"]
            row[f"{metric}_lo"], row[f"{metric}_hi"] = v.get("ci_low"), v.get("ci_high")
    return row


def _method_rows(ctx: Context, data: SessionData, methods, n: int, speed: bool = True) -> pd.DataFrame:
    rows = []
    by_name = {m.name: m for m in data.session.methods}
    for name in methods:
        m = by_name[name]
        rows.append(
            {
                "temperature": data.session.temperature,
                "method": m.label,
                "name": name,
                **m.facts,
                **data.stats(name, n),
                **(_speed_row(data, name, n) if speed else {}),
                **_quality_row(ctx, data, name, n),
            }
        )
    return pd.DataFrame(rows)


def _settings(ctx: Context, data: Optional[SessionData] = None, tree: bool = True, **extra) -> dict:
    """An item's settings line; ``tree``: the item decodes with the draft tree (its shape is listed)."""
    c = ctx.config
    out = {"model": ctx.primary, "seed": c.seed}
    if tree:
        out["tree (total, depth, top-k)"] = list(c.tree)
    if data is not None:
        out.update({"sampling": data.sampling.as_dict(), "images": data.session.rounds})
    out.update(extra)
    return out


def _prdc_note(n: int, k: int = Protocol.k) -> list:
    """A note when precision / recall are degenerate: at n <= k + 1 images per set every k-NN ball
    reaches the farthest other image, so each set covers the other and both are 1 by construction."""
    if n > k + 1:
        return []
    return [
        f"Precision and recall use k = {k} nearest neighbours: on n = {n} <= k + 1 images per set every "
        f"neighbourhood ball reaches the farthest image, so they are 1 by construction for every method and "
        f"say nothing (the published 0.48 / 0.56 are on 5000 images); compare them only on full runs."
    ]


def _quick(ctx: Context, notes: list) -> list:
    q = ctx.note_quick()
    return ([q] if q else []) + notes


def _timing_note(ctx: Context, sessions: Sequence[tuple[float, int]]) -> list[str]:
    """With ``--batch-size`` > 1: which rounds the speed-ups come from and how the rest were
    decoded, per (temperature, rounds) of the primary model's sessions (none at batch 1: every round
    is timed), and with ``--compile`` that the forwards were compiled."""
    c = ctx.config
    compiled = (
        [
            "compiled forwards (--compile): every method's target and drafter forwards ran through torch.compile; "
            "the compilation happened in the timing warm-up"
        ]
        if c.compile
        else []
    )
    if int(c.batch_size) == 1:
        return compiled
    B = session_batch_size(ctx, ctx.primary)[0]
    return [
        f"temperature {t:g}: speed-ups from the first {min(c.timing_images, n)} rounds, timed at batch 1, "
        f"interleaved; statistics and quality over {n} images at batch {B}."
        for t, n in sessions
    ] + compiled


def _k_note(ctx: Context) -> str:
    V = ctx.model(ctx.primary).vocab_size
    if V == P.PAPER_CODEBOOK:
        return f"k as in the paper ({V}-code codebook)"
    maps = ", ".join(f"{k} -> {ctx.k(ctx.primary, k)}" for k in sorted(set(ctx.config.ks) | {ctx.config.paper_k}))
    return (
        f"{ctx.primary}'s codebook has {V} codes, the paper's {P.PAPER_CODEBOOK}: k is mapped by the same "
        f"fraction of the codebook ({maps}); top-k {ctx.config.top_k} -> {ctx.k(ctx.primary, ctx.config.top_k)}"
    )


def _savefig(ctx: Context, fig, name: str, stem: str) -> str:
    plots.save_figure(fig, ctx.subdir(name) / stem)
    return f"{name}/{stem}.png"


# --------------------------------------------------------------------------- Fig. 2
def fig2a(ctx: Context) -> Item:
    """Mean accepted length of lossless speculative decoding (EAGLE-2 tree) per model and temperature."""
    rows = []
    for model in ctx.config.models:
        for t in (0.0, 1.0):
            s = Session(f"{model}-T{t:g}-eagle2", model, t, (_eagle2(ctx),), ctx.config.fig2a_images)
            data = run_session(ctx, s)
            if data is None:
                continue
            rows.append({"model": model, "kind": ctx.kind(model), "temperature": t, **data.stats("eagle2")})
    df = pd.DataFrame(rows)
    fig = None
    if ctx.shard.merges:
        with plots.style():
            fig, ax = plots.new_figure(width=3.6, height=2.4)
            models = list(dict.fromkeys(df["model"]))
            x = np.arange(len(models))
            for j, t in enumerate((0.0, 1.0)):
                d = df[df["temperature"] == t].set_index("model").reindex(models)
                ax.bar(
                    x + (j - 0.5) * 0.38,
                    d["tau"],
                    width=0.38,
                    color=plots.color_for(f"T{t:g}", j),
                    label=f"temperature {t:g}",
                )
                for xi, v in zip(x + (j - 0.5) * 0.38, d["tau"]):
                    ax.text(xi, v + 0.03, f"{v:.2f}", ha="center", va="bottom", fontsize=6)
            ax.set_xticks(x, [f"{m}\n({ctx.kind(m)})" for m in models])
            ax.set_ylabel("mean accepted length τ\n(bonus token counted)")
            ax.set_title("lossless SD with the EAGLE-2 tree", fontsize=8)
            ax.legend(fontsize=6)
    figs = [_savefig(ctx, fig, "fig2a", "fig2a")] if fig is not None else []
    notes = _quick(
        ctx,
        [
            "The paper draws Fig. 2a as bars (LlamaGen and Anole far below the text LLMs); its "
            "values are not published as numbers.",
            "On this toolkit's embedded pair the gap does not appear: 64-token Fashion-MNIST images are "
            "more predictable than natural images (see Fig. 2c).",
        ]
        + batch_note(ctx, ctx.config.models),
    )
    return Item(
        "fig2a",
        "Fig. 2a: mean accepted length of EAGLE-2 (lossless) on image vs text models",
        {"ours": df},
        figs,
        _settings(ctx, images=ctx.config.fig2a_images, models=list(ctx.config.models)),
        notes,
    )


def _accuracy_table(ctx: Context, model: str) -> Optional[pd.DataFrame]:
    path = ctx.config.drafters.get(model) or shipped_drafter_path(model)
    table = accuracy_table_path(path)
    return read_table(table).assign(model=model) if table.is_file() else None


def fig2b(ctx: Context) -> Item:
    """Drafter test accuracy per epoch per model (epoch 0 = random init), and EAGLE-2's mean
    accepted length with a random-initialised vs the trained drafter (the review discussion)."""
    tables = [t for t in (_accuracy_table(ctx, m) for m in ctx.config.models) if t is not None]
    acc = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if len(acc):
        acc = acc[["model", "epoch", "top1", "top2", "top3", "test_ce", "test_positions"]]
    rows = []
    for t in (0.0, 1.0):
        s = Session(
            f"{ctx.primary}-T{t:g}-random-init",
            ctx.primary,
            t,
            (_eagle2(ctx, "random-init", name="eagle2-random-init"), _eagle2(ctx)),
            ctx.config.random_init_images,
        )
        data = run_session(ctx, s)
        if data is not None:
            for name, label in (("eagle2-random-init", "random init"), ("eagle2", "trained")):
                rows.append({"drafter": label, "temperature": t, **data.stats(name)})
    tau = pd.DataFrame(rows)
    pub_tau = pd.DataFrame([{"drafter": d, "temperature": t, "tau": v} for (d, t), v in P.RANDOM_INIT.items()])
    pub_acc = pd.DataFrame([{"model": m, "top1": v} for m, v in P.DRAFTER_TOP1.items()])
    figs = []
    if ctx.shard.merges and len(acc):
        with plots.style():
            models = list(dict.fromkeys(acc["model"]))
            fig, axes = plots.new_figure(1, len(models), width=2.6 * len(models), height=2.4)
            axes = np.atleast_1d(axes)
            for ax, model in zip(axes, models):
                d = acc[acc["model"] == model]
                for i, k in enumerate((1, 2, 3)):
                    ax.plot(
                        d["epoch"],
                        100 * d[f"top{k}"],
                        marker="o",
                        markersize=2.5,
                        color=plots.color_for(f"top-{k}", i),
                        label=f"top-{k}",
                    )
                for j, (name, v) in enumerate(P.DRAFTER_TOP1.items()):
                    ax.axhline(100 * v, color="0.5", ls=("--", ":")[j % 2], lw=0.8, label=f"{name} top-1 (paper)")
                ax.set_title(model, fontsize=8)
                ax.set_xlabel("epoch (0 = random init)")
                ax.set_ylim(0, 100)
            axes[0].set_ylabel("test accuracy (%)")
            axes[0].legend(fontsize=5.5)
            figs.append(_savefig(ctx, fig, "fig2b", "fig2b"))
    notes = _quick(
        ctx,
        [
            "Accuracy: the fraction of held-out teacher-forced positions whose drafter top-k contains "
            "the target's top-1 (from each drafter's training table).",
            "τ is EAGLE-2's mean accepted length (bonus token counted) with the same tree, on the same "
            "images, with a randomly initialised drafter of the same architecture vs the trained one.",
        ],
    )
    return Item(
        "fig2b",
        "Fig. 2b: drafter test accuracy per epoch; random-init vs trained drafter",
        {"ours": acc, "ours_tau": tau, "published": pub_acc, "published_tau": pub_tau},
        figs,
        _settings(ctx, images=ctx.config.random_init_images),
        notes,
    )


def fig2c(ctx: Context) -> Item:
    """Average top-1 probability and top-10 mass per model with bootstrap intervals."""
    figs, result = [], pd.DataFrame()
    if ctx.shard.merges:  # profiling is cheap: the merging process does it alone
        settings = CompareSettings(num_images=max(2, ctx.config.profile_images), seed=ctx.config.seed)
        models = [ctx.model(m) for m in ctx.config.models]
        result, tables = compare(models, settings, out=ctx.subdir("fig2c", "profiles"), progress=ctx.progress)
        rows = result.to_dict(orient="records")
        figs.append(_savefig(ctx, plot_ambiguity(rows, tables, settings.level, paper=True), "fig2c", "fig2c"))
        result = result[
            [
                "model",
                "kind",
                "images",
                "tokens",
                "top1",
                "top1_lo",
                "top1_hi",
                "top10",
                "top10_lo",
                "top10_hi",
                "entropy",
                "entropy_lo",
                "entropy_hi",
            ]
        ]
    pub = pd.DataFrame([{"model": m, **v} for m, v in P.AMBIGUITY.items()])
    notes = _quick(
        ctx,
        [
            "Means over tokens of the next-token distribution each model samples from (temperature 1, "
            "no classifier-free guidance: cfg 1), 95 % bootstrap intervals over images (the paper "
            "profiles MS-COCO captions)."
        ],
    )
    return Item(
        "fig2c",
        "Fig. 2c: average top-1 probability and top-10 mass per model",
        {"ours": result, "published": pub},
        figs,
        _settings(ctx, tree=False, images=ctx.config.profile_images, models=list(ctx.config.models)),
        notes,
    )


# --------------------------------------------------------------------------- Fig. 3
def fig3(ctx: Context) -> Item:
    """Latent interchangeability: replacing tokens by latent neighbours vs random tokens."""
    model = ctx.model(ctx.primary)
    if not model.can_decode:
        raise UsageError(f"{ctx.primary} has no VQ decoder loaded; Fig. 3 decodes tokens to pixels")
    figs, summary = [], pd.DataFrame()
    if ctx.shard.merges:
        V = model.vocab_size
        ks = sorted({k for k in (1, 4, 16, ctx.k(ctx.primary, ctx.config.paper_k)) if k < V})
        rates = (0.1, 0.25, 0.5, 1.0)
        codes, nb, _, summary = run_interchangeability(
            model,
            ks,
            rates,
            num_images=ctx.config.interchange_images,
            seed=ctx.config.seed,
            sampling=sampling_for(ctx, ctx.primary, 1.0),
            out_dir=ctx.subdir("fig3", "run"),
            progress=ctx.progress,
        )
        k = ctx.k(ctx.primary, ctx.config.paper_k)
        images, labels = replacement_rows(
            model, codes, nb, k, (0.25, 1.0), seed=ctx.config.seed, show=min(6, len(codes))
        )
        fig = plots.image_grid(
            images,
            ncol=min(6, len(codes)),
            row_labels=labels,
            title=f"{ctx.primary}: tokens replaced by latent neighbours (B_{k}) vs random tokens",
        )
        figs.append(_savefig(ctx, fig, "fig3", "fig3_images"))
        plot_psnr(summary, ctx.subdir("fig3") / "fig3_psnr", title="PSNR vs the untouched decode")
        figs.append("fig3/fig3_psnr.png")
    notes = _quick(
        ctx,
        [
            "PSNR (dB) of the decoded image after replacing a fraction r of its tokens by a random "
            "member of B_k (latent neighbours, l2 on the codebook) or by uniformly random codes.",
            "The paper shows this qualitatively (Fig. 3, images); no numbers are published.",
        ],
    )
    return Item(
        "fig3",
        "Fig. 3: latent interchangeability of tokens",
        {"ours": summary},
        figs,
        _settings(ctx, tree=False, images=ctx.config.interchange_images),
        notes,
    )


# --------------------------------------------------------------------------- Fig. 4 and 5
def _grid_methods(ctx: Context) -> list[tuple[int, float, str]]:
    return [(k, d, _lantern_name(ctx, k, d)) for k in ctx.config.ks for d in ctx.config.deltas]


def fig4(ctx: Context) -> Item:
    """Samples over δ and k, the same seeds in every cell."""
    data = main_session(ctx, 1.0)
    figs = []
    if data is not None:
        show, c = ctx.config.show, ctx.config
        rows, labels = [pixels(ctx, data, "ar", show)], ["AR"]
        rows.append(pixels(ctx, data, "eagle2", show))
        labels.append("EAGLE-2")
        for k in c.ks:
            for d in c.deltas:
                rows.append(pixels(ctx, data, _lantern_name(ctx, k, d), show))
                labels.append(f"k={ctx.k(ctx.primary, k)}, δ={d:g}")
        fig = plots.image_grid(
            torch.cat(rows),
            ncol=show,
            row_labels=labels,
            title=f"{ctx.primary}, temperature 1: images 0-{show - 1} (same seeds in every row)",
        )
        figs.append(_savefig(ctx, fig, "fig4", "fig4"))
    return Item(
        "fig4",
        "Fig. 4: samples over δ and k with the same seeds",
        {},
        figs,
        _settings(ctx, data, shown=ctx.config.show),
        _quick(ctx, [_k_note(ctx)]),
    )


def fig5(ctx: Context) -> Item:
    """Quality against speed-up and mean accepted length over the (k, δ) grid (temperature 1)."""
    data = main_session(ctx, 1.0)
    n = ctx.config.grid_images
    df = pd.DataFrame()
    figs = []
    if data is not None:
        names = ["ar", "eagle2"] + [name for _, _, name in _grid_methods(ctx)]
        df = _method_rows(ctx, data, names, n)
        figs.append(_savefig(ctx, _plot_quality_speed(df, ctx), "fig5", "fig5"))
    notes = _quick(
        ctx,
        [
            _k_note(ctx),
            f"Quality of the first {n} images of every method against the real "
            f"{ctx.config.reference} images (FID/KID/precision/recall per feature extractor, "
            f"95 % intervals: jackknife, Wilson for precision); FID at small n is biased upward: "
            f"compare at equal n only.",
            "CLIP score and HPS v2 need captions (text-to-image models): not available for a class-conditional model.",
        ]
        + _prdc_note(n),
    )
    return Item(
        "fig5",
        "Fig. 5: image quality vs speed-up and mean accepted length over δ and k",
        {"ours": df},
        figs,
        _settings(ctx, data, grid_images=n),
        notes,
    )


METRIC_TITLES = {
    "fid": "FID",
    "kid": "KID",
    "precision": "precision",
    "recall": "recall",
    "density": "density",
    "coverage": "coverage",
}


def _metric_title(metric: str) -> str:
    """``fid_fmnist`` -> ``FID (fmnist features)``."""
    name, _, extractor = metric.partition("_")
    return METRIC_TITLES.get(name, name) + (f" ({extractor} features)" if extractor else "")


DELTA_MARKERS = "osDvP^<>"


def _plot_quality_speed(df: pd.DataFrame, ctx: Context):
    """Fig. 5: one row per quality metric (title: metric and extractor), speed-up (ratio of total
    latencies) and τ along x; LANTERN: one line per k (colour) through its δ values (marker shape,
    so coinciding points never overprint text), each point with its 95 % interval (the table's ci
    columns); AR and EAGLE-2 as grey markers; one legend below the panels."""
    from matplotlib.lines import Line2D

    metrics = [
        m for m in df.columns if m.split("_")[0] in ("fid", "precision", "recall") and not m.endswith(("_lo", "_hi"))
    ]
    rows = max(1, len(metrics))
    height = 1.9 * rows + 0.6
    grid = df[df["name"].str.startswith("lantern")]
    ks = sorted(grid["k"].dropna().unique())
    deltas = sorted(grid["delta"].dropna().unique())
    marker_of = {d: DELTA_MARKERS[i % len(DELTA_MARKERS)] for i, d in enumerate(deltas)}

    def bars(rows_, metric, lo, hi):
        if lo is None or hi is None:
            return None
        return np.vstack(
            [(rows_[metric] - lo[rows_.index]).clip(lower=0), (hi[rows_.index] - rows_[metric]).clip(lower=0)]
        )

    with plots.style():
        fig, axes = plots.new_figure(rows, 2, width=6.0, height=height)
        axes = np.atleast_2d(axes)
        for i, metric in enumerate(metrics):
            lo, hi = df.get(f"{metric}_lo"), df.get(f"{metric}_hi")
            for j, x in enumerate(("speedup", "tau")):
                ax = axes[i, j]
                for ci, k in enumerate(ks):
                    col = plots.color_for(f"k{k}", ci)
                    d = grid[grid["k"] == k].sort_values("delta")
                    ax.plot(d[x], d[metric], color=col, lw=1.0, zorder=2)
                    for delta, r in d.groupby("delta"):
                        ax.errorbar(
                            r[x],
                            r[metric],
                            yerr=bars(r, metric, lo, hi),
                            fmt=marker_of[delta],
                            color=col,
                            markersize=3.5,
                            capsize=1.5,
                            elinewidth=0.6,
                            zorder=3,
                        )
                for name, marker in (("ar", "X"), ("eagle2", "*")):
                    r = df[df["name"] == name]
                    if len(r):
                        ax.errorbar(
                            r[x],
                            r[metric],
                            yerr=bars(r, metric, lo, hi),
                            fmt=marker,
                            color="0.3",
                            markersize=4.5,
                            capsize=1.5,
                            elinewidth=0.6,
                            zorder=3,
                        )
                values = pd.concat([df[metric]] + [c for c in (lo, hi) if c is not None]).dropna()
                if len(values) and float(values.max() - values.min()) < 1e-9:  # one value for every method
                    v = float(values.iloc[0])
                    ax.set_ylim(v - 0.5, v + 0.5)
                    ax.set_yticks([v])
                    ax.text(
                        0.5,
                        0.12,
                        "the same value for every method",
                        transform=ax.transAxes,
                        ha="center",
                        fontsize=5.5,
                        color="0.35",
                    )
                ax.set_xlabel(
                    "speed-up over AR (ratio of total latencies)"
                    if x == "speedup"
                    else "mean accepted length τ (bonus token counted)"
                )
                ax.set_ylabel(METRIC_TITLES.get(metric.split("_")[0], metric))
                ax.set_title(_metric_title(metric), fontsize=7)
        n = int(df["images"].max()) if "images" in df and df["images"].notna().any() else None
        fig.suptitle(
            f"{ctx.primary}: quality vs speed over δ and k (temperature 1"
            + (f", {n} images per method" if n else "")
            + "; bars: 95 % intervals)",
            fontsize=8,
        )
        handles = [
            Line2D([], [], color=plots.color_for(f"k{k}", ci), lw=1.0, label=f"LANTERN k={int(k)}")
            for ci, k in enumerate(ks)
        ]
        handles += [
            Line2D([], [], color="0.45", marker=marker_of[d], ls="none", markersize=3.5, label=f"δ={d:g}")
            for d in deltas
        ]
        handles += [
            Line2D([], [], color="0.3", marker=m, ls="none", markersize=4.5, label=label)
            for m, label in (("X", "AR"), ("*", "EAGLE-2 (lossless)"))
        ]
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize=6, frameon=False)
    return fig


# --------------------------------------------------------------------------- Tables 2 and 3
def table2(ctx: Context) -> Item:
    """AR, EAGLE-2 and LANTERN at the paper's setting, temperature 0 and 1: τ, speed-up, quality;
    and the precision/recall grid over k and δ (review discussion)."""
    frames, timed = [], []
    for t in (0.0, 1.0):
        data = main_session(ctx, t)
        if data is None:
            continue
        timed.append((t, data.session.rounds))
        frames.append(
            _method_rows(
                ctx,
                data,
                ["ar", "eagle2", _lantern_name(ctx, ctx.config.paper_k, ctx.config.paper_delta)],
                data.session.rounds,
            )
        )
    ours = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    pr = pd.DataFrame()
    data = main_session(ctx, 1.0)
    if data is not None and ctx.model(ctx.primary).can_decode:
        n = ctx.config.grid_images
        rows = [
            {
                "k_paper": None,
                "k": None,
                "delta": None,
                "method": "AR",
                **_pr(ctx, data, "ar", n),
                "published_precision": P.AR_PRECISION_RECALL[0],
                "published_recall": P.AR_PRECISION_RECALL[1],
            }
        ]
        measured = {(k, d): name for k, d, name in _grid_methods(ctx)}
        for k, d in sorted(set(measured) | set(P.PRECISION_RECALL)):  # every published cell, measured or not
            pub = P.PRECISION_RECALL.get((k, d), (None, None))
            mine = (
                _pr(ctx, data, measured[(k, d)], n) if (k, d) in measured else {"extractor": "not in this run's grid"}
            )
            rows.append(
                {
                    "k_paper": k,
                    "k": ctx.k(ctx.primary, k),
                    "delta": d,
                    "method": "LANTERN",
                    **mine,
                    "published_precision": pub[0],
                    "published_recall": pub[1],
                    "published_hps": P.HPS.get((k, d)),
                }
            )
        pr = pd.DataFrame(rows)
    pub = pd.DataFrame(
        [{"temperature": t, "method": m, "speedup": v} for t, d in P.SPEEDUP.items() for m, v in d.items()]
    )
    notes = _quick(
        ctx,
        [
            _k_note(ctx),
            "Speed-up: the ratio of total (equivalently mean) latencies, AR / method, as the paper "
            "reports it; each image is decoded by every method in a random order after a warm-up. Its "
            "spread: per_image_speedup is the median [quartiles] of the per-image ratios AR / method "
            "(the ratio of totals weighs slow images more, so it can lie outside them). "
            "ar_ms_per_forward is AR's milliseconds per target forward; "
            "a 'flag' column appears where the speed-up exceeds the tokens per target forward (a slow "
            "baseline loop).",
            *_timing_note(ctx, timed),
            *batch_note(ctx, [ctx.primary]),
            "τ counts the bonus token; the paper writes τ for the temperature, here 'temperature'.",
            f"Published speed-ups are LlamaGen-XL Stage I on a GPU ({P.SOURCES['table2']}); {P.SOURCES['abstract']}.",
            "CLIP score and HPS v2 need captions: not available for a class-conditional model "
            "(published HPS v2 at δ = 0.05 is in the precision/recall table).",
        ]
        + _prdc_note(min(ctx.config.grid_images, ctx.config.main_images)),
    )
    tables = {"ours": ours, "published": pub}
    if len(pr):
        tables["precision_recall"] = pr
    return Item(
        "table2",
        "Table 2: AR vs EAGLE-2 vs LANTERN (temperature 0 and 1), and the precision/recall grid",
        tables,
        [],
        _settings(
            ctx,
            k_paper=ctx.config.paper_k,
            delta=ctx.config.paper_delta,
            main_images=ctx.config.main_images,
            greedy_images=ctx.config.greedy_images,
            grid_images=ctx.config.grid_images,
        ),
        notes,
    )


def _pr(ctx: Context, data: SessionData, method: str, n: int) -> dict:
    q = _quality_row(ctx, data, method, n)
    ex = ctx.config.extractors[0]
    return {"precision": q.get(f"precision_{ex}"), "recall": q.get(f"recall_{ex}"), "extractor": ex}


def table3(ctx: Context) -> Item:
    """Neighbour-metric ablation (l2, cosine, random) and TVD vs JSD at matched speed-up (temperature 1)."""
    data = main_session(ctx, 1.0)
    c = ctx.config
    df = pd.DataFrame()
    notes = _quick(ctx, [_k_note(ctx)])
    if data is not None:
        tvd_name = _lantern_name(ctx, c.paper_k, c.paper_delta)  # the JSD runs' neighbours: the quantiser's codebook
        metric_names = [_lantern_name(ctx, c.paper_k, c.paper_delta, m, matrix=TABLE3_MATRIX) for m in ("l2", "cosine")]
        metric_names.append(_lantern_name(ctx, c.paper_k, c.paper_delta, "random"))
        jsd_names = [_lantern_name(ctx, c.paper_k, d, method="lantern-jsd") for d in c.jsd_deltas]
        df = _method_rows(ctx, data, ["ar", "eagle2", tvd_name] + metric_names + jsd_names, c.grid_images)
        tvd = df[df["name"] == tvd_name]["speedup"].iloc[0]
        jsd = df[df["name"].isin(jsd_names)]
        best = jsd.iloc[(jsd["speedup"] - tvd).abs().argmin()]["name"] if len(jsd) else None
        df["matched_to_tvd"] = df["name"] == best
        notes.append(
            f"TVD vs JSD: the JSD bound (nats) whose speed-up is closest to TVD's at δ = {c.paper_delta:g} "
            f"is marked matched_to_tvd; all JSD bounds are listed."
        )
        notes.append(
            "Neighbour metrics (l2, cosine) are measured on the raw, un-normalised codebook weights, as "
            "the official code builds its table (torch.cdist on the VQ embedding weights): the quantiser "
            "compares l2-normalised codes, and on unit vectors |a - b|² = 2 - 2 cos(a, b), so l2 and "
            "cosine would order neighbours identically and their rows would be equal by construction. "
            "The TVD-vs-JSD rows use the quantiser's (normalised) codebook like every other item."
        )
        notes.append(_raw_codebook_note(ctx, ctx.k(ctx.primary, c.paper_k)))
        notes.append(
            "The paper reports L2 ≈ cosine > random and TVD ≈ JSD in words; its Table 3 values are not "
            "published here as numbers."
        )
    return Item(
        "table3",
        "Table 3: neighbour metric (l2 / cosine / random) and TVD vs JSD at matched speed-up",
        {"ours": df},
        [],
        _settings(ctx, data, grid_images=c.grid_images, jsd_deltas=list(c.jsd_deltas)),
        notes,
    )


def _raw_codebook_note(ctx: Context, k: int) -> str:
    """How far apart l2 and cosine neighbours are on the primary model's raw codebook: the norm
    range of its stored codes and the shared fraction of the two B_k tables."""
    from ambiguity.neighbourhood import model_neighbourhoods

    model = ctx.model(ctx.primary)
    norms = model.raw_codebook().norm(dim=1)
    a, b = (model_neighbourhoods(model, k, metric, "codebook-raw").indices for metric in ("l2", "cosine"))
    shared = sum(len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b)) / a.numel()
    return (
        f"On {ctx.primary}'s raw codebook the stored codes have norms {float(norms.min()):.2f}-"
        f"{float(norms.max()):.2f}, so l2 and cosine B_{k} share {100 * shared:.1f} % of their neighbours: the "
        f"closer the norms are to equal, the closer the two rows are by construction."
    )


# --------------------------------------------------------------------------- App. F
F1_MIN_BAND = 5  # F.1 draws bootstrap bands from this many images on


def f1(ctx: Context) -> Item:
    """Speed-up over AR measured on the first n images, for n up to ``main_images``."""
    data = main_session(ctx, 1.0)
    df, figs = pd.DataFrame(), []
    if data is not None:
        n = data.session.rounds if int(ctx.config.batch_size) == 1 else min(data.session.rounds, _timed_rounds(data))
        ns = sorted({x for x in (*range(1, 11), 20, 50, 100, 200, 500, 1000, 2000, 5000) if x <= n} | {n})
        lantern = _lantern_name(ctx, ctx.config.paper_k, ctx.config.paper_delta)
        curves = {
            label: speedup_curve(data.timing, name, "ar", ns, seed=ctx.config.seed)
            for label, name in (("EAGLE-2", "eagle2"), ("LANTERN", lantern))
        }
        df = pd.concat([c.assign(method=label) for label, c in curves.items()], ignore_index=True)
        with plots.style():
            fig, ax = plots.new_figure(width=3.6, height=2.4)
            for i, (label, c) in enumerate(curves.items()):
                col = plots.color_for(label, i)
                ax.plot(c["n"], c["speedup"], marker="o", markersize=2.5, color=col, label=label)
                band = c[c["n"] >= F1_MIN_BAND]  # a bootstrap over a handful of images says nothing
                ax.fill_between(band["n"], band["ci_low"], band["ci_high"], color=col, alpha=0.2, linewidth=0)
            ax.axhline(1.0, color="0.5", lw=0.7, ls=":")
            ax.set_xscale("log")
            ticks = (
                ns if len(ns) <= 10 else [x for x in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if x <= n]
            )
            ax.xaxis.set_major_locator(mticker.FixedLocator(ticks))
            ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(mticker.NullFormatter())
            ax.set_xlabel("images measured (n)")
            ax.set_ylabel("speed-up over AR\n(ratio of total latencies)")
            ax.set_title(f"{ctx.primary}, temperature 1: speed-up on the first n images", fontsize=7)
            ax.legend(fontsize=6, loc="best")
        figs.append(_savefig(ctx, fig, "f1", "f1"))
    notes = _quick(
        ctx,
        [
            "Speed-up (ratio of total latencies) on the first n images, n = 1 ... 10 then 20, 50, ... "
            "(each decoded once by AR, EAGLE-2 and LANTERN, interleaved in a random order per image after "
            f"a warm-up); band: 95 % bootstrap over those images, drawn from n = {F1_MIN_BAND} on.",
            *(_timing_note(ctx, [(1.0, data.session.rounds)]) if data is not None else []),
            P.SOURCES["f1"] + ".",
        ],
    )
    return Item(
        "f1", "App. F.1: measured speed-up vs number of images", {"ours": df}, figs, _settings(ctx, data), notes
    )


def _timed_rounds(data: SessionData) -> int:
    """How many rounds of ``data`` were timed (the first ``--timing-images`` with --batch-size > 1)."""
    return int(data.timing["round"].nunique()) if len(data.timing) else 0


def f2(ctx: Context) -> Item:
    """Cost of building A and of the whole acceptance decision vs one target and one drafter
    forward, from the timers inside the real decoding steps (k and δ of App. F.2)."""
    data = main_session(ctx, 1.0)
    df = pd.DataFrame()
    c = ctx.config
    if data is not None:
        name = _lantern_name(ctx, c.paper_k, c.f2_delta)
        st = data.steps[(data.steps["method"] == name) & (data.steps["drafter_forwards"] > 0)]
        ar = data.steps[data.steps["method"] == "ar"]
        per_step = {k: float(st[f"{k}_s"].mean()) for k in ("target", "drafter", "acceptance", "proximity")}
        drafter_fwd = float(st["drafter_s"].sum() / st["drafter_forwards"].sum())
        rows = [
            {"quantity": "target forward (tree verification)", "ms": 1e3 * per_step["target"]},
            {"quantity": "target forward (AR, one token)", "ms": 1e3 * float(ar["target_s"].mean())},
            {"quantity": "drafter forward", "ms": 1e3 * drafter_fwd},
            {"quantity": "acceptance decision (per step)", "ms": 1e3 * per_step["acceptance"]},
            {"quantity": "building A (per step)", "ms": 1e3 * per_step["proximity"]},
        ]
        df = pd.DataFrame(rows)
        a = per_step["proximity"]
        df["target_forward_over_A"] = [per_step["target"] / a] + [np.nan] * 4
        df["drafter_forward_over_A"] = [np.nan, np.nan, drafter_fwd / a, np.nan, np.nan]
    pub = pd.DataFrame(
        [
            {"quantity": "target forward / A", "ratio": P.PROXIMITY_COST["target_forward_over_A"]},
            {"quantity": "drafter forward / A", "ratio": P.PROXIMITY_COST["drafter_forward_over_A"]},
        ]
    )
    notes = _quick(
        ctx,
        [
            f"Timed inside the decoding steps of LANTERN k={ctx.k(ctx.primary, c.paper_k)} "
            f"δ={c.f2_delta:g} (EAGLE-2 tree) of the temperature-1 session: building A (the proximity "
            f"sets of every judged draft) is part of the acceptance decision; per verification step.",
            "On this tiny CPU model a forward costs milliseconds, so the ratios are far smaller than "
            "at LlamaGen-XL scale (see benchmarks/bench_acceptance.py for XL shapes).",
            P.SOURCES["f2"] + ".",
        ],
    )
    return Item(
        "f2",
        "App. F.2: cost of building A and of acceptance vs target and drafter forwards",
        {"ours": df, "published": pub},
        [],
        _settings(ctx, data, k_paper=c.paper_k, delta=c.f2_delta),
        notes,
    )


def pairs_session(ctx: Context) -> Optional[SessionData]:
    """The AR samples whose (p, q) pairs the distortion item measures: a session of its own,
    ``<primary>-T1-pairs``, with AR alone for ``pairs_images`` rounds. Its round r is image r of the
    temperature-1 main session (same condition, same seeded stream), so the tokens are the main
    session's first AR samples (up to float rounding of batched rounds) without decoding its other methods."""
    s = Session(
        f"{ctx.primary}-T1-pairs",
        ctx.primary,
        1.0,
        (Method("ar", DecodeConfig.of("ar"), "AR"),),
        ctx.config.pairs_images,
    )
    return run_session(ctx, s)


def distortion(ctx: Context) -> Item:
    """Exact per-step TVD(output, p) of LANTERN on real (p, q) pairs over k and δ, with its drivers
    (entropies and top-1 of p and q, TVD(q, p)) and bootstrap intervals over images."""
    data = pairs_session(ctx)
    df, figs = pd.DataFrame(), []
    c = ctx.config
    n = c.pairs_images
    if data is not None:
        model = ctx.model(ctx.primary)
        p, q, groups = real_pairs(
            model, ctx.drafter(ctx.primary), data.tokens["ar"][:n], data.conditions[:n], data.sampling, with_groups=True
        )
        ks = sorted({ctx.k(ctx.primary, k) for k in c.ks})
        table = neighbour_table(model, DecodeConfig.of("lantern", k=max(ks)))
        df = distortion_table(p, q, table, ks, c.deltas, groups=groups, seed=c.seed)
        with plots.style():
            fig, ax = plots.new_figure(width=3.6, height=2.4)
            d = df[df["what"] == "TVD(out, p)"]
            for i, k in enumerate(ks):
                dk = d[d["k"] == k].sort_values("delta")
                color = plots.color_for(f"k{k}", i)
                ax.fill_between(dk["delta"], dk["ci_low"], dk["ci_high"], color=color, alpha=0.2, lw=0)
                ax.plot(dk["delta"], dk["mean"], marker="o", markersize=2.5, color=color, label=f"k={k}")
            xs = np.array(sorted(c.deltas))
            ax.plot(xs, xs, color="0.5", ls=":", lw=0.8, label="δ")
            own = df.iloc[0]  # TVD(q, p)
            ax.axhspan(float(own["ci_low"]), float(own["ci_high"]), color="0.3", alpha=0.12, lw=0)
            ax.axhline(float(own["mean"]), color="0.3", ls="--", lw=0.8, label="TVD(q, p)")
            ax.set_xlabel("δ (TVD bound per draft)")
            ax.set_ylabel("mean TVD(output, p)")
            ax.set_title(f"{ctx.primary}, temperature 1: one LANTERN step's output vs p ({n} images)", fontsize=7)
            ax.legend(fontsize=6)
        figs.append(_savefig(ctx, fig, "distortion", "distortion"))
    notes = _quick(
        ctx,
        [
            "Exact distribution of the token one LANTERN verification step emits (no sampling), "
            f"compared with the target's p, on the (p, q) pairs at every position of {n} AR samples "
            f"(--pairs-images; an AR-only session, {ctx.primary}-T1-pairs, whose images are the first "
            "ones of the temperature-1 session) with teacher-forced target and drafter and the "
            "processing of decoding.",
            "The δ bound holds per draft (moved mass ≤ δ), not for the output: TVD(out, p) can exceed δ "
            "when the drafter is far from p. Our own finding; not in the paper.",
            "Drivers on the same pairs (k = 0, δ = 0): H(p) and H(q) in nats, p top-1 = max p (probability), "
            "q top-1 = p top-1 = the fraction of positions where the drafter's argmax is the target's "
            "(its median / q90 / max are of the 0/1 indicator).",
            "ci_low, ci_high: 95 % percentile bootstrap interval of the mean (2000 resamples of the "
            "images, positions of one image kept together; seed = the run's seed).",
        ],
    )
    return Item(
        "distortion",
        "Distortion: exact per-step TVD(output, p) of the relaxed rule, and its drivers",
        {"ours": df},
        figs,
        _settings(ctx, data, tree=False, pairs_images=c.pairs_images),
        notes,
    )


EXPERIMENTS: dict[str, Callable[[Context], Item]] = {
    "fig2a": fig2a,
    "fig2b": fig2b,
    "fig2c": fig2c,
    "fig3": fig3,
    "fig4": fig4,
    "fig5": fig5,
    "table2": table2,
    "table3": table3,
    "f1": f1,
    "f2": f2,
    "distortion": distortion,
}
# one line per experiment for --help: the first paragraph of its docstring, without reST markup
TITLES = {name: " ".join(fn.__doc__.split("\n\n")[0].split()).replace("``", "") for name, fn in EXPERIMENTS.items()}
