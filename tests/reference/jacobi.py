"""Training-free parallel decoding by Jacobi iteration of the target itself: SJD, GSD and SCD.

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
* ``"gsd"`` — Grouped Speculative Decoding (So et al., ICCV 2025, arXiv 2508.07747; official
  code github.com/junhyukso/GSD, ``scheduler/jacobi_iteration_lumina_mgpt.py``): as SJD, but a
  draft ``x`` is judged by the mass of a *group* ``G(x)`` of tokens the target ranks next to it:
  accepted with probability ``min(1, p(G)/q(G))``. ``G(x)``: the ``group`` tokens around ``x`` in
  the target's ascending probability order (ranks ``r-group//2 .. r-group//2+group-1``; the
  official code slices ``[r-7, r+7)``, ``group = 14``) whose probability differs from ``p(x)`` by
  less than ``prob_gap`` (official 0.15), optionally also within a squared L2 distance
  ``distance`` of ``x``'s input embedding (official 0.5 on Chameleon's table; off here by default,
  its scale is model-specific). Rejection resamples the plain SJD residual (as the official code).
  Not lossless: :func:`gsd_output_distribution` gives one step's output exactly.
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

:func:`jacobi_decode`: one condition at a time (two rows with CFG), like :mod:`lantern.chain`.
:func:`batched_jacobi_decode` (``decode(..., batch_size=B)``): up to B images per target forward,
each at its own position with its own window, committing its own accepted prefix (ragged
commits in per-image cache slots, with the masks of :mod:`lantern.batched` and the slot scheduler
of :mod:`lantern.slots`). Both run the same per-image steps (:class:`_Image`). Randomness: image
``i`` draws from its generator ``(seed, i)`` (:mod:`ambiguity.seeding`) through
:class:`lantern.trees.Draws`, the same numbers in the same order at any batch size; in float64
batched tokens and records equal batch 1's.

Records (:mod:`lantern.records`): one step row per Jacobi forward (``drafted`` = window drafts,
``accepted`` = accepted prefix, ``drafter_forwards = 0``), one draft row per window draft with
``proposed_step`` = the Jacobi iteration (step) whose forward sampled it, or -1 for an initialised
position; for GSD ``p_tilde = p(G)``, ``j_star = |G| - 1`` and ``spent = p(G) - p(x)``.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from ambiguity.models.base import Prompt, TokenModel
from ambiguity.sampling import SamplingConfig, expand_rows
from ambiguity.stats import entropy, top1_prob
from lantern.engine.records import Decoded
from lantern.methods.jacobi.config import JacobiConfig, check_jacobi
from lantern.methods.jacobi.method import inverse_cdf
from lantern.rules.jacobi import (
    entropy_acceptance,
    entropy_threshold,
    group_masses,
    gsd_accept_prob,
    sjd_accept_prob,
    sjd_residual,
)
from reference.records import StepLog
from reference.steps import Timer, check_prompt, elapsed_since, image_row, prefill, target_distribution
from reference.trees import Draws, GeneratorDraws

__all__ = ["jacobi_decode"]


# --------------------------------------------------------------------------- the decoder
class _Window:
    """Draft tokens for positions ``start, start+1, ...``: token, the distribution it was drawn
    from (None: a point mass, an initialised position) and the step that proposed it (-1: init)."""

    def __init__(self):
        self.tokens: list[int] = []
        self.q: list[Optional[torch.Tensor]] = []
        self.proposed: list[int] = []

    def __len__(self):
        return len(self.tokens)

    def set(self, tokens, q, proposed):
        self.tokens, self.q, self.proposed = list(tokens), list(q), list(proposed)

    def add(self, token: int, q: Optional[torch.Tensor], proposed: int):
        self.tokens.append(int(token))
        self.q.append(q)
        self.proposed.append(proposed)


class _Gumbel:
    """SCD's Gumbel noise, one (V,) vector per absolute position, drawn from the image's stream
    when the position first enters a window (its bonus position or a draft) and reused by every
    later iteration."""

    def __init__(self, generator: Optional[torch.Generator], V: int, device):
        self.generator, self.V, self.device, self.noise = generator, V, device, {}

    def ensure(self, upto: int) -> None:
        """Noise for every position up to ``upto`` not drawn yet (one call for all of them)."""
        lo = len(self.noise)
        if upto < lo:
            return
        u = torch.rand(upto + 1 - lo, self.V, generator=self.generator, device=self.device, dtype=torch.float64)
        for t in range(lo, upto + 1):
            self.noise[t] = 1.0 / -torch.log(u[t - lo].clamp(1e-300, 1 - 1e-16))  # exp of Gumbel noise

    def sample(self, p: torch.Tensor, position: int) -> int:
        self.ensure(position)
        return int((p.double() * self.noise[position]).argmax())  # argmax(log p + g) = argmax(p exp(g))


def _draw(p: torch.Tensor, position: int, greedy: bool, draws: Draws, gumbel: Optional[_Gumbel]) -> int:
    """A target sample at ``position``: argmax (greedy), Gumbel-max (SCD gumbel) or from ``draws``."""
    if greedy:
        return int(p.argmax())
    if gumbel is not None:
        return gumbel.sample(p, position)
    return draws.categorical(p)


def _judge(
    p: torch.Tensor, q: torch.Tensor, token: int, config: JacobiConfig, greedy: bool, embeddings: Optional[torch.Tensor]
) -> dict:
    """Verdict inputs of one draft: acceptance probability (0/1 when greedy) and record columns."""
    px = float(p[token])
    qx = float(q[token])
    cols = dict(p_draft=px, q_draft=qx, p_tilde=px, j_star=0, spent=0.0)
    if config.method == "gsd":
        pg, qg, cnt = group_masses(p, q, config.group, config.prob_gap, embeddings, config.distance)
        cols.update(p_tilde=float(pg[token]), j_star=int(cnt[token]) - 1, spent=float(pg[token]) - px)
        if greedy:
            top = int(p.argmax())
            in_group = _in_group(p, token, top, config, embeddings)
            cols["accept_prob"] = float(token == top or in_group)
        else:
            cols["accept_prob"] = float(gsd_accept_prob(pg[token], qg[token]))
    elif greedy:
        cols["accept_prob"] = float(token == int(p.argmax()))
    else:
        cols["accept_prob"] = float(sjd_accept_prob(p, q, torch.tensor(token, device=p.device)))
    if config.method == "entropy-sd":  # min(1, p(x) / (tau(H) q(x))), arXiv 2510.09012
        tau = entropy_threshold(entropy(p).to(p.dtype), config.entropy_alpha, config.entropy_floor)
        relaxed = float(p[token] / tau)
        cols.update(p_tilde=relaxed, spent=relaxed - px)
        if not greedy:
            acc = entropy_acceptance(p, q, config.entropy_alpha, config.entropy_floor)
            cols["accept_prob"] = float(acc[token])
    return cols


def _in_group(p: torch.Tensor, x: int, y: int, config: JacobiConfig, embeddings) -> bool:
    """Is ``y`` in GSD's group of ``x`` (:func:`group_masses`' definition)?"""
    order = torch.sort(p, stable=True).indices
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=p.device))
    lo = int(rank[x]) - config.group // 2
    if not lo <= int(rank[y]) < lo + config.group or not abs(float(p[y]) - float(p[x])) < config.prob_gap:
        return False
    if config.distance is not None:
        e = embeddings.double()
        return float(((e[y] - e[x]) ** 2).sum()) < config.distance
    return True


def _point(V: int, token: int, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(V, dtype=like.dtype, device=like.device).scatter_(
        0, torch.tensor([token], device=like.device), 1.0
    )


class _StepDraws:
    """Where one Jacobi step of one image takes its random numbers. From the image's generator:
    one block of uniforms drawn at the start of the step, ``k`` for the random new window
    positions, then (sampling) ``g`` coins (coin ``j`` for draft ``j``, also the maximal coupling's
    test of the draft at ``j`` when it was not reached) and ``g + 1`` inverse-CDF uniforms (``j``
    for the token drawn at position ``j``, :func:`lantern.methods.jacobi.method.inverse_cdf`).
    Scripted (exact enumeration): the Draws, in decision order."""

    def __init__(self, draws: Draws, generator, scripted: bool, k: int, g: int, greedy: bool, device):
        self.draws, self.scripted, self.k, self.g, self.i, self.last_u = draws, scripted, k, g, 0, float("nan")
        count = k if greedy else k + 2 * g + 1
        self.u = [] if scripted else torch.rand(count, generator=generator, device=device, dtype=torch.float64).tolist()

    def init(self, V: int) -> int:
        if self.scripted:
            return self.draws.categorical(torch.ones(V, dtype=torch.float64))
        self.i += 1
        return min(int(self.u[self.i - 1] * V), V - 1)

    def coin(self, j: int, prob: float) -> bool:
        if self.scripted:
            return self.draws.coin(prob)
        self.last_u = self.u[self.k + j]
        return self.last_u < float(prob)

    def categorical(self, j: int, probs: torch.Tensor) -> int:
        if self.scripted:
            return self.draws.categorical(probs)
        u = torch.tensor(self.u[self.k + self.g + j], dtype=torch.float64, device=probs.device)
        return int(inverse_cdf(probs, u))


class _Image:
    """One image's Jacobi state and its per-iteration work, shared by :func:`jacobi_decode` (batch 1)
    and :func:`batched_jacobi_decode`: both call :meth:`start`, then per iteration :meth:`prepare`
    (top up the window), one target forward, :meth:`verify` (judge, commit, next drafts) and
    :meth:`commit` (records), so an image draws the same random numbers in the same order either way.

    Committed tokens are a Python list (no device sync to read ``x_{n-1}`` or a left neighbour)."""

    def __init__(
        self,
        model: TokenModel,
        sampling: SamplingConfig,
        config: JacobiConfig,
        N: int,
        draws: Draws,
        generator: Optional[torch.Generator],
        image: int,
        emb: Optional[torch.Tensor],
        pairs=None,
    ):
        self.config, self.N, self.V = config, N, model.vocab_size
        self.greedy, self.device, self.draws, self.emb, self.pairs = sampling.greedy, model.device, draws, emb, pairs
        self.generator, self.scripted = generator, not isinstance(draws, GeneratorDraws)
        self.width = int(tuple(getattr(model, "grid", (1, N)))[-1])
        scd_gumbel = config.method == "scd" and config.coupling == "gumbel"
        self.gumbel = _Gumbel(generator, self.V, model.device) if scd_gumbel else None
        self.maximal = config.method == "scd" and config.coupling.startswith("maximal")
        self.log, self.tokens, self.window, self.n, self.step = StepLog(image), [], _Window(), 1, 0

    @property
    def done(self) -> bool:
        return self.n >= self.N

    def start(self, p0: torch.Tensor) -> None:
        """The first token from the prefill's distribution p0 (V,)."""
        self.tokens = [_draw(p0, 0, self.greedy, self.draws, self.gumbel)]

    def prepare(self) -> list[int]:
        """Start an iteration: the window shrunk to ``g = min(L - 1, N - 1 - n)`` drafts and topped
        up with initialised positions; the step's random numbers drawn (:class:`_StepDraws`), then
        SCD's Gumbel noise up to the bonus position. Returns the forward's input
        ``[x_{n-1}, d_n .. d_{n+g-1}]``."""
        self.step += 1
        n, w = self.n, self.window
        self.g = g = min(int(self.config.window) - 1, self.N - 1 - n)  # the bonus position n + g stays inside
        w.set(w.tokens[:g], w.q[:g], w.proposed[:g])
        fresh = range(n + len(w), n + g)
        k = sum(1 for t in fresh if self.config.init != "repeat-horizon" or t % self.width == 0)
        self.rng = _StepDraws(self.draws, self.generator, self.scripted, k, g, self.greedy, self.device)
        while len(w) < g:
            w.add(self._init(n + len(w)), None, -1)
        if self.gumbel is not None and not self.greedy:
            self.gumbel.ensure(n + g)
        return [self.tokens[n - 1]] + w.tokens

    def _init(self, position: int) -> int:
        """A new window position: uniform random, or the token to its left (``repeat-horizon``,
        random in the first column)."""
        if self.config.init == "repeat-horizon" and position % self.width != 0:
            left = position - 1
            return self.tokens[left] if left < self.n else self.window.tokens[left - self.n]
        return self.rng.init(self.V)

    def verify(self, p: torch.Tensor) -> int:
        """Judge the window against this forward's ``p`` (g + 1, V) (positions n .. n + g), left to
        right up to the first rejection; commit the accepted prefix and the next token (residual or
        bonus); sample the next drafts. Returns the accepted length a."""
        n, g, w, V, rng, greedy = self.n, self.g, self.window, self.V, self.rng, self.greedy
        q_of = lambda j: w.q[j] if w.q[j] is not None else _point(V, w.tokens[j], p)
        cols, a = [], g
        for j in range(g):  # verify left to right; stop at the first rejection
            q = q_of(j)
            c = _judge(p[j], q, w.tokens[j], self.config, greedy, self.emb)
            ok = bool(c["accept_prob"] >= 1.0) if greedy else rng.coin(j, c["accept_prob"])
            c.update(u=rng.last_u if not greedy else float("nan"), accepted=ok)
            cols.append(c)
            if self.pairs is not None:
                self.pairs.append((p[j].float().cpu(), q.float().cpu()))
            if not ok:
                a = j
                break
        if a < g:
            nxt = int(p[a].argmax()) if greedy else rng.categorical(a, sjd_residual(p[a], q_of(a)))
        elif greedy or self.gumbel is None:
            nxt = int(p[g].argmax()) if greedy else rng.categorical(g, p[g])
        else:
            nxt = self.gumbel.sample(p[g], n + g)
        self.tokens += w.tokens[:a] + [nxt]
        new = _Window()  # the next drafts: this forward's samples at positions n + a + 1 .. n + g
        for j in range(a + 1, g + 1):
            if self.maximal and j < g and not greedy:
                qj, d = q_of(j), w.tokens[j]
                if rng.coin(j, float(sjd_accept_prob(p[j], qj, torch.tensor(d, device=p.device)))):
                    new.add(d, qj if self.config.coupling == "maximal-official" else p[j], self.step)
                else:
                    new.add(rng.categorical(j, sjd_residual(p[j], qj)), p[j], self.step)
            elif greedy or self.gumbel is None:
                new.add(int(p[j].argmax()) if greedy else rng.categorical(j, p[j]), p[j], self.step)
            else:
                new.add(self.gumbel.sample(p[j], n + j), p[j], self.step)
        self._pending = (p, cols, a, nxt, new)
        return a

    def commit(self, seconds: dict, batch_step: Optional[int] = None, active: int = 1) -> None:
        """Record the iteration (its seconds per section) and move past the committed tokens."""
        p, cols, a, nxt, new = self._pending
        g = self.g
        kind = "target" if g == 0 else ("bonus" if a == g else "residual")
        self.log.add_step(
            self.step,
            self.n,
            g,
            a,
            kind,
            nxt,
            seconds,
            _draft_columns(p[:g], self.window, cols, self.step) if g else None,
            drafter_forwards=0,
            batch_step=batch_step,
            active=active,
        )
        self.window, self._pending = new, None
        self.n += a + 1

    def result(self, condition, seed, seconds: dict, total: float) -> Decoded:
        """This image's :class:`Decoded` (tokens (1, N) int64 on the CPU)."""
        steps, drafts_tab = self.log.tables()
        images = image_row(self.log.image, _One(condition), seed, self.N, self.step, steps, seconds, total)
        return Decoded(
            torch.tensor([self.tokens], dtype=torch.long),
            steps,
            drafts_tab,
            images,
            self.config.method,
            int(self.config.window) - 1,
        )


