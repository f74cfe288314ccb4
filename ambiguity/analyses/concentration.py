"""Neighbourhood concentration: does the target model spread its probability over latent neighbours?

LANTERN's relaxation (Jang et al., ICLR 2025, Sec. 4.1, Fig. 3) assumes that the target's
next-token distribution p puts much of the mass it does not give its top-1 token x* on codes
close to x* in latent space. For every position we measure, for k in a range:

* ``neighbours:<metric>``: p(B_k(x*)), the mass on the k latent neighbours of x* (x* excluded);
* ``random``: the mass on k codes drawn uniformly without replacement from the V - 1 others
  (a seeded random permutation per code, :data:`ambiguity.neighbourhood` metric ``random``);
  its expectation is ``random-expected`` = k / (V - 1) * (1 - p(x*));
* ``top-k``: the mass of the k most probable codes other than x*, the most any set of k codes
  excluding x* can hold (the upper bound of the two curves above).

All three exclude x*, so at k = V - 1 each equals 1 - p(x*). The anchor x* is the argmax of p
(``anchor="top1"``, ties to the lower index) or the token actually sampled (``"sampled"``).
If latent proximity matters, the neighbour curve lies well above the random one and close to
the top-k one. Positions are averaged over images and token positions; quantiles over positions.

CLI: ``python -m ambiguity.analyses.concentration --model embedded --num-images 32``
(or ``python -m ambiguity.analyses concentration ...``) writes ``concentration.parquet``
(summary), ``concentration_positions.parquet`` (per position) and ``concentration.png/.pdf``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ambiguity import plots
from ambiguity.analyses import common
from ambiguity.cli import cli_main, int_list
from ambiguity.distributed import SINGLE
from ambiguity.errors import UsageError
from ambiguity.knn import METRICS
from ambiguity.memory import check_run_size
from ambiguity.neighbourhood import MATRICES, Neighbourhoods, build_neighbourhoods, model_matrix
from ambiguity.runs import RunOptions, shard_units
from ambiguity.sampling import SamplingConfig, distribution, expand_rows

__all__ = [
    "default_ks",
    "neighbourhood_mass",
    "top_mass",
    "expected_random_mass",
    "position_masses",
    "concentration_frame",
    "summarize_concentration",
    "run_concentration",
    "plot_concentration",
    "main",
]

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def default_ks(vocab_size: int) -> list[int]:
    """1, 2, 4, ... below V - 1, then V - 1 (the whole vocabulary but the anchor)."""
    ks, k = [], 1
    while k < vocab_size - 1:
        ks.append(k)
        k *= 2
    return ks + [vocab_size - 1]


def _check_ks(ks: Sequence[int], limit: int) -> list[int]:
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1 or ks[-1] > limit:
        raise UsageError(f"--ks must lie in 1..{limit} (V - 1, or the k of the neighbourhood table), got {ks}")
    return ks


def neighbourhood_mass(
    p: torch.Tensor, anchors: torch.Tensor, neighbours: torch.Tensor, ks: Sequence[int]
) -> torch.Tensor:
    """Mass of the first k neighbours of each anchor, for every k in ``ks``.

    Args:
        p: (P, V) float probabilities (rows sum to 1); anchors: (P,) int64 code indices.
        neighbours: (V, K) int64 neighbour table (code order, nearest first, anchor excluded),
            K >= max(ks). ks: increasing sizes k >= 1.
    Returns (P, len(ks)) float32 probabilities: sum_{j < k} p[neighbours[anchor, j]].
    """
    kmax = max(ks)
    nb = neighbours[anchors.to(neighbours.device), :kmax].to(p.device)
    cm = p.gather(1, nb).double().cumsum(1)  # gather first: only (P, kmax) entries in float64
    return cm[:, [k - 1 for k in ks]].float()


def top_mass(p: torch.Tensor, anchors: torch.Tensor, ks: Sequence[int]) -> torch.Tensor:
    """Largest mass any k codes other than the anchor can hold: (P, V), (P,) -> (P, len(ks)) float32.

    The sum of the k largest entries of p with the anchor's entry removed (the ``top-k`` curve).
    """
    q = p.clone()
    q.scatter_(1, anchors[:, None].to(p.device), 0.0)
    cm = torch.topk(q, max(ks), dim=1).values.double().cumsum(1)
    return cm[:, [k - 1 for k in ks]].float()


def expected_random_mass(p: torch.Tensor, anchors: torch.Tensor, ks: Sequence[int]) -> torch.Tensor:
    """E[mass of k uniformly random codes other than the anchor] = k / (V - 1) * (1 - p[anchor]).

    (P, V), (P,) -> (P, len(ks)) float32.
    """
    rest = 1.0 - p.gather(1, anchors[:, None].to(p.device)).double()
    frac = torch.tensor([k / (p.shape[1] - 1) for k in ks], dtype=torch.float64, device=p.device)
    return (rest * frac).float()


def position_masses(
    p: torch.Tensor,
    anchors: torch.Tensor,
    tables: dict[str, Neighbourhoods],
    random_table: Neighbourhoods,
    ks: Sequence[int],
) -> dict[str, torch.Tensor]:
    """All curves at P positions: set name -> (P, len(ks)) float32 (see the module docstring).

    ``tables`` maps metric names to neighbourhood tables; ``random_table`` is a ``random``-metric
    table. Each table must have k >= max(ks).
    """
    out = {f"neighbours:{m}": neighbourhood_mass(p, anchors, t.indices, ks) for m, t in tables.items()}
    out["random"] = neighbourhood_mass(p, anchors, random_table.indices, ks)
    out["random-expected"] = expected_random_mass(p, anchors, ks)
    out["top-k"] = top_mass(p, anchors, ks)
    return out


def concentration_frame(masses: dict[str, torch.Tensor], ks: Sequence[int], meta: dict[str, np.ndarray]):
    """Long per-position table: the columns of ``meta`` (one value per position), set, k, mass."""
    frames = []
    for name, m in masses.items():
        P = m.shape[0]
        cols = {c: np.repeat(np.asarray(v), len(ks)) for c, v in meta.items()}
        cols.update(set=name, k=np.tile(np.asarray(ks, dtype=np.int64), P), mass=m.cpu().numpy().reshape(-1))
        frames.append(pd.DataFrame(cols))
    return pd.concat(frames, ignore_index=True)


def summarize_concentration(positions):
    """Per (set, k): mean, std, quantiles q05..q95 of the mass over positions, count of positions,
    and ``over_random``: mean / mean of the ``random`` set at the same k."""
    g = positions.groupby(["set", "k"], sort=True)["mass"]
    s = g.agg(["mean", "std", "count"]).rename(columns={"count": "positions"})
    for q in QUANTILES:
        s[f"q{int(q * 100):02d}"] = g.quantile(q)
    s = s.reset_index()
    rnd = s[s["set"] == "random"].set_index("k")["mean"]
    s["over_random"] = s["mean"] / s["k"].map(rnd)
    return s


COMMAND = "python -m ambiguity.analyses concentration"
DESCRIPTION = (
    "Probability mass the target puts on the latent neighbours of its top-1 token "
    "(LANTERN Sec. 4.1), against k random tokens and the best k tokens."
)
OUTPUTS = ("concentration.parquet", "concentration_positions.parquet", "concentration.png", "concentration.pdf")


def _check_metrics(metrics: Sequence[str], anchor: str) -> list[str]:
    """The distinct metrics, in order. Raises UsageError for a bad metric or anchor."""
    if anchor not in ("top1", "sampled"):
        raise UsageError(f"--anchor must be top1 or sampled, got {anchor!r}")
    metrics = list(dict.fromkeys(metrics))
    bad = [m for m in metrics if m not in METRICS or m == "random"]
    if bad or not metrics:
        raise UsageError(
            f"--metrics must name some of l2, l2-normalized, cosine (random is always added), got {metrics}"
        )
    return metrics


def _image_conditions(model, conditions: Optional[list], num_images: int) -> list:
    """One condition per image (default ``model.default_conditions``). Raises UsageError when too few."""
    conds = list(conditions) if conditions is not None else model.default_conditions(num_images)
    if len(conds) < num_images:
        raise UsageError(f"{len(conds)} conditions for --num-images {num_images}; give one per image")
    return conds[:num_images]


def _concentration_tables(
    model, matrix: str, metrics: list[str], kmax: int, seed: int, cache_dir, progress: bool
) -> tuple[dict[str, Neighbourhoods], Neighbourhoods]:
    """(metric -> neighbourhood table of the ``matrix`` rows, the ``random`` control's table), k = ``kmax``."""
    rows = model_matrix(model, matrix)
    tables = {
        m: build_neighbourhoods(
            rows,
            kmax,
            m,
            image_token_ids=model.image_token_ids,
            source=f"{model.name}:{matrix}",
            cache_dir=cache_dir,
            progress=progress,
        )
        for m in metrics
    }
    rtable = build_neighbourhoods(rows, kmax, "random", seed=seed, cache_dir=cache_dir, progress=progress)
    return tables, rtable


def _generated_masses(model, conditions, sampling, seed: int, first: int, anchor: str, tables, rtable, ks):
    """Sample the images ``first ..`` and measure every curve at each step ->
    (set -> (B*T, len(ks)) masses, anchors (B*T,), anchor probabilities (B*T,), T)."""
    steps = []

    def hook(t, logits, p, x):
        a = p.argmax(-1) if anchor == "top1" else x
        steps.append((position_masses(p.float(), a, tables, rtable, ks), a, p.gather(1, a[:, None])[:, 0]))

    common.generate_grids(model, conditions, sampling, seed, first, on_step=hook)
    masses = {n: torch.stack([m[n] for m, _, _ in steps], 1).reshape(-1, len(ks)) for n in steps[0][0]}
    anchors = torch.stack([a for _, a, _ in steps], 1).reshape(-1)
    anchor_p = torch.stack([q for _, _, q in steps], 1).reshape(-1)
    return masses, anchors, anchor_p, len(steps)


def _forced_masses(model, conditions, images, sampling, anchor: str, tables, rtable, ks):
    """Teacher-force the VQ codes of ``images`` and measure every curve; returns as
    :func:`_generated_masses` (``"sampled"`` anchors are the real tokens)."""
    prompt = model.make_prompt(conditions, guided=sampling.guided)
    codes = model.encode_images(images).reshape(len(conditions), -1)
    step = model.teacher_force(prompt, expand_rows(codes, prompt.guided))
    p = distribution(step.logits, sampling, prompt.guided)  # (B, T, V)
    T = p.shape[1]
    p = p.reshape(-1, model.vocab_size)
    anchors = p.argmax(-1) if anchor == "top1" else codes.reshape(-1).to(p.device)
    anchor_p = p.gather(1, anchors[:, None])[:, 0]
    return position_masses(p, anchors, tables, rtable, ks), anchors, anchor_p, T


def _batch_frame(masses, anchors, anchor_p, T: int, images: slice, conditions, ks):
    """The per-position table (:func:`concentration_frame`) of the images ``images``."""
    meta = {
        "image": np.repeat(np.arange(images.start, images.stop), T),
        "position": np.tile(np.arange(T), len(conditions)),
        "condition": np.repeat(np.asarray([str(c) for c in conditions], dtype=object), T),
        "anchor": anchors.cpu().numpy(),
        "anchor_p": anchor_p.float().cpu().numpy(),
    }
    return concentration_frame(masses, ks, meta)


@torch.no_grad()
def run_concentration(
    model,
    ks: Optional[Sequence[int]] = None,
    metrics: Sequence[str] = ("l2",),
    matrix: str = "codebook",
    *,
    num_images: int = 32,
    batch_size: int = 16,
    sampling=None,
    seed: int = 0,
    anchor: str = "top1",
    conditions: Optional[list] = None,
    images: Optional[torch.Tensor] = None,
    cache_dir=None,
    options: Optional[RunOptions] = None,
):
    """Measure neighbourhood concentration on generated (or, with ``images``, real) token grids.

    Args:
        model: a :class:`~ambiguity.models.base.TokenModel`.
        ks: neighbourhood sizes (default :func:`default_ks`); metrics: neighbourhood metrics;
            matrix: ``codebook``/``codebook-raw``/``input``/``output`` rows that define proximity.
        num_images / batch_size: token grids and grids per forward pass (and per resumable part).
        sampling: :class:`~ambiguity.sampling.SamplingConfig` (the distribution p is the one
            sampled from: guidance, temperature, top-k/top-p applied).
        seed: image ``i`` samples from its own stream (:mod:`ambiguity.seeding`); also the random
            control's seed.
        anchor: ``"top1"`` or ``"sampled"`` (for real data ``"sampled"`` is the real token).
        conditions: one per image (default: classes round-robin / ``default_conditions``).
        images: (num_images, C, H, W) real images in [0, 1] to teacher-force (their VQ codes)
            instead of generating; ``conditions`` are then their labels.
        cache_dir: the neighbourhood cache folder (None: the default).
        options: :class:`~ambiguity.runs.RunOptions`: ``out`` a run directory (each finished batch
            a part, reused on a rerun with the same settings; other settings refused unless
            ``overwrite``), ``progress`` bars; one process (no ``shard``).
    Returns (positions DataFrame (see :func:`concentration_frame`), summary DataFrame).
    Raises UsageError for bad ks, metrics, matrix or anchor, too few conditions or a sharded ``options``.
    """
    opts = RunOptions.of(options)
    sampling = sampling or SamplingConfig()
    metrics = _check_metrics(metrics, anchor)
    ks = _check_ks(ks if ks is not None else default_ks(model.vocab_size), model.vocab_size - 1)
    check_run_size(model, num_images, batch_size, sampling.guided)
    tables, rtable = _concentration_tables(model, matrix, metrics, ks[-1], seed, cache_dir, opts.progress)
    conds = _image_conditions(model, conditions, num_images)
    settings = {
        "analysis": "concentration",
        "model": model.describe(),
        "matrix": matrix,
        "metrics": metrics,
        "ks": ks,
        "sampling": sampling.as_dict(),
        "seed": seed,
        "anchor": anchor,
        "real_images": images is not None,
        "batch_size": batch_size,
        "num_images": num_images,
        "conditions": common.digest(conds),
        "matrix_key": tables[metrics[0]].key,
    }
    run = common.open_analysis_run(opts, settings, COMMAND, OUTPUTS)
    frames = []
    units = [(f"batch_{b:05d}", {"images": [sl.start, sl.stop]}) for b, sl in common.batches(num_images, batch_size)]
    bar = dict(total=len(units), desc="concentration", unit="batch", disable=not opts.progress)
    for b, part in tqdm(shard_units(run, units, SINGLE), **bar):
        sl = slice(*units[b][1]["images"])
        if part is not None:
            frames.append(part.tables["positions"])
            continue
        if images is None:
            found = _generated_masses(model, conds[sl], sampling, seed, sl.start, anchor, tables, rtable, ks)
        else:
            found = _forced_masses(model, conds[sl], images[sl], sampling, anchor, tables, rtable, ks)
        frame = _batch_frame(*found, sl, conds[sl], ks)
        if run is not None:
            run.write_part(*units[b], tables={"positions": frame})
        frames.append(frame)
    positions = pd.concat(frames, ignore_index=True)
    positions["set"] = positions["set"].astype(str)
    return positions, summarize_concentration(positions)


def _colour(name: str, i: int) -> str:
    if name == "random":
        return plots.color_for("random")
    if name == "top-k":
        return plots.color_for("top-k", 0)
    return plots.color_for("neighbourhood") if i == 0 else plots.color_for(name, 2 + i)


def plot_concentration(summary, path: str | Path, title: str = "") -> list[Path]:
    """Mean mass vs k (log2 x axis) with a 25-75 % quantile band per set; PNG + PDF at ``path``.

    The analytic ``random-expected`` curve is drawn dashed without a band.
    """
    with plots.style():
        fig, ax = plots.new_figure(width=3.6, height=2.6)
        sets = [s for s in summary["set"].unique() if s != "random-expected"]
        nbs = sorted(s for s in sets if s.startswith("neighbours"))
        order = [s for s in ("top-k",) if s in sets] + nbs + [s for s in ("random",) if s in sets]
        for name in order:
            d = summary[summary["set"] == name].sort_values("k")
            c = _colour(name, nbs.index(name) if name in nbs else 0)
            label = name.replace("neighbours:", "latent neighbours B_k, ").replace("top-k", "top-k (best possible)")
            ax.plot(d["k"], d["mean"], color=c, label=label, marker="o", markersize=2.5)
            ax.fill_between(d["k"], d["q25"], d["q75"], color=c, alpha=0.18, linewidth=0)
        e = summary[summary["set"] == "random-expected"].sort_values("k")
        if len(e):
            ax.plot(
                e["k"],
                e["mean"],
                color=plots.color_for("random"),
                linestyle="--",
                linewidth=0.8,
                label="random (expected)",
            )
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1)
        ax.set_xlabel("set size k (top-1 token excluded)")
        ax.set_ylabel("probability mass")
        if title:
            ax.set_title(title)
        ax.legend(loc="upper left", title="mean over positions; band: 25–75 %", title_fontsize="small")
        return plots.save_figure(fig, path)


