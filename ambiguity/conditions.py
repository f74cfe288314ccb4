"""What a run conditions on and teacher-forces: class labels, captions, real images.

Shared by every command that generates or analyses images (profile, the analyses, compare,
lantern's generate and drafter training):

* ``--source generate``: class labels (``--classes``, cycled; else ``model.default_conditions``)
  for c2i models; a seeded subset of ``--captions`` for t2i models (prompts for text models).
* ``--source dataset``: real images whose VQ token sequences are teacher-forced. For the
  embedded model, Fashion-MNIST test images (``--data DIR``; the true labels are the
  conditions); for other models an ``--images DIR`` of image files, center-cropped and resized
  to ``model.image_shape``.

Every helper raises a one-line :class:`~ambiguity.errors.UsageError` naming the fix.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch

from ambiguity.data.captions import is_coco_json, read_captions, read_coco_captions, sample_captions
from ambiguity.data.fashion_mnist import load_split, model_image_size
from ambiguity.errors import UsageError
from ambiguity.models.base import TokenModel
from ambiguity.seeding import subset_seed

__all__ = [
    "parse_classes",
    "check_labels",
    "generation_conditions",
    "model_conditions",
    "fashion_mnist_subset",
    "ImageFiles",
    "image_files_subset",
    "IMAGE_SUFFIXES",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")


def parse_classes(text: Optional[str]) -> Optional[list[int]]:
    """``"0,3,7"`` -> [0, 3, 7]; None or "" -> None. Raises UsageError for non-integers."""
    if text is None or not str(text).strip():
        return None
    try:
        out = [int(t) for t in str(text).replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise UsageError(f"--classes must be comma-separated integers like 0,3,7; got {text!r}") from None
    if not out:
        raise UsageError(f"--classes must be comma-separated integers like 0,3,7; got {text!r}")
    return out


def check_labels(model: TokenModel, labels: Sequence[int]) -> None:
    """Raise UsageError unless every label is a class of the c2i ``model`` (0..num_classes-1)."""
    n = model.num_classes or 0
    bad = [c for c in labels if not 0 <= int(c) < n]
    if bad:
        raise UsageError(f"class {bad[0]} is out of range for {model.name}; pass --classes in 0..{n - 1}")


def generation_conditions(
    model: TokenModel, n: int, seed: int, classes: Optional[list[int]] = None, captions: Optional[str | Path] = None
) -> list:
    """Conditions for ``n`` generated images: labels (c2i) or captions/prompts (t2i, text).

    c2i: ``classes`` repeated in order to length ``n`` (``[0, 3]`` -> 0, 3, 0, 3, ...), else
    ``model.default_conditions(n, seed)``. t2i / text: ``n`` captions drawn with ``seed`` from
    the ``captions`` file; without a file, ``model.default_conditions`` when the model has them.
    Raises UsageError for options that do not fit the model's kind.
    """
    if model.kind == "c2i":
        if captions is not None:
            raise UsageError(f"{model.name} is class-conditional; drop --captions and pass --classes 0,3,7 instead")
        labels = [classes[i % len(classes)] for i in range(n)] if classes else list(model.default_conditions(n, seed))
        check_labels(model, labels)
        return labels
    if classes:
        raise UsageError(
            f"{model.name} is not class-conditional ({model.kind}); drop --classes and pass --captions FILE"
        )
    if captions is not None:
        return sample_captions(read_captions(captions), n, seed)
    what = "captions" if model.kind == "t2i" else "prompts"
    return model_conditions(
        model, n, seed, f"{model.name} needs {what}: pass --captions FILE (one per line, or an MS-COCO captions_*.json)"
    )


def model_conditions(model: TokenModel, n: int, seed: int, missing: str) -> list:
    """``model.default_conditions(n, seed)`` as a list (n conditions drawn with ``seed``).
    Raises UsageError with the message ``missing`` when the model has none (its
    ``default_conditions`` raises NotImplementedError: captions or prompts must be given)."""
    try:
        return list(model.default_conditions(n, seed))
    except NotImplementedError:
        raise UsageError(missing) from None


def _subset(n_total: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(subset_seed(seed))
    return torch.randperm(n_total, generator=g)[:n].tolist()


def fashion_mnist_subset(
    model: TokenModel, n: int, seed: int, classes: Optional[list[int]] = None, data: Optional[str | Path] = None
) -> tuple[torch.Tensor, list[int]]:
    """``n`` Fashion-MNIST test images drawn with ``seed`` (only ``classes`` when given).

    Returns (images (n, 1, S, S) float32 in [0, 1], S = 32 or the model's larger side, their true
    labels). Raises UsageError
    when the data are absent, the model does not take 1 x S x S images, or fewer than ``n``
    test images are left after the class filter.
    """
    shape = _image_shape(model)
    size = model_image_size(shape)
    if size is None:
        raise UsageError(f"{model.name} takes {tuple(shape)} images, not Fashion-MNIST; pass --images DIR")
    images, labels = load_split("test", data, size=size)
    keep = torch.arange(labels.numel())
    if classes:
        check_labels(model, classes)
        keep = keep[torch.isin(labels, torch.tensor(classes))]
    if keep.numel() < n:
        raise UsageError(f"only {keep.numel()} Fashion-MNIST test images match; lower --num-images")
    idx = keep[_subset(keep.numel(), n, seed)]
    return images[idx], labels[idx].tolist()


def _image_shape(model: TokenModel) -> tuple[int, int, int]:
    try:
        return model.image_shape
    except NotImplementedError:
        raise UsageError(
            f"{model.name} has no VQ tokenizer loaded, so --source dataset cannot encode images; "
            f"use --source generate or add the tokenizer checkpoint"
        ) from None


class ImageFiles:
    """Image files loaded lazily as model inputs: ``files[a:b]`` -> (b - a, C, H, W) float32 in [0, 1].

    Each image is converted to grey (C = 1) or RGB (C = 3), center-cropped to the aspect
    ratio of ``shape`` = (C, H, W) and resized to H x W (bicubic, PIL).
    ``fingerprint`` identifies the list of files (used to refuse mixing runs on resume).
    """

    def __init__(self, paths: Sequence[Path], shape: tuple[int, int, int]):
        self.paths, self.shape = [Path(p) for p in paths], tuple(shape)
        self.fingerprint = hashlib.sha1("\n".join(str(p) for p in self.paths).encode()).hexdigest()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, s: slice) -> torch.Tensor:
        return torch.stack([load_image(p, self.shape) for p in self.paths[s]])


def load_image(path: Path, shape: tuple[int, int, int]) -> torch.Tensor:
    """One image file -> (C, H, W) float32 in [0, 1] (center crop + bicubic resize; see ImageFiles).

    Raises UsageError when PIL cannot read the file.
    """
    import numpy as np
    from PIL import Image

    C, H, W = shape
    try:
        with Image.open(path) as im:
            im = im.convert("L" if C == 1 else "RGB")
    except Exception as exc:  # PIL raises many types for broken files
        raise UsageError(f"cannot read image {path} ({type(exc).__name__}); remove it from --images") from None
    w, h = im.size
    target = W / H
    if w / h > target:
        cw, ch = round(h * target), h
    else:
        cw, ch = w, round(w / target)
    left, top = (w - cw) // 2, (h - ch) // 2
    im = im.crop((left, top, left + cw, top + ch)).resize((W, H), Image.BICUBIC)
    x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0)
    return x[None] if C == 1 else x.permute(2, 0, 1).contiguous()


def image_files_subset(
    model: TokenModel,
    folder: str | Path,
    n: int,
    seed: int,
    classes: Optional[list[int]] = None,
    captions: Optional[str | Path] = None,
) -> tuple[ImageFiles, list]:
    """``n`` image files from ``folder`` (searched recursively, sorted by path) drawn with ``seed``.

    Conditions: c2i -> ``classes`` cycled or ``model.default_conditions`` (the files carry no
    labels); t2i/text -> captions: with an MS-COCO JSON, the longest caption of the image whose
    file name's number is its ``image_id`` (``000000397133.jpg`` -> 397133); with a text file,
    line i belongs to the i-th file in sorted order. Returns (ImageFiles, conditions).
    Raises UsageError for a missing/empty folder or images without captions.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise UsageError(f"--images {folder} is not a directory; pass a folder of image files")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise UsageError(f"--images {folder} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    shape = _image_shape(model)
    if model.kind == "c2i":
        if captions is not None:
            raise UsageError(f"{model.name} is class-conditional; drop --captions and pass --classes 0,3,7 instead")
        if len(files) < n:
            raise UsageError(f"--images {folder} holds {len(files)} images; lower --num-images")
        chosen = [files[i] for i in _subset(len(files), n, seed)]
        return ImageFiles(chosen, shape), generation_conditions(model, n, seed, classes)
    if classes:
        raise UsageError(
            f"{model.name} is not class-conditional ({model.kind}); drop --classes and pass --captions FILE"
        )
    if captions is None:
        raise UsageError(f"{model.name} needs a caption per image: pass --captions FILE with --images")
    if is_coco_json(captions):
        by_id = read_coco_captions(captions)
        pairs = [(f, by_id.get(_image_id(f))) for f in files]
    else:
        lines = read_captions(captions)
        pairs = list(zip(files, lines))
    pairs = [(f, c) for f, c in pairs if c]
    if len(pairs) < n:
        raise UsageError(f"only {len(pairs)} images in {folder} have a caption in {captions}; lower --num-images")
    chosen = [pairs[i] for i in _subset(len(pairs), n, seed)]
    return ImageFiles([f for f, _ in chosen], shape), [c for _, c in chosen]


def _image_id(path: Path) -> Optional[int]:
    digits = re.findall(r"\d+", path.stem)
    return int(digits[-1]) if digits else None
