"""Fashion-MNIST from the standard IDX files (Xiao et al., 2017; 60k train / 10k test, 10 classes).

On Debian ``apt-get install dataset-fashion-mnist`` puts them in
``/usr/share/datasets/fashion-mnist/``; any directory with the four standard files works
(gzipped or not). Images are returned as float32 in [0, 1], padded from 28 x 28 to 32 x 32
so that a VQ tokenizer with 4x downsampling gives an 8 x 8 token grid; ``load_split(size=64)``
upsamples them (:func:`upsample`) to 64 x 64 for a 16 x 16 grid (the ``embedded-16`` model).
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ambiguity.errors import UsageError

__all__ = [
    "CLASSES",
    "DEFAULT_DIRS",
    "find_dir",
    "load_split",
    "pad_to_32",
    "read_idx",
    "write_idx",
    "upsample",
    "model_image_size",
]

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
DEFAULT_DIRS = ("/usr/share/datasets/fashion-mnist", "~/.cache/fashion-mnist", "data/fashion-mnist")
MAX_IDX_BYTES = 2**31  # the largest Fashion-MNIST file holds 47 MB
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


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
    raise UsageError(
        f"Fashion-MNIST IDX files not found in {where}; run `apt-get install dataset-fashion-mnist` "
        f"or pass --data DIR with train-/t10k- images and labels"
    )


def _read_idx(fh, name: str = "IDX file") -> np.ndarray:
    try:
        with fh:
            head = fh.read(4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] != 0x08:
                raise UsageError(
                    f"{name} is not an unsigned-byte IDX file (bad magic {head.hex() or 'none'}); "
                    f"re-download the Fashion-MNIST files"
                )
            sizes = fh.read(4 * head[3])
            if len(sizes) != 4 * head[3]:
                raise UsageError(f"{name} ends inside its IDX header; the file is truncated, re-download it")
            dims = struct.unpack(">" + "I" * head[3], sizes)
            if math.prod(dims) > MAX_IDX_BYTES:
                raise UsageError(
                    f"{name} has the shape {tuple(dims)} in its header, more data than any "
                    f"Fashion-MNIST file; the file is damaged, re-download it"
                )
            data = fh.read(math.prod(dims) + 1)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError; EOFError: truncated .gz
        raise UsageError(
            f"cannot read {name} ({type(exc).__name__}: {exc}); the file is damaged or truncated, "
            f"re-download the Fashion-MNIST files"
        ) from None
    if len(data) != math.prod(dims):
        raise UsageError(
            f"{name} holds {len(data)} bytes of data but its header says {tuple(dims)}; "
            f"the file is truncated or damaged, re-download it"
        )
    return np.frombuffer(data, dtype=np.uint8).reshape(dims)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an unsigned-byte IDX file (LeCun et al.'s MNIST format; ``.gz`` read transparently).

    Format: big-endian magic ``0x0000 08 <ndim>``, ``ndim`` big-endian uint32 sizes, then the
    bytes in C order. Returns a uint8 array of those sizes. Raises UsageError for a missing,
    non-IDX or truncated file.
    """
    path = Path(path)
    fh = _open(path.with_suffix("") if path.suffix == ".gz" else path)
    if fh is None:
        raise UsageError(f"{path} does not exist; pass --data DIR with the Fashion-MNIST IDX files")
    return _read_idx(fh, path.name)


def write_idx(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Write a uint8 array as an IDX file (gzipped when ``path`` ends in ``.gz``) -> path.

    Used to build small fake data sets for tests. Raises ValueError for non-uint8 arrays.
    """
    array = np.ascontiguousarray(array)
    if array.dtype != np.uint8:
        raise ValueError(f"IDX writer takes uint8 arrays, got {array.dtype}")
    blob = bytes([0, 0, 0x08, array.ndim]) + struct.pack(">" + "I" * array.ndim, *array.shape) + array.tobytes()
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as fh:
        fh.write(blob)
    return path


def pad_to_32(images: torch.Tensor) -> torch.Tensor:
    """(N, 28, 28) uint8 -> (N, 1, 32, 32) float32 in [0, 1] (value / 255), 2 px of black on each side."""
    x = images.float().div(255.0)[:, None]
    return torch.nn.functional.pad(x, (2, 2, 2, 2))


def upsample(images: torch.Tensor, size: int) -> torch.Tensor:
    """Padded images (N, 1, 32, 32) in [0, 1] -> (N, 1, size, size), bilinearly resized
    (``align_corners=False``, no antialiasing; an identity for size 32).

    The one resizing used wherever Fashion-MNIST meets a model with larger images: VQ
    training, drafter data, profiling and the analyses. For size 64 each output pixel is
    0.75 * its nearer source pixel + 0.25 * the next one along each axis (edges replicated),
    so values stay in [0, 1]. Raises ValueError when size is not a multiple of 32.
    """
    if size <= 0 or size % 32:
        raise ValueError(f"Fashion-MNIST images are resized to a multiple of 32 px, got {size}")
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    return torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)


def model_image_size(shape) -> Optional[int]:
    """The side S when a model's ``image_shape`` is (1, S, S) with S a multiple of 32 (a model
    that takes Fashion-MNIST, padded and :func:`upsample`-d), else None."""
    shape = tuple(shape) if shape is not None else None
    if shape is None or len(shape) != 3 or shape[0] != 1 or shape[1] != shape[2] or shape[1] % 32:
        return None
    return int(shape[1])


def load_split(
    split: str = "train", root: Optional[str | os.PathLike] = None, limit: Optional[int] = None, size: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read a split -> (images (N, 1, size, size) float32 in [0, 1], labels (N,) int64 in 0..9).

    ``root``: directory with the IDX files (default: see :func:`find_dir`); ``limit``: keep only
    the first ``limit`` examples (smoke runs); ``size``: 32 (padded), or a multiple of 32 the
    padded images are :func:`upsample`-d to. Raises UsageError
    for an unknown split, missing or corrupt files, or image/label counts that differ.
    """
    if split not in _FILES:
        raise UsageError(f"split must be 'train' or 'test', got {split!r}")
    d = find_dir(root)
    img_f, lab_f = _FILES[split]
    for f in (img_f, lab_f):
        if _open(d / f) is None:
            raise UsageError(f"{d / f}[.gz] not found; pass --data DIR with the Fashion-MNIST {split} files")
    images = torch.from_numpy(_read_idx(_open(d / img_f), str(d / img_f)).copy())
    labels = torch.from_numpy(_read_idx(_open(d / lab_f), str(d / lab_f)).astype(np.int64))
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise UsageError(
            f"{d}: {split} images {tuple(images.shape)} and labels {tuple(labels.shape)} do not match; "
            f"re-download the Fashion-MNIST files"
        )
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    return upsample(pad_to_32(images), size), labels
