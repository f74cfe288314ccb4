"""What the drafter methods (chains, draft trees) share: the drafter over every slot's pending
positions (EAGLE's re-run on accepted tokens, :func:`pending_features`), a chain of drafts
(:func:`draft_chains`) and the acceptance rule's command-line options (:data:`RULE_OPTIONS`)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ambiguity.cli import finite_float, nonneg_int, positive_int
from ambiguity.knn import DEFAULT_METRIC, METRICS
from ambiguity.neighbourhood import MATRICES
from ambiguity.sampling import expand_rows
from lantern.drafter.model import draft_q
from lantern.engine.options import OptionGroup
from lantern.engine.slots import BatchState
from lantern.rules.acceptance import BOUNDS, CONVENTIONS, RELAXATIONS, RULES, AcceptanceRule

__all__ = ["pending_features", "draft_chains", "RELAXED", "RULE_OPTIONS", "rule_from_args"]


def pending_features(st: BatchState, n, d, drafting) -> torch.Tensor:
    """The drafter over every drafting slot's pending positions ``d_b..n_b-1`` with true target
    features (EAGLE's re-run on accepted tokens; padded to the longest; a slot that does not draft
    runs one throw-away position at ``d_b``). Returns (rows, 1, H): each row's last pending output,
    the feature that drafts ``x̂_{n_b}`` (the root of a draft tree)."""
    dev, H, guided = st.device, st.H, st.guided
    pend = np.where(drafting, n - d, 1)
    Tp = int(pend.max())
    if (d == d[0]).all() and (pend == Tp).all() and d[0] + Tp <= st.N:  # rows together (batch 1): slices
        return _pending_together(st, int(d[0]), Tp)
    d_t = torch.as_tensor(d, device=dev)
    ar = torch.arange(Tp + int(d.max()) + 1, device=dev)
    slots = d_t[:, None] + ar[:Tp]
    pos = slots.clamp(max=st.N - 1)
    toks = st.tokens.gather(1, pos)
    pos_r = expand_rows(pos, guided)
    fin = st.feats.gather(1, pos_r[..., None].expand(-1, -1, H))
    S = int(d.max()) + Tp
    visible = ar[None, None, :S] <= slots[:, :, None]
    f = st.drafter.forward_slots(
        st.model,
        expand_rows(toks, guided),
        fin,
        st.dcache,
        expand_rows(slots, guided),
        pos_r,
        expand_rows(visible, guided),
    )
    last = expand_rows(torch.as_tensor(pend - 1, device=dev), guided)
    return f.gather(1, last[:, None, None].expand(-1, 1, H))


def _pending_together(st: BatchState, d: int, Tp: int) -> torch.Tensor:
    """:func:`pending_features` when every row runs the positions ``d..d+Tp-1`` (``d + Tp <= N``)."""
    R, S = st.rows, d + Tp
    ar = torch.arange(S, device=st.device)
    visible = S if Tp == 1 else (ar[None, :] <= ar[d:, None]).expand(R, Tp, S)
    toks = expand_rows(st.tokens[:, d:S], st.guided)
    rows = ar[d:].expand(R, Tp)
    return st.drafter.forward_slots(st.model, toks, st.feats[:, d:S], st.dcache, rows, rows, visible)[:, -1:]


def draft_chains(st: BatchState, n, d, g, go_on=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft a chain for every slot in ``max(g)`` drafter steps (:func:`lantern.methods.chain.draft`, per row).

    The first forward covers each row's pending positions ``d_b..n_b-1`` (padded to the longest;
    each row's last real output drafts ``x̂_{n_b}``); row b draws only its first ``g_b`` drafts
    from its stream. go_on: None, or ``go_on(j, q)`` -> bool called after step j's drafts are
    drawn (q (B, V) their distributions): False stops drafting there (a draft-length policy,
    :class:`lantern.engine.policy.GammaPolicy`). Returns drafts (B, steps) int64 and q (B, steps, V),
    steps <= max g."""
    dev, B, guided = st.device, st.B, st.guided
    gmax, top = int(g.max()), int(n.max())
    f = pending_features(st, n, d, g > 0)
    at = torch.as_tensor(n, device=dev)[:, None] + torch.arange(gmax, device=dev)  # (B, γ): step j writes at[:, j]
    at_r, pos_r = expand_rows(at, guided), expand_rows(at.clamp(max=st.N - 1), guided)
    if (n == top).all():  # every row at one position (batch 1): step j sees the slots 0..top+j, no mask
        vis_r = None
    else:
        vis = torch.arange(top + gmax, device=dev)[None, None, :] <= at[:, :, None]  # (B, γ, top + γ)
        vis_r = expand_rows(vis, guided)
    xs, qs = [], []
    for j in range(gmax):
        q = draft_q(st.drafter, st.model, f, st.target)[:, -1]  # (B, V)
        x = q.argmax(-1) if st.sampling.greedy else st.streams.categorical(q, range(B), g > j)
        xs.append(x)
        qs.append(q)
        if j + 1 == gmax or (go_on is not None and not go_on(j, q)):
            break
        s = slice(j, j + 1)
        vis_j = top + j + 1 if vis_r is None else vis_r[:, s, : top + j + 1]
        f = st.drafter.forward_slots(
            st.model, expand_rows(x, guided)[:, None], f, st.dcache, at_r[:, s], pos_r[:, s], vis_j
        )
    return torch.stack(xs, 1), torch.stack(qs, 1)


