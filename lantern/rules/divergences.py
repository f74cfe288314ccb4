"""Divergences between next-token distributions, in the units LANTERN's bounds use.

* :func:`tvd` — total variation distance, ``0.5 * sum |p - q|`` (a probability, in [0, 1]).
* :func:`jsd` — Jensen–Shannon divergence in **nats** (natural log), in [0, ln 2].
* :func:`moved_jsd` — the JSD between ``p`` and the distribution LANTERN builds from it by
  moving the mass ``S`` of some neighbours onto the draft token (Jang et al., ICLR 2025,
  arXiv 2410.03355, Sec. 3), in closed form from ``p(x̂)`` and ``S``. (The TVD of that move is
  simply ``S``: the draft token gains ``S``, the neighbours lose ``S``, ``½ (S + S) = S``.)

Closed form of the moved JSD. Let ``a = p(x̂)`` and let ``p'`` equal ``p`` except
``p'(x̂) = a + S`` and ``p'(n_i) = 0`` for the moved neighbours ``n_1..n_j`` (``S = Σ p(n_i)``).
With ``m = (p + p') / 2`` only those tokens contribute to ``JSD = ½ KL(p‖m) + ½ KL(p'‖m)``:

* a moved neighbour ``n_i``: ``m = p(n_i)/2``, so ``½ p(n_i) ln 2`` (the ``p'`` term is 0);
* the draft token: ``m = a + S/2``, so ``½ [a ln(a/m) + (a+S) ln((a+S)/m)]``.

Hence ``JSD(S) = ½ [S ln 2 + a ln(a / (a + S/2)) + (a + S) ln((a + S) / (a + S/2))]``, which
depends on the neighbours only through ``S``; evaluated on the cumulative sums ``S_1..S_k`` it
gives the JSD of every prefix at once. ``dJSD/dS = ½ ln 2 + ½ ln((a+S)/(a+S/2)) > 0``, so it
grows with ``S`` (and hence with the prefix length). ``a = 0`` gives ``S ln 2``; ``S = 1`` with
``a = 0`` reaches the maximum ``ln 2``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["tvd", "jsd", "moved_jsd"]

LN2 = math.log(2.0)


def tvd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation distance ``0.5 * Σ_v |p(v) - q(v)|`` over the last dim.

    p, q: (..., V) probabilities of one floating dtype (broadcastable) -> (...) same dtype,
    a probability in [0, 1]. Raises nothing (shape errors come from torch).
    """
    return 0.5 * (p - q).abs().sum(-1)


def jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen–Shannon divergence in nats: ``½ KL(p‖m) + ½ KL(q‖m)``, ``m = (p + q) / 2``.

    p, q: (..., V) probabilities (broadcastable, floating) -> (...) same dtype, in [0, ln 2].
    Zero entries contribute 0 (``0 ln 0 = 0`` via ``torch.xlogy``).
    """
    m = 0.5 * (p + q)
    kl_p = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1)
    kl_q = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(-1)
    return (0.5 * (kl_p + kl_q)).clamp_min(0.0)


def moved_jsd(p_draft: torch.Tensor, moved: torch.Tensor) -> torch.Tensor:
    """JSD (nats) between ``p`` and ``p`` with mass ``moved`` shifted onto the draft token.

    p_draft: (...) ``a = p(x̂)``; moved: (...) ``S`` (broadcastable, e.g. (..., 1) against
    (..., k) cumulative sums) -> broadcast shape, same floating dtype, in [0, ln 2]. Closed form
    (derived in the module docstring)::

        JSD = ½ [S ln 2 + a ln(a / (a + S/2)) + (a + S) ln((a + S) / (a + S/2))]

    Computed in float64 and cast back, so ``S = 0`` gives exactly 0.
    """
    dtype = torch.promote_types(p_draft.dtype, moved.dtype)
    a = p_draft.double()
    s = moved.double()
    m = a + 0.5 * s
    b = a + s
    out = 0.5 * (s * LN2 + torch.xlogy(a, a) - torch.xlogy(a, m) + torch.xlogy(b, b) - torch.xlogy(b, m))
    return out.clamp_min(0.0).to(dtype)
