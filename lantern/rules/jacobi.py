"""The acceptance rules of the training-free Jacobi decoders (:mod:`lantern.methods.jacobi.method`) as pure tensor
functions: SJD's speculative-sampling test and residual (Teng et al., ICLR 2025, arXiv
2410.01699), GSD's group masses and group test (So et al., ICCV 2025, arXiv 2508.07747), and
the exact output distribution of one step of each (for the distortion measurements and tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ambiguity.stats import entropy

__all__ = [
    "sjd_accept_prob",
    "sjd_residual",
    "group_masses",
    "gsd_accept_prob",
    "gsd_output_distribution",
    "sjd_output_distribution",
    "WindowDrafts",
    "JacobiRule",
    "JACOBI_RULES",
    "sjd_judge",
    "argmax_test",
    "rank_keys",
    "group_at",
    "gsd_judge",
    "gsd_greedy",
    "entropy_threshold",
    "entropy_judge",
    "entropy_acceptance",
    "entropy_window",
    "one_step_output",
]


def sjd_accept_prob(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """``min(1, p(x)/q(x))`` of drafts ``x``: p, q (..., V) float, draft (...) int64 -> (...) float.

    ``q(x) = 0 < p(x)`` gives 1, ``p(x) = 0`` gives 0 (SJD's speculative-sampling rule, Leviathan
    et al. 2023 Alg. 1)."""
    idx = draft.long().unsqueeze(-1)
    px, qx = p.gather(-1, idx)[..., 0], q.gather(-1, idx)[..., 0]
    safe = torch.where(qx > 0, qx, torch.ones_like(qx))
    return torch.where(qx > 0, (px / safe).clamp(max=1.0), (px > 0).to(p.dtype))


def sjd_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(p - q, 0))`` (..., V), or ``p`` where it has no mass (a rejection then has
    probability 0). What SJD, GSD and SCD draw from after rejecting a draft drawn from ``q``."""
    r = (p - q).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / torch.where(mass > 0, mass, torch.ones_like(mass)), p)


def group_masses(
    p: torch.Tensor,
    q: torch.Tensor,
    group: int,
    prob_gap: float,
    embeddings: Optional[torch.Tensor] = None,
    distance: Optional[float] = None,
):
    """GSD's group ``G(x)`` of every token ``x``, as masses: ``(p(G), q(G), |G|)``, each (..., V).

    p, q: (..., V) float. Tokens are ranked by ascending ``p`` (stable: ties by code index); ``G(x)``
    holds the ranks ``r-h .. r-h+group-1`` (``h = group // 2``, clipped to the vocabulary) around
    ``x``'s rank ``r`` whose ``|p(y) - p(x)| < prob_gap`` and, when ``distance`` is given, whose
    squared L2 distance between the (V, H) ``embeddings`` of ``y`` and ``x`` is ``< distance``.
    ``x`` itself is always in ``G(x)``. Official code: ``logit_sort[..][cur_idx-7:cur_idx+7]``
    with ``p_thr = 0.15`` and ``d_thr = 0.5`` (junhyukso/GSD); it falls back to plain SJD for the
    7 lowest ranks (its slice is empty there); we clip instead.
    """
    V = p.shape[-1]
    order = torch.sort(p, dim=-1, stable=True).indices  # ascending
    ps, qs = p.gather(-1, order), q.gather(-1, order)
    h = group // 2
    pad = lambda t, v: torch.nn.functional.pad(t, (h, group - h - 1), value=v)
    win_p = pad(ps, float("nan")).unfold(-1, group, 1)  # (..., V, group): ranks r-h .. r-h+group-1
    win_q = pad(qs, 0.0).unfold(-1, group, 1)
    keep = ~torch.isnan(win_p) & ((torch.nan_to_num(win_p, nan=2.0) - ps.unsqueeze(-1)).abs() < prob_gap)
    if distance is not None:
        emb = embeddings.to(p.device, torch.float64)
        e = emb[order]  # (..., V, H) in rank order
        idx = pad(torch.arange(V, device=p.device).expand_as(order), 0).unfold(-1, group, 1)  # (..., V, group)
        members = e.gather(-2, idx.flatten(-2).unsqueeze(-1).expand(*idx.shape[:-2], V * group, e.shape[-1]))
        members = members.view(*idx.shape, e.shape[-1])
        keep &= ((members - e.unsqueeze(-2)) ** 2).sum(-1).to(p.dtype) < distance
    pg = (torch.nan_to_num(win_p, nan=0.0) * keep).sum(-1)
    qg = (win_q * keep).sum(-1)
    count = keep.sum(-1)
    back = lambda t: torch.empty_like(t).scatter_(-1, order, t)  # rank order -> vocabulary order
    return back(pg), back(qg), back(count)