# --------------------------------------------------------------------------- the acceptance rule's options
RELAXED = tuple(m for m in RULES if BOUNDS[m] is not None)  # the rules with a latent neighbourhood
_RULE = AcceptanceRule()  # the rule's defaults are the command's defaults


def _no_neighbourhood(args) -> Optional[str]:
    if args.k == 0:
        return f"with --k 0 (no latent neighbourhood: {args.method} accepts as sd), only with --k >= 1"
    return None


def _bounded_by(method: str) -> str:
    return f" ({method} is bounded by --{BOUNDS[method].parameter})" if method in RELAXED else ""


def _add_convention(g) -> None:
    g.add_argument(
        "--convention",
        default="exact",
        choices=CONVENTIONS,
        help="exact: lossless at δ = 0 (residual norm(max(p-q,0)), recursive over tree siblings); "
        "official: what the official LANTERN code does (its residuals, greedy test and filter "
        "order) (default: exact)",
    )


def _add_k(g) -> None:
    g.add_argument(
        "--k",
        type=nonneg_int,
        default=_RULE.k,
        help=f"latent neighbourhood size |B_k|, 0 <= k < vocabulary size; 0 = plain SD (then --metric and "
        f"--matrix are refused) (default: {_RULE.k})",
    )


def _add_geometry(g) -> None:
    g.add_argument(
        "--metric",
        default=DEFAULT_METRIC,
        choices=METRICS,
        help="latent distance on the VQ codebook (default: l2, as the official LANTERN code)",
    )
    g.add_argument(
        "--matrix",
        default="codebook",
        choices=MATRICES,
        help="rows the distance is measured on: codebook (as the quantiser compares codes), "
        "codebook-raw (the stored weights, as the official code for LlamaGen) (default: codebook)",
    )


_BOUND_HELP = {
    "delta": f"bound δ: TVD (lantern) or JSD in nats (lantern-jsd), in [0, 1] (default: {_RULE.delta:g})",
    "lam": f"relative bound λ >= 1 of lantern++ (default: {_RULE.lam:g})",
}


def _bound_group(parameter: str) -> OptionGroup:
    """The group of one bound parameter: read by the rules of :data:`BOUNDS` it bounds."""
    methods = tuple(m for m in RELAXED if BOUNDS[m].parameter == parameter)

    def add(g):
        g.add_argument(
            f"--{parameter}", type=finite_float, default=getattr(_RULE, parameter), help=_BOUND_HELP.get(parameter)
        )

    return OptionGroup(f"bound {parameter}", methods, add, _no_neighbourhood, _bounded_by)


def _add_cool(g) -> None:
    g.add_argument(
        "--cool-delta",
        type=finite_float,
        default=_RULE.cool_delta,
        help=f"δ >= 1: the mean over a chain of the annealed factor ω on p(x̂) (default: {_RULE.cool_delta:g}; "
        f"the paper's fastest row: 2)",
    )
    g.add_argument(
        "--cool-nu",
        type=finite_float,
        default=_RULE.cool_nu,
        help=f"ν >= 0: ω's decay per chain place (default: {_RULE.cool_nu:g})",
    )


def _add_fly(g) -> None:
    g.add_argument(
        "--fly-entropy",
        type=finite_float,
        default=_RULE.fly_entropy,
        help=f"θ >= 0 nats: a rejection is deferred only where the target's top-3 entropy reaches θ "
        f"(default: {_RULE.fly_entropy:g})",
    )
    g.add_argument(
        "--fly-window",
        type=positive_int,
        default=_RULE.fly_window,
        help=f"W < γ: the following drafts that must pass for a rejection to be deferred (default: {_RULE.fly_window}, "
        f"vLLM's min(6, γ - 1) at γ 4)",
    )


# the options of the rule every drafted method judges with; a relaxed rule's bound parameter gets
# its group from BOUNDS, so a new rule entry brings its flag (and the flag's refusal) with it
def _add_drafter(g) -> None:
    g.add_argument(
        "--drafter",
        default=None,
        metavar="FILE",
        help="drafter .safetensors (default: lantern/weights/<model>_drafter)",
    )


RULE_OPTIONS = (
    OptionGroup("drafter", RULES, _add_drafter),
    OptionGroup("acceptance rule", RULES, _add_convention),
    OptionGroup("latent neighbourhood", RELAXED, _add_k),
    OptionGroup("latent distance", RELAXED, _add_geometry, _no_neighbourhood),
    *(_bound_group(p) for p in dict.fromkeys(BOUNDS[m].parameter for m in RELAXED)),
    OptionGroup("Cool-SD annealing", ("cool-sd",), _add_cool),
    OptionGroup("FLy deferral", ("fly",), _add_fly),
)


def rule_from_args(args) -> dict:
    """The :class:`~lantern.rules.acceptance.AcceptanceRule` fields from the parsed :data:`RULE_OPTIONS`."""
    fields = dict(k=args.k, delta=args.delta, lam=args.lam, convention=args.convention)
    for parameter in RELAXATIONS[args.method].parameters if args.method in RELAXATIONS else ():
        fields[parameter] = getattr(args, parameter)
    return fields