class _One:
    """The one condition an images-table row names (:func:`lantern.steps.image_row`)."""

    def __init__(self, condition):
        self.conditions = [condition]


def _image(model, sampling, config, N, generator, image, draws=None, pairs=None) -> _Image:
    emb = model.input_embeddings() if config.method == "gsd" and config.distance is not None else None
    return _Image(
        model, sampling, config, N, draws or GeneratorDraws(generator, model.device), generator, image, emb, pairs
    )


@torch.no_grad()
def jacobi_decode(
    model: TokenModel,
    prompt: Prompt,
    sampling: SamplingConfig,
    config: JacobiConfig,
    generator: Optional[torch.Generator] = None,
    num_tokens: Optional[int] = None,
    image: int = 0,
    seed: Optional[int] = None,
    draws: Optional[Draws] = None,
    pairs: Optional[list] = None,
) -> Decoded:
    """Decode one image with SJD, GSD or SCD (module docstring): batch 1, CFG rows, any sampling.

    model: the target (:class:`TokenModel`, decoded on a :class:`~reference.cache.OneImageCache`); prompt: one
    condition (two rows with guidance); config: the method and its knobs; generator: the image's
    stream; draws: a :class:`lantern.trees.Draws` instead (exact enumeration in the tests; SCD's
    Gumbel noise still comes from ``generator``); pairs: a list that receives ``(p, q)`` (V,)
    float32 CPU pairs of every judged draft (for :func:`gsd_output_distribution`).
    Returns a :class:`~lantern.records.Decoded` (tokens (1, N); steps / drafts / images records).
    Raises :class:`UsageError` for a batch of conditions, a guidance mismatch or a config the model
    cannot run (:func:`check_jacobi`).
    """
    check_prompt(prompt, sampling)
    check_jacobi(config, model)
    N = int(num_tokens or model.num_tokens)
    guided = prompt.guided
    img = _image(model, sampling, config, N, generator, image, draws, pairs)
    timer = Timer(model.device)
    t_start = time.perf_counter()
    with timer("target"):
        cache, first = prefill(model, prompt, N)
    with timer("acceptance"):
        img.start(target_distribution(first.logits[:, -1], sampling, guided)[0])
    while not img.done:
        before = timer.snapshot()
        with timer("acceptance"):
            fed = torch.tensor([img.prepare()], dtype=torch.long, device=model.device)
        with timer("target"):
            out = cache.extend(expand_rows(fed, guided))
        with timer("acceptance"):
            a = img.verify(target_distribution(out.logits, sampling, guided)[0])  # (g + 1, V): positions n .. n + g
        with timer("target"):
            cache.rollback(img.n + a)  # keep x_0 .. x_{n+a-1}; x_{n+a} is fed next iteration
        img.commit(elapsed_since(timer, before))
    cond = prompt.conditions[0] if prompt.conditions else ""
    return img.result(cond, seed, timer.seconds, time.perf_counter() - t_start)


