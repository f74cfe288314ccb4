"""How far a relaxed rule's output distribution moves from the target's p, exactly, on real (p, q) pairs.

LANTERN bounds the mass moved *per draft* (``S_j* <= δ``), not the distance of what a
verification step emits from the target distribution: with the exact residual
``TVD(out, p) <= Σ_y min(max(q(y) - p(y), 0), δ)``, which exceeds δ when the drafter is far
from p. This module measures that distance with no sampling:

* :func:`real_pairs` — the (p, q) pairs a decoder meets: for token sequences of the target
  (e.g. its own samples), one teacher-forced pass of the target gives p at every position (with
  the same guidance, temperature and top-k/top-p processing as decoding) and one pass of the
  drafter on the target's true features gives q for the same position (what the first draft of
  a verification step starting there is drawn from);
* :func:`distortion_table` — ``TVD(out, p)`` of one verification step for each (k, δ)
  (:func:`lantern.rules.output.output_distributions`), next to ``TVD(q, p)`` and what drives it
  (the entropies and top-1 probabilities of p and q, how often their argmaxes agree), each mean
  with a percentile-bootstrap interval that resamples images (:func:`bootstrap_mean_ci`);
* :func:`sibling_output_distribution` — the same for the deterministic drafts of an EAGLE-2
  dynamic tree (the paper's decoder): the node's children, the drafter's top-m tokens, are
  judged in order as point masses (``q(x̂) = 1``), so a child is accepted with probability
  ``min(1, p̃(x̂))`` instead of ``min(1, p̃(x̂) / q(x̂))``. Each child then adds at most δ of
  excess mass, ``TVD(out, p) <= m δ``, whatever the drafter's distance from p; with drafts
  sampled from ``q`` (chains, EAGLE-1 static trees) the bound is ``Σ_y min(max(q(y) - p(y), 0), δ)``.
* :func:`chain_place_tvds` — ``TVD(out, p)`` of one step at each place of a chain, for the rules
  whose law depends on the place (Cool-SD's annealed factor, FLy's window).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np
import pandas as pd
import torch

from ambiguity.errors import UsageError
from ambiguity.models.base import TokenModel
from ambiguity.sampling import SamplingConfig, expand_rows
from ambiguity.stats import bootstrap_mean_ci, entropy
from lantern.drafter.model import DraftModel, draft_q
from lantern.engine.steps import target_distribution
from lantern.rules.acceptance import AcceptanceRule, proximity, residual
from lantern.rules.divergences import tvd
from lantern.rules.output import output_distribution, output_distributions

__all__ = [
    "real_pairs",
    "image_groups",
    "sibling_output_distribution",
    "chain_place_tvds",
    "distortion_table",
    "step_tvds",
    "DRIVERS",
    "TREE_ROW",
]

TREE_ROW = "TVD(out, p), tree"  # distortion_table's rows of the deterministic tree (``siblings`` = m)

# the driver rows of distortion_table, in order: (what, unit)
DRIVERS = (
    ("H(p)", "nats"),
    ("p top-1", "probability"),
    ("H(q)", "nats"),
    ("q top-1 = p top-1", "fraction of positions"),
)


@torch.no_grad()
def real_pairs(
    model: TokenModel,
    drafter: DraftModel,
    tokens: torch.Tensor,
    conditions: Sequence,
    sampling: SamplingConfig,
    convention: str = "exact",
    batch_size: int = 8,
    positions: slice = slice(None),
    with_groups: bool = False,
):
    """Target and drafter distributions at every position of given sequences.

    tokens: (B, N) int64 code indices (raster order); conditions: B labels or captions;
    sampling: guidance, temperature, top-k/top-p, applied to both as in decoding (a
    temperature of 0 is treated as 1: the distributions, not the argmax). positions: which of
    the N - 1 predicted positions (1 .. N-1) to keep. Returns (p, q), each (B * n, V) float32,
    image by image (the n kept positions of image 0 first); with ``with_groups`` also the
    (B * n,) int64 image of each pair (:func:`image_groups`), for intervals that resample images.
    """
    if sampling.greedy:
        sampling = SamplingConfig(
            guidance=sampling.guidance, temperature=1.0, top_k=sampling.top_k, top_p=sampling.top_p
        )
    guided = sampling.guided
    ps, qs = [], []
    for s in range(0, len(tokens), batch_size):
        x = tokens[s : s + batch_size].to(model.device)
        prompt = model.make_prompt(list(conditions[s : s + batch_size]), guided=guided)
        rows = expand_rows(x, guided)
        step = model.teacher_force(prompt, rows)  # hidden[:, t] predicts x_t
        p = target_distribution(step.logits[:, 1:], sampling, guided, convention)  # (b, N-1, V): x_1 .. x_{N-1}
        f = drafter(model, rows[:, :-1], step.hidden[:, :-1].to(drafter.dtype), None, 0)  # f_i predicts x_{i+1}
        q = draft_q(drafter, model, f, lambda x: target_distribution(x, sampling, guided, convention))
        ps.append(p[:, positions].reshape(-1, p.shape[-1]).float().cpu())
        qs.append(q[:, positions].reshape(-1, q.shape[-1]).float().cpu())
    p, q = torch.cat(ps), torch.cat(qs)
    if not with_groups:
        return p, q
    return p, q, image_groups(len(tokens), len(p) // max(len(tokens), 1))


def image_groups(images: int, per_image: int) -> torch.Tensor:
    """The image of each of ``images * per_image`` pairs stored image by image: (images * per_image,)
    int64, ``[0] * per_image + [1] * per_image + ...``."""
    return torch.arange(int(images), dtype=torch.int64).repeat_interleave(int(per_image))


def sibling_output_distribution(
    p: torch.Tensor, siblings: torch.Tensor, neighbours: Optional[torch.Tensor], rule: AcceptanceRule
) -> torch.Tensor:
    """The exact distribution of the next token a deterministic draft tree emits at one node:
    (..., V), p's dtype.

    p: (..., V) float, the target's distribution after the node; siblings: (..., m) int64, the
    node's children (distinct code indices) in trial order, e.g. the drafter's top-m
    (``q.topk(m).indices``: an EAGLE-2 dynamic tree, EAGLE-2 Sec. 4); neighbours: (V, >= k + 1)
    int64 table (nearest first; None when the rule is not relaxed).

    As ``tests/reference/tree_decoding.py:walk_tree`` judges them: child ``i`` is a point-mass draft,
    accepted with probability ``a_i = min(1, p̃_i(c_i))`` where ``p̃_i`` grows the proximity set on
    ``r_{i-1}``, the target after the earlier rejections (``r_0 = p``; ``r_i`` is
    :func:`lantern.rules.acceptance.residual` of ``r_{i-1}`` with ``q = None``: ``c_i`` zeroed for
    ``"exact"``). So ``out = Σ_i reach_i a_i 1[c_i] + reach_{m+1} r_m`` with ``reach_1 = 1`` and
    ``reach_{i+1} = reach_i (1 - a_i)``: the first token of the node's step whether a child is
    accepted (its subtree is judged next) or not (the residual is sampled). With δ = 0 and
    ``"exact"`` this is p (recursive rejection sampling without replacement). Each ``a_i``
    exceeds ``r_{i-1}(c_i)`` by at most δ, so ``TVD(out, p) <= m δ`` for ``"exact"``, LANTERN
    Sec. 3 with EAGLE-2's ``q(x̂) = 1``.
    Raises :class:`~ambiguity.errors.UsageError` as :func:`lantern.rules.acceptance.judge` (shapes, table).
    """
    table = rule.table_for(p, neighbours) if rule.relaxed else None
    if siblings.shape[:-1] != p.shape[:-1]:
        raise UsageError(f"siblings has shape {tuple(siblings.shape)}, expected p's leading shape plus (m,)")
    out = torch.zeros_like(p)
    reach = torch.ones(p.shape[:-1], dtype=p.dtype, device=p.device)
    target = p
    for i in range(siblings.shape[-1]):
        x = siblings[..., i].long()
        accept = proximity(target, x, table, rule)[1].clamp(max=1.0)
        out.scatter_add_(-1, x.unsqueeze(-1), (reach * accept).unsqueeze(-1))
        target = residual(target, None, x, table, rule, validate=False)
        reach = reach * (1.0 - accept)
    return out + reach.unsqueeze(-1) * target


def chain_place_tvds(
    p: torch.Tensor,
    q: torch.Tensor,
    rule: AcceptanceRule,
    gamma: int,
    window_pass=None,
    neighbours: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``TVD(out_i, p)`` of one verification step at each place ``i = 0..γ-1`` of a chain of γ
    drafts, for the rules whose law depends on the place (:data:`lantern.rules.acceptance.RELAXATIONS`):
    (γ, ...) p's dtype, exact (no sampling).

    p, q: (..., V) float, e.g. the real pairs of :func:`real_pairs`; gamma: γ >= 1. ``"cool-sd"``:
    the step with Cool-SD's factor ``ω_i`` of a γ-chain (arXiv 2601.09212). ``"fly"``: window_pass
    (float in [0, 1], required) is the probability that the W drafts after place i are all natively
    accepted where the window fits in the chain (``i + W < γ``); a place whose window does not fit
    defers nothing and is lossless (arXiv 2511.22972). Any other rule (neighbours: its table): the
    same step at every place.
    Raises :class:`~ambiguity.errors.UsageError` for ``gamma < 1`` and as
    :func:`lantern.rules.output.output_distribution`.
    """
    if isinstance(gamma, bool) or int(gamma) != gamma or gamma < 1:
        raise UsageError(f"gamma must be an integer >= 1 (drafts per chain), got {gamma}")
    rows = []
    for i in range(int(gamma)):
        kw = {}
        if rule.method == "cool-sd":
            kw = dict(positions=i, lengths=int(gamma))
        elif rule.method == "fly":
            kw = dict(window_pass=window_pass if i + rule.fly_window < gamma else 0.0)
        rows.append(tvd(output_distribution(p, q, neighbours, rule, **kw), p))
    return torch.stack(rows)


