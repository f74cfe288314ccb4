"""Speculative decoding of visual AR models with an EAGLE drafter and LANTERN's relaxed acceptance.

Small free functions in the order a decoder calls them (gpt-fast style):
:func:`prefill` (target prefix -> first token), :func:`draft` (a chain of γ draft tokens from
the drafter), :func:`verify` (one target forward over the last token and the drafts),
:func:`accept` (the acceptance rule -> accepted prefix and the next token),
:func:`speculative_decode` (the loop for one image), :func:`autoregressive_decode` (the
baseline), :func:`decode` (many images, one at a time, with records and optional pixels).
Every loop *returns* its statistics (:class:`lantern.records.Decoded`); nothing is logged.

Methods: ``"ar"`` (one target forward per token), ``"sd"`` (lossless speculative sampling,
Leviathan et al. 2023), ``"lantern"`` (TVD bound δ), ``"lantern-jsd"`` (JSD bound δ, nats),
``"lantern++"`` (relative bound λ) — the rules of :mod:`lantern.acceptance` (LANTERN, Jang et
al., ICLR 2025, arXiv 2410.03355, Sec. 3-4; LANTERN++, arXiv 2502.06352). Temperature 0 uses
the greedy rule (:func:`lantern.acceptance.verify_greedy`): the drafter drafts its argmax, and
with δ = 0 (or ``"sd"``) the tokens equal greedy AR decoding exactly.

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
4. Rollback: the target keeps ``x_0..x_{n+a-1}`` (``model.rollback(cache, n + a)``), the drafter
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

import contextlib
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from ambiguity.errors import UsageError
from ambiguity.generation import cfg_rows, make_generator
from ambiguity.models.base import Prompt, Step, TokenModel
from ambiguity.sampling import SamplingConfig, distribution, pick
from ambiguity.stats import entropy, top1_prob
from lantern.acceptance import METHODS as RULES
from lantern.acceptance import AcceptanceRule, Verdict, residual, verify as verify_rule, verify_greedy
from lantern.records import NEXT_KINDS, Decoded, StepLog

__all__ = ["METHODS", "DEFAULT_METRIC", "DecodeConfig", "Timer", "Acceptance", "prefill", "draft", "verify",
           "accept", "speculative_decode", "autoregressive_decode", "neighbour_table", "check_drafter", "decode"]

METHODS = ("ar",) + RULES
DEFAULT_METRIC = "l2"  # the official LANTERN code: Euclidean distance between codebook vectors (torch.cdist)


@dataclass(frozen=True)
class DecodeConfig:
    """What to decode with: method, draft length and the acceptance rule's parameters.

    method: one of :data:`METHODS`. gamma: draft tokens per verification (γ >= 1; unused by
    ``"ar"``). k, delta, lam, residual: see :class:`lantern.acceptance.AcceptanceRule` (k is
    |B_k|; δ a probability for ``lantern``, nats for ``lantern-jsd``; λ >= 1 for ``lantern++``).
    metric: latent distance of the neighbour table on the VQ codebook
    (:data:`ambiguity.neighbourhood.METRICS`; default ``"l2"`` as in the official code).
    Raises :class:`UsageError` for an unknown method, γ < 1 and the rule's own checks.
    """

    method: str = "lantern"
    gamma: int = 4
    k: int = 64
    delta: float = 0.2
    lam: float = 2.0
    residual: str = "exact"
    metric: str = DEFAULT_METRIC

    def __post_init__(self):
        if self.method not in METHODS:
            raise UsageError(f"unknown method {self.method!r}; use one of {', '.join(METHODS)}")
        if isinstance(self.gamma, bool) or int(self.gamma) != self.gamma or self.gamma < 1:
            raise UsageError(f"--gamma (draft tokens per step) must be an integer >= 1, got {self.gamma}")
        from ambiguity.neighbourhood import METRICS

        if self.metric not in METRICS:
            raise UsageError(f"--metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        self.rule()  # validates k, delta, lam, residual

    @property
    def speculative(self) -> bool:
        return self.method != "ar"

    def rule(self) -> Optional[AcceptanceRule]:
        """The :class:`AcceptanceRule`, or None for ``"ar"``."""
        if self.method == "ar":
            return None
        return AcceptanceRule(self.method, self.k, self.delta, self.lam, self.residual)

    def as_dict(self) -> dict:
        return asdict(self)


class Timer:
    """Wall-clock seconds per named section; synchronises CUDA before and after each section.

    ``with timer("target"): ...`` adds to ``timer.seconds["target"]``; :meth:`snapshot` copies.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.sync = torch.device(device).type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - t0

    def snapshot(self) -> dict:
        return dict(self.seconds)


