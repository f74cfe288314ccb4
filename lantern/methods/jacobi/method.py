"""Training-free parallel decoding by Jacobi iteration of the target itself: SJD, GSD, SCD, entropy-aware SJD.

No drafter: each target forward reads ``[x_{n-1}, d_n .. d_{n+g-1}]`` — the last committed token
and a *window* of draft tokens for the next positions — and its outputs both verify the drafts
and propose the next iteration's drafts.

* ``"sjd"`` — Speculative Jacobi Decoding (Teng et al., ICLR 2025, arXiv 2410.01699; official
  code github.com/tyshiwo1/Accelerating-T2I-AR-with-SJD, ``scheduler/jacobi_iteration_*.py``).
  The draft at position ``t`` was drawn from ``q_t``: the target distribution at ``t`` of the
  previous iteration (whose context held the drafts of that iteration), or a point mass for a
  freshly initialised position. It is accepted with probability ``min(1, p_t(d)/q_t(d))``
  against this iteration's ``p_t``; the accepted prefix is committed, the first rejected
  position draws from ``norm(max(p_t - q_t, 0))`` (the bonus ``p`` after the window when every
  draft passed), and the tokens this forward *sampled* at the later positions (from its
  ``p_t``, with ``q = p_t``) become the next drafts, the window being topped up with new
  initialised positions. Lossless: the draft at ``t`` depends only on randomness that nothing
  at positions ``< t`` has used.
  The residual ``norm(max(p_t - q_t, 0))`` is drawn as it is; the official SJD code re-applies
  temperature and top-k / top-p to the residual before drawing, which is lossy at T != 1 (this
  implementation is lossless at every temperature).
* ``"gsd"`` — Grouped Speculative Decoding (So et al., ICCV 2025, arXiv 2508.07747; official
  code github.com/junhyukso/GSD, ``scheduler/jacobi_iteration_lumina_mgpt.py``): as SJD, but a
  draft ``x`` is judged by the mass of a *group* ``G(x)`` of tokens the target ranks next to it:
  accepted with probability ``min(1, p(G)/q(G))``. ``G(x)``: the ``group`` tokens around ``x`` in
  the target's ascending probability order (ranks ``r-group//2 .. r-group//2+group-1``; the
  official code slices ``[r-7, r+7)``, ``group = 14``) whose probability differs from ``p(x)`` by
  less than ``prob_gap`` (official 0.15), optionally also within a squared L2 distance
  ``distance`` of ``x``'s input embedding (official 0.5 on Chameleon's table; off here by default,
  its scale is model-specific). Rejection resamples the plain SJD residual. Not lossless:
  :func:`lantern.rules.jacobi.gsd_output_distribution` gives one step's output exactly. Two
  deviations from the official code: its embedding-distance filter is on (here off by default,
  ``distance``), and where a draft ranks in the lower half of the group's window the official slice
  ``[r-7, r+7)`` starts below rank 0 and is empty, so the official code falls back to plain SJD
  for that draft, while this one clips the group to the ranks that exist (the one-step output law
  then differs from the official one, by up to 0.12 in total variation in 25 of 36 random cases at
  V = 16-32, the official law being the closer to p).
* ``"scd"`` — Speculative Coupled Decoding (So et al., ICML 2026, arXiv 2510.24211; official
  code github.com/junhyukso/SCD, ``lumina1/scheduler/jacobi_iteration_lumina_mgpt_{GS,SCDMC}.py``):
  SJD whose successive drafts at one position are *coupled* so that they tend to repeat.
  ``coupling="gumbel"`` (``_GS``): every sample at position ``t`` is ``argmax(log p + g_t)`` with a
  Gumbel vector ``g_t`` fixed per absolute position for the whole image (the official code
  shifts its noise table with the accepted tokens). ``"maximal"`` (``_SCDMC``): the next draft at
  ``t`` is the maximal coupling of the old draft ``d ~ q_t`` and ``p_t`` — kept with probability
  ``min(1, p_t(d)/q_t(d))``, else drawn from ``norm(max(p_t - q_t, 0))`` — so it is distributed as
  ``p_t`` and is recorded with ``q = p_t`` (lossless). ``"maximal-official"`` records a kept draft
  with its old ``q_t`` as the official code does; the exact enumeration in
  ``tests/test_jacobi.py`` shows that this moves the output away from AR sampling.

Windows (``JacobiConfig.window`` = ``L``, the official ``max_num_new_tokens``): one forward reads
``L`` tokens (``L - 1`` drafts) and emits ``1 .. L`` tokens; ``L = 1`` is AR decoding. The window
shrinks near the end so the bonus position stays inside the image. New positions are
initialised (``init``) with a uniform random token (official ``"random"``, Lumina-mGPT) or a copy
of the token to the left in the image grid (``"repeat-horizon"``, the official LlamaGen script;
random in the first column), both with a point-mass ``q``. Greedy decoding (temperature 0): a
draft is accepted iff it is the argmax of ``p`` (GSD: iff the argmax is in its group) and the
drafts are argmaxes: greedy SJD/SCD is greedy AR token for token.

* ``"entropy-sd"`` — entropy-aware acceptance (Ma et al., NeurIPS 2025, arXiv 2510.09012; official
  code github.com/krennic999/ARsample): SJD whose test is relaxed where the target is uncertain,
  ``min(1, p(x) / (tau(H) q(x)))`` with ``tau(H) = max(floor, exp(-H / alpha))`` of the target's
  entropy ``H`` at the draft's position (:func:`lantern.rules.jacobi.entropy_judge`), and whose
  window depends on the entropy too: image ``b``'s next forward reads
  ``L_b = clamp(round(L exp(-H_b / scale)), L_min, L)`` tokens
  (:func:`lantern.rules.jacobi.entropy_window`), ``H_b`` the entropy of the target distribution its
  newest token was drawn from (the first token's at admission): a confident image drafts further.
  ``H_b`` is known before the forward, so the windows depend only on the past and greedy decoding
  stays greedy AR. The official release holds the paper's dynamic temperature
  (``2.5 exp(-H/3) + 0.6``, LlamaGen ``autoregressive/models/generate.py``) and, for Lumina-mGPT,
  plain SJD (``lumina_mgpt/jacobi_iteration.py``: the test ``min(1, p/q)``, a fixed window of 16);
  neither the entropy-aware test nor an entropy-dependent draft length, and the paper's text was
  not available here beyond its abstract ("entropy-aware acceptance rules ... near-lossless at
  about 85 % of the inference cost"): both functional forms, ``alpha = 3`` nats (the official
  temperature's entropy scale), ``floor = 0.7``, ``L = 24``, ``L_min = 4`` and ``scale = 6`` nats
  are ours (:class:`~lantern.methods.jacobi.config.JacobiConfig`). Not lossless: greedy equals
  greedy AR; one step's law is :func:`lantern.rules.jacobi.one_step_output` with
  :func:`~lantern.rules.jacobi.entropy_acceptance`.

The acceptance rules are entries of :data:`lantern.rules.jacobi.JACOBI_RULES` (acceptance
probability and record columns, greedy test, residual): a new Jacobi rule is one entry.

:class:`Jacobi` runs on the engine (:mod:`lantern.engine.loop`): up to B images per target
forward, each at its own position with its own window, committing its own accepted prefix
(ragged commits in per-image cache slots). One step is one tensor pass over all (B, g) drafts
after the forward: the rule, the coins, the accepted prefix (cumulative product), the residual or
bonus token, this forward's samples at every window position (the next drafts), the committed
tokens, the next window and the record columns, with one host transfer. Randomness: image ``i``
draws from its generator ``(seed, i)`` (:mod:`ambiguity.seeding`), per step one block of uniforms
(:func:`draw_counts`: its new random positions, one coin per draft, one inverse-CDF uniform per
position; the coin of a draft that is not reached is SCD-maximal's coupling test there) and then
SCD's Gumbel noise for the positions entering its window, the same numbers at any batch size; in
float64 the tokens and records do not depend on it. A scripted image
(:class:`lantern.engine.slots.Draws`, exact enumeration in the tests) draws each decision in order
(new tokens, coins up to the first rejection, the next token, the next drafts). Every draw is used
at one position only and the draft at ``t`` depends only on numbers nothing at ``< t`` used, so
SJD and SCD stay lossless.

Records (:mod:`lantern.engine.records`): one step row per Jacobi forward (``drafted`` = window drafts,
``accepted`` = accepted prefix, ``drafter_forwards = 0``), one draft row per window draft with
``proposed_step`` = the Jacobi iteration (step) whose forward sampled it, or -1 for an initialised
position; for GSD ``p_tilde = p(G)``, ``j_star = |G| - 1`` and ``spent = p(G) - p(x)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ambiguity.models.base import TokenModel
from ambiguity.sampling import row_uniforms
from ambiguity.stats import entropy, top1_prob
from lantern.engine.loop import engine_rounds
from lantern.engine.method import Method, Round
from lantern.engine.policy import WindowPolicy
from lantern.engine.records import CHAIN_VALUES, chain_rows
from lantern.engine.slots import BatchState, verify_chains
from lantern.methods.ar import AR, ar_round
from lantern.methods.jacobi.config import JacobiConfig
from lantern.rules.jacobi import JACOBI_RULES, WindowDrafts, entropy_window

__all__ = ["Jacobi", "race_weights", "gumbel_max", "inverse_cdf", "uniform_tokens", "draw_counts"]


def race_weights(u: torch.Tensor) -> torch.Tensor:
    """``exp(g)`` of standard Gumbel noise ``g = -log(-log u)``, i.e. ``1 / -log u`` (...) float64,
    from float64 uniforms ``u`` (...) in [0, 1): :func:`gumbel_max` multiplies by it."""
    return 1.0 / -torch.log(u.clamp(1e-300, 1 - 1e-16))


def gumbel_max(p: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Gumbel-max sampling ``argmax(log p + g)`` computed as ``argmax(p exp(g))`` (the same token,
    no logarithm of p): p (..., V), weights (..., V) float64 of :func:`race_weights` -> (...) int64."""
    return (p.double() * weights).argmax(-1)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Inverse-CDF sampling in two levels: probs (..., V) >= 0 (any scale), u (...) float64 in
    [0, 1) -> (...) int64, the first token whose cumulative probability exceeds ``u * total`` (as
    :func:`ambiguity.sampling.invert`), with float64 sums over blocks of ``block`` codes and a
    float64 running sum inside the one block the target falls in, instead of a float64 running sum
    over the whole vocabulary (the slow part of drawing every window position at once). A zero-
    probability token is never returned; ``u ~ U[0, 1)`` gives ``v`` with probability
    ``p(v) / total`` up to float64 rounding."""
    V = probs.shape[-1]
    flat = probs.reshape(-1, V)
    if V % block:
        flat = torch.nn.functional.pad(flat, (0, block - V % block))
    rows = flat.view(flat.shape[0], flat.shape[1] // block, block)
    ends = rows.sum(-1, dtype=torch.float64).cumsum(-1)  # (R, blocks) cumulative mass at block ends
    x = u.reshape(-1, 1).double() * ends[:, -1:]
    k = torch.minimum(  # the block the target falls in, at most the last block with mass
        torch.searchsorted(ends, x, right=True), torch.searchsorted(ends, ends[:, -1:].contiguous(), right=False)
    )
    y = x - torch.where(k > 0, ends.gather(1, (k - 1).clamp(min=0)), torch.zeros_like(x))
    inner = rows.gather(1, k[..., None].expand(-1, -1, block))[:, 0].double().cumsum(-1)  # (R, block)
    last = torch.searchsorted(inner, inner[:, -1:].contiguous(), right=False)  # the block's last positive token
    j = torch.minimum(torch.searchsorted(inner, y, right=True), last)
    return (k * block + j)[:, 0].clamp(max=V - 1).view(probs.shape[:-1])


def uniform_tokens(u: torch.Tensor, V: int) -> torch.Tensor:
    """A uniformly random token per uniform (...) int64: ``floor(u V)`` (the inverse CDF of the
    uniform distribution over ``V`` codes; a new window position's ``random`` initialisation)."""
    return (u * V).floor().long().clamp(max=V - 1)


def draw_counts(k_init, g, greedy: bool):
    """Uniforms a slot draws from its stream per Jacobi step, in this order: ``k_init`` for its
    random new window positions, then (sampling only) ``g`` acceptance coins (one per draft,
    position ``j`` the coin of draft ``j``) and ``g + 1`` inverse-CDF uniforms (position ``j``
    draws the residual, the bonus or the next draft there). Numpy (B,) int64 in, out."""
    k_init, g = np.asarray(k_init), np.asarray(g)
    return k_init if greedy else k_init + 2 * g + 1


@dataclass
class _Windows:
    """Every slot's draft window (B slots, W = L - 1 columns; column i is position ``n_b + i``).

    tok (B, W) int64; q (B, W, V) the distribution each draft was drawn from (ignored where
    ``point``); point (B, W) bool, a new position (point-mass q); q_top1 (B, W); proposed (B, W)
    int64 the step that sampled the draft (-1: new). Host (B,) int64: ``length`` drafts carried
    over from the last step, ``noised`` the first position without Gumbel noise (SCD gumbel;
    ``noise`` (B, L, V) float64 holds position t's :func:`race_weights` at row ``t % L``)."""

    tok: torch.Tensor
    q: torch.Tensor
    point: torch.Tensor
    q_top1: torch.Tensor
    proposed: torch.Tensor
    length: np.ndarray
    noised: np.ndarray
    noise: Optional[torch.Tensor]

    def select(self, rows) -> None:
        """Keep the slots ``rows`` (int64 numpy), renumbered 0.. (a draining batch)."""
        r = torch.as_tensor(rows, device=self.tok.device)
        for name in ("tok", "q", "point", "q_top1", "proposed"):
            setattr(self, name, getattr(self, name)[r])
        self.noise = None if self.noise is None else self.noise[r]
        self.length, self.noised = self.length[rows], self.noised[rows]


def _new_windows(B: int, W: int, V: int, p0: torch.Tensor, gumbel: bool) -> _Windows:
    dev = p0.device
    return _Windows(
        tok=torch.zeros(B, W, dtype=torch.long, device=dev),
        q=torch.zeros(B, W, V, dtype=p0.dtype, device=dev),
        point=torch.ones(B, W, dtype=torch.bool, device=dev),
        q_top1=torch.ones(B, W, dtype=p0.dtype, device=dev),
        proposed=torch.full((B, W), -1, dtype=torch.long, device=dev),
        length=np.zeros(B, dtype=np.int64),
        noised=np.zeros(B, dtype=np.int64),
        noise=torch.zeros(B, W + 1, V, dtype=torch.float64, device=dev) if gumbel else None,
    )


# --------------------------------------------------------------------------- before the forward
def _top_up(st: BatchState, win: _Windows, g: np.ndarray, active: np.ndarray, config: JacobiConfig, width: int, greedy):
    """Shrink every window to its ``g_b`` drafts and fill its new positions (``random``: a uniform
    token, ``repeat-horizon``: the token to the left, random in the first grid column). Draws each
    live slot's uniforms for the step (:func:`draw_counts`; scripted slots draw their new tokens
    from their :class:`~lantern.engine.slots.Draws`). Returns the uniforms (B, >= 1) float64 and
    ``k_init`` (B,) int64 numpy."""
    (B, W), V = win.tok.shape, win.q.shape[-1]
    dev, n = st.device, st.n
    cols = np.arange(W)[None, :]
    pos = n[:, None] + cols
    kept = np.minimum(win.length, g)
    new = (cols >= kept[:, None]) & (cols < g[:, None])
    rand = new & (pos % width == 0) if config.init == "repeat-horizon" else new
    k_init = rand.sum(1)
    scripted = np.array([d is not None for d in st.streams.scripted])
    counts = np.where(active & ~scripted, draw_counts(k_init, g, greedy), 0)
    U = row_uniforms(st.streams.gens, counts, torch.float64, dev, fill=0.5)
    if U.shape[1] == 0:
        U = torch.full((B, 1), 0.5, dtype=torch.float64, device=dev)
    ridx = torch.as_tensor(np.clip(np.cumsum(rand, 1) - 1, 0, U.shape[1] - 1), device=dev)
    fresh = uniform_tokens(U.gather(1, ridx), V)
    for b in np.flatnonzero(scripted & rand.any(1)):  # exact enumeration: the Draws pick the new tokens
        ones = torch.ones(V, dtype=torch.float64, device=dev)
        for i in np.flatnonzero(rand[b]):
            fresh[b, i] = st.streams.scripted[b].categorical(ones)
    new_t, rand_t = torch.as_tensor(new, device=dev), torch.as_tensor(rand, device=dev)
    tok = torch.where(rand_t, fresh, win.tok)
    if config.init == "repeat-horizon":  # a copy of position s - 1, or of the random token at s
        s = np.maximum((n + kept)[:, None], pos - pos % width)
        src = torch.as_tensor(np.clip(np.where(s % width == 0, s - n[:, None] + 1, s - n[:, None]), 0, W), device=dev)
        ext = torch.cat([st.tokens.gather(1, torch.as_tensor(n - 1, device=dev)[:, None]), tok], 1)
        tok = torch.where(new_t & ~rand_t, ext.gather(1, src), tok)
    win.tok = tok
    win.point = win.point | new_t
    win.proposed = torch.where(new_t, -1, win.proposed)
    win.q_top1 = torch.where(new_t, torch.ones_like(win.q_top1), win.q_top1)
    return U, k_init


def _draw_noise(st: BatchState, win: _Windows, upto: np.ndarray, rows) -> None:
    """SCD gumbel: Gumbel noise (V,) for every position up to ``upto[b]`` (a slot's bonus position
    ``n_b + g_b``; 0 for a new image's first token) not yet noised, for the slots ``rows``, drawn
    from the slot's stream after its uniforms and kept per absolute position for the whole image."""
    L, V = win.noise.shape[1], win.noise.shape[2]
    for b in rows:
        lo, hi = int(win.noised[b]), int(upto[b]) + 1
        if hi > lo:
            u = torch.rand(hi - lo, V, generator=st.streams.gens[b], device=st.device, dtype=torch.float64)
            win.noise[b, torch.arange(lo, hi, device=st.device) % L] = race_weights(u)
            win.noised[b] = hi


# --------------------------------------------------------------------------- after the forward
@dataclass
class _Step:
    """One step's device tensors over B slots (gmax = the longest window this step)."""

    p: torch.Tensor  # (B, gmax + 1, V) target distributions at positions n .. n + gmax
    drafts: WindowDrafts  # the judged window (B, gmax)
    g: torch.Tensor  # (B,) int64 drafts per slot
    cols: dict  # the rule's (B, gmax) columns
    ok: torch.Tensor  # (B, gmax) bool: each draft's test, also where it was not reached
    u_coin: torch.Tensor  # (B, gmax) float64 the coins (NaN where greedy or scripted)
    u_draw: torch.Tensor  # (B, gmax + 1) float64 the inverse-CDF uniforms of positions 0 .. gmax


def _columns_at(U: torch.Tensor, first: np.ndarray, width: int) -> torch.Tensor:
    """U's columns ``first_b .. first_b + width - 1`` of each row (B, width), clipped to U."""
    idx = np.clip(np.asarray(first)[:, None] + np.arange(width)[None, :], 0, U.shape[1] - 1)
    return U.gather(1, torch.as_tensor(idx, device=U.device))


def _judge(m: Jacobi, st: BatchState, p: torch.Tensor, win: _Windows, g: np.ndarray, U, k_init) -> _Step:
    """Every draft's acceptance probability and record columns (the rule of :data:`JACOBI_RULES`),
    and its test: a coin ``u < accept_prob`` or, greedy, the rule's greedy test."""
    gmax = p.shape[1] - 1
    d = WindowDrafts(win.tok[:, :gmax], win.q[:, :gmax], win.point[:, :gmax])
    pj = p[:, :gmax]
    cols = m.rule.judge(pj, d, m.config, m.emb)
    u_coin = _columns_at(U, k_init, gmax)
    u_draw = _columns_at(U, k_init + g, gmax + 1)
    if st.sampling.greedy:
        ok, u_coin = m.rule.greedy(pj, d, m.config, m.emb), torch.full_like(u_coin, float("nan"))
        cols["accept_prob"] = ok.to(pj.dtype)  # greedy: the test is the verdict
    else:
        ok = u_coin < cols["accept_prob"].double()
    step = _Step(p, d, torch.as_tensor(g, device=st.device), cols, ok, u_coin, u_draw)
    if any(s is not None for s in st.streams.scripted) and not st.sampling.greedy:
        _script_coins(st, step, g)
    return step


def _script_coins(st: BatchState, step: _Step, g: np.ndarray) -> None:
    """Scripted slots (exact enumeration) walk their coins through the acceptance probabilities
    until the first rejection (:class:`~lantern.engine.slots.Draws`); their coins read NaN."""
    prob = step.cols["accept_prob"].double().cpu()
    for b, d in enumerate(st.streams.scripted):
        if d is None:
            continue
        step.ok[b] = False
        step.u_coin[b] = float("nan")
        for j in range(int(g[b])):
            step.ok[b, j] = ok = d.coin(float(prob[b, j]))
            if not ok:
                break


def _next_token(m: Jacobi, st: BatchState, s: _Step, win: _Windows):
    """The accepted prefix ``a`` (B,) and the token after it (B,): the residual at the first
    rejection, else the bonus (Gumbel-max for SCD gumbel), argmax when greedy."""
    B, gmax = s.ok.shape
    rows = torch.arange(B, device=st.device)
    reached = s.ok & (torch.arange(gmax, device=st.device) < s.g[:, None])
    a = reached.long().cumprod(-1).sum(-1)
    pa = s.p[rows, a]
    if st.sampling.greedy:
        return a, pa.argmax(-1)
    rejected = a < s.g
    if gmax:
        at = a.clamp(max=gmax - 1)
        q_at = WindowDrafts(s.drafts.tokens[rows, at, None], s.drafts.q[rows, at, None], s.drafts.point[rows, at, None])
        dist = torch.where(rejected[:, None], m.rule.residual(pa, q_at.q_full()[:, 0].to(pa.dtype)), pa)
    else:
        dist = pa
    nxt = inverse_cdf(dist, s.u_draw[rows, a])
    if win.noise is not None:
        at_noise = win.noise[rows, (torch.as_tensor(st.n, device=st.device) + a) % win.noise.shape[1]]
        nxt = torch.where(rejected, nxt, gumbel_max(pa, at_noise))
    for b, d in enumerate(st.streams.scripted):
        if d is not None and st.image[b] >= 0 and not (win.noise is not None and not bool(rejected[b])):
            nxt[b] = d.categorical(dist[b])
    return a, nxt


def _samples(m: Jacobi, st: BatchState, s: _Step, win: _Windows, a: torch.Tensor):
    """This forward's samples at positions ``n + 1 .. n + gmax`` (B, gmax), the next drafts where
    past ``a``: argmax (greedy), Gumbel-max with the position's noise (SCD gumbel), the maximal
    coupling of the old draft and ``p`` (SCD maximal: the draft's own test keeps it, else the
    residual is drawn; the bonus position is drawn from ``p``), or inverse CDF. Also (B, gmax)
    bool: the draft was kept by the coupling."""
    B, T, V = s.p.shape
    P = s.p[:, 1:]
    keep = torch.zeros(B, T - 1, dtype=torch.bool, device=st.device)
    if st.sampling.greedy:
        S = P.argmax(-1)
    elif win.noise is not None:
        L = win.noise.shape[1]
        at = (torch.as_tensor(st.n, device=st.device)[:, None] + torch.arange(1, T, device=st.device)) % L
        rows = (torch.arange(B, device=st.device)[:, None] * L + at).reshape(-1)
        noise = win.noise.reshape(B * L, V).index_select(0, rows).view(B, T - 1, V)
        S = noise.mul_(P).argmax(-1)
    else:
        S = inverse_cdf(P, s.u_draw[:, 1:])
        if m.maximal and T > 2:
            j = torch.arange(1, T - 1, device=st.device)
            d = WindowDrafts(s.drafts.tokens[:, 1:], s.drafts.q[:, 1:], s.drafts.point[:, 1:])
            res = inverse_cdf(m.rule.residual(P[:, :-1], d.q_full().to(P.dtype)), s.u_draw[:, 1:-1])
            keep[:, :-1] = s.ok[:, 1:] & (j < s.g[:, None])
            coupled = torch.where(keep[:, :-1], d.tokens, res)
            S[:, :-1] = torch.where(j < s.g[:, None], coupled, S[:, :-1])
    if any(d is not None for d in st.streams.scripted):
        _script_samples(m, st, s, win, a, S, keep)
    return S, keep


def _script_samples(m: Jacobi, st: BatchState, s: _Step, win: _Windows, a, S, keep) -> None:
    """Scripted slots draw their next drafts ``j = a + 1 .. g`` from their Draws: the maximal
    coupling's coin and residual, or a draw from ``p_j`` (argmax and Gumbel-max need no draw)."""
    if st.sampling.greedy or (win.noise is not None):
        return
    for b, d in enumerate(st.streams.scripted):
        if d is None or st.image[b] < 0:
            continue
        g, ab = int(s.g[b]), int(a[b])
        for j in range(ab + 1, g + 1):
            if m.maximal and j < g:
                dj = WindowDrafts(s.drafts.tokens[b, j, None], s.drafts.q[b, j, None], s.drafts.point[b, j, None])
                keep[b, j - 1] = kept = d.coin(float(s.cols["accept_prob"][b, j]))
                if not kept:
                    S[b, j - 1] = d.categorical(m.rule.residual(s.p[b, j], dj.q_full()[0].to(s.p.dtype)))
                else:
                    S[b, j - 1] = s.drafts.tokens[b, j]
            else:
                S[b, j - 1] = d.categorical(s.p[b, j])


def _advance(m: Jacobi, st: BatchState, s: _Step, win: _Windows, a, S, keep, top1) -> None:
    """The next window: this forward's samples at positions ``n + a + 1 .. n + g`` with ``q = p``
    there (``maximal-official``: a kept draft keeps its old q), proposed by this step."""
    B, T, V = s.p.shape
    W = win.tok.shape[1]
    jc = (a[:, None] + 1 + torch.arange(W, device=st.device)).clamp(max=T - 1)  # (B, W) positions in p
    rows = (torch.arange(B, device=st.device)[:, None] * T + jc).reshape(-1)
    tok = S.gather(1, (jc - 1).clamp(min=0, max=max(T - 2, 0))) if T > 1 else win.tok
    q = s.p.reshape(B * T, V).index_select(0, rows).view(B, W, V)
    point = torch.zeros_like(win.point)
    q_top1 = top1.gather(1, jc)
    if m.config.coupling == "maximal-official" and T > 1:
        wc = jc.clamp(max=W - 1)
        kept = keep.gather(1, (jc - 1).clamp(max=T - 2)) & (jc < s.g[:, None])
        old = win.q.reshape(B * W, V).index_select(0, (torch.arange(B, device=st.device)[:, None] * W + wc).reshape(-1))
        q = torch.where(kept[..., None], old.view(B, W, V), q)
        point = kept & win.point.gather(1, wc)
        q_top1 = torch.where(kept, win.q_top1.gather(1, wc), q_top1)
    win.tok, win.q, win.point, win.q_top1 = tok, q, point, q_top1
    win.proposed = torch.as_tensor(st.step, device=st.device)[:, None].expand(B, W).clone()


def _commit(st: BatchState, drafts: torch.Tensor, a: torch.Tensor, nxt: torch.Tensor) -> None:
    """Write every slot's accepted drafts and next token (``x_n .. x_{n+a}``) into st.tokens."""
    T = drafts.shape[1] + 1
    ar = torch.arange(T, device=st.device)
    cand = torch.cat([drafts, nxt[:, None]], 1).scatter(1, a[:, None], nxt[:, None])
    at = torch.as_tensor(st.n, device=st.device)[:, None] + ar
    st.tokens.scatter_(1, at, torch.where(ar[None, :] <= a[:, None], cand, st.tokens.gather(1, at)))


def _to_host(s: _Step, a, nxt, win_proposed, win_q_top1, top1, ent, last: bool = False) -> dict:
    """The step's accepted lengths, next tokens and kinds, with ``last`` the entropy of the distribution
    each next token was drawn from (``ent`` (B, >= gmax), the entropy of p at each position, read at
    ``a``; as ``h_last``), and its (B, gmax) draft columns (judged drafts, up to the first rejection,
    carry their verdicts; later ones NaN, ``j_star`` 0, ``accepted`` False) as numpy arrays, moved to
    the CPU in one transfer."""
    B, gmax = s.ok.shape
    kind = torch.where(s.g == 0, 0, torch.where(a == s.g, 1, 2))
    head = [a, nxt, kind] + ([ent[torch.arange(B, device=a.device), a]] if last else [])
    parts = [torch.stack([x.double() for x in head], 1)]
    if gmax:
        j = torch.arange(gmax, device=a.device)
        judged = (j <= a[:, None]) & (j < s.g[:, None])
        nan = lambda x: torch.where(judged, x.double(), float("nan"))
        pj = s.p[:, :gmax]
        draft = {
            "token": s.drafts.tokens,
            "p_draft": pj.gather(-1, s.drafts.tokens[..., None])[..., 0],
            "q_draft": s.drafts.q_draft(),
            "p_tilde": nan(s.cols["p_tilde"]),
            "j_star": torch.where(judged, s.cols["j_star"], 0),
            "spent": nan(s.cols["spent"]),
            "accept_prob": nan(s.cols["accept_prob"]),
            "u": nan(s.u_coin),
            "accepted": s.ok & judged,
            "p_top1": top1[:, :gmax],
            "p_entropy": ent[:, :gmax],
            "q_top1": win_q_top1[:, :gmax],
            "proposed_step": win_proposed[:, :gmax],
        }
        parts += [x.double() for x in draft.values()]
    flat = torch.cat([x.reshape(B, -1) for x in parts], 1).cpu().numpy()
    host = {name: flat[:, i].astype(np.int64) for i, name in enumerate(("a", "next", "kind"))}
    if last:
        host["h_last"] = flat[:, 3]
    h = len(head)
    for i, name in enumerate(("token", *CHAIN_VALUES, "proposed_step") if gmax else ()):
        host[name] = flat[:, h + i * gmax : h + (i + 1) * gmax]
    return host


class Jacobi(Method):
    """SJD, GSD, SCD or entropy-aware SJD on the engine (module docstring): every slot's window
    in one target forward, verified in one tensor pass.

    Image ``b`` at ``n_b`` committed tokens feeds ``[x_{n_b-1}, d_{n_b} .. d_{n_b+g_b-1}]`` at its
    own cache slots and positions (rows padded to the longest window, padding never seen) and
    commits its own accepted prefix ``a_b + 1``. The rule (:data:`lantern.rules.jacobi.JACOBI_RULES`)
    judges all (B, g) drafts at once; coins, the accepted prefix (cumulative product), the
    residual / bonus token, the next drafts of every position and the record columns are tensor
    operations, with one host transfer per step. Each slot draws its uniforms from its image's own
    stream (:func:`draw_counts`), or, scripted, from its :class:`~lantern.engine.slots.Draws`.

    config: the :class:`~lantern.methods.jacobi.config.JacobiConfig`; model: the target (GSD's
    embedding-distance filter reads its input embeddings); pairs: a list that receives ``(p, q)``
    (V,) float32 CPU pairs of every judged draft (for :func:`gsd_output_distribution`).
    """

    def __init__(
        self,
        config: JacobiConfig,
        model: TokenModel,
        pairs: Optional[list] = None,
        policy: Optional[WindowPolicy] = None,
    ):
        self.config, self.pairs, self.rule, self.policy = config, pairs, JACOBI_RULES[config.method], policy
        self.name, self.depth, self.spare = config.method, int(config.window) - 1, int(config.window)
        self.emb = model.input_embeddings() if config.method == "gsd" and config.distance is not None else None
        self.gumbel = config.method == "scd" and config.coupling == "gumbel"
        self.maximal = config.method == "scd" and config.coupling.startswith("maximal")
        self.width = int(tuple(getattr(model, "grid", (1, model.num_tokens)))[-1])
        self.win: Optional[_Windows] = None
        self.dynamic = config.entropy_dynamic
        self.lengths = np.zeros(0, dtype=np.int64)  # (B,) each slot's window L_b for its next forward

    def open(self, st: BatchState) -> None:
        self.win = None  # allocated at the first admission (the distribution's dtype and V)
        self.lengths = np.full(st.B, int(self.config.window), dtype=np.int64)
        if self.policy is not None:
            fixed = Jacobi(self.config.replace(window=min(4, int(self.config.window)), auto=False), st.model)
            engine = lambda images: engine_rounds(st, images, AR(), fixed)
            self.policy.open(st.model, st.sampling, st.B, self.config.method, engine)

    def _plain_round(self, st: BatchState) -> Round:
        """A forward of window 1: AR's step (:func:`lantern.methods.ar.ar_round`). The drafts carried
        over are stale after it (their positions moved), so the next window starts afresh."""
        self.win.length[:] = 0
        self.win.noised = np.maximum(self.win.noised, st.n + 1)  # SCD gumbel: the committed position needs none
        return ar_round(st)

    def _window_for(self, h) -> np.ndarray:
        """The windows (k,) int64 for target entropies ``h`` (k,) nats: :func:`entropy_window`
        between the configured shortest window (at most L) and L."""
        c = self.config
        return entropy_window(h, int(c.window), min(int(c.entropy_min_window), int(c.window)), c.entropy_window_scale)

    def start(self, st: BatchState, slots: list[int], p0: torch.Tensor) -> torch.Tensor:
        gumbel = self.gumbel and not st.sampling.greedy
        if self.win is None:
            self.win = _new_windows(st.B, self.depth, p0.shape[-1], p0, gumbel)
        self.win.length[slots], self.win.noised[slots] = 0, 0
        if self.dynamic:  # the first window reads the entropy of the first token's distribution
            self.lengths[slots] = self._window_for(entropy(p0).double().cpu().numpy())
        if not gumbel:
            return super().start(st, slots, p0)
        _draw_noise(st, self.win, np.zeros(st.B, dtype=np.int64), slots)
        noise = self.win.noise[torch.as_tensor(slots, device=st.device), 0]
        return gumbel_max(p0, noise)

    def round(self, st: BatchState, active: np.ndarray) -> Round:
        win, greedy = self.win, st.sampling.greedy
        lengths = self.lengths
        if self.policy is not None:
            L = self.policy.plan(st.rows)
            if L == 1:
                return self._plain_round(st)
            lengths = np.minimum(lengths, L)
        g = np.where(active, np.minimum(lengths - 1, st.N - 1 - st.n), 0)
        live = np.flatnonzero(active)
        with st.timer("acceptance"):
            U, k_init = _top_up(st, win, g, active, self.config, self.width, greedy)
            if win.noise is not None:
                _draw_noise(st, win, st.n + g, live)
            vin = torch.cat([st.tokens.gather(1, torch.as_tensor(st.n - 1, device=st.device)[:, None]), win.tok], 1)
        with st.timer("target"):
            out = verify_chains(st.model, st.cache, vin[:, : int(g.max()) + 1], st.n, st.N, st.guided)
        with st.timer("acceptance"):
            p = st.target(out.logits)  # (B, gmax + 1, V)
            s = _judge(self, st, p, win, g, U, k_init)
            a, nxt = _next_token(self, st, s, win)
            S, keep = _samples(self, st, s, win, a)
            _commit(st, s.drafts.tokens, a, nxt)
            top1 = top1_prob(p)
            proposed, q_top1 = win.proposed, win.q_top1
            _advance(self, st, s, win, a, S, keep, top1)
            ent = entropy(s.p if self.dynamic else s.p[:, : int(g.max())])  # entropy-sd reads it at a (<= g)
            host = _to_host(s, a, nxt, proposed, q_top1, top1, ent, self.dynamic)  # the step's one host transfer
        win.length = np.where(active, g - host["a"], 0)
        if self.policy is not None:
            sampled = host["proposed_step"][live] >= 0 if g.max() else np.zeros((len(live), 0), dtype=bool)
            self.policy.observe(g[live], host["a"][live], sampled)
        if self.dynamic:  # the next window reads the entropy where the newest token was drawn
            self.lengths = np.where(active, self._window_for(host["h_last"]), self.lengths)
        if self.pairs is not None:
            self._keep_pairs(s, host, live)
        cols = None
        if g.max():
            values = {c: host[c][live] for c in host if c not in ("a", "kind", "next")}
            cols = chain_rows(values, st.image[live], st.step[live], st.n[live], g[live], host["a"][live])
        return Round(host["a"], g, host["kind"], host["next"], np.zeros(st.B, dtype=np.int64), cols)

    def _keep_pairs(self, s: _Step, host: dict, live) -> None:
        """``(p, q)`` of every judged draft, float32 on the CPU (for the distortion measurements)."""
        q = s.drafts.q_full()
        for b in live:
            for j in range(min(int(host["a"][b]) + 1, int(s.g[b]))):
                self.pairs.append((s.p[b, j].float().cpu(), q[b, j].float().cpu()))

    def compact(self, st: BatchState, live: np.ndarray, rows: torch.Tensor) -> None:
        if self.win is not None:
            self.win.select(live)
        self.lengths = self.lengths[live]
