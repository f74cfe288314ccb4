"""Image sets to evaluate and to compare against: generation runs, image folders, data set splits.

A source is named by one string, the same on the command line and in the Python API:

* a directory written by ``python -m lantern.generate`` (it has ``summary.json``): its images in
  index order, with their conditions (class labels or captions) and seeds;
* any other directory: its image files (``.png``, ``.jpg``, ``.jpeg``, ``.bmp``, ``.webp``) in
  name order;
* ``fashion-mnist:test`` or ``fashion-mnist:train`` (the IDX files, see
  :mod:`ambiguity.data.fashion_mnist`; ``--data DIR``): 28 x 28 padded to 32 x 32, the embedded
  model's format, with true labels as conditions; as the reference of runs with square images
  of a multiple of 32 px (embedded-16: 64 x 64) it is upsampled to their size exactly as that
  model's training data were.

``SPEC@N`` keeps a seeded random subset of N images (:func:`ambiguity.seeding.derived_seed` of
the evaluation seed and the tag 11), e.g. ``fashion-mnist:train@1000`` as a real-data baseline
at the sample size of a run; ``SPEC@:N`` keeps the first N (for runs: image indices 0..N-1, the
same seeds and conditions in every run of one ``--seed``). A **reference** folder of images of
other sizes is centre-cropped and resized (PIL bicubic) to the resolution of the generated images;
generated sets must share one resolution with each other and with a fixed-size reference (runs and
data sets), else the evaluation stops with one line naming the fix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image

from ambiguity.data.fashion_mnist import CLASSES, find_dir, load_split
from ambiguity.errors import UsageError
from ambiguity.runs import file_sha256
from ambiguity.seeding import SEED_TAGS, derived_seed
from lantern.run_reader import load_run, read_images

__all__ = [
    "ImageSet",
    "distinct_images",
    "duplicate_note",
    "load_source",
    "parse_spec",
    "subset_indices",
    "IMAGE_SUFFIXES",
    "DATASETS",
    "SUBSET_TAG",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
DATASETS = ("fashion-mnist:test", "fashion-mnist:train")
SUBSET_TAG = SEED_TAGS["quality-subset"]


@dataclass
class ImageSet:
    """Images of one source: images (N, C, H, W) float32 in [0, 1]; conditions (N,) (labels or
    captions, None when unknown); fingerprint: SHA-256 prefix of what the images came from;
    info: facts for the record (kind, path, model, sampling settings, class names)."""

    spec: str
    label: str
    images: torch.Tensor
    conditions: Optional[list]
    fingerprint: str
    info: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.images.shape[0])

    @property
    def hw(self) -> tuple[int, int]:
        return tuple(int(v) for v in self.images.shape[-2:])


def parse_spec(spec: str) -> tuple[str, Optional[int]]:
    """``"SPEC@N"`` -> (SPEC, N); ``"SPEC@:N"`` -> (SPEC, -N) (the first N); ``"SPEC"`` -> (SPEC, None).

    UsageError for a size below 1.
    """
    base, sep, n = str(spec).rpartition("@")
    if not sep or not base:
        return str(spec), None
    first = n.startswith(":")
    try:
        k = int(n[1:] if first else n)
    except ValueError:
        return str(spec), None  # an '@' inside a path
    if k < 1:
        raise UsageError(f"{spec}: the subset size after '@' must be >= 1")
    return base, -k if first else k


def subset_indices(n: int, k: Optional[int], seed: int) -> np.ndarray:
    """Sorted indices kept of range(n): all (k None or |k| >= n), the first -k (k < 0), or a
    seeded random subset of k."""
    if k is None or abs(k) >= n:
        return np.arange(n)
    if k < 0:
        return np.arange(-k)
    g = torch.Generator().manual_seed(derived_seed(seed, SUBSET_TAG))
    return np.sort(torch.randperm(n, generator=g)[:k].numpy())


def _read_image(path: Path) -> np.ndarray:
    try:
        with Image.open(path) as im:
            im = im.convert("L") if im.mode in ("1", "L", "LA", "I", "I;16") else im.convert("RGB")
            a = np.asarray(im, dtype=np.float32) / 255.0
    except OSError as exc:
        raise UsageError(f"cannot read image {path} ({exc}); remove it or re-create it") from None
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def _resize_square(a: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Centre-crop to square and resize (PIL bicubic) to hw; (C, H, W) float in [0, 1]."""
    c, h, w = a.shape
    s = min(h, w)
    a = a[:, (h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s]
    if (s, s) == tuple(hw):
        return a
    u8 = np.clip(np.rint(a * 255), 0, 255).astype(np.uint8)
    im = Image.fromarray(u8[0] if c == 1 else u8.transpose(1, 2, 0))
    out = np.asarray(im.resize((hw[1], hw[0]), Image.BICUBIC), dtype=np.float32) / 255.0
    return out[None] if out.ndim == 2 else out.transpose(2, 0, 1)


def _folder(path: Path, k: Optional[int], seed: int, resize_to: Optional[tuple[int, int]]) -> ImageSet:
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise UsageError(
            f"{path} holds no image files ({', '.join(IMAGE_SUFFIXES)}) and no lantern.generate run; "
            f"pass a run directory, an image folder or one of {', '.join(DATASETS)}"
        )
    files = [files[i] for i in subset_indices(len(files), k, seed)]
    arrays = [_read_image(f) for f in files]
    if resize_to is not None:
        arrays = [_resize_square(a, resize_to) for a in arrays]
    shapes = sorted({a.shape for a in arrays})
    if len(shapes) > 1:
        raise UsageError(
            f"{path} holds images of several sizes ({shapes[0]} and {shapes[-1]}); resize them to one "
            f"size, or use the folder as --reference (references are cropped and resized)"
        )
    chans = {a.shape[0] for a in arrays}
    if len(chans) > 1:  # mixed grey / RGB: make all RGB
        arrays = [np.repeat(a, 3, 0) if a.shape[0] == 1 else a for a in arrays]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + file_sha256(f).encode())
    fix = {"kind": "folder", "path": str(path.resolve()), "files": len(files)}
    if resize_to is not None:
        fix["resize"] = f"centre-crop to square, PIL bicubic to {resize_to[0]}x{resize_to[1]}"
    return ImageSet(str(path), path.name, torch.from_numpy(np.stack(arrays)), None, h.hexdigest()[:16], fix)


