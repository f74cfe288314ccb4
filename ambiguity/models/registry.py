"""Model names -> loaders. ``load_model("embedded")`` is the default everywhere.

Loaders are referenced as ``"module:function"`` strings so that listing models never imports
transformers or reads weights. A loader takes ``(weights, device, dtype)`` and returns a
:class:`~ambiguity.models.base.TokenModel`; it raises
:class:`~ambiguity.errors.WeightsNotFoundError` with a one-line download hint when the
checkpoint is absent.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import Optional

import torch
from torch import nn

from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.models.base import TokenModel, compile_refusal, resolve_device
from ambiguity.models.catalog import BUILTIN, ModelSpec
from ambiguity.models.checkpoints import check_finite

__all__ = [
    "register",
    "available_models",
    "get_spec",
    "load_model",
    "DEFAULT_MODEL",
    "resolve_dtype",
    "spec_sizes",
    "check_spec_options",
    "check_compile",
    "check_image_size",
    "SIZED_LOADER",
]

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
        return ModelSpec(
            name,
            "Hugging Face causal LM",
            "ambiguity.models.hf_text:load_hf_causal_lm",
            {"repo": name[3:]},
            kind="text",
            codes_key=("vocab_size",),
        )
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY) + list(_ALIASES), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"unknown model {name!r}; {hint}choose one of {', '.join(sorted(_REGISTRY))} or hf:<repo>")
    return _REGISTRY[key]


def resolve_dtype(dtype: Optional[str | torch.dtype], device: torch.device) -> torch.dtype:
    """``None``/``"auto"`` -> float32 on CPU, bfloat16 on CUDA; names like ``"bf16"`` accepted; ``"float64"``
    makes batched decoding give exactly the tokens of one image at a time (:mod:`lantern.engine.loop`)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "float64": torch.float64,
        "fp64": torch.float64,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise UsageError(f"--dtype must be one of auto, {', '.join(table)}; got {dtype!r}")
    return table[dtype]


def _config_codes(spec: ModelSpec, weights) -> Optional[int]:
    """V from the ``config.json`` of the checkpoint ``spec`` would load (``spec.codes_key``), or None
    when the spec names no key or the checkpoint (or the key) is absent; reads no weights."""
    from ambiguity.models.hf_common import local_dir
    from ambiguity.models.hub import hf_snapshot_dir

    repo = spec.options.get("repo")
    if not spec.codes_key or repo is None:
        return None
    try:
        config = json.loads((hf_snapshot_dir(repo, local_dir(repo, weights), spec.name) / "config.json").read_text())
    except (WeightsNotFoundError, OSError, ValueError):
        return None  # the loader reports the absent or damaged checkpoint
    for key in spec.codes_key:
        config = config.get(key) if isinstance(config, dict) else None
    return int(config) if isinstance(config, int) and not isinstance(config, bool) else None


def spec_sizes(spec: ModelSpec, weights=None) -> dict:
    """What a model's options are checked against, known before its weights are read.

    Returns ``{"codes": V or None, "classes": C or None}``: V is the codebook size (the image
    vocabulary), read from the checkpoint's ``config.json`` where the spec says where
    (``ModelSpec.codes_key``), else the registry's value for the shipped or official files
    (``ModelSpec.codes``; None with ``--weights``, which may hold another size); C likewise
    (``ModelSpec.classes``, c2i models only). None: unknown until the model loads.
    """
    read = _config_codes(spec, weights)
    fixed = weights is None and not spec.codes_key
    return {
        "codes": read if read is not None else spec.codes if fixed else None,
        "classes": spec.classes if weights is None and spec.kind == "c2i" else None,
    }


