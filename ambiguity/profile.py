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

    from ambiguity.models.registry import load_model
    from ambiguity.profile import profile
    df, summary = profile(load_model("embedded"), num_images=64)

Resuming: with an output directory every finished batch is saved atomically as a shard
(``<out>/shards/batch_00000.parquet``); rerunning the same command skips finished batches and
gives exactly the tokens an uninterrupted run would (batch ``b`` samples with its own seed).
A rerun with *different* settings into the same directory is refused with a one-line error
naming ``--out`` (nothing is deleted); ``--overwrite`` discards the old results instead.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Optional, Sequence

_START = time.perf_counter()  # process start-up is part of the reported wall time of a CLI run
if __name__ == "__main__":
    # Decoding runs thousands of tiny ops; with OpenMP's default busy-waiting, two threads on
    # CPU cores shared with other jobs ran 10x slower than one. Passive waiting keeps the speed
    # of an idle machine. Only for the command line, and only before torch starts OpenMP.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from ambiguity.errors import UsageError, cli_main
from ambiguity.io import abspath, settings_difference
from ambiguity.generation import cfg_rows, make_generator, sample_tokens
from ambiguity.models.base import TokenModel
from ambiguity.sampling import SamplingConfig, distribution, split_cfg
from ambiguity.stats import STAT_NAMES, token_stats

__all__ = ["profile", "profile_generated", "profile_forced", "batch_table", "summarize", "default_cfg",
           "batch_seed", "build_parser", "check_arguments", "resolve_inputs", "main", "STAT_COLUMNS", "TABLE_FILE",
           "SUMMARY_FILE", "SHARD_DIR", "RUN_FILE"]

DISTRIBUTIONS = ("guided", "cond")
STAT_COLUMNS = tuple(f"{d}_{s}" for d in DISTRIBUTIONS for s in STAT_NAMES)
TABLE_FILE, SUMMARY_FILE, SHARD_DIR, RUN_FILE = "tokens.parquet", "summary.json", "shards", "run.json"
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
FIGURES = ("top1_distribution", "top1_by_position", "images")
FINAL_FILES = (TABLE_FILE, SUMMARY_FILE, "samples.txt") + tuple(f"{f}.{x}" for f in FIGURES for x in ("png", "pdf"))


def default_cfg(kind: str) -> float:
    """The guidance scale used when ``--cfg`` is not given: LlamaGen's sampler defaults.

    4.0 for class-conditional (``sample_c2i.py``), 7.5 for text-to-image (``sample_t2i.py``),
    1.0 (no guidance) for text models.
    """
    return {"c2i": 4.0, "t2i": 7.5}.get(kind, 1.0)


def batch_seed(seed: int, batch: int) -> int:
    """Seed of the sampling generator of batch ``batch``: ``seed * 1_000_003 + batch``.

    Each batch has its own generator, so resumed and uninterrupted runs draw the same tokens.
    """
    return int(seed) * 1_000_003 + int(batch)


