"""Batched draft trees: every image in flight drafts, verifies, walks and commits its own tree in one step.

:func:`lantern.engine.loop.run` with ``tree=`` (EAGLE-1 static or EAGLE-2 dynamic
:class:`lantern.methods.tree.spec.TreeSpec`, both conventions) runs :func:`tree_round` once per batch step
on the slots of :mod:`lantern.engine.slots`: each step every image drafts its own tree, all trees are
verified in one target forward (padded to the widest tree; column ``t`` of image ``b`` at cache
slot ``n_b - 1 + t``, image position ``n_b - 1 + depth_t``, seeing its image's committed slots and
its own ancestors), each image walks its tree and moves its accepted path's keys and values
behind its committed tokens (:meth:`~ambiguity.models.base.TokenModel.move_slots`, one indexed
copy for all images). The target's cache is preallocated for ``N`` + the node count positions a
row.

Vectorised over images: all images' trees are (B, T) tensors
(:class:`lantern.methods.tree.walk.Trees`) built level by level for all images at once (EAGLE-2
beams and reranking as batched top-k and stable sorts; EAGLE-1 shapes as node tables), one drafter
forward per level, one target forward, a walk in which every image judges one child per round
(tensor ops over images: proximity sets, coins, residuals, the next token), the per-node records as
tensors, and one indexed copy for the commits (the walk and the records:
:mod:`lantern.methods.tree.walk`). The per-image Python work left is drawing from each image's own
stream (one uniform per walking image per round; a static tree's children level by level) and
scripted Draws in tests. Host reads per tree step: which images still walk, once per walk round (an
image draws from its stream only while it walks), how many children each parent gets, once per
static-tree level when sampling, and one transfer of the step's outcomes and records.

Randomness: a tree draws its children (static trees, sampling), coins and next token from the
image's stream (:class:`lantern.engine.slots.Streams`), one float64 uniform each in one-image
decoding's order (the numbers its :class:`lantern.engine.slots.GeneratorDraws` draws). In float64
tokens and every record (steps, per-node draft rows) equal
``tests/reference/tree_decoding.py:tree_decode``'s (``tests/test_engine.py``).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ambiguity.sampling import expand_rows, invert
from lantern.drafter.model import draft_q
from lantern.engine.slots import BatchState
from lantern.methods.drafting import pending_features
from lantern.methods.tree.walk import Trees, tree_draft_columns, tree_host, walk_trees

__all__ = ["tree_round", "log_q", "top_log_q"]


def tree_round(st: BatchState, n, d, active, images, steps):
    """One batch step of draft trees: every drafting slot drafts its tree (:func:`_draft_trees`),
    one target forward verifies all trees (:func:`_verify_trees`), all images walk their trees at
    once (:func:`~lantern.methods.tree.walk.walk_trees`), one host transfer brings the outcomes and per-node records
    (:func:`~lantern.methods.tree.walk.tree_host`) and every image commits its accepted path (:func:`_commit_paths`).

    n, d: (B,) int64 committed tokens and drafter positions per slot; active: (B,) bool;
    images / steps: the image index and step number of each slot. Returns accepted (B,), drafted
    (B,), kind (B,) index into NEXT_KINDS, next token (B,), drafter forwards (B,) (int64 numpy
    arrays), the draft columns of the step (None when no image drafted) and the new drafter
    positions d (B,).
    """
    drafting = active & (n < st.N - 1)  # an image with one token left verifies its root alone
    with st.timer("drafter"):
        trees = _draft_trees(st, n, d, drafting)
    with st.timer("target"):
        anc = trees.ancestors()
        out = _verify_trees(st, n, trees, anc)
    with st.timer("acceptance"):
        p = st.target(out.logits)  # (B, T, V)
        walk = walk_trees(st, trees, p, anc, active, drafting)
        host = tree_host(trees, p, walk)  # the step's last host transfer
        _commit_paths(st, n, host["m"], walk["path"], walk["next"], trees.tokens, out.hidden)
    cols = tree_draft_columns(host, active, n, images, steps)
    return host["m"], host["drafted"], host["kind"], host["next"], host["forwards"], cols, np.where(drafting, n, d)


def _draft_trees(st: BatchState, n, d, drafting) -> Trees:
    """Every drafting slot's draft tree, vectorised over slots (:class:`Trees`; a slot that does
    not draft holds its root alone).

    One drafter forward over the pending positions (:func:`~lantern.engine.slots.pending_features`) gives
    each root's feature and the drafter's distribution after it; then :func:`_draft_dynamic` or
    :func:`_draft_static` grow all trees level by level, one ``forward_slots`` per level for all
    images (an image's level-l nodes at its own drafter slots after ``n_b``, seeing its
    committed positions and their tree ancestors). The drafter's tree entries are simply left
    behind (recomputed from true features next round, as
    ``tests/reference/tree_decoding.py:tree_decode`` rolls its drafter cache back)."""
    dev = st.device
    root = st.tokens.gather(1, torch.as_tensor(n - 1, device=dev)[:, None])  # (B, 1)
    if not drafting.any():
        zeros = torch.zeros_like(root)
        return Trees(
            root, zeros, zeros, torch.ones_like(root, dtype=torch.bool), zeros, None, False, False, zeros[:, 0], 0
        )
    f_root = pending_features(st, n, d, drafting)  # (R, 1, H)
    root_q = draft_q(st.drafter, st.model, f_root, st.target)[:, -1]  # (B, V)
    room = np.where(drafting, st.N - 1 - n, 0)  # the deepest draft each slot may have (0: no tree)
    if st.spec.kind == "dynamic":
        return _draft_dynamic(st, n, room, root, f_root, root_q)
    return _draft_static(st, n, room, root, f_root, root_q)


def _sibling_rank(parent: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """(B, T) int64: how many earlier nodes of the row share each node's parent."""
    T = parent.shape[1]
    ar = torch.arange(T, device=parent.device)
    same = (parent[:, :, None] == parent[:, None, :]) & nodes[:, None, :] & (ar[None, :] < ar[:, None])
    return same.sum(-1)


