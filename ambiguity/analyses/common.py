"""What the analyses share: their command-line options, the token grids they analyse, the table printer.

Nothing here is science; the analyses themselves live in :mod:`.concentration` and
:mod:`.interchangeability`. Options, run directories and seeds are the toolkit's own
(:mod:`ambiguity.cli`, :mod:`ambiguity.runs`, :mod:`ambiguity.seeding`), so image ``i`` of an
analysis is the image ``i`` that ``python -m ambiguity.profile`` generates for the same seed,
condition and sampling settings.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Optional

import torch

from ambiguity.cli import add_condition_args, add_data_arg, add_model_args, add_run_args, add_sampling_args
from ambiguity.conditions import fashion_mnist_subset, generation_conditions, parse_classes
from ambiguity.errors import UsageError
from ambiguity.generation import StepHook, sample_tokens
from ambiguity.memory import check_run_size
from ambiguity.models.base import TokenModel
from ambiguity.sampling import SamplingConfig
from ambiguity.seeding import image_generators

__all__ = ["add_analysis_args", "analysis_inputs", "generate_grids", "batches", "digest", "print_table"]


def add_analysis_args(ap, num_images: int, batch_size: int, out_help: str) -> None:
    """Options every analysis takes: model, conditions, sampling (guidance 1 by default), ``--data``,
    ``--cache-dir`` and the run options."""
    add_model_args(ap, dtype=False)
    add_condition_args(ap, num_images=num_images, batch_size=batch_size)
    add_sampling_args(ap, guidance=1.0)
    add_data_arg(
        ap,
        "teacher-force Fashion-MNIST test images instead of generating: an IDX folder, or "
        "'fashion-mnist' for the default places",
    )
    ap.add_argument("--cache-dir", default=None, metavar="DIR", help="neighbourhood cache folder")
    add_run_args(ap, out_help)


def analysis_inputs(
    model: TokenModel,
    num_images: int,
    seed: int,
    classes: Optional[str | list[int]] = None,
    captions: Optional[str] = None,
    data: Optional[str] = None,
):
    """(conditions, images or None) for an analysis.

    With ``data``: a seeded subset of Fashion-MNIST test images (:func:`ambiguity.conditions.fashion_mnist_subset`)
    and their true labels as conditions; else the conditions of ``num_images`` generated images
    (:func:`ambiguity.conditions.generation_conditions`). Raises UsageError as those.
    """
    if isinstance(classes, str) or classes is None:
        classes = parse_classes(classes)
    check_run_size(model, num_images)
    if data is not None:
        if captions is not None:
            raise UsageError("--data teacher-forces labelled Fashion-MNIST images; drop --captions")
        images, labels = fashion_mnist_subset(
            model, num_images, seed, classes, None if data == "fashion-mnist" else data
        )
        return labels, images
    return generation_conditions(model, num_images, seed, classes, captions), None


def generate_grids(
    model: TokenModel,
    conditions: Sequence,
    sampling: SamplingConfig,
    seed: int,
    first: int,
    on_step: Optional[StepHook] = None,
) -> torch.Tensor:
    """Sample the images ``first .. first + len(conditions) - 1`` (each from its own stream,
    :mod:`ambiguity.seeding`) -> (B, N) int64 code indices."""
    prompt = model.make_prompt(list(conditions), guided=sampling.guided)
    gens = image_generators(seed, range(first, first + len(conditions)), model.device)
    return sample_tokens(model, prompt, sampling, gens, on_step=on_step)


def batches(n: int, batch_size: int) -> Iterator[tuple[int, slice]]:
    """(batch index, slice) pairs covering range(n). Raises UsageError for batch_size < 1."""
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    for b, s in enumerate(range(0, n, batch_size)):
        yield b, slice(s, min(n, s + batch_size))


def digest(values: Sequence) -> str:
    """A short hash of a list of conditions (what a run record stores instead of the list)."""
    return hashlib.sha1(json.dumps([str(v) for v in values]).encode()).hexdigest()[:16]


def print_table(df, columns: Sequence[str], title: str = "") -> None:
    """Print selected columns of a summary DataFrame with 4 significant digits."""
    if title:
        print(title)
    print(df[list(columns)].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
