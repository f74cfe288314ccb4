"""The embedded default model: a LlamaGen-architecture VQ tokenizer and class-conditional GPT
trained by this project on Fashion-MNIST (``scripts/train_embedded.py`` regenerates them).

Weights ship inside the package as safetensors with the architecture in the file metadata
(key ``config``), so running the model needs neither the data set nor a network.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from ambiguity.data.fashion_mnist import CLASSES
from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.models.checkpoints import load_module
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.llamagen import LlamaGenModel
from ambiguity.models.vq import VQConfig, VQModel

__all__ = [
    "WEIGHTS_DIR",
    "VQ_FILE",
    "GPT_FILE",
    "METRICS_FILE",
    "VQ16_FILE",
    "GPT16_FILE",
    "METRICS16_FILE",
    "Variant",
    "VARIANTS",
    "load_gpt",
    "load_vq",
    "load_embedded",
    "variant_of",
    "check_variant",
    "weights_dir",
    "VQ_SKIP",
]

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
VQ_FILE = "fashion_vq.safetensors"
GPT_FILE = "fashion_gpt.safetensors"
METRICS_FILE = "embedded_metrics.json"
TRAIN_HINT = "python scripts/train_embedded.py"
VQ_SKIP = ("quantize.codebook_used",)  # bookkeeping buffer of training, not saved with the weights
# embedded-16: LlamaGen's token geometry (16384 codes of dim 8, 16 x 16 tokens on 64 x 64 px)
VQ16_FILE = "fashion16_vq.safetensors"
GPT16_FILE = "fashion16_gpt.safetensors"
METRICS16_FILE = "embedded16_metrics.json"


class Variant(NamedTuple):
    """A shipped embedded model: its weight and metrics file names and its image side in px."""

    vq_file: str
    gpt_file: str
    metrics_file: str
    image_size: int


# registry name (= --recipe of scripts/train_embedded.py) -> its files
VARIANTS = {
    "embedded": Variant(VQ_FILE, GPT_FILE, METRICS_FILE, 32),
    "embedded-16": Variant(VQ16_FILE, GPT16_FILE, METRICS16_FILE, 64),
}

# Files that ``scripts/train_embedded.py --recipe embedded-16-long`` wrote before 2026-12-03 record the
# recipe's name as their variant; the recipe trains embedded-16's GPT, so they are embedded-16's files.
RECIPE_VARIANTS = {"embedded-16-long": "embedded-16"}


def weights_dir(weights: Optional[str | Path] = None) -> Path:
    """``weights`` as a Path, or the package's ``ambiguity/weights`` directory when None."""
    return Path(weights).expanduser() if weights is not None else WEIGHTS_DIR


def load_gpt(path: str | Path, device="cpu", dtype: torch.dtype = torch.float32) -> tuple[GPT, dict]:
    """A GPT written by :func:`~ambiguity.models.checkpoints.save_module` -> (module, metadata)."""
    return load_module(path, GPT, GPTConfig, device, dtype, fix=f"retrain it ({TRAIN_HINT})")


def load_vq(path: str | Path, device="cpu") -> tuple[VQModel, dict]:
    """A VQ tokenizer written by ``save_module`` (its ``codebook_used`` bookkeeping buffer is not
    stored) -> (module in float32, metadata)."""
    return load_module(
        path,
        VQModel,
        VQConfig,
        device,
        torch.float32,
        defaults=lambda m: {"quantize.codebook_used": m.quantize.codebook_used},
        fix=f"retrain it ({TRAIN_HINT})",
    )


