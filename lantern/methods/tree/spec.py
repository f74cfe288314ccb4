"""What shape a draft tree has: the :class:`TreeSpec` of a chain, an EAGLE-1 static tree (child-rank
paths, the official shapes by name in :data:`STATIC_TREES`) or an EAGLE-2 dynamic tree (total
tokens, depth, top-k; Li et al. 2024, arXiv 2406.16858, Sec. 4), the checks of a static shape,
and ``--tree`` parsing. :mod:`lantern.methods.tree.draft` drafts the trees.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from ambiguity.cli import positive_int
from ambiguity.errors import FieldError, UsageError
from lantern.engine.options import OptionGroup
from lantern.rules.acceptance import RELAXATIONS, RULES

__all__ = ["STATIC_TREES", "TREE_KINDS", "TreeSpec", "check_paths", "parse_tree", "tree_kind", "TREE_RULES", "OPTIONS"]

# The official trees (jadohu/LANTERN models/drafters/choices.py, from EAGLE/Medusa): child-rank paths.
# fmt: off
STATIC_TREES: dict[str, tuple[tuple[int, ...], ...]] = {
    "mc_sim_7b_63": (
        (0,), (1,), (2,), (3,),
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0), (0, 2, 1), (1, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2),
        (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
    ),
    "mc_sim_7b_63_balanced": (
        (0,), (1,), (2,),
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2),
        (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
    ),
    "naive_extend_57": (
        (0,), (1,), (2,), (3,), (4,),
        (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (4, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 2, 0), (0, 2, 1), (0, 2, 2),
        (0, 3, 0), (0, 3, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 3), (0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 1, 2), (0, 0, 2, 0),
        (0, 0, 2, 1), (0, 0, 3, 0), (0, 1, 0, 0), (0, 1, 0, 1), (0, 1, 1, 0), (0, 2, 0, 0),
        (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 1, 0), (0, 0, 0, 1, 1), (0, 0, 1, 0, 0),
        (0, 0, 1, 0, 1), (0, 0, 1, 1, 0), (0, 0, 2, 0, 0),
    ),
    "medusa_2_7b_63": tuple(
        [(i,) for i in range(10)]
        + [(0, i) for i in range(10)]
        + [(1, i) for i in range(5)]
        + [(2, 0), (2, 1), (3, 0), (3, 1), (4, 0), (5, 0), (6, 0), (7, 0)]
        + [(0, 0, i) for i in range(9)]
        + [(0, 1, i) for i in range(4)]
        + [(0, 2, 0), (0, 2, 1), (0, 3, 0), (0, 4, 0), (0, 5, 0)]
        + [(1, 0, 0), (1, 0, 1), (1, 0, 2), (1, 1, 0), (2, 0, 0)]
        + [(0, 0, 0, i) for i in range(4)]
        + [(0, 0, 1, 0), (0, 0, 2, 0), (0, 1, 0, 0)]
    ),
    "reverse_balanced_25": (
        (0,), (1,), (2,),
        (0, 0), (0, 1), (1, 0), (2, 0),
        (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (1, 0, 0),
        (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 1, 0), (0, 0, 1, 1),
        (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 0, 3), (0, 0, 0, 1, 0), (0, 0, 0, 1, 1),
        (0, 0, 0, 1, 2),
    ),
    "chain": ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)),
}
# fmt: on
TREE_KINDS = ("chain", "static", "dynamic")


# --------------------------------------------------------------------------- specification
@dataclass(frozen=True)
class TreeSpec:
    """How to draft: a chain (``lantern.engine.decode``'s γ), a static tree or an EAGLE-2 dynamic tree.

    kind: ``"chain"`` | ``"static"`` | ``"dynamic"``. paths (static): child-rank paths, each
    path's prefixes present (validated), e.g. ``((0,), (1,), (0, 0))``; name: the shape's name.
    total_tokens (dynamic): nodes of the tree, the root included (official 59); depth (dynamic):
    expansion rounds after the root's children, the deepest draft sits at ``depth + 1``
    (official 4); top_k (dynamic): children per expanded node and beam width (official 10).
    Raises :class:`UsageError` for a shape that is not a tree, ``total_tokens < 2``, ``depth < 1``
    or ``top_k < 1``.
    """

    kind: str = "dynamic"
    paths: tuple[tuple[int, ...], ...] = ()
    name: str = ""
    total_tokens: int = 59
    depth: int = 4
    top_k: int = 10

    def __post_init__(self):
        if self.kind not in TREE_KINDS:
            raise UsageError(f"unknown tree kind {self.kind!r}; use chain, dynamic or a static tree name")
        if self.kind == "dynamic":
            for name, low in (("total_tokens", 2), ("depth", 1), ("top_k", 1)):
                v = getattr(self, name)
                if isinstance(v, bool) or int(v) != v or v < low:
                    raise FieldError("TreeSpec", name, f"must be an integer >= {low}, got {v}")
        if self.kind == "static":
            object.__setattr__(self, "paths", check_paths(self.paths))

    @property
    def max_depth(self) -> int:
        """Depth of the deepest draft (a chain: γ is the decoder's)."""
        if self.kind == "dynamic":
            return self.depth + 1
        return max((len(p) for p in self.paths), default=0)

    @property
    def nodes(self) -> int:
        """The most nodes a tree of this spec verifies, the root included."""
        return self.total_tokens if self.kind == "dynamic" else len(self.paths) + 1

    @property
    def drafter_nodes(self) -> int:
        """The most nodes the drafter runs while drafting one tree (its cache needs that room)."""
        if self.kind == "dynamic":
            return self.depth * self.top_k
        return len(self.paths)

    @property
    def label(self) -> str:
        if self.kind == "dynamic":
            return f"dynamic({self.total_tokens},{self.depth},{self.top_k})"
        return self.name or self.kind

    def as_dict(self) -> dict:
        d = asdict(self)
        d["paths"] = [list(p) for p in self.paths]
        return d


def check_paths(paths) -> tuple[tuple[int, ...], ...]:
    """Validate static-tree paths -> sorted by (depth, path). Raises UsageError when a path is
    empty or has a negative rank, a path repeats, a path's parent path is missing, or a rank
    skips one (children are the top ranks 0, 1, 2, ... of their parent)."""
    try:
        out = [tuple(int(r) for r in p) for p in paths]
    except (TypeError, ValueError):
        raise UsageError("a static tree is a list of paths of child ranks, e.g. [[0], [1], [0, 0]]") from None
    if not out:
        raise UsageError("the static tree has no paths; give at least [[0]]")
    seen = set(out)
    if len(seen) != len(out):
        raise UsageError("the static tree lists a path twice; list each node once")
    for p in out:
        if not p or min(p) < 0:
            raise UsageError(f"static tree path {list(p)} is empty or has a negative rank; ranks start at 0")
        if len(p) > 1 and p[:-1] not in seen:
            raise UsageError(f"static tree path {list(p)} has no parent {list(p[:-1])}: not a tree")
        if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in seen:
            raise UsageError(
                f"static tree path {list(p)} has no elder sibling {list(p[:-1] + (p[-1] - 1,))}; "
                f"child ranks must be 0, 1, 2, ... without gaps"
            )
    return tuple(sorted(out, key=lambda p: (len(p), p)))


def parse_tree(text: str, total_tokens: int = 59, depth: int = 4, top_k: int = 10) -> Optional[TreeSpec]:
    """``--tree``: ``chain`` (None: the decoder's chain of γ drafts), ``dynamic`` (with
    ``total_tokens``, ``depth``, ``top_k``), a name of :data:`STATIC_TREES`, or a JSON file with a
    list of paths. Raises UsageError for anything else."""
    if text == "chain":
        return None
    if text == "dynamic":
        return TreeSpec("dynamic", total_tokens=total_tokens, depth=depth, top_k=top_k)
    if text in STATIC_TREES:
        return TreeSpec("static", STATIC_TREES[text], name=text)
    path = Path(text).expanduser()
    if path.suffix == ".json" and path.is_file():
        try:
            return TreeSpec("static", check_paths(json.loads(path.read_text())), name=path.stem)
        except UsageError as exc:
            raise UsageError(f"--tree {path}: {exc}") from None
        except (OSError, ValueError):
            raise UsageError(
                f"--tree {path} is not readable JSON; write a list of paths like [[0], [1], [0, 0]]"
            ) from None
    if (path.suffix == ".json" or "/" in text or "\\" in text) and not path.exists():
        raise UsageError(f"--tree {text} does not exist; give a .json file of paths like [[0], [1], [0, 0]]")
    static = ", ".join(n for n in STATIC_TREES if n != "chain")
    raise UsageError(f"unknown --tree {text!r}; use chain, dynamic, one of {static} or a .json file of paths")


def tree_kind(tree: str) -> str:
    """``--tree`` text -> ``"chain"``, ``"dynamic"`` or ``"static"`` (a named or .json tree)."""
    return tree if tree in ("chain", "dynamic") else "static"


# --------------------------------------------------------------------------- command-line options
_NAMED = [name for name in STATIC_TREES if name != "chain"]  # the static shapes (chain is --tree chain)


def _add_tree(g) -> None:
    g.add_argument(
        "--tree",
        default="chain",
        metavar="SHAPE",
        help=f"chain (γ drafts), dynamic (EAGLE-2), a static EAGLE-1 tree ({', '.join(_NAMED)}) or "
        f"a .json list of child-rank paths (default: chain)",
    )


def _add_dynamic(g) -> None:
    d = TreeSpec()
    g.add_argument(
        "--total-tokens",
        type=positive_int,
        default=d.total_tokens,
        help=f"nodes incl. the root (official {d.total_tokens})",
    )
    g.add_argument(
        "--depth",
        type=positive_int,
        default=d.depth,
        help=f"expansion rounds; the deepest draft is depth + 1 (official {d.depth})",
    )
    g.add_argument(
        "--tree-top-k",
        type=positive_int,
        default=d.top_k,
        help=f"children per node and beam width (official {d.top_k})",
    )


def _not_dynamic(args) -> Optional[str]:
    kind = tree_kind(args.tree)
    if kind == "dynamic":
        return None
    shape = "--tree chain" if kind == "chain" else f"--tree {args.tree} (static)"
    return f"to {shape}, only to --tree dynamic"


TREE_RULES = tuple(m for m in RULES if m not in RELAXATIONS)  # a chain-place relaxation (cool-sd, fly) has no tree
# --tree is read by every drafted method but those; the EAGLE-2 knobs size a dynamic tree only
# (a static tree is its paths)
OPTIONS = (
    OptionGroup("draft shape", TREE_RULES, _add_tree),
    OptionGroup("EAGLE-2 dynamic tree", TREE_RULES, _add_dynamic, _not_dynamic),
)
