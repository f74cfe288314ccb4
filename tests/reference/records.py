"""The per-image record log of the reference loops (the engine keeps its records in
:class:`lantern.engine.records.Book`)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from lantern.engine.records import DRAFT_COLUMNS, STEP_COLUMNS, tree_rows


def _empty(columns) -> dict:
    return {c: np.array([]) for c in columns}


class StepLog:
    """Accumulates the records of one image while it is decoded (used by :mod:`lantern.engine.decode`).

    :meth:`add_step` takes tensors on any device; they are moved to the CPU once, in
    :meth:`tables`, so logging does not synchronise the accelerator more than decoding does.
    """

    def __init__(self, image: int = 0):
        self.image = image
        self.steps: list[dict] = []
        self.drafts: list[dict] = []

    def add_step(
        self,
        step: int,
        position: int,
        drafted: int,
        accepted: int,
        next_kind: str,
        next_token: int,
        seconds: dict,
        drafts: Optional[dict] = None,
        drafter_forwards: int = 0,
        batch_step: Optional[int] = None,
        active: int = 1,
    ) -> None:
        """One verification step; ``drafts`` maps draft columns to (γ,) tensors of a chain (absent
        when γ = 0), or — with a ``reached`` column — to the complete per-node arrays of a tree.
        batch_step / active: the batch forward and its image count (default: ``step`` and 1, one
        image at a time; batched Jacobi decoding, :func:`lantern.methods.jacobi.method.batched_jacobi_decode`)."""
        self.steps.append(
            dict(
                image=self.image,
                step=step,
                position=position,
                drafted=drafted,
                accepted=accepted,
                emitted=accepted + 1,
                next_kind=next_kind,
                next_token=next_token,
                drafter_forwards=drafter_forwards,
                target_s=seconds.get("target", 0.0),
                drafter_s=seconds.get("drafter", 0.0),
                acceptance_s=seconds.get("acceptance", 0.0),
                proximity_s=seconds.get("proximity", 0.0),
                batch_step=step if batch_step is None else batch_step,
                active=active,
            )
        )
        if drafts is not None and drafted > 0:
            chain = "reached" not in drafts  # a tree brings its own per-node positions
            self.drafts.append(
                dict(drafts, step=step, accepted_count=accepted, **({"position": position} if chain else {}))
            )

    def tables(self) -> tuple[dict, dict]:
        """(steps, drafts) as dicts of numpy columns (see the module docstring)."""
        steps = {c: np.array([s[c] for s in self.steps]) for c in STEP_COLUMNS}
        if not self.steps:
            steps = _empty(STEP_COLUMNS)
        if not self.drafts:
            return steps, _empty(DRAFT_COLUMNS)
        cols: dict[str, list] = {c: [] for c in DRAFT_COLUMNS}
        for d in self.drafts:
            rows = tree_rows(d) if "reached" in d else _chain_rows(d)
            g = len(rows["token"])
            rows["image"], rows["step"] = np.full(g, self.image), np.full(g, d["step"])
            rows["out_of_support"] = rows["committed"] & (rows["p_draft"] == 0)
            rows.setdefault("proposed_step", np.full(g, d["step"]))  # a drafter proposes in its own step
            for c in DRAFT_COLUMNS:
                cols[c].append(rows[c])
        return steps, {c: np.concatenate(v) for c, v in cols.items()}


def _chain_rows(d: dict) -> dict:
    """Columns of one chain step from its (γ,) tensors: the accepted prefix is committed."""
    g = int(d["token"].numel())
    idx = np.arange(g)
    a = d["accepted_count"]
    rows = {
        "draft_index": idx,
        "position": d["position"] + idx,
        "accepted": d["accepted"].cpu().numpy().astype(bool),
        "reached": idx <= a,
        "committed": idx < a,
        "node": idx + 1,
        "parent": idx,
        "depth": idx + 1,
        "sibling": np.zeros(g, dtype=np.int64),
    }
    for c in (
        "token",
        "p_draft",
        "q_draft",
        "p_tilde",
        "j_star",
        "spent",
        "accept_prob",
        "u",
        "p_top1",
        "p_entropy",
        "q_top1",
    ) + (("proposed_step",) if "proposed_step" in d else ()):
        rows[c] = (
            d[c].cpu().numpy().astype(np.int64)
            if c in ("token", "j_star", "proposed_step")
            else d[c].detach().double().cpu().numpy()
        )
    return rows
