"""Checks of an evaluation's input, run before any image is scored: each raises
:class:`~ambiguity.errors.UsageError` with one line that names the fix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from ambiguity.errors import UsageError
from ambiguity.memory import check_count
from lantern.quality.features import EXTRACTORS
from lantern.quality.sources import ImageSet

__all__ = [
    "check_bootstrap",
    "check_sizes",
    "check_run_names",
    "check_counts",
    "parse_extractors",
    "read_class_names",
]


def check_bootstrap(resamples: int, n: int) -> None:
    """Refuse ``--bootstrap`` before any image is scored when its resample counts of ``n`` images
    (float64, as :func:`lantern.quality.metrics.bootstrap_indices` holds them, with its working
    copies) cannot fit in memory; UsageError naming the largest count that fits."""
    check_count(resamples, 3 * 8 * max(n, 1), "--bootstrap", f"the resample counts of {n} images")


def check_sizes(runs: Sequence[ImageSet], reference: Optional[ImageSet]) -> None:
    """All runs must share one resolution, and a run or data-set reference must have it too."""
    sizes = {r.spec: r.hw for r in runs}
    first = runs[0]
    for r in runs[1:]:
        if r.hw != first.hw:
            raise UsageError(
                f"{r.spec} has {r.hw[0]}x{r.hw[1]} images but {first.spec} {first.hw[0]}x{first.hw[1]}; "
                f"evaluate runs of one resolution together (FID across resolutions is not comparable)"
            )
    if reference is not None and reference.info.get("kind") != "folder" and reference.hw != first.hw:
        raise UsageError(
            f"the reference {reference.spec} has {reference.hw[0]}x{reference.hw[1]} images but the runs "
            f"{first.hw[0]}x{first.hw[1]} ({', '.join(sizes)}); pass a reference at the runs' resolution "
            f"(an image folder reference is cropped and resized)"
        )


def check_run_names(runs: Sequence[str], paired_with: Optional[str] = None) -> None:
    """Refuse a run named twice (it would be scored twice, under one label) and a ``--paired-with``
    that is not one of the runs or has no other run to be compared with."""
    seen: dict[str, str] = {}
    for r in runs:
        key = str(Path(r).expanduser().resolve()) if Path(r).expanduser().exists() else r
        if key in seen:
            raise UsageError(f"{r} is named twice (also as {seen[key]}); name each run once")
        seen[key] = r
    if paired_with is not None and paired_with not in runs:
        raise UsageError(f"--paired-with {paired_with} is not one of the runs; name it among the runs too")
    if paired_with is not None and len(runs) < 2:
        raise UsageError(
            f"--paired-with {paired_with} compares the other runs with it, but it is the only run; "
            f"name the runs to compare with it too"
        )


def check_counts(runs: Sequence[ImageSet], reference: Optional[ImageSet], extractors) -> None:
    """Feature metrics (FID, KID, precision/recall) need at least 2 images in every set and in the
    reference: refuse a smaller one before any feature is extracted. ``extractors``: the names
    asked for (None: the defaults; an empty list computes no feature metric)."""
    if extractors is not None and not len(extractors):
        return
    for s in [*runs, *([reference] if reference is not None else [])]:
        if s.n < 2:
            raise UsageError(
                f"{s.spec} has {s.n} image; FID, KID and precision/recall need at least 2 per set "
                f"(generate more with --num-images)"
            )


def parse_extractors(text: Optional[str]) -> Optional[list[str]]:
    """``--extractors`` -> names (None when not given: :func:`default_extractors` decides);
    UsageError for an unknown name."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in EXTRACTORS]
    if bad:
        raise UsageError(f"unknown extractor {bad[0]!r}; --extractors takes {', '.join(EXTRACTORS)}")
    return names


def read_class_names(path: Optional[str]) -> Optional[list[str]]:
    """``--class-names FILE`` -> its non-empty lines (None when not given); UsageError for an
    unreadable or empty file."""
    if path is None:
        return None
    try:
        names = [ln.strip() for ln in Path(path).expanduser().read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"cannot read --class-names {path} ({type(exc).__name__}); pass a text file, one name a line"
        ) from None
    if not names:
        raise UsageError(f"--class-names {path} is empty; pass one class name per line")
    return names
