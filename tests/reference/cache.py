"""The one-image cache the oracles decode on, written over the models' slot protocol.

The oracles were written over a batch-1 cache protocol (``prefill`` / ``extend`` / ``rollback`` /
``extend_tree`` / ``keep_path``) that the models no longer have: :class:`OneImageCache` gives them
those calls over :meth:`~ambiguity.models.base.TokenModel.new_slots_cache`, ``prefill_slots``,
``extend_slots`` and ``move_slots``, so every oracle stays the algorithm it was. The cache holds
one prompt's rows (both guidance rows of one image, or several images at one position); ``n`` image
tokens are held, at slots ``0..n-1``; tokens past ``n`` are never visible, so a rollback only moves
``n`` back.
"""

from __future__ import annotations

import torch

from ambiguity.models.base import Prompt, Step, TokenModel

__all__ = ["OneImageCache"]


class OneImageCache:
    """A slot cache used as one image's cache: every row of the prompt at the same image position.

    Args:
        model: the target.
        prompt: its rows (``prompt.rows``) fill the cache; :meth:`prefill` runs it.
        num_tokens: image tokens the cache holds (slots ``0..num_tokens-1``).
        spare: further slots (a verified draft tree's nodes past the image's end).
    """

    def __init__(self, model: TokenModel, prompt: Prompt, num_tokens: int, spare: int = 0):
        self.model, self.prompt = model, prompt
        self.cache = model.new_slots_cache(prompt.batch_size, prompt.guided, num_tokens, spare)
        self.n = 0

    def prefill(self) -> Step:
        """The prompt's prefix into every row; the Step (rows, 1, .) of the first image token."""
        self.n = 0
        rows = torch.arange(self.prompt.rows, device=self.model.device)
        return self.model.prefill_slots(self.cache, rows, self.prompt)

    def extend(self, tokens: torch.Tensor) -> Step:
        """Append tokens (rows, T) int64 at slots and positions ``n..n+T-1``, each seeing the held
        slots and the tokens up to itself; returns the T next-token distributions (rows, T, .)."""
        R, T = tokens.shape
        dev = self.model.device
        at = (self.n + torch.arange(T, device=dev))[None].expand(R, -1)
        if T == 1:  # one token per row, every row at one position: no mask (the engine's call)
            visible = self.n + 1
        else:
            s = torch.arange(self.n + T, device=dev)
            visible = (s[None, :] <= at[0][:, None])[None].expand(R, -1, -1)
        self.n += T
        return self.model.extend_slots(self.cache, tokens.to(dev), at, at, visible)

    def rollback(self, n: int) -> None:
        """Keep the first ``n`` image tokens; ValueError when the cache holds fewer."""
        if not 0 <= n <= self.n:
            raise ValueError(f"rollback to {n} image tokens but the cache holds {self.n}")
        self.n = int(n)

    def extend_tree(self, tokens: torch.Tensor, depths: torch.Tensor, ancestors: torch.Tensor) -> Step:
        """Verify a draft tree in one forward: tokens (rows, T) int64 of the T nodes (node 0 the root:
        the last committed token, not yet held), depths (T,) int64, ancestors (T, T) bool (``[t, s]``
        true when node s is t or an ancestor of t). Node t is written at slot ``n + t``, takes image
        position ``n + depths[t]`` and sees the held slots and its ancestors. Returns the Step
        (rows, T, .); follow with :meth:`keep_path`."""
        R, T = tokens.shape
        dev = self.model.device
        slots = (self.n + torch.arange(T, device=dev))[None].expand(R, -1)
        positions = (self.n + depths.to(dev, torch.long))[None].expand(R, -1)
        held = torch.ones(T, self.n, dtype=torch.bool, device=dev)
        visible = torch.cat([held, ancestors.to(dev).bool()], 1)[None].expand(R, -1, -1)
        self.n += T
        return self.model.extend_slots(self.cache, tokens.to(dev), slots, positions, visible)

    def keep_path(self, n: int, nodes: torch.Tensor) -> None:
        """After :meth:`extend_tree` on a cache holding ``n`` image tokens: keep those and then the
        tree nodes ``nodes`` (m,) int64 (the accepted path, root first) as image tokens ``n..n+m-1``."""
        dev = self.model.device
        m = int(nodes.numel())
        src = (n + nodes.to(dev, torch.long))[None].expand(self.prompt.rows, -1)
        dst = (n + torch.arange(m, device=dev))[None].expand(self.prompt.rows, -1)
        self.model.move_slots(self.cache, src, dst)
        self.n = n + m
