"""Reading and writing weights: official PyTorch checkpoints and the project's own safetensors files.

Generic readers used by every adapter, the drafter and the training scripts. Each turns what a
user can get wrong (a truncated download, a file of another model, a non-checkpoint file) into a
one-line :class:`~ambiguity.errors.UsageError` that names the file and the fix.

The project's own files (:func:`save_module`) are safetensors with the module's dataclass config
as JSON metadata (key ``config``), so :func:`load_module` rebuilds the module without code that
knows the architecture in advance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import UsageError
from ambiguity.io import load_tensors, save_tensors
from ambiguity.memory import available_bytes, check_weights_fit, format_bytes

__all__ = [
    "load_checkpoint_state",
    "read_safetensors",
    "load_strict",
    "save_module",
    "load_module",
    "load_checkpoint",
    "first_non_finite",
    "check_finite",
]


def load_checkpoint_state(path: str | Path) -> dict[str, torch.Tensor]:
    """Read an official ``.pt`` checkpoint: ``{"model": sd}``, ``{"module": sd}``,
    ``{"state_dict": sd}`` or a bare state dict (tensors on the CPU).

    Raises UsageError for a missing, unreadable or truncated file, or one that holds no state dict.
    """
    return load_checkpoint(path)[0]


def load_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """:func:`load_checkpoint_state` and what the file keeps beside the state dict: (state, extras),
    extras = the other top-level entries of a ``{"model": sd, ...}`` file (e.g. a training
    ``"args"`` or ``"config"`` dict; ``{}`` for a bare state dict). Raises UsageError as
    :func:`load_checkpoint_state`."""
    path = Path(path)
    if path.is_file():  # torch.load materialises the whole file in CPU memory
        check_weights_fit([path], torch.float32, "cpu", str(path))
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"checkpoint {path} does not exist; check the --weights path") from None
    except Exception as exc:  # pickle errors, truncated downloads, files that are no checkpoint
        raise UsageError(
            f"cannot read {path} as a PyTorch checkpoint ({type(exc).__name__}); check that --weights "
            f"names the official .pt file, and re-download it if it is truncated"
        ) from None
    if not isinstance(obj, dict):
        raise UsageError(f"{path} is not a state-dict checkpoint; pass the official .pt file")
    extras = {}
    for key in ("model", "module", "state_dict"):
        if key in obj and isinstance(obj[key], dict):
            extras = {k: v for k, v in obj.items() if k != key}
            obj = obj[key]
            break
    if not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UsageError(f"{path} is not a state-dict checkpoint (it holds non-tensor values); pass the weights file")
    return obj, extras


def read_safetensors(path: str | Path, fix: str = "re-create or re-download it") -> tuple[dict, dict]:
    """Read a safetensors file -> (tensors on the CPU, metadata with JSON values decoded).

    Raises UsageError naming ``fix`` for a missing, truncated or non-safetensors file.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path} does not exist; {fix}")
    try:
        return load_tensors(path)
    except MemoryError:  # the file may be fine: say what it needs, not that it is damaged
        raise UsageError(
            f"not enough memory to read {path} ({format_bytes(path.stat().st_size)} on disk, "
            f"{format_bytes(available_bytes())} available); free memory or use a machine with more"
        ) from None
    except Exception as exc:  # SafetensorError for bad headers, OSError, truncated data
        raise UsageError(
            f"cannot read {path} as a safetensors file ({type(exc).__name__}: {str(exc).splitlines()[0][:80]}); {fix}"
        ) from None


def load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """``load_state_dict(strict=True)`` with a one-line UsageError naming the first mismatches."""
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {tuple(state[k].shape)} != {tuple(own[k].shape)}"
        for k in own
        if k in state and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} keys (e.g. {unexpected[0]})")
        if shapes:
            parts.append(f"shape mismatch ({shapes[0]})")
        raise UsageError(
            f"{what} does not match the model architecture: "
            + "; ".join(parts)
            + "; check that --model names the checkpoint's model"
        )
    module.load_state_dict(state, strict=True)


def first_non_finite(module: torch.nn.Module, seen: Optional[set] = None) -> Optional[str]:
    """Name of the first floating parameter or buffer of ``module`` holding NaN or +-Inf (None when
    all are finite). Checked tensor by tensor, so the extra memory is one bool per element of the
    largest tensor; ``seen``: ids of tensors already checked (shared modules are checked once)."""
    seen = set() if seen is None else seen
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


def check_finite(modules, what: str, fix: str) -> None:
    """Raise UsageError naming the first tensor with NaN / Inf among ``modules`` ({prefix: module}
    or one module): weights like that give NaN distributions and figures without any error.
    what: the weights' name or file; fix: what to do (restore or re-create the file)."""
    items = modules.items() if isinstance(modules, dict) else [("", modules)]
    seen: set = set()
    for prefix, module in items:
        bad = first_non_finite(module, seen)
        if bad is not None:
            where = f"{prefix}.{bad}" if prefix else bad
            raise UsageError(f"{what} holds NaN or infinite values (in {where}); the weights are damaged: {fix}")


def save_module(
    module: torch.nn.Module,
    config,
    path: str | Path,
    dtype: torch.dtype = torch.float16,
    skip: tuple[str, ...] = (),
    **metadata,
) -> Path:
    """Save parameters and buffers (floating tensors cast to ``dtype``, fp16 by default; keys in
    ``skip`` left out) with the dataclass ``config`` as safetensors metadata (key ``config``,
    JSON) plus any extra ``metadata``, atomically. Returns ``path``."""
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in module.state_dict().items() if k not in skip}
    meta = {"config": dataclasses.asdict(config), "dtype": str(dtype).replace("torch.", ""), **metadata}
    return save_tensors(state, path, meta)


def load_module(
    path: str | Path,
    module_cls: Callable,
    config_cls: type,
    device="cpu",
    dtype: torch.dtype = torch.float32,
    defaults: Optional[Callable[[torch.nn.Module], dict]] = None,
    fix: str = "re-create the file with its training script",
):
    """Rebuild a module from a file written by :func:`save_module`.

    ``module_cls(config_cls(**meta["config"]))`` is built, its state loaded strictly (float32),
    then moved to ``device`` and ``dtype``; ``defaults(module)`` may supply entries the file
    leaves out (e.g. bookkeeping buffers). Returns (module in eval mode, metadata dict).
    Raises UsageError for an unreadable file, a file of another module type (its config does
    not fit ``config_cls``) or tensors that do not match the config.
    """
    path = Path(path)
    state, meta = read_safetensors(path, fix)
    config = meta.get("config")
    names = {f.name for f in dataclasses.fields(config_cls)}
    if not isinstance(config, dict) or not set(config) <= names:
        what = config_cls.__name__.removesuffix("Config") or config_cls.__name__
        raise UsageError(
            f"{path.name} does not hold a {what} module (its stored config has other fields); "
            f"check which file goes where, or {fix}"
        )
    module = module_cls(config_cls(**config))
    if defaults is not None:
        for k, v in defaults(module).items():
            state.setdefault(k, v)
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    load_strict(module, state, path.name)
    check_finite(module, str(path), fix)
    return module.to(device=device, dtype=dtype).eval(), meta