def _draft_dynamic(st: BatchState, n, room, root, f_root, root_q) -> Trees:
    """EAGLE-2 dynamic trees of all slots at once (``tests/reference/trees.py:tree_steps``, ``"dynamic"``,
    the same candidates, scores and ties): the root's top-k children form each beam; every round
    expands all beams in one drafter forward ((B, k) nodes), scores the (B, k, k) children by
    cumulative float64 log-probability and keeps each row's k best (a stable descending sort: ties
    to the earlier candidate); the rerank keeps each row's ``total_tokens - 1`` best finite
    candidates in candidate order. A slot near the end of its image runs fewer rounds
    (``min(depth, room_b - 1)``); its later candidates are -inf and never kept.
    room (B,) int64: the deepest draft per slot (0: no tree); root (B, 1) int64; f_root (R, 1, H);
    root_q (B, V)."""
    spec, dev, B, H, guided = st.spec, st.device, st.B, st.H, st.guided
    k = min(spec.top_k, root_q.shape[-1])
    rounds = np.where(room > 0, np.minimum(spec.depth, room - 1), 0)
    n_t = torch.as_tensor(n, device=dev)
    ninf = torch.tensor(float("-inf"), dtype=torch.float64, device=dev)
    top_values, top_indices = top_log_q(root_q, k)  # as tests/reference/trees.py:tree_steps scores candidates
    beam_score = torch.where(torch.as_tensor(room > 0, device=dev)[:, None], top_values, ninf)
    toks, scores = [top_indices], [beam_score]
    pars, depths = [torch.full((B, k), -1, device=dev)], [torch.ones(B, k, dtype=torch.long, device=dev)]
    beam = torch.arange(k, device=dev).expand(B, k)  # candidate index of each beam node
    chain = torch.zeros(B, k, 0, dtype=torch.long, device=dev)  # beam column of each node's ancestor per round
    pf = f_root.expand(-1, k, -1)
    first = k
    for r in range(int(rounds.max())):
        part = rounds > r
        part_t = torch.as_tensor(part, device=dev)
        slots_h = (n + k * np.minimum(r, rounds))[:, None] + np.arange(k)
        slots = torch.as_tensor(slots_h, device=dev)
        S = int(slots_h.max()) + 1
        vis = ((torch.arange(S, device=dev) < n_t[:, None]) & part_t[:, None])[:, None, :].expand(B, k, S).clone()
        if r:  # the ancestors' drafter slots (a resting row sees only itself)
            cols = n_t[:, None, None] + k * torch.arange(r, device=dev) + chain
            vis.scatter_(2, torch.where(part_t[:, None, None], cols, slots[:, :, None]), True)
        vis.scatter_(2, slots[:, :, None], True)
        pos = torch.as_tensor(np.minimum(n + r, st.N - 1), device=dev)[:, None].expand(B, k)  # depth r + 1
        out = st.drafter.forward_slots(
            st.model,
            expand_rows(torch.cat(toks, 1).gather(1, beam), guided),
            pf,
            st.dcache,
            expand_rows(slots, guided),
            expand_rows(pos, guided),
            expand_rows(vis, guided),
        )
        child_values, child_indices = top_log_q(draft_q(st.drafter, st.model, out, st.target), k)  # (B, k, k)
        pool = torch.where(part_t[:, None], (beam_score[..., None] + child_values).reshape(B, k * k), ninf)
        toks.append(child_indices.reshape(B, k * k))
        scores.append(pool)
        pars.append(beam.repeat_interleave(k, 1))
        depths.append(torch.full((B, k * k), r + 2, device=dev))
        pick = pool.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        j = pick // k  # the beam column of each new beam node's parent
        beam, beam_score = first + pick, pool.gather(1, pick)
        first += k * k
        chain = torch.cat([chain.gather(1, j[..., None].expand(-1, -1, r)), j[..., None]], 2)
        pf = out.gather(1, expand_rows(j, guided)[..., None].expand(-1, -1, H))
    score = torch.cat(scores, 1)
    C = score.shape[1]
    keep = min(spec.total_tokens - 1, C)
    if st.budget is not None:  # the node policy's count for this round (gamma="auto")
        keep = st.budget(score, keep, st.rows)
    best = score.sort(dim=-1, descending=True, stable=True).indices[:, :keep]
    kept = torch.where(score.gather(1, best) > ninf, best, C).sort(-1).values  # candidate order; C: none
    exists = torch.cat([torch.ones_like(root, dtype=torch.bool), kept < C], 1)
    kc = kept.clamp(max=C - 1)
    column = torch.zeros(B, C + 2, dtype=torch.long, device=dev)  # candidate + 1 -> its column (0: the root)
    column.scatter_(1, kept + 1, torch.arange(1, keep + 1, device=dev).expand(B, -1))
    ar = torch.arange(keep + 1, device=dev)
    parent = torch.cat([torch.zeros_like(root), column.gather(1, torch.cat(pars, 1).gather(1, kc) + 1)], 1)
    parent = torch.where(exists, parent, ar)
    tokens = torch.cat([root, torch.cat(toks, 1).gather(1, kc)], 1) * exists
    depth = torch.cat([torch.zeros_like(root), torch.cat(depths, 1).gather(1, kc)], 1) * exists
    nodes = exists & (ar > 0)
    forwards = torch.as_tensor(np.where(room > 0, 1 + rounds, 0), device=dev)
    return Trees(
        tokens, parent, depth, exists, _sibling_rank(parent, nodes), None, False, False, forwards, 1 + int(rounds.max())
    )


