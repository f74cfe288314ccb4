"""Chain speculative decoding: γ draft tokens per target forward (EAGLE drafter, any acceptance rule).

Small free functions in the order a decoder calls them (gpt-fast style):
:func:`lantern.steps.prefill` (target prefix -> first token), :func:`draft` (a chain of γ draft
tokens from the drafter), :func:`verify` (one target forward over the last token and the
drafts), :func:`accept` (the acceptance rule -> accepted prefix and the next token),
:func:`speculative_decode` (the loop for one image), :func:`autoregressive_decode` (the
baseline). Every loop *returns* its statistics (:class:`lantern.records.Decoded`); nothing is
logged. Draft trees live in :mod:`lantern.tree_decoding`; :func:`lantern.decoding.decode` runs
either for many images.

Alignment (EAGLE, arXiv 2401.15077, Sec. 4). Write ``x_i`` for image token ``i`` and ``h_i``
for the target's last hidden state at the position of ``x_i`` (it predicts ``x_{i+1}``;
``h_{-1}`` is the last prefix position). The drafter's input at position ``i`` is
``(x_i, f_{i-1})``. State at the start of a round with ``n`` committed tokens: the target's
KV cache holds ``x_0..x_{n-2}`` (the last committed token is not fed yet), the target features
``h_{-1}..h_{n-2}`` are known, the drafter's cache holds positions ``0..d-1`` computed from
true target features, and positions ``d..n-1`` are *pending*. A round:

1. :func:`draft`: one drafter forward over the pending positions with the true features
   ``h_{d-1}..h_{n-2}`` (EAGLE's re-run on accepted tokens; its last output drafts
   ``x̂_n``), then ``γ - 1`` forwards on the drafter's own features.
2. :func:`verify`: the target appends ``[x_{n-1}, x̂_n .. x̂_{n+γ-1}]`` -> ``p`` for positions
   ``n .. n+γ`` (the last is the bonus position) and ``h_{n-1} .. h_{n+γ-1}``.
3. :func:`accept`: ``a`` accepted drafts, next token ``y`` from the residual at the first
   rejection or from the bonus position.
4. Rollback: the target keeps ``x_0..x_{n+a-1}`` (``cache.rollback(n + a)``), the drafter
   keeps positions ``0..n-1`` (``drafter.rollback(dcache, n)``): positions ``n..`` used drafter
   features and are recomputed next round with ``h_{n-1}..h_{n+a-1}``.

γ is cut to ``min(γ, N - 1 - n)`` so that the bonus position is always an image token: every
verification forward emits ``accepted + 1`` tokens (the last token of an image is never drafted;
when one token is left the step is a plain target forward with no drafts).

Batches and CFG. A decode handles one condition at a time (``prompt.batch_size == 1``: one
row, or two rows with classifier-free guidance — conditional then unconditional). Rows of a
batch of images would accept different numbers of tokens per step; instead of ragged KV
caches we decode images one after another (:func:`decode`), which keeps rollback exact and
the per-image wall-clock honest. Under CFG the drafter runs on both rows with the target
features of the matching row, and ``q`` is its logits processed exactly like ``p``
(:func:`ambiguity.sampling.distribution`: CFG with the same scale, temperature, top-k, top-p).

Timing (seconds, wall-clock; ``torch.cuda.synchronize`` around each section on CUDA):
``target`` = target prefill/extend forwards and rollback; ``drafter`` = drafter forwards,
its head, ``q`` and sampling the drafts; ``acceptance`` = turning target logits into ``p``,
the rule (building the proximity sets ``A``), the residual and sampling the next token.
Record keeping (moving statistics to the CPU) is outside all three, inside ``total_s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from ambiguity.errors import UsageError
from ambiguity.models.base import Prompt, Step, TokenModel
from ambiguity.sampling import Generators, SamplingConfig, distribution, expand_rows, pick
from ambiguity.stats import entropy, top1_prob
from lantern.drafter.model import DraftModel
from lantern.engine.records import NEXT_KINDS, Decoded
from lantern.rules.acceptance import AcceptanceRule, Verdict, judge, judge_greedy, proximity, residual
from reference.records import StepLog
from reference.steps import Timer, check_prompt, elapsed_since, image_row, prefill, target_distribution

__all__ = ["Acceptance", "draft", "verify", "accept", "speculative_decode", "autoregressive_decode"]


@dataclass
class Acceptance:
    """Outcome of :func:`accept` for B conditions.

    accepted: (B,) int64 accepted draft tokens (the accepted prefix); next_token: (B,) int64;
    next_kind: (B,) int64 index into :data:`lantern.records.NEXT_KINDS` (0 target, 1 bonus,
    2 residual); verdict: per-draft :class:`~lantern.acceptance.Verdict` ((B, γ) fields), None
    when γ = 0; u: (B, γ) uniforms used (None when greedy or γ = 0).
    """

    accepted: torch.Tensor
    next_token: torch.Tensor
    next_kind: torch.Tensor
    verdict: Optional[Verdict]
    u: Optional[torch.Tensor]


def draft(
    drafter: DraftModel,
    model: TokenModel,
    dcache,
    tokens: torch.Tensor,
    features: torch.Tensor,
    start: int,
    gamma: int,
    sampling: SamplingConfig,
    guided: bool,
    generator: Generators = None,
    convention: str = "exact",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft a chain of ``gamma`` tokens (EAGLE, arXiv 2401.15077, Sec. 4.1).

    tokens: (rows, T) int64, the pending positions ``x_start .. x_{start+T-1}`` (T >= 1);
    features: (rows, T, H), ``f_{start-1} ..`` — true target features. The first drafter
    forward covers all T positions (writing them into ``dcache``); its last output drafts
    the first token, each further token feeds the drafter's own previous feature.
    Returns drafts (B, γ) int64 (sampled from q, or its argmax when greedy) and q (B, γ, V)
    float32, the drafter's distributions after guidance (scale ``sampling.guidance``),
    temperature and top-k/top-p — the same processing as the target's p
    (:func:`target_distribution` of ``convention``).
    """
    T = tokens.shape[1]
    f = drafter(model, tokens, features, dcache, start)[:, -1:]
    xs, qs = [], []
    for j in range(gamma):
        q = target_distribution(drafter.logits(model, f)[:, -1], sampling, guided, convention)  # (B, V)
        x = pick(q, sampling.greedy, generator)
        xs.append(x)
        qs.append(q)
        if j + 1 < gamma:
            f = drafter(model, expand_rows(x, guided)[:, None], f, dcache, start + T + j)
    return torch.stack(xs, 1), torch.stack(qs, 1)


