"""SJD-PAC on the engine: speculative Jacobi decoding with a proactive draft tree and adaptive
continuation (Kang et al., CVPR 2026, arXiv 2603.18599; official code
github.com/KangJialiang/SJD-PAC, ``scheduler/sjd_pac_iteration_lumina_mgpt.py``).

Like SJD (:mod:`lantern.methods.jacobi.method`) no drafter: every target forward reads the last
committed token and drafts for the next positions, and its own outputs become the next drafts.
The drafts form the official tree (:func:`lantern.methods.sjd_pac.config.pac_tree`): the first
``D - 1`` draft positions hold ``K`` *siblings* each (proactive drafting: the same K candidates
under every node of the level before, so a stale context costs one candidate, not the position),
and the first-sibling path continues as a chain to ``L`` nodes in all. One forward verifies every
node with an ancestor mask; the accepted path's keys and values move behind the committed tokens.

Per position the drafts are K draws *without replacement* from one distribution ``q``: sibling k
was drawn from ``q`` with siblings ``0..k-1`` removed (renormalised; uniform over the codes left
where nothing is). The walk descends from the root: the children of the current node are tried in
order, sibling k accepted with ``min(1, p_k(x)/q_k(x))`` where ``p_0 = p`` (the target at the
node) and ``p_{k+1} = norm(max(p_k - q_k, 0))`` (recursive rejection sampling over siblings drawn
without replacement: multi-candidate speculative decoding, Yang et al. 2024); when every child is
rejected the next token is drawn from the last residual, when the walk reaches a node without
children in the window the bonus token is drawn from ``p`` there.

Adaptive continuation: the positions after the committed ones keep their drafts into the next
forward. The first sibling ``x ~ q`` at each such position is kept with probability
``min(1, p(x)/q(x))`` against this forward's (stale) ``p`` there, else redrawn from
``norm(max(p - q, 0))`` — a maximal coupling, so the kept-or-redrawn draft is distributed as ``p``
and is recorded with ``q = p``; the stale ``p`` is read along the accepted path continued by first
siblings, or along the main chain past the tree. The position after the deepest node is drawn from
``p`` there (as SJD does; the official code leaves it to a uniform code). Further siblings are
drawn from ``p`` without replacement when the position branches in the next forward. New positions
draw uniform codes (``q`` uniform, as the official code). ``continuation="resample"`` draws every later position
afresh from ``p`` instead (SJD's rule; the paper's proactive drafting alone).

Exactness: every draft is distributed as the ``q`` it is judged with, given everything the walk
read before it, so the output is distributed as AR sampling (exhaustive enumeration in
``tests/test_sjd_pac.py``). Deviations from the official code, each of which makes the official
sampler not exactly lossless: (1) the official verifier takes the *longest* accepted root-to-leaf
row, so a later sibling whose subtree accepted more wins over an earlier accepted sibling (here the
first accepted sibling is taken, as recursive rejection sampling requires); (2) at a continued
position its further siblings are drawn from a residual (and at a branching position a rejected
first draft is redrawn from the residual left after all K siblings) but judged as if drawn from
``p`` without replacement (here they are); (3) when every drafted token of the main chain is accepted
the official bonus token is uniform (here it is drawn from ``p``). Greedy decoding (temperature
0): a sibling is accepted iff it is the argmax of ``p``, drafts are the top-K codes of the stale
``p``: greedy SJD-PAC is greedy AR token for token.

Records (:mod:`lantern.engine.records`): one step row per forward (``drafted`` = the tree's draft
nodes, ``accepted`` = the accepted path), one draft row per node (``node``, ``parent``, ``depth``,
``sibling``; ``proposed_step`` = the step whose forward gave the node's ``q``, -1 for a new
position). Randomness: image ``i`` draws from its own stream, in the same order at any batch size.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ambiguity.sampling import expand_rows
from lantern.engine.method import Method, Round
from lantern.engine.records import tree_rows
from lantern.engine.slots import BatchState, Draws, GeneratorDraws
from lantern.methods.sjd_pac.config import PacConfig, PacTree, pac_tree
from lantern.rules.jacobi import sjd_accept_prob, sjd_residual

__all__ = ["SJDPAC", "sibling_q"]


def sibling_q(base: Optional[torch.Tensor], drawn: list[int], V: int, like: torch.Tensor) -> torch.Tensor:
    """The distribution the next sibling is drawn from, without replacement: ``base`` (V,) (None:
    uniform) with the codes ``drawn`` removed and renormalised; uniform over the codes not drawn
    where nothing is left. Returns (V,) in ``like``'s dtype and device."""
    q = torch.ones(V, dtype=like.dtype, device=like.device) if base is None else base.to(like.dtype).clone()
    if drawn:
        q[torch.tensor(drawn, device=like.device)] = 0
    mass = q.sum()
    if not float(mass) > 0:
        q = torch.ones(V, dtype=like.dtype, device=like.device)
        q[torch.tensor(drawn, device=like.device)] = 0
        mass = q.sum()
    return q / mass


