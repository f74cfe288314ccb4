"""Acceptance rules of speculative decoding and LANTERN, as pure tensor functions.

Notation (per draft position): ``p`` is the target's next-token distribution after CFG,
temperature and top-k/top-p (what the target would sample from), ``q`` the drafter's,
processed the same way, ``x̂ ~ q`` the draft token. ``neighbours`` is a (V, K) integer table in
code-index space whose row ``v`` lists the latent neighbours of code ``v`` nearest first, ``v``
itself excluded (``B_k(v)`` is the first ``k`` columns). ``S_j = p(n_1) + ... + p(n_j)`` for
the neighbours ``n_1..n_k`` of ``x̂``.

Rules (``AcceptanceRule.method``; each relaxed rule is one entry of :data:`BOUNDS`):

* ``"sd"`` — lossless speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023):
  accept with probability ``min(1, p(x̂) / q(x̂))``.
* ``"lantern"`` — LANTERN with the TVD bound (Jang et al., ICLR 2025, arXiv 2410.03355, Sec. 3):
  the proximity set ``A = {x̂, n_1..n_j*}`` keeps the neighbours while ``S_j <= δ``; ``S_j`` is
  exactly the TVD between ``p`` and ``p`` with the mass of ``n_1..n_j`` moved onto ``x̂``.
* ``"lantern-jsd"`` — the same prefix grown while the Jensen–Shannon divergence (nats) between
  ``p`` and that moved distribution stays ``<= δ`` (closed form: :func:`lantern.rules.divergences.moved_jsd`).
* ``"lantern++"`` — the relative bound of LANTERN++ (arXiv 2502.06352): grown while
  ``S_j <= (λ - 1) p(x̂)``, i.e. ``p̃(x̂) <= λ p(x̂)``.
* ``"cool-sd"`` — Cool-SD (arXiv 2601.09212; :mod:`lantern.rules.cool_sd`): no neighbourhood;
  ``p̃(x̂) = ω p(x̂)`` with ω annealed over the draft's place in its chain, and the TV-optimal
  residual ``norm(max(p - min(q, ω p), 0))``.
* ``"fly"`` — FLy (arXiv 2511.22972; :mod:`lantern.rules.fly`): the ``"sd"`` test, then a walk
  over the chain that defers a rejection where the target's top-3 entropy is high and the
  following drafts agree.

The last two are entries of :data:`RELAXATIONS` (their :data:`BOUNDS` entry is None: no
neighbourhood); their rules need the chain (:func:`judge`'s positions, :func:`walk`).

For the relaxed rules ``p̃(x̂) = p(x̂) + S_j*`` and the draft is accepted with probability
``min(1, p̃(x̂) / q(x̂))``. "Grown while" means the prefix stops at the first ``j`` that breaks
the bound. ``S_j`` is non-decreasing in ``j`` and the three bounds are non-decreasing functions
of ``S_j`` (the JSD's derivative in ``S`` is positive, see :mod:`lantern.rules.divergences`), so the
first break also gives the largest ``j`` within the bound — what the official code computes.

Conventions (``AcceptanceRule.convention``): what happens after a rejection, for drafts drawn
from ``q`` (chains, EAGLE-1 static trees: ``q`` given) and for deterministic drafts (EAGLE-2
dynamic trees take the drafter's top-k: ``q = None``, a point mass at ``x̂``):

* ``"exact"`` — lossless at ``δ = 0``. With ``α(x) = min(q(x), p̃_x(x))`` the accepted mass of
  each possible draft ``x`` (``p̃_x`` computed as if ``x`` were the draft), sample from
  ``norm(max(p - α, 0))``. Because ``p̃_x(x) >= p(x)``, ``max(p - α, 0) = max(p - q, 0)`` entry
  by entry (where ``q <= p̃`` the two agree; where ``q > p̃ >= p`` both are 0), so this *is* the
  standard residual ``norm(max(p - q, 0))``: it needs no neighbour table and does not depend on
  which draft was rejected; for a deterministic draft it is ``p`` with ``x̂`` zeroed. With
  ``δ = 0`` or ``k = 0`` the output distribution is exactly ``p``. Whatever residual is used,
  a token ``y`` is emitted with probability at least ``α(y)``; this one emits exactly ``α(y)``
  where ``α(y) >= p(y)`` and at most ``p(y)`` elsewhere, so ``TVD(out, p) = Σ_y max(α(y) - p(y), 0)``,
  the least distortion the relaxed acceptance allows. A tree decoder judges the next sibling
  against this residual (recursive rejection sampling; siblings drawn from ``q`` without
  replacement use the conditional ``q`` of the remaining mass), which keeps ``δ = 0`` lossless.
* ``"official"`` — what the official LANTERN code (github.com/jadohu/LANTERN, release 3a56e45,
  ``models/ea_model_llamagen.py``; the Anole and Lumina-mGPT files are the same) does after
  rejecting ``x̂``. Let ``Z = nearest_latents[x̂, :k+1]`` when ``j* >= 1`` (its table excludes
  ``x̂``, so ``Z`` is ``B_{k+1}(x̂)``: all of ``B_k`` whatever ``j*`` is, plus the (k+1)-th
  neighbour; we use the first ``k+1`` columns of ``neighbours``), else empty. Deterministic
  drafts (``evaluate_posterior``, the dynamic tree, ``q(x̂) = 1``): ``p`` zeroed at ``x̂`` and
  ``Z``, renormalised. Sampled drafts (``evaluate_posterior_v1``, static trees): ``q`` zeroed
  at ``Z`` (not renormalised), then ``norm(max(p - q, 0))``. A residual without mass becomes
  the uniform distribution. With ``δ = 0`` a neighbour of zero probability (e.g. cut by top-k)
  still counts as "moved" (``S_j = 0 <= δ``), so ``j* >= 1`` and ``Z`` is zeroed: lossy even at
  ``δ = 0`` when filters cut neighbours. In a tree it is lossy at ``δ = 0`` even without
  filters: after a sibling is rejected the target has zero mass there, so when the next
  sibling's neighbours include it, it counts as moved and that sibling's rejection zeroes all
  of its ``k + 1`` neighbours. Measured by exhaustive enumeration of the real tree decoder on a
  tiny model (issue 21): TVD of the output to AR 5e-5 without filters, 0.10 with top-k, 0.81
  with top-k and top-p. Use ``"exact"`` for lossless decoding; ``"official"`` only to
  reproduce the official numbers.

Zero-mass residual (``"exact"``): when ``max(p - α, 0)`` has no mass at all we return ``p``
itself (a rejection then has probability 0).

Greedy decoding (temperature 0; ``p`` is then the temperature-1 distribution after the filters,
see :mod:`ambiguity.sampling`): ``"exact"`` accepts ``x̂`` iff ``p̃(x̂) >= max_{v != x̂} p(v)``;
on rejection the decoder emits ``argmax p``. ``"official"`` writes ``p̃(x̂)`` at ``x̂`` in the
unfiltered softmax and accepts iff ``x̂`` is then its argmax, ties going to the lower code
index (:func:`judge_greedy` with ``official=True``).

Typical decoder use (``p``: (B, γ+1, V) target incl. the bonus position; ``q``: (B, γ, V);
``draft``, ``u``: (B, γ))::

    v = judge(p[:, :γ], q, draft, u, neighbours, rule)    # per-draft-token verdicts
    n = v.accepted.long().cumprod(-1).sum(-1)             # (B,) accepted draft tokens per row
    rows = (n < γ).nonzero().squeeze(-1); at = n[rows]    # first rejection of each row
    r = residual(p[rows, at], q[rows, at], draft[rows, at], neighbours, rule)   # (R, V)
    # next token: sample r in rejected rows, p[b, γ] (the bonus token) in the others

The residual is computed lazily by :func:`residual`, only at the first rejected position.
The exact distribution of the token one verification step emits, by enumeration over the
drafts, is an analysis tool of its own: :mod:`lantern.rules.output`.

Validation happens at the API edge: every public function checks its inputs (one-line
:class:`UsageError`) unless called with ``validate=False``, which the decoder does on every
step after checking the rule and the table once (:meth:`AcceptanceRule.table_for`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from ambiguity.errors import FieldError, UsageError
from lantern.rules.cool_sd import annealed_weights
from lantern.rules.divergences import moved_jsd
from lantern.rules.fly import deferred, top_entropy

__all__ = [
    "RULES",
    "CONVENTIONS",
    "BOUNDS",
    "Bound",
    "RELAXATIONS",
    "Relaxation",
    "AcceptanceRule",
    "Verdict",
    "grow_proximity_set",
    "relaxed_mass",
    "judge",
    "proximity",
    "judge_greedy",
    "walk",
    "residual",
    "rule_table",
    "check_q",
    "relaxation_scale",
    "max_other",
    "convention_residual",
]

CONVENTIONS = ("exact", "official")


def _relative_mass(a: torch.Tensor, moved: torch.Tensor) -> torch.Tensor:
    """S_j / p(x̂), 0 where p(x̂) = 0 (LANTERN++'s relative bound is then S_j <= 0)."""
    return torch.where(a > 0, moved / torch.where(a > 0, a, torch.ones_like(a)), torch.zeros_like(moved))


@dataclass(frozen=True)
class Bound:
    """How a relaxed rule bounds the proximity set it grows (one entry of :data:`BOUNDS`).

    parameter: the :class:`AcceptanceRule` field holding the bound (``"delta"`` or ``"lam"``);
    at_most_one: the parameter must lie in [0, 1] (a probability or, for the JSD, nats below ln 2);
    spent: ``(p(x̂), S_j) -> divergence`` of moving the neighbours' mass ``S_j`` onto ``x̂``, in
    the bound's units (broadcasting (..., 1) against (..., k)); within: ``(rule, p(x̂), S_j,
    spent) -> bool``, whether the move respects the bound; units: for tables and docstrings.
    """

    parameter: str
    at_most_one: bool
    spent: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    within: Callable[[AcceptanceRule, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    units: str


# method -> its bound (None: lossless speculative sampling). A new relaxed rule is one entry here.
BOUNDS: dict[str, Optional[Bound]] = {
    "sd": None,
    "lantern": Bound(
        "delta", True, lambda a, moved: moved, lambda r, a, moved, spent: spent <= r.delta, "TVD (a probability)"
    ),
    "lantern-jsd": Bound("delta", True, moved_jsd, lambda r, a, moved, spent: spent <= r.delta, "JSD (nats)"),
    "lantern++": Bound(
        "lam",
        False,
        _relative_mass,
        lambda r, a, moved, spent: moved <= (r.lam - 1.0) * a,
        "relative mass S/p(x̂), bounded by λ - 1",
    ),
    "cool-sd": None,  # no neighbourhood: a relaxation (RELAXATIONS)
    "fly": None,
}
RULES = tuple(BOUNDS)


@dataclass(frozen=True)
class Relaxation:
    """How a lossy rule without a latent neighbourhood departs from ``"sd"`` (one entry of :data:`RELAXATIONS`).

    parameters: the :class:`AcceptanceRule` fields it reads; scale: ``(rule, positions, lengths) ->
    ω`` (...) float64, the factor on ``p(x̂)`` in the acceptance test (``p̃(x̂) = ω p(x̂)``) and in
    the residual (:func:`residual`), from each draft's 0-based place in its chain and the chain's
    length, or None (ω = 1); spent: ``p (..., V) -> (...)``, what :attr:`Verdict.spent` records
    for each draft, or None (then ω, or 0); walk: ``(rule, native (B, γ) bool, verdict) -> (B, γ)
    bool``, the drafts accepted once the whole chain's native verdicts are known (:func:`walk`),
    or None (the native verdicts); units: of ``spent``.
    """

    parameters: tuple
    scale: Optional[Callable[[AcceptanceRule, torch.Tensor, torch.Tensor], torch.Tensor]]
    spent: Optional[Callable[[torch.Tensor], torch.Tensor]]
    walk: Optional[Callable[[AcceptanceRule, torch.Tensor, Verdict], torch.Tensor]]
    units: str


# method -> its relaxation, for the rules of BOUNDS without a neighbourhood bound (None there) other than "sd"
RELAXATIONS: dict[str, Relaxation] = {
    "cool-sd": Relaxation(
        ("cool_delta", "cool_nu"),
        lambda r, positions, lengths: annealed_weights(positions, lengths, r.cool_delta, r.cool_nu),
        None,
        None,
        "ω, the annealed factor on p(x̂)",
    ),
    "fly": Relaxation(
        ("fly_entropy", "fly_window"),
        None,
        top_entropy,
        lambda r, native, v: deferred(native, v.spent, v.p_draft, r.fly_entropy, r.fly_window),
        "top-3 entropy of p (nats), compared with θ",
    ),
}


@dataclass(frozen=True)
class AcceptanceRule:
    """Configuration of one acceptance rule (see the module docstring for the rules).

    method: a key of :data:`BOUNDS`: ``"sd"`` | ``"lantern"`` | ``"lantern-jsd"`` | ``"lantern++"`` |
       ``"cool-sd"`` | ``"fly"``.
    k: neighbourhood size ``|B_k|`` (>= 0; 0 turns every rule into ``"sd"``); must be smaller
       than the vocabulary size, checked when the rule meets a distribution. ``"sd"`` ignores it.
    delta: the bound δ of ``"lantern"`` (TVD, a probability) and ``"lantern-jsd"`` (JSD, nats);
       in [0, 1]; 0 is lossless. The official code reads ``delta > 1`` as the relative bound λ;
       here that is ``method="lantern++", lam=...``.
    lam: λ >= 1 of ``"lantern++"`` (``p̃(x̂) <= λ p(x̂)``); 1 is lossless.
    convention: ``"exact"`` | ``"official"`` — what happens after a rejection, and the greedy
       test (module docstring); ``"cool-sd"`` and ``"fly"`` have only ``"exact"``.
    cool_delta: δ >= 1 of ``"cool-sd"``, the mean of its annealed factor ω over a chain
       (:mod:`lantern.rules.cool_sd`; the paper's main setting 1.1, its 2.72x LlamaGen row 2);
       with ``cool_nu = 0`` and ``cool_delta = 1`` the rule is lossless ``"sd"``.
    cool_nu: ν >= 0 of ``"cool-sd"``, the decay of ω per place in the chain (the paper's 0.7;
       0 is the uniform relaxation ω = δ).
    fly_entropy: θ >= 0 of ``"fly"``, nats: a rejection at a draft whose target top-3 entropy is
       at least θ may be deferred (:mod:`lantern.rules.fly`; official 0.3).
    fly_window: W >= 1 of ``"fly"``, how many following drafts must be natively accepted for a
       deferral (vLLM's default min(6, γ - 1): 3 at the toolkit's γ = 4; vLLM requires W < γ, and a
       window longer than the chain defers nothing, so :class:`lantern.engine.decode.DecodeConfig`
       refuses W >= γ).

    The defaults (k = 64, δ = 0.2, λ = 2) are the toolkit's defaults everywhere (CLI included);
    those of Cool-SD and FLy are their papers'. Raises :class:`UsageError` (one line naming the
    fix) for an unknown method or convention, ``k < 0`` or non-integer, ``delta < 0`` (or > 1 for
    the TVD/JSD rules), ``lam < 1``, ``cool_delta < 1``, ``cool_nu < 0``, ``fly_entropy < 0``, a
    non-integer or ``fly_window < 1``, the ``"official"`` convention with ``"cool-sd"`` / ``"fly"``.
    """

    method: str = "sd"
    k: int = 64
    delta: float = 0.2
    lam: float = 2.0
    convention: str = "exact"
    cool_delta: float = 1.1
    cool_nu: float = 0.7
    fly_entropy: float = 0.3
    fly_window: int = 3

    def __post_init__(self):
        if self.method not in BOUNDS:
            raise UsageError(f"unknown acceptance method {self.method!r}; use one of {', '.join(RULES)}")
        if self.convention not in CONVENTIONS:
            raise UsageError(f"unknown convention {self.convention!r}; use 'exact' or 'official'")
        if isinstance(self.k, bool) or int(self.k) != self.k or self.k < 0:
            raise FieldError(
                "AcceptanceRule", "k", f"must be an integer >= 0 (0 disables the latent neighbourhood), got {self.k}"
            )
        if not 0 <= self.delta < float("inf"):
            raise FieldError("AcceptanceRule", "delta", f"must be >= 0 (0 is lossless), got {self.delta}")
        bound = BOUNDS[self.method]
        if bound is not None and bound.at_most_one and self.delta > 1:
            raise FieldError(
                "AcceptanceRule",
                "delta",
                f"must be <= 1 for method {self.method}, got {self.delta}; "
                "for the official code's delta > 1 (a relative bound) use method lantern++ with lam = delta "
                "(--method lantern++ --lam DELTA)",
            )
        if not 1 <= self.lam < float("inf"):
            raise FieldError("AcceptanceRule", "lam", f"must be >= 1 (1 is lossless), got {self.lam}")
        self._check_relaxations()
        object.__setattr__(self, "k", int(self.k))
        object.__setattr__(self, "fly_window", int(self.fly_window))

    def _check_relaxations(self) -> None:
        """The knobs of :data:`RELAXATIONS` (checked whatever the method: their defaults are valid)."""
        if not 1 <= self.cool_delta < float("inf"):
            raise FieldError(
                "AcceptanceRule", "cool_delta", f"must be >= 1 (the mean of Cool-SD's factor ω), got {self.cool_delta}"
            )
        if not 0 <= self.cool_nu < float("inf"):
            raise FieldError("AcceptanceRule", "cool_nu", f"must be >= 0 (0: no annealing), got {self.cool_nu}")
        if not 0 <= self.fly_entropy < float("inf"):
            raise FieldError("AcceptanceRule", "fly_entropy", f"must be >= 0 nats, got {self.fly_entropy}")
        w = self.fly_window
        if isinstance(w, bool) or not isinstance(w, (int, float)) or int(w) != w or w < 1:
            raise FieldError(
                "AcceptanceRule", "fly_window", f"must be an integer >= 1 (drafts checked after a rejection), got {w}"
            )
        if self.method in RELAXATIONS and self.convention != "exact":
            raise UsageError(
                f"convention {self.convention!r} is the official LANTERN code's; {self.method} has only 'exact' "
                "(drop --convention)"
            )

    @property
    def relaxed(self) -> bool:
        """Whether the rule moves neighbour mass at all (a LANTERN method with ``k > 0``)."""
        return BOUNDS[self.method] is not None and self.k > 0

    @property
    def bound(self) -> float:
        """The number the divergence spent is compared with: δ, or λ - 1 for ``"lantern++"``."""
        return self.lam - 1.0 if self.method == "lantern++" else float(self.delta)

    def as_dict(self) -> dict:
        """The fields as a flat dict; the knobs of :data:`RELAXATIONS` only for the method that reads
        them, so the record (and settings digest) of any other rule is what it was before they existed."""
        record = asdict(self)
        for method, relax in RELAXATIONS.items():
            if method != self.method:
                for name in relax.parameters:
                    record.pop(name)
        return record

    def table_for(self, p: torch.Tensor, neighbours) -> Optional[torch.Tensor]:
        """Validate the neighbour table against ``p`` (..., V) float and this rule; see :meth:`prepare_table`.
        Raises UsageError also for a non-float ``p``."""
        if not torch.is_floating_point(p):
            raise UsageError(f"p must be a floating tensor of probabilities (..., V), got dtype {p.dtype}")
        return self.prepare_table(neighbours, p.shape[-1], p.device)

    def prepare_table(self, neighbours, vocab_size: int, device) -> Optional[torch.Tensor]:
        """The neighbour table checked for a vocabulary of ``vocab_size`` codes, as int64 on ``device``
        (None when the rule does not use neighbours). ``neighbours``: a (V, K >= k) tensor or an
        :class:`ambiguity.neighbourhood.Neighbourhoods`. Raises UsageError for ``k >= V`` or a
        missing or mis-shaped table."""
        V = int(vocab_size)
        if self.relaxed and self.k >= V:
            raise UsageError(
                f"k={self.k} must be smaller than the vocabulary size V={V} (a token has at most V-1 "
                f"neighbours); lower k"
            )
        if not self.relaxed:
            return None
        if neighbours is not None and not isinstance(neighbours, torch.Tensor):
            neighbours = neighbours.indices  # an ambiguity.neighbourhood.Neighbourhoods
        if neighbours is None:
            raise UsageError(
                f"method={self.method!r} with k={self.k} needs a neighbour table (V, >= k); build one "
                f"with ambiguity.neighbourhood"
            )
        if neighbours.ndim != 2 or neighbours.shape[0] != V or neighbours.shape[1] < self.k:
            raise UsageError(
                f"neighbour table has shape {tuple(neighbours.shape)}, expected ({V}, >= {self.k}); "
                "build it for this codebook with at least k columns"
            )
        return neighbours.to(device=device, dtype=torch.long)


@dataclass(frozen=True)
class Verdict:
    """Per-draft-token outcome of one verification; every field has the draft's shape (...).

    accepted: bool. accept_prob: ``min(1, p̃(x̂)/q(x̂))`` (greedy: 0. or 1.), p's dtype.
    p_draft: ``p(x̂)``; q_draft: ``q(x̂)`` (greedy: 1.); p_tilde: ``p̃(x̂) = p(x̂) + S_j*``.
    j_star: int64, the number of neighbours moved onto ``x̂`` (``|A| - 1``).
    spent: the divergence of the move, in the units of the rule's bound (:data:`BOUNDS`):
    ``S_j*`` (TVD, a probability) for ``"lantern"``, the JSD in nats for ``"lantern-jsd"``, the
    relative mass ``S_j* / p(x̂)`` (compare with λ - 1) for ``"lantern++"``, 0 for ``"sd"`` and
    when ``j* = 0``; Cool-SD's factor ω for ``"cool-sd"``, the target's top-3 entropy (nats,
    compare with θ) for ``"fly"`` (:data:`RELAXATIONS`).
    """

    accepted: torch.Tensor
    accept_prob: torch.Tensor
    p_draft: torch.Tensor
    q_draft: torch.Tensor
    p_tilde: torch.Tensor
    j_star: torch.Tensor
    spent: torch.Tensor


def rule_table(p: torch.Tensor, neighbours, rule: AcceptanceRule, validate: bool) -> Optional[torch.Tensor]:
    """The neighbour table the rule reads: (V, K >= k) int64 on p's device, or None when the rule is not relaxed.

    p: (..., V) float; neighbours: a (V, K) integer tensor, an :class:`ambiguity.neighbourhood.Neighbourhoods`
    or None. ``validate``: checked by :meth:`AcceptanceRule.table_for` (raises :class:`UsageError` for a
    non-float p, ``k >= V``, a missing or mis-shaped table); without it ``neighbours`` is passed through
    unchecked (the decoder's per-step path, after one checked call).
    """
    if validate:
        return rule.table_for(p, neighbours)
    return neighbours if rule.relaxed else None


def check_q(p: torch.Tensor, q: torch.Tensor) -> None:
    """Check that the drafter's distribution q has the target's shape (..., V); raises :class:`UsageError` if not."""
    if q.shape != p.shape:
        raise UsageError(f"q has shape {tuple(q.shape)}, expected p's shape {tuple(p.shape)}")


def _check_draft(p: torch.Tensor, draft: torch.Tensor, name: str = "draft") -> None:
    if draft.shape != p.shape[:-1]:
        raise UsageError(f"{name} has shape {tuple(draft.shape)}, expected p's leading shape {tuple(p.shape[:-1])}")


def grow_proximity_set(p: torch.Tensor, drafts: torch.Tensor, table: Optional[torch.Tensor], rule: AcceptanceRule):
    """Grow the proximity set A of each of ``n`` drafts per row (LANTERN Sec. 3, Alg. 1).

    p (..., V) float; drafts (..., n) int64; table (V, >= k) int64 on p's device (None when the
    rule is not relaxed) -> p_draft, p_tilde, spent (..., n) p.dtype and j_star (..., n) int64.
    The neighbours of x̂ are added in distance order while the rule's bound (:data:`BOUNDS`)
    holds; the set stops at the first neighbour that breaks it. One (..., n, k) gather and
    cumsum; no loop; no validation (see :meth:`AcceptanceRule.table_for`).
    """
    p_draft = p.gather(-1, drafts)
    if not rule.relaxed:
        return p_draft, p_draft.clone(), torch.zeros_like(drafts), torch.zeros_like(p_draft)
    bound = BOUNDS[rule.method]
    nbr = table[:, : rule.k][drafts]  # (..., n, k): B_k of each draft
    rows = p.unsqueeze(-2).expand(*drafts.shape, p.shape[-1])
    moved = rows.gather(-1, nbr).cumsum(-1)  # (..., n, k): S_1..S_k
    a = p_draft.unsqueeze(-1)
    cost = bound.spent(a, moved)
    within = bound.within(rule, a, moved, cost)
    j_star = within.long().cumprod(-1).sum(-1)  # stops at the first j that breaks the bound
    has = j_star > 0
    last = (j_star - 1).clamp_min(0).unsqueeze(-1)
    zero = torch.zeros_like(p_draft)
    s_star = torch.where(has, moved.gather(-1, last).squeeze(-1), zero)
    spent = torch.where(has, cost.gather(-1, last).squeeze(-1), zero)
    return p_draft, p_draft + s_star, j_star, spent


def proximity(p: torch.Tensor, draft: torch.Tensor, table: Optional[torch.Tensor], rule: AcceptanceRule):
    """:func:`grow_proximity_set` of one draft per distribution: p (..., V), draft (...) int64 ->
    (p_draft, p_tilde, j_star, spent), each (...). The decoders time this call on its own (the
    ``proximity_s`` of their step records) and pass it to :func:`judge` / :func:`judge_greedy`."""
    return tuple(t.squeeze(-1) for t in grow_proximity_set(p, draft.long().unsqueeze(-1), table, rule))


def relaxed_mass(
    p: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor | None, rule: AcceptanceRule, validate: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The proximity set of each draft: ``(j_star, p_tilde, spent)``.

    p: (..., V) float, the target distribution; draft: (...) int64 code indices;
    neighbours: (V, K >= k) integer table (None allowed when the rule is not relaxed).
    Returns j_star (...) int64 = ``|A| - 1``; p_tilde (...) = ``p(x̂) + S_j*`` (a probability);
    spent (...) in the bound's units (see :class:`Verdict`). LANTERN Sec. 3; LANTERN++ Sec. 3.
    Raises :class:`UsageError` for a missing or mis-shaped table, ``k >= V`` or a bad shape.
    """
    table = rule_table(p, neighbours, rule, validate)
    if validate:
        _check_draft(p, draft)
    _, p_tilde, j_star, spent = proximity(p, draft, table, rule)
    return j_star, p_tilde, spent


def relaxation_scale(
    rule: AcceptanceRule, draft: torch.Tensor, positions, lengths, chain: bool
) -> Optional[torch.Tensor]:
    """Cool-SD's factor ω of each draft: (...) float64 for a rule with a scale (:data:`RELAXATIONS`), else None.

    draft: (...) int64 (its shape and device only); positions: int or (...) int64, each draft's
    0-based place in its chain, and lengths (int or int64 broadcastable to it) the chain's length.
    ``chain``: without positions, the last dim of ``draft`` is the chain (0..γ-1 of length γ, or
    ``lengths`` when given). Raises :class:`UsageError` for a scaled rule without positions (unless
    ``chain``) or with positions but no lengths. arXiv 2601.09212 (:mod:`lantern.rules.cool_sd`).
    """
    relax = RELAXATIONS.get(rule.method)
    if relax is None or relax.scale is None:
        return None
    if positions is None:
        if not chain:
            raise UsageError(f"{rule.method} needs each draft's place in its chain: pass positions and lengths")
        g = draft.shape[-1]
        positions = torch.arange(g, device=draft.device).expand(draft.shape)
        lengths = g if lengths is None else lengths
    if lengths is None:
        raise UsageError(f"{rule.method} needs the length of each draft's chain: pass lengths with positions")
    positions = torch.as_tensor(positions, device=draft.device)
    return relax.scale(rule, positions, torch.as_tensor(lengths, device=draft.device))


def _relax(p, draft, p_draft, p_tilde, spent, rule: AcceptanceRule, positions, lengths, greedy: bool):
    """(p_tilde, spent) of the drafts under the rule's relaxation (:data:`RELAXATIONS`); unchanged for
    the other rules. Greedy: a scale below 1 does not lower ``p̃`` under ``p(x̂)``."""
    relax = RELAXATIONS.get(rule.method)
    if relax is None:
        return p_tilde, spent
    omega = relaxation_scale(rule, draft, positions, lengths, chain=True)
    if omega is not None:
        omega = omega.to(p.dtype).expand(p_draft.shape)
        p_tilde = p_draft * (omega.clamp_min(1.0) if greedy else omega)
        spent = omega
    if relax.spent is not None:
        spent = relax.spent(p)
    return p_tilde, spent


def walk(native: torch.Tensor, verdict: Verdict, rule: AcceptanceRule) -> torch.Tensor:
    """The drafts of each chain the rule accepts once every native verdict of the chain is known.

    native: (B, γ) bool, :attr:`Verdict.accepted` of the chain's drafts (False beyond a row's own
    chain length); verdict: that :class:`Verdict` ((B, γ) fields) -> (B, γ) bool. The accepted
    prefix is the leading run of True (``out.long().cumprod(-1).sum(-1)``). The rule's walk
    (:data:`RELAXATIONS`): ``"fly"`` also accepts the rejections it defers
    (:func:`lantern.rules.fly.deferred`); every other rule returns ``native`` itself.
    """
    relax = RELAXATIONS.get(rule.method)
    if relax is None or relax.walk is None:
        return native
    return relax.walk(rule, native, verdict)


def judge(
    p: torch.Tensor,
    q: Optional[torch.Tensor],
    draft: torch.Tensor,
    u: torch.Tensor,
    neighbours: torch.Tensor | None,
    rule: AcceptanceRule,
    validate: bool = True,
    proximity_set: Optional[tuple] = None,
    positions: Optional[torch.Tensor] = None,
    lengths=None,
) -> Verdict:
    """Accept or reject each draft token independently (no prefix logic across positions).

    p, q: (..., V) float probabilities of the target and the drafter at the draft positions,
    e.g. (B, γ, V); q None: deterministic drafts (the drafter's top-k, EAGLE-2 trees), judged
    as a point mass ``q(x̂) = 1``; draft: (...) int64 code indices (drawn from q); u: (...)
    uniforms in [0, 1) (``torch.rand``), passed in so that randomness is the caller's;
    neighbours: (V, K >= k) integer table, row v = B_K(v) nearest first, v excluded (None when
    the rule is not relaxed; an ``ambiguity.neighbourhood.Neighbourhoods`` is accepted and its
    ``indices`` used).

    Accepts iff ``u * q(x̂) < p̃(x̂)``: probability ``min(1, p̃(x̂)/q(x̂))`` for u ~ U[0, 1); a
    draft with ``p̃(x̂) = 0`` is never accepted, one with ``q(x̂) = 0 < p̃(x̂)`` always.
    Leviathan et al. 2023 Alg. 1 (``"sd"``), LANTERN Sec. 3 / LANTERN++ (relaxed rules).
    Returns a :class:`Verdict`; sample the rejected position from :func:`residual`.
    ``validate=False`` skips the input checks (the decoder validates once per decode);
    ``proximity_set``: :func:`proximity` of these drafts, when the caller computed (and timed) it.
    positions: (...) int64, each draft's 0-based place in its chain, and lengths (int64,
    broadcastable to it) the chain's length: read by rules with a scale (``"cool-sd"``, whose
    ``p̃(x̂) = ω p(x̂)``, :data:`RELAXATIONS`); by default the last dim of ``draft`` is the chain
    (positions ``0..γ-1``, lengths ``γ``). ``"fly"`` records its gate, the top-3 entropy of ``p``,
    as ``spent``; its deferrals need the whole chain (:func:`walk`).
    Raises :class:`UsageError` for mismatched shapes, a missing table, ``k >= V``.
    """
    table = rule_table(p, neighbours, rule, validate)
    if validate:
        if q is not None:
            check_q(p, q)
        _check_draft(p, draft)
        _check_draft(p, u, "u")
    p_draft, p_tilde, j_star, spent = proximity_set or proximity(p, draft, table, rule)
    p_tilde, spent = _relax(p, draft, p_draft, p_tilde, spent, rule, positions, lengths, greedy=False)
    q_draft = q.gather(-1, draft.long().unsqueeze(-1)).squeeze(-1) if q is not None else torch.ones_like(p_draft)
    accepted = u * q_draft < p_tilde
    safe_q = torch.where(q_draft > 0, q_draft, torch.ones_like(q_draft))
    accept_prob = torch.where(q_draft > 0, (p_tilde / safe_q).clamp(max=1.0), (p_tilde > 0).to(p.dtype))
    return Verdict(accepted, accept_prob, p_draft, q_draft, p_tilde, j_star, spent)


def max_other(p: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """``max_{v != x} p(v)``, the best competitor of each draft in greedy verification.

    p: (..., V) float with V >= 2; drafts: (..., n) int64 -> (..., n) p.dtype. No validation.
    (:func:`judge_greedy`; LANTERN Sec. 3, greedy.)
    """
    top = p.topk(2, dim=-1)
    first, second = top.values[..., :1], top.values[..., 1:]
    return torch.where(drafts == top.indices[..., :1], second, first)


def _beats_lower_indices(p: torch.Tensor, drafts: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value > max_{v < x} p(v)`` for drafts (..., n) against p (..., V) (True when x = 0)."""
    V = p.shape[-1]
    lower = torch.arange(V, device=p.device) < drafts.unsqueeze(-1)  # (..., n, V)
    rows = p.unsqueeze(-2).expand(*drafts.shape, V)
    best = torch.where(lower, rows, torch.full_like(rows, float("-inf"))).amax(-1)
    return value > best


def judge_greedy(
    p: torch.Tensor,
    draft: torch.Tensor,
    neighbours: torch.Tensor | None,
    rule: AcceptanceRule,
    validate: bool = True,
    proximity_set: Optional[tuple] = None,
    positions: Optional[torch.Tensor] = None,
    lengths=None,
) -> Verdict:
    """Greedy (temperature 0) verification: is ``x̂`` the argmax once ``p̃(x̂)`` replaces ``p(x̂)``?

    p: (..., V) float (V >= 2): for ``"exact"`` the target's temperature-1 distribution after
    the filters, for ``"official"`` the unfiltered softmax (what the official code compares);
    draft: (...) int64; neighbours, rule, validate, proximity_set as in :func:`judge`.
    ``"exact"`` accepts iff ``p̃(x̂) >= max_{v != x̂} p(v)`` (ties accepted); ``"official"``
    iff ``p̃(x̂) > p(v)`` for every lower index ``v`` and ``>=`` for every higher one (argmax
    ties go to the lower code index). On rejection the decoder emits ``p.argmax(-1)``. With
    ``"sd"`` (or δ = 0 and no zero-mass neighbours) this accepts exactly when ``x̂`` is an
    argmax of ``p``. LANTERN Sec. 3 (greedy). ``"cool-sd"`` uses ``p̃(x̂) = max(ω, 1) p(x̂)``
    (positions, lengths as in :func:`judge`): a factor ``ω < 1`` late in a chain would reject the
    argmax only to emit it again after the rejection, so it never rejects the argmax (our choice;
    the paper treats sampling only). ``"fly"`` judges as ``"sd"`` here; :func:`walk` defers.
    Returns a :class:`Verdict` with ``q_draft = 1`` and ``accept_prob`` 0. or 1.
    Raises :class:`UsageError` as :func:`judge`.
    """
    table = rule_table(p, neighbours, rule, validate)
    if validate:
        _check_draft(p, draft)
    idx = draft.long().unsqueeze(-1)
    p_draft, p_tilde, j_star, spent = proximity_set or proximity(p, draft, table, rule)
    p_tilde, spent = _relax(p, draft, p_draft, p_tilde, spent, rule, positions, lengths, greedy=True)
    accepted = p_tilde >= max_other(p, idx).squeeze(-1)
    if rule.convention == "official":
        accepted &= _beats_lower_indices(p, idx, p_tilde.unsqueeze(-1)).squeeze(-1)
    return Verdict(accepted, accepted.to(p.dtype), p_draft, torch.ones_like(p_draft), p_tilde, j_star, spent)


def _normalise(r: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """r (..., V) >= 0 -> r / sum(r), or ``fallback`` where r has no mass."""
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / torch.where(mass > 0, mass, torch.ones_like(mass)), fallback)


def _point_mass(p: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(p).scatter_(-1, draft.unsqueeze(-1), 1.0)


def _official_zap(
    p: torch.Tensor, draft: torch.Tensor, j_star: torch.Tensor, table: Optional[torch.Tensor], rule: AcceptanceRule
) -> torch.Tensor:
    """(..., V) bool: ``B_{k+1}(x̂)`` where ``j* >= 1`` (the official code's zeroed neighbours), else nothing."""
    zap = torch.zeros_like(p, dtype=torch.bool)
    if table is not None:
        cols = table[:, : rule.k + 1][draft]  # (..., min(k+1, K))
        zap.scatter_(-1, cols, (j_star > 0).unsqueeze(-1).expand_as(cols))
    return zap


def convention_residual(
    p: torch.Tensor,
    q: Optional[torch.Tensor],
    draft: torch.Tensor,
    j_star: torch.Tensor,
    table: Optional[torch.Tensor],
    rule: AcceptanceRule,
    omega: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The residual of the rule's convention (module docstring) once the proximity set is known:
    (..., V), p's dtype, rows sum to 1.

    p: (..., V) float; q: (..., V) or None (a point mass at ``draft``); draft: (...) int64 (unused,
    may be None, for ``"exact"`` with a q); j_star: (...) int64 from :func:`grow_proximity_set`
    and table: :func:`rule_table`'s, both read by ``"official"`` only; omega: (...) Cool-SD's
    factor (:func:`relaxation_scale`; None for the other rules): ``norm(max(p - min(q, ω p), 0))``.
    No validation: :func:`residual` is the checked entry point.
    """
    point = q is None
    if omega is not None:
        q = _point_mass(p, draft) if point else q
        # equal to max(p - q, 0) float for float where ω >= 1: min(q, ωp) = q wherever q <= ωp, and both are 0 elsewhere
        return _normalise((p - torch.minimum(q, omega.to(p.dtype).unsqueeze(-1) * p)).clamp_min(0.0), p)
    if rule.convention == "exact" and point:
        # max(p - 1[x̂], 0) is p with x̂ zeroed: p <= 1 (a distribution), so p(x̂) - 1 clamps to 0,
        # and p - 0 == p elsewhere; the same floats without the one-hot and two more passes
        return _normalise(p.scatter(-1, draft.unsqueeze(-1), 0.0), p)
    q = _point_mass(p, draft) if point else q
    if rule.convention == "exact":
        return _normalise((p - q).clamp_min(0.0), p)
    zap = _official_zap(p, draft, j_star, table, rule)
    if point:
        r = p.masked_fill(zap, 0.0).scatter(-1, draft.unsqueeze(-1), 0.0)
    else:
        r = (p - q.masked_fill(zap, 0.0)).clamp_min(0.0)
    return _normalise(r, torch.full_like(p, 1.0 / p.shape[-1]))


def residual(
    p: torch.Tensor,
    q: Optional[torch.Tensor],
    draft: torch.Tensor,
    neighbours: torch.Tensor | None,
    rule: AcceptanceRule,
    validate: bool = True,
    positions=None,
    lengths=None,
) -> torch.Tensor:
    """The distribution to sample (or to judge the next sibling against) after rejecting ``draft``:
    (..., V), p's dtype, rows sum to 1.

    p: (..., V) float; q: (..., V) the distribution the draft was drawn from, or None for a
    deterministic draft (a point mass at ``draft``: EAGLE-2 tree children); draft: (...) int64,
    the rejected tokens; neighbours as in :func:`judge`. ``rule.convention == "exact"``:
    ``norm(max(p - q, 0))`` (module docstring; for a deterministic draft, ``p`` with ``x̂``
    zeroed), ``p`` when it has no mass; ``"official"``: the official LANTERN code's residual
    (module docstring), uniform when it has no mass. ``"cool-sd"``: the TV-optimal residual of
    arXiv 2601.09212 (Theorem 2), ``G* = norm(max(p - min(q, ω p), 0))``, ``p`` when it has no
    mass, with ω the factor of the rejected draft — positions (...) int64 its 0-based place in its
    chain and lengths the chain's length, both required (for ω >= 1 it is ``norm(max(p - q, 0))``).
    ``"fly"`` rejects as ``"sd"``. Call it only where a draft was rejected.
    Raises :class:`UsageError` as :func:`judge`, and for ``"cool-sd"`` without positions / lengths.
    """
    table = rule_table(p, neighbours, rule, validate)
    if validate:
        if q is not None:
            check_q(p, q)
        _check_draft(p, draft)
    idx = draft.long()
    j_star = grow_proximity_set(p, idx.unsqueeze(-1), table, rule)[2].squeeze(-1)
    return convention_residual(
        p, q, idx, j_star, table, rule, relaxation_scale(rule, idx, positions, lengths, chain=False)
    )