def gsd_accept_prob(p_group: torch.Tensor, q_group: torch.Tensor) -> torch.Tensor:
    """``min(1, p(G)/q(G))`` (...): GSD's acceptance probability of a draft from its group masses
    (:func:`group_masses` gathered at the draft); ``q(G) = 0 < p(G)`` gives 1, ``p(G) = 0`` gives 0."""
    safe = torch.where(q_group > 0, q_group, torch.ones_like(q_group))
    return torch.where(q_group > 0, (p_group / safe).clamp(max=1.0), (p_group > 0).to(p_group.dtype))


def gsd_output_distribution(
    p: torch.Tensor,
    q: torch.Tensor,
    group: int,
    prob_gap: float,
    embeddings: Optional[torch.Tensor] = None,
    distance: Optional[float] = None,
) -> torch.Tensor:
    """The exact distribution of the token one GSD verification emits at a position (..., V).

    ``out(y) = q(y) a(y) + (Σ_x q(x) (1 - a(x))) norm(max(p - q, 0))(y)`` with
    ``a(x) = min(1, p(G(x))/q(G(x)))``: the draft ``x ~ q`` is kept or the SJD residual is drawn.
    p, q: (..., V) float (q may be a point mass: an initialised draft). ``group = 1`` gives ``p``
    exactly (SJD is lossless). Compare with ``p`` (``lantern.rules.divergences.tvd``) for the per-step
    distortion, as :mod:`lantern.distortion` does for LANTERN.
    """
    pg, qg, _ = group_masses(p, q, group, prob_gap, embeddings, distance)
    return one_step_output(p, q, gsd_accept_prob(pg, qg))


def sjd_output_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """One SJD verification's output distribution (..., V): ``p`` up to rounding (lossless)."""
    return gsd_output_distribution(p, q, 1, 1.0)


# --------------------------------------------------------------------------- the rules as table entries
@dataclass(frozen=True)
class WindowDrafts:
    """A Jacobi window's drafts as the rules read them (B rows, g drafts, vocabulary V).

    tokens: (B, g) int64; q: (B, g, V) float, the distribution each draft was drawn from (its
    row is ignored where ``point``); point: (B, g) bool, the draft is a new window position whose
    q is a point mass on it (SJD, arXiv 2410.01699, Sec. 3.2: initialised drafts).
    """

    tokens: torch.Tensor
    q: torch.Tensor
    point: torch.Tensor

    def q_draft(self) -> torch.Tensor:
        """``q(x)`` (B, g): 1 for a point mass."""
        qx = self.q.gather(-1, self.tokens.unsqueeze(-1))[..., 0]
        return torch.where(self.point, torch.ones_like(qx), qx)

    def q_full(self) -> torch.Tensor:
        """``q`` (B, g, V) with the point masses written out."""
        one = torch.zeros_like(self.q).scatter_(-1, self.tokens.unsqueeze(-1), 1.0)
        return torch.where(self.point.unsqueeze(-1), one, self.q)


@dataclass(frozen=True)
class JacobiRule:
    """One Jacobi acceptance rule as a table entry of :data:`JACOBI_RULES`.

    judge(p, drafts, knobs, emb) -> dict of (B, g) tensors ``accept_prob``, ``p_tilde``,
    ``j_star``, ``spent`` (p: (B, g, V) target distributions at the drafts; drafts: a
    :class:`WindowDrafts`; knobs: the method's :class:`~lantern.methods.jacobi.config.JacobiConfig`;
    emb: (V, H) input embeddings or None); greedy(p, drafts, knobs, emb) -> (B, g) bool, the
    temperature-0 test; residual(p, q) -> (..., V), what a rejection draws from; lossless: one
    step's output is ``p`` exactly; greedy_is_ar: greedy decoding equals greedy AR.
    """

    judge: Callable
    greedy: Callable
    residual: Callable
    lossless: bool
    greedy_is_ar: bool