@functools.lru_cache(maxsize=32)
def _static_shape(paths: tuple) -> dict:
    """A static shape's node tables (numpy, column t = path t - 1 of ``paths``; column 0 the root):
    parent, rank, depth, kids (children per node), and per level l >= 1: its columns, its
    parents (columns with children at depth l - 1), each node's parent's place among them, and the
    drafter slot offset (after ``n_b``) of each node the level expands (-1: a leaf)."""
    T = len(paths) + 1
    col = {(): 0}
    parent, rank, depth = np.zeros(T, np.int64), np.zeros(T, np.int64), np.zeros(T, np.int64)
    for t, p in enumerate(paths, 1):
        col[p] = t
        parent[t], rank[t], depth[t] = col[p[:-1]], p[-1], len(p)
    kids = np.bincount(parent[1:], minlength=T)
    slot = np.full(T, -1)
    expanded = np.flatnonzero((kids > 0) & (np.arange(T) > 0))  # in (depth, path) order
    slot[expanded] = np.arange(len(expanded))
    return dict(T=T, parent=parent, rank=rank, depth=depth, kids=kids, slot=slot)


def _draft_static(st: BatchState, n, room, root, f_root, root_q) -> Trees:
    """EAGLE-1 static trees of all slots at once (``tests/reference/trees.py:tree_steps``, ``"static"``):
    level by level, every parent's children are its top ranks (greedy) or drawn from its q
    without replacement in rank order (:func:`_draw_children`: each slot's uniforms from its own
    stream in one-image decoding's order); a parent has ``min(children, tokens with mass)``
    children, and a slot drafts no deeper than ``room_b``. All expanded nodes of a level run in
    one drafter forward (each at the drafter slot ``n_b`` + its place among the shape's expanded
    nodes). room (B,) int64 (0: no tree); root (B, 1) int64; f_root (R, 1, H); root_q (B, V)."""
    spec, dev, B, guided = st.spec, st.device, st.B, st.guided
    shape = _static_shape(spec.paths)
    D = min(spec.max_depth, int(room.max()))
    T = int((shape["depth"] <= D).sum())  # paths are sorted by depth: the first T columns
    depth_h, parent_h, rank_h, kids, slot = (shape[c][:T] for c in ("depth", "parent", "rank", "kids", "slot"))
    V = root_q.shape[-1]
    n_t, room_t = torch.as_tensor(n, device=dev), torch.as_tensor(room, device=dev)
    tokens = root.new_zeros(B, T)
    tokens[:, :1] = root
    exists = torch.zeros(B, T, dtype=torch.bool, device=dev)
    exists[:, 0] = True
    q = root_q.new_zeros(B, T, V)
    q[:, 0] = root_q
    feats = f_root.new_zeros(f_root.shape[0], T, f_root.shape[-1])
    feats[:, :1] = f_root
    forwards = (room_t > 0).long()
    for level in range(1, D + 1):
        cols = np.flatnonzero(depth_h == level)
        pars = np.unique(parent_h[cols])  # parents in column order (the frontier's order)
        at = np.searchsorted(pars, parent_h[cols])  # each node's parent's place among pars
        qp = q[:, pars]  # (B, P, V)
        want = torch.as_tensor(kids[pars], device=dev)[None] * (room_t >= level)[:, None]
        m = torch.minimum(want, (qp > 0).sum(-1)) * exists[:, pars]  # children drawn per parent
        M = int(kids[pars].max())
        if st.sampling.greedy:
            picks = qp.topk(min(M, V), dim=-1).indices
        else:
            picks = _draw_children(st, qp, m, M)
        r = torch.as_tensor(rank_h[cols], device=dev)
        at_t = torch.as_tensor(at, device=dev)
        here = r[None] < m[:, at_t]  # (B, level width)
        tokens[:, cols] = torch.where(here, picks[:, at_t, r.clamp(max=picks.shape[-1] - 1)], 0)
        exists[:, cols] = here
        grow = cols[kids[cols] > 0] if level < D else cols[:0]
        if len(grow):  # one drafter forward for the level's nodes with children
            off = slot[grow]
            S = int(n.max()) + int(off.max()) + 1
            vis = (torch.arange(S, device=dev) < n_t[:, None])[:, None, :].expand(B, len(grow), S).clone()
            chain, up = np.empty((len(grow), level), dtype=np.int64), grow
            for i in range(level):  # the node itself, then its (expanded) ancestors up to depth 1
                chain[:, i], up = slot[up], parent_h[up]
            vis.scatter_(2, n_t[:, None, None] + torch.as_tensor(chain, device=dev), True)
            pos = torch.as_tensor(np.minimum(n - 1 + level, st.N - 1), device=dev)
            out = st.drafter.forward_slots(
                st.model,
                expand_rows(tokens[:, grow], guided),
                feats[:, parent_h[grow]],
                st.dcache,
                expand_rows(n_t[:, None] + torch.as_tensor(off, device=dev), guided),
                expand_rows(pos[:, None].expand(B, len(grow)), guided),
                expand_rows(vis, guided),
            )
            feats[:, grow] = out
            q[:, grow] = draft_q(st.drafter, st.model, out, st.target)
            forwards += (exists[:, grow].any(-1) & (room_t > level)).long()
    parent = torch.as_tensor(parent_h, device=dev).expand(B, T)
    ar = torch.arange(T, device=dev)
    parent = torch.where(exists, parent, ar)
    depth = torch.as_tensor(depth_h, device=dev).expand(B, T) * exists
    rank = torch.as_tensor(rank_h, device=dev).expand(B, T) * exists
    return Trees(tokens, parent, depth, exists, rank, q, not st.sampling.greedy, True, forwards, D)


