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

__all__ = ["WEIGHTS_DIR", "VQ_FILE", "GPT_FILE", "METRICS_FILE", "save_module", "load_module", "load_embedded",
           "weights_dir", "embedded_recipe"]

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
VQ_FILE = "fashion_vq.safetensors"
GPT_FILE = "fashion_gpt.safetensors"
METRICS_FILE = "embedded_metrics.json"


def embedded_recipe(quick: bool = False):
    """Architectures and optimisation of the shipped model -> (VQConfig, VQTrainConfig,
    GPTConfig, GPTTrainConfig).

    Shipped: VQ with base width 32, ch_mult [1, 2, 2] (32 x 32 px -> 8 x 8 tokens), 1024 codes
    of dim 8 (l2-normalised); c2i GPT with dim 192, 6 layers, 6 heads, 10 classes, 10% label
    dropout. Optimisation: :class:`~ambiguity.train.VQTrainConfig` and
    :class:`~ambiguity.train.GPTTrainConfig` defaults (VQ 1000 steps x 32 images; GPT 1800 steps
    x 64 sequences = 7,372,800 training tokens, about 1.9 epochs). ``quick``: tiny versions
    (64 codes, dim 32, 2 layers, 4 steps each) for smoke tests. Sized to train in about 100
    minutes on 2 shared CPU cores and to ship in under 10 MB (fp16).
    """
    from ambiguity.train import GPTTrainConfig, VQTrainConfig

    K = 64 if quick else 1024
    vq = VQConfig(codebook_size=K, codebook_embed_dim=8, codebook_l2_norm=True, encoder_ch_mult=[1, 2, 2],
                  decoder_ch_mult=[1, 2, 2], z_channels=32 if quick else 64, ch=32, num_res_blocks=1,
                  in_channels=1)
    gpt = GPTConfig(dim=32 if quick else 192, n_layer=2 if quick else 6, n_head=2 if quick else 6,
                    multiple_of=32, num_classes=len(CLASSES), class_dropout_prob=0.1, model_type="c2i",
                    vocab_size=K, cls_token_num=1, block_size=64, rope="2d")
    if quick:
        return (vq, VQTrainConfig(steps=4, batch_size=8, warmup=1, dead_after=2, reinit_every=2, ckpt_every=2),
                gpt, GPTTrainConfig(steps=4, batch_size=8, warmup=1, ckpt_every=2))
    return vq, VQTrainConfig(), gpt, GPTTrainConfig()


def weights_dir(weights: Optional[str | Path] = None) -> Path:
    """``weights`` as a Path, or the package's ``ambiguity/weights`` directory when None."""
    return Path(weights).expanduser() if weights is not None else WEIGHTS_DIR


def save_module(module: torch.nn.Module, config, path: str | Path, dtype: torch.dtype = torch.float16,
                **metadata) -> Path:
    """Save parameters (floating tensors cast to ``dtype``, fp16 by default; the VQ's
    ``codebook_used`` bookkeeping buffer is skipped) and the dataclass ``config`` as safetensors
    metadata (key ``config``, JSON), plus any extra ``metadata``, atomically. Returns ``path``."""
    skip = {"quantize.codebook_used"}
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in module.state_dict().items() if k not in skip}
    meta = {"config": dataclasses.asdict(config), "dtype": str(dtype).replace("torch.", ""), **metadata}
    return save_tensors(state, path, meta)


def load_module(kind: str, path: str | Path, device="cpu", dtype: torch.dtype = torch.float32):
    """Rebuild a ``"gpt"`` or ``"vq"`` module from a file written by :func:`save_module`.

    Returns (module in eval mode on ``device`` in ``dtype``, metadata dict). Raises ValueError
    for another ``kind`` and UsageError when the tensors do not match the stored config.
    """
    if kind not in ("gpt", "vq"):
        raise ValueError(f"kind must be 'gpt' or 'vq', got {kind!r}")
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
