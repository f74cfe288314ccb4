"""The walk half of batched draft trees: the trees as (B, T) tensors, every image's acceptance walk
at once, and the step's one host transfer of outcomes and per-node draft records.

:func:`lantern.methods.tree.draft.tree_round` drafts the trees (:class:`Trees`), verifies them in one
target forward, then calls :func:`walk_trees` (or :func:`walk_official_greedy` for the official
greedy convention), :func:`tree_host` and :func:`tree_draft_columns` from here. Same verdicts,
draws and records as one-image decoding (``tests/reference/tree_decoding.py:walk_tree``); in float64 the
batched and one-image records are equal (``tests/test_engine.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ambiguity.sampling import invert
from lantern.engine.records import tree_rows
from lantern.engine.slots import BatchState
from lantern.rules.acceptance import judge_greedy, proximity, residual

__all__ = ["NODE_COLUMNS", "TRIALS", "Trees", "tree_draft_columns", "tree_host", "walk_official_greedy", "walk_trees"]


@dataclass
class Trees:
    """The draft trees of all slots, as (B, T) tensors on the device (row b: slot b's tree).

    Column 0 of a row is its root ``x_{n_b-1}``. tokens (B, T) int64 code indices; parent (B, T)
    int64 column of each node's parent (the root and padding: their own column); depth (B, T)
    int64 (0 at the root and padding); exists (B, T) bool: the row's nodes (the root always; the
    drafts of a drafting slot), the rest is padding; rank (B, T) int64: a node's place among its
    parent's children (their trial order); q: (B, T, V) float (the drafter's dtype) the drafter's distribution of
    each expanded node's children (static trees), None for dynamic trees (their drafts are the
    drafter's top ranks and count as deterministic); sampled: static children drawn from q
    (temperature > 0); static: a static shape (the official greedy walk orders its paths
    lexicographically); forwards (B,) int64: drafter forwards of each row's tree, the root's
    included (0 without a tree); depth_max: the deepest node any row may hold (host int).

    Layouts: a dynamic tree is packed (a row's drafts fill its columns ``1..drafted`` in the
    order of ``tests/reference/trees.py:tree_steps``, ascending candidate index); a static tree keeps
    its shape's order (column t is path t of :attr:`lantern.methods.tree.spec.TreeSpec.paths`, truncated to
    the deepest level any row may draft), so a child a row did not draw (fewer tokens with mass
    than ranks, or the image's last tokens) is padding in that row. A row's node number in the
    records is the count of its nodes before the column (one-image decoding's node index).
    """

    tokens: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    exists: torch.Tensor
    rank: torch.Tensor
    q: Optional[torch.Tensor]
    sampled: bool
    static: bool
    forwards: torch.Tensor
    depth_max: int

    @property
    def nodes(self) -> torch.Tensor:
        """(B, T) bool: the drafts (existing nodes other than the root)."""
        return self.exists & (torch.arange(self.tokens.shape[1], device=self.tokens.device) > 0)

    def ancestors(self) -> torch.Tensor:
        """(B, T, T) bool: ``[b, t, s]`` is True when column s is t or an ancestor of t in row b
        (padding: itself only). ``depth_max`` gathers over the parents, no per-node loop."""
        B, T = self.tokens.shape
        eye = torch.eye(T, dtype=torch.bool, device=self.tokens.device)
        anc = eye.expand(B, T, T)
        for _ in range(self.depth_max):
            anc = eye | anc.gather(1, self.parent[..., None].expand(-1, -1, T))
        return anc


TRIALS = ("p_tilde", "spent", "q_draft", "accept_prob", "u")


def walk_trees(st: BatchState, trees: Trees, p: torch.Tensor, anc: torch.Tensor, active, drafting) -> dict:
    """All images' acceptance walks at once (``tests/reference/tree_decoding.py:walk_tree``: the same
    verdicts, residuals, draws and records), one trial per image per round.

    From the root, each walking image judges the child of rank r of its current node against its
    current target (:func:`lantern.rules.acceptance.proximity`, :func:`~lantern.rules.acceptance.judge_greedy`
    or a coin ``u < min(1, p̃/q)``, q the conditional q of the mass not yet drawn for sampled
    static trees, 1 for deterministic drafts); a rejection replaces the target by the residual
    and moves to the next sibling, an acceptance moves down; an image with no child left draws
    its next token from its target (argmax when greedy) and stops. Every walking image draws one
    uniform per round from its own stream (a coin or its next token: the order of one-image
    decoding); the round's only host read is which images still walk. Greedy ``"official"``:
    :func:`walk_official_greedy`.

    p: (B, T, V) the target after each column; anc: (B, T, T) of :meth:`Trees.ancestors`;
    active / drafting: (B,) bool host arrays. Returns device tensors: m (B,) accepted drafts,
    path (B, depth_max + 1) columns of the root and the accepted nodes (``path[b, :m_b + 1]``),
    next (B,) int64, kind (B,) index into NEXT_KINDS, and the per-column trial records (B, T):
    reached, accepted (bool), j_star (int64) and p_tilde, spent, q_draft, accept_prob, u
    (float64, NaN where not judged). The rules of :data:`lantern.rules.acceptance.RELAXATIONS` are
    defined on chains (Cool-SD's schedule, FLy's window): :class:`lantern.engine.decode.DecodeConfig`
    refuses them with a tree."""
    if st.sampling.greedy and st.convention == "official":
        return walk_official_greedy(st, trees, p, anc, active, drafting)
    dev, (B, T, _) = st.device, p.shape
    greedy = st.sampling.greedy
    rows = torch.arange(B, device=dev)
    kid = _child_table(trees)
    cur, r = rows.new_zeros(B), rows.new_zeros(B)
    walking = torch.as_tensor(active, device=dev)
    rejected = torch.zeros(B, dtype=torch.bool, device=dev)
    target = p[:, 0]
    left = trees.q[:, 0].double() if trees.sampled and not greedy else None
    path = rows.new_zeros(B, trees.depth_max + 1)
    m, nxt, kind = rows.new_zeros(B), rows.new_zeros(B), rows.new_zeros(B)
    trials, judged = [], []  # per round: (B, 8) trial values and (B,) the column each image judged
    walking_h = np.asarray(active, dtype=bool)
    while walking_h.any():
        c = kid.gather(1, (cur * (T + 1) + r)[:, None])[:, 0]
        has = walking & (c >= 0)
        cc = c.clamp(min=0)
        x = trees.tokens.gather(1, cc[:, None])[:, 0]
        ok, u, q_cond, trial = _judge_round(st, target, x, has, walking_h, left, p.dtype)
        bad = has & ~ok
        trials.append(trial)
        judged.append(torch.where(has, c, T))  # the column judged this round (T: none)
        if not greedy:
            target = torch.where(bad[:, None], residual(target, q_cond, x, st.table, st.rule, validate=False), target)
            if left is not None:
                left = torch.where(bad[:, None], left.scatter(1, x[:, None], 0.0), left)
        done = walking & ~has
        done_h = done.cpu().numpy()  # the round's host read: who stops walking (and draws its next token)
        if done_h.any():  # the next token of the images that stop, from their current target (rows alone)
            at, token = _stop_tokens(st, target, u, np.flatnonzero(done_h))
            nxt = nxt.index_put((at,), token)
            kind = kind.index_put((at,), 1 + rejected[at].long())  # NEXT_KINDS: bonus, residual
        m = m + ok.long()
        path.scatter_(1, m[:, None], torch.where(ok, c, path.gather(1, m[:, None])[:, 0])[:, None])
        cur = torch.where(ok, c, cur)
        r = torch.where(ok, 0, r + bad.long())
        rejected = ~ok & (rejected | bad)
        target = torch.where(ok[:, None], p[rows, cc], target)
        if left is not None:
            left = torch.where(ok[:, None], trees.q[rows, cc].double(), left)
        walking = walking & ~done
        walking_h = walking_h & ~done_h  # who walks on (and draws)
    kind = torch.where(torch.as_tensor(drafting, device=dev), kind, 0)  # one token left: a target step
    return dict(m=m, path=path, next=nxt, kind=kind, **_trial_records(trials, judged, B, T, dev))


def _child_table(trees: Trees) -> torch.Tensor:
    """(B, T (T + 1)) int64: ``[b, u (T + 1) + r]`` is the column of child r of column u in row b
    (the child of rank r among u's children), -1 where u has no such child (and for the padding)."""
    (B, T), dev = trees.tokens.shape, trees.tokens.device
    kid = torch.full((B, T * (T + 1)), -1, dtype=torch.long, device=dev)
    kid.scatter_(
        1, trees.parent * (T + 1) + torch.where(trees.nodes, trees.rank, T), torch.arange(T, device=dev).expand(B, T)
    )
    kid[:, T :: T + 1] = -1  # the padding's column
    return kid


def _judge_round(
    st: BatchState, target: torch.Tensor, x: torch.Tensor, has: torch.Tensor, walking_h: np.ndarray, left, dtype
) -> tuple:
    """One round's trials: every image with a child left (has, (B,) bool) judges its draft x (B,)
    int64 against its target (B, V). Greedy: :func:`~lantern.rules.acceptance.judge_greedy`;
    sampling: one uniform per walking image (walking_h, host bool) from its own stream and the
    coin ``u < min(1, p̃/q)``, q the conditional drafter mass not yet drawn (left, (B, V) float64,
    for sampled static trees; None: 1), a scripted image's coin from its Draws.

    Returns ok (B,) bool, u ((B,) float64 or None when greedy), q_cond ((B, V) in ``dtype`` or
    None) and the round's (B, 8) float64 trial values (:data:`TRIALS`, then j_star, ok, has)."""
    one = torch.ones(len(x), dtype=torch.float64, device=x.device)
    with st.timer("proximity"):
        prox = proximity(target, x, st.table, st.rule)
    q_cond = None
    if st.sampling.greedy:
        ok = judge_greedy(target, x, st.table, st.rule, False, prox).accepted & has
        qx, prob, u, u_rec = one, ok.double(), None, torch.full_like(one, float("nan"))
    else:
        u = st.streams.each(walking_h)  # one draw per walking image: a coin, or its next token
        if left is not None:
            q_cond = (left / left.sum(-1, keepdim=True)).to(dtype)
            qx = q_cond.gather(1, x[:, None])[:, 0].double()
        else:
            qx = one
        pt = prox[1].double()
        prob = torch.where(qx > 0, (pt / torch.where(qx > 0, qx, one)).clamp(max=1.0), (pt > 0).double())
        u_rec = _scripted_coins(st, has, prob, u)
        ok = has & (u < prob)
    trial = (prox[1].double(), prox[3].double(), qx, prob, u_rec, prox[2].double(), ok.double(), has.double())
    return ok, u, q_cond, torch.stack(trial, 1)


def _scripted_coins(st: BatchState, has: torch.Tensor, prob: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """A scripted image's coin (exact enumeration in tests): its Draws decides, written into u
    (0 to accept, the float below 1 to reject). Returns the (B,) float64 uniforms to record
    (a scripted image's ``last_u``; the others' u)."""
    u_rec = u.clone()
    scripted = [b for b, d in enumerate(st.streams.scripted) if d is not None]
    if scripted:
        below_one = float(np.nextafter(1.0, 0.0))
        has_h, prob_h = has.cpu().numpy(), prob.cpu().numpy()
        for b in scripted:
            if has_h[b]:
                d = st.streams.scripted[b]
                u[b] = 0.0 if d.coin(float(prob_h[b])) else below_one
                u_rec[b] = getattr(d, "last_u", float("nan"))
    return u_rec


def _stop_tokens(st: BatchState, target: torch.Tensor, u, stop: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of the images that stop walking (stop: host int64 rows), from their current
    target (B, V): its argmax when greedy, else its inverse CDF at the round's uniform u (B,) (a
    scripted image: its Draws' categorical). Returns the rows on the device and their int64 tokens."""
    at = torch.as_tensor(stop, device=target.device)
    if st.sampling.greedy:
        return at, target[at].argmax(-1)
    token = invert(target[at], u[at])
    for i, b in enumerate(stop):
        if st.streams.scripted[b] is not None:
            token[i] = st.streams.scripted[b].categorical(target[b])
    return at, token


def _trial_records(trials: list, judged: list, B: int, T: int, dev) -> dict:
    """The per-column (B, T) trial records from the rounds' (B, 8) trial values and judged columns
    (T: none that round): :data:`TRIALS` float64 (NaN where not judged), j_star int64, accepted
    and reached bool."""
    nan = float("nan")
    book = torch.tensor([nan] * len(TRIALS) + [0.0, 0.0, 0.0], dtype=torch.float64, device=dev)
    book = book.expand(B, T + 1, -1).clone()  # (B, T + 1, 8); column T takes the rounds without a trial
    if trials:
        book.scatter_(1, torch.stack(judged, 1)[..., None].expand(-1, -1, 8), torch.stack(trials, 1))
    rec = {c: book[:, :T, i] for i, c in enumerate(TRIALS)}
    rec.update(j_star=book[:, :T, 5].long(), accepted=book[:, :T, 6] > 0, reached=book[:, :T, 7] > 0)
    return rec


def walk_official_greedy(st: BatchState, trees: Trees, p: torch.Tensor, anc: torch.Tensor, active, drafting) -> dict:
    """``tests/reference/tree_decoding.py:walk_official_greedy`` for all images at once: every node
    passes or fails on its own against the target at its parent; a node's path passes when it
    and its ancestors pass; each leaf's longest passing prefix, the first leaf with the longest
    winning (static trees: leaves in lexicographic path order, so the winner is the first
    passing node at that depth; dynamic trees: leaves by column). Shapes as :func:`walk_trees`
    (no draws, no host read)."""
    dev, (B, T, V) = st.device, p.shape
    rows, ar = torch.arange(B, device=dev), torch.arange(T, device=dev)
    nodes, parent, depth = trees.nodes, trees.parent, trees.depth
    p_par = p.gather(1, parent[..., None].expand(-1, -1, V))
    with st.timer("proximity"):
        prox = proximity(p_par, trees.tokens, st.table, st.rule)
    v = judge_greedy(p_par, trees.tokens, st.table, st.rule, False, prox)
    passed = (v.accepted & nodes) | (ar == 0)
    full = passed
    for _ in range(trees.depth_max):
        full = passed & full.gather(1, parent)
    has_kid = torch.zeros(B, T + 1, dtype=torch.bool, device=dev)
    has_kid.scatter_(1, torch.where(nodes, parent, T), True)
    has_kid = has_kid[:, :T]
    leaf = trees.exists & ~has_kid
    anchor = torch.where(full, ar, -1)  # the deepest passing node on the way to each node
    for _ in range(trees.depth_max):
        anchor = torch.where(anchor >= 0, anchor, anchor.gather(1, parent))
    reach = depth.gather(1, anchor.clamp(min=0))
    best = torch.where(leaf, reach, -1).amax(-1)
    if trees.static:
        chosen = torch.where(full & trees.exists & (depth == best[:, None]), ar, T).amin(-1)
    else:
        first = torch.where(leaf & (reach == best[:, None]), ar, T).amin(-1)
        chosen = anchor.gather(1, first[:, None])[:, 0]
    on_path = anc[rows, chosen]  # (B, T): the chosen node and its ancestors
    D = trees.depth_max
    path = rows.new_zeros(B, D + 2).scatter_(1, torch.where(on_path, depth, D + 1), ar.expand(B, T))[:, : D + 1]
    act = torch.as_tensor(active, device=dev)
    m = torch.where(act, depth.gather(1, chosen[:, None])[:, 0], 0)
    nxt = p[rows, chosen].argmax(-1)
    kind = torch.where(torch.as_tensor(drafting, device=dev), 1 + has_kid.gather(1, chosen[:, None])[:, 0].long(), 0)
    reached = nodes & on_path.gather(1, parent)
    nan = torch.full((B, T), float("nan"), dtype=torch.float64, device=dev)
    rec = dict(
        p_tilde=torch.where(reached, v.p_tilde.double(), nan),
        spent=torch.where(reached, v.spent.double(), nan),
        q_draft=torch.where(reached, 1.0, nan),
        accept_prob=torch.where(reached, passed.double(), nan),
        u=nan,
        j_star=torch.where(reached, v.j_star, 0),
        accepted=reached & passed,
        reached=reached,
    )
    return dict(m=m, path=path * act[:, None], next=torch.where(act, nxt, 0), kind=kind * act, **rec)


NODE_COLUMNS = ("token", "p_draft", *TRIALS, "j_star", "accepted", "reached", "committed", "p_top1", "p_entropy")
NODE_COLUMNS += ("q_top1", "node", "parent", "depth", "sibling", "draft")


def tree_host(trees: Trees, p: torch.Tensor, walk: dict) -> dict:
    """The step's outcomes and per-column draft records moved to the CPU in one transfer.

    Per image (B,) int64: m, kind, next, drafted, forwards; per column (B, T) numpy: the
    :data:`NODE_COLUMNS` (``draft``: the column is a draft; node / parent: one-image node
    numbers; p_draft, p_top1, p_entropy: the target at the node's parent; q_top1: the drafter's
    top probability there, NaN for dynamic trees) as ``tests/reference/tree_decoding.py:tree_draft_columns``
    computes them."""
    B, T, V = p.shape
    nodes, parent = trees.nodes, trees.parent
    number = trees.exists.long().cumsum(1) - 1
    committed = torch.zeros(B, T, dtype=torch.bool, device=p.device)
    steps = torch.arange(walk["path"].shape[1], device=p.device)
    committed.scatter_(1, walk["path"], (steps > 0) & (steps <= walk["m"][:, None]))
    nan = torch.full((B, T), float("nan"), device=p.device)
    top1, entropy = parent_summaries(p, parent, nodes)
    cols = dict(
        token=trees.tokens,
        p_draft=p.reshape(B, T * V).gather(1, parent * V + trees.tokens),  # p at the parent, of the draft
        **{c: walk[c] for c in (*TRIALS, "j_star", "accepted", "reached")},
        committed=committed & nodes,
        p_top1=top1.gather(1, parent),
        p_entropy=entropy.gather(1, parent),
        q_top1=trees.q.amax(-1).gather(1, parent) if trees.q is not None else nan,
        node=number,
        parent=number.gather(1, parent),
        depth=trees.depth,
        sibling=trees.rank,
        draft=nodes,
    )
    per_image = [walk["m"], walk["kind"], walk["next"], nodes.sum(1), trees.forwards]
    flat = torch.cat([torch.stack(per_image, 1).double(), *(cols[c].double() for c in NODE_COLUMNS)], 1).cpu().numpy()
    host = {c: flat[:, i].astype(np.int64) for i, c in enumerate(("m", "kind", "next", "drafted", "forwards"))}
    for i, c in enumerate(NODE_COLUMNS):
        host[c] = flat[:, 5 + i * T : 5 + (i + 1) * T]
    return host


def parent_summaries(p: torch.Tensor, parent: torch.Tensor, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-1 probability and the entropy (nats) of the target at every column that is a
    draft's parent: p (B, T, V), parent (B, T) int64, nodes (B, T) bool -> two (B, T) tensors in
    p's dtype (NaN at the other columns, which no draft reads).

    On the CPU only the parent columns are reduced (a few per tree); each row's reduction is
    the same computation as over all columns, so the same floats. On an accelerator every column is
    reduced (cheap there; choosing the rows would be a host read)."""
    B, T, V = p.shape
    if p.device.type != "cpu":
        return p.amax(-1), -(torch.xlogy(p, p)).sum(-1)
    flat = torch.arange(B)[:, None] * T + parent  # (B, T) row of p.reshape(B * T, V) at each parent
    chosen = torch.zeros(B * T, dtype=torch.bool)
    chosen[flat[nodes]] = True
    idx = chosen.nonzero()[:, 0]
    rows = p.reshape(B * T, V)[idx]  # (parents, V)
    top1 = torch.full((B * T,), float("nan"), dtype=p.dtype)
    entropy = top1.clone()
    top1[idx] = rows.amax(-1)
    entropy[idx] = -(torch.xlogy(rows, rows)).sum(-1)
    return top1.view(B, T), entropy.view(B, T)


def tree_draft_columns(host: dict, active, n, images, steps) -> Optional[dict]:
    """The step's draft rows (one per draft of every active image's tree; see
    :data:`lantern.engine.records.DRAFT_COLUMNS`) from the (B, T) host columns of :func:`tree_host`."""
    keep = (host["draft"] > 0) & np.asarray(active, dtype=bool)[:, None]
    if not keep.any():
        return None
    b = np.nonzero(keep)[0]
    cols = {c: host[c][keep] for c in NODE_COLUMNS if c != "draft"}
    cols["image"], cols["step"] = np.asarray(images)[b], np.asarray(steps)[b]
    cols["draft_index"] = cols["depth"] - 1
    cols["position"] = np.asarray(n)[b] + cols["draft_index"]
    rows = tree_rows(cols)
    rows["out_of_support"] = rows["committed"] & (rows["p_draft"] == 0)
    return rows
