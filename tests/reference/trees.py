"""Draft trees: EAGLE-2 dynamic trees and EAGLE-1 static trees, drafted with the EAGLE drafter.

A draft tree replaces the chain of :func:`lantern.decoding.draft`: several candidates per
position, verified by the target in one forward with tree attention
(:meth:`reference.cache.OneImageCache.extend_tree`). Node 0 is the *root*, the last committed
token ``x_{n-1}``; a node at depth ``d`` is a candidate for ``x_{n-1+d}``.

* **Dynamic** (EAGLE-2, Li et al. 2024, arXiv 2406.16858, Sec. 4; LANTERN's default; official
  ``total_token`` 59, ``depth`` 4, ``top_k`` 10): the root's ``top_k`` most likely children
  (drafter log-probabilities) form the first beam; each of ``depth`` rounds expands every beam
  node into its ``top_k`` children, scores them by cumulative log-probability and keeps the
  ``top_k`` best as the next beam. All candidates are then reranked and the ``total_tokens - 1``
  best (by cumulative log-probability; ties to the earlier candidate, so a parent always
  precedes its children) form the tree. Drafts are deterministic (``q(x̂) = 1``). The deepest
  node is at depth ``depth + 1``.
* **Static** (EAGLE-1, arXiv 2401.15077): a fixed shape given as paths of child ranks, e.g.
  ``[[0], [1], [0, 0]]``: the root's two children and the first child of its first child. With
  sampling the children of a node are drawn from ``q`` without replacement, in rank order (each
  with the conditional probability of the mass not yet drawn); greedy takes the top ranks. The
  official shapes ship by name (:data:`STATIC_TREES`).

Every random choice goes through a :class:`Draws` object (one torch generator per image in
decoding), so that tests can enumerate all outcomes of the real code exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from functools import partial
from typing import Optional, Protocol

import numpy as np
import torch

from ambiguity.models.base import TokenModel
from ambiguity.sampling import expand_rows, invert
from lantern.drafter.model import DraftModel
from lantern.methods.tree.spec import TreeSpec

__all__ = ["Tree", "Draws", "GeneratorDraws", "Expansion", "draft_tree", "tree_steps", "log_q", "top_log_q"]


# --------------------------------------------------------------------------- randomness
class Draws(Protocol):
    """Where a tree decoder's random choices come from (one source per image).

    ``coin(prob)`` -> True with probability ``prob`` (clamped to [0, 1]); ``categorical(probs)``
    -> a token drawn from ``probs`` (V,) (any positive scale; zero-mass tokens never drawn).
    """

    def coin(self, prob: float) -> bool: ...

    def categorical(self, probs: torch.Tensor) -> int: ...


class GeneratorDraws:
    """:class:`Draws` from a torch.Generator: a coin is one uniform ``u < prob``; a categorical
    draw inverts the CDF with one uniform (:func:`ambiguity.sampling.invert`). ``last_u`` is the
    uniform of the last coin (recorded with each verdict)."""

    def __init__(self, generator: Optional[torch.Generator], device: torch.device | str = "cpu"):
        self.generator, self.device, self.last_u = generator, torch.device(device), float("nan")

    def _uniform(self) -> torch.Tensor:
        return torch.rand((), generator=self.generator, device=self.device, dtype=torch.float64)

    def coin(self, prob: float) -> bool:
        self.last_u = float(self._uniform())
        return self.last_u < float(prob)

    def categorical(self, probs: torch.Tensor) -> int:
        return int(invert(probs, self._uniform()))


# --------------------------------------------------------------------------- the tree
@dataclass
class Tree:
    """One draft tree, nodes in topological order (parents first; siblings in trial order).

    tokens: (T,) int64 code indices on the model's device (node 0: the root); parents: T ints
    (-1 for the root); depths: T ints; children: per node, its children's indices in trial order;
    q: per node the drafter's distribution of its children (V,) float32 (None for leaves);
    sampled: children were drawn from ``q`` (EAGLE-1 with temperature > 0), else they are the
    drafter's top ranks (EAGLE-2, greedy) and count as deterministic drafts. forwards: drafter
    forwards that built the tree (the root's included). static: built from a static shape
    (:class:`TreeSpec` ``kind="static"``); the official greedy verification then orders its
    root-to-leaf paths lexicographically (:meth:`official_leaves`).
    """

    tokens: torch.Tensor
    parents: list[int]
    depths: list[int]
    children: list[list[int]] = field(default_factory=list)
    q: list[Optional[torch.Tensor]] = field(default_factory=list)
    sampled: bool = False
    forwards: int = 1
    static: bool = False

    def __len__(self) -> int:
        return len(self.parents)

    def ancestors(self) -> torch.Tensor:
        """(T, T) bool: ``[t, s]`` is True when s is t or an ancestor of t."""
        T = len(self.parents)
        out = np.eye(T, dtype=bool)  # row ORs in numpy: a tensor op per node costs more than the OR
        for t in range(1, T):
            out[t] |= out[self.parents[t]]
        return torch.from_numpy(out)

    def path_to(self, node: int) -> list[int]:
        """Nodes from the root to ``node`` (inclusive)."""
        path = [node]
        while self.parents[path[-1]] >= 0:
            path.append(self.parents[path[-1]])
        return path[::-1]

    def official_leaves(self) -> list[int]:
        """Leaves in the order the official code lists its candidate paths (its
        ``retrieve_indices``), whose first longest accepted path wins a greedy tie.

        Static trees: the official ``generate_tree_buffers`` numbers nodes by (depth, path) (as
        :func:`_static` does) and sorts the root-to-leaf index paths lexicographically, so a
        leaf below an earlier-ranked sibling comes first. Dynamic trees: EAGLE-2's
        ``topK_genrate`` lists leaves by node index (it sorts only when sampling).
        Source: jadohu/LANTERN ``models/ea_model_llamagen.py`` ``generate_tree_buffers``,
        ``models/drafters/cnets_llamagen.py`` ``topK_genrate``.
        """
        leaves = [t for t in range(len(self)) if not self.children[t]]
        return sorted(leaves, key=self.path_to) if self.static else leaves


# --------------------------------------------------------------------------- drafting
def _root_features(
    drafter: DraftModel, model: TokenModel, dcache, tokens: torch.Tensor, features: torch.Tensor, start: int
) -> torch.Tensor:
    """The drafter over the pending positions (true target features); its last output f_{n-1}."""
    return drafter(model, tokens, features, dcache, start)[:, -1:]


def _expand(
    drafter: DraftModel,
    model: TokenModel,
    dcache,
    node_tokens: torch.Tensor,
    parent_f: torch.Tensor,
    positions: torch.Tensor,
    visible: torch.Tensor,
    guided: bool,
) -> torch.Tensor:
    """One drafter forward over F tree nodes: tokens (F,), their parents' features (rows, F, H),
    image positions (F,), visibility (F, cache length + F) -> features (rows, F, H)."""
    rows_tokens = expand_rows(node_tokens[None], guided)
    return drafter(model, rows_tokens, parent_f, dcache, int(positions[0]), positions, visible)


def _visibility(dcache_len: int, n: int, slots: list[int], ancestors_of: list[list[int]]) -> torch.Tensor:
    """(F, dcache_len + F) bool: each new node sees the committed drafter positions 0..n-1, the
    cache slots of its tree ancestors and itself."""
    F = len(ancestors_of)
    vis = torch.zeros(F, dcache_len + F, dtype=torch.bool)
    vis[:, :n] = True
    seen = [(i, slots[a]) for i, anc in enumerate(ancestors_of) for a in anc if slots[a] >= 0]
    rows = [i for i, _ in seen] + list(range(F))
    cols = [c for _, c in seen] + list(range(dcache_len, dcache_len + F))
    vis[torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)] = True  # one write
    return vis


def _cache_length(dcache) -> int:
    length = getattr(dcache, "length", None)  # the GPT KV cache
    return int(length) if length is not None else int(dcache.get_seq_length())


@dataclass
class Expansion:
    """One drafter forward a tree drafter asks for (:func:`static_tree_steps`, :func:`dynamic_tree_steps`).

    tokens: F code indices of the nodes to run; parent_f: (rows, F, H) their parents' features;
    depth: their tree depth (image position ``n - 1 + depth``); visible: ``visible(L)`` -> (F, L + F)
    bool, which drafter cache entries each node sees when the cache holds ``L`` entries before
    them (the committed positions ``0..n-1`` and the tree nodes already run) and the F nodes are
    appended at ``L..L+F-1``. The driver answers with ``(out (rows, F, H), q (F, V), L)``.
    """

    tokens: list[int]
    parent_f: torch.Tensor
    depth: int
    visible: Callable[[int], torch.Tensor]


def draft_tree(
    drafter: DraftModel,
    model: TokenModel,
    dcache,
    tokens: torch.Tensor,
    features: torch.Tensor,
    start: int,
    spec: TreeSpec,
    max_depth: int,
    q_of,
    greedy: bool,
    draws: Optional[Draws],
    guided: bool,
) -> Tree:
    """Draft one tree after the committed tokens (EAGLE alignment as :func:`lantern.decoding.draft`).

    tokens (rows, P) / features (rows, P, H): the pending positions ``start .. n-1`` with true
    target features (``n = start + P``; the root is ``x_{n-1}``); spec: static or dynamic;
    max_depth: the deepest draft allowed (the image's remaining tokens); q_of: drafter logits
    (rows, F, V) -> distributions (F, V) (guidance, temperature, filters); greedy: children are
    top ranks (else static children are drawn from q without replacement through ``draws``).
    The drafter cache holds the committed positions afterwards plus the tree's nodes; roll it
    back to ``n`` after verification. Returns the :class:`Tree`. The tree logic lives in
    :func:`tree_steps` (shared with batched decoding, :mod:`lantern.batched`); this drives it
    with one drafter forward per :class:`Expansion`.
    """
    n = start + tokens.shape[1]
    f_root = _root_features(drafter, model, dcache, tokens, features, start)  # (rows, 1, H)
    root_q = q_of(drafter.logits(model, f_root))[0]
    steps = tree_steps(spec, int(tokens[0, -1]), f_root, root_q, n, max_depth, greedy, draws, model.device)
    try:
        ask = next(steps)
        while True:
            L = _cache_length(dcache)
            pos = torch.full((len(ask.tokens),), n - 1 + ask.depth, dtype=torch.long)
            node_tokens = torch.tensor(ask.tokens, device=model.device)
            out = _expand(drafter, model, dcache, node_tokens, ask.parent_f, pos, ask.visible(L), guided)
            ask = steps.send((out, q_of(drafter.logits(model, out)), L))
    except StopIteration as done:
        return done.value


def tree_steps(
    spec: TreeSpec,
    root_token: int,
    f_root: torch.Tensor,
    root_q: torch.Tensor,
    n: int,
    max_depth: int,
    greedy: bool,
    draws: Optional[Draws],
    device,
) -> Generator[Expansion, tuple, Tree]:
    """The tree drafter of one image as a generator: it yields an :class:`Expansion` per drafter
    forward it needs and returns the :class:`Tree`. root_token: ``x_{n-1}``; f_root (rows, 1, H):
    the drafter's feature at the root (from true target features); root_q (V,): the drafter's
    distribution after the root; the drafter cache holds ``0..n-1`` before the first expansion."""
    if spec.kind == "dynamic":
        return (yield from _dynamic(root_token, f_root, root_q, n, spec, max_depth, device))
    return (yield from _static(root_token, f_root, root_q, n, spec, max_depth, greedy, draws, device))


def _static(root_token, f_root, root_q, n, spec, max_depth, greedy, draws, device):
    paths = [p for p in spec.paths if len(p) <= max_depth]
    kids: dict[tuple, int] = {}
    for p in paths:  # children per parent path (ranks 0 .. m-1)
        kids[p[:-1]] = max(kids.get(p[:-1], 0), p[-1] + 1)
    node_of: dict[tuple, int] = {(): 0}
    tokens, parents, depths = [int(root_token)], [-1], [0]
    qs: list[Optional[torch.Tensor]] = [root_q]
    feats = [f_root]
    slots = [n - 1]  # the root's drafter entry: position n-1, computed from true features
    frontier = [()]
    forwards = 1
    for depth in range(1, max_depth + 1):
        new = []
        for parent in frontier:
            m = kids.get(parent, 0)
            if not m:
                continue
            u = node_of[parent]
            for r, tok in enumerate(_choose(qs[u], m, greedy, draws)):
                path = parent + (r,)
                node_of[path] = len(tokens)
                tokens.append(tok)
                parents.append(u)
                depths.append(depth)
                qs.append(None)
                feats.append(None)
                slots.append(-1)
                new.append(path)
        expand = [p for p in new if p in kids]
        if expand:
            idx = [node_of[p] for p in expand]
            tree = Tree(torch.tensor(tokens), parents, depths)
            anc = [tree.path_to(i) for i in idx]
            out, q_new, L = yield Expansion(
                [tokens[i] for i in idx],
                torch.cat([feats[parents[i]] for i in idx], 1),
                depth,
                lambda L: _visibility(L, n, list(slots), anc),  # noqa: B023 - called before the loop moves on
            )
            forwards += 1
            for j, i in enumerate(idx):
                feats[i], qs[i], slots[i] = out[:, j : j + 1], q_new[j], L + j
        frontier = new
    tree = _finish(tokens, parents, depths, qs, device, sampled=not greedy, forwards=forwards)
    tree.static = True
    return tree


def _choose(q: torch.Tensor, m: int, greedy: bool, draws: Optional[Draws]) -> list[int]:
    """``m`` children from q (V,): its top ranks (greedy), else drawn without replacement in order."""
    m = min(m, int((q > 0).sum()))
    if greedy or draws is None:
        return q.topk(m).indices.tolist()
    left, out = q.clone().double(), []
    for _ in range(m):
        x = draws.categorical(left)
        out.append(x)
        left[x] = 0.0
    return out


def _beam_visibility(n: int, anc: list[list[int]], slot: dict, L: int) -> torch.Tensor:
    """(F, L + F) bool for a beam: committed positions 0..n-1, the slots of each node's candidate
    ancestors (``anc[i]``: the node, then its parent candidates) and the node itself."""
    F = len(anc)
    vis = torch.zeros(F, L + F, dtype=torch.bool)
    vis[:, :n] = True
    rows = [i for i, chain in enumerate(anc) for _ in chain[1:]] + list(range(F))
    cols = [slot[c] for chain in anc for c in chain[1:]] + list(range(L, L + F))
    vis[torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)] = True  # one write
    return vis


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


def _dynamic(root_token, f_root, root_q, n, spec, max_depth, device):
    k = min(spec.top_k, root_q.shape[-1])
    top_values, top_indices = top_log_q(root_q, k)
    # candidates: token, parent candidate (-1: the root), score (cumulative log q), depth, drafter slot
    c_tok, c_par, c_score, c_depth = top_indices.tolist(), [-1] * k, top_values.tolist(), [1] * k
    beam = list(range(k))
    slot: dict[int, int] = {}
    feat: dict[int, torch.Tensor] = {}
    rounds = min(spec.depth, max_depth - 1)
    for r in range(rounds):
        depth = r + 1
        anc = []
        for b in beam:
            chain, c = [], b
            while c >= 0:
                chain.append(c)
                c = c_par[c]
            anc.append(chain)

        parent_f = torch.cat([feat[c_par[b]] if c_par[b] >= 0 else f_root for b in beam], 1)
        visible = partial(_beam_visibility, n, anc, dict(slot))
        out, q_new, L = yield Expansion([c_tok[b] for b in beam], parent_f, depth, visible)
        kk = min(spec.top_k, q_new.shape[-1])
        child_logq, child_tok = top_log_q(q_new, kk)
        child_tok, child_logq = child_tok.tolist(), child_logq.tolist()  # one transfer, exact floats
        first = len(c_tok)
        for j, b in enumerate(beam):
            slot[b], feat[b] = L + j, out[:, j : j + 1]
            for t in range(kk):
                c_tok.append(child_tok[j][t])
                c_par.append(b)
                c_score.append(c_score[b] + child_logq[j][t])
                c_depth.append(depth + 1)
        pool = list(range(first, len(c_tok)))
        pool.sort(key=lambda c: (-c_score[c], c))
        beam = pool[:k]
    order = sorted(range(len(c_tok)), key=lambda c: (-c_score[c], c))[: spec.total_tokens - 1]
    keep = sorted(c for c in order if c_score[c] > float("-inf"))
    index = {c: i + 1 for i, c in enumerate(keep)}
    tokens = [int(root_token)] + [c_tok[c] for c in keep]
    parents = [-1] + [index[c_par[c]] if c_par[c] >= 0 else 0 for c in keep]
    depths = [0] + [c_depth[c] for c in keep]
    return _finish(tokens, parents, depths, [None] * len(tokens), device, sampled=False, forwards=1 + max(rounds, 0))


def _finish(
    tokens: list[int], parents: list[int], depths: list[int], qs, device, sampled: bool, forwards: int = 1
) -> Tree:
    children: list[list[int]] = [[] for _ in tokens]
    for t in range(1, len(tokens)):
        children[parents[t]].append(t)
    return Tree(
        torch.tensor(tokens, dtype=torch.long, device=device),
        parents,
        depths,
        children,
        list(qs),
        sampled,
        forwards,
    )