class _Column:
    """The drafts for one future position: tokens (siblings in trial order), q[k] the distribution
    sibling k was drawn from (q[0] None: uniform), proposed (the step whose forward gave q[0], -1:
    a new position)."""

    def __init__(self, token: int, q0: Optional[torch.Tensor], proposed: int):
        self.tokens, self.q, self.proposed = [int(token)], [q0], proposed


class _Image:
    """One image's SJD-PAC state and its per-forward work: :meth:`prepare` (the tree's tokens),
    one target forward, :meth:`verify` (walk, next token, continuation). Draws come from ``draws``
    in a fixed order, so the image's tokens do not depend on the batch."""

    def __init__(self, tree: PacTree, config: PacConfig, N: int, V: int, greedy: bool, draws: Draws, like):
        self.tree, self.config, self.N, self.V, self.greedy, self.draws = tree, config, N, V, greedy, draws
        self.like = like  # dtype / device of the distributions
        self.columns: list[_Column] = []
        self.step, self.g, self.last = 0, 0, 0

    def _draw(self, q: torch.Tensor) -> int:
        return int(q.argmax()) if self.greedy else self.draws.categorical(q)

    def _uniform(self, drawn: list[int]) -> int:
        return self.draws.categorical(sibling_q(None, drawn, self.V, self.like))

    def q_of(self, col: _Column, k: int) -> torch.Tensor:
        """The (V,) distribution sibling k of ``col`` was drawn from."""
        if col.q[k] is None or k == 0:
            return sibling_q(col.q[0], col.tokens[:k], self.V, self.like)
        return col.q[k]

    def _add_sibling(self, col: _Column) -> None:
        q = sibling_q(col.q[0], col.tokens, self.V, self.like)
        token = self._uniform(col.tokens) if col.q[0] is None else self._draw(q)
        col.tokens.append(int(token))
        col.q.append(q)

    def prepare(self, n: int) -> list[int]:
        """Start a forward at ``n`` committed tokens: ``g = min(M - 1, N - 1 - n)`` draft levels
        (the bonus position stays inside the image), new positions drawn uniform, K siblings at
        the branching levels. Returns the T node tokens (padding past ``g``: code 0)."""
        tree, K = self.tree, min(self.config.width, self.V)
        self.step += 1
        self.g = g = min(tree.main - 1, self.N - 1 - n)
        self.columns = self.columns[:g]
        while len(self.columns) < g:
            self.columns.append(_Column(self._uniform([]), None, -1))
        for col in self.columns[: min(self.config.depth - 1, g)]:
            while len(col.tokens) < K:
                self._add_sibling(col)
        return [
            self.last if d == 0 else (self.columns[d - 1].tokens[b] if d <= g else 0)
            for d, b in zip(tree.depth, tree.branch)
        ]

    def _walk(self, p: torch.Tensor):
        """Root to leaf: the first accepted child of each node (recursive rejection over its
        siblings). Returns (path nodes, next token, kind, {node: (accept_prob, u, accepted)})."""
        tree, g, cur, path, trials = self.tree, self.g, 0, [], {}
        while True:
            kids = [c for c in tree.children[cur] if tree.depth[c] <= g]
            if not kids:
                return path, self._draw(p[cur]), (0 if g == 0 else 1), trials
            col, resid, chosen = self.columns[tree.depth[kids[0]] - 1], p[cur], None
            top = int(p[cur].argmax()) if self.greedy else -1
            for k, child in enumerate(kids):
                q, x = self.q_of(col, k), col.tokens[k]
                if self.greedy:
                    a, u, ok = float(x == top), float("nan"), x == top
                else:
                    a = float(sjd_accept_prob(resid, q, torch.tensor(x, device=q.device)))
                    ok = self.draws.coin(a)
                    u = float(getattr(self.draws, "last_u", float("nan")))
                trials[child] = (a, u, ok)
                if ok:
                    chosen = child
                    break
                resid = sjd_residual(resid, q)
            if chosen is None:
                return path, (top if self.greedy else self.draws.categorical(resid)), 2, trials
            path.append(chosen)
            cur = chosen

    def _continue(self, p: torch.Tensor, path: list[int]) -> list[_Column]:
        """The next forward's drafts at positions after the committed ones (old levels ``m + 2 ..
        g + 1``): the first sibling coupled with (adaptive) or drawn from (resample) the stale
        ``p`` read along the accepted path continued by first siblings, then the main chain; the
        position after the deepest level is drawn from ``p`` there (as SJD does)."""
        tree, m, node, ctx = self.tree, len(path), (path[-1] if path else 0), []
        for c in range(m + 2, self.g + 2):
            kids = tree.children[node]
            node = kids[0] if kids else c - 1  # the first child, or the main chain's node at depth c - 1
            ctx.append(node)
        if not ctx:
            return []
        ps = p[torch.tensor(ctx, device=p.device)].clone()  # (C, V) the stale target at each position
        out = []
        for j, c in enumerate(range(m + 2, self.g + 2)):
            col, pj = (self.columns[c - 1] if c <= self.g else None), ps[j]
            if self.greedy:
                token = int(pj.argmax())
            elif self.config.continuation == "adaptive" and col is not None:
                q0, x = self.q_of(col, 0), col.tokens[0]
                keep = self.draws.coin(float(sjd_accept_prob(pj, q0, torch.tensor(x, device=pj.device))))
                token = x if keep else self.draws.categorical(sjd_residual(pj, q0))
            else:
                token = self.draws.categorical(pj)
            out.append(_Column(token, pj, self.step))
        return out

    def verify(self, p: torch.Tensor) -> dict:
        """Judge the tree against this forward's ``p`` (T, V): walk, next token, the next drafts.
        Returns the outcome: m (accepted drafts), path (nodes), tokens (the m + 1 committed),
        kind, next, and the per-node record columns."""
        path, nxt, kind, trials = self._walk(p)
        records = self._records(p, path, trials)
        tokens = [self.columns[self.tree.depth[t] - 1].tokens[self.tree.branch[t]] for t in path] + [int(nxt)]
        self.columns = self._continue(p, path)
        self.last = tokens[-1]
        return dict(m=len(path), path=path, tokens=tokens, kind=kind, next=int(nxt), records=records)

    def _records(self, p: torch.Tensor, path: list[int], trials: dict) -> Optional[dict]:
        """Per draft node (depth 1..g) the record columns (numpy), None without drafts."""
        tree, g = self.tree, self.g
        nodes = [t for t in range(1, tree.nodes) if tree.depth[t] <= g]
        if not nodes:
            return None
        parents = torch.tensor([tree.parent[t] for t in nodes], device=p.device)
        pp = p[parents].double()  # (k, V) the target at each node's parent
        toks = [self.columns[tree.depth[t] - 1].tokens[tree.branch[t]] for t in nodes]
        qs = torch.stack([self.q_of(self.columns[tree.depth[t] - 1], tree.branch[t]) for t in nodes]).double()
        idx = torch.tensor(toks, device=p.device)[:, None]
        nan = float("nan")
        cols = dict(
            token=np.asarray(toks),
            p_draft=pp.gather(1, idx)[:, 0].cpu().numpy(),
            q_draft=qs.gather(1, idx)[:, 0].cpu().numpy(),
            accept_prob=np.asarray([trials.get(t, (nan,))[0] for t in nodes]),
            u=np.asarray([trials.get(t, (nan, nan))[1] for t in nodes]),
            accepted=np.asarray([bool(trials.get(t, (0, 0, False))[2]) for t in nodes]),
            reached=np.asarray([t in trials for t in nodes]),
            committed=np.asarray([t in path for t in nodes]),
            p_top1=pp.amax(-1).cpu().numpy(),
            p_entropy=(-torch.xlogy(pp, pp).sum(-1)).cpu().numpy(),
            q_top1=qs.amax(-1).cpu().numpy(),
            node=np.asarray(nodes),
            parent=np.asarray([tree.parent[t] for t in nodes]),
            depth=np.asarray([tree.depth[t] for t in nodes]),
            sibling=np.asarray([tree.branch[t] for t in nodes]),
            proposed_step=np.asarray([self.columns[tree.depth[t] - 1].proposed for t in nodes]),
        )
        cols.update(p_tilde=cols["p_draft"].copy(), j_star=np.zeros(len(nodes)), spent=np.zeros(len(nodes)))
        return cols


