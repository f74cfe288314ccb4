"""Draft trees on the engine: EAGLE-1 static and EAGLE-2 dynamic trees, both conventions.

Each round every slot drafts its own tree (:mod:`lantern.methods.tree.draft`), one target
forward verifies all trees with tree attention, every image walks its tree with the acceptance
rule (:mod:`lantern.methods.tree.walk`) and commits its accepted path; the keys and values of the
accepted nodes move behind the committed tokens (one indexed copy for all images). With a
:class:`~lantern.engine.policy.NodePolicy` (``gamma="auto"``, dynamic trees) a round is AR's step
where no tree is expected to pay, and the target verifies the candidate count the policy picks
from the tree's own scores.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from lantern.drafter.model import DraftModel
from lantern.engine.loop import engine_rounds
from lantern.engine.method import Method, Round
from lantern.engine.policy import NodePolicy
from lantern.engine.slots import BatchState
from lantern.methods.ar import AR, ar_round
from lantern.methods.chain import Chain
from lantern.methods.tree.draft import tree_round
from lantern.methods.tree.spec import TreeSpec
from lantern.rules.acceptance import AcceptanceRule

__all__ = ["Tree"]


class Tree(Method):
    """A draft tree per slot and round (``--tree static|dynamic``), judged by ``rule``.

    spec: the tree's shape (:class:`~lantern.methods.tree.spec.TreeSpec`, static paths or a
    dynamic node budget); drafter / table as :class:`lantern.methods.chain.Chain`.
    """

    def __init__(
        self,
        rule: AcceptanceRule,
        spec: TreeSpec,
        drafter: DraftModel,
        table: Optional[torch.Tensor],
        policy: Optional[NodePolicy] = None,
    ):
        self.rule, self.spec, self.drafter, self.table, self.policy = rule, spec, drafter, table, policy
        self.name, self.depth, self.spare, self.convention = rule.method, spec.max_depth, spec.nodes, rule.convention

    def open(self, st: BatchState) -> None:
        st.drafter, st.rule, st.table, st.spec = self.drafter, self.rule, self.table, self.spec
        # the tree's drafter nodes after the committed positions, plus one level of padding
        st.dcache = self.drafter.new_cache(st.rows, 2 * self.spec.drafter_nodes + 1)
        if self.policy is not None:
            chain = Chain(self.rule, 2, self.drafter, self.table)
            engine = lambda images: engine_rounds(st, images, AR(), chain)
            self.policy.open(st.model, self.drafter, st.sampling, st.B, self.rule, self.table, engine)
            st.budget = self.policy.budget

    def round(self, st: BatchState, active: np.ndarray) -> Round:
        if self.policy is not None and not self.policy.plan(st.rows):  # AR's step; the drafter catches up later
            return ar_round(st, features=True)
        a, g, kind, nxt, forwards, cols, st.d = tree_round(st, st.n, st.d, active, st.image, st.step)
        if self.policy is not None:
            self.policy.observe(a[active] + 1)
        return Round(a, g, kind, nxt, forwards, cols)
