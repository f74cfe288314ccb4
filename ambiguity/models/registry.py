"""Model names -> loaders. ``load_model("embedded")`` is the default everywhere.

Loaders are referenced as ``"module:function"`` strings so that listing models never imports
transformers or reads weights. A loader takes ``(weights, device, dtype)`` and returns a
:class:`~ambiguity.models.base.TokenModel`; it raises
:class:`~ambiguity.errors.WeightsNotFoundError` with a one-line download hint when the
checkpoint is absent.
"""
from __future__ import annotations

import difflib
from typing import Optional

import torch
from torch import nn

from ambiguity.errors import UsageError
from ambiguity.models.checkpoints import check_finite
from ambiguity.models.base import TokenModel, resolve_device
from ambiguity.models.catalog import BUILTIN, ModelSpec

__all__ = ["ModelSpec", "register", "available_models", "get_spec", "load_model", "DEFAULT_MODEL", "resolve_dtype"]

DEFAULT_MODEL = "embedded"


_REGISTRY: dict[str, ModelSpec] = {}
_ALIASES: dict[str, str] = {}


def register(spec: ModelSpec) -> ModelSpec:
    _REGISTRY[spec.name] = spec
    for a in spec.aliases:
        _ALIASES[a] = spec.name
    return spec


def available_models() -> list[str]:
    return sorted(_REGISTRY)


def get_spec(name: str) -> ModelSpec:
    """Look a name up (aliases too). ``hf:<repo or path>`` names any Hugging Face causal LM."""
    if name.startswith("hf:"):
        return ModelSpec(name, "Hugging Face causal LM", "ambiguity.models.hf_text:load_hf_causal_lm",
                         {"repo": name[3:]}, kind="text")
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY) + list(_ALIASES), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"unknown model {name!r}; {hint}choose one of {', '.join(sorted(_REGISTRY))} or hf:<repo>")
    return _REGISTRY[key]


def resolve_dtype(dtype: Optional[str | torch.dtype], device: torch.device) -> torch.dtype:
    """``None``/``"auto"`` -> float32 on CPU, bfloat16 on CUDA; names like ``"bf16"`` accepted; ``"float64"``
    makes batched decoding give exactly the tokens of one image at a time (:mod:`lantern.batched`)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "float64": torch.float64, "fp64": torch.float64,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise UsageError(f"--dtype must be one of auto, {', '.join(table)}; got {dtype!r}")
    return table[dtype]


def load_model(name: str = DEFAULT_MODEL, weights=None, device="auto", dtype=None) -> TokenModel:
    """Build the named model on ``device`` ("auto", "cpu", "cuda"). See :func:`get_spec`.

    Raises UsageError (unknown name, bad dtype) or WeightsNotFoundError (checkpoint absent).
    """
    spec = get_spec(name)
    dev = resolve_device(device)
    model = spec.resolve_loader()(weights=weights, device=dev, dtype=resolve_dtype(dtype, dev), **spec.options)
    model.name = spec.name if not name.startswith("hf:") else name
    check_finite({k: v for k, v in vars(model).items() if isinstance(v, nn.Module)}, f"the weights of {model.name}",
                 "restore or re-download them" + (" (git checkout -- ambiguity/weights)" if weights is None and
                                                   spec.name.startswith("embedded") else ""))
    return model


for _spec in BUILTIN:
    register(_spec)
