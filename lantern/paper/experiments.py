"""The paper's items, one function each: ``fn(ctx) -> Item`` (see :mod:`lantern.paper`).

Decoding experiments share three sessions of the primary image model
(:mod:`lantern.paper.sessions`): temperature 1 (AR, EAGLE-2 and LANTERN at the paper's setting
for ``main_images`` images; the (k, δ) grid, the neighbour-metric and JSD variants for the first
``grid_images``), temperature 0 (AR, EAGLE-2, LANTERN for ``greedy_images``), and small
sessions for Fig. 2a/2b and the distortion item (AR alone for ``pairs_images``: the first images
of the temperature-1 session). EAGLE-2 is lossless speculative decoding with the EAGLE-2 dynamic tree;
LANTERN uses the same tree. Every speed-up is a ratio of latencies timed interleaved after a
warm-up (:mod:`lantern.timing`).

Here: Fig. 2a-c, 3, 4, 5, Tables 2 and 3, App. F.1 and F.2, and :data:`EXPERIMENTS` / :data:`TITLES`.
The methods, the main sessions, the method rows, settings and notes the items share are in
:mod:`lantern.paper.methods`; Fig. 5's plot in :mod:`lantern.paper.quality_speed`; the distortion
item and its AR session in :mod:`lantern.paper.distortion_item`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
import torch

from ambiguity import plots
from ambiguity.analyses.interchangeability import plot_psnr, replacement_rows, run_interchangeability
from ambiguity.compare import CompareSettings, compare_models, plot_ambiguity
from ambiguity.errors import UsageError
from ambiguity.io import read_table
from ambiguity.runs import RunOptions
from lantern.drafter.model import accuracy_table_path, shipped_drafter_path
from lantern.drafter.report import plot_topk_curves
from lantern.paper import published as P
from lantern.paper.context import Context
from lantern.paper.distortion_item import distortion
from lantern.paper.methods import (
    TABLE3_MATRIX,
    eagle2_method,
    grid_methods,
    item_settings,
    k_note,
    lantern_name,
    main_session,
    method_rows,
    prdc_note,
    precision_recall,
    quick_notes,
    raw_codebook_note,
    savefig,
    timed_rounds,
    timing_note,
)
from lantern.paper.quality_speed import plot_quality_speed
from lantern.paper.report import Item
from lantern.paper.sessions import Session, pixels, run_session, sampling_for
from lantern.timing import speedup_curve

__all__ = ["EXPERIMENTS", "TITLES", "plot_f1"]


# --------------------------------------------------------------------------- Fig. 2
def fig2a(ctx: Context) -> Item:
    """Mean accepted length of lossless speculative decoding (EAGLE-2 tree) per model and temperature."""
    rows = []
    for model in ctx.config.models:
        for t in (0.0, 1.0):
            s = Session(f"{model}-T{t:g}-eagle2", model, t, (eagle2_method(ctx),), ctx.config.fig2a_images)
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
    figs = [savefig(ctx, fig, "fig2a", "fig2a")] if fig is not None else []
    notes = quick_notes(
        ctx,
        [
            "The paper draws Fig. 2a as bars (LlamaGen and Anole far below the text LLMs); its "
            "values are not published as numbers.",
            "On this toolkit's embedded pair the gap does not appear: 64-token Fashion-MNIST images are "
            "more predictable than natural images (see Fig. 2c).",
        ],
    )
    return Item(
        "fig2a",
        "Fig. 2a: mean accepted length of EAGLE-2 (lossless) on image vs text models",
        {"ours": df},
        figs,
        item_settings(ctx, images=ctx.config.fig2a_images, models=list(ctx.config.models)),
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
            (eagle2_method(ctx, "random-init", name="eagle2-random-init"), eagle2_method(ctx)),
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
                plot_topk_curves(ax, d, markersize=2.5)
                for j, (name, v) in enumerate(P.DRAFTER_TOP1.items()):
                    ax.axhline(100 * v, color="0.5", ls=("--", ":")[j % 2], lw=0.8, label=f"{name} top-1 (paper)")
                ax.set_title(model, fontsize=8)
                ax.set_xlabel("epoch (0 = random init)")
                ax.set_ylim(0, 100)
            axes[0].set_ylabel("test accuracy (%)")
            axes[0].legend(fontsize=5.5)
            figs.append(savefig(ctx, fig, "fig2b", "fig2b"))
    notes = quick_notes(
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
        item_settings(ctx, images=ctx.config.random_init_images),
        notes,
    )


def fig2c(ctx: Context) -> Item:
    """Average top-1 probability and top-10 mass per model with bootstrap intervals."""
    figs, result = [], pd.DataFrame()
    if ctx.shard.merges:  # profiling is cheap: the merging process does it alone
        settings = CompareSettings(num_images=max(2, ctx.config.profile_images), seed=ctx.config.seed)
        models = [ctx.model(m) for m in ctx.config.models]
        result, tables = compare_models(models, settings, out=ctx.subdir("fig2c", "profiles"), progress=ctx.progress)
        rows = result.to_dict(orient="records")
        figs.append(savefig(ctx, plot_ambiguity(rows, tables, settings.level, paper=True), "fig2c", "fig2c"))
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
    notes = quick_notes(
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
        item_settings(ctx, tree=False, images=ctx.config.profile_images, models=list(ctx.config.models)),
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
            options=RunOptions(out=ctx.subdir("fig3", "run"), progress=ctx.progress),
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
        figs.append(savefig(ctx, fig, "fig3", "fig3_images"))
        plot_psnr(summary, ctx.subdir("fig3") / "fig3_psnr", title="PSNR vs the untouched decode")
        figs.append("fig3/fig3_psnr.png")
    notes = quick_notes(
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
        item_settings(ctx, tree=False, images=ctx.config.interchange_images),
        notes,
    )


# --------------------------------------------------------------------------- Fig. 4 and 5
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
                rows.append(pixels(ctx, data, lantern_name(ctx, k, d), show))
                labels.append(f"k={ctx.k(ctx.primary, k)}, δ={d:g}")
        fig = plots.image_grid(
            torch.cat(rows),
            ncol=show,
            row_labels=labels,
            title=f"{ctx.primary}, temperature 1: images 0-{show - 1} (same seeds in every row)",
        )
        figs.append(savefig(ctx, fig, "fig4", "fig4"))
    return Item(
        "fig4",
        "Fig. 4: samples over δ and k with the same seeds",
        {},
        figs,
        item_settings(ctx, data, shown=ctx.config.show),
        quick_notes(ctx, [k_note(ctx)]),
    )


def fig5(ctx: Context) -> Item:
    """Quality against speed-up and mean accepted length over the (k, δ) grid (temperature 1)."""
    data = main_session(ctx, 1.0)
    n = ctx.config.grid_images
    df = pd.DataFrame()
    figs = []
    if data is not None:
        names = ["ar", "eagle2"] + [name for _, _, name in grid_methods(ctx)]
        df = method_rows(ctx, data, names, n)
        figs.append(savefig(ctx, plot_quality_speed(df, ctx), "fig5", "fig5"))
    notes = quick_notes(
        ctx,
        [
            k_note(ctx),
            f"Quality of the first {n} images of every method against the real "
            f"{ctx.config.reference} images (FID/KID/precision/recall per feature extractor, "
            f"95 % intervals: jackknife, Wilson for precision); FID at small n is biased upward: "
            f"compare at equal n only.",
            "CLIP score and HPS v2 need captions (text-to-image models): not available for a class-conditional model.",
        ]
        + prdc_note(n),
    )
    return Item(
        "fig5",
        "Fig. 5: image quality vs speed-up and mean accepted length over δ and k",
        {"ours": df},
        figs,
        item_settings(ctx, data, grid_images=n),
        notes,
    )


# --------------------------------------------------------------------------- Tables 2 and 3
def _table2_rows(ctx: Context) -> tuple[pd.DataFrame, list]:
    """Table 2's method rows (AR, EAGLE-2, LANTERN at the paper's setting) at temperature 0 and 1,
    and the (temperature, rounds) of the sessions they come from."""
    frames, timed = [], []
    for t in (0.0, 1.0):
        data = main_session(ctx, t)
        if data is None:
            continue
        timed.append((t, data.session.rounds))
        frames.append(
            method_rows(
                ctx,
                data,
                ["ar", "eagle2", lantern_name(ctx, ctx.config.paper_k, ctx.config.paper_delta)],
                data.session.rounds,
            )
        )
    ours = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return ours, timed


def _precision_recall_grid(ctx: Context) -> pd.DataFrame:
    """Precision and recall of AR and of every published and measured (k, δ) cell at temperature 1,
    next to the published values (empty when the model cannot decode pixels)."""
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
                **precision_recall(ctx, data, "ar", n),
                "published_precision": P.AR_PRECISION_RECALL[0],
                "published_recall": P.AR_PRECISION_RECALL[1],
            }
        ]
        measured = {(k, d): name for k, d, name in grid_methods(ctx)}
        for k, d in sorted(set(measured) | set(P.PRECISION_RECALL)):  # every published cell, measured or not
            pub = P.PRECISION_RECALL.get((k, d), (None, None))
            mine = (
                precision_recall(ctx, data, measured[(k, d)], n)
                if (k, d) in measured
                else {"extractor": "not in this run's grid"}
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
    return pr


def _table2_notes(ctx: Context, timed: list) -> list[str]:
    """Table 2's notes: mapped k, the speed-up's definition and spread, timing, batching, τ, sources."""
    return quick_notes(
        ctx,
        [
            k_note(ctx),
            "Speed-up: the ratio of total (equivalently mean) latencies, AR / method, as the paper "
            "reports it; each image is decoded by every method in a random order after a warm-up. Its "
            "spread: per_image_speedup is the median [quartiles] of the per-image ratios AR / method "
            "(the ratio of totals weighs slow images more, so it can lie outside them). "
            "ar_ms_per_forward is AR's milliseconds per target forward; "
            "a 'flag' column appears where the speed-up exceeds the tokens per target forward (a slow "
            "baseline loop).",
            *timing_note(ctx, timed),
            "τ counts the bonus token; the paper writes τ for the temperature, here 'temperature'.",
            f"Published speed-ups are LlamaGen-XL Stage I on a GPU ({P.SOURCES['table2']}); {P.SOURCES['abstract']}.",
            "CLIP score and HPS v2 need captions: not available for a class-conditional model "
            "(published HPS v2 at δ = 0.05 is in the precision/recall table).",
        ]
        + prdc_note(min(ctx.config.grid_images, ctx.config.main_images)),
    )


def table2(ctx: Context) -> Item:
    """AR, EAGLE-2 and LANTERN at the paper's setting, temperature 0 and 1: τ, speed-up, quality;
    and the precision/recall grid over k and δ (review discussion)."""
    ours, timed = _table2_rows(ctx)
    pr = _precision_recall_grid(ctx)
    pub = pd.DataFrame(
        [{"temperature": t, "method": m, "speedup": v} for t, d in P.SPEEDUP.items() for m, v in d.items()]
    )
    notes = _table2_notes(ctx, timed)
    tables = {"ours": ours, "published": pub}
    if len(pr):
        tables["precision_recall"] = pr
    return Item(
        "table2",
        "Table 2: AR vs EAGLE-2 vs LANTERN (temperature 0 and 1), and the precision/recall grid",
        tables,
        [],
        item_settings(
            ctx,
            k_paper=ctx.config.paper_k,
            delta=ctx.config.paper_delta,
            main_images=ctx.config.main_images,
            greedy_images=ctx.config.greedy_images,
            grid_images=ctx.config.grid_images,
        ),
        notes,
    )


def table3(ctx: Context) -> Item:
    """Neighbour-metric ablation (l2, cosine, random) and TVD vs JSD at matched speed-up (temperature 1)."""
    data = main_session(ctx, 1.0)
    c = ctx.config
    df = pd.DataFrame()
    notes = quick_notes(ctx, [k_note(ctx)])
    if data is not None:
        tvd_name = lantern_name(ctx, c.paper_k, c.paper_delta)  # the JSD runs' neighbours: the quantiser's codebook
        metric_names = [lantern_name(ctx, c.paper_k, c.paper_delta, m, matrix=TABLE3_MATRIX) for m in ("l2", "cosine")]
        metric_names.append(lantern_name(ctx, c.paper_k, c.paper_delta, "random"))
        jsd_names = [lantern_name(ctx, c.paper_k, d, method="lantern-jsd") for d in c.jsd_deltas]
        df = method_rows(ctx, data, ["ar", "eagle2", tvd_name] + metric_names + jsd_names, c.grid_images)
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
        notes.append(raw_codebook_note(ctx, ctx.k(ctx.primary, c.paper_k)))
        notes.append(
            "The paper reports L2 ≈ cosine > random and TVD ≈ JSD in words; its Table 3 values are not "
            "published here as numbers."
        )
    return Item(
        "table3",
        "Table 3: neighbour metric (l2 / cosine / random) and TVD vs JSD at matched speed-up",
        {"ours": df},
        [],
        item_settings(ctx, data, grid_images=c.grid_images, jsd_deltas=list(c.jsd_deltas)),
        notes,
    )


# --------------------------------------------------------------------------- App. F
F1_MIN_BAND = 5  # F.1 draws bootstrap bands from this many images on


def plot_f1(curves: dict, ns: list[int], n: int, primary: str):
    """App. F.1's figure: speed-up on the first n images per method ({label: speedup_curve frame with
    n, speedup, ci_low, ci_high}), with its 95 % bootstrap band from :data:`F1_MIN_BAND` images on,
    which the title says. Returns the matplotlib figure."""
    with plots.style():
        fig, ax = plots.new_figure(width=3.6, height=2.4)
        for i, (label, c) in enumerate(curves.items()):
            col = plots.color_for(label, i)
            ax.plot(c["n"], c["speedup"], marker="o", markersize=2.5, color=col, label=label)
            band = c[c["n"] >= F1_MIN_BAND]  # a bootstrap over a handful of images says nothing
            ax.fill_between(band["n"], band["ci_low"], band["ci_high"], color=col, alpha=0.2, linewidth=0)
        ax.axhline(1.0, color="0.5", lw=0.7, ls=":")
        ax.set_xscale("log")
        ticks = ns if len(ns) <= 10 else [x for x in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if x <= n]
        ax.xaxis.set_major_locator(mticker.FixedLocator(ticks))
        ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(mticker.NullFormatter())
        ax.set_xlabel("images measured (n)")
        ax.set_ylabel("speed-up over AR\n(ratio of total latencies)")
        ax.set_title(
            f"{primary}, temperature 1: speed-up on the first n images\n"
            f"bands: 95 % bootstrap over the images, from n = {F1_MIN_BAND} on (fewer: too few to resample)",
            fontsize=7,
        )
        ax.legend(fontsize=6, loc="best")
    return fig


def f1(ctx: Context) -> Item:
    """Speed-up over AR measured on the first n images, for n up to ``main_images``."""
    data = main_session(ctx, 1.0)
    df, figs = pd.DataFrame(), []
    if data is not None:
        n = data.session.rounds if int(ctx.config.batch_size) == 1 else min(data.session.rounds, timed_rounds(data))
        ns = sorted({x for x in (*range(1, 11), 20, 50, 100, 200, 500, 1000, 2000, 5000) if x <= n} | {n})
        lantern = lantern_name(ctx, ctx.config.paper_k, ctx.config.paper_delta)
        curves = {
            label: speedup_curve(data.timing, name, "ar", ns, seed=ctx.config.seed)
            for label, name in (("EAGLE-2", "eagle2"), ("LANTERN", lantern))
        }
        df = pd.concat([c.assign(method=label) for label, c in curves.items()], ignore_index=True)
        fig = plot_f1(curves, ns, n, ctx.primary)
        figs.append(savefig(ctx, fig, "f1", "f1"))
    notes = quick_notes(
        ctx,
        [
            "Speed-up (ratio of total latencies) on the first n images, n = 1 ... 10 then 20, 50, ... "
            "(each decoded once by AR, EAGLE-2 and LANTERN, interleaved in a random order per image after "
            f"a warm-up); band: 95 % bootstrap over those images, drawn from n = {F1_MIN_BAND} on.",
            *(timing_note(ctx, [(1.0, data.session.rounds)]) if data is not None else []),
            P.SOURCES["f1"] + ".",
        ],
    )
    return Item(
        "f1", "App. F.1: measured speed-up vs number of images", {"ours": df}, figs, item_settings(ctx, data), notes
    )


def f2(ctx: Context) -> Item:
    """Cost of building A and of the whole acceptance decision vs one target and one drafter
    forward, from the timers inside the real decoding steps (k and δ of App. F.2)."""
    data = main_session(ctx, 1.0)
    df = pd.DataFrame()
    c = ctx.config
    if data is not None:
        name = lantern_name(ctx, c.paper_k, c.f2_delta)
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
    notes = quick_notes(
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
        item_settings(ctx, data, k_paper=c.paper_k, delta=c.f2_delta),
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
