"""What the paper's items share: the decoding methods and the primary model's main sessions, the
rows of a method table, and the settings line and notes of an item.

Methods (:class:`~lantern.paper.sessions.Method`): AR, EAGLE-2 (lossless speculative decoding with
the EAGLE-2 dynamic tree, :func:`eagle2_method`) and LANTERN on the same tree at a paper (k, δ)
(:func:`lantern_method`, k mapped to the model's codebook). :func:`main_session` decodes the
primary image model at temperature 1 (AR, EAGLE-2 and LANTERN at the paper's setting for
``main_images`` images; the (k, δ) grid, the neighbour-metric and JSD variants for the first
``grid_images``) or at temperature 0 (AR, EAGLE-2, LANTERN for ``greedy_images``). The items are
in :mod:`lantern.paper.experiments` and :mod:`lantern.paper.distortion_item`; the Fig. 5 plot is in
:mod:`lantern.paper.quality_speed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import pandas as pd

from ambiguity import plots
from lantern.engine.decode import DecodeConfig
from lantern.methods.tree.spec import TreeSpec
from lantern.paper import published as P
from lantern.paper.context import Context
from lantern.paper.sessions import Method, Session, SessionData, quality, run_session
from lantern.quality.scoring import QualityProtocol

__all__ = [
    "QUALITY",
    "TABLE3_MATRIX",
    "tree_spec",
    "eagle2_method",
    "lantern_method",
    "main_methods",
    "main_session",
    "lantern_name",
    "grid_methods",
    "timed_rounds",
    "speed_row",
    "quality_row",
    "method_rows",
    "precision_recall",
    "item_settings",
    "prdc_note",
    "quick_notes",
    "timing_note",
    "k_note",
    "raw_codebook_note",
    "savefig",
]

QUALITY = ("fid", "kid", "precision", "recall")  # the quality metrics a method row carries (with 95 % intervals)


# --------------------------------------------------------------------------- methods and sessions
def tree_spec(ctx: Context) -> TreeSpec:
    """The EAGLE-2 dynamic draft tree of the run (``PaperConfig.tree``: total tokens incl. the root,
    depth, top-k per node), shared by EAGLE-2 and every LANTERN method."""
    total, depth, top_k = ctx.config.tree
    return TreeSpec("dynamic", total_tokens=total, depth=depth, top_k=top_k)


def eagle2_method(ctx: Context, drafter: str = "trained", rounds: Optional[int] = None, name: str = "eagle2") -> Method:
    """EAGLE-2: lossless speculative decoding on :func:`tree_spec` with the ``drafter`` (``"trained"``
    or ``"random-init"``), in the first ``rounds`` rounds of its session (None: all), named ``name``."""
    return Method(
        name,
        DecodeConfig.of("sd", tree=tree_spec(ctx)),
        "EAGLE-2" + (" (random-init drafter)" if drafter == "random-init" else ""),
        drafter,
        rounds,
    )


TABLE3_MATRIX = "codebook-raw"  # the official code's neighbour table: distances on the stored codebook weights


def lantern_method(
    ctx: Context,
    model: str,
    k_paper: int,
    delta: float,
    rounds: Optional[int] = None,
    metric: str = "l2",
    method: str = "lantern",
    matrix: str = "codebook",
) -> Method:
    """LANTERN (relaxed acceptance, ``method`` ``"lantern"``: TVD bound δ; ``"lantern-jsd"``: JSD bound δ
    in nats) on :func:`tree_spec` at the paper's ``k_paper`` mapped to ``model``'s codebook, with the
    latent neighbourhood B_k by ``metric`` (``"l2"``, ``"cosine"``, ``"random"``) on ``matrix``
    (``"codebook"``: the quantiser's codes; ``"codebook-raw"``: the stored weights, as the official code);
    in the first ``rounds`` rounds (None: all). Named ``lantern-[jsd-][metric-][raw-]k<k>-d<δ>``; its
    ``facts`` (k, k_paper, delta, metric, matrix, bound) become columns of the method rows."""
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
    config = DecodeConfig.of(method, tree=tree_spec(ctx), k=k, delta=delta, metric=metric, matrix=matrix)
    return Method(
        f"lantern-{tag}k{k}-d{delta:g}",
        config,
        label,
        "trained",
        rounds,
        {"k": k, "k_paper": k_paper, "delta": delta, "metric": metric, "matrix": matrix, "bound": method},
    )


def main_methods(ctx: Context, temperature: float) -> list[Method]:
    """The methods of the primary model's session at ``temperature``: AR, EAGLE-2 and LANTERN at the
    paper's (k, δ); at temperature 1 also, for the first ``grid_images``, the (k, δ) grid, F.2's δ, the
    raw-codebook l2 / cosine and random neighbour metrics and the JSD bounds (each method once)."""
    c, m = ctx.config, ctx.primary
    out = [
        Method("ar", DecodeConfig.of("ar"), "AR"),
        eagle2_method(ctx),
        lantern_method(ctx, m, c.paper_k, c.paper_delta),
    ]
    if temperature == 0:
        return out
    grid = [lantern_method(ctx, m, k, d, c.grid_images) for k in c.ks for d in c.deltas]
    grid.append(lantern_method(ctx, m, c.paper_k, c.f2_delta, c.grid_images))
    # Table 3's neighbour metrics on the raw codebook weights, as the official code measures them
    # (on the l2-normalised codebook l2 and cosine order neighbours identically); random needs no geometry
    grid += [
        lantern_method(ctx, m, c.paper_k, c.paper_delta, c.grid_images, metric, matrix=TABLE3_MATRIX)
        for metric in ("l2", "cosine")
    ]
    grid.append(lantern_method(ctx, m, c.paper_k, c.paper_delta, c.grid_images, "random"))
    grid += [lantern_method(ctx, m, c.paper_k, d, c.grid_images, method="lantern-jsd") for d in c.jsd_deltas]
    names = {x.name for x in out}
    for g in grid:  # the paper setting is already a main method; keep each method once
        if g.name not in names:
            out.append(g)
            names.add(g.name)
    return out


def main_session(ctx: Context, temperature: float) -> Optional[SessionData]:
    """The primary model's session at ``temperature`` with :func:`main_methods` (``main_images``
    images at temperature 1, ``greedy_images`` at 0), cached per process in ``ctx.sessions``; None
    on the shards that do not merge (:func:`~lantern.paper.sessions.run_session`)."""
    if temperature not in ctx.sessions:
        n = ctx.config.main_images if temperature else ctx.config.greedy_images
        s = Session(
            f"{ctx.primary}-T{temperature:g}", ctx.primary, temperature, tuple(main_methods(ctx, temperature)), n
        )
        ctx.sessions[temperature] = run_session(ctx, s)
    return ctx.sessions[temperature]


def lantern_name(
    ctx: Context, k_paper: int, delta: float, metric: str = "l2", method: str = "lantern", matrix: str = "codebook"
) -> str:
    """The session name of :func:`lantern_method` on the primary model at the paper's ``k_paper`` and
    ``delta`` (e.g. ``"lantern-k62-d0.1"``)."""
    return lantern_method(ctx, ctx.primary, k_paper, delta, metric=metric, method=method, matrix=matrix).name


def speed_row(data: SessionData, method: str, n: Optional[int] = None) -> dict:
    """``method``'s speed over the first ``n`` rounds: speed-up over AR (ratio of total latencies),
    median and quartiles of the per-image ratios, milliseconds per image, AR's milliseconds per target
    forward and a ``flag`` when the speed-up exceeds the tokens per target forward; {} if not timed."""
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


def quality_row(ctx: Context, data: SessionData, method: str, n: int) -> dict:
    """:data:`QUALITY` of the first ``n`` images of ``method``, one column per metric and extractor
    (``fid_<extractor>``) with ``_lo`` / ``_hi`` 95 % interval columns; {} if the model cannot decode
    tokens to pixels."""
    if not ctx.model(data.session.model).can_decode:
        return {}
    scores = quality(ctx, data, method, n)
    row = {}
    for metric, v in scores.items():
        if metric.split("_")[0] in QUALITY:
            row[metric] = v["value"]
            row[f"{metric}_lo"], row[f"{metric}_hi"] = v.get("ci_low"), v.get("ci_high")
    return row


def method_rows(ctx: Context, data: SessionData, methods, n: int, speed: bool = True) -> pd.DataFrame:
    """One row per name in ``methods`` over the first ``n`` images: temperature, label, name, the
    method's facts, its statistics (τ with the bonus token counted, tokens per target forward,
    acceptance rate), :func:`speed_row` (if ``speed``) and :func:`quality_row`."""
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
                **(speed_row(data, name, n) if speed else {}),
                **quality_row(ctx, data, name, n),
            }
        )
    return pd.DataFrame(rows)


def item_settings(ctx: Context, data: Optional[SessionData] = None, tree: bool = True, **extra) -> dict:
    """An item's settings line; ``tree``: the item decodes with the draft tree (its shape is listed)."""
    c = ctx.config
    out = {"model": ctx.primary, "seed": c.seed}
    if tree:
        out["tree (total, depth, top-k)"] = list(c.tree)
    if data is not None:
        out.update({"sampling": data.sampling.as_dict(), "images": data.session.rounds})
    out.update(extra)
    return out


