"""What a decoding method is to the engine: a :class:`Method` with one :meth:`~Method.round`.

The engine (:func:`lantern.engine.loop.run`) owns the slots, the caches, the random streams, the
committed tokens and the records; a method owns only what it adds to that state (a drafter's
cache, the Jacobi windows) and one round of its algorithm over every slot at once: draft,
verify with one target forward, accept, and write the committed tokens (and target features)
into the engine's buffers. A round returns a :class:`Round`: per slot, how many drafts it
judged and accepted, how the next token was drawn, and the draft records of the live slots.
Batch 1 is ``B = 1``: there is no second loop.

Adding a method is one module (its config, its options, its round) plus one line in
:data:`lantern.methods.registry.METHODS`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

__all__ = ["Round", "Method"]


@dataclass
class Round:
    """One engine step's outcome, host numpy arrays over the B slots (empty slots: zeros).

    accepted: (B,) int64 accepted drafts ``a``; drafted: (B,) int64 drafts judged ``g`` (a
    tree's node budget: its nodes; a Jacobi window: its drafts); kind: (B,) int64 index into
    :data:`lantern.engine.records.NEXT_KINDS` (how the token after the accepted ones was drawn);
    next_token: (B,) int64; forwards: (B,) int64 drafter forwards (None: equal to ``drafted``);
    drafts: the draft-record columns of the live slots (:func:`lantern.engine.records.chain_rows`
    or a tree's rows), None when nothing was drafted.
    """

    accepted: np.ndarray
    drafted: np.ndarray
    kind: np.ndarray
    next_token: np.ndarray
    forwards: Optional[np.ndarray] = None
    drafts: Optional[dict] = None


class Method(abc.ABC):
    """A decoding method on the engine's state (:class:`lantern.engine.slots.BatchState`).

    name: the ``--method`` value; depth: the longest accepted run of one round (γ, a tree's
    depth, a Jacobi window's drafts; 0 for AR); spare: cache positions a row may write past its
    image (one round's verified tokens); convention: how target logits become the distribution
    acceptance compares (:func:`lantern.engine.steps.target_distribution`).
    """

    name: str = "ar"
    depth: int = 0
    spare: int = 1
    convention: str = "exact"

    def open(self, st) -> None:  # noqa: B027 - optional hook
        """Allocate the method's own state for ``st.B`` slots (a drafter's cache); default: none."""

    def start(self, st, slots: list[int], p0: torch.Tensor) -> torch.Tensor:
        """The first token of the images just admitted into ``slots`` (k,), from the prefill's
        distribution ``p0`` (k, V): the argmax when greedy, else one draw from each slot's stream.
        Returns (k,) int64 on the device."""
        if st.sampling.greedy:
            return p0.argmax(-1)
        return st.streams.categorical(p0, slots)

    @abc.abstractmethod
    def round(self, st, active: np.ndarray) -> Round:
        """One step over every slot (``active`` (B,) bool: the slots holding an image): draft,
        one target forward, accept; write the committed tokens ``x_n .. x_{n+a}`` into
        ``st.tokens`` (and their features into ``st.feats`` where the method keeps them)."""

    def release(self, st, slots) -> None:  # noqa: B027 - optional hook
        """The images of ``slots`` finished: drop their per-slot state; default: none."""

    def compact(self, st, live: np.ndarray, rows: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """A draining batch kept only the slots ``live`` (old numbers, renumbered 0..) and their
        model ``rows``: compact the method's own per-slot state the same way; default: none."""