def _since(timer: Timer, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in timer.seconds.items()}


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


# --------------------------------------------------------------------------- the four calls
def prefill(model: TokenModel, prompt: Prompt, num_tokens: int) -> tuple[object, Step]:
    """A fresh target KV cache for ``num_tokens`` image tokens and the prefix forward.

    Returns ``(cache, step)``: step.logits (rows, 1, V) float32 for ``x_0``, step.hidden
    (rows, 1, H) = ``h_{-1}``.
    """
    cache = model.new_cache(prompt, num_tokens)
    return cache, model.prefill(prompt, cache)


def draft(drafter, model: TokenModel, dcache, tokens: torch.Tensor, features: torch.Tensor, start: int,
          gamma: int, sampling: SamplingConfig, cfg: bool,
          generator: Optional[torch.Generator] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft a chain of ``gamma`` tokens (EAGLE, arXiv 2401.15077, Sec. 4.1).

    tokens: (rows, T) int64, the pending positions ``x_start .. x_{start+T-1}`` (T >= 1);
    features: (rows, T, H), ``f_{start-1} ..`` — true target features. The first drafter
    forward covers all T positions (writing them into ``dcache``); its last output drafts
    the first token, each further token feeds the drafter's own previous feature.
    Returns drafts (B, γ) int64 (sampled from q, or its argmax when greedy) and q (B, γ, V)
    float32, the drafter's distributions after CFG (scale ``sampling.cfg``), temperature and
    top-k/top-p — the same processing as the target's p.
    """
    T = tokens.shape[1]
    f = drafter(model, tokens, features, dcache, start)[:, -1:]
    xs, qs = [], []
    for j in range(gamma):
        q = distribution(drafter.logits(model, f)[:, -1], sampling, cfg)  # (B, V)
        x = pick(q, sampling.greedy, generator)
        xs.append(x)
        qs.append(q)
        if j + 1 < gamma:
            f = drafter(model, cfg_rows(x, cfg)[:, None], f, dcache, start + T + j)
    return torch.stack(xs, 1), torch.stack(qs, 1)


def verify(model: TokenModel, cache, last: torch.Tensor, drafts: torch.Tensor, cfg: bool) -> Step:
    """One target forward over ``[last, drafts]``: last (B, 1) int64, the last committed token
    (not yet in the cache); drafts (B, γ) int64 (γ may be 0).

    Returns the Step (rows, γ+1, .): logits[:, j] predicts the token after ``drafts[:, j-1]``
    (j = 0: the first draft's position; j = γ: the bonus position); hidden[:, j] the matching
    target features. The cache grows by γ + 1 tokens; roll it back after :func:`accept`.
    """
    return model.extend(cache, cfg_rows(torch.cat([last, drafts], 1), cfg))


def accept(p: torch.Tensor, q: Optional[torch.Tensor], drafts: torch.Tensor, rule: AcceptanceRule,
           neighbours: Optional[torch.Tensor], greedy: bool,
           generator: Optional[torch.Generator] = None) -> Acceptance:
    """Apply the acceptance rule to a chain and draw the next token.

    p: (B, γ+1, V) float32 target distributions at the draft positions and the bonus
    position; q: (B, γ, V) drafter distributions (unused when greedy); drafts: (B, γ) int64;
    neighbours: (V, K >= k) int64 table (None for ``"sd"``).
    Sampling: uniforms ``u`` (B, γ) from ``generator``; each draft is judged by
    :func:`lantern.acceptance.verify`; the accepted prefix length ``a`` is the number of leading
    accepted drafts; the next token is drawn from the residual at position ``a``
    (:func:`lantern.acceptance.residual`) when ``a < γ``, else from the bonus ``p[:, γ]``.
    Greedy: :func:`lantern.acceptance.verify_greedy`; the next token is ``argmax p[:, a]``
    (the rejected position's argmax, or the bonus argmax). γ = 0: the next token is drawn from
    ``p[:, 0]``. Leviathan et al. 2023, Alg. 1; LANTERN Sec. 3.
    """
    B, g = drafts.shape
    rows = torch.arange(B, device=p.device)
    if g == 0:
        nxt = pick(p[:, 0], greedy, generator)
        return Acceptance(torch.zeros(B, dtype=torch.long, device=p.device), nxt,
                          torch.zeros(B, dtype=torch.long, device=p.device), None, None)
    u = None
    if greedy:
        v = verify_greedy(p[:, :g], drafts, neighbours, rule)
    else:
        u = torch.rand(drafts.shape, generator=generator, device=p.device, dtype=p.dtype)
        v = verify_rule(p[:, :g], q, drafts, u, neighbours, rule)
    a = v.accepted.long().cumprod(-1).sum(-1)  # (B,)
    rejected = a < g
    target = p[rows, a]  # (B, V): bonus position where all were accepted, else the rejected position
    if greedy or not bool(rejected.any()):
        nxt = pick(target, greedy, generator)
    else:
        at = a.clamp(max=g - 1)
        res = residual(p[rows, at], q[rows, at], drafts[rows, at], neighbours, rule)
        nxt = pick(torch.where(rejected[:, None], res, target), False, generator)
    kind = torch.where(rejected, 2, 1).long()
    return Acceptance(a, nxt, kind, v, u)


# --------------------------------------------------------------------------- loops
def _check_one(prompt: Prompt, sampling: SamplingConfig) -> None:
    if prompt.cfg != sampling.use_cfg:
        raise UsageError("the prompt's CFG rows must match the sampling config; build it with "
                         "model.make_prompt(conditions, cfg=sampling.use_cfg)")


@torch.no_grad()
def speculative_decode(model: TokenModel, drafter, prompt: Prompt, sampling: SamplingConfig,
                       rule: AcceptanceRule, neighbours: Optional[torch.Tensor] = None, gamma: int = 4,
                       generator: Optional[torch.Generator] = None, num_tokens: Optional[int] = None,
                       image: int = 0, seed: Optional[int] = None) -> Decoded:
    """Speculative decoding of one image (module docstring: alignment, rollback, timing).

    model: the target; drafter: a :class:`lantern.drafter.Drafter` for it; prompt: one
    condition (``batch_size == 1``; 2 rows with CFG); rule: ``"sd"`` or a LANTERN rule;
    neighbours: (V, K >= k) int64 code-index table (:func:`neighbour_table`) for relaxed rules;
    gamma: draft length γ >= 1; generator: the source of every random number (drafts, ``u``,
    next tokens); num_tokens: tokens to generate (default ``model.num_tokens``).
    Returns a :class:`~lantern.records.Decoded` with tokens (1, N) and the step, draft and
    image records (``image`` and ``seed`` are written into them).
    Raises :class:`UsageError` for a batch of several conditions, γ < 1 or a CFG mismatch.
    """
    _check_one(prompt, sampling)
    if prompt.batch_size != 1:
        raise UsageError("speculative decoding takes one condition at a time (rows accept different numbers of "
                         "tokens); use lantern.decoding.decode for several images")
    if int(gamma) < 1:
        raise UsageError(f"gamma must be >= 1, got {gamma}")
    N = int(num_tokens or model.num_tokens)
    cfg, greedy = prompt.cfg, sampling.greedy
    timer, log = Timer(model.device), StepLog(image)
    t_start = time.perf_counter()
    with timer("target"):
        cache, first = prefill(model, prompt, N)
    with timer("acceptance"):
        x0 = pick(distribution(first.logits[:, -1], sampling, cfg), greedy, generator)
    tokens = torch.empty(1, N, dtype=torch.long, device=model.device)
    tokens[:, 0] = x0
    rows_tokens = lambda a, b: cfg_rows(tokens[:, a:b], cfg)
    feats = first.hidden.new_empty(prompt.rows, N, first.hidden.shape[-1])  # feats[:, i] = h_{i-1}
    feats[:, 0] = first.hidden[:, -1]
    dcache = drafter.new_cache(prompt.rows)
    n, d, step_no = 1, 0, 0
    while n < N:
        step_no += 1
        before = timer.snapshot()
        g = min(int(gamma), N - 1 - n)
        q = None
        if g > 0:
            with timer("drafter"):
                drafts, q = draft(drafter, model, dcache, rows_tokens(d, n), feats[:, d:n], d, g, sampling, cfg,
                                  generator)
                drafter.rollback(dcache, n)
            d = n
        else:
            drafts = tokens.new_empty(1, 0)
        with timer("target"):
            out = verify(model, cache, tokens[:, n - 1:n], drafts, cfg)
        with timer("acceptance"):
            p = distribution(out.logits, sampling, cfg)  # (1, g+1, V)
            res = accept(p, q, drafts, rule, neighbours, greedy, generator)
            a = int(res.accepted[0])
        tokens[:, n:n + a] = drafts[:, :a]
        tokens[:, n + a] = res.next_token
        feats[:, n:n + a + 1] = out.hidden[:, :a + 1]
        with timer("target"):
            model.rollback(cache, n + a)
        kind = NEXT_KINDS[int(res.next_kind[0])]
        log.add_step(step_no, n, g, a, kind, int(res.next_token[0]), _since(timer, before),
                     _draft_columns(p[0, :g], q[0], drafts[0], res) if g else None)
        n += a + 1
    steps, drafts_tab = log.tables()
    s = timer.seconds
    images = _image_row(image, prompt, seed, N, step_no, steps, s, time.perf_counter() - t_start)
    return Decoded(tokens.cpu(), steps, drafts_tab, images, rule.method, int(gamma))


def _draft_columns(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, res: Acceptance) -> dict:
    """Per-draft columns of one chain (γ,): p (γ, V), q (γ, V) (the drafter's distributions, also
    when greedy), drafts (γ,)."""
    v = res.verdict
    u = res.u[0] if res.u is not None else torch.full(drafts.shape, float("nan"), device=p.device)
    return dict(token=drafts, p_draft=v.p_draft[0], q_draft=q.gather(-1, drafts[:, None])[:, 0],
                p_tilde=v.p_tilde[0], j_star=v.j_star[0], spent=v.spent[0], accept_prob=v.accept_prob[0], u=u,
                accepted=v.accepted[0], p_top1=top1_prob(p), p_entropy=entropy(p), q_top1=top1_prob(q))


def _image_row(image: int, prompt: Prompt, seed, N: int, steps_n: int, steps: dict, seconds: dict,
               total: float) -> dict:
    cond = prompt.conditions[0] if prompt.conditions else ""
    return {"image": np.array([image]), "condition": np.array([str(cond)]),
            "seed": np.array([-1 if seed is None else int(seed)]), "tokens": np.array([N]),
            "target_forwards": np.array([1 + steps_n]), "steps": np.array([steps_n]),
            "drafted": np.array([int(np.sum(steps["drafted"])) if steps_n else 0]),
            "accepted": np.array([int(np.sum(steps["accepted"])) if steps_n else 0]),
            "target_s": np.array([seconds.get("target", 0.0)]), "drafter_s": np.array([seconds.get("drafter", 0.0)]),
            "acceptance_s": np.array([seconds.get("acceptance", 0.0)]), "total_s": np.array([total])}


@torch.no_grad()
def autoregressive_decode(model: TokenModel, prompt: Prompt, sampling: SamplingConfig,
                          generator: Optional[torch.Generator] = None, num_tokens: Optional[int] = None,
                          image: int = 0, seed: Optional[int] = None) -> Decoded:
    """The baseline: one target forward per token with the KV cache (one condition).

    Same random-number use as :func:`ambiguity.generation.sample_tokens`, so the tokens are
    identical for the same generator. Every forward after the prefill is a step with
    ``drafted = accepted = 0`` and ``emitted = 1``; step compression is 1.
    Returns a :class:`~lantern.records.Decoded` (tokens (1, N)); raises UsageError as
    :func:`speculative_decode`.
    """
    _check_one(prompt, sampling)
    if prompt.batch_size != 1:
        raise UsageError("decode one condition at a time; use lantern.decoding.decode for several images")
    N = int(num_tokens or model.num_tokens)
    cfg, greedy = prompt.cfg, sampling.greedy
    timer, log = Timer(model.device), StepLog(image)
    t_start = time.perf_counter()
    with timer("target"):
        cache, out = prefill(model, prompt, N)
    tokens = torch.empty(1, N, dtype=torch.long, device=model.device)
    for t in range(N):
        before = timer.snapshot()
        if t > 0:
            with timer("target"):
                out = model.extend(cache, cfg_rows(tokens[:, t - 1:t], cfg))
        with timer("acceptance"):
            x = pick(distribution(out.logits[:, -1], sampling, cfg), greedy, generator)
        tokens[:, t] = x
        if t > 0:
            log.add_step(t, t, 0, 0, "target", int(x[0]), _since(timer, before))
    steps, drafts_tab = log.tables()
    images = _image_row(image, prompt, seed, N, N - 1, steps, timer.seconds, time.perf_counter() - t_start)
    return Decoded(tokens.cpu(), steps, drafts_tab, images, "ar", 0)


# --------------------------------------------------------------------------- many images
def neighbour_table(model: TokenModel, config: DecodeConfig, **kwargs) -> Optional[torch.Tensor]:
    """The (V, K) int64 code-index table B_K of the model's VQ codebook for ``config``, on the
    model's device, or None when the rule does not use neighbours.

    K = k, or k + 1 for the ``"official"`` residual (it zeroes ``B_{k+1}``), capped at V - 1.
    Built (or read from the cache) by :func:`ambiguity.neighbourhood.model_neighbourhoods` with
    ``config.metric`` (LANTERN Sec. 4.1). Raises UsageError when k >= V or the model has no codebook.
    """
    rule = config.rule()
    if rule is None or not rule.relaxed:
        return None
    V = model.vocab_size
    if rule.k >= V:
        raise UsageError(f"--k {rule.k} must be smaller than the vocabulary size {V} of {model.name}; lower --k")
    from ambiguity.neighbourhood import model_neighbourhoods

    try:
        model.codebook()
    except NotImplementedError:
        raise UsageError(f"{config.method} needs the VQ codebook of {model.name} for latent neighbourhoods; "
                         f"load its tokenizer weights or use --method sd") from None
    K = min(rule.k + 1, V - 1) if rule.residual == "official" else rule.k
    nb = model_neighbourhoods(model, K, config.metric, **kwargs)
    return nb.indices.to(model.device)


def check_drafter(drafter, model: TokenModel) -> None:
    """Raise UsageError unless ``drafter`` was built for ``model`` (fingerprint, see lantern.drafter)."""
    from lantern.drafter import fingerprint_mismatch, target_fingerprint

    why = fingerprint_mismatch(getattr(drafter, "target", {}) or {}, target_fingerprint(model))
    if why is not None:
        raise UsageError(f"drafter was built for {why}, not {model.name}; pass --drafter for this model or train "
                         f"one with python -m lantern.train_drafter --model {model.name}")


def decode(model: TokenModel, conditions: Sequence, config: DecodeConfig, sampling: SamplingConfig,
           drafter=None, neighbours: Optional[torch.Tensor] = None, seed: int = 0, num_tokens: Optional[int] = None,
           pixels: bool = False, progress: bool = False, first_index: int = 0) -> Decoded:
    """Decode one image per condition, one after another, image ``i`` with seed ``seed + i``.

    conditions: class labels / captions (``model.make_prompt``); config: method and rule;
    drafter: required unless ``config.method == "ar"`` (checked against the model);
    neighbours: a (V, >= k) table, built with :func:`neighbour_table` when None and needed;
    pixels: also decode the tokens to images ((B, C, H, W) float32 in [0, 1]);
    first_index: image index of ``conditions[0]`` (its seed is ``seed + first_index``).
    The same seed and condition give the same random stream for every method, so an AR image
    and a LANTERN image of one index are comparable. Returns the concatenated
    :class:`~lantern.records.Decoded`. Raises UsageError for a missing or mismatched drafter.
    """
    from tqdm.auto import tqdm

    rule = config.rule()
    if rule is not None:
        if drafter is None:
            raise UsageError(f"method {config.method} needs a drafter; pass --drafter or use --method ar")
        check_drafter(drafter, model)
        if neighbours is None:
            neighbours = neighbour_table(model, config)
    parts = []
    for j, c in enumerate(tqdm(list(conditions), desc=config.method, disable=not progress, unit="img")):
        i = first_index + j
        prompt = model.make_prompt([c], cfg=sampling.use_cfg)
        gen = make_generator(seed + i, model.device)
        if rule is None:
            out = autoregressive_decode(model, prompt, sampling, gen, num_tokens, image=i, seed=seed + i)
        else:
            out = speculative_decode(model, drafter, prompt, sampling, rule, neighbours, config.gamma, gen,
                                     num_tokens, image=i, seed=seed + i)
        if pixels:
            h, w = model.grid
            out.pixels = model.decode_codes(out.tokens.view(1, h, w).to(model.device)).cpu()
        parts.append(out)
    result = Decoded.concat(parts)
    result.settings = {**config.as_dict(), **{f"sampling_{k}": v for k, v in sampling.as_dict().items()}}
    return result