def prdc_note(n: int, k: int = QualityProtocol.k) -> list:
    """A note when precision / recall are degenerate: at n <= k + 1 images per set every k-NN ball
    reaches the farthest other image, so each set covers the other and both are 1 by construction."""
    if n > k + 1:
        return []
    return [
        f"Precision and recall use k = {k} nearest neighbours: on n = {n} <= k + 1 images per set every "
        f"neighbourhood ball reaches the farthest image, so they are 1 by construction for every method and "
        f"say nothing (the published 0.48 / 0.56 are on 5000 images); compare them only on full runs."
    ]


def quick_notes(ctx: Context, notes: list) -> list:
    """``notes`` after the quick-mode warning when the run is ``--quick`` (else ``notes`` alone)."""
    q = ctx.note_quick()
    return ([q] if q else []) + notes


def timing_note(ctx: Context, sessions: Sequence[tuple[float, int]]) -> list[str]:
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
    B = int(c.batch_size)
    return [
        f"temperature {t:g}: speed-ups from the first {min(c.timing_images, n)} rounds, timed at batch 1, "
        f"interleaved; statistics and quality over {n} images at batch {B}."
        for t, n in sessions
    ] + compiled


def k_note(ctx: Context) -> str:
    """How the paper's k (and top-k) map to the primary model's codebook, or that they are the paper's."""
    V = ctx.model(ctx.primary).vocab_size
    if V == P.PAPER_CODEBOOK:
        return f"k as in the paper ({V}-code codebook)"
    maps = ", ".join(f"{k} -> {ctx.k(ctx.primary, k)}" for k in sorted(set(ctx.config.ks) | {ctx.config.paper_k}))
    return (
        f"{ctx.primary}'s codebook has {V} codes, the paper's {P.PAPER_CODEBOOK}: k is mapped by the same "
        f"fraction of the codebook ({maps}); top-k {ctx.config.top_k} -> {ctx.k(ctx.primary, ctx.config.top_k)}"
    )


