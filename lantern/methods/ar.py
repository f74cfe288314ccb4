"""Autoregressive decoding: one target forward per token, the baseline every speed-up is measured against.

A round feeds every slot's last committed token ``x_{n_b-1}`` and draws ``x_{n_b}`` from the
target's distribution (guidance, temperature, top-k / top-p; the argmax when greedy) with one
uniform of the image's own stream, so AR decoding of image ``i`` gives the tokens
``python -m ambiguity.profile`` generates for image ``i``.
"""

from __future__ import annotations

import numpy as np
import torch

from lantern.engine.method import Method, Round
from lantern.engine.slots import BatchState, verify_chains

__all__ = ["AR"]


class AR(Method):
    """Plain autoregressive sampling on the engine (``--method ar``): no drafter, γ = 0."""

    name, depth, spare = "ar", 0, 1

    def round(self, st: BatchState, active: np.ndarray) -> Round:
        same = bool((st.n == st.n[0]).all())  # every slot at one position (batch 1, a full batch): views
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
            else:
                st.tokens.scatter_(1, n_t, x[:, None])
        zeros = np.zeros(st.B, dtype=np.int64)
        return Round(zeros, zeros, zeros, x.cpu().numpy().astype(np.int64))
