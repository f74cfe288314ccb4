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

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from ambiguity.errors import UsageError, cli_main
from ambiguity.neighbourhood import Neighbourhoods

__all__ = ["default_ks", "neighbourhood_mass", "top_mass", "expected_random_mass", "position_masses",
           "concentration_frame", "summarize_concentration", "run_concentration", "plot_concentration", "main"]

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


def neighbourhood_mass(p: torch.Tensor, anchors: torch.Tensor, neighbours: torch.Tensor,
                       ks: Sequence[int]) -> torch.Tensor:
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


def position_masses(p: torch.Tensor, anchors: torch.Tensor, tables: dict[str, Neighbourhoods],
                    random_table: Neighbourhoods, ks: Sequence[int]) -> dict[str, torch.Tensor]:
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
    import pandas as pd

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


@torch.no_grad()
def run_concentration(model, ks: Optional[Sequence[int]] = None, metrics: Sequence[str] = ("l2",),
                      matrix: str = "codebook", *, num_images: int = 32, batch_size: int = 16, sampling=None,
                      seed: int = 0, anchor: str = "top1", conditions: Optional[list] = None,
                      data: Optional[str] = None, out_dir: Optional[str | Path] = None, cache_dir=None,
                      progress: bool = True):
    """Measure neighbourhood concentration on generated (or, with ``data``, real) token grids.

    Args:
        model: a :class:`~ambiguity.models.base.TokenModel`.
        ks: neighbourhood sizes (default :func:`default_ks`); metrics: neighbourhood metrics;
            matrix: ``codebook``/``input``/``output`` rows that define proximity.
        num_images / batch_size: token grids and grids per forward pass.
        sampling: :class:`~ambiguity.sampling.SamplingConfig` (the distribution p is the one
            sampled from: guidance, temperature, top-k/top-p applied).
        seed: sampling seed (batch b uses ``seed_for(seed, b)``) and the random control's seed.
        anchor: ``"top1"`` or ``"sampled"`` (for real data ``"sampled"`` is the real token).
        conditions: one per image (default: classes round-robin / ``default_conditions``).
        data: teacher-force Fashion-MNIST test images (see :func:`.common.real_images`).
        out_dir: when given, each finished batch is written to ``out_dir/parts-<hash>/`` and
            reused on a rerun with the same settings (resume).
    Returns (positions DataFrame (see :func:`concentration_frame`), summary DataFrame).
    Raises UsageError for bad ks, metrics, matrix or anchor.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from ambiguity.analyses.common import batches, conditions_for, real_images, seed_for, settings_dir
    from ambiguity.generation import cfg_rows, make_generator, sample_tokens
    from ambiguity.io import read_table, write_table
    from ambiguity.neighbourhood import METRICS, build_neighbourhoods, model_matrix
    from ambiguity.sampling import SamplingConfig, distribution

    sampling = sampling or SamplingConfig()
    if anchor not in ("top1", "sampled"):
        raise UsageError(f"--anchor must be top1 or sampled, got {anchor!r}")
    metrics = list(dict.fromkeys(metrics))
    bad = [m for m in metrics if m not in METRICS or m == "random"]
    if bad or not metrics:
        raise UsageError(f"--metrics must name some of l2, l2-normalized, cosine (random is always added), "
                         f"got {metrics}")
    V = model.vocab_size
    ks = _check_ks(ks if ks is not None else default_ks(V), V - 1)
    rows = model_matrix(model, matrix)
    tables = {m: build_neighbourhoods(rows, ks[-1], m, image_token_ids=model.image_token_ids,
                                      source=f"{model.name}:{matrix}", cache_dir=cache_dir) for m in metrics}
    rtable = build_neighbourhoods(rows, ks[-1], "random", seed=seed, cache_dir=cache_dir)
    images = labels = None
    if data is not None:
        images, labels = real_images(model, data, num_images)
    conds = labels if labels is not None else (conditions or conditions_for(model, num_images))
    if len(conds) < num_images:
        raise UsageError(f"{len(conds)} conditions for --num-images {num_images}; give one per image")
    parts = None
    if out_dir is not None:
        parts = settings_dir(Path(out_dir), {"analysis": "concentration", "model": model.name, "matrix": matrix,
                                             "metrics": metrics, "ks": ks, "sampling": sampling.as_dict(),
                                             "seed": seed, "anchor": anchor, "data": data, "batch_size": batch_size,
                                             "conditions": [str(c) for c in conds[:num_images]],
                                             "matrix_key": tables[metrics[0]].key})
    frames = []
    todo = list(batches(num_images, batch_size))
    for b, sl in tqdm(todo, desc="concentration", unit="batch", disable=not progress):
        part = None if parts is None else parts / f"batch-{b:05d}.parquet"
        if part is not None and part.is_file():
            frames.append(read_table(part))
            continue
        cond_b = conds[sl]
        prompt = model.make_prompt(cond_b, cfg=sampling.use_cfg)
        if images is None:
            steps = []

            def hook(t, logits, p, x):
                a = p.argmax(-1) if anchor == "top1" else x
                steps.append((position_masses(p.float(), a, tables, rtable, ks), a, p.gather(1, a[:, None])[:, 0]))

            sample_tokens(model, prompt, sampling, make_generator(seed_for(seed, b), model.device), on_step=hook)
            T = len(steps)
            masses = {n: torch.stack([m[n] for m, _, _ in steps], 1).reshape(-1, len(ks)) for n in steps[0][0]}
            anchors = torch.stack([a for _, a, _ in steps], 1).reshape(-1)
            anchor_p = torch.stack([q for _, _, q in steps], 1).reshape(-1)
        else:
            codes = model.encode_images(images[sl]).reshape(len(cond_b), -1)
            step = model.teacher_force(prompt, cfg_rows(codes, prompt.cfg))
            p = distribution(step.logits, sampling, prompt.cfg)             # (B, T, V)
            T = p.shape[1]
            p = p.reshape(-1, V)
            anchors = p.argmax(-1) if anchor == "top1" else codes.reshape(-1).to(p.device)
            anchor_p = p.gather(1, anchors[:, None])[:, 0]
            masses = position_masses(p, anchors, tables, rtable, ks)
        B = len(cond_b)
        meta = {"image": np.repeat(np.arange(sl.start, sl.stop), T), "position": np.tile(np.arange(T), B),
                "condition": np.repeat(np.asarray([str(c) for c in cond_b], dtype=object), T),
                "anchor": anchors.cpu().numpy(), "anchor_p": anchor_p.float().cpu().numpy()}
        frame = concentration_frame(masses, ks, meta)
        if part is not None:
            write_table(frame, part)
        frames.append(frame)
    positions = pd.concat(frames, ignore_index=True)
    positions["set"] = positions["set"].astype(str)
    return positions, summarize_concentration(positions)


def _colour(name: str, i: int) -> str:
    from ambiguity import plots

    if name == "random":
        return plots.color_for("random")
    if name == "top-k":
        return plots.color_for("top-k", 0)
    return plots.color_for("neighbourhood") if i == 0 else plots.color_for(name, 2 + i)


def plot_concentration(summary, path: str | Path, title: str = "") -> list[Path]:
    """Mean mass vs k (log2 x axis) with a 25-75 % quantile band per set; PNG + PDF at ``path``.

    The analytic ``random-expected`` curve is drawn dashed without a band.
    """
    from ambiguity import plots

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
            ax.plot(e["k"], e["mean"], color=plots.color_for("random"), linestyle="--", linewidth=0.8,
                    label="random (expected)")
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
    from ambiguity.analyses.common import (add_model_args, add_sampling_args, conditions_for, parse_ints,
                                           print_table, sampling_from_args)
    from ambiguity.errors import ArgumentParser
    from ambiguity.io import ensure_writable_dir, write_table
    from ambiguity.neighbourhood import MATRICES
    from ambiguity.models.registry import load_model

    ap = ArgumentParser(prog="python -m ambiguity.analyses.concentration",
                        description="Probability mass the target puts on the latent neighbours of its top-1 token "
                                    "(LANTERN Sec. 4.1), against k random tokens and the best k tokens.")
    add_model_args(ap)
    add_sampling_args(ap)
    ap.add_argument("--ks", default=None, help="comma-separated set sizes (default: 1,2,4,...,V-1)")
    ap.add_argument("--metrics", default="l2", help="comma-separated: l2, l2-normalized, cosine (default: %(default)s)")
    ap.add_argument("--matrix", default="codebook", choices=MATRICES)
    ap.add_argument("--anchor", default="top1", choices=("top1", "sampled"))
    ap.add_argument("--cache-dir", default=None, help="neighbourhood cache folder")
    ap.add_argument("--out", default=None, help="output folder (default: runs/concentration/<model>)")
    args = ap.parse_args(argv)

    sampling = sampling_from_args(args)
    out = ensure_writable_dir(args.out or f"runs/concentration/{args.model}")
    model = load_model(args.model, weights=args.weights, device=args.device)
    ks = parse_ints(args.ks, "--ks") if args.ks else None
    conds = None if args.data else conditions_for(model, args.num_images, args.captions)
    positions, summary = run_concentration(
        model, ks, [m for m in args.metrics.split(",") if m], args.matrix, num_images=args.num_images,
        batch_size=args.batch_size, sampling=sampling, seed=args.seed, anchor=args.anchor, conditions=conds,
        data=args.data, out_dir=out, cache_dir=args.cache_dir)
    summary.insert(0, "model", model.name)
    summary.insert(1, "matrix", args.matrix)
    write_table(summary, out / "concentration.parquet")
    write_table(positions, out / "concentration_positions.parquet")
    src = "real images" if args.data else "generated"
    figs = plot_concentration(summary, out / "concentration",
                              title=f"{model.name}, {args.matrix}, {args.num_images} {src} images")
    print_table(summary, ["set", "k", "mean", "q25", "q50", "q75", "over_random"],
                title=f"neighbourhood concentration ({model.name}, {args.matrix} rows, anchor {args.anchor}, "
                      f"{summary['positions'].iloc[0]} positions):")
    print(f"wrote {out / 'concentration.parquet'}, {out / 'concentration_positions.parquet'}, "
          f"{', '.join(str(f) for f in figs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
