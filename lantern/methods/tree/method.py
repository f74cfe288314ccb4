"""Draft trees on the engine: EAGLE-1 static and EAGLE-2 dynamic trees, both conventions.

Each round every slot drafts its own tree (:mod:`lantern.methods.tree.draft`), one target
forward verifies all trees with tree attention, every image walks its tree with the acceptance
rule (:mod:`lantern.methods.tree.walk`) and commits its accepted path; the keys and values of the
accepted nodes move behind the committed tokens (one indexed copy for all images).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from lantern.drafter.model import DraftModel
from lantern.engine.method import Method, Round
from lantern.engine.slots import BatchState
from lantern.methods.tree.draft import tree_round
from lantern.methods.tree.spec import TreeSpec
from lantern.rules.acceptance import AcceptanceRule

__all__ = ["Tree"]


class Tree(Method):
    """A draft tree per slot and round (``--tree static|dynamic``), judged by ``rule``.

    spec: the tree's shape (:class:`~lantern.methods.tree.spec.TreeSpec`, static paths or a
    dynamic node budget); drafter / table as :class:`lantern.methods.chain.Chain`.
    """

    def __init__(self, rule: AcceptanceRule, spec: TreeSpec, drafter: DraftModel, table: Optional[torch.Tensor]):
        self.rule, self.spec, self.drafter, self.table = rule, spec, drafter, table
        self.name, self.depth, self.spare, self.convention = rule.method, spec.max_depth, spec.nodes, rule.convention

    def open(self, st: BatchState) -> None:
        st.drafter, st.rule, st.table, st.spec = self.drafter, self.rule, self.table, self.spec
        # the tree's drafter nodes after the committed positions, plus one level of padding
        st.dcache = self.drafter.new_cache(st.rows, 2 * self.spec.drafter_nodes + 1)

    def round(self, st: BatchState, active: np.ndarray) -> Round:
        a, g, kind, nxt, forwards, cols, st.d = tree_round(st, st.n, st.d, active, st.image, st.step)
        return Round(a, g, kind, nxt, forwards, cols)