def _columns(px: torch.Tensor, accept: torch.Tensor, p_tilde=None, j_star=None) -> dict:
    p_tilde = px if p_tilde is None else p_tilde
    j_star = torch.zeros_like(px, dtype=torch.long) if j_star is None else j_star
    return dict(accept_prob=accept, p_tilde=p_tilde, j_star=j_star, spent=p_tilde - px)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``min(1, num/den)``; ``den = 0 < num`` gives 1, ``num = 0`` gives 0."""
    safe = torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, (num / safe).clamp(max=1.0), (num > 0).to(num.dtype))


def sjd_judge(p: torch.Tensor, d: WindowDrafts, knobs=None, emb=None) -> dict:
    """SJD's ``min(1, p(x)/q(x))`` for every draft (B, g) (Teng et al., ICLR 2025, arXiv 2410.01699)."""
    px = p.gather(-1, d.tokens.unsqueeze(-1))[..., 0]
    return _columns(px, _ratio(px, d.q_draft().to(px.dtype)))


def argmax_test(p: torch.Tensor, d: WindowDrafts, knobs=None, emb=None) -> torch.Tensor:
    """Greedy verification (B, g) bool: the draft is the argmax of ``p`` (lowest index on ties)."""
    return d.tokens == p.argmax(-1)


def rank_keys(p: torch.Tensor) -> Optional[torch.Tensor]:
    """Distinct int64 keys (..., V) in the order of the stable ascending sort of ``p`` (ties by code
    index): the float32 bits of ``p >= 0`` (monotone for non-negative floats) above the code index,
    or None where they do not fit in 63 bits (float64 ``p``)."""
    if p.dtype != torch.float32:
        return None
    shift = max(1, (p.shape[-1] - 1).bit_length())
    return (p.view(torch.int32).long() << shift) | torch.arange(p.shape[-1], device=p.device)


def _window(p: torch.Tensor, x: torch.Tensor, group: int):
    """The tokens at ranks ``r - group//2 .. r - group//2 + group - 1`` around each draft's rank
    ``r`` in the stable ascending order of ``p`` (..., group) int64, and whether each rank exists."""
    V, h = p.shape[-1], group // 2
    key = rank_keys(p)
    if key is None:  # one stable sort per row
        order = torch.sort(p, dim=-1, stable=True).indices
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(V, device=p.device).expand_as(order))
        r = rank.gather(-1, x.unsqueeze(-1)) + torch.arange(group, device=p.device) - h
        inside = (r >= 0) & (r < V)
        return order.gather(-1, r.clamp(0, V - 1)), inside
    kx = key.gather(-1, x.unsqueeze(-1))  # the neighbours by two small top-k's over the keys
    below = torch.where(key < kx, key, -1).topk(h, -1).values.flip(-1)
    top = torch.iinfo(torch.int64).max
    above = torch.where(key > kx, key, top).topk(group - h - 1, -1, largest=False).values
    keys = torch.cat([below, kx, above], -1)
    inside = (keys >= 0) & (keys < top)
    return torch.where(inside, keys & ((1 << max(1, (V - 1).bit_length())) - 1), 0), inside


def group_at(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor, group: int, prob_gap: float, emb=None, distance=None):
    """GSD's group masses at the drafts only: ``(p(G(x)), q(G(x)), |G(x)|)``, each (...) for
    p, q (..., V) and drafts x (...) int64 (the group of :func:`group_masses` evaluated at ``x``
    instead of at every token, summed in the same rank order: float32 ``p`` finds the window
    with two top-k's over :func:`rank_keys`, float64 with one stable sort per row)."""
    members, inside = _window(p, x, group)
    pm, qm = p.gather(-1, members), q.gather(-1, members)
    px = p.gather(-1, x.unsqueeze(-1))
    keep = inside & ((pm - px).abs() < prob_gap)
    if distance is not None:
        e = emb.to(p.device, torch.float64)
        keep &= ((e[members] - e[x].unsqueeze(-2)) ** 2).sum(-1).to(p.dtype) < distance
    return (pm * keep).sum(-1), (qm * keep).sum(-1), keep.sum(-1)


def gsd_judge(p: torch.Tensor, d: WindowDrafts, knobs, emb=None) -> dict:
    """GSD's ``min(1, p(G)/q(G))`` for every draft (B, g) (So et al., ICCV 2025, arXiv 2508.07747);
    record columns ``p_tilde = p(G)``, ``j_star = |G| - 1``, ``spent = p(G) - p(x)``."""
    pg, qg, cnt = group_at(p, d.q_full().to(p.dtype), d.tokens, knobs.group, knobs.prob_gap, emb, knobs.distance)
    px = p.gather(-1, d.tokens.unsqueeze(-1))[..., 0]
    return _columns(px, _ratio(pg, qg), pg, cnt - 1)


