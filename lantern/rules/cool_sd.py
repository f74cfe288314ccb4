"""Cool-SD's annealed relaxation schedule (Li, Zhang, Du, Ji, "Annealed Relaxation of Speculative
Decoding for Faster Autoregressive Image Generation", AAAI 2026, arXiv 2601.09212).

Cool-SD accepts the draft ``x̂_i`` at place ``i`` of an ``L``-token chain with probability
``f_i = min(1, ω_i p(x̂_i) / q(x̂_i))`` and, after a rejection, samples the residual that minimises
the paper's upper bound on the TV distance (its Theorem 2), ``G*_i = norm(max(p - q f_i, 0))``
with ``f_i`` evaluated at every token: ``q(y) f_i(y) = min(q(y), ω_i p(y))``. Its perturbation
analysis (Proposition 2) shows that, for a fixed expected number of accepted drafts, relaxing the
early places of a chain more than the late ones gives a smaller bound, hence the exponentially
decaying schedule ``ω_i = δ exp(-ν i - μ)`` with ``ν = 0.7`` and ``δ`` the one knob.

The paper leaves ``μ`` implicit; we take it to normalise the schedule so that its mean over the
chain is ``δ``: ``μ = ln(mean_{m=1..L} exp(-ν m))``, i.e.
``ω_i = δ L exp(-ν i) / Σ_{m=1..L} exp(-ν m)`` (the uniform schedule of the paper's
"UniformRSD" ablation, ``ω_i = δ``, is ``ν = 0``; the shift of ``i`` cancels, so counting places
from 0 or 1 gives the same weights). Late places can then get ``ω_i < 1`` (stricter than
lossless SD), which the residual ``G*`` handles (it is no longer ``norm(max(p - q, 0))`` there).
``i`` is the place of a draft *within its chain* (the paper's ``i = 1..L`` of one verification),
not the image token index, and ``L`` is that chain's length (the decoder cuts chains near the end
of an image; the schedule is then that of the shorter chain).
"""

from __future__ import annotations

import torch

__all__ = ["annealed_weights"]


def annealed_weights(positions: torch.Tensor, lengths: torch.Tensor, delta: float, nu: float) -> torch.Tensor:
    """Cool-SD's relaxation factor ``ω`` of each draft: ``δ L exp(-ν i) / Σ_{m=0..L-1} exp(-ν m)``.

    positions: (...) int64, the 0-based place ``i`` of each draft in its chain; lengths: int64
    broadcastable to positions, the chain's length ``L >= 1`` (``i < L``); delta: δ > 0, the mean of
    the schedule over a chain; nu: ν >= 0, its decay per place -> (...) float64, ``ω > 0``.
    Closed form of the geometric sum: ``Σ_{m<L} e^{-ν m} = (1 - e^{-ν L}) / (1 - e^{-ν})`` (``L`` when
    ν = 0). No validation (:class:`lantern.rules.acceptance.AcceptanceRule` checks δ and ν).
    Source: arXiv 2601.09212, Sec. "Annealed relaxation" (ν = 0.7; the normalisation is our choice,
    module docstring).
    """
    i = positions.double()
    L = torch.as_tensor(lengths, device=positions.device).double().clamp_min(1.0)
    if nu == 0:
        shape = torch.broadcast_shapes(i.shape, L.shape)
        return torch.full(shape, float(delta), dtype=torch.float64, device=positions.device)
    decay = torch.exp(torch.tensor(-float(nu), dtype=torch.float64, device=positions.device))
    total = (1.0 - decay**L) / (1.0 - decay)
    return delta * L * torch.exp(-nu * i) / total