def distortion_table(
    p: torch.Tensor,
    q: torch.Tensor,
    neighbours: torch.Tensor,
    ks: Sequence[int],
    deltas: Sequence[float],
    method: str = "lantern",
    convention: str = "exact",
    chunk: int = 256,
    max_bytes: int = 1 << 30,
    groups: Optional[torch.Tensor] = None,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    tree_siblings: Sequence[int] = (),
) -> pd.DataFrame:
    """Exact per-step distortion of a relaxed rule on (p, q) pairs, and what drives it.

    p, q: (P, V) float target and drafter distributions (:func:`real_pairs`); neighbours:
    (V, >= max(ks)) int64 table (nearest first); groups: optional (P,) int64 image of each
    position (:func:`image_groups`, ``real_pairs(..., with_groups=True)``).

    Returns a DataFrame with columns ``what, k, delta, siblings, mean, median, q90, max, positions,
    ci_low, ci_high``: per row, the mean / median / 90th percentile / max over the P positions
    of a per-position quantity, ``positions`` = P, and ``ci_low``/``ci_high`` a ``level``
    percentile-bootstrap interval of the mean (:func:`bootstrap_mean_ci` with ``n_boot`` and
    ``seed``; resampling images when ``groups`` is given, else positions; every row uses the same
    resamples). Rows, in order:

    * ``TVD(q, p)`` (k = 0, δ = 0): the drafter's own distance from p (probability);
    * ``TVD(out, p)`` for each k in ``ks`` and δ in ``deltas``: the exact distribution one
      verification step emits (:func:`~lantern.rules.output.output_distribution`) against p;
    * ``TVD(out, p), tree`` (:data:`TREE_ROW`) for each m in ``tree_siblings``, k and δ: the same
      for a deterministic tree node whose children are the drafter's top-m tokens
      (:func:`sibling_output_distribution`; ``siblings`` = m, 0 in every other row);
    * the drivers (:data:`DRIVERS`, k = 0, δ = 0): ``H(p)`` and ``H(q)``, entropies in nats
      (0 ln 0 = 0); ``p top-1``, max_x p(x) (probability); ``q top-1 = p top-1``, the fraction of
      positions where argmax q equals argmax p (ties: the first index), whose median / q90 / max
      are those of the 0/1 indicator.

    Positions go through :func:`step_tvds` (every (k, δ) cell of the ``"exact"`` convention from one
    gather and cumulative sum at the largest k) ``chunk`` at a time, fewer when the working set
    would pass ``max_bytes`` bytes: at V = 16384, k = 1000 and the paper's top-k 2000 that is 22
    positions (2 when q is not filtered).
    ``neighbours`` goes in whole, as the decoders pass it (the ``"official"`` residual zeroes the
    first k + 1 columns).
    Raises ValueError when ``groups`` does not hold one entry per position.
    """
    if groups is not None and len(groups) != len(p):
        raise ValueError(f"groups has {len(groups)} entries for {len(p)} (p, q) pairs; pass one image per pair")

    def stats(t: torch.Tensor) -> dict:
        return _summary(t, groups, n_boot, seed, level)

    rows = [{"what": "TVD(q, p)", "k": 0, "delta": 0.0, "siblings": 0, **stats(tvd(q, p))}]
    rules = [AcceptanceRule(method, k=int(k), delta=float(d), convention=convention) for k in ks for d in deltas]
    for rule, t in zip(rules, step_tvds(p, q, neighbours, rules, chunk, max_bytes)):
        rows.append({"what": "TVD(out, p)", "k": rule.k, "delta": rule.delta, "siblings": 0, **stats(t)})
    for m in tree_siblings:
        for rule, t in zip(rules, _tree_tvds(p, q, neighbours, rules, int(m), chunk)):
            rows.append({"what": TREE_ROW, "k": rule.k, "delta": rule.delta, "siblings": int(m), **stats(t)})
    per = [_drivers(p[i : i + chunk], q[i : i + chunk]) for i in range(0, len(p), chunk)]  # no (P, V) temporaries
    rows += [
        {"what": what, "k": 0, "delta": 0.0, "siblings": 0, **stats(torch.cat([d[what] for d in per]))}
        for what, _ in DRIVERS
    ]
    return pd.DataFrame(rows)