@cli_main
def main(argv=None) -> int:
    """``python -m ambiguity.analyses.concentration``: mass near the top-1 token vs random and top-k."""
    ap = common.analysis_parser("concentration", DESCRIPTION, num_images=32, batch_size=16)
    ap.add_argument("--ks", default=None, help="comma-separated set sizes (default: 1,2,4,...,V-1)")
    ap.add_argument("--metrics", default="l2", help="comma-separated: l2, l2-normalized, cosine (default: %(default)s)")
    ap.add_argument("--matrix", default="codebook", choices=MATRICES)
    ap.add_argument("--anchor", default="top1", choices=("top1", "sampled"))
    args = ap.parse_args(argv)

    ks = int_list(args.ks, "--ks", minimum=1) if args.ks else None
    setup = common.load_analysis(args, "concentration")
    model, out = setup.model, setup.out
    positions, summary = run_concentration(
        model,
        ks,
        [m for m in args.metrics.split(",") if m],
        args.matrix,
        anchor=args.anchor,
        **common.run_arguments(args, setup),
    )
    tables = common.write_results(
        summary, positions, out, "concentration", "positions", {"model": model.name, "matrix": args.matrix}
    )
    src = "real images" if setup.images is not None else "generated"
    figs = plot_concentration(
        summary, out / "concentration", title=f"{model.name}, {args.matrix}, {args.num_images} {src} images"
    )
    title = (
        f"neighbourhood concentration ({model.name}, {args.matrix} rows, anchor {args.anchor}, "
        f"{summary['positions'].iloc[0]} positions):"
    )
    common.print_table(summary, ["set", "k", "mean", "q25", "q50", "q75", "over_random"], title, tables + figs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
