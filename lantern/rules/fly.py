"""FLy's entropy-gated deferred verification (Li et al., "Training-Free Loosely Speculative
Decoding: Accepting Semantically Correct Drafts Beyond Exact Match", arXiv 2511.22972, ICLR 2026;
official code github.com/AMD-AGI/FLy ``fly/models/FLy.py``; shipped in vLLM as
``rejection_sample_method="fly"``).

Speculative decoding stops a chain at its first rejected draft. FLy *defers* a rejection at a
place where the target itself is unsure: draft ``i``, natively rejected, is accepted after all when

1. the target's top-3 entropy there, ``H_3(p) = -Σ_{top 3} p log p`` (nats, over the three largest
   probabilities of the processed ``p``, not renormalised), is at least the threshold θ (0.3);
2. the ``W`` drafts that follow it in the chain (the window, 6) are all natively accepted — the
   drafter and the target agree again, so the mismatch was a rewording, not an error; a window
   that does not fit in the chain defers nothing;
3. ``p(x̂_i) > 0`` (a draft the target cannot emit, e.g. cut by top-k, is never deferred).

"Natively accepted" is the lossless test of the same draft: for sampled drafts the coin
``u q(x̂) < p(x̂)`` of speculative sampling (vLLM's probabilistic-draft path), for greedy
decoding ``x̂ = argmax p``. The window is judged on the native verdicts, so two deferred drafts
are at least ``W + 1`` places apart. The accepted prefix is then the leading run of native or
deferred acceptances; the next token is drawn as in speculative decoding (the residual
``norm(max(p - q, 0))`` at the first draft left rejected, the bonus position otherwise). FLy is
lossy and has no distribution guarantee.

Where the sources differ we follow vLLM: its window counts the ``W`` drafts *after* the rejected
one (the official code's ``win_len`` counts the rejected draft too, and also leaves the chain's
last ``win_len`` places undeferrable), and it adds condition 3.
"""

from __future__ import annotations

import torch

__all__ = ["ENTROPY_TOP", "top_entropy", "deferred"]

ENTROPY_TOP = 3  # FLy's entropy gate reads the three largest target probabilities (vLLM's VLLM_FLY_ENTROPY_TOP_K)


def top_entropy(p: torch.Tensor, top: int = ENTROPY_TOP) -> torch.Tensor:
    """``-Σ p log p`` over the ``top`` largest probabilities of each row (not renormalised), in nats.

    p: (..., V) float probabilities -> (...) p.dtype, in [0, top/e]. ``0 log 0 = 0``. A vocabulary
    smaller than ``top`` uses all of it. Source: FLy's ``calculate_topk_entropy`` (arXiv 2511.22972).
    """
    values = p.topk(min(top, p.shape[-1]), dim=-1).values
    return -torch.xlogy(values, values).sum(-1)


def deferred(
    native: torch.Tensor, entropy: torch.Tensor, p_draft: torch.Tensor, threshold: float, window: int
) -> torch.Tensor:
    """The drafts FLy accepts: native acceptances plus the deferred rejections (module docstring).

    native: (B, γ) bool, the lossless verdicts (False beyond a row's chain); entropy: (B, γ) the
    target's top-3 entropy at each draft (nats, :func:`top_entropy`); p_draft: (B, γ) ``p(x̂)``;
    threshold: θ >= 0; window: W >= 1 -> (B, γ) bool. Draft i is deferred iff it is natively
    rejected, ``entropy >= θ``, ``p(x̂) > 0`` and drafts ``i+1 .. i+W`` all exist and are natively
    accepted. No validation (:class:`lantern.rules.acceptance.AcceptanceRule` checks θ and W).
    """
    B, g = native.shape
    runs = torch.cat([native.new_zeros(B, 1, dtype=torch.long), native.long().cumsum(-1)], 1)  # (B, γ+1)
    end = torch.arange(g, device=native.device) + 1 + window  # exclusive end of each draft's window
    fits = end <= g
    agreed = runs.gather(1, end.clamp(max=g).expand(B, g)) - runs[:, 1:]  # native acceptances in i+1..i+W
    defer = ~native & (entropy >= threshold) & (p_draft > 0) & fits & (agreed == window)
    return native | defer
