"""Which decoding flags of ``python -m lantern.generate`` apply to which method and draft shape.

A flag given for a method or ``--tree`` that does not read it is refused in one line (exit 2)
instead of being silently ignored: :data:`FLAG_METHODS` (dest -> methods) and :data:`FLAG_TREES`
(dest -> tree kinds) say who reads what, :func:`record_typed` makes the parser record the flags
actually typed (default values included; no second parse of the command line) and
:func:`check_flags_apply` raises the :class:`~ambiguity.errors.UsageError`.
"""

from __future__ import annotations

import argparse
from typing import Optional

from ambiguity.errors import UsageError
from lantern.methods.jacobi.config import JACOBI_METHODS
from lantern.rules.acceptance import BOUNDS, RULES

__all__ = ["RELAXED", "FLAG_METHODS", "FLAG_TREES", "tree_kind", "record_typed", "check_flags_apply"]


# the decoding options each method reads (dest -> methods); one given for another method is refused.
# The bound flags follow lantern.rules.acceptance.BOUNDS: sd reads no neighbourhood flag, lantern and
# lantern-jsd read --delta (a TVD or a JSD bound), lantern++ reads --lam.
RELAXED = tuple(m for m in RULES if BOUNDS[m] is not None)
FLAG_METHODS = {
    **dict.fromkeys(("gamma", "tree", "total_tokens", "depth", "tree_top_k", "convention"), RULES),
    **dict.fromkeys(("k", "metric", "matrix"), RELAXED),
    **{p: tuple(m for m in RELAXED if BOUNDS[m].parameter == p) for p in ("delta", "lam")},
    **dict.fromkeys(("window", "jacobi_init"), JACOBI_METHODS),
    **dict.fromkeys(("gsd_group", "gsd_prob_gap", "gsd_distance"), ("gsd",)),
    "scd_coupling": ("scd",),
}
# the draft-shape options each --tree reads (dest -> tree kinds): γ sizes a chain only (a tree
# has its own depth), the EAGLE-2 knobs size a dynamic tree only (a static tree is its paths)
FLAG_TREES = {"gamma": ("chain",), **dict.fromkeys(("total_tokens", "depth", "tree_top_k"), ("dynamic",))}


def tree_kind(tree: str) -> str:
    """``--tree`` text -> ``"chain"``, ``"dynamic"`` or ``"static"`` (a named or .json tree)."""
    return tree if tree in ("chain", "dynamic") else "static"


class _Typed(argparse._StoreAction):
    """``store`` that also records its dest in the namespace's ``typed`` set: the flags the user
    actually typed, at their default value or not (:func:`record_typed`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        namespace.typed = getattr(namespace, "typed", set()) | {self.dest}


def record_typed(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make every value option added to ``parser`` from now on record itself in ``args.typed`` when
    typed (no second parse of the command line). Call before adding the options; returns ``parser``."""
    parser.register("action", None, _Typed)
    parser.register("action", "store", _Typed)
    return parser


def check_flags_apply(method: str, given: set[str], tree: str = "chain", k: Optional[int] = None) -> None:
    """Raise UsageError for a decoding option in ``given`` (dests) that ``method`` with ``--tree
    tree`` and ``--k k`` ignores: by :data:`FLAG_METHODS`, tree, γ and neighbourhood flags with
    ``ar`` or a Jacobi method, ``--k --delta --lam --metric --matrix`` with ``sd``, ``--delta`` with
    ``lantern++`` and ``--lam`` with ``lantern``/``lantern-jsd``, Jacobi knobs with the others;
    ``--delta --lam --metric --matrix`` with ``k == 0`` (no latent neighbourhood: every rule
    accepts as ``sd``, :attr:`lantern.rules.acceptance.AcceptanceRule.relaxed`); by :data:`FLAG_TREES`,
    ``--gamma`` with a tree and ``--total-tokens --depth --tree-top-k`` with a chain or a static
    tree. The line names the methods, ``--k`` or trees the flag is for."""
    for dest, methods in FLAG_METHODS.items():
        if dest in given and method not in methods:
            flag = "--" + dest.replace("_", "-")
            hint = ""
            if method in RELAXED and dest in ("delta", "lam"):
                hint = f" ({method} is bounded by --{BOUNDS[method].parameter})"
            raise UsageError(f"{flag} does not apply to --method {method}, only to {', '.join(methods)}{hint}; drop it")
    if k == 0:
        for dest in ("delta", "lam", "metric", "matrix"):
            if dest in given:
                raise UsageError(
                    f"--{dest} does not apply with --k 0 (no latent neighbourhood: {method} accepts as sd), "
                    f"only with --k >= 1; drop it"
                )
    kind = tree_kind(tree)
    for dest, kinds in FLAG_TREES.items():
        if dest in given and kind not in kinds:
            flag = "--" + dest.replace("_", "-")
            shape = "--tree chain" if kind == "chain" else f"--tree {tree}" + (" (static)" if kind == "static" else "")
            why = " (a tree sets its own depth)" if dest == "gamma" else ""
            raise UsageError(f"{flag} does not apply to {shape}{why}, only to --tree {' or '.join(kinds)}; drop it")
