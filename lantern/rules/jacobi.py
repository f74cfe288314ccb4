"""The acceptance rules of the training-free Jacobi decoders (:mod:`lantern.methods.jacobi.method`) as pure tensor
functions: SJD's speculative-sampling test and residual (Teng et al., ICLR 2025, arXiv
2410.01699), GSD's group masses and group test (So et al., ICCV 2025, arXiv 2508.07747), and
the exact output distribution of one step of each (for the distortion measurements and tests).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = [
    "sjd_accept_prob",
    "sjd_residual",
    "group_masses",
    "gsd_accept_prob",
    "gsd_output_distribution",
    "sjd_output_distribution",
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
    a = gsd_accept_prob(pg, qg)
    rejected = (q * (1 - a)).sum(-1, keepdim=True)
    return q * a + rejected * sjd_residual(p, q)


def sjd_output_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """One SJD verification's output distribution (..., V): ``p`` up to rounding (lossless)."""
    return gsd_output_distribution(p, q, 1, 1.0)
