"""Slot KV caches for batched decoding (many images in flight) over a transformers decoder.

The transformers adapters (:class:`~ambiguity.models.hf_common.HFTokenModel`: Anole / Chameleon,
Lumina-mGPT, Janus, Emu3, Hugging Face text LMs) and their drafter layer
(:class:`~ambiguity.models.hf_common.HFDraftLayer`) decode several images per forward on these:

* :class:`SlotKV` - keys and values of every decoder layer preallocated per row and written in
  place at per-row cache indices; it duck-types the part of ``transformers.Cache`` that decoder
  layers call (``update``, ``get_seq_length``).
* :class:`HFSlotsCache` - the target's cache of a batched decode: a :class:`SlotKV`, a prefix
  region holding each row's (left-padded) prompt, then the row's image slots; the 4D additive
  attention mask and per-row position ids are built by
  :meth:`~ambiguity.models.hf_common.HFTokenModel.extend_slots`.
"""

from __future__ import annotations

from typing import Optional

import torch

from ambiguity.models.kv_ops import move_cache_entries

__all__ = ["SlotKV", "HFSlotsCache"]


class SlotKV:
    """Preallocated keys and values of every decoder layer, written in place at per-row indices.

    It duck-types the part of ``transformers.Cache`` that decoder layers call (transformers 5.x:
    ``cache.update(key_states, value_states, layer_idx, ...)`` and ``get_seq_length()``), so one
    decoder call can write each row's new keys/values at its own cache indices: before the call
    set ``write`` (rows, T) int64 (the cache index of every input) and ``span`` (the entries the
    call attends to, ``0..span-1``); ``update`` scatters the (rows, heads, T, head_dim) states
    there and returns views of the first ``span`` entries. The 4D attention mask the caller
    passes decides what each input sees (stale entries are simply never visible).

    Attributes: ``keys`` / ``values``: one (rows, kv heads, capacity, head_dim) tensor per layer,
    allocated by the first write (:meth:`put` or ``update``); ``capacity``: entries per row.
    """

    def __init__(self, rows: int, capacity: int):
        self.rows, self.capacity = int(rows), int(capacity)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.write: Optional[torch.Tensor] = None
        self.span = 0

    def _allocate(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        shape = lambda x: (self.rows, x.shape[1], self.capacity, x.shape[3])
        self.keys.append(key_states.new_zeros(shape(key_states)))
        self.values.append(value_states.new_zeros(shape(value_states)))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write (rows, heads, T, head_dim) states at ``write`` (rows, T); return the first ``span`` entries."""
        if layer_idx == len(self.keys):
            self._allocate(key_states, value_states)
        k, v = self.keys[layer_idx], self.values[layer_idx]
        at = self.write.to(k.device)[:, None, :, None]
        k.scatter_(2, at.expand(-1, k.shape[1], -1, k.shape[3]), key_states.to(k.dtype))
        v.scatter_(2, at.expand(-1, v.shape[1], -1, v.shape[3]), value_states.to(v.dtype))
        return k[:, :, : self.span], v[:, :, : self.span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.span

    def put(self, layer: int, rows: torch.Tensor, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Copy (len(rows), heads, L, head_dim) states into rows ``rows`` at entries ``start..start+L-1``
        (a prefilled prompt); layers are allocated in order by their first copy."""
        if layer == len(self.keys):
            self._allocate(keys, values)
        L = keys.shape[2]
        self.keys[layer][rows, :, start : start + L] = keys.to(self.keys[layer].dtype)
        self.values[layer][rows, :, start : start + L] = values.to(self.values[layer].dtype)

    def grow(self, capacity: int, left: int = 0) -> None:
        """At least ``capacity`` entries per row; ``left`` new entries go before the old ones (a longer prefix)."""
        capacity = max(int(capacity), self.capacity + left)
        if capacity == self.capacity:
            return
        for buf in (self.keys, self.values):
            for i, x in enumerate(buf):
                new = x.new_zeros(x.shape[0], x.shape[1], capacity, x.shape[3])
                new[:, :, left : left + x.shape[2]] = x
                buf[i] = new
        self.capacity = capacity

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the rows ``rows`` (int64, in this order)."""
        self.keys = [x[rows.to(x.device)] for x in self.keys]
        self.values = [x[rows.to(x.device)] for x in self.values]
        self.rows = int(rows.numel())

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Per row, copy the entries ``src`` (rows, m) int64 to ``dst`` (rows, m) in every layer, all
        read before any is written."""
        for x in (*self.keys, *self.values):
            move_cache_entries(x, src, dst)


class HFSlotsCache:
    """The cache of a batched decode over a transformers decoder (:meth:`HFTokenModel.new_slots_cache`).

    Every row holds a prefix region of ``prefix`` entries (its prompt right-aligned: prompts of
    other lengths are left-padded, the padding hidden by ``key_mask``), then its image region:
    image slot ``s`` at entry ``prefix + cache_positions(s)`` and, in layouts with end-of-row tokens,
    the separator after a completed row at the next entry (the layout of one-image decoding). The
    prefix region widens (left padding added to every row) when a longer prompt is admitted.

    Attributes: ``kv`` (:class:`SlotKV`, one scratch entry at the end for unused separator inputs);
    ``prefix`` (int); ``key_mask`` (rows, prefix) bool, the real prompt tokens; ``start`` (rows,)
    int64, each row's prompt length (the position id of its first image token, as one-image
    decoding counts: left padding does not count); ``positions`` (rows, capacity) int64, the
    position id of every written entry (a draft-tree node's is its depth's, not its slot's; a
    sliding-window layer compares them with the query's); ``num_tokens`` (N, tokens per image);
    ``width`` (image slots per row: N plus the spare slots of a padded chain or tree).
    """

    def __init__(self, rows: int, num_tokens: int, width: int, entries: int, device: torch.device):
        self.kv = SlotKV(rows, entries + 1)
        self.prefix = 0
        self.key_mask = torch.zeros(rows, 0, dtype=torch.bool, device=device)
        self.start = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, entries + 1, dtype=torch.long, device=device)
        self.num_tokens, self.width = int(num_tokens), int(width)

    @property
    def scratch(self) -> int:
        """The entry that unused separator inputs write to (never visible)."""
        return self.kv.capacity - 1

    def widen(self, prefix: int) -> None:
        """Make the prefix region ``prefix`` entries wide (left padding for every row); no-op when it is."""
        extra = int(prefix) - self.prefix
        if extra > 0:
            self.kv.grow(self.kv.capacity + extra, left=extra)
            pad = torch.zeros(self.key_mask.shape[0], extra, dtype=torch.bool, device=self.key_mask.device)
            self.key_mask = torch.cat([pad, self.key_mask], 1)
            self.positions = torch.cat([pad.long(), self.positions], 1)
            self.prefix = int(prefix)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the rows ``rows`` (int64 on the cache's device, in this order)."""
        self.kv.select_rows(rows)
        self.key_mask, self.start, self.positions = self.key_mask[rows], self.start[rows], self.positions[rows]

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Per row, copy the entries ``src`` (rows, m) int64 to ``dst`` (rows, m): keys, values and
        position ids, all read before any is written."""
        self.kv.move(src, dst)
        at = torch.arange(src.shape[0], device=src.device)[:, None]
        self.positions[at, dst] = self.positions[at, src]