def distinct_images(images: torch.Tensor) -> int:
    """How many of the images (N, C, H, W) differ from each other (byte-equal images count once)."""
    x = images.detach().cpu().contiguous().numpy()
    return len({hashlib.sha256(a.tobytes()).digest() for a in x})


def duplicate_note(s: ImageSet) -> Optional[str]:
    """A note when ``s`` holds the same image more than once (greedy decoding with CFG repeats one
    image per condition), else None: every metric counts all n images, so its n and interval
    overstate how many independent samples there are."""
    d = distinct_images(s.images)
    if d == s.n:
        return None
    return (
        f"{s.label}: only {d} distinct images among its n = {s.n} (repeats, as greedy decoding gives one image "
        f"per condition); the metrics count all {s.n}, so they describe {d} samples and their intervals are too narrow"
    )


_OLD_KEYS = {"tau": "mean_accepted_length", "tokens_per_forward": "step_compression"}  # summaries before the rename


def _speed(summary: dict) -> dict:
    """Acceptance rate, τ, tokens per target forward and seconds per image of a run's summary."""
    out = {}
    for key in ("acceptance_rate", "tau", "tokens_per_forward", "seconds_per_image"):
        v = summary.get(key, summary.get(_OLD_KEYS.get(key, key)))
        if v is not None:
            out[key] = v
    return out


