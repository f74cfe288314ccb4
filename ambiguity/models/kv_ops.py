"""Indexed copies inside key/value caches, shared by the LlamaGen GPT's static :class:`KVCache
<ambiguity.models.gpt.KVCache>` and the transformers adapters' :class:`SlotKV
<ambiguity.models.hf_slots.SlotKV>` (batched draft trees move each image's accepted path behind its
committed tokens)."""

from __future__ import annotations

import torch

__all__ = ["move_cache_entries"]


def move_cache_entries(buf: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Per row, copy the cache entries at positions ``src`` to ``dst``, in place.

    Args:
        buf: keys or values (..., rows, heads, L, head_dim), any dtype; leading dims (e.g. the layers
            of a stacked static cache) are copied alike.
        src, dst: (rows, m) int64 cache positions < L, moved to ``buf``'s device. Every entry is read
            before any is written, so a position may be both a source and a destination; a pair
            with ``src == dst`` leaves that entry as it is. Positions in a row of ``dst`` should be
            distinct (with duplicates, which copy lands is unspecified, as for any indexed write).
    """
    src, dst = src.to(buf.device), dst.to(buf.device)
    at = torch.arange(src.shape[0], device=buf.device)[:, None]
    buf[..., at, :, dst, :] = buf[..., at, :, src, :]  # advanced indexing reads a copy first
