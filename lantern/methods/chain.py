"""Chain speculative decoding: γ draft tokens per target forward (EAGLE drafter, any acceptance rule).

:class:`Chain` is the method (one engine round over every slot); :func:`accept` is the
acceptance step it calls, a pure function of the target's and the drafter's distributions:
the accepted prefix and the next token (Leviathan et al. 2023, Alg. 1; LANTERN, Jang et al.,
ICLR 2025, arXiv 2410.03355, Sec. 3).

Alignment (EAGLE, arXiv 2401.15077, Sec. 4). Write ``x_i`` for image token ``i`` and ``h_i``
for the target's last hidden state at the position of ``x_i`` (it predicts ``x_{i+1}``;
``h_{-1}`` is the last prefix position). The drafter's input at position ``i`` is
``(x_i, f_{i-1})``. At the start of a round with ``n`` committed tokens the target's cache
holds ``x_0..x_{n-2}`` (the last committed token is not fed yet), the features
``h_{-1}..h_{n-2}`` are known, the drafter's cache holds positions ``0..d-1`` computed from
true target features, and positions ``d..n-1`` are *pending*. A round drafts (one drafter
forward over the pending positions, then ``γ - 1`` on its own features), verifies
``[x_{n-1}, x̂_n .. x̂_{n+γ-1}]`` (``p`` for positions ``n .. n+γ``, the last the bonus
position), accepts ``a`` drafts and draws the next token from the residual at the first
rejection or from the bonus position. γ is cut to ``min(γ, N - 1 - n)`` so that the bonus
position is always an image token.

Under CFG the drafter runs on both rows with the target features of the matching row, and
``q`` is its logits processed exactly like ``p`` (:func:`ambiguity.sampling.distribution`).
Timing (seconds, wall-clock): ``target`` = target forwards; ``drafter`` = drafter forwards, its
head, ``q`` and drawing the drafts; ``acceptance`` = ``p``, the rule (``proximity``: growing
the sets A), the residual, the next token and the commit.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import torch

from ambiguity.cli import positive_int
from ambiguity.models.base import Step
from ambiguity.sampling import Generators, expand_rows, pick
from ambiguity.stats import entropy, top1_prob
from lantern.drafter.model import DraftModel
from lantern.engine.loop import engine_rounds
from lantern.engine.method import Method, Round
from lantern.engine.options import OptionGroup
from lantern.engine.policy import GammaPolicy
from lantern.engine.records import ChainDrafts
from lantern.engine.slots import BatchState, verify_chains
from lantern.engine.steps import Timer
from lantern.methods.ar import AR, ar_round, ar_step
from lantern.methods.drafting import draft_chains
from lantern.rules.acceptance import RULES, AcceptanceRule, Verdict, judge, judge_greedy, proximity, residual, walk

__all__ = ["Acceptance", "accept", "Chain", "OPTIONS"]


@dataclass
class Acceptance:
    """Outcome of :func:`accept` for B conditions.

    accepted: (B,) int64 accepted draft tokens (the accepted prefix); next_token: (B,) int64;
    next_kind: (B,) int64 index into :data:`lantern.engine.records.NEXT_KINDS` (0 target, 1 bonus,
    2 residual); verdict: per-draft :class:`~lantern.rules.acceptance.Verdict` ((B, γ) fields), None
    when γ = 0; u: (B, γ) uniforms used (None when greedy or γ = 0).
    """

    accepted: torch.Tensor
    next_token: torch.Tensor
    next_kind: torch.Tensor
    verdict: Optional[Verdict]
    u: Optional[torch.Tensor]


def accept(
    p: torch.Tensor,
    q: Optional[torch.Tensor],
    drafts: torch.Tensor,
    rule: AcceptanceRule,
    neighbours: Optional[torch.Tensor],
    greedy: bool,
    generator: Generators = None,
    validate: bool = True,
    timer: Optional[Timer] = None,
    lengths: Optional[torch.Tensor] = None,
    u: Optional[torch.Tensor] = None,
    choose=None,
) -> Acceptance:
    """Apply the acceptance rule to a chain and draw the next token.

    p: (B, γ+1, V) float32 target distributions at the draft positions and the bonus
    position; q: (B, γ, V) drafter distributions (unused when greedy); drafts: (B, γ) int64;
    neighbours: (V, K >= k) int64 table (None for ``"sd"``).
    Sampling: uniforms ``u`` (B, γ) from ``generator``; each draft is judged by
    :func:`lantern.rules.acceptance.judge` (each draft's place ``j`` in its row's chain and the chain's
    length reach the rule: Cool-SD's annealed schedule); the accepted prefix length ``a`` is the
    number of leading accepted drafts after the rule's walk (:func:`lantern.rules.acceptance.walk`:
    FLy defers some rejections, and the verdict's ``accepted`` then records its deferrals); the
    next token is drawn from the residual at position ``a`` (:func:`lantern.rules.acceptance.residual`)
    when ``a < γ``, else from the bonus ``p[:, γ]``.
    Greedy: :func:`lantern.rules.acceptance.judge_greedy`; the next token is ``argmax p[:, a]``
    (the rejected position's argmax, or the bonus argmax). γ = 0: the next token is drawn from
    ``p[:, 0]``. ``validate=False``: the table was checked once by the caller
    (:meth:`AcceptanceRule.prepare_table`). timer: the decoder's :class:`lantern.engine.steps.Timer`;
    growing the proximity sets is timed as its ``"proximity"`` section (inside the caller's
    ``"acceptance"``). Batched decoding (:mod:`lantern.engine.loop`): ``lengths`` (B,) int64, each
    row's own chain length ``γ_b <= γ`` (drafts beyond it are padding: never accepted; a row
    with ``γ_b = 0`` draws its next token from ``p[b, 0]``, kind "target"), and ``u`` (B, γ)
    the uniforms the caller drew (row b's first γ_b from its own stream); the residual is then
    computed for every row without a host synchronisation; ``choose``: probs (B, V) -> (B,) int64,
    how the next token is drawn when sampling (default :func:`ambiguity.sampling.pick` with
    ``generator``). Leviathan et al. 2023, Alg. 1;
    LANTERN Sec. 3.
    """
    B, g = drafts.shape
    rows = torch.arange(B, device=p.device)
    if choose is None or greedy:
        choose = lambda probs: pick(probs, greedy, generator)
    if g == 0:
        nxt = choose(p[:, 0])
        return Acceptance(
            torch.zeros(B, dtype=torch.long, device=p.device),
            nxt,
            torch.zeros(B, dtype=torch.long, device=p.device),
            None,
            None,
        )
    prox = None
    if not validate and timer is not None:  # the decoder (table checked once): time the proximity sets alone
        with timer("proximity"):
            prox = proximity(p[:, :g], drafts, neighbours if rule.relaxed else None, rule)
    chain = g if lengths is None else lengths  # each row's chain length (g, or (B,)): Cool-SD's schedule reads it
    at_chain = chain if lengths is None else chain[:, None]
    if greedy:
        v = judge_greedy(p[:, :g], drafts, neighbours, rule, validate, prox, lengths=at_chain)
        u = None
    else:
        u = _uniforms(drafts.shape, generator, p) if u is None else u
        v = judge(p[:, :g], q, drafts, u, neighbours, rule, validate, prox, lengths=at_chain)
    ok = v.accepted if lengths is None else v.accepted & (torch.arange(g, device=p.device) < lengths[:, None])
    walked = walk(ok, v, rule)  # the rule's walk over the chain (FLy defers rejections); else ok itself
    a = walked.long().cumprod(-1).sum(-1)  # (B,)
    rejected = a < chain
    target = p[rows, a]  # (B, V): bonus position where all were accepted, else the rejected position
    if greedy or (lengths is None and not bool(rejected.any())):
        nxt = choose(target)
    else:
        at = a.clamp(max=g - 1)
        res = residual(p[rows, at], q[rows, at], drafts[rows, at], neighbours, rule, validate, at, chain)
        nxt = choose(torch.where(rejected[:, None], res, target))
    kind = torch.where(rejected, 2, 1).long()
    if lengths is not None:
        kind = torch.where(lengths == 0, 0, kind)
    return Acceptance(a, nxt, kind, v if walked is ok else replace(v, accepted=walked), u)


def _uniforms(shape, generator: Generators, like: torch.Tensor) -> torch.Tensor:
    """Uniforms of ``shape`` (B, γ) in p's dtype: row b from generator b (or all from one)."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand(shape, generator=generator, device=like.device, dtype=like.dtype)
    return torch.stack([torch.rand(shape[1:], generator=g, device=like.device, dtype=like.dtype) for g in generator])


class Chain(Method):
    """Chains of γ drafts from an EAGLE drafter, judged by an acceptance rule (``sd``, ``lantern``,
    ``lantern-jsd``, ``lantern++``; :data:`lantern.rules.acceptance.RULES`), any batch size.

    A round (EAGLE, arXiv 2401.15077, Sec. 4): slot b at ``n_b`` committed tokens drafts
    ``γ_b = min(γ, N - 1 - n_b)`` tokens (the bonus position stays inside the image;
    :func:`lantern.methods.drafting.draft_chains`), one target forward verifies
    ``[x_{n_b-1}, x̂_{n_b} .. x̂_{n_b+γ_b-1}]`` for every slot (:func:`lantern.engine.slots.verify_chains`),
    :func:`accept` keeps the accepted prefix ``a_b`` and draws the next token from the residual
    at the first rejection or the bonus position, and the committed tokens and their target
    features ``h_{n_b-1}..h_{n_b+a_b-1}`` are written in place. The drafter's cache keeps its
    positions ``0..d_b-1``; positions ``d_b..n_b-1`` are re-run with true features next round.

    rule: the :class:`~lantern.rules.acceptance.AcceptanceRule`; gamma: γ >= 1; drafter: a
    :class:`~lantern.drafter.model.DraftModel` with ``forward_slots``; table: the (V, K) int64
    neighbour table prepared by :meth:`AcceptanceRule.prepare_table` (None for ``sd``); policy: a
    :class:`lantern.engine.policy.GammaPolicy` (``gamma="auto"``): each round it picks the chain
    length in ``0..gamma`` (0: a plain AR step) and may stop drafting early; None: always γ.
    """

    def __init__(
        self,
        rule: AcceptanceRule,
        gamma: int,
        drafter: DraftModel,
        table: Optional[torch.Tensor],
        policy: Optional[GammaPolicy] = None,
    ):
        self.rule, self.gamma, self.drafter, self.table, self.policy = rule, int(gamma), drafter, table, policy
        self.name, self.depth, self.spare, self.convention = rule.method, self.gamma, self.gamma + 1, rule.convention

    def open(self, st: BatchState) -> None:
        st.drafter, st.rule, st.table = self.drafter, self.rule, self.table
        st.dcache = self.drafter.new_cache(st.rows, self.gamma + 1)
        if self.policy is not None:
            engine = lambda images: engine_rounds(st, images, AR(), Chain(self.rule, 2, self.drafter, self.table))
            self.policy.open(st.model, self.drafter, st.sampling, st.B, self.rule, self.table, engine)
            st.p_stats = np.zeros((st.B, 2))

    def start(self, st: BatchState, slots: list[int], p0: torch.Tensor) -> torch.Tensor:
        if self.policy is not None:
            st.p_stats[slots] = _host_stats(p0)
        return super().start(st, slots, p0)

    def round(self, st: BatchState, active: np.ndarray) -> Round:
        if self.policy is not None and not self.policy.may_draft(st.rows):  # speculation off at this batch size
            return _plain_round(st, stats=False)
        if self.policy is not None and self.policy.resting():  # AR stretch: no plan this round
            return _plain_round(st, stats=self.policy.plans_next())
        n, timer, greedy = st.n, st.timer, st.sampling.greedy
        caps = np.where(active, np.minimum(self.gamma, st.N - 1 - n), 0)
        g, go_on = caps, None
        if self.policy is not None:
            g, go_on = _policy_lengths(self.policy, st, active, caps)
        if not g.any():  # the policy's G = 0, or every image at its last token
            return _plain_round(st, stats=self.policy is not None and self.policy.plans_next())
        with timer("drafter"):
            drafts, q = draft_chains(st, n, st.d, g, go_on)
        g = np.minimum(g, drafts.shape[1])  # the policy may stop drafting early
        st.d = np.where(g > 0, n, st.d)
        gmax = drafts.shape[1]
        with timer("target"):
            out = _verify(st, drafts)
        with timer("acceptance"):
            p = st.target(out.logits)  # (B, γ + 1, V)
            u = _uniforms_of(st, p, q, drafts, g) if gmax and not greedy else None
            res = accept(
                p,
                q,
                drafts,
                self.rule,
                self.table,
                greedy,
                validate=False,
                timer=timer,
                lengths=torch.as_tensor(g, device=st.device),
                u=u,
                choose=lambda probs: st.streams.categorical(probs, range(st.B)),
            )
            _commit(st, drafts, res, out.hidden)
        a, nxt, kind = _to_host(st, res, p, self.policy is not None)  # the step's one host transfer
        cols = None
        if gmax:
            live = np.flatnonzero(active)
            values = _draft_values(res, p, q, drafts, gmax)
            cols = ChainDrafts(values, live, st.image[live], st.step[live], n[live], g[live], a[live])
        return Round(a, g, kind, nxt, None, cols)


def _plain_round(st: BatchState, stats: bool) -> Round:
    """A round of the draft-length policy without drafts: a plain AR step (:func:`lantern.methods.ar.ar_step`,
    the same draw the chain's acceptance makes at γ = 0) that keeps the target features for the drafter's
    later rounds; with ``stats``, each slot's (top-1, entropy) of the distribution its token came from goes
    to ``st.p_stats`` in the same host transfer."""
    if not stats:
        return ar_round(st, features=True)
    x, p = ar_step(st, features=True)
    zeros = np.zeros(st.B, dtype=np.int64)
    host = torch.stack([x.double(), top1_prob(p).double(), entropy(p).double()]).cpu().numpy()
    st.p_stats = host[1:].T.copy()
    return Round(zeros, zeros, zeros, host[0].astype(np.int64))


def _host_stats(p: torch.Tensor) -> np.ndarray:
    """(top-1 probability, entropy) of each row of p (k, V) as a (k, 2) float64 host array."""
    return torch.stack([top1_prob(p), entropy(p)], 1).double().cpu().numpy()


def _policy_lengths(policy: GammaPolicy, st: BatchState, active: np.ndarray, caps: np.ndarray):
    """The policy's draft lengths of a round (B,) int64 (0 for every slot: a plain AR step) and the
    drafting loop's stopping rule ``go_on(j, q)`` (:meth:`GammaPolicy.go_on`, on the live slots)."""
    live = np.flatnonzero(active)
    pending = int((st.n[live] - st.d[live]).max())  # the drafter's first forward reads positions d..n-1
    if policy.plan(st.p_stats[live], caps[live], st.rows, pending) == 0:
        return np.zeros_like(caps), None
    pick = None if len(live) == st.B else torch.as_tensor(live, device=st.device)

    def go_on(j: int, q: torch.Tensor) -> bool:
        top = q.amax(-1) if pick is None else q[pick].amax(-1)
        return policy.go_on(top.double().cpu().numpy())

    return caps, go_on


def _to_host(st: BatchState, res: Acceptance, p: torch.Tensor, stats: bool):
    """The accepted lengths, next tokens and kinds (B,) int64 numpy, in one transfer; with
    ``stats``, also each slot's (top-1, entropy) of the distribution its next token came from,
    into ``st.p_stats`` (the policy's input for the next round)."""
    cols = torch.stack([res.accepted, res.next_token, res.next_kind])
    if not stats:
        a, nxt, kind = cols.cpu().numpy()
        return a, nxt, kind
    last = p[torch.arange(p.shape[0], device=p.device), res.accepted]  # (B, V)
    host = torch.cat([cols.double(), top1_prob(last).double()[None], entropy(last).double()[None]]).cpu().numpy()
    st.p_stats = host[3:].T.copy()
    a, nxt, kind = host[:3].astype(np.int64)
    return a, nxt, kind


def _verify(st: BatchState, drafts: torch.Tensor) -> Step:
    """One target forward over every slot's ``[x_{n-1}, drafts]`` (B, 1 + max γ)."""
    n_t = torch.as_tensor(st.n, device=st.device)
    vin = torch.cat([st.tokens.gather(1, (n_t - 1)[:, None]), drafts], 1)
    return verify_chains(st.model, st.cache, vin, st.n, st.N, st.guided)


def _uniforms_of(st: BatchState, p, q, drafts, g) -> torch.Tensor:
    """The acceptance uniforms (B, max γ): row b's first γ_b from its stream (a scripted row walks
    its coins through the rule's acceptance probabilities, :meth:`Streams.uniforms`)."""
    gmax = drafts.shape[1]
    prob = None
    if any(x is not None for x in st.streams.scripted):
        zeros = torch.zeros_like(drafts, dtype=p.dtype)
        lengths = torch.as_tensor(g, device=st.device)[:, None]  # each row's own chain (Cool-SD's ω by place)
        prob = judge(p[:, :gmax], q, drafts, zeros, st.table, st.rule, False, lengths=lengths).accept_prob
    return st.streams.uniforms(g, p.dtype, prob)


def _commit(st: BatchState, drafts: torch.Tensor, res: Acceptance, hidden: torch.Tensor) -> None:
    """Write every slot's accepted drafts and next token (``x_n..x_{n+a}``) into st.tokens and
    the target features ``h_{n-1}..h_{n+a-1}`` of what was kept into st.feats, in place.

    The whole verified width is written (positions ``n_b .. n_b + max γ``): what lies past a slot's
    ``n_b + a_b`` is never read (a round reads committed positions only) and the next round
    overwrites it from its new ``n_b`` on."""
    a, T = res.accepted, drafts.shape[1] + 1
    cand = torch.cat([drafts, res.next_token[:, None]], 1).scatter_(1, a[:, None], res.next_token[:, None])
    at = torch.as_tensor(st.n, device=st.device)[:, None] + torch.arange(T, device=st.device)
    st.tokens.scatter_(1, at, cand)
    st.feats.scatter_(1, expand_rows(at, st.guided)[..., None].expand(-1, -1, st.H), hidden)


def _draft_values(res, p, q, drafts, gmax: int) -> torch.Tensor:
    """The step's draft columns (:data:`lantern.engine.records.CHAIN_COLUMNS`) as one (B, columns, γ)
    tensor (the token, j* and the verdict stored exactly as floats; u NaN when greedy)."""
    v, pg = res.verdict, p[:, :gmax]
    u = res.u if res.u is not None else torch.full_like(v.p_draft, float("nan"))
    cols = [
        drafts,
        v.p_draft,
        q.gather(-1, drafts[..., None])[..., 0],
        v.p_tilde,
        v.j_star,
        v.spent,
        v.accept_prob,
        u,
        v.accepted,
        top1_prob(pg),
        entropy(pg),
        top1_prob(q),
    ]
    dtype = torch.float64 if any(c.dtype == torch.float64 for c in cols) else v.p_draft.dtype
    return torch.stack([c.to(dtype) for c in cols], 1)


# --------------------------------------------------------------------------- command-line options
def _draft_length(text: str):
    """``--gamma``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or auto, got {text!r}") from None


def _add_gamma(g) -> None:
    g.add_argument(
        "--gamma",
        type=_draft_length,
        default=4,
        help="draft tokens per verification step of a chain, >= 1, or auto: the engine's draft-length policy picks "
        "each round's length in 0..--gamma-max from a measured cost model and the drafter's acceptance predictor "
        "(lantern.engine.policy; with --tree dynamic: whether to draft the tree and how many of its candidates to "
        "verify) (default: 4)",
    )


def _add_gamma_max(g) -> None:
    g.add_argument(
        "--gamma-max", type=positive_int, default=8, help="the longest chain --gamma auto drafts (default: 8)"
    )


def _not_auto(args) -> Optional[str]:
    return _not_a_chain(args) or (None if args.gamma == "auto" else f"to --gamma {args.gamma}, only to --gamma auto")


def _not_a_chain(args) -> Optional[str]:
    if args.tree == "chain":
        return None
    static = " (static)" if args.tree != "dynamic" else ""
    return f"to --tree {args.tree}{static} (a tree sets its own depth), only to --tree chain"


def _gamma_refusal(args) -> Optional[str]:
    if args.gamma == "auto" and args.tree != "chain":  # a dynamic tree's node budget; a static tree is fixed
        fixed = f"to --tree {args.tree} (a fixed shape), only to a chain or --tree dynamic"
        return None if args.tree == "dynamic" else fixed
    return _not_a_chain(args)


OPTIONS = (
    OptionGroup("chain", RULES, _add_gamma, _gamma_refusal),
    OptionGroup("chain draft-length policy", RULES, _add_gamma_max, _not_auto),
)