def _run(path: Path, k: Optional[int], seed: int) -> ImageSet:
    run = load_run(path)
    images = run["images"]
    if len(images) == 0:
        raise UsageError(
            f"{path} holds no images; generate some with python -m lantern.generate --out {path} --num-images N"
        )
    images = images.iloc[subset_indices(len(images), k, seed)].reset_index(drop=True)
    pix = torch.from_numpy(read_images(path, images).astype(np.float32))
    s = run["summary"]
    settings = s.get("settings", {}) or {}
    fp = hashlib.sha256((file_sha256(path / "images.parquet") + json.dumps(sorted(images["image"].tolist()))).encode())
    model = settings.get("model") or (s.get("model") or {}).get("name")
    info = {
        "kind": "run",
        "path": str(path.resolve()),
        "method": s.get("method"),
        "rule": s.get("rule"),
        "model": model,
        "sampling": s.get("sampling"),
        "seed": settings.get("seed"),
        "model_kind": (s.get("model") or {}).get("kind") if isinstance(s.get("model"), dict) else None,
        "captions": settings.get("captions"),
        "captions_sha256": settings.get("captions_sha256"),
        "classes": settings.get("classes"),
        "seeds": [int(v) for v in images["seed"]] if "seed" in images else None,
        "image_indices": [int(v) for v in images["image"]],
        "speed": _speed(s),
    }
    if model == "embedded":
        info["class_names"] = list(CLASSES)
    return ImageSet(str(path), path.name, pix, list(images["condition"]), fp.hexdigest()[:16], info)


def _dataset(
    spec: str, k: Optional[int], seed: int, data: Optional[str], resize_to: Optional[tuple[int, int]] = None
) -> ImageSet:
    split = spec.split(":", 1)[1]
    d = find_dir(data)
    # a reference for larger images (embedded-16: 64 x 64) is upsampled exactly as that model's
    # training data were (ambiguity.data.fashion_mnist.upsample); other sizes stay 32 x 32
    size = resize_to[0] if resize_to and resize_to[0] == resize_to[1] and resize_to[0] % 32 == 0 else 32
    x, y = load_split(split, d, size=size)
    idx = subset_indices(len(x), k, seed)
    files = [f for f in sorted(d.iterdir()) if f.name.startswith("t10k" if split == "test" else "train")]
    fp = hashlib.sha256(
        "".join(file_sha256(f) for f in files).encode()
        + json.dumps(idx.tolist()).encode()
        + (f"@{size}px".encode() if size != 32 else b"")
    )
    info = {
        "kind": "dataset",
        "dataset": spec,
        "path": str(d.resolve()),
        "images_in_split": int(len(x)),
        "format": "28x28 uint8 / 255, zero-padded by 2 px to 32x32"
        + (f", bilinearly upsampled to {size}x{size}" if size != 32 else ""),
        "class_names": list(CLASSES),
    }
    label = spec + ("" if k is None else f"@{k}" if k > 0 else f"@:{-k}")
    return ImageSet(spec, label, x[idx], [int(v) for v in y[idx]], fp.hexdigest()[:16], info)


def load_source(
    spec: str, seed: int = 0, data: Optional[str] = None, resize_to: Optional[tuple[int, int]] = None, what: str = "run"
) -> ImageSet:
    """Load the images named by ``spec`` (module docstring) -> :class:`ImageSet`.

    seed: the evaluation seed (subsets); data: Fashion-MNIST directory; resize_to: (H, W) that a
    folder of images is cropped and resized to, and that Fashion-MNIST is upsampled to when it is
    a square multiple of 32 (references only); what: ``"run"`` or
    ``"reference"`` for messages. Raises UsageError for a missing path, an empty run or folder,
    unreadable images or images of several sizes.
    """
    base, k = parse_spec(spec)
    if base.startswith("fashion-mnist:"):
        if base not in DATASETS:
            raise UsageError(f"unknown data set {base!r}; use {' or '.join(DATASETS)}")
        out = _dataset(base, k, seed, data, resize_to)
    else:
        path = Path(base).expanduser()
        if not path.exists():
            hint = (
                f"pass a lantern.generate run, an image folder or one of {', '.join(DATASETS)}"
                if what == "reference"
                else "check the path, or generate it with python -m lantern.generate"
            )
            raise UsageError(f"{what} {path} does not exist; {hint}")
        if not path.is_dir():
            raise UsageError(f"{what} {path} is not a directory; pass a lantern.generate run or an image folder")
        is_run = any((path / f).is_file() for f in ("summary.json", "run.json", "images.parquet"))
        out = _run(path, k, seed) if is_run else _folder(path, k, seed, resize_to)  # unfinished runs: load_run says so
    if out.n == 0:
        raise UsageError(f"{what} {spec} holds no images")
    if k is not None and abs(k) > out.n:  # said, not silently clamped: the label still reads @k
        out.info["notes"] = [f"{spec}: only {out.n} images exist, so all {out.n} are used"]
    out.spec = spec
    return out