def load_embedded(weights=None, device="cpu", dtype=torch.float32, variant: str = "embedded") -> LlamaGenModel:
    """A shipped Fashion-MNIST model, ``variant`` of :data:`VARIANTS` (``weights``: a directory
    with its two files instead).

    ``embedded``: images 1 x 32 x 32 (Fashion-MNIST padded by 2 px), 8 x 8 tokens.
    ``embedded-16``: images upsampled to 1 x 64 x 64, 16 x 16 tokens of a 16384-code codebook;
    the grid and vocabulary come from the files.
    Raises WeightsNotFoundError when the files are missing (a checkout without them can
    regenerate them with ``python scripts/train_embedded.py --recipe <variant>``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown embedded variant {variant!r}; choose from {', '.join(VARIANTS)}")
    name, (vq_file, gpt_file, _, _) = variant, VARIANTS[variant]
    d = weights_dir(weights)
    hint = TRAIN_HINT + ("" if variant == "embedded" else f" --recipe {variant}")
    if weights is not None and not d.exists():
        raise UsageError(f"--weights {d} does not exist; check the path (or omit --weights for the shipped files)")
    if d.is_file():
        raise UsageError(
            f"--weights {d} is a file; the {name} model takes a directory holding {vq_file} and {gpt_file}"
        )
    missing = [f for f in (vq_file, gpt_file) if not (d / f).is_file()]
    if missing:
        raise WeightsNotFoundError(
            f"{name} model weights {', '.join(missing)} not found in {d}; run `{hint}` to train them"
        )
    vq, vq_meta = load_vq(d / vq_file, device)
    gpt, gpt_meta = load_gpt(d / gpt_file, device, dtype)
    check_variant(variant, d, vq, vq_meta, gpt, gpt_meta)
    return LlamaGenModel(gpt, vq, name=name, class_names=list(CLASSES))


def _recorded_variant(meta: dict) -> Optional[str]:
    """The ``variant`` a file's metadata records, with :data:`RECIPE_VARIANTS` applied."""
    v = meta.get("variant")
    return RECIPE_VARIANTS.get(str(v), str(v)) if v else None


def variant_of(vq: VQModel, vq_meta: dict, gpt: GPT, gpt_meta: dict) -> Optional[str]:
    """Which :data:`VARIANTS` entry a VQ + GPT pair is: the ``variant`` its files record (files
    written since it is recorded; a training recipe's name recorded by older files maps through
    :data:`RECIPE_VARIANTS`), else the one whose image side equals the pair's (token grid side x
    the VQ's downsampling factor; the shipped files predate the record). None when no variant has
    that side (e.g. a test model)."""
    recorded = _recorded_variant(gpt_meta) or _recorded_variant(vq_meta)
    if recorded:
        return recorded
    side = math.isqrt(gpt.config.block_size) * 2 ** (len(vq.config.encoder_ch_mult) - 1)
    return next((n for n, v in VARIANTS.items() if v.image_size == side), None)


def check_variant(variant: str, d: Path, vq: VQModel, vq_meta: dict, gpt: GPT, gpt_meta: dict) -> None:
    """Refuse (UsageError) files of another embedded variant under ``variant``'s names (say
    ``fashion16_*`` renamed ``fashion_*``: a run labelled ``embedded`` with 16 x 16 tokens), a
    VQ and a GPT that record different variants, or a GPT whose vocabulary is not the VQ's
    codebook. Source: the variant table :data:`VARIANTS`; the file metadata of ``save_module``."""
    recorded = {k: _recorded_variant(m) for k, m in (("VQ", vq_meta), ("GPT", gpt_meta)) if m.get("variant")}
    if len(set(recorded.values())) > 1:
        raise UsageError(
            f"the files in {d} belong to different models (VQ: {recorded['VQ']}, GPT: {recorded['GPT']}); "
            f"restore the pair or retrain it ({TRAIN_HINT})"
        )
    found = variant_of(vq, vq_meta, gpt, gpt_meta)
    if found is not None and found != variant:
        side = math.isqrt(gpt.config.block_size)
        fix = f"pass --model {found}" if found in VARIANTS else "pass the model these files belong to"
        raise UsageError(
            f"{d} holds {found} weights ({side}x{side} tokens, {gpt.config.vocab_size} codes) under "
            f"{variant}'s file names; {fix}, or restore {variant}'s files"
        )
    if gpt.config.vocab_size != vq.config.codebook_size:
        raise UsageError(
            f"the GPT in {d} predicts {gpt.config.vocab_size} codes but the VQ has "
            f"{vq.config.codebook_size}; the two files belong to different models: restore the pair "
            f"or retrain it ({TRAIN_HINT})"
        )
