"""Captions for text-to-image models: a plain text file or an MS-COCO captions annotation file.

* Text: one caption per line, UTF-8; blank lines are skipped; surrounding whitespace is stripped.
* MS-COCO (``captions_train2017.json``, ``captions_val2014.json``, ...): ``{"annotations":
  [{"image_id": int, "caption": str, ...}, ...]}``. As in LANTERN's MS-COCO evaluation (Jang et
  al., ICLR 2025, experimental setup) one caption per image is used: the longest one (by
  characters; the first in file order on ties), images in ascending ``image_id``.

A file is read as COCO JSON when its name ends in ``.json`` or its first non-blank character is
``{``. :func:`sample_captions` draws the seeded random subset the profiler uses.
Every problem with the file is a one-line :class:`~ambiguity.errors.UsageError` naming the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import UsageError
from ambiguity.seeding import subset_seed

__all__ = [
    "read_captions",
    "read_text_captions",
    "read_coco_captions",
    "longest_per_image",
    "sample_captions",
    "load_captions",
    "is_coco_json",
]

_FIX = "pass --captions FILE with one caption per line or an MS-COCO captions_*.json"


def _clean(text: str) -> str:
    """Collapse runs of whitespace (COCO captions contain stray newlines and double spaces)."""
    return " ".join(text.split())


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"captions file {path} does not exist; {_FIX}") from None
    except IsADirectoryError:
        raise UsageError(f"captions path {path} is a directory; {_FIX}") from None
    except UnicodeDecodeError:
        raise UsageError(f"captions file {path} is not UTF-8 text; {_FIX}") from None
    except OSError as exc:
        raise UsageError(f"cannot read captions file {path} ({exc.strerror or exc}); {_FIX}") from None


def read_text_captions(path: str | Path) -> list[str]:
    """One caption per line -> list[str] in file order (blank lines skipped).

    Raises UsageError when the file cannot be read or holds no caption.
    """
    path = Path(path).expanduser()
    captions = [_clean(line) for line in _read_text(path).splitlines()]
    captions = [c for c in captions if c]
    if not captions:
        raise UsageError(f"captions file {path} holds no captions; {_FIX}")
    return captions


def longest_per_image(annotations: list) -> dict[int, str]:
    """COCO ``annotations`` list -> {image_id: longest caption}, ids in ascending order.

    Raises UsageError when an entry lacks an integer ``image_id`` or a string ``caption``.
    """
    best: dict[int, str] = {}
    for i, ann in enumerate(annotations):
        if (
            not isinstance(ann, dict)
            or not isinstance(ann.get("caption"), str)
            or isinstance(ann.get("image_id"), bool)
            or not isinstance(ann.get("image_id"), int)
        ):
            raise UsageError(f"COCO annotation #{i} lacks an integer image_id and a string caption; {_FIX}")
        cap = _clean(ann["caption"])
        if cap and len(cap) > len(best.get(ann["image_id"], "")):
            best[ann["image_id"]] = cap
    return {k: best[k] for k in sorted(best)}


def read_coco_captions(path: str | Path) -> dict[int, str]:
    """MS-COCO captions annotation file -> {image_id: longest caption} (ascending ids).

    Raises UsageError for unreadable, malformed or caption-less files.
    """
    path = Path(path).expanduser()
    text = _read_text(path)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"captions file {path} is not valid JSON (line {exc.lineno}: {exc.msg}); {_FIX}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("annotations"), list):
        raise UsageError(f'{path} has no "annotations" list, so it is not an MS-COCO captions file; {_FIX}')
    best = longest_per_image(obj["annotations"])
    if not best:
        raise UsageError(f"COCO captions file {path} holds no captions; {_FIX}")
    return best


def is_coco_json(path: str | Path) -> bool:
    """Whether ``path`` is read as COCO JSON: a ``.json`` name or a first non-blank ``{``."""
    path = Path(path).expanduser()
    if path.suffix.lower() == ".json":
        return True
    try:
        with open(path, "rb") as fh:
            head = fh.read(256).lstrip()
    except OSError:
        return False
    return head.startswith(b"{")


def read_captions(path: str | Path) -> list[str]:
    """All captions of a text or COCO JSON file (format detected; see the module docstring).

    Returns list[str]: text lines in file order, or the longest caption of each COCO image in
    ascending image id. Raises UsageError for a missing, unreadable, empty or malformed file.
    """
    path = Path(path).expanduser()
    if path.is_file() and is_coco_json(path):
        return list(read_coco_captions(path).values())
    return read_text_captions(path)


def sample_captions(captions: list[str], n: Optional[int], seed: int = 0) -> list[str]:
    """A seeded random subset of ``n`` distinct entries, in draw order (``torch.randperm`` on CPU).

    ``n=None`` takes all captions (a seeded permutation). The same (captions, n, seed) always
    gives the same list. Raises UsageError when ``n < 1`` or there are fewer than ``n`` captions.
    """
    if n is None:
        n = len(captions)
    if n < 1:
        raise UsageError(f"--num-images must be >= 1, got {n}")
    if n > len(captions):
        raise UsageError(
            f"the captions file has {len(captions)} captions but {n} images were asked for; "
            f"lower --num-images or pass a larger --captions file"
        )
    g = torch.Generator().manual_seed(subset_seed(seed))
    order = torch.randperm(len(captions), generator=g)[:n]
    return [captions[i] for i in order.tolist()]


def load_captions(path: str | Path, n: Optional[int] = None, seed: int = 0) -> list[str]:
    """:func:`read_captions` then :func:`sample_captions`: ``n`` seeded captions (all when None)."""
    return sample_captions(read_captions(path), n, seed)
