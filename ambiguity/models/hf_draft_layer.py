"""The drafter layer of EAGLE-style drafters for transformers-backed targets: one freshly
initialised decoder layer of the target's own architecture (built from its config), wrapped to
the :class:`~ambiguity.models.base.DraftLayer` interface with its own ``DynamicCache`` and
rotary positions, and a :class:`~ambiguity.models.hf_slots.SlotKV` for batched decoding
(EAGLE, Li et al. 2024, arXiv 2401.15077, Sec. 4.1: the draft head is one decoder layer).
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, Optional

import torch
import torch.nn as nn

from ambiguity.models.base import DraftLayer
from ambiguity.models.hf_cache import additive_mask, cache_kwarg, crop_dynamic_cache, new_dynamic_cache
from ambiguity.models.hf_slots import SlotKV

__all__ = ["decoder_layers", "new_decoder_layer", "HFDraftLayer", "make_draft_layer"]


def decoder_layers(decoder: nn.Module) -> nn.ModuleList:
    """The ModuleList of decoder layers of a transformers base model (``layers``, ``h``, ``blocks``)."""
    for name in ("layers", "h", "blocks", "layer", "decoder_layers"):
        mods = getattr(decoder, name, None)
        if isinstance(mods, nn.ModuleList) and len(mods):
            return mods
    raise NotImplementedError(f"cannot find the decoder layers of {type(decoder).__name__}")


def new_decoder_layer(decoder: nn.Module, config) -> nn.Module:
    """A freshly initialised layer of the same class as ``decoder``'s layers, built from ``config``.

    Linear weights ~ N(0, ``config.initializer_range``), biases 0, norms at their defaults
    (the transformers initialisation of these architectures).
    """
    cls = type(decoder_layers(decoder)[0])
    params = inspect.signature(cls.__init__).parameters
    layer = cls(config, layer_idx=0) if "layer_idx" in params else cls(config)
    std = float(getattr(config, "initializer_range", 0.02))
    with torch.no_grad():
        for mod in layer.modules():
            w = getattr(mod, "weight", None)
            if isinstance(w, nn.Parameter) and w.ndim == 2:
                w.normal_(0.0, std)
            b = getattr(mod, "bias", None)
            if isinstance(b, nn.Parameter) and isinstance(w, nn.Parameter) and w.ndim == 2:
                b.zero_()
    return layer


class HFDraftLayer(DraftLayer):
    """One decoder layer of a transformers architecture for EAGLE-style drafters.

    ``forward(x, cache, start)``: x (rows, T, H) features at image-token positions
    ``start..start+T-1`` -> (rows, T, H). Rotary models get position ids ``start + t`` through a
    copy of the target's rotary module (attention depends only on position differences, so the
    target's prefix length does not matter); absolute-position models (GPT-2) get none inside a
    layer. The cache is a ``DynamicCache``; a ``start`` below what it holds rolls it back first.
    """

    def __init__(self, layer: nn.Module, rotary: Optional[nn.Module] = None):
        super().__init__()
        self.layer = layer
        # kept out of the module tree so that .to(bfloat16) does not round the float32 inverse
        # frequencies: the layer keeps the target's exact rotary frequencies; moved to x's device on use
        self._rotary = (rotary,)
        self._cache_kw = cache_kwarg(layer.forward)
        self._takes_pe = "position_embeddings" in inspect.signature(layer.forward).parameters

    def new_cache(self, rows: int, spare: int = 0):
        """An empty ``DynamicCache`` (its batch size is set by the first forward; it grows as needed)."""
        return new_dynamic_cache()

    def rollback(self, cache, n: int) -> None:
        """Keep the first ``n`` positions of the layer's cache."""
        crop_dynamic_cache(cache, n)

    def _call(self, x: torch.Tensor, cache, mask: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The layer on x (rows, T, H) with the additive mask (rows, 1, T, keys) and position ids (rows, T)."""
        kwargs: dict[str, Any] = dict(attention_mask=mask, position_ids=pos, use_cache=cache is not None)
        kwargs[self._cache_kw] = cache
        rotary = self._rotary[0]
        if rotary is not None and self._takes_pe:
            if next(rotary.buffers()).device != x.device:
                rotary.to(x.device)
            kwargs["position_embeddings"] = rotary(x, pos)
        out = self.layer(x, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def forward_slots(
        self, x: torch.Tensor, cache, slots: torch.Tensor, positions: torch.Tensor, visible
    ) -> torch.Tensor:
        """Batched decoding (see :meth:`DraftLayer.forward_slots`): x (rows, T, H) written at the
        drafter cache slots (rows, T) int64 of a :class:`SlotKV` kept on ``cache`` (made by the first
        call, widened as slots grow; every slot must be < S), position ids ``positions`` (rows, T)
        (image positions, as :meth:`forward` counts them), attending to the slots ``visible``
        (rows, T, S) allows."""
        if isinstance(visible, int):
            visible = torch.ones(x.shape[0], x.shape[1], visible, dtype=torch.bool)
        slots, positions, visible = (t.to(x.device) for t in (slots, positions, visible))
        kv = getattr(cache, "slots", None)
        if kv is None:
            kv = cache.slots = SlotKV(x.shape[0], 0)
        S = visible.shape[-1]  # every slot written is < S (the callers' windows)
        if S > kv.capacity:
            kv.grow(max(S, 2 * kv.capacity))  # geometric: a decode reallocates O(log N) times
        kv.write, kv.span = slots, S
        return self._call(x, kv, additive_mask(visible.bool()[:, None], x.dtype), positions)

    def select_slots(self, cache, rows: torch.Tensor) -> None:
        """Keep only the rows ``rows`` of a batched decode's drafter cache (a draining batch)."""
        if getattr(cache, "slots", None) is not None:
            cache.slots.select_rows(rows)

    def forward(
        self,
        x: torch.Tensor,
        cache,
        start: int,
        positions: Optional[torch.Tensor] = None,
        attend: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        rows, T = x.shape[:2]
        past = 0
        if cache is not None:
            held = cache.get_seq_length()
            if positions is None:
                if start > held:
                    raise ValueError(f"draft layer cache holds {held} positions; cannot start at {start}")
                crop_dynamic_cache(cache, start)
            past = start if positions is None else held  # tree nodes are appended after the cache
        if attend is None:
            q = torch.arange(T, device=x.device)[:, None] + past
            attend = torch.arange(past + T, device=x.device)[None, :] <= q
        mask = additive_mask(attend.to(x.device).bool(), x.dtype)[None, None].expand(rows, 1, T, past + T)
        pos_t = torch.arange(T, device=x.device) + start if positions is None else positions.to(x.device)
        return self._call(x, cache, mask, pos_t[None].expand(rows, T))


def make_draft_layer(decoder: nn.Module, config, device, dtype) -> HFDraftLayer:
    """:class:`HFDraftLayer` from ``decoder``'s layer class and ``config`` (sdpa attention)."""
    config = copy.deepcopy(config)
    try:
        config._attn_implementation = "sdpa"
    except Exception:  # pragma: no cover - configs without the setter
        pass
    rotary = getattr(decoder, "rotary_emb", None)
    rotary = copy.deepcopy(rotary).to(device) if rotary is not None else None
    return HFDraftLayer(new_decoder_layer(decoder, config), rotary).to(device=device, dtype=dtype).eval()
