"""KV caches of transformers decoders as the adapters use them: ``DynamicCache`` helpers that hold
across transformers releases (the cache argument's name, construction, crop, row selection), the
additive attention mask, whether a decoder fits the per-image slots cache, and :class:`HFCache`
(a ``DynamicCache`` plus the 2D attention mask of everything it holds; rollback crops both).
"""

from __future__ import annotations

import inspect

import torch

__all__ = [
    "HFCache",
    "cache_kwarg",
    "new_dynamic_cache",
    "select_dynamic_cache",
    "additive_mask",
    "crop_dynamic_cache",
    "slots_cache_limit",
]


def cache_kwarg(fn) -> str:
    """Name of the KV-cache argument of a transformers ``forward``: ``"cache"`` (transformers >= 5.2x)
    or ``"past_key_values"`` (earlier releases)."""
    params = inspect.signature(fn).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_dynamic_cache(config=None):
    """An empty ``transformers.DynamicCache`` (layer types from ``config`` when given)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config) if config is not None else DynamicCache()
    except TypeError:  # older transformers without the config argument
        return DynamicCache()


def select_dynamic_cache(kv, index: torch.Tensor) -> None:
    """Keep the cached positions ``index`` (L',) int64 of every layer of a DynamicCache, in that order."""
    for layer in getattr(kv, "layers", []):
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            i = index.to(layer.keys.device)
            layer.keys, layer.values = layer.keys[..., i, :], layer.values[..., i, :]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask (..., T, L), True = attend -> the additive float mask transformers layers take
    (0 where allowed, the dtype's minimum elsewhere)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def crop_dynamic_cache(kv, length: int) -> None:
    """Keep the first ``length`` positions of a DynamicCache (no-op when it holds no more).

    Uses ``crop(-k)`` (remove ``k`` positions), which means the same in every transformers release
    that has ``DynamicCache.crop``. Raises ValueError when ``length`` exceeds what the cache holds.
    """
    held = kv.get_seq_length()
    if length > held:
        raise ValueError(f"cannot crop a cache holding {held} positions to {length}")
    if held > length:
        kv.crop(length - held)


def slots_cache_limit(config) -> str:
    """Why a decoder with this config cannot run on the slots cache, '' when it can: the layer kinds of
    an empty ``DynamicCache`` built from ``config`` (:func:`new_dynamic_cache`) must all be
    ``DynamicLayer`` (full attention)."""
    kinds = {type(layer).__name__ for layer in new_dynamic_cache(config).layers}
    other = sorted(kinds - {"DynamicLayer"})
    if not other:
        return ""
    return f"its decoder has {', '.join(other)} cache layers, which the per-image slots cache does not model"


class HFCache:
    """A ``DynamicCache`` of a transformers decoder plus what the adapter needs around it.

    Attributes:
        kv: the ``transformers.DynamicCache``.
        mask: (rows, L) int64 attention mask of the L cached positions (0 at left padding).
        prefix: number of cached positions that belong to the prompt (the padded prefix length).
        tokens: number of image tokens held after the prefix.
    """

    def __init__(self, kv, rows: int, device: torch.device):
        self.kv = kv
        self.mask = torch.zeros(rows, 0, dtype=torch.long, device=device)
        self.prefix = 0
        self.tokens = 0

    @property
    def length(self) -> int:
        """Cached positions, prefix included."""
        return int(self.mask.shape[1])

    def crop(self, length: int) -> None:
        """Keep the first ``length`` cached positions (KV tensors and mask)."""
        crop_dynamic_cache(self.kv, length)
        self.mask = self.mask[:, :length]
