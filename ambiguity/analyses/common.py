"""Plumbing shared by the analyses: command-line options, token grids to analyse, resumable parts.

Nothing here is science; the analyses themselves live in :mod:`.concentration` and
:mod:`.interchangeability`.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from ambiguity.errors import UsageError
from ambiguity.sampling import SamplingConfig

__all__ = ["add_model_args", "add_sampling_args", "sampling_from_args", "conditions_for", "real_images",
           "settings_dir", "batches", "seed_for", "parse_floats", "parse_ints", "print_table"]


def add_model_args(ap) -> None:
    """--model, --weights, --device, --seed, --out (shared by every analysis CLI)."""
    from ambiguity.models.registry import DEFAULT_MODEL

    ap.add_argument("--model", default=DEFAULT_MODEL, help="registry name (default: %(default)s)")
    ap.add_argument("--weights", default=None, help="checkpoint file or folder (default: the model's usual place)")
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of sampling and of every random choice")


def add_sampling_args(ap) -> None:
    """--cfg, --temperature, --top-k, --top-p, --num-images, --batch-size, --captions, --data."""
    ap.add_argument("--num-images", type=int, default=32, help="token grids to analyse (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=16, help="images per forward pass (default: %(default)s)")
    ap.add_argument("--cfg", type=float, default=1.0, help="classifier-free guidance scale (1 = none)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0, help="0 disables")
    ap.add_argument("--top-p", type=float, default=1.0, help="1 disables")
    ap.add_argument("--captions", default=None, help="text file, one caption per line (t2i models)")
    ap.add_argument("--data", default=None, help="teacher-force real images instead of generating: a Fashion-MNIST "
                    "IDX folder, or 'fashion-mnist' for the default places (models with 1x32x32 images)")


def sampling_from_args(args) -> SamplingConfig:
    """SamplingConfig from parsed options (UsageError for out-of-range values)."""
    return SamplingConfig(cfg=args.cfg, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def conditions_for(model, n: int, captions: Optional[str] = None) -> list:
    """``n`` conditions: classes round-robin for c2i, lines of ``captions`` (cycled) for t2i.

    Raises UsageError when a t2i/text model gets no captions file, or the file is empty.
    """
    if n < 1:
        raise UsageError(f"--num-images must be >= 1, got {n}")
    if captions is not None:
        path = Path(captions)
        if not path.is_file():
            raise UsageError(f"captions file {path} does not exist; pass a text file with one caption per line")
        lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
        if not lines:
            raise UsageError(f"captions file {path} is empty; write one caption per line")
        return [lines[i % len(lines)] for i in range(n)]
    try:
        return model.default_conditions(n)
    except NotImplementedError:
        raise UsageError(f"{model.name} needs conditions; pass --captions FILE with one caption per line") from None


def real_images(model, data: str, n: int) -> tuple[torch.Tensor, list]:
    """The first ``n`` Fashion-MNIST test images (N, 1, 32, 32) in [0, 1] and their labels.

    Raises UsageError when the model's images are not 1 x 32 x 32 or the files are missing.
    """
    from ambiguity.data.fashion_mnist import load_split

    try:
        shape = tuple(model.image_shape)
    except NotImplementedError:
        shape = None
    if shape != (1, 32, 32):
        raise UsageError(f"--data gives 1x32x32 Fashion-MNIST images but {model.name} takes {shape}; "
                         f"drop --data to analyse generated tokens")
    images, labels = load_split("test", None if data == "fashion-mnist" else data)
    if n > len(images):
        raise UsageError(f"--num-images {n} exceeds the {len(images)} test images")
    return images[:n], labels[:n].tolist()


def settings_dir(out: Path, settings: dict) -> Path:
    """``out/parts-<hash of settings>``: parts written under other settings are never mixed in."""
    h = hashlib.blake2b(json.dumps(settings, sort_keys=True, default=str).encode(), digest_size=6).hexdigest()
    d = Path(out) / f"parts-{h}"
    d.mkdir(parents=True, exist_ok=True)
    from ambiguity.io import write_json

    write_json(settings, d / "settings.json")
    return d


def batches(n: int, batch_size: int) -> Iterator[tuple[int, slice]]:
    """(batch index, slice) pairs covering range(n). Raises UsageError for batch_size < 1."""
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    for b, s in enumerate(range(0, n, batch_size)):
        yield b, slice(s, min(n, s + batch_size))


def seed_for(*parts) -> int:
    """A 63-bit seed derived from integers (SeedSequence), e.g. seed_for(seed, batch)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def parse_ints(text: str | Sequence[int], what: str) -> list[int]:
    """"1,2,4" -> [1, 2, 4]; UsageError naming the option otherwise."""
    if not isinstance(text, str):
        return [int(v) for v in text]
    try:
        return [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers like 1,4,16, got {text!r}") from None


def parse_floats(text: str | Sequence[float], what: str) -> list[float]:
    """"0.1,0.5" -> [0.1, 0.5]; UsageError naming the option otherwise."""
    if not isinstance(text, str):
        return [float(v) for v in text]
    try:
        return [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated numbers like 0.1,0.5, got {text!r}") from None


def print_table(df, columns: Sequence[str], title: str = "") -> None:
    """Print selected columns of a summary DataFrame with 4 significant digits."""
    if title:
        print(title)
    print(df[list(columns)].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