def _summary(t: torch.Tensor, groups: Optional[torch.Tensor], n_boot: int, seed: int, level: float) -> dict:
    """One row's statistics of a (P,) per-position quantity: mean, median, q90, max, positions and
    the bootstrap interval of the mean (:func:`bootstrap_mean_ci`, images resampled when ``groups``)."""
    v = t.double().numpy()
    lo, hi = bootstrap_mean_ci(v, groups, n_boot=n_boot, seed=seed, level=level)
    return {
        "mean": float(v.mean()),
        "median": float(np.median(v)),
        "q90": float(np.quantile(v, 0.9)),
        "max": float(v.max()),
        "positions": int(v.size),
        "ci_low": lo,
        "ci_high": hi,
    }


def step_tvds(
    p: torch.Tensor,
    q: torch.Tensor,
    neighbours: Optional[torch.Tensor],
    rules: Sequence[AcceptanceRule],
    chunk: int = 256,
    max_bytes: int = 1 << 30,
) -> list[torch.Tensor]:
    """Per rule, the (P,) TVD from p of the exact distribution one verification step emits
    (:func:`~lantern.rules.output.output_distributions`: the relaxed rules of the ``"exact"``
    convention share one gather and cumulative sum at the largest k).

    p, q: (P, V) float pairs (:func:`real_pairs`); neighbours: (V, >= max k) int64 (None when no rule
    is relaxed). Positions go ``chunk`` at a time, fewer when the working set (about six float32
    (m, max k) tensors a position, m the most drafts q can draw at one position, and three (V, V)
    ones for ``"official"``) would pass ``max_bytes`` bytes (at least one position). Returns one
    (P,) tensor in p's dtype per rule, in order. Raises UsageError as ``output_distribution``.
    """
    rules = list(rules)
    k = max((r.k for r in rules if r.relaxed), default=0)
    official = any(r.convention == "official" for r in rules)
    drawable = int((q > 0).sum(-1).max()) if len(q) else 1
    n = _positions_per_chunk(p.shape[-1], drawable, k, "official" if official else "exact", chunk, max_bytes)
    per_rule = [[] for _ in rules]
    for i in range(0, len(p), n):
        for acc, out in zip(per_rule, output_distributions(p[i : i + n], q[i : i + n], neighbours, rules)):
            acc.append(tvd(out, p[i : i + n]))
    return [torch.cat(parts) if parts else p.new_zeros(0) for parts in per_rule]