def check_spec_options(
    name: str,
    weights=None,
    k: Optional[int] = None,
    classes: Optional[Sequence[int]] = None,
    captions=None,
    tree_top_k: Optional[int] = None,
) -> None:
    """Refuse options that cannot fit the model ``name`` before its weights load (issue 20, item 13).

    k: the neighbourhood size (``--k``, must be below V); classes: ``--classes`` labels (c2i
    models only, each in 0..C-1); captions: ``--captions`` (not for c2i models); tree_top_k:
    ``--tree-top-k`` (at most V). V and C come from :func:`spec_sizes`; a size it cannot know is
    checked after loading, as before. Raises UsageError with the same line the loaded model's checks
    give (:func:`ambiguity.conditions.generation_conditions`, :func:`lantern.engine.decode.neighbour_table`).
    """
    spec = get_spec(name)
    label = spec.name if not name.startswith("hf:") else name
    if spec.kind == "c2i" and captions is not None:
        raise UsageError(f"{label} is class-conditional; drop --captions and pass --classes 0,3,7 instead")
    if spec.kind != "c2i" and classes:
        raise UsageError(f"{label} is not class-conditional ({spec.kind}); drop --classes and pass --captions FILE")
    sizes = spec_sizes(spec, weights)
    C, V = sizes["classes"], sizes["codes"]
    bad = [c for c in classes or () if C is not None and not 0 <= int(c) < C]
    if bad:
        raise UsageError(f"class {bad[0]} is out of range for {label}; pass --classes in 0..{C - 1}")
    if V is not None and k is not None and k >= V:
        raise UsageError(f"--k {k} must be smaller than the vocabulary size {V} of {label}; lower --k")
    if V is not None and tree_top_k is not None and tree_top_k > V:
        raise UsageError(
            f"--tree-top-k {tree_top_k} exceeds the vocabulary size {V} of {label}; use --tree-top-k {V} or less"
        )


#: the loader whose checkpoints need ``--image-size`` (their files do not record the token grid)
SIZED_LOADER = "ambiguity.models.llamagen:load_llamagen"


def check_image_size(name: str, image_size: Optional[int]) -> None:
    """Refuse ``--image-size`` for a model other than the official LlamaGen checkpoints (whose files
    alone do not record their grid); None passes. Raises UsageError (one line), before any weights load."""
    if image_size is not None and get_spec(name).loader != SIZED_LOADER:
        raise UsageError(
            f"--image-size is for the LlamaGen checkpoints (llamagen-*), whose files do not record their "
            f"token grid; {name} knows its own, drop --image-size"
        )


def check_compile(name: str) -> None:
    """Refuse ``--compile`` for the model ``name`` before its weights load when the registry knows
    its adapter runs eager only (:attr:`ModelSpec.compiles` False: the transformers adapters and
    ``hf:``); an unknown family is left to the loaded model. Raises UsageError (one line)."""
    spec = get_spec(name)
    if spec.compiles is False:
        raise UsageError(compile_refusal(spec.name if not name.startswith("hf:") else name))


def load_model(
    name: str = DEFAULT_MODEL, weights=None, device="auto", dtype=None, image_size: Optional[int] = None
) -> TokenModel:
    """Build the named model on ``device`` ("auto", "cpu", "cuda"). See :func:`get_spec`.

    image_size: the image size (px) an official LlamaGen checkpoint was trained at (``--image-size``;
    its file does not record its token grid, :func:`ambiguity.models.llamagen.llamagen_image_size`).
    Raises UsageError (unknown name, bad dtype, ``image_size`` for another family) or
    WeightsNotFoundError (checkpoint absent).
    """
    spec = get_spec(name)
    check_image_size(name, image_size)
    dev = resolve_device(device)
    extra = {"image_size": int(image_size)} if image_size is not None else {}
    loader = spec.resolve_loader()
    model = loader(weights=weights, device=dev, dtype=resolve_dtype(dtype, dev), **spec.options, **extra)
    model.name = spec.name if not name.startswith("hf:") else name
    check_finite(
        {k: v for k, v in vars(model).items() if isinstance(v, nn.Module)},
        f"the weights of {model.name}",
        "restore or re-download them"
        + (" (git checkout -- ambiguity/weights)" if weights is None and spec.name.startswith("embedded") else ""),
    )
    return model


for _spec in BUILTIN:
    register(_spec)
