"""Ambiguity statistics of next-token distributions: pure, vectorised tensor functions.

Every function takes probabilities ``p`` of shape (..., V), float (any float dtype; computed in
float32 or wider), each row summing to 1 over the V image tokens, and reduces the last axis.
These are the quantities behind LANTERN's motivation (Jang et al., ICLR 2025, Sec. 3 and Fig. 2:
the average top-1 probability and top-10 mass of visual AR models are far below those of text
LLMs, so the target model is *ambiguous* about which token to choose).

Rank convention: the rank of a token is 1 + the number of tokens with strictly larger
probability ("competition" or "min" ranking). Tokens tied in probability share the best rank of
the tie, so the token chosen by greedy decoding always has rank 1, and a token tied with the
most likely one also has rank 1.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

__all__ = [
    "bootstrap_mean_ci",
    "top1_prob",
    "topk_mass",
    "entropy",
    "chosen_prob",
    "chosen_rank",
    "token_stats",
    "STAT_NAMES",
]

STAT_NAMES = ("top1", "top10", "entropy", "chosen_prob", "chosen_rank")


def _float(p: torch.Tensor) -> torch.Tensor:
    return p if p.dtype in (torch.float32, torch.float64) else p.float()


def top1_prob(p: torch.Tensor) -> torch.Tensor:
    """Probability of the most likely token: (..., V) -> (...), same float dtype (float32 for halves).

    LANTERN Fig. 2 (left): the mean of this over positions is the "average top-1 probability".
    """
    return _float(p).amax(dim=-1)


def topk_mass(p: torch.Tensor, k: int = 10) -> torch.Tensor:
    """Total probability of the ``k`` most likely tokens: (..., V) -> (...), probabilities.

    ``k`` larger than V is clipped to V (mass 1). Raises ValueError for ``k < 1``.
    LANTERN Fig. 2 (right) uses k = 10 ("top-10 mass").
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    p = _float(p)
    return torch.topk(p, min(int(k), p.shape[-1]), dim=-1).values.sum(-1)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats, H(p) = -sum_v p_v log p_v, with 0 log 0 = 0: (..., V) -> (...).

    Ranges from 0 (one token has all the mass) to log V (uniform). Entries of exactly zero
    (e.g. tokens removed by top-k / top-p filtering) contribute nothing.
    """
    p = _float(p)
    # log of p clamped to the smallest normal float (0 log 0 = 0 exactly, as p is 0 there) and one dot product
    # per row: vectorised, 2x faster on the CPU than torch.special.entr's elementwise -p log p (same value to 1 ulp)
    return -torch.linalg.vecdot(p, p.clamp_min(torch.finfo(p.dtype).tiny).log())


def chosen_prob(p: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Probability the distribution gives the chosen token: p (..., V), tokens (...) int64 -> (...).

    ``tokens`` are code indices (columns of ``p``); raises IndexError/RuntimeError when a token is
    outside 0..V-1 (torch.gather).
    """
    p = _float(p)
    return p.gather(-1, tokens.long().unsqueeze(-1).to(p.device)).squeeze(-1)


def chosen_rank(p: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Rank of the chosen token, 1 = most likely: p (..., V), tokens (...) -> (...) int64.

    rank = 1 + #{v : p_v > p_token}; ties share the best rank (see the module docstring), so
    the argmax is always rank 1 and a token of probability 0 ranks after all tokens with mass.
    """
    p = _float(p)
    q = chosen_prob(p, tokens)
    return (p > q.unsqueeze(-1)).sum(-1).to(torch.long) + 1


def token_stats(p: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """All per-token statistics at once: p (..., V), tokens (...) -> dict of (...) tensors.

    Keys (see :data:`STAT_NAMES`): ``top1`` (probability), ``top10`` (mass of the 10 most
    likely tokens), ``entropy`` (nats), ``chosen_prob`` (probability), ``chosen_rank`` (int64,
    1 = most likely). Float outputs are float32 (float64 for float64 input).
    """
    p = _float(p)
    return {
        "top1": top1_prob(p),
        "top10": topk_mass(p, 10),
        "entropy": entropy(p),
        "chosen_prob": chosen_prob(p, tokens),
        "chosen_rank": chosen_rank(p, tokens),
    }


def bootstrap_mean_ci(
    values,
    groups: Optional[torch.Tensor] = None,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile-bootstrap interval (low, high) of the mean of ``values`` (P,) over positions.

    groups: (P,) int64 cluster of each value (the image a position belongs to; positions of one
    image are correlated): each resample draws the G groups with replacement and takes the mean
    of the values of the drawn groups (a group drawn twice counts twice; with equal group sizes
    this is the mean of the drawn groups' means). Without ``groups`` every value is its own
    group (positions resampled). ``n_boot`` resamples from ``numpy.random.default_rng(seed)``
    (``integers(0, G, (n_boot, G))``, drawn in blocks), interval at the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles (numpy's linear interpolation) of the resampled means
    (Efron & Tibshirani, 1993, ch. 13). Same inputs and seed -> same interval; one group gives
    [mean, mean]. Raises ValueError for no values, a ``groups`` of another length or n_boot < 1.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    if v.size == 0:
        raise ValueError("bootstrap_mean_ci needs at least one value")
    if int(n_boot) < 1:
        raise ValueError(f"bootstrap_mean_ci: n_boot must be >= 1, got {n_boot}")
    if groups is None:
        sums, counts = v, np.ones_like(v)
    else:
        g = np.asarray(groups).ravel()
        if g.shape != v.shape:
            raise ValueError(f"groups has {g.size} entries for {v.size} values; pass one group per position")
        _, g = np.unique(g, return_inverse=True)
        sums, counts = np.bincount(g, weights=v), np.bincount(g).astype(np.float64)
    G = sums.size
    rng = np.random.default_rng(seed)
    block = max(1, (1 << 22) // G)  # at most ~4M drawn indices (32 MiB) at once
    means = []
    for at in range(0, int(n_boot), block):
        idx = rng.integers(0, G, size=(min(block, int(n_boot) - at), G))
        means.append(sums[idx].sum(1) / counts[idx].sum(1))
    lo, hi = np.quantile(np.concatenate(means), [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