def savefig(ctx: Context, fig, name: str, stem: str) -> str:
    """Write ``fig`` as ``<name>/<stem>.png`` and ``.pdf`` in the run directory, marked QUICK MODE in
    red above its title for a ``--quick`` run (:func:`ambiguity.plots.mark_quick`); returns the PNG's
    path relative to it, as an item lists its figures."""
    if ctx.config.quick:  # the README's promise: a quick run's figures say so in the image
        plots.mark_quick(fig)
    plots.save_figure(fig, ctx.subdir(name) / stem)
    return f"{name}/{stem}.png"


def grid_methods(ctx: Context) -> list[tuple[int, float, str]]:
    """(paper k, δ, session name) of every LANTERN method of the (k, δ) grid, k-major."""
    return [(k, d, lantern_name(ctx, k, d)) for k in ctx.config.ks for d in ctx.config.deltas]


def timed_rounds(data: SessionData) -> int:
    """How many rounds of ``data`` were timed (the first ``--timing-images`` with --batch-size > 1)."""
    return int(data.timing["round"].nunique()) if len(data.timing) else 0


def precision_recall(ctx: Context, data: SessionData, method: str, n: int) -> dict:
    """Precision and recall of the first ``n`` images of ``method`` with the run's first extractor
    (None where not measured), and that extractor's name."""
    q = quality_row(ctx, data, method, n)
    ex = ctx.config.extractors[0]
    return {"precision": q.get(f"precision_{ex}"), "recall": q.get(f"recall_{ex}"), "extractor": ex}


def raw_codebook_note(ctx: Context, k: int) -> str:
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