def _draw_children(st: BatchState, qp: torch.Tensor, m: torch.Tensor, M: int) -> torch.Tensor:
    """Static-tree children drawn without replacement: qp (B, P, V) the parents' drafter
    distributions, m (B, P) int64 children per parent -> (B, P, M) int64 tokens (rank r of parent
    u: inverse CDF of the mass not yet drawn; columns r >= m[b, u] unused). Slot b uses the next
    ``sum(m[b])`` uniforms of its stream in one-image decoding's order (parent by parent, rank by
    rank: ``tests/reference/trees.py:_choose`` with :class:`lantern.engine.slots.GeneratorDraws`); a scripted
    slot calls its Draws. The one host read of a level: m."""
    B, P, V = qp.shape
    dev = qp.device
    m_h = m.cpu().numpy()
    count = m_h.sum(1)
    width = max(int(count.max()), 1)
    flat = torch.stack(
        [
            torch.cat(
                [
                    st.streams.block(b, int(count[b])),
                    torch.full((width - int(count[b]),), 0.5, dtype=torch.float64, device=dev),
                ]
            )
            for b in range(B)
        ]
    )  # (B, width): slot b's uniforms of this level
    start = np.cumsum(m_h, 1) - m_h
    index = np.minimum(start[:, :, None] + np.arange(M), width - 1)
    u = flat.gather(1, torch.as_tensor(index.reshape(B, -1), device=dev)).view(B, P, M)
    left = qp.double().clone()
    picks = torch.zeros(B, P, M, dtype=torch.long, device=dev)
    zero = left.new_zeros(())
    for r in range(M):
        x = invert(left, u[:, :, r])[..., None]
        picks[:, :, r] = x[..., 0]
        left.scatter_(-1, x, torch.where(r < m[..., None], zero, left.gather(-1, x)))
    for b, d in enumerate(st.streams.scripted):
        if d is None:
            continue
        for j in range(P):
            rest = qp[b, j].double().clone()
            for r in range(int(m_h[b, j])):
                picks[b, j, r] = x = d.categorical(rest)
                rest[x] = 0.0
    return picks