class SJDPAC(Method):
    """SJD-PAC (``--method sjd-pac``, module docstring): every slot's tree in one target forward.

    Image ``b`` at ``n_b`` committed tokens feeds its T-node tree at cache slots ``n_b - 1 ..
    n_b + T - 2`` (image positions by depth, an ancestor mask), walks it and commits its accepted
    path plus one token; the path's keys and values move behind its committed tokens (one
    indexed copy for all images). config: the :class:`~lantern.methods.sjd_pac.config.PacConfig`.
    """

    name = "sjd-pac"

    def __init__(self, config: PacConfig):
        self.config = config
        self.tree = pac_tree(config.window, config.width, config.depth)
        self.depth, self.spare = self.tree.main - 1, int(config.window)
        self.images: dict[int, _Image] = {}  # slot -> the image it decodes
        depths = np.asarray(self.tree.depth)
        self.drafts_at = np.asarray([int(((depths >= 1) & (depths <= g)).sum()) for g in range(self.tree.main)])

    def start(self, st: BatchState, slots: list[int], p0: torch.Tensor) -> torch.Tensor:
        for r, s in enumerate(slots):
            draws = st.streams.scripted[s] or GeneratorDraws(st.streams.gens[s], st.device)
            img = _Image(self.tree, self.config, st.N, p0.shape[-1], st.sampling.greedy, draws, p0[r])
            img.last = img._draw(p0[r])
            self.images[s] = img
        return torch.tensor([self.images[s].last for s in slots], dtype=torch.long, device=st.device)

    def round(self, st: BatchState, active: np.ndarray) -> Round:
        live = np.flatnonzero(active).tolist()
        with st.timer("acceptance"):
            vin = torch.zeros(st.B, self.tree.nodes, dtype=torch.long)
            for b in live:
                vin[b] = torch.tensor(self.images[b].prepare(int(st.n[b])))
        with st.timer("target"):
            out = _verify_trees(st, vin.to(st.device), self.tree)
        with st.timer("acceptance"):
            p = st.target(out.logits)  # (B, T, V)
            done = {b: self.images[b].verify(p[b]) for b in live}
            _commit(st, done)
        return self._round(st, live, done)

    def _round(self, st: BatchState, live: list[int], done: dict) -> Round:
        B = st.B
        a, g, kind, nxt = (np.zeros(B, dtype=np.int64) for _ in range(4))
        parts = []
        for b in live:
            r = done[b]
            a[b], kind[b], nxt[b] = r["m"], r["kind"], r["next"]
            g[b] = self.drafts_at[self.images[b].g]
            if r["records"] is not None:
                cols = r["records"]
                k = len(cols["node"])
                cols.update(image=np.full(k, st.image[b]), step=np.full(k, st.step[b]))
                cols["draft_index"] = cols["depth"] - 1
                cols["position"] = st.n[b] + cols["draft_index"]
                parts.append(cols)
        drafts = None
        if parts:
            drafts = tree_rows({c: np.concatenate([x[c] for x in parts]) for c in parts[0]})
            drafts["out_of_support"] = drafts["committed"] & (drafts["p_draft"] == 0)
        return Round(a, g, kind, nxt, np.zeros(B, dtype=np.int64), drafts)

    def release(self, st: BatchState, slots) -> None:
        for s in slots:
            self.images.pop(int(s), None)

    def compact(self, st: BatchState, live: np.ndarray, rows: torch.Tensor) -> None:
        self.images = {new: self.images[int(old)] for new, old in enumerate(live) if int(old) in self.images}


