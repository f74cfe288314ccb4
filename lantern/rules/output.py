"""The exact distribution of the token one verification step emits, by enumeration over the drafts q can draw.

An analysis tool next to the acceptance rules of :mod:`lantern.rules.acceptance` (whose module
docstring defines the rules, the conventions and the notation used here): for one draft position
with target ``p`` and drafter ``q`` (..., V), the emitted token is the draft ``x ~ q`` when the
rule accepts it and a draw from the rule's residual otherwise, so its law is
``out(y) = Σ_x q(x) P(accept x) [y = x] + Σ_x q(x) (1 - P(accept x)) residual_x(y)``, computed
exactly (no sampling). Comparing ``out`` with ``p`` (e.g.
:func:`lantern.rules.divergences.tvd`) gives the distortion a rule introduces per step.

* :func:`output_distribution` — one rule (any method, convention, greedy or sampled).
* :func:`output_distributions` — several rules on the same (p, q), the relaxed ``"exact"`` rules
  sharing one gather and cumulative sum at the largest k (the same floats as one at a time).

Deterministic drafts judged as point masses (the children of an EAGLE-2 tree node) are
:func:`lantern.distortion.sibling_output_distribution`'s.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch

from ambiguity.errors import UsageError
from lantern.rules.acceptance import (
    BOUNDS,
    AcceptanceRule,
    check_q,
    convention_residual,
    grow_proximity_set,
    max_other,
    relaxation_scale,
    rule_table,
)
from lantern.rules.fly import top_entropy

__all__ = ["output_distribution", "output_distributions"]


def output_distribution(
    p: torch.Tensor,
    q: torch.Tensor,
    neighbours: torch.Tensor | None,
    rule: AcceptanceRule,
    greedy: bool = False,
    positions=None,
    lengths=None,
    window_pass=None,
) -> torch.Tensor:
    """The exact distribution of the token one verification step emits: (..., V), p's dtype.

    ``out(y) = Σ_x q(x) P(accept x) [y = x] + Σ_x q(x) (1 - P(accept x)) residual_x(y)``,
    by enumeration over every draft x (no sampling). p, q: (..., V) float; with ``greedy`` q
    is the distribution of the greedy draft (one-hot for a deterministic drafter),
    ``P(accept x)`` is 0 or 1 as in :func:`lantern.rules.acceptance.judge_greedy` and a
    rejection emits ``argmax p``.
    Compare with p, e.g. ``lantern.rules.divergences.tvd(out, p)``, to see a rule's distortion;
    ``"sd"``, or δ = 0 / k = 0 with the ``"exact"`` convention, give ``out == p``. The δ bound
    holds per draft (``S_j* <= δ``), not for ``out``: with the exact residual
    ``TVD(out, p) = Σ_y max(α(y) - p(y), 0) <= Σ_y min(max(q(y) - p(y), 0), δ)``, which can
    exceed δ. Only the drafts q can draw are enumerated (a draft of q = 0 adds nothing). Memory:
    (..., m, k) for p̃ of every drawable draft (m: the most tokens of positive q in a row, e.g. the
    top-k filter's k), plus (..., V, V) for ``"official"``
    (its residual depends on x).

    ``"cool-sd"``: the step at place ``positions`` (int or (...) int64, 0-based) of a chain of
    ``lengths`` drafts, with factor ω: ``P(accept x) = min(1, ω p(x) / q(x))`` and the residual
    ``G*`` (:func:`lantern.rules.acceptance.residual`); with ω >= 1,
    ``TVD(out, p) = Σ_y max(min(q(y), ω p(y)) - p(y), 0)``.
    ``"fly"``: ``window_pass`` (float or (...) in [0, 1], required) is the probability that the
    ``W`` drafts after this one are all natively accepted; a native rejection of x is then
    deferred with probability ``window_pass`` when ``H_3(p) >= θ`` and ``p(x) > 0``, so with the
    gate open and ``q`` putting no mass where ``p`` has none, ``out = p + window_pass (q - p)``
    and ``TVD(out, p) = window_pass TVD(q, p)``. (For drafts drawn from context-free p and q, ``window_pass = β^W`` with
    ``β = Σ min(p, q)``.)
    Raises :class:`UsageError` as :func:`lantern.rules.acceptance.judge`, for ``"cool-sd"``
    without positions / lengths and for ``"fly"`` without ``window_pass`` or with one outside [0, 1].
    """
    table = rule_table(p, neighbours, rule, True)
    check_q(p, q)
    every = torch.arange(p.shape[-1], device=p.device).expand(p.shape)
    drafts = _drawable(q)  # the drafts q can draw: a draft it never draws adds nothing to out
    _, p_tilde, j_star, _ = grow_proximity_set(p, drafts, table, rule)
    p_tilde_all, j_all = p.scatter(-1, drafts, p_tilde), torch.zeros_like(every).scatter(-1, drafts, j_star)
    omega = relaxation_scale(rule, every[..., 0], positions, lengths, chain=False)
    if omega is not None:
        factor = omega.to(p.dtype).unsqueeze(-1)
        p_tilde_all = p * (factor.clamp_min(1.0) if greedy else factor)
    if greedy:
        accept = _deferred_all(p, (p_tilde_all >= max_other(p, every)).to(p.dtype), rule, window_pass)
        rejected = (q * (1 - accept)).sum(-1, keepdim=True)
        top = torch.zeros_like(p).scatter_(-1, p.argmax(-1, keepdim=True), 1.0)
        return q * accept + rejected * top
    safe_q = torch.where(q > 0, q, torch.ones_like(q))
    accept = torch.where(q > 0, (p_tilde_all / safe_q).clamp(max=1.0), torch.ones_like(q))
    accept = _deferred_all(p, accept, rule, window_pass)
    out = q * accept
    weight = q * (1 - accept)  # (..., V): probability of drafting x and rejecting it
    if rule.convention == "exact":
        res = convention_residual(p, q, every[..., 0], j_all[..., 0], table, rule, omega)
        return out + weight.sum(-1, keepdim=True) * res
    rows = p.unsqueeze(-2).expand(*p.shape, p.shape[-1])  # (..., V_x, V_y): the residual after each x
    res = convention_residual(rows, q.unsqueeze(-2).expand_as(rows), every, j_all, table, rule)
    return out + (weight.unsqueeze(-1) * res).sum(-2)


def _drawable(q: torch.Tensor) -> torch.Tensor:
    """The drafts q (..., V) can draw: (..., m) int64, every token of positive q in each row, m the
    most any row has (shorter rows padded with tokens of q = 0); all V tokens when some row has no zero."""
    m = max(1, int((q > 0).sum(-1).max())) if q.numel() else 1
    if m == q.shape[-1]:
        return torch.arange(m, device=q.device).expand(q.shape)
    return q.topk(m, dim=-1).indices


def _deferred_all(p: torch.Tensor, accept: torch.Tensor, rule: AcceptanceRule, window_pass) -> torch.Tensor:
    """FLy: the probability (..., V) of accepting each draft x once its native rejection may be
    deferred, ``a + (1 - a) π [H_3(p) >= θ] [p(x) > 0]`` (π = window_pass); ``accept`` itself for
    the other rules."""
    if rule.method != "fly":
        return accept
    if window_pass is None:
        raise UsageError("fly's output depends on the drafts after this one: pass window_pass in [0, 1]")
    pi = torch.as_tensor(window_pass, dtype=p.dtype, device=p.device)
    if not bool(((pi >= 0) & (pi <= 1)).all()):
        raise UsageError(f"window_pass must be a probability in [0, 1], got {window_pass}")
    gate = (top_entropy(p) >= rule.fly_entropy).unsqueeze(-1) & (p > 0)
    pi = pi.unsqueeze(-1) if pi.ndim else pi
    return accept + (1 - accept) * pi * gate.to(p.dtype)


def output_distributions(
    p: torch.Tensor, q: torch.Tensor, neighbours: torch.Tensor | None, rules: list[AcceptanceRule]
) -> list[torch.Tensor]:
    """:func:`output_distribution` of several rules on the same (p, q): a list of (..., V), one per
    rule in order, each equal (the same floats) to ``output_distribution(p, q, neighbours, rule)``.

    The relaxed rules of the ``"exact"`` convention share the work that dominates at a large
    codebook: one (..., m, K) gather of p over the neighbours of every token q can draw (m of them,
    :func:`output_distribution`) and its cumulative sum,
    with K the largest k among them (a rule with a smaller k reads the first k columns: prefix
    sums of a prefix are the same floats), one bound evaluation per (method, bound value) on that
    tensor (the leading run of neighbours within the bound, cut at each rule's k), and one exact
    residual ``norm(max(p - q, 0))``, which no rule changes. At V = 16384 and the paper's 3 x 4
    (k, δ) grid that is about one k = 1000 pass instead of twelve passes. Other rules (``"sd"``,
    k = 0, ``"official"``) go through :func:`output_distribution` one by one.

    p, q: (..., V) float; neighbours: (V, >= every relaxed rule's k) int64 (nearest first), or
    None when no rule is relaxed. Memory: (..., m, K) p.dtype and bool tensors.
    Raises :class:`UsageError` as :func:`output_distribution`.
    """
    shared = [i for i, r in enumerate(rules) if r.relaxed and r.convention == "exact"]
    out: list[Optional[torch.Tensor]] = [None] * len(rules)
    for i, rule in enumerate(rules):
        if i not in shared:
            out[i] = output_distribution(p, q, neighbours, rule)
    if not shared:
        return out
    K = max(rules[i].k for i in shared)
    table = rule_table(p, neighbours, replace(rules[shared[0]], k=K), True)
    check_q(p, q)
    drafts = _drawable(q)  # (..., m): the drafts q can draw (the others add nothing to out)
    rows = p.unsqueeze(-2).expand(*drafts.shape, p.shape[-1])
    moved = rows.gather(-1, table[:, :K][drafts]).cumsum(-1)  # (..., m, K): S_1..S_K of every drawable draft
    p_d, q_d = p.gather(-1, drafts), q.gather(-1, drafts)
    a = p_d.unsqueeze(-1)  # (..., m, 1): p(x̂)
    residual_exact = convention_residual(p, q, None, None, None, rules[shared[0]])
    safe_q = torch.where(q_d > 0, q_d, torch.ones_like(q_d))
    zero = torch.zeros_like(p_d)
    first_break: dict = {}  # (method, bound value) -> (..., V) int64: length of the leading run within the bound
    tvd_bounds = sorted({rules[i].delta for i in shared if rules[i].method == "lantern"})
    if tvd_bounds and bool((moved[..., 1:] >= moved[..., :-1]).all()):
        # S_j <= δ on non-decreasing S_j: the leading run is the count of S_j <= δ, every δ in one search
        values = torch.tensor(tvd_bounds, dtype=p.dtype, device=p.device).expand(*moved.shape[:-1], len(tvd_bounds))
        counts = torch.searchsorted(moved, values.contiguous(), right=True)
        first_break.update({("lantern", d): counts[..., c] for c, d in enumerate(tvd_bounds)})
    for i in shared:
        rule = rules[i]
        bound = BOUNDS[rule.method]
        key = (rule.method, getattr(rule, bound.parameter))
        if key not in first_break:
            broken = ~bound.within(rule, a, moved, bound.spent(a, moved))
            first = broken.to(torch.uint8).argmax(-1)  # the first True (0 when none)
            first_break[key] = torch.where(broken.any(-1), first, torch.full_like(first, K))
        j_star = first_break[key].clamp(max=rule.k)  # the set stops at the first neighbour that breaks the bound
        last = (j_star - 1).clamp_min(0).unsqueeze(-1)
        s_star = torch.where(j_star > 0, moved.gather(-1, last).squeeze(-1), zero)
        p_tilde = p_d + s_star
        accept_d = torch.where(q_d > 0, (p_tilde / safe_q).clamp(max=1.0), torch.ones_like(q_d))
        accept = torch.ones_like(q).scatter(-1, drafts, accept_d)
        weight = q * (1 - accept)
        out[i] = q * accept + weight.sum(-1, keepdim=True) * residual_exact
    return out
