"""Tree speculative decoding: draft a tree, verify every node in one target forward, walk it.

One round with ``n`` committed tokens (EAGLE alignment as in :mod:`lantern.chain`; the target's
cache holds ``x_0..x_{n-2}``, the root of the tree is ``x_{n-1}``):

1. :func:`lantern.trees.draft_tree`: the drafter re-runs the pending positions with true target
   features, then drafts a static or dynamic tree (tree attention inside its own cache); its
   cache is rolled back to the ``n`` committed positions right after.
2. :meth:`~reference.cache.OneImageCache.extend_tree`: the target verifies all nodes in one
   forward (each node at its own position, attending to its ancestors) -> ``p`` at every node.
3. :func:`walk_tree`: from the root, the children of the accepted node are judged in order
   (:class:`lantern.acceptance.AcceptanceRule`); the first accepted child is followed; after a
   rejection the next sibling is judged against the residual (``"exact"``: recursive rejection
   sampling, lossless at ``δ = 0``; ``"official"``: the official LANTERN code). When no child is
   accepted (or a leaf is reached) the next token is drawn from the current target (the
   residual after a rejection, else ``p`` at the node: the bonus token). Greedy ``"official"``
   instead takes the longest accepted root-to-leaf path, as the official code does
   (:func:`walk_official_greedy`).
4. :meth:`~reference.cache.OneImageCache.keep_path`: the target's cache keeps the root and
   the accepted nodes; the next token is fed in the next round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from ambiguity.errors import UsageError
from ambiguity.models.base import Prompt, TokenModel
from ambiguity.sampling import Generators, SamplingConfig, expand_rows
from lantern.drafter.model import DraftModel
from lantern.engine.records import Decoded
from lantern.methods.tree.spec import TreeSpec
from lantern.rules.acceptance import AcceptanceRule, judge_greedy, proximity, residual
from reference.records import StepLog
from reference.steps import Timer, check_prompt, elapsed_since, image_row, prefill, target_distribution
from reference.trees import Draws, GeneratorDraws, Tree, draft_tree

__all__ = ["TreeOutcome", "walk_tree", "walk_official_greedy", "tree_draft_columns", "tree_decode"]

_TRIAL = ("node", "sibling", "p_tilde", "j_star", "spent", "q_draft", "accept_prob", "u", "accepted")


@dataclass
class TreeOutcome:
    """What a verified tree emits: ``path`` (node indices, root first: the accepted drafts follow
    the root), ``token`` (the next token), ``kind`` (``"bonus"``: drawn from ``p`` at the last
    accepted node; ``"residual"``: after a rejection), and one trial dict per judged node
    (keys ``node, sibling, p_tilde, j_star, spent, q_draft, accept_prob, u, accepted``)."""

    path: list[int]
    token: int
    kind: str
    trials: list[dict] = field(default_factory=list)


def walk_tree(
    tree: Tree,
    p: torch.Tensor,
    rule: AcceptanceRule,
    table: Optional[torch.Tensor],
    greedy: bool,
    draws: Optional[Draws],
    timer: Optional[Timer] = None,
) -> TreeOutcome:
    """Judge the tree's nodes from the root down and pick the next token.

    p: (T, V) the target distribution after each node (:func:`lantern.steps.target_distribution`);
    table: the checked neighbour table (None for unrelaxed rules); greedy: temperature 0 (the
    ``"exact"`` greedy test; no randomness); draws: coins and categorical draws (sampling).
    A sampled tree (EAGLE-1 with temperature > 0) judges sibling ``i`` with the conditional
    ``q`` of the mass not yet drawn (its children were drawn without replacement in trial
    order); a deterministic tree (EAGLE-2) with ``q(x̂) = 1``. timer: growing the proximity
    sets is timed as its ``"proximity"`` section. LANTERN Sec. 3; EAGLE-2 Sec. 4.
    """
    timed = timer or Timer(p.device)
    if greedy and rule.convention == "official":
        return walk_official_greedy(tree, p, rule, table, timed)
    cur, path, trials = 0, [0], []
    while True:
        target = p[cur]
        q = tree.q[cur] if tree.sampled else None
        left = q.double().clone() if q is not None else None
        accepted, rejected = None, False
        for rank, c in enumerate(tree.children[cur]):
            x = tree.tokens[c]
            with timed("proximity"):
                prox = proximity(target, x, table, rule)
            if greedy:
                v = judge_greedy(target, x, table, rule, False, prox)
                ok = bool(v.accepted)
                trials.append(_trial(c, rank, v.p_tilde, v.j_star, v.spent, 1.0, float(ok), float("nan"), ok))
            else:
                q_cond = (left / left.sum()).to(target.dtype) if left is not None else None
                _, pt, j, spent = prox
                qx = float(q_cond[x]) if q_cond is not None else 1.0
                prob = min(1.0, float(pt) / qx) if qx > 0 else float(float(pt) > 0)
                ok = draws.coin(prob)
                trials.append(_trial(c, rank, pt, j, spent, qx, prob, getattr(draws, "last_u", float("nan")), ok))
                if not ok:
                    target = residual(target, q_cond, x, table, rule, validate=False)
                    if left is not None:
                        left[x] = 0.0
            if ok:
                accepted = c
                break
            rejected = True
        if accepted is None:
            token = int(target.argmax()) if greedy else draws.categorical(target)
            return TreeOutcome(path, token, "residual" if rejected else "bonus", trials)
        path.append(accepted)
        cur = accepted


def walk_official_greedy(
    tree: Tree, p: torch.Tensor, rule: AcceptanceRule, table: Optional[torch.Tensor], timer: Optional[Timer] = None
) -> TreeOutcome:
    """The official code's greedy tree verification: every node passes or fails on its own
    (:func:`lantern.acceptance.judge_greedy`, ``"official"``: ``x̂`` is the argmax of the
    unfiltered ``p`` with ``p̃(x̂)`` written at it, ties to the lower index); each root-to-leaf
    path accepts its longest passing prefix; the first path with the longest prefix wins, paths
    in the official order (:meth:`lantern.trees.Tree.official_leaves`: lexicographic on a
    static tree, by node index on a dynamic one); the next token is the argmax of ``p`` at its last accepted node."""
    T = len(tree)
    passed = [False] * T
    trials = []
    timed = timer or Timer(p.device)
    for t in range(1, T):
        target = p[tree.parents[t]]
        with timed("proximity"):
            prox = proximity(target, tree.tokens[t], table, rule)
        v = judge_greedy(target, tree.tokens[t], table, rule, False, prox)
        passed[t] = bool(v.accepted)
        rank = tree.children[tree.parents[t]].index(t)
        trials.append(_trial(t, rank, v.p_tilde, v.j_star, v.spent, 1.0, float(passed[t]), float("nan"), passed[t]))
    best, best_len = [0], 0
    for leaf in tree.official_leaves():
        path = tree.path_to(leaf)
        m = 0
        while m + 1 < len(path) and passed[path[m + 1]]:
            m += 1
        if m > best_len:
            best, best_len = path[: m + 1], m
    last = best[-1]
    kind = "bonus" if not tree.children[last] else "residual"
    reached = {0} | set(best)
    trials = [tr for tr in trials if tree.parents[tr["node"]] in reached]  # judged on the way that counted
    return TreeOutcome(best, int(p[last].argmax()), kind, trials)


def _trial(node, sibling, p_tilde, j_star, spent, q_draft, accept_prob, u, accepted) -> dict:
    return dict(
        node=int(node),
        sibling=int(sibling),
        p_tilde=float(p_tilde),
        j_star=int(j_star),
        spent=float(spent),
        q_draft=float(q_draft),
        accept_prob=float(accept_prob),
        u=float(u),
        accepted=bool(accepted),
    )


def tree_draft_columns(tree: Tree, p: torch.Tensor, outcome: TreeOutcome, position: int) -> dict:
    """Per-node draft columns of one tree (nodes 1..T-1; see :data:`lantern.records.DRAFT_COLUMNS`)."""
    T = len(tree)
    nodes = np.arange(1, T)
    parents = np.asarray(tree.parents[1:], dtype=np.int64)
    depths = np.asarray(tree.depths[1:])
    tokens = tree.tokens[1:].cpu().numpy()
    # the target at each node's parent: entropy and top-1 once per distinct parent row (few nodes
    # are parents), then indexed per node; the same per-row values as on the (T-1, V) gather
    rows, inv = np.unique(parents, return_inverse=True)
    inv = torch.as_tensor(inv.reshape(-1), device=p.device)
    p_rows = p[torch.as_tensor(rows, device=p.device)]  # (distinct parents, V)
    cols = {c: np.full(T - 1, np.nan) for c in ("p_tilde", "spent", "q_draft", "accept_prob", "u")}
    cols["j_star"] = np.zeros(T - 1, dtype=np.int64)
    cols["accepted"] = np.zeros(T - 1, dtype=bool)
    reached = np.zeros(T - 1, dtype=bool)
    sibling = np.asarray([tree.children[tree.parents[t]].index(t) for t in range(1, T)])
    for tr in outcome.trials:
        i = tr["node"] - 1
        reached[i] = True
        for c in ("p_tilde", "spent", "q_draft", "accept_prob", "u", "j_star", "accepted"):
            cols[c][i] = tr[c]
    committed = np.isin(nodes, outcome.path[1:])
    q_top1 = np.asarray([float(tree.q[par].max()) if tree.q[par] is not None else np.nan for par in parents])
    p_draft = p[torch.as_tensor(parents, device=p.device), tree.tokens[1:].to(p.device)].double().cpu().numpy()
    ent = -(torch.xlogy(p_rows, p_rows)).sum(-1)[inv]
    return dict(
        token=tokens,
        p_draft=p_draft,
        **cols,
        reached=reached,
        committed=committed,
        p_top1=p_rows.amax(-1)[inv].double().cpu().numpy(),
        p_entropy=ent.double().cpu().numpy(),
        q_top1=q_top1,
        node=nodes,
        parent=parents,
        depth=depths,
        sibling=sibling,
        position=position + depths - 1,
        draft_index=depths - 1,
    )


@torch.no_grad()
def tree_decode(
    model: TokenModel,
    drafter: DraftModel,
    prompt: Prompt,
    sampling: SamplingConfig,
    rule: AcceptanceRule,
    neighbours: Optional[torch.Tensor],
    spec: TreeSpec,
    generator: Generators = None,
    num_tokens: Optional[int] = None,
    image: int = 0,
    seed: Optional[int] = None,
    draws: Optional[Draws] = None,
) -> Decoded:
    """Tree speculative decoding of one image (module docstring).

    model, drafter, prompt (one condition), sampling, rule, neighbours: as
    :func:`lantern.chain.speculative_decode`; spec: a static or dynamic :class:`TreeSpec`;
    generator: the image's random stream (or ``draws``: any :class:`lantern.trees.Draws`, e.g. an
    enumerator in tests). Near the end of the image the tree is cut to the remaining tokens.
    Returns a :class:`~lantern.records.Decoded` (tokens (1, N); one draft row per tree node).
    Raises UsageError for a guidance mismatch, several conditions, a chain spec, a bad table or
    an adapter that cannot verify trees.
    """
    check_prompt(prompt, sampling)
    if spec.kind not in ("static", "dynamic"):
        raise UsageError("tree_decode takes a static or dynamic TreeSpec; chains run in lantern.chain")
    table = rule.prepare_table(neighbours, model.vocab_size, model.device)
    N = int(num_tokens or model.num_tokens)
    guided, greedy, conv = prompt.guided, sampling.greedy, rule.convention
    draws = draws or GeneratorDraws(generator, model.device)
    q_of = lambda logits: target_distribution(logits, sampling, guided, conv)[0]  # (rows, F, V) -> (F, V)
    timer, log = Timer(model.device), StepLog(image)
    t_start = time.perf_counter()
    with timer("target"):
        cache, first = prefill(model, prompt, N, spec.nodes)  # room for one verified tree beyond the image
    with timer("acceptance"):
        p0 = q_of(first.logits)[0]
        x0 = int(p0.argmax()) if greedy else draws.categorical(p0)
    tokens = torch.empty(1, N, dtype=torch.long, device=model.device)
    tokens[0, 0] = x0
    feats = first.hidden.new_empty(prompt.rows, N, first.hidden.shape[-1])  # feats[:, i] = h_{i-1}
    feats[:, 0] = first.hidden[:, -1]
    dcache = drafter.new_cache(prompt.rows, spec.drafter_nodes)
    n, d, step_no, max_drafted = 1, 0, 0, 0
    while n < N:
        step_no += 1
        before = timer.snapshot()
        room = N - 1 - n  # drafts deeper than this would pass the image's last token
        if room == 0:  # one token left: a plain target forward
            with timer("target"):
                out = cache.extend(expand_rows(tokens[:, n - 1 : n], guided))
            with timer("acceptance"):
                p = q_of(out.logits)[0]
                y = int(p.argmax()) if greedy else draws.categorical(p)
            tokens[0, n] = y
            feats[:, n] = out.hidden[:, 0]
            log.add_step(step_no, n, 0, 0, "target", y, elapsed_since(timer, before))
            n += 1
            continue
        with timer("drafter"):
            tree = draft_tree(
                drafter,
                model,
                dcache,
                expand_rows(tokens[:, d:n], guided),
                feats[:, d:n],
                d,
                spec,
                room,
                q_of,
                greedy,
                draws,
                guided,
            )
            drafter.rollback(dcache, n)  # tree nodes used the drafter's own features: recomputed next round
        d = n
        with timer("target"):
            # all nodes in one forward; node t at image position n-1+depth[t], seeing its ancestors only
            out = cache.extend_tree(
                expand_rows(tree.tokens[None], guided),
                torch.tensor(tree.depths, dtype=torch.long),
                tree.ancestors(),
            )
        with timer("acceptance"):
            p = q_of(out.logits)  # (T, V): p after each node
            outcome = walk_tree(tree, p, rule, table, greedy, draws, timer)
        path = torch.tensor(outcome.path, dtype=torch.long, device=model.device)
        m = len(outcome.path) - 1
        tokens[0, n : n + m] = tree.tokens[path[1:]]
        tokens[0, n + m] = outcome.token
        feats[:, n : n + m + 1] = out.hidden[:, path]  # h_{n-1} .. h_{n+m-1}: root and accepted nodes
        with timer("target"):
            cache.keep_path(n - 1, path)  # keep x_0..x_{n+m-1}; the new token is fed next round
        max_drafted = max(max_drafted, max(tree.depths))
        log.add_step(
            step_no,
            n,
            len(tree) - 1,
            m,
            outcome.kind,
            outcome.token,
            elapsed_since(timer, before),
            tree_draft_columns(tree, p, outcome, n),
            drafter_forwards=tree.forwards,
        )
        n += m + 1
    steps, drafts_tab = log.tables()
    images = image_row(image, prompt, seed, N, step_no, steps, timer.seconds, time.perf_counter() - t_start)
    return Decoded(tokens.cpu(), steps, drafts_tab, images, rule.method, spec.max_depth)
