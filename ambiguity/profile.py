"""Profile the next-token distributions of a visual AR target model: how ambiguous is it?

At every image and token position the profiler records, for the *guided* distribution the
sampler draws from (classifier-free guidance, temperature, top-k, top-p; ``ambiguity.sampling``)
and for the *conditional-only* distribution (conditional rows, same temperature / top-k / top-p,
no guidance): the top-1 probability, the top-10 mass, the entropy (nats), and the probability and
rank of the chosen token (:mod:`ambiguity.stats`). These are the statistics of LANTERN's Sec. 3 /
Fig. 2 (Jang et al., ICLR 2025): visual AR models spread their mass thinly (average top-1
probability ~0.21 for LlamaGen, 0.06 for Anole), which is why plain speculative decoding rejects
most draft tokens.

Sources of token sequences: ``generate`` samples images with
:func:`ambiguity.generation.sample_tokens` (the chosen token is the sampled one); ``dataset``
teacher-forces the VQ tokens of real images (the chosen token is the real one).

Command line (see ``--help`` and README.md)::

    python -m ambiguity.profile                                  # embedded model, 64 images
    python -m ambiguity.profile --model llamagen-t2i-stage1 --captions captions_val2014.json

Python / Jupyter::

    import ambiguity as amb
    df, summary = amb.profile(amb.load_model("embedded"), num_images=64)

Resuming: the output directory is a run directory (:mod:`ambiguity.runs`): every finished
batch is a checked part (``<out>/parts/batch_00000.*``); rerunning the same command reads
finished batches back and gives exactly the tokens an uninterrupted run would (image ``i``
samples from its own stream, :mod:`ambiguity.seeding`). A rerun with *different* settings
into the same directory is refused with a one-line error naming ``--out`` (nothing is
deleted); ``--overwrite`` discards the old results instead.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

_START = time.perf_counter()  # process start-up is part of the reported wall time of a CLI run

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ambiguity import cli
from ambiguity.conditions import (
    fashion_mnist_subset,
    generation_conditions,
    image_files_subset,
    model_conditions,
    parse_classes,
)
from ambiguity.data.captions import read_captions
from ambiguity.distributed import shard_from_args
from ambiguity.errors import UsageError
from ambiguity.generation import sample_tokens
from ambiguity.io import abspath
from ambiguity.memory import check_run_size
from ambiguity.models.base import TokenModel
from ambiguity.models.registry import check_spec_options, get_spec, load_model
from ambiguity.profile_report import OUTPUTS, print_summary, write_outputs
from ambiguity.run_records import versions
from ambiguity.runs import RunDir, RunOptions, assemble_units, read_units, shard_units
from ambiguity.sampling import SamplingConfig, default_guidance, distribution, expand_rows, split_rows
from ambiguity.seeding import image_generators
from ambiguity.stats import STAT_NAMES, token_stats

__all__ = [
    "profile_model",
    "profile_generated",
    "profile_forced",
    "batch_table",
    "summarize_profile",
    "build_parser",
    "check_arguments",
    "resolve_inputs",
    "main",
    "STAT_COLUMNS",
    "COMMAND",
]

DISTRIBUTIONS = ("guided", "cond")
STAT_COLUMNS = tuple(f"{d}_{s}" for d in DISTRIBUTIONS for s in STAT_NAMES)
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
COMMAND = "python -m ambiguity.profile"
MERGE = "ambiguity.profile:merge_run"


def _stats_pair(p_guided: torch.Tensor, p_cond: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    guided = token_stats(p_guided, tokens)
    cond = guided if p_cond is p_guided else token_stats(p_cond, tokens)  # no CFG: one distribution
    return {**{f"guided_{k}": v for k, v in guided.items()}, **{f"cond_{k}": v for k, v in cond.items()}}


@torch.no_grad()
def profile_generated(
    model: TokenModel, conditions: Sequence, sampling: SamplingConfig, generator=None, on_tokens=None
) -> tuple[torch.Tensor, dict]:
    """Sample one image per condition and record both distributions' statistics at every step.

    Args:
        model: the target model; conditions: B labels (c2i) or captions/prompts.
        sampling: guidance scale, temperature, top-k, top-p; generator: one seeded torch.Generator
            per image on ``model.device`` (``ambiguity.seeding.image_generators``), or one for the
            batch, or None (torch's global RNG); on_tokens: called with B after each step.
    Returns (tokens (B, N) int64 code indices, {column: (B, N) tensor}) with the columns of
    :data:`STAT_COLUMNS` (float32 probabilities / nats, int64 ranks), on CPU.
    The conditional-only distribution equals the guided one when ``sampling.guidance == 1``.
    Raises UsageError for conditions the model refuses (``model.make_prompt``).
    Statistics: :mod:`ambiguity.stats` (LANTERN, Sec. 3 / Fig. 2).
    """
    prompt = model.make_prompt(conditions, guided=sampling.guided)
    steps: list[dict[str, torch.Tensor]] = []

    def on_step(t, logits, p, x):
        p_cond = distribution(split_rows(logits, True)[0], sampling, False) if prompt.guided else p
        steps.append(_stats_pair(p, p_cond, x))  # kept on the device: one transfer at the end
        if on_tokens is not None:
            on_tokens(x.shape[0])

    tokens = sample_tokens(model, prompt, sampling, generator, on_step)
    return tokens.cpu(), {k: torch.stack([s[k] for s in steps], 1).cpu() for k in STAT_COLUMNS}


@torch.no_grad()
def profile_forced(
    model: TokenModel, conditions: Sequence, tokens: torch.Tensor, sampling: SamplingConfig, chunk: int = 64
) -> dict:
    """Teacher-force known sequences and record both distributions' statistics at every position.

    Args:
        tokens: (B, N) int64 code indices (e.g. ``model.encode_images(x).flatten(1)``); position
            t is predicted from the condition and ``tokens[:, :t]``, and ``tokens[:, t]`` is the
            chosen token. chunk: positions turned into distributions at once (bounds memory to
            about rows x chunk x V floats).
    Returns {column: (B, N) tensor} as :func:`profile_generated`, on CPU.
    Raises UsageError for conditions the model refuses (``model.make_prompt``).
    """
    prompt = model.make_prompt(conditions, guided=sampling.guided)
    tokens = tokens.to(model.device).long()
    logits = model.teacher_force(prompt, expand_rows(tokens, prompt.guided)).logits
    cond = split_rows(logits, prompt.guided)[0]
    parts = []
    for s in range(0, tokens.shape[1], chunk):
        p = distribution(logits[:, s : s + chunk], sampling, prompt.guided)
        p_cond = distribution(cond[:, s : s + chunk], sampling, False) if prompt.guided else p
        parts.append({k: v.cpu() for k, v in _stats_pair(p, p_cond, tokens[:, s : s + chunk]).items()})
    return {k: torch.cat([q[k] for q in parts], 1) for k in STAT_COLUMNS}


def _condition_names(model: TokenModel, conditions: Sequence) -> tuple[list[int], list[str]]:
    if model.kind == "c2i":
        labels = [int(c) for c in conditions]
        names = model.class_names
        return labels, [names[c] if names and 0 <= c < len(names) else str(c) for c in labels]
    return [-1] * len(conditions), [str(c) for c in conditions]


def batch_table(model: TokenModel, first_image: int, conditions: Sequence, tokens: torch.Tensor, stats: dict):
    """One tidy row per (image, position) -> pandas DataFrame.

    Columns: image (global index, int64), label (class, -1 for captions), condition (class name
    or caption), position, row, col (int32; row-major over ``model.grid``), token (chosen code
    index, int32), then :data:`STAT_COLUMNS` (float32; ``*_chosen_rank`` int32).
    """
    B, N = tokens.shape
    w = model.grid[1]
    labels, names = _condition_names(model, conditions)
    pos = np.tile(np.arange(N, dtype=np.int32), B)
    cols = {
        "image": np.repeat(np.arange(first_image, first_image + B, dtype=np.int64), N),
        "label": np.repeat(np.asarray(labels, dtype=np.int64), N),
        "condition": np.repeat(np.asarray(names, dtype=object), N),
        "position": pos,
        "row": pos // w,
        "col": pos % w,
        "token": tokens.reshape(-1).numpy().astype(np.int32),
    }
    for k in STAT_COLUMNS:
        v = stats[k].reshape(-1).numpy()
        cols[k] = v.astype(np.int32) if k.endswith("rank") else v.astype(np.float32)
    return pd.DataFrame(cols)


def summarize_profile(df) -> dict:
    """Means and quantiles of every statistic column of a per-token table.

    Returns {column: {"mean", "std", "q05", "q25", "median", "q75", "q95"}} (probabilities,
    nats or ranks as the column) plus ``{d}_chosen_is_top1``: {"mean"} = share of positions
    whose chosen token has rank 1.
    """
    out = {}
    for k in STAT_COLUMNS:
        x = df[k].astype("float64")
        q = x.quantile(list(QUANTILES)).tolist()
        out[k] = {
            "mean": float(x.mean()),
            "std": float(x.std(ddof=0)),
            "q05": q[0],
            "q25": q[1],
            "median": q[2],
            "q75": q[3],
            "q95": q[4],
        }
    for d in DISTRIBUTIONS:
        out[f"{d}_chosen_is_top1"] = {"mean": float((df[f"{d}_chosen_rank"] == 1).mean())}
    return out


def _digest(obj) -> str:
    if obj is None:
        return ""
    if hasattr(obj, "fingerprint"):
        return str(obj.fingerprint)
    if torch.is_tensor(obj):
        return hashlib.sha1(obj.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
    return hashlib.sha1(json.dumps(obj, default=str).encode()).hexdigest()


def _profile_conditions(
    model: TokenModel,
    conditions: Optional[Sequence],
    given,
    num_images: Optional[int],
    batch_size: int,
    seed: int,
    guided: bool,
) -> tuple[list, int]:
    """(one condition per image, num_images): ``num_images`` defaults to the number of conditions
    (or of the ``given`` sequences/images), else 64; conditions to ``model.default_conditions``.
    Raises UsageError for non-positive sizes, a run too large for memory
    (:func:`ambiguity.memory.check_run_size`), a model without default conditions or too few."""
    if num_images is None:
        num_images = len(conditions) if conditions is not None else (len(given) if given is not None else 64)
    if num_images < 1:
        raise UsageError(f"--num-images must be >= 1, got {num_images}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    check_run_size(model, num_images, batch_size, guided)
    if conditions is None:
        missing = f"{model.name} has no default conditions; pass conditions=[...] (captions or prompts, one per image)"
        conditions = model_conditions(model, num_images, seed, missing)
    conditions = list(conditions)
    available = min(len(conditions), len(given)) if given is not None else len(conditions)
    if available < num_images:
        raise UsageError(
            f"{num_images} images asked for but only {available} conditions/sequences given; lower --num-images"
        )
    return conditions[:num_images], num_images


def _run_key(model: TokenModel, sampling: SamplingConfig, seed: int, batch_size: int, conditions, tokens, images):
    """What a stored run must match to be resumed: model facts, sampling, seed, sizes, source and
    digests of the conditions and the teacher-forced sequences or images."""
    return {
        "model": model.describe(),
        "sampling": sampling.as_dict(),
        "seed": int(seed),
        "batch_size": int(batch_size),
        "num_images": len(conditions),
        "source": "generate" if tokens is None and images is None else "dataset",
        "conditions": _digest(conditions),
        "sequences": _digest(tokens if images is None else images),
    }


def _token_bar(model: TokenModel, opts: RunOptions, units: list[tuple[str, dict]]):
    """The tqdm bar over the tokens of the images of the batch ``units`` this shard computes."""
    shard = opts.shard
    images = sum(e - s for b, (_, part) in enumerate(units) if shard.owns(b) for s, e in [part["images"]])
    return tqdm(
        total=images * model.num_tokens,
        unit="tok",
        desc=f"profile {model.name}" + (f" ({shard.label})" if shard.count > 1 else ""),
        disable=not opts.progress,
        dynamic_ncols=True,
        leave=False,
    )


def _open_profile_run(opts: RunOptions, key: dict, settings: Optional[dict]) -> Optional[RunDir]:
    """The shared run directory ``opts.out`` opened for ``key`` (None without ``out``). Raises
    UsageError for a sharded run without ``out`` or an ``out`` of other settings."""
    if opts.out is None:
        if opts.shard.count > 1:
            raise UsageError("sharded profiling needs --out: the shards meet in its run directory")
        return None
    run = RunDir(opts.out, {"settings": settings or {}, "key": key}, command=COMMAND, outputs=OUTPUTS, merge=MERGE)
    run.open_shared(opts.shard, opts.overwrite)
    return run


def _profile_batch(model: TokenModel, conditions: Sequence, first: int, sampling, seed: int, tokens, images, bar):
    """The per-token table (:func:`batch_table`) of the images ``first ..``: teacher-forced from
    ``tokens`` or ``images`` when one is given, else generated; ``bar`` counts the tokens."""
    n = len(conditions)
    if tokens is not None or images is not None:
        last = first + n
        seq = tokens[first:last] if tokens is not None else model.encode_images(images[first:last]).reshape(n, -1)
        stats = profile_forced(model, conditions, seq, sampling)
        bar.update(n * model.num_tokens)
        seq = seq.cpu()
    else:
        gens = image_generators(seed, range(first, first + n), model.device)
        seq, stats = profile_generated(model, conditions, sampling, gens, on_tokens=bar.update)
    return batch_table(model, first, conditions, seq, stats)


def profile_model(
    model: TokenModel,
    conditions: Optional[Sequence] = None,
    sampling: Optional[SamplingConfig] = None,
    *,
    num_images: Optional[int] = None,
    batch_size: int = 32,
    seed: int = 0,
    tokens: Optional[torch.Tensor] = None,
    images=None,
    settings: Optional[dict] = None,
    options: Optional[RunOptions] = None,
):
    """Profile ``model``'s next-token distributions; the Python entry point behind the CLI.

    Args:
        model: any :class:`~ambiguity.models.base.TokenModel` (e.g. ``load_model("embedded")``).
        conditions: one label / caption / prompt per image; default
            ``model.default_conditions(num_images, seed)`` (c2i models).
        sampling: :class:`~ambiguity.sampling.SamplingConfig`; default: temperature 1, no top-k/p,
            guidance scale :func:`~ambiguity.sampling.default_guidance` of the model's kind.
        num_images: default ``len(conditions)`` (or of ``tokens``/``images``), else 64.
        batch_size: images per forward pass and per resumable part. seed: image ``i`` samples
            from its own stream seeded by ``(seed, i)`` (:mod:`ambiguity.seeding`), so the tokens
            do not depend on ``batch_size`` in float64; in float32 a batched forward rounds
            differently and an image occasionally diverges from some position on.
        tokens: (num_images, N) int64 code sequences to teacher-force instead of generating, or
        images: (num_images, C, H, W) float in [0, 1] (anything sliceable to such tensors, e.g.
            :class:`ambiguity.conditions.ImageFiles`), encoded per batch with ``model.encode_images``.
        settings: extra facts stored with the run and in the summary (the CLI's options).
        options: :class:`~ambiguity.runs.RunOptions`: ``out`` a run directory
            (:class:`ambiguity.runs.RunDir`) that makes the run resumable, each finished batch a
            part (None keeps everything in memory); ``overwrite`` discards a run of other
            settings in ``out`` instead of refusing; ``progress`` shows a tqdm bar (tokens per
            second); ``shard`` is this process's share (:mod:`ambiguity.distributed`): it
            computes the batches ``b % shard.count == shard.index``, the merging shard then
            reads every batch's part.
    Returns:
        (DataFrame, summary): one row per (image, position), columns as :func:`batch_table`;
        summary dict with the model facts, settings, per-column statistics (:func:`summarize_profile`),
        token count, wall time (seconds) and package versions. (None, None) on a shard that does
        not merge.
    Raises:
        UsageError for bad settings, conditions the model refuses, mismatched lengths, or an
        ``out`` holding results of other settings (unless ``overwrite``).
    """
    t0 = time.perf_counter()
    opts = RunOptions.of(options)
    sampling = sampling or SamplingConfig(guidance=default_guidance(model.kind))
    given = tokens if tokens is not None else images
    conditions, num_images = _profile_conditions(
        model, conditions, given, num_images, batch_size, seed, sampling.guided
    )
    key = _run_key(model, sampling, seed, batch_size, conditions, tokens, images)
    run = _open_profile_run(opts, key, settings)
    nb = math.ceil(num_images / batch_size)
    units = [_batch_part(b, batch_size, num_images) for b in range(nb)]
    frames, resumed = [], 0
    bar = _token_bar(model, opts, units)
    try:
        for b, part in shard_units(run, units, opts.shard):
            s, e = b * batch_size, min((b + 1) * batch_size, num_images)
            if part is not None:
                frames.append(part.tables["tokens"])
                resumed += 1
                bar.update((e - s) * model.num_tokens)
                continue
            df = _profile_batch(model, conditions[s:e], s, sampling, seed, tokens, images, bar)
            if run is not None:
                run.write_part(*units[b], tables={"tokens": df})
            frames.append(df)
    finally:
        bar.close()
    frames = assemble_units(run, units, opts.shard, frames, lambda part: part.tables["tokens"])
    if frames is None:
        return None, None  # rank 0 (torchrun) or `python -m ambiguity merge` writes the outputs
    table = pd.concat(frames, ignore_index=True)
    summary = _summary(key, settings or {}, table, nb, resumed, time.perf_counter() - t0)
    return table, summary


def _batch_part(b: int, batch_size: int, num_images: int) -> tuple[str, dict]:
    """Name and content of the part of batch ``b``."""
    return f"batch_{b:05d}", {"images": [b * batch_size, min((b + 1) * batch_size, num_images)]}


def _read_batches(run: RunDir, nb: int, batch_size: int, num_images: int) -> list:
    """Every batch's table from the run's parts (UsageError naming a missing or foreign one)."""
    return read_units(run, [_batch_part(b, batch_size, num_images) for b in range(nb)], lambda p: p.tables["tokens"])


def _summary(key: dict, settings: dict, table, nb: int, resumed: int, seconds: float) -> dict:
    """The run's summary from its derived key (model facts, sampling, seed, sizes) and table."""
    return {
        "model": key["model"],
        "source": key["source"],
        "sampling": key["sampling"],
        "seed": key["seed"],
        "batch_size": key["batch_size"],
        "images": key["num_images"],
        "tokens": int(len(table)),
        "tokens_per_image": int(len(table)) // max(1, key["num_images"]),
        "grid": key["model"]["grid"],
        "settings": settings,
        "stats": summarize_profile(table),
        "batches": {"total": nb, "resumed": resumed, "computed": nb - resumed},
        "wall_time_s": round(seconds, 3),
        "versions": versions(),
    }


def merge_run(path: str | Path, figures: bool = True) -> tuple[list[Path], list[str]]:
    """``python -m ambiguity merge RUN`` for a profile run: the table, summary and figures from the
    shards' parts (the model is loaded only to draw the images figure). Returns (written files,
    notes). Raises UsageError when a part is missing, damaged or foreign."""
    t0 = time.perf_counter()
    record = RunDir(path, {}, command=COMMAND).stored()
    if record is None:
        raise UsageError(f"{path} holds no run.json: not a run directory")
    try:
        run = RunDir(path, record["settings"], command=COMMAND, outputs=OUTPUTS, merge=MERGE)
        key, settings = record["settings"]["key"], record["settings"]["settings"]
        nb = math.ceil(int(key["num_images"]) / int(key["batch_size"]))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        raise UsageError(
            f"{path}/run.json lacks the settings of a profile run; it is damaged, rerun the shards into a fresh --out"
        ) from None
    table = pd.concat(_read_batches(run, nb, key["batch_size"], key["num_images"]), ignore_index=True)
    summary = _summary(key, settings, table, nb, nb, time.perf_counter() - t0)
    model = None
    if figures and settings.get("model"):
        model = load_model(
            settings["model"], weights=settings.get("weights"), device="cpu", image_size=settings.get("image_size")
        )
    files, notes = write_outputs(model, table, summary, run.path, figures=model is not None, started=t0)
    print_summary(summary, run.path, files, notes)
    return files, notes


# --------------------------------------------------------------------------- command line
def build_parser() -> cli.ArgumentParser:
    """The ``python -m ambiguity.profile`` argument parser (one-line errors, exit code 2)."""
    p = cli.ArgumentParser(
        prog=COMMAND,
        description="How ambiguous are a visual AR model's next-token distributions? Records top-1 "
        "probability, top-10 mass, entropy and the chosen token's probability and rank "
        "at every token, guided and conditional-only.",
    )
    cli.add_model_args(p, image_size=True)
    cli.add_condition_args(p, num_images=64, batch_size=32)
    p.add_argument(
        "--source",
        choices=("generate", "dataset"),
        default="generate",
        help="generate: sample images; dataset: teacher-force real images (default: generate)",
    )
    cli.add_data_arg(p, "Fashion-MNIST directory for --source dataset on the embedded model")
    p.add_argument(
        "--images", default=None, metavar="DIR", help="folder of image files for --source dataset on other models"
    )
    cli.add_sampling_args(p)
    cli.add_run_args(
        p,
        "output directory (default: runs/profile/<model>, runs/profile/<model>-dataset for --source dataset)",
    )
    p.add_argument("--no-figures", action="store_true", help="write only the table and summary")
    cli.add_shard_args(p)
    return p


@cli.cli_main
def main(argv: Optional[list[str]] = None) -> int:
    """CLI entry point (see README.md, "Profile"). Returns the exit code: 0, or 2 with one line
    on stderr for any UsageError (via :func:`ambiguity.cli.cli_main`)."""
    t0 = _START if __name__ == "__main__" else time.perf_counter()
    args = build_parser().parse_args(argv)
    out, settings = check_arguments(args)  # nothing is loaded or written before the options are valid
    device, _ = cli.device_from_args(args)
    shard = shard_from_args(args, device)
    model = load_model(
        args.model,
        weights=args.weights,
        device=shard.device(device),
        dtype=settings["dtype"],
        image_size=args.image_size,
    )
    sampling = cli.sampling_from_args(args, model.kind)
    check_run_size(model, args.num_images, args.batch_size, sampling.guided)  # before any per-image list is built
    conditions, tokens, images = resolve_inputs(args, model, settings["classes"])
    model.make_prompt(conditions[:1], guided=sampling.guided)  # e.g. a missing caption encoder fails before any output
    table, summary = profile_model(
        model,
        conditions,
        sampling,
        num_images=args.num_images,
        batch_size=args.batch_size,
        seed=args.seed,
        tokens=tokens,
        images=images,
        settings=settings,
        options=RunOptions.from_args(args, shard, out),
    )
    if table is None:
        print(
            f"{shard.label} done: its batches are parts of {out}"
            + ("" if shard.group else f"; after every shard, run python -m ambiguity merge {out}")
        )
        return 0
    files, notes = write_outputs(model, table, summary, out, figures=not args.no_figures, started=t0)
    print_summary(summary, out, files, notes)
    return 0


def check_arguments(args) -> tuple[Path, dict]:
    """Validate the parsed options without loading a model or writing a file.

    Returns (output directory, settings dict: every option with resolved paths, device type and
    dtype; stored in the run record and in summary.json). Raises UsageError for out-of-range
    settings, an unreadable captions file, an unknown model, an unwritable ``--out``, or an
    ``--out`` holding results of other settings (unless ``--overwrite``).
    """
    sampling = cli.sampling_from_args(args, get_spec(args.model).kind)  # `--cfg 4` = the c2i default
    classes = parse_classes(args.classes)
    if args.captions is not None:
        read_captions(args.captions)
    check_spec_options(args.model, args.weights, classes=classes, captions=args.captions)  # before any weights
    if args.source == "generate" and (args.images or args.data):
        raise UsageError("--images and --data are for --source dataset; add --source dataset or drop them")
    device, dtype = cli.device_from_args(args)
    out = (
        Path(args.out)
        if args.out is not None
        else cli.default_out("profile", args.model + ("-dataset" if args.source == "dataset" else ""))
    )
    cli.check_out_dir(out)
    settings = {
        "model": args.model,
        "weights": abspath(args.weights),
        **({"image_size": args.image_size} if args.image_size else {}),  # a declared LlamaGen grid
        "device": device.type,
        "dtype": str(dtype).replace("torch.", ""),
        "num_images": args.num_images,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "source": args.source,
        "classes": classes,
        "captions": abspath(args.captions),
        "data": abspath(args.data),
        "images": abspath(args.images),
        "guidance": sampling.guidance,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
    }
    if not args.overwrite:
        RunDir(out, {"settings": settings}, command=COMMAND).check(only=("settings",))
    return out, settings


def resolve_inputs(args, model: TokenModel, classes: Optional[list[int]]):
    """What to condition on and teacher-force, from the options -> (conditions, tokens, images).

    ``generate``: conditions only (tokens = images = None). ``dataset``: ``--images`` files, the
    model's own held-out sequences (``model.dataset_sequences``, e.g. the text twin), or
    Fashion-MNIST test images for the embedded model. Raises UsageError when the options do not
    fit the model (see :mod:`ambiguity.conditions`).
    """
    n, seed = args.num_images, args.seed
    if args.source == "generate":
        return generation_conditions(model, n, seed, classes, args.captions), None, None
    if args.images:
        images, conditions = image_files_subset(model, args.images, n, seed, classes, args.captions)
        return conditions, None, images
    if hasattr(model, "dataset_sequences"):
        tokens, conditions = model.dataset_sequences(n, seed)
        return conditions, tokens, None
    if model.kind == "c2i" and (args.data or model.name.startswith("embedded")):
        if args.captions:
            raise UsageError(
                f"{model.name} is class-conditional; drop --captions (the Fashion-MNIST labels are the conditions)"
            )
        images, conditions = fashion_mnist_subset(model, n, seed, classes, args.data)
        return conditions, None, images
    raise UsageError(f"--source dataset for {model.name} needs --images DIR (image files to teacher-force)")


if __name__ == "__main__":
    raise SystemExit(main())
