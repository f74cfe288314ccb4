"""What SJD-PAC (:mod:`lantern.methods.sjd_pac.method`) runs with: :class:`PacConfig` (window, tree
width and depth, continuation rule) at the official defaults, the node layout of its draft tree
(:func:`pac_tree`), the check of a config against a model (:func:`check_pac`) and its
command-line options (:data:`OPTIONS`).

Source: Kang et al., "SJD-PAC: Accelerating Speculative Jacobi Decoding via Proactive Drafting and
Adaptive Continuation", CVPR 2026, arXiv 2603.18599; official code github.com/KangJialiang/SJD-PAC,
``scheduler/sjd_pac_iteration_lumina_mgpt.py`` (``generate_tree_mask_and_retrieve``,
``_init_new_params``: ``max_num_new_tokens = 64``, ``tree_width = 3``, ``tree_depth = 3``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ambiguity.errors import UsageError
from ambiguity.models.base import TokenModel
from lantern.engine.options import OptionGroup

__all__ = ["CONTINUATIONS", "DEFAULT_WINDOW", "PacConfig", "PacTree", "pac_tree", "check_pac", "OPTIONS", "from_args"]

CONTINUATIONS = ("adaptive", "resample")
DEFAULT_WINDOW = 64  # the official max_num_new_tokens (test_lumina_mgpt.py, _init_new_params)


def _count(value, flag: str, what: str) -> None:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise UsageError(f"{flag} ({what}) must be an integer >= 1, got {value}")


def tree_nodes(width: int, depth: int) -> int:
    """Nodes of the full ``width``-ary tree of ``depth`` levels, the root counted: (K^D - 1)/(K - 1)."""
    return depth if width == 1 else (width**depth - 1) // (width - 1)


@dataclass(frozen=True)
class PacConfig:
    """SJD-PAC's knobs (defaults: the official code for Lumina-mGPT).

    window: tokens per target forward L >= 1, the root included (the official
    ``max_num_new_tokens``; None: 64); width: K >= 1 siblings at each branching draft position
    (official ``tree_width`` 3); depth: D >= 1 levels of the K-ary tree, the root counted, so the
    first D - 1 draft positions branch (official ``tree_depth`` 3); the rest of the window is a
    chain after the first sibling of each level. continuation: ``"adaptive"`` (the paper's AC:
    after the first rejection each later draft is kept with probability ``min(1, p/q)`` against
    this forward's stale ``p``, else redrawn from ``norm(max(p - q, 0))``) or ``"resample"`` (SJD:
    later positions draw afresh from ``p``). Raises :class:`UsageError` for a bad value or a tree
    with more nodes than the window.
    """

    window: Optional[int] = None
    width: int = 3
    depth: int = 3
    continuation: str = "adaptive"
    method: str = field(default="sjd-pac", init=False)

    def __post_init__(self):
        if self.window is None:
            object.__setattr__(self, "window", DEFAULT_WINDOW)
        if self.window == "auto":
            raise UsageError("--window auto picks the windows of sjd, gsd, scd and entropy-sd; give sjd-pac --window N")
        _count(self.window, "--window", "tokens per SJD-PAC forward")
        _count(self.width, "--pac-width", "siblings per branching draft position")
        _count(self.depth, "--pac-depth", "levels of the draft tree, the root counted")
        if self.continuation not in CONTINUATIONS:
            raise UsageError(f"--pac-continuation must be one of {', '.join(CONTINUATIONS)}, got {self.continuation!r}")
        nodes = tree_nodes(self.width, self.depth)
        if nodes > self.window:
            raise UsageError(
                f"a {self.width}-ary tree of {self.depth} levels has {nodes} nodes, more than --window "
                f"{self.window}; use --window {nodes} or more, or a smaller --pac-width / --pac-depth"
            )

    @property
    def draft_depth(self) -> int:
        """The longest accepted run of one forward: the drafts of the tree's main path
        (:attr:`PacTree.main` - 1)."""
        return pac_tree(self.window, self.width, self.depth).main - 1

    def as_dict(self) -> dict:
        """The knobs (JSON-able), prefixed ``pac_``."""
        return dict(
            pac_window=int(self.window),
            pac_width=int(self.width),
            pac_depth=int(self.depth),
            pac_continuation=self.continuation,
        )


@dataclass(frozen=True)
class PacTree:
    """The nodes one SJD-PAC forward reads, in column order (T = window nodes).

    parent / depth / branch: (T,) host tuples (root: parent -1, depth 0, branch 0); branch is a
    node's trial order among its siblings. Columns ``0..M-1`` are the *main path* (the first
    sibling at every level, then the chain): ``main[d] = d``; the other branches of the tree
    follow, level by level in lexicographic order of their branch digits. children: per node its
    children in trial order (a K-ary node: K; a main node at depth >= D - 1: its chain child; an
    other leaf: none). ancestors: (T, T) bool, ``ancestors[i, j]``: j is i or one of its ancestors.
    """

    parent: tuple
    depth: tuple
    branch: tuple
    children: tuple
    main: int
    ancestors: torch.Tensor

    @property
    def nodes(self) -> int:
        return len(self.parent)


def pac_tree(window: int, width: int, depth: int) -> PacTree:
    """The official SJD-PAC tree (``generate_tree_mask_and_retrieve``): a full ``width``-ary tree
    of ``depth`` levels whose all-first-sibling path continues as a chain to ``window`` nodes.
    The main path has ``M = depth + window - (K^D - 1)/(K - 1)`` nodes (the official 54 for
    L = 64, K = 3, D = 3). Raises UsageError (via :class:`PacConfig`) when the tree does not fit."""
    PacConfig(window, width, depth)
    M = depth + window - tree_nodes(width, depth)
    index = {(0,) * d: d for d in range(min(depth, M))}  # branch digits -> column; main path first
    parent, dep, branch = [-1] + list(range(M - 1)), list(range(M)), [0] * M
    for d in range(1, depth):
        for digits in _digits(width, d):
            if digits in index:
                continue
            index[digits] = len(parent)
            parent.append(index[digits[:-1]])
            dep.append(d)
            branch.append(digits[-1])
    children = [[] for _ in parent]
    for t in range(1, len(parent)):
        children[parent[t]].append(t)
    children = tuple(tuple(sorted(c, key=lambda t: branch[t])) for c in children)
    anc = torch.zeros(len(parent), len(parent), dtype=torch.bool)
    for t in range(len(parent)):
        s = t
        while s >= 0:
            anc[t, s] = True
            s = parent[s]
    return PacTree(tuple(parent), tuple(dep), tuple(branch), children, M, anc)


def _digits(width: int, d: int):
    """Every branch-digit tuple of length d, lexicographic."""
    if d == 0:
        yield ()
        return
    for head in _digits(width, d - 1):
        for b in range(width):
            yield head + (b,)


def check_pac(config: PacConfig, model: TokenModel) -> None:
    """Raise UsageError when ``model`` cannot run ``config``: a window longer than the tokens per
    image (``model.num_tokens``), or more siblings per position than the vocabulary has codes."""
    if config.window > model.num_tokens:
        raise UsageError(
            f"--window must be <= {model.num_tokens}, the tokens per image of {model.name}; got {config.window}"
        )
    if config.width > model.vocab_size:
        raise UsageError(
            f"--pac-width {config.width} exceeds the vocabulary size {model.vocab_size} of {model.name}; "
            f"use --pac-width {model.vocab_size} or less"
        )


# --------------------------------------------------------------------------- command-line options
_P = PacConfig()


def _add_pac(g) -> None:
    g.add_argument(
        "--pac-width", type=int, default=_P.width, help=f"K siblings per branching draft position (official {_P.width})"
    )
    g.add_argument(
        "--pac-depth",
        type=int,
        default=_P.depth,
        help=f"D levels of the K-ary draft tree, the root counted (official {_P.depth})",
    )
    g.add_argument(
        "--pac-continuation",
        default=_P.continuation,
        choices=CONTINUATIONS,
        help="drafts after the first rejection: adaptive (kept with min(1, p/q), the paper's AC) or "
        "resample (SJD) (default: adaptive)",
    )


OPTIONS = (OptionGroup("SJD-PAC tree", ("sjd-pac",), _add_pac),)


def from_args(args) -> dict:
    """The :class:`PacConfig` fields from the parsed :data:`OPTIONS` (and the shared ``--window``)."""
    return dict(window=args.window, width=args.pac_width, depth=args.pac_depth, continuation=args.pac_continuation)