def _draft_columns(p: torch.Tensor, window: _Window, cols: list, step: int) -> dict:
    """Per-draft columns of one Jacobi step (g,): judged drafts carry their verdicts; drafts after
    the first rejection were not judged (NaN verdict columns, ``accepted`` False)."""
    g = p.shape[0]
    nan = float("nan")
    pad = lambda key, fill: [c[key] for c in cols] + [fill] * (g - len(cols))
    qs = window.q[:g]  # None: a point mass (an initialised draft)
    q_top1 = torch.tensor([float(q.max()) if q is not None else 1.0 for q in qs], dtype=torch.float64)
    toks = torch.tensor(window.tokens[:g], dtype=torch.long)
    q_draft = torch.tensor(
        [float(q[t]) if q is not None else 1.0 for q, t in zip(qs, window.tokens[:g])], dtype=torch.float64
    )
    p_cpu = p.detach().double().cpu()
    f = lambda key: torch.tensor(pad(key, nan), dtype=torch.float64)
    return dict(
        token=toks,
        p_draft=p_cpu.gather(-1, toks[:, None])[:, 0],
        q_draft=q_draft,
        p_tilde=f("p_tilde"),
        j_star=torch.tensor(pad("j_star", 0), dtype=torch.long),
        spent=f("spent"),
        accept_prob=f("accept_prob"),
        u=f("u"),
        accepted=torch.tensor(pad("accepted", False)),
        p_top1=top1_prob(p_cpu),
        p_entropy=entropy(p_cpu),
        q_top1=q_top1,
        proposed_step=torch.tensor(window.proposed[:g], dtype=torch.long),
    )
