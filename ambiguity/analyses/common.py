"""What the analyses share: their command-line options and set-up, their run directory, the token grids
they analyse, the tables they write and print.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ambiguity import cli
from ambiguity.conditions import fashion_mnist_subset, generation_conditions, parse_classes
from ambiguity.errors import UsageError
from ambiguity.generation import StepHook, sample_tokens
from ambiguity.io import write_table
from ambiguity.memory import check_run_size
from ambiguity.models.base import TokenModel
from ambiguity.models.registry import check_spec_options, load_model
from ambiguity.runs import RunDir, RunOptions
from ambiguity.sampling import SamplingConfig
from ambiguity.seeding import image_generators

__all__ = [
    "analysis_parser",
    "add_analysis_args",
    "analysis_inputs",
    "AnalysisSetup",
    "load_analysis",
    "open_analysis_run",
    "run_arguments",
    "generate_grids",
    "batches",
    "digest",
    "print_table",
    "write_results",
]


def add_analysis_args(ap, num_images: int, batch_size: int, out_help: str) -> None:
    """Options every analysis takes: model, conditions, sampling (guidance 1 by default), ``--data``,
    ``--cache-dir`` and the run options."""
    cli.add_model_args(ap, dtype=False)
    cli.add_condition_args(ap, num_images=num_images, batch_size=batch_size)
    cli.add_sampling_args(ap, guidance=1.0)
    cli.add_data_arg(
        ap,
        "teacher-force Fashion-MNIST test images instead of generating: an IDX folder, or "
        "'fashion-mnist' for the default places",
    )
    ap.add_argument("--cache-dir", default=None, metavar="DIR", help="neighbourhood cache folder")
    cli.add_run_args(ap, out_help)


def analysis_parser(name: str, description: str, num_images: int, batch_size: int) -> cli.ArgumentParser:
    """The parser of ``python -m ambiguity.analyses.<name>`` with :func:`add_analysis_args` (``--out``
    default ``runs/<name>/<model>``); the analysis adds its own options."""
    ap = cli.ArgumentParser(prog=f"python -m ambiguity.analyses.{name}", description=description)
    add_analysis_args(
        ap, num_images=num_images, batch_size=batch_size, out_help=f"output folder (default: runs/{name}/<model>)"
    )
    return ap


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


@dataclass(frozen=True)
class AnalysisSetup:
    """What an analysis CLI works on: its output folder, the loaded model, the sampling settings,
    one condition per image and the real images to teacher-force (None: generate)."""

    out: Path
    model: TokenModel
    sampling: SamplingConfig
    conditions: list
    images: Optional[torch.Tensor]


def load_analysis(args, name: str) -> AnalysisSetup:
    """The options of :func:`add_analysis_args` -> :class:`AnalysisSetup` (``--out`` default
    ``runs/<name>/<model>``). Checks the folders and the model's options before loading any weights.
    Raises UsageError for an unwritable folder, options the model refuses or bad inputs."""
    out = cli.check_out_dir(args.out or cli.default_out(name, args.model))
    if args.cache_dir is not None:
        cli.check_out_dir(args.cache_dir, "--cache-dir")
    check_spec_options(args.model, args.weights, classes=parse_classes(args.classes), captions=args.captions)
    model = load_model(args.model, weights=args.weights, device=args.device)
    sampling = cli.sampling_from_args(args, "c2i")
    conds, images = analysis_inputs(model, args.num_images, args.seed, args.classes, args.captions, args.data)
    return AnalysisSetup(out, model, sampling, conds, images)


def run_arguments(args, setup: AnalysisSetup) -> dict:
    """The keyword arguments every analysis driver takes, from the options and the loaded setup:
    num_images, batch_size, sampling, seed, conditions, images, cache_dir and the run options."""
    return {
        "num_images": args.num_images,
        "batch_size": args.batch_size,
        "sampling": setup.sampling,
        "seed": args.seed,
        "conditions": setup.conditions,
        "images": setup.images,
        "cache_dir": args.cache_dir,
        "options": RunOptions.from_args(args, out=setup.out),
    }


def open_analysis_run(options: RunOptions, settings: dict, command: str, outputs: Sequence[str]) -> Optional[RunDir]:
    """The run directory ``options.out`` opened for ``settings`` (its parts resume a rerun), or None
    without ``out``. Raises UsageError for a sharded ``options`` (an analysis runs in one process)
    or a folder holding another run (unless ``options.overwrite``)."""
    if options.shard.count > 1:
        raise UsageError("the analyses run in one process; drop --shard-index/--num-shards")
    if options.out is None:
        return None
    run = RunDir(options.out, settings, command=command, outputs=outputs)
    run.open(options.overwrite)
    return run


def write_results(summary, rows, out: Path, name: str, rows_name: str, columns: dict) -> list[Path]:
    """Insert ``columns`` (name -> value) first in ``summary`` and write it to ``out/<name>.parquet``
    and the per-row table to ``out/<name>_<rows_name>.parquet``; returns the two paths."""
    for i, (column, value) in enumerate(columns.items()):
        summary.insert(i, column, value)
    paths = [out / f"{name}.parquet", out / f"{name}_{rows_name}.parquet"]
    write_table(summary, paths[0])
    write_table(rows, paths[1])
    return paths


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


def print_table(df, columns: Sequence[str], title: str = "", files: Sequence[Path] = ()) -> None:
    """Print selected columns of a summary DataFrame with 4 significant digits, then the ``files``
    written (when any)."""
    if title:
        print(title)
    print(df[list(columns)].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if files:
        print(f"wrote {', '.join(str(f) for f in files)}")
