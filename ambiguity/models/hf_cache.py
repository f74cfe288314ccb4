"""KV caches of transformers decoders as the adapters use them: ``DynamicCache`` helpers that hold
across transformers releases (the cache argument's name, construction, crop), the additive attention
mask, and which attention layers a decoder has (:func:`slots_cache_plan`: full attention, a sliding
window, or kinds the per-image slots cache does not model).
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch

__all__ = [
    "cache_kwarg",
    "new_dynamic_cache",
    "additive_mask",
    "crop_dynamic_cache",
    "slots_cache_plan",
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


def slots_cache_plan(config) -> tuple[str, tuple[Optional[int], ...]]:
    """The attention of each layer of a decoder with this config, as the slots cache models it.

    Reads the layer kinds of an empty ``DynamicCache`` built from ``config`` (:func:`new_dynamic_cache`,
    one build): a ``DynamicLayer`` attends to every earlier position (window None), a
    ``DynamicSlidingWindowLayer`` to the positions ``j`` with ``i - j < w`` (its ``sliding_window`` w;
    the transformers sliding-window mask). Returns ``(limit, windows)``: ``limit`` is '' when the
    slots cache can decode this decoder, else one clause naming why not (chunked attention, recurrent
    or other layer kinds, several window sizes, or full and windowed layers without
    ``config.layer_types`` to give each its mask); ``windows`` has one entry per layer (empty when
    ``limit`` is not '').
    """
    layers = list(new_dynamic_cache(config).layers)
    kinds = {type(layer).__name__ for layer in layers}
    other = sorted(kinds - {"DynamicLayer", "DynamicSlidingWindowLayer"})
    if other:
        return f"its decoder has {', '.join(other)} cache layers, which the per-image slots cache does not model", ()
    types = list(getattr(config, "layer_types", None) or [])
    if "chunked_attention" in types or (getattr(config, "attention_chunk_size", None) and not types):
        return "its decoder has chunked-attention layers, which the per-image slots cache does not model", ()
    windows = tuple(getattr(layer, "sliding_window", None) for layer in layers)
    sizes = {w for w in windows if w is not None}
    if len(sizes) > 1:
        return f"its decoder has sliding windows of {len(sizes)} sizes; the slots cache masks one window size", ()
    if sizes and None in windows and not types:
        return "its decoder mixes full and sliding-window layers without config.layer_types to mask each", ()
    return "", windows