def _stats_pair(p_guided: torch.Tensor, p_cond: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    guided = token_stats(p_guided, tokens)
    cond = guided if p_cond is p_guided else token_stats(p_cond, tokens)  # no CFG: one distribution
    return {**{f"guided_{k}": v for k, v in guided.items()}, **{f"cond_{k}": v for k, v in cond.items()}}


@torch.no_grad()
def profile_generated(model: TokenModel, conditions: Sequence, sampling: SamplingConfig,
                      generator: Optional[torch.Generator] = None, on_tokens=None) -> tuple[torch.Tensor, dict]:
    """Sample one image per condition and record both distributions' statistics at every step.

    Args:
        model: the target model; conditions: B labels (c2i) or captions/prompts.
        sampling: CFG scale, temperature, top-k, top-p; generator: seeded torch.Generator on
            ``model.device`` (None: torch's global RNG); on_tokens: called with B after each step.
    Returns (tokens (B, N) int64 code indices, {column: (B, N) tensor}) with the columns of
    :data:`STAT_COLUMNS` (float32 probabilities / nats, int64 ranks), on CPU.
    The conditional-only distribution equals the guided one when ``sampling.cfg == 1``.
    Raises UsageError for conditions the model refuses (``model.make_prompt``).
    Statistics: :mod:`ambiguity.stats` (LANTERN, Sec. 3 / Fig. 2).
    """
    prompt = model.make_prompt(conditions, cfg=sampling.use_cfg)
    steps: list[dict[str, torch.Tensor]] = []

    def on_step(t, logits, p, x):
        p_cond = distribution(split_cfg(logits, True)[0], sampling, False) if prompt.cfg else p
        steps.append(_stats_pair(p, p_cond, x))  # kept on the device: one transfer at the end
        if on_tokens is not None:
            on_tokens(x.shape[0])

    tokens = sample_tokens(model, prompt, sampling, generator, on_step)
    return tokens.cpu(), {k: torch.stack([s[k] for s in steps], 1).cpu() for k in STAT_COLUMNS}


@torch.no_grad()
def profile_forced(model: TokenModel, conditions: Sequence, tokens: torch.Tensor, sampling: SamplingConfig,
                   chunk: int = 64) -> dict:
    """Teacher-force known sequences and record both distributions' statistics at every position.

    Args:
        tokens: (B, N) int64 code indices (e.g. ``model.encode_images(x).flatten(1)``); position
            t is predicted from the condition and ``tokens[:, :t]``, and ``tokens[:, t]`` is the
            chosen token. chunk: positions turned into distributions at once (bounds memory to
            about rows x chunk x V floats).
    Returns {column: (B, N) tensor} as :func:`profile_generated`, on CPU.
    Raises UsageError for conditions the model refuses (``model.make_prompt``).
    """
    prompt = model.make_prompt(conditions, cfg=sampling.use_cfg)
    tokens = tokens.to(model.device).long()
    logits = model.teacher_force(prompt, cfg_rows(tokens, prompt.cfg)).logits
    cond = split_cfg(logits, prompt.cfg)[0]
    parts = []
    for s in range(0, tokens.shape[1], chunk):
        p = distribution(logits[:, s:s + chunk], sampling, prompt.cfg)
        p_cond = distribution(cond[:, s:s + chunk], sampling, False) if prompt.cfg else p
        parts.append({k: v.cpu() for k, v in _stats_pair(p, p_cond, tokens[:, s:s + chunk]).items()})
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
    import numpy as np
    import pandas as pd

    B, N = tokens.shape
    w = model.grid[1]
    labels, names = _condition_names(model, conditions)
    pos = np.tile(np.arange(N, dtype=np.int32), B)
    cols = {"image": np.repeat(np.arange(first_image, first_image + B, dtype=np.int64), N),
            "label": np.repeat(np.asarray(labels, dtype=np.int64), N),
            "condition": np.repeat(np.asarray(names, dtype=object), N),
            "position": pos, "row": pos // w, "col": pos % w,
            "token": tokens.reshape(-1).numpy().astype(np.int32)}
    for k in STAT_COLUMNS:
        v = stats[k].reshape(-1).numpy()
        cols[k] = v.astype(np.int32) if k.endswith("rank") else v.astype(np.float32)
    return pd.DataFrame(cols)


def summarize(df) -> dict:
    """Means and quantiles of every statistic column of a per-token table.

    Returns {column: {"mean", "std", "q05", "q25", "median", "q75", "q95"}} (probabilities,
    nats or ranks as the column) plus ``{d}_chosen_is_top1``: {"mean"} = share of positions
    whose chosen token has rank 1.
    """
    out = {}
    for k in STAT_COLUMNS:
        x = df[k].astype("float64")
        q = x.quantile(list(QUANTILES)).tolist()
        out[k] = {"mean": float(x.mean()), "std": float(x.std(ddof=0)), "q05": q[0], "q25": q[1], "median": q[2],
                  "q75": q[3], "q95": q[4]}
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


def _check_run_dir(shards: Path, record: dict, overwrite: bool, out_name: str) -> None:
    """Refuse to mix results of other settings into ``shards``; remember this run's settings."""
    from ambiguity.io import write_json

    run_file = shards / RUN_FILE
    if overwrite:
        old = list(shards.glob("batch_*.parquet")) + [run_file] if shards.is_dir() else []
        old += [shards.parent / f for f in FINAL_FILES]
        for f in old:
            f.unlink(missing_ok=True)
    if run_file.is_file():
        try:
            old = json.loads(run_file.read_text())
        except (OSError, json.JSONDecodeError):
            old = None
        if old != json.loads(json.dumps(record, default=str)):
            raise UsageError(f"{out_name} holds results of a run with other settings "
                             f"({settings_difference(old, record)}); pass another --out or add --overwrite")
        return
    if shards.is_dir() and any(shards.glob("batch_*.parquet")):
        raise UsageError(f"{out_name} holds shards without their {RUN_FILE}, so their settings are unknown; "
                         f"pass another --out or add --overwrite")
    shards.mkdir(parents=True, exist_ok=True)
    write_json(record, run_file)


def profile(model: TokenModel, conditions: Optional[Sequence] = None, sampling: Optional[SamplingConfig] = None, *,
            num_images: Optional[int] = None, batch_size: int = 32, seed: int = 0,
            tokens: Optional[torch.Tensor] = None, images=None, out: Optional[str | Path] = None,
            overwrite: bool = False, settings: Optional[dict] = None, progress: bool = True):
    """Profile ``model``'s next-token distributions; the Python entry point behind the CLI.

    Args:
        model: any :class:`~ambiguity.models.base.TokenModel` (e.g. ``load_model("embedded")``).
        conditions: one label / caption / prompt per image; default
            ``model.default_conditions(num_images, seed)`` (c2i models).
        sampling: :class:`~ambiguity.sampling.SamplingConfig`; default: temperature 1, no top-k/p,
            guidance scale :func:`default_cfg` of the model's kind.
        num_images: default ``len(conditions)`` (or of ``tokens``/``images``), else 64.
        batch_size: images per batch (one shard each). seed: sampling seed (see :func:`batch_seed`).
        tokens: (num_images, N) int64 code sequences to teacher-force instead of generating, or
        images: (num_images, C, H, W) float in [0, 1] (anything sliceable to such tensors, e.g.
            :class:`ambiguity.profile_inputs.ImageFiles`), encoded per batch with ``model.encode_images``.
        out: directory for resumable shards (``out/shards``); None keeps everything in memory.
        overwrite: discard shards of a run with other settings instead of refusing.
        settings: extra facts stored with the shards and in the summary (the CLI's options).
        progress: show a tqdm bar (tokens per second).
    Returns:
        (DataFrame, summary): one row per (image, position), columns as :func:`batch_table`;
        summary dict with the model facts, settings, per-column statistics (:func:`summarize`),
        token count, wall time (seconds) and package versions.
    Raises:
        UsageError for bad settings, conditions the model refuses, mismatched lengths, or an
        ``out`` holding results of other settings (unless ``overwrite``).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from ambiguity.io import read_table, write_table
    from ambiguity.profile_report import versions

    t0 = time.perf_counter()
    sampling = sampling or SamplingConfig(cfg=default_cfg(model.kind))
    forced = tokens is not None or images is not None
    given = tokens if tokens is not None else images
    if num_images is None:
        num_images = len(conditions) if conditions is not None else (len(given) if forced else 64)
    if num_images < 1:
        raise UsageError(f"--num-images must be >= 1, got {num_images}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    if conditions is None:
        try:
            conditions = model.default_conditions(num_images, seed)
        except NotImplementedError:
            raise UsageError(f"{model.name} has no default conditions; pass conditions=[...] "
                             f"(captions or prompts, one per image)") from None
    conditions = list(conditions)
    available = min(len(conditions), len(given)) if forced else len(conditions)
    if available < num_images:
        raise UsageError(f"{num_images} images asked for but only {available} conditions/sequences given; "
                         f"lower --num-images")
    conditions = conditions[:num_images]
    source = "dataset" if forced else "generate"
    N = model.num_tokens
    key = {"model": model.describe(), "sampling": sampling.as_dict(), "seed": int(seed), "batch_size": int(batch_size),
           "num_images": int(num_images), "source": source, "conditions": _digest(conditions),
           "sequences": _digest(given if images is None else images)}
    record = {"run": key, "settings": settings or {}}
    shards = Path(out).expanduser() / SHARD_DIR if out is not None else None
    if shards is not None:
        _check_run_dir(shards, record, overwrite, f"--out {Path(out)}")

    nb = math.ceil(num_images / batch_size)
    frames, resumed = [], 0
    bar = tqdm(total=num_images * N, unit="tok", desc=f"profile {model.name}", disable=not progress,
               dynamic_ncols=True, leave=False)
    try:
        for b in range(nb):
            s, e = b * batch_size, min((b + 1) * batch_size, num_images)
            shard = shards / f"batch_{b:05d}.parquet" if shards is not None else None
            if shard is not None and shard.is_file():
                try:
                    df = read_table(shard)
                except Exception:  # a foreign or damaged file: recompute it
                    df = None
                if df is not None and len(df) == (e - s) * N:
                    frames.append(df)
                    resumed += 1
                    bar.update((e - s) * N)
                    continue
            cond = conditions[s:e]
            if forced:
                seq = tokens[s:e] if tokens is not None else model.encode_images(images[s:e]).reshape(e - s, -1)
                stats = profile_forced(model, cond, seq, sampling)
                bar.update((e - s) * N)
                seq = seq.cpu()
            else:
                gen = make_generator(batch_seed(seed, b), model.device)
                seq, stats = profile_generated(model, cond, sampling, gen, on_tokens=bar.update)
            df = batch_table(model, s, cond, seq, stats)
            if shard is not None:
                write_table(df, shard)
            frames.append(df)
    finally:
        bar.close()
    table = pd.concat(frames, ignore_index=True)
    summary = {"model": model.describe(), "source": source, "sampling": sampling.as_dict(), "seed": int(seed),
               "batch_size": int(batch_size), "images": int(num_images), "tokens": int(len(table)),
               "tokens_per_image": N, "grid": list(model.grid), "settings": settings or {},
               "stats": summarize(table), "batches": {"total": nb, "resumed": resumed, "computed": nb - resumed},
               "wall_time_s": round(time.perf_counter() - t0, 3), "versions": versions()}
    return table, summary


# --------------------------------------------------------------------------- command line
def build_parser():
    """The ``python -m ambiguity.profile`` argument parser (one-line errors, exit code 2)."""
    from ambiguity.errors import ArgumentParser

    p = ArgumentParser(prog="python -m ambiguity.profile",
                       description="How ambiguous are a visual AR model's next-token distributions? Records top-1 "
                                   "probability, top-10 mass, entropy and the chosen token's probability and rank "
                                   "at every token, guided and conditional-only.")
    p.add_argument("--model", default="embedded", metavar="NAME", help="registry name (default: embedded)")
    p.add_argument("--weights", default=None, metavar="PATH", help="checkpoint file or directory (default: shipped / HF cache)")
    p.add_argument("--device", default="auto", metavar="DEVICE", help="auto | cpu | cuda (default: auto)")
    p.add_argument("--dtype", default=None, metavar="DTYPE", help="auto | float32 | bfloat16 | float16 (default: fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default: runs/profile/<model>)")
    p.add_argument("--num-images", type=int, default=64, metavar="N", help="images to profile (default: 64)")
    p.add_argument("--batch-size", type=int, default=32, metavar="B", help="images per batch and shard (default: 32)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="sampling and subset seed (default: 0)")
    p.add_argument("--source", choices=("generate", "dataset"), default="generate",
                   help="generate: sample images; dataset: teacher-force real images (default: generate)")
    p.add_argument("--classes", default=None, metavar="LIST", help="class labels for c2i models, e.g. 0,3,7 (cycled)")
    p.add_argument("--captions", default=None, metavar="FILE", help="captions for t2i models: text file (one per line) or COCO captions_*.json")
    p.add_argument("--data", default=None, metavar="DIR", help="Fashion-MNIST directory for --source dataset on the embedded model")
    p.add_argument("--images", default=None, metavar="DIR", help="folder of image files for --source dataset on other models")
    p.add_argument("--cfg", type=float, default=None, metavar="S",
                   help="classifier-free guidance scale, 1 = none (default: 4.0 c2i, 7.5 t2i, 1.0 text)")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T", help="sampling temperature, 0 = greedy (default: 1.0)")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="keep the k most likely tokens, 0 = all (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass in (0, 1], 1 = all (default: 1.0)")
    p.add_argument("--overwrite", action="store_true", help="discard results of other settings in --out")
    p.add_argument("--no-figures", action="store_true", help="write only the table and summary")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    """CLI entry point (see README.md, "Profile"). Returns the exit code: 0, or 2 with one line
    on stderr for any UsageError (via :func:`ambiguity.errors.cli_main`)."""
    from ambiguity.io import ensure_writable_dir
    from ambiguity.models.registry import load_model
    from ambiguity.profile_report import print_summary, write_outputs

    t0 = _START if __name__ == "__main__" else time.perf_counter()
    args = build_parser().parse_args(argv)
    out, settings = check_arguments(args)  # nothing is loaded or written before the options are valid
    model = load_model(args.model, weights=args.weights, device=settings["device"], dtype=settings["dtype"])
    sampling = SamplingConfig(cfg=settings["cfg"], temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    conditions, tokens, images = resolve_inputs(args, model, settings["classes"])
    model.make_prompt(conditions[:1], cfg=sampling.use_cfg)  # e.g. a missing caption encoder fails before any output
    ensure_writable_dir(out)
    table, summary = profile(model, conditions, sampling, num_images=args.num_images, batch_size=args.batch_size,
                             seed=args.seed, tokens=tokens, images=images, out=out, overwrite=args.overwrite,
                             settings=settings, progress=not args.no_progress)
    files, notes = write_outputs(model, table, summary, out, figures=not args.no_figures, started=t0)
    print_summary(summary, out, files, notes)
    return 0


def check_arguments(args) -> tuple[Path, dict]:
    """Validate the parsed options without loading a model or writing a file.

    Returns (output directory, settings dict: every option with resolved paths, device and
    dtype; stored with the shards and in summary.json). Raises UsageError for out-of-range
    settings, an unreadable captions file, an unknown model, an unwritable ``--out``, or an
    ``--out`` holding results of other settings (unless ``--overwrite``).
    """
    from ambiguity.data.captions import read_captions
    from ambiguity.models.base import resolve_device
    from ambiguity.models.registry import get_spec, resolve_dtype
    from ambiguity.profile_inputs import parse_classes
    from ambiguity.profile_report import check_out_dir

    cfg = default_cfg(get_spec(args.model).kind) if args.cfg is None else args.cfg  # `--cfg 4` = the c2i default
    SamplingConfig(cfg=cfg, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.num_images < 1:
        raise UsageError(f"--num-images must be >= 1, got {args.num_images}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    classes = parse_classes(args.classes)
    if args.captions is not None:
        read_captions(args.captions)
    if args.source == "generate" and (args.images or args.data):
        raise UsageError("--images and --data are for --source dataset; add --source dataset or drop them")
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    out = Path(args.out) if args.out is not None else Path("runs", "profile", re.sub(r"[^\w.-]", "_", args.model))
    check_out_dir(out)
    settings = {"model": args.model, "weights": abspath(args.weights), "device": str(device),
                "dtype": str(dtype).replace("torch.", ""), "num_images": args.num_images,
                "batch_size": args.batch_size, "seed": args.seed, "source": args.source, "classes": classes,
                "captions": abspath(args.captions), "data": abspath(args.data), "images": abspath(args.images),
                "cfg": cfg, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    if not args.overwrite:
        _check_settings_only(out, settings)
    return out, settings


def resolve_inputs(args, model: TokenModel, classes: Optional[list[int]]):
    """What to condition on and teacher-force, from the options -> (conditions, tokens, images).

    ``generate``: conditions only (tokens = images = None). ``dataset``: ``--images`` files, the
    model's own held-out sequences (``model.dataset_sequences``, e.g. the text twin), or
    Fashion-MNIST test images for the embedded model. Raises UsageError when the options do not
    fit the model (see :mod:`ambiguity.profile_inputs`).
    """
    from ambiguity.profile_inputs import fashion_mnist_subset, generation_conditions, image_files_subset

    n, seed = args.num_images, args.seed
    if args.source == "generate":
        return generation_conditions(model, n, seed, classes, args.captions), None, None
    if args.images:
        images, conditions = image_files_subset(model, args.images, n, seed, classes, args.captions)
        return conditions, None, images
    if hasattr(model, "dataset_sequences"):
        tokens, conditions = model.dataset_sequences(n, seed)
        return conditions, tokens, None
    if model.kind == "c2i" and (args.data or model.name == "embedded"):
        if args.captions:
            raise UsageError(f"{model.name} is class-conditional; drop --captions (the Fashion-MNIST labels are the "
                             f"conditions)")
        images, conditions = fashion_mnist_subset(model, n, seed, classes, args.data)
        return conditions, None, images
    raise UsageError(f"--source dataset for {model.name} needs --images DIR (image files to teacher-force)")


def _check_settings_only(out: Path, settings: dict) -> None:
    """Before loading the model: refuse at once when ``out`` holds a run of other CLI settings."""
    run_file = out / SHARD_DIR / RUN_FILE
    if not run_file.is_file():
        return
    try:
        old = json.loads(run_file.read_text()).get("settings")
    except (OSError, json.JSONDecodeError, AttributeError):
        return
    new = json.loads(json.dumps(settings, default=str))
    if old != new:
        raise UsageError(f"--out {out} holds results of a run with other settings "
                         f"({settings_difference(old, new)}); pass another --out or add --overwrite")


if __name__ == "__main__":
    import sys

    sys.exit(main())