def gsd_greedy(p: torch.Tensor, d: WindowDrafts, knobs, emb=None) -> torch.Tensor:
    """Greedy GSD (B, g) bool: the argmax of ``p`` is the draft or in the draft's group."""
    top = p.argmax(-1, keepdim=True)
    members, inside = _window(p, d.tokens, knobs.group)
    x = d.tokens.unsqueeze(-1)
    ok = ((members == top) & inside).any(-1, keepdim=True)
    ok &= (p.gather(-1, top) - p.gather(-1, x)).abs() < knobs.prob_gap
    if knobs.distance is not None:
        e = emb.to(p.device, torch.float64)
        ok &= ((e[top] - e[x]) ** 2).sum(-1) < knobs.distance
    return (d.tokens == top[..., 0]) | ok[..., 0]


def entropy_threshold(h: torch.Tensor, alpha: float, floor: float) -> torch.Tensor:
    """The entropy-aware rule's threshold ``tau(H) = max(floor, exp(-H / alpha))`` (...) for target
    entropies ``h`` (...) in nats: 1 at a certain position, down to ``floor`` at a flat one."""
    return torch.exp(-h / alpha).clamp(min=floor)


def entropy_judge(p: torch.Tensor, d: WindowDrafts, knobs, emb=None) -> dict:
    """Entropy-aware acceptance (Ma et al., NeurIPS 2025, arXiv 2510.09012):
    ``min(1, p(x) / (tau(H(p)) q(x)))`` with :func:`entropy_threshold` of the target's entropy at
    the draft's position, so high-entropy (low-information) positions accept more drafts; ``p_tilde``
    records ``p(x) / tau`` (the relaxed mass) and ``spent`` what the relaxation added."""
    px = p.gather(-1, d.tokens.unsqueeze(-1))[..., 0]
    tau = entropy_threshold(entropy(p).to(p.dtype), knobs.entropy_alpha, knobs.entropy_floor)
    relaxed = px / tau
    return _columns(px, _ratio(relaxed, d.q_draft().to(px.dtype)), relaxed)


def entropy_acceptance(p: torch.Tensor, q: torch.Tensor, alpha: float, floor: float) -> torch.Tensor:
    """The entropy-aware rule's acceptance probability of every token as a draft (..., V) for
    p, q (..., V): ``min(1, p(y) / (tau(H(p)) q(y)))`` (for :func:`one_step_output`)."""
    tau = entropy_threshold(entropy(p).to(p.dtype), alpha, floor).unsqueeze(-1)
    return _ratio(p / tau, q)


def entropy_window(h, longest: int, shortest: int, scale: float) -> np.ndarray:
    """The entropy-aware rule's window (tokens per Jacobi forward) for target entropies ``h`` (nats,
    any array-like of floats) -> the same shape, int64 numpy:
    ``L(H) = clamp(floor(longest * exp(-H / scale) + 1/2), shortest, longest)`` (nearest, ties up),
    so a confident position (H = 0) gets the longest window and the window shrinks by ``e`` every
    ``scale`` nats. ``longest >= shortest >= 1`` windows, ``scale > 0`` nats (checked by
    :class:`~lantern.methods.jacobi.config.JacobiConfig`). Our reconstruction of the entropy-dependent
    draft length of Ma et al. (NeurIPS 2025, arXiv 2510.09012), whose code does not release it."""
    raw = np.floor(longest * np.exp(-np.asarray(h, dtype=np.float64) / scale) + 0.5)
    return np.clip(raw, shortest, longest).astype(np.int64)


def one_step_output(p: torch.Tensor, q: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
    """The exact distribution (..., V) of the token one verification emits when a draft ``x ~ q``
    is kept with probability ``accept(x)`` (..., V) and a rejection draws ``norm(max(p - q, 0))``:
    ``out(y) = q(y) accept(y) + (sum_x q(x) (1 - accept(x))) norm(max(p - q, 0))(y)``."""
    rejected = (q * (1 - accept)).sum(-1, keepdim=True)
    return q * accept + rejected * sjd_residual(p, q)


# method -> its rule: a new Jacobi rule is one entry (plus its knobs in JacobiConfig)
JACOBI_RULES = {
    "sjd": JacobiRule(sjd_judge, argmax_test, sjd_residual, lossless=True, greedy_is_ar=True),
    "scd": JacobiRule(sjd_judge, argmax_test, sjd_residual, lossless=True, greedy_is_ar=True),
    "gsd": JacobiRule(gsd_judge, gsd_greedy, sjd_residual, lossless=False, greedy_is_ar=False),
    "entropy-sd": JacobiRule(entropy_judge, argmax_test, sjd_residual, lossless=False, greedy_is_ar=True),
}
