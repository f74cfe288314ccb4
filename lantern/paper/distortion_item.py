"""The distortion item: the exact per-step TVD(output, p) of LANTERN's relaxed acceptance on real
(p, q) pairs over k and δ, for drafts sampled from q (chains, EAGLE-1 static trees) and for the
deterministic top-k children of an EAGLE-2 dynamic tree node (the paper's decoder), and its drivers,
on the AR samples of :func:`pairs_session` (a small AR-only session whose images are the first ones of
the temperature-1 main session). Listed in :data:`lantern.paper.experiments.EXPERIMENTS` as
``distortion``."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from ambiguity import plots
from lantern.distortion import TREE_ROW, distortion_table, real_pairs
from lantern.engine.decode import DecodeConfig, neighbour_table
from lantern.paper.context import Context
from lantern.paper.methods import item_settings, quick_notes, savefig
from lantern.paper.report import Item
from lantern.paper.sessions import Method, Session, SessionData, run_session

__all__ = ["pairs_session", "distortion", "plot_distortion"]


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


def plot_distortion(df: pd.DataFrame, ks: list[int], deltas, m: int, n: int, primary: str):
    """The distortion figure: mean TVD(output, p) against δ per k, for drafts sampled from q and for
    the tree's top-``m`` siblings, with bands, the line TVD = δ and TVD(q, p); n: the images. Returns
    the matplotlib figure."""
    with plots.style():
        fig, ax = plots.new_figure(width=3.6, height=2.4)
        for what, ls, marker, kind in (
            ("TVD(out, p)", "-", "o", "drafts ~ q"),
            (TREE_ROW, "--", "s", f"tree top-{m}"),
        ):
            d = df[df["what"] == what]
            for i, k in enumerate(ks):
                dk = d[d["k"] == k].sort_values("delta")
                color = plots.color_for(f"k{k}", i)
                ax.fill_between(dk["delta"], dk["ci_low"], dk["ci_high"], color=color, alpha=0.2, lw=0)
                ax.plot(
                    dk["delta"],
                    dk["mean"],
                    ls=ls,
                    marker=marker,
                    markersize=2.5,
                    color=color,
                    label=f"k={k}, {kind}",
                )
        xs = np.array(sorted(deltas))
        ax.plot(xs, xs, color="0.5", ls=":", lw=0.8, label="δ")
        own = df.iloc[0]  # TVD(q, p)
        ax.axhspan(float(own["ci_low"]), float(own["ci_high"]), color="0.3", alpha=0.12, lw=0)
        ax.axhline(float(own["mean"]), color="0.3", ls="--", lw=0.8, label="TVD(q, p)")
        ax.set_xlabel("δ (TVD bound per draft)")
        ax.set_ylabel("mean TVD(output, p)")
        ax.set_title(
            f"{primary}, temperature 1: one LANTERN step's output vs p ({n} images)\n"
            "bands: 95 % image-bootstrap interval of the mean",
            fontsize=6,
        )
        ax.legend(fontsize=5, ncol=2)
    return fig


def distortion(ctx: Context) -> Item:
    """Exact per-step TVD(output, p) of LANTERN on real (p, q) pairs over k and δ, with drafts sampled
    from q and with the tree's deterministic siblings (the drafter's top ``config.tree[2]`` tokens),
    with its drivers (entropies and top-1 of p and q, TVD(q, p)) and bootstrap intervals over images."""
    data = pairs_session(ctx)
    df, figs = pd.DataFrame(), []
    c = ctx.config
    n, m = c.pairs_images, c.tree[2]
    if data is not None:
        model = ctx.model(ctx.primary)
        p, q, groups = real_pairs(
            model, ctx.drafter(ctx.primary), data.tokens["ar"][:n], data.conditions[:n], data.sampling, with_groups=True
        )
        ks = sorted({ctx.k(ctx.primary, k) for k in c.ks})
        table = neighbour_table(model, DecodeConfig.of("lantern", k=max(ks)), progress=ctx.bars)
        df = distortion_table(p, q, table, ks, c.deltas, groups=groups, seed=c.seed, tree_siblings=(m,))
        fig = plot_distortion(df, ks, c.deltas, m, n, ctx.primary)
        figs.append(savefig(ctx, fig, "distortion", "distortion"))
    notes = quick_notes(
        ctx,
        [
            "Exact distribution of the token one LANTERN verification step emits (no sampling), "
            f"compared with the target's p, on the (p, q) pairs at every position of {n} AR samples "
            f"(--pairs-images; an AR-only session, {ctx.primary}-T1-pairs, whose images are the first "
            "ones of the temperature-1 session) with teacher-forced target and drafter and the "
            "processing of decoding.",
            "The δ bound holds per draft (moved mass ≤ δ), not for the output: TVD(out, p) can exceed δ "
            "when the drafter is far from p. Our own finding; not in the paper.",
            f"Rows 'TVD(out, p)': the draft is sampled from q and accepted with min(1, p̃/q) (chains, EAGLE-1 "
            f"static trees). Rows '{TREE_ROW}' (siblings = {m}): a dynamic-tree node whose children are the "
            f"drafter's top-{m} tokens, judged in order as point masses (q(x̂) = 1, EAGLE-2 and the paper's "
            "code): accepted with min(1, p̃), the residual after each rejection (first emitted token; "
            "lantern.distortion.sibling_output_distribution). With the exact convention each child moves at "
            f"most δ, so these stay ≤ {m} δ whatever the drafter's distance from p.",
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
        item_settings(ctx, data, tree=False, pairs_images=c.pairs_images),
        notes,
    )
