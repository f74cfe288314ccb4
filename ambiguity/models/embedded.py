"""The embedded default model: a LlamaGen-architecture VQ tokenizer and class-conditional GPT
trained by this project on Fashion-MNIST (``scripts/train_embedded.py`` regenerates them).

Weights ship inside the package as safetensors with the architecture in the file metadata
(key ``config``), so running the model needs neither the data set nor a network.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import torch

from ambiguity.data.fashion_mnist import CLASSES
from ambiguity.errors import WeightsNotFoundError
from ambiguity.io import load_tensors, save_tensors
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.llamagen import LlamaGenModel, load_strict
from ambiguity.models.vq import VQConfig, VQModel

__all__ = ["WEIGHTS_DIR", "VQ_FILE", "GPT_FILE", "save_module", "load_module", "load_embedded", "weights_dir"]

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
VQ_FILE = "fashion_vq.safetensors"
GPT_FILE = "fashion_gpt.safetensors"


def weights_dir(weights: Optional[str | Path] = None) -> Path:
    return Path(weights).expanduser() if weights is not None else WEIGHTS_DIR


def save_module(module: torch.nn.Module, config, path: str | Path, dtype: torch.dtype = torch.float16,
                **metadata) -> Path:
    """Save parameters (cast to ``dtype``; buffers that are not weights are skipped) and the
    dataclass ``config`` as safetensors metadata, atomically."""
    skip = {"quantize.codebook_used"}
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in module.state_dict().items() if k not in skip}
    meta = {"config": dataclasses.asdict(config), "dtype": str(dtype).replace("torch.", ""), **metadata}
    return save_tensors(state, path, meta)


def load_module(kind: str, path: str | Path, device="cpu", dtype: torch.dtype = torch.float32):
    """Rebuild a ``"gpt"`` or ``"vq"`` module from a file written by :func:`save_module`."""
    state, meta = load_tensors(path)
    if kind == "gpt":
        module = GPT(GPTConfig(**meta["config"]))
    else:
        module = VQModel(VQConfig(**meta["config"]))
        state.setdefault("quantize.codebook_used", module.quantize.codebook_used)
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    load_strict(module, state, Path(path).name)
    return module.to(device=device, dtype=dtype).eval(), meta


def load_embedded(weights=None, device="cpu", dtype=torch.float32) -> LlamaGenModel:
    """The shipped Fashion-MNIST model (``weights``: a directory with the two files instead).

    Images are 1 x 32 x 32 (Fashion-MNIST padded by 2 px), 8 x 8 tokens.
    Raises WeightsNotFoundError when the files are missing (a checkout without them can
    regenerate them with ``python scripts/train_embedded.py``).
    """
    d = weights_dir(weights)
    missing = [f for f in (VQ_FILE, GPT_FILE) if not (d / f).is_file()]
    if missing:
        raise WeightsNotFoundError(f"embedded model weights {', '.join(missing)} not found in {d}; "
                                   f"run `python scripts/train_embedded.py` to train them")
    vq, _ = load_module("vq", d / VQ_FILE, device, torch.float32)
    gpt, _ = load_module("gpt", d / GPT_FILE, device, dtype)
    return LlamaGenModel(gpt, vq, name="embedded", class_names=list(CLASSES))