def verify(model: TokenModel, cache, last: torch.Tensor, drafts: torch.Tensor, guided: bool) -> Step:
    """One target forward over ``[last, drafts]``: last (B, 1) int64, the last committed token
    (not yet in the cache); drafts (B, γ) int64 (γ may be 0).

    Returns the Step (rows, γ+1, .): logits[:, j] predicts the token after ``drafts[:, j-1]``
    (j = 0: the first draft's position; j = γ: the bonus position); hidden[:, j] the matching
    target features. The cache grows by γ + 1 tokens; roll it back after :func:`accept`.
    """
    return cache.extend(expand_rows(torch.cat([last, drafts], 1), guided))


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
    :func:`lantern.acceptance.judge`; the accepted prefix length ``a`` is the number of leading
    accepted drafts; the next token is drawn from the residual at position ``a``
    (:func:`lantern.acceptance.residual`) when ``a < γ``, else from the bonus ``p[:, γ]``.
    Greedy: :func:`lantern.acceptance.judge_greedy`; the next token is ``argmax p[:, a]``
    (the rejected position's argmax, or the bonus argmax). γ = 0: the next token is drawn from
    ``p[:, 0]``. ``validate=False``: the table was checked once by the caller
    (:meth:`AcceptanceRule.prepare_table`). timer: the decoder's :class:`lantern.steps.Timer`;
    growing the proximity sets is timed as its ``"proximity"`` section (inside the caller's
    ``"acceptance"``). Batched decoding (:mod:`lantern.batched`): ``lengths`` (B,) int64, each
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
        choose = lambda probs: pick(probs, greedy, generator)  # one draw per row
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
    if greedy:
        v = judge_greedy(p[:, :g], drafts, neighbours, rule, validate, prox)
        u = None
    else:
        u = _uniforms(drafts.shape, generator, p) if u is None else u
        v = judge(p[:, :g], q, drafts, u, neighbours, rule, validate, prox)
    ok = v.accepted if lengths is None else v.accepted & (torch.arange(g, device=p.device) < lengths[:, None])
    a = ok.long().cumprod(-1).sum(-1)  # (B,)
    rejected = a < (g if lengths is None else lengths)
    target = p[rows, a]  # (B, V): bonus position where all were accepted, else the rejected position
    if greedy or (lengths is None and not bool(rejected.any())):
        nxt = choose(target)
    else:
        at = a.clamp(max=g - 1)
        res = residual(p[rows, at], q[rows, at], drafts[rows, at], neighbours, rule, validate)
        nxt = choose(torch.where(rejected[:, None], res, target))
    kind = torch.where(rejected, 2, 1).long()
    if lengths is not None:
        kind = torch.where(lengths == 0, 0, kind)
    return Acceptance(a, nxt, kind, v, u)


def _uniforms(shape, generator: Generators, like: torch.Tensor) -> torch.Tensor:
    """Uniforms of ``shape`` (B, γ) in p's dtype: row b from generator b (or all from one)."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.rand(shape, generator=generator, device=like.device, dtype=like.dtype)
    return torch.stack([torch.rand(shape[1:], generator=g, device=like.device, dtype=like.dtype) for g in generator])


@torch.no_grad()
def speculative_decode(
    model: TokenModel,
    drafter: DraftModel,
    prompt: Prompt,
    sampling: SamplingConfig,
    rule: AcceptanceRule,
    neighbours: Optional[torch.Tensor] = None,
    gamma: int = 4,
    generator: Generators = None,
    num_tokens: Optional[int] = None,
    image: int = 0,
    seed: Optional[int] = None,
) -> Decoded:
    """Speculative decoding of one image (module docstring: alignment, rollback, timing).

    model: the target; drafter: a :class:`lantern.drafter.model.DraftModel` for it; prompt: one
    condition (``batch_size == 1``; 2 rows with guidance); rule: ``"sd"`` or a LANTERN rule;
    neighbours: (V, K >= k) int64 code-index table (:func:`neighbour_table`) for relaxed rules;
    gamma: draft length γ >= 1; generator: the source of every random number (drafts, ``u``,
    next tokens); num_tokens: tokens to generate (default ``model.num_tokens``).
    Returns a :class:`~lantern.records.Decoded` with tokens (1, N) and the step, draft and
    image records (``image`` and ``seed`` are written into them).
    Raises :class:`UsageError` for a batch of several conditions, γ < 1, a guidance mismatch
    or a neighbour table that does not fit (checked once here, not on every step).
    """
    check_prompt(prompt, sampling)
    if int(gamma) < 1:
        raise UsageError(f"gamma must be >= 1, got {gamma}")
    table = rule.prepare_table(neighbours, model.vocab_size, model.device)
    N = int(num_tokens or model.num_tokens)
    guided, greedy = prompt.guided, sampling.greedy
    timer, log = Timer(model.device), StepLog(image)
    t_start = time.perf_counter()
    with timer("target"):
        cache, first = prefill(model, prompt, N)
    with timer("acceptance"):
        x0 = pick(target_distribution(first.logits[:, -1], sampling, guided, rule.convention), greedy, generator)
    tokens = torch.empty(1, N, dtype=torch.long, device=model.device)
    tokens[:, 0] = x0
    row_tokens = lambda a, b: expand_rows(tokens[:, a:b], guided)  # per-row view of tokens a..b-1
    feats = first.hidden.new_empty(prompt.rows, N, first.hidden.shape[-1])  # feats[:, i] = h_{i-1}
    feats[:, 0] = first.hidden[:, -1]
    dcache = drafter.new_cache(prompt.rows)
    # n: tokens committed; d: drafter positions computed from true target features (0..d-1)
    n, d, step_no = 1, 0, 0
    while n < N:
        step_no += 1
        before = timer.snapshot()
        g = min(int(gamma), N - 1 - n)  # the bonus position must stay inside the image
        q = None
        if g > 0:
            with timer("drafter"):
                # pending positions d..n-1 get true features h_{d-1}..h_{n-2}; their last output drafts x̂_n
                drafts, q = draft(
                    drafter,
                    model,
                    dcache,
                    row_tokens(d, n),
                    feats[:, d:n],
                    d,
                    g,
                    sampling,
                    guided,
                    generator,
                    rule.convention,
                )
                drafter.rollback(dcache, n)  # positions >= n used the drafter's own features: recompute next round
            d = n
        else:
            drafts = tokens.new_empty(1, 0)
        with timer("target"):
            # the target appends [x_{n-1}, x̂_n .. x̂_{n+g-1}]: p for positions n .. n+g (the last is the bonus)
            out = verify(model, cache, tokens[:, n - 1 : n], drafts, guided)
        with timer("acceptance"):
            p = target_distribution(out.logits, sampling, guided, rule.convention)  # (1, g+1, V)
            res = accept(p, q, drafts, rule, table, greedy, generator, validate=False, timer=timer)
            a = int(res.accepted[0])
        tokens[:, n : n + a] = drafts[:, :a]
        tokens[:, n + a] = res.next_token
        feats[:, n : n + a + 1] = out.hidden[:, : a + 1]  # h_{n-1} .. h_{n+a-1}: true features of what was kept
        with timer("target"):
            cache.rollback(n + a)  # keep x_0..x_{n+a-1}; the new token x_{n+a} is fed next round
        kind = NEXT_KINDS[int(res.next_kind[0])]
        log.add_step(
            step_no,
            n,
            g,
            a,
            kind,
            int(res.next_token[0]),
            elapsed_since(timer, before),
            _draft_columns(p[0, :g], q[0], drafts[0], res) if g else None,
            drafter_forwards=g,
        )
        n += a + 1
    steps, drafts_tab = log.tables()
    s = timer.seconds
    images = image_row(image, prompt, seed, N, step_no, steps, s, time.perf_counter() - t_start)
    return Decoded(tokens.cpu(), steps, drafts_tab, images, rule.method, int(gamma))


def _draft_columns(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, res: Acceptance) -> dict:
    """Per-draft columns of one chain (γ,): p (γ, V), q (γ, V) (the drafter's distributions, also
    when greedy), drafts (γ,)."""
    v = res.verdict
    u = res.u[0] if res.u is not None else torch.full(drafts.shape, float("nan"), device=p.device)
    return dict(
        token=drafts,
        p_draft=v.p_draft[0],
        q_draft=q.gather(-1, drafts[:, None])[:, 0],
        p_tilde=v.p_tilde[0],
        j_star=v.j_star[0],
        spent=v.spent[0],
        accept_prob=v.accept_prob[0],
        u=u,
        accepted=v.accepted[0],
        p_top1=top1_prob(p),
        p_entropy=entropy(p),
        q_top1=top1_prob(q),
    )


@torch.no_grad()
def autoregressive_decode(
    model: TokenModel,
    prompt: Prompt,
    sampling: SamplingConfig,
    generator: Generators = None,
    num_tokens: Optional[int] = None,
    image: int = 0,
    seed: Optional[int] = None,
) -> Decoded:
    """The baseline: one target forward per token with the KV cache (one condition).

    Same random-number use as :func:`ambiguity.generation.sample_tokens`, so the tokens are
    identical for the same generator. Every forward after the prefill is a step with
    ``drafted = accepted = 0`` and ``emitted = 1``; step compression is 1.
    Returns a :class:`~lantern.records.Decoded` (tokens (1, N)); raises UsageError as
    :func:`speculative_decode`.
    """
    check_prompt(prompt, sampling)
    N = int(num_tokens or model.num_tokens)
    guided, greedy = prompt.guided, sampling.greedy
    timer, log = Timer(model.device), StepLog(image)
    t_start = time.perf_counter()
    with timer("target"):
        cache, out = prefill(model, prompt, N)
    tokens = torch.empty(1, N, dtype=torch.long, device=model.device)
    for t in range(N):
        before = timer.snapshot()
        if t > 0:
            with timer("target"):
                out = cache.extend(expand_rows(tokens[:, t - 1 : t], guided))
        with timer("acceptance"):
            x = pick(distribution(out.logits[:, -1], sampling, guided), greedy, generator)
        tokens[:, t] = x
        if t > 0:
            log.add_step(t, t, 0, 0, "target", int(x[0]), elapsed_since(timer, before))
    steps, drafts_tab = log.tables()
    images = image_row(image, prompt, seed, N, N - 1, steps, timer.seconds, time.perf_counter() - t_start)
    return Decoded(tokens.cpu(), steps, drafts_tab, images, "ar", 0)