def _verify_trees(st: BatchState, n, trees: Trees, anc: torch.Tensor):
    """One target forward over every slot's tree; returns the
    :class:`~ambiguity.models.base.Step` (R, T, .).

    Column t of row b sits at cache slot ``n_b - 1 + t`` (the root at slot ``n_b - 1``), image
    position ``n_b - 1 + depth_t``, and sees slots ``0..n_b-2`` and its ancestors (anc (B, T, T)
    bool of :meth:`~lantern.methods.tree.walk.Trees.ancestors`); padding sees the committed
    slots and itself (its outputs are unused and its cache entries never seen). A slot without a
    tree verifies its root alone (a plain target step)."""
    dev, (B, T) = st.device, trees.tokens.shape
    n_t = torch.as_tensor(n, device=dev)
    S = int(n.max()) - 1 + T
    slots = (n_t - 1)[:, None] + torch.arange(T, device=dev)
    vis = (torch.arange(S, device=dev) < (n_t - 1)[:, None])[:, None, :].expand(B, T, S).clone()
    vis.scatter_(2, slots[:, None, :].expand(B, T, T), anc)
    pos = ((n_t - 1)[:, None] + trees.depth).clamp(max=st.N - 1)
    g = st.guided
    return st.model.extend_slots(
        st.cache, expand_rows(trees.tokens, g), expand_rows(slots, g), expand_rows(pos, g), expand_rows(vis, g)
    )


