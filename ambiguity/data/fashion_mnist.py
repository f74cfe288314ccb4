"""Fashion-MNIST from the standard IDX files (Xiao et al., 2017; 60k train / 10k test, 10 classes).

On Debian ``apt-get install dataset-fashion-mnist`` puts them in
``/usr/share/datasets/fashion-mnist/``; any directory with the four standard files works
(gzipped or not). Images are returned as float32 in [0, 1], padded from 28 x 28 to 32 x 32
so that a VQ tokenizer with 4x downsampling gives an 8 x 8 token grid.
"""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ambiguity.errors import UsageError

__all__ = ["CLASSES", "DEFAULT_DIRS", "find_dir", "load_split", "pad_to_32"]

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
DEFAULT_DIRS = ("/usr/share/datasets/fashion-mnist", "~/.cache/fashion-mnist", "data/fashion-mnist")
_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _open(base: Path):
    for cand in (base, base.with_name(base.name + ".gz")):
        if cand.is_file():
            return gzip.open(cand, "rb") if cand.suffix == ".gz" else open(cand, "rb")
    return None


def find_dir(root: Optional[str | os.PathLike] = None) -> Path:
    """The first directory holding the IDX files: ``root``, $FASHION_MNIST_DIR, then defaults.

    Raises UsageError naming how to get the data when none is found.
    """
    cands = [root] if root else [os.environ.get("FASHION_MNIST_DIR"), *DEFAULT_DIRS]
    for c in cands:
        if not c:
            continue
        p = Path(c).expanduser()
        if all(_open(p / f) is not None for f in _FILES["test"]):
            return p
    where = root or ", ".join(DEFAULT_DIRS)
    raise UsageError(f"Fashion-MNIST IDX files not found in {where}; run `apt-get install dataset-fashion-mnist` "
                     f"or pass --data DIR with train-/t10k- images and labels")


def _read_idx(fh) -> np.ndarray:
    with fh:
        magic = struct.unpack(">I", fh.read(4))[0]
        ndim = magic & 0xFF
        dims = struct.unpack(">" + "I" * ndim, fh.read(4 * ndim))
        return np.frombuffer(fh.read(), dtype=np.uint8).reshape(dims)


def pad_to_32(images: torch.Tensor) -> torch.Tensor:
    """(N, 28, 28) uint8 -> (N, 1, 32, 32) float32 in [0, 1], 2 px of black on each side."""
    x = images.float().div(255.0)[:, None]
    return torch.nn.functional.pad(x, (2, 2, 2, 2))


def load_split(split: str = "train", root: Optional[str | os.PathLike] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (images (N, 1, 32, 32) float32 in [0, 1], labels (N,) int64)."""
    if split not in _FILES:
        raise UsageError(f"split must be 'train' or 'test', got {split!r}")
    d = find_dir(root)
    img_f, lab_f = _FILES[split]
    images = torch.from_numpy(_read_idx(_open(d / img_f)).copy())
    labels = torch.from_numpy(_read_idx(_open(d / lab_f)).astype(np.int64))
    return pad_to_32(images), labels