def _tree_tvds(
    p: torch.Tensor, q: torch.Tensor, neighbours: torch.Tensor, rules: list[AcceptanceRule], m: int, chunk: int
) -> list[torch.Tensor]:
    """Per rule, the (P,) TVD from p of a deterministic tree node whose children are the drafter's
    top-m tokens (:func:`sibling_output_distribution`), ``chunk`` positions at a time."""
    per_tree = [[] for _ in rules]
    for i in range(0, len(p), chunk):  # (chunk, m, k) gathers: no (P, V, k) working set
        pi = p[i : i + chunk]
        children = q[i : i + chunk].topk(m, dim=-1).indices  # once per chunk, shared by the rules
        for acc, rule in zip(per_tree, rules):
            acc.append(tvd(sibling_output_distribution(pi, children, neighbours, rule), pi))
    return [torch.cat(parts) for parts in per_tree]


def _drivers(p: torch.Tensor, q: torch.Tensor) -> dict:
    """{what: (n,) float64} of the driver rows (:data:`DRIVERS`) for (n, V) pairs."""
    return {
        "H(p)": entropy(p).double(),
        "p top-1": p.amax(-1).double(),
        "H(q)": entropy(q).double(),
        "q top-1 = p top-1": (q.argmax(-1) == p.argmax(-1)).double(),
    }


def _positions_per_chunk(V: int, drawable: int, k: int, convention: str, chunk: int, max_bytes: int) -> int:
    """Positions per call of ``output_distributions`` whose working set stays under ``max_bytes``:
    about six float32 (drawable, k) tensors per position (gathered p, cumulative sums, masks), plus
    three (V, V) ones for the official residual."""
    per_position = 6 * 4 * drawable * max(k, 1) + (3 * 4 * V * V if convention == "official" else 0)
    return max(1, min(chunk, max_bytes // per_position))