def _commit_paths(
    st: BatchState, n, m, path: torch.Tensor, nxt: torch.Tensor, vin: torch.Tensor, hidden: torch.Tensor
) -> None:
    """Commit every image's accepted path and next token, vectorised over images: tokens, target
    features and the target's keys/values of the accepted path move behind the committed tokens
    (:meth:`~ambiguity.models.base.TokenModel.move_slots`, one indexed copy for all images).

    m (B,) int64 numpy (accepted drafts); path (B, >= max m + 1) int64 and nxt (B,) int64 on the
    device, of :func:`~lantern.methods.tree.walk.walk_trees`; vin (B, T) int64 node tokens and hidden (R, T, H) of
    :func:`_verify_trees`. Writes ``x_{n_b}..x_{n_b+m_b}`` into st.tokens and
    ``h_{n_b-1}..h_{n_b+m_b-1}`` into st.feats (slots ``n_b..n_b+m_b``)."""
    dev, B, H, guided = st.device, st.B, st.H, st.guided
    M = int(m.max()) + 1
    keep = torch.as_tensor(np.arange(M)[None] <= m[:, None], device=dev)  # root, accepted nodes, next token
    path_t = path[:, :M]
    n_t = torch.as_tensor(n, device=dev)
    dest = n_t[:, None] + torch.arange(M, device=dev)
    cand = torch.cat([vin.gather(1, path_t[:, 1:]), vin.new_zeros(B, 1)], 1)
    cand.scatter_(1, torch.as_tensor(m, device=dev)[:, None], nxt[:, None])
    st.tokens.scatter_(1, dest, torch.where(keep, cand, st.tokens.gather(1, dest)))
    dest_r = expand_rows(dest, guided)[..., None].expand(-1, -1, H)
    hid = hidden.gather(1, expand_rows(path_t, guided)[..., None].expand(-1, -1, H))  # h_{n-1}..h_{n+m-1}
    st.feats.scatter_(1, dest_r, torch.where(expand_rows(keep, guided)[..., None], hid, st.feats.gather(1, dest_r)))
    if M > 1:  # the accepted nodes' keys/values move behind the committed tokens (slots n_b ..)
        moved = keep[:, 1:]
        dst = n_t[:, None] - 1 + torch.arange(1, M, device=dev)
        src = torch.where(moved, n_t[:, None] - 1 + path_t[:, 1:], dst)
        st.model.move_slots(st.cache, expand_rows(src, guided), expand_rows(dst, guided))


def log_q(q: torch.Tensor) -> torch.Tensor:
    """Drafter probabilities (..., V) -> float64 log-probabilities, -inf where q has no mass (the
    cumulative scores of EAGLE-2 candidates)."""
    return torch.log(q.double().clamp_min(1e-300)).masked_fill(q <= 0, float("-inf"))


def top_log_q(q: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_q(q).topk(k)`` along the last dimension -> (values (..., k) float64, indices (..., k)
    int64), without the log over the whole vocabulary when it cannot change the ranking.

    For float32 (or narrower) q, float64 ``log`` is strictly increasing on its values (their
    relative spacing, >= 2**-24, is far above the float64 spacing of their logs), so ``q`` and
    ``log_q(q)`` compare alike: topk picks the same indices in the same order, ties included, and
    the k logs are the same numbers. Distinct float64 probabilities can share a float64 log, so
    float64 q is ranked by its logs as before.
    """
    if q.dtype == torch.float64:
        top = log_q(q).topk(k)
        return top.values, top.indices
    top = q.topk(k)
    return log_q(top.values), top.indices