def _verify_trees(st: BatchState, vin: torch.Tensor, tree: PacTree):
    """One target forward over every slot's tree ``vin`` (B, T) int64: node t of row b at cache
    slot ``n_b - 1 + t`` and image position ``n_b - 1 + depth_t`` (clamped to N - 1), seeing the
    committed slots ``0..n_b-2`` and its ancestors. Returns the model's Step (R, T, .)."""
    dev, (B, T) = st.device, vin.shape
    n_t = torch.as_tensor(st.n, device=dev)
    S = int(st.n.max()) - 1 + T
    slots = (n_t - 1)[:, None] + torch.arange(T, device=dev)
    vis = (torch.arange(S, device=dev) < (n_t - 1)[:, None])[:, None, :].expand(B, T, S).clone()
    vis.scatter_(2, slots[:, None, :].expand(B, T, T), tree.ancestors.to(dev).expand(B, T, T))
    depth = torch.tensor(tree.depth, device=dev)
    pos = ((n_t - 1)[:, None] + depth).clamp(max=st.N - 1)
    g = st.guided
    return st.model.extend_slots(
        st.cache, expand_rows(vin, g), expand_rows(slots, g), expand_rows(pos, g), expand_rows(vis, g)
    )


def _commit(st: BatchState, done: dict) -> None:
    """Write every image's committed tokens ``x_n .. x_{n+m}`` into st.tokens and move the keys and
    values of its accepted nodes (slots ``n - 1 + node``) behind its committed tokens (slots
    ``n .. n + m - 1``), one indexed copy for all images (none when every path is the main chain)."""
    dev, M = st.device, max(r["m"] for r in done.values())
    src = torch.zeros(st.B, max(M, 1), dtype=torch.long)
    dst = torch.zeros_like(src)
    for b, r in done.items():
        n = int(st.n[b])
        st.tokens[b, n : n + r["m"] + 1] = torch.tensor(r["tokens"], device=dev)
        dst[b] = n + torch.arange(max(M, 1))
        src[b] = dst[b]
        if r["m"]:
            src[b, : r["m"]] = n - 1 + torch.tensor(r["path"])
    if M and not torch.equal(src, dst):
        st.model.move_slots(st.cache, expand_rows(src.to(dev), st.guided), expand_rows(dst.to(dev), st.guided))
