"""What the drafter methods (chains, draft trees) share: the drafter over every slot's pending
positions (EAGLE's re-run on accepted tokens, :func:`pending_features`) and a chain of drafts
(:func:`draft_chains`)."""

from __future__ import annotations

import numpy as np
import torch

from ambiguity.sampling import expand_rows
from lantern.drafter.model import draft_q
from lantern.engine.slots import BatchState

__all__ = ["pending_features", "draft_chains"]


def pending_features(st: BatchState, n, d, drafting) -> torch.Tensor:
    """The drafter over every drafting slot's pending positions ``d_b..n_b-1`` with true target
    features (EAGLE's re-run on accepted tokens; padded to the longest; a slot that does not draft
    runs one throw-away position at ``d_b``). Returns (rows, 1, H): each row's last pending output,
    the feature that drafts ``x̂_{n_b}`` (the root of a draft tree)."""
    dev, H, guided = st.device, st.H, st.guided
    pend = np.where(drafting, n - d, 1)
    Tp = int(pend.max())
    d_t = torch.as_tensor(d, device=dev)
    ar = torch.arange(Tp + int(d.max()) + 1, device=dev)
    slots = d_t[:, None] + ar[:Tp]
    pos = slots.clamp(max=st.N - 1)
    toks = st.tokens.gather(1, pos)
    pos_r = expand_rows(pos, guided)
    fin = st.feats.gather(1, pos_r[..., None].expand(-1, -1, H))
    S = int(d.max()) + Tp
    visible = ar[None, None, :S] <= slots[:, :, None]
    f = st.drafter.forward_slots(
        st.model,
        expand_rows(toks, guided),
        fin,
        st.dcache,
        expand_rows(slots, guided),
        pos_r,
        expand_rows(visible, guided),
    )
    last = expand_rows(torch.as_tensor(pend - 1, device=dev), guided)
    return f.gather(1, last[:, None, None].expand(-1, 1, H))


def draft_chains(st: BatchState, n, d, g) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft a chain for every slot in ``max(g)`` drafter steps (:func:`lantern.methods.chain.draft`, per row).

    The first forward covers each row's pending positions ``d_b..n_b-1`` (padded to the longest;
    each row's last real output drafts ``x̂_{n_b}``); row b draws only its first ``g_b`` drafts
    from its stream. Returns drafts (B, max g) int64 and q (B, max g, V)."""
    dev, B, guided = st.device, st.B, st.guided
    gmax = int(g.max())
    f = pending_features(st, n, d, g > 0)
    ar = torch.arange(gmax + int(n.max()) + 1, device=dev)
    n_t = torch.as_tensor(n, device=dev)
    xs, qs = [], []
    for j in range(gmax):
        q = draft_q(st.drafter, st.model, f, st.target)[:, -1]  # (B, V)
        x = q.argmax(-1) if st.sampling.greedy else st.streams.categorical(q, range(B), g > j)
        xs.append(x)
        qs.append(q)
        if j + 1 < gmax:
            at = (n_t + j)[:, None]
            vis = ar[None, None, : int(n.max()) + j + 1] <= at[:, :, None]
            f = st.drafter.forward_slots(
                st.model,
                expand_rows(x, guided)[:, None],
                f,
                st.dcache,
                expand_rows(at, guided),
                expand_rows(at.clamp(max=st.N - 1), guided),
                expand_rows(vis, guided),
            )
    return torch.stack(xs, 1), torch.stack(qs, 1)
