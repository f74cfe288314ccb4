"""Autoregressive decoding: one target forward per token, the baseline every speed-up is measured against.

A round feeds every slot's last committed token ``x_{n_b-1}`` and draws ``x_{n_b}`` from the
target's distribution (guidance, temperature, top-k / top-p; the argmax when greedy) with one
uniform of the image's own stream, so AR decoding of image ``i`` gives the tokens
``python -m ambiguity.profile`` generates for image ``i``.
"""

from __future__ import annotations

import numpy as np
import torch

from ambiguity.sampling import expand_rows
from lantern.engine.method import Method, Round
from lantern.engine.slots import BatchState, verify_chains

__all__ = ["AR", "ar_round", "ar_step"]


class AR(Method):
    """Plain autoregressive sampling on the engine (``--method ar``): no drafter, γ = 0."""

    name, depth, spare = "ar", 0, 1

    def round(self, st: BatchState, active: np.ndarray) -> Round:
        return ar_round(st)


def ar_round(st: BatchState, features: bool = False) -> Round:
    """AR's round on the engine: :func:`ar_step` (features: keep the target features, for a drafting
    method's round without drafts) and its :class:`~lantern.engine.method.Round` (nothing drafted)."""
    x, _ = ar_step(st, features)
    zeros = np.zeros(st.B, dtype=np.int64)
    return Round(zeros, zeros, zeros, x.cpu().numpy().astype(np.int64))


def ar_step(st: BatchState, features: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One target forward over every slot's last committed token ``x_{n_b-1}`` and the draw of
    ``x_{n_b}``, written into ``st.tokens`` (timed as "target" and "acceptance").

    features: also write the target feature ``h_{n_b-1}`` into ``st.feats`` (a drafting method's
    round without drafts, whose drafter reads the features later). Returns the tokens drawn (B,)
    int64 and their distributions p (B, V), on the device. Every slot at one position (batch 1, a
    batch admitted together) reads and writes through views, without a mask."""
    same = bool((st.n == st.n[0]).all())
    n0 = int(st.n[0])
    with st.timer("target"):
        n_t = None if same else torch.as_tensor(st.n, device=st.device)[:, None]
        last = st.tokens[:, n0 - 1 : n0] if same else st.tokens.gather(1, n_t - 1)
        out = verify_chains(st.model, st.cache, last, st.n, st.N, st.guided)
    with st.timer("acceptance"):
        p = st.target(out.logits[:, 0])  # (B, V)
        x = p.argmax(-1) if st.sampling.greedy else st.streams.categorical(p, range(st.B))
        if same:
            st.tokens[:, n0] = x
            if features:
                st.feats[:, n0] = out.hidden[:, 0]
        else:
            st.tokens.scatter_(1, n_t, x[:, None])
            if features:
                at = expand_rows(n_t, st.guided)[..., None].expand(-1, -1, st.H)
                st.feats.scatter_(1, at, out.hidden)
    return x, p
