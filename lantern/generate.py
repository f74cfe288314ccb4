"""``python -m lantern.generate``: images by AR, speculative, LANTERN or Jacobi decoding, with records.

Example::

    python -m lantern.generate --method lantern --k 64 --delta 0.2 --num-images 16 --out runs/lantern

writes into ``--out`` (a run directory, :mod:`ambiguity.runs`):

* ``images/00000.png`` … (one PNG per image) and ``grid.png`` / ``grid.pdf``;
* ``steps.parquet`` (one row per verification step), ``drafts.parquet`` (one row per draft
  token), ``images.parquet`` (one row per image, with its code grid in ``codes``) — the columns
  are documented in :mod:`lantern.engine.records`;
* ``summary.json`` (settings, model, drafter, and :func:`lantern.engine.records.summarize_decode`), also
  printed as a table.

Image ``i`` draws from its own random stream seeded by ``(--seed, i)`` (:mod:`ambiguity.seeding`),
so a rerun of the same command resumes after the last finished image (``parts/image_NNNNN.*``
hold each image's records, checked on resume), ``--num-images`` can be raised later, and AR
and LANTERN runs with the same seed are comparable image by image (:mod:`lantern.replay`).
A rerun with other settings into the same ``--out`` is refused unless ``--overwrite``. Bad
parameters (δ < 0, λ < 1, k >= the vocabulary size, γ < 1, a drafter built for another model,
an unknown method, an option of another method or draft shape: each method declares its options,
:data:`lantern.methods.registry.OPTIONS`; ``--compile`` for an eager-only model, before its weights load) end with one
line on stderr and exit status 2. ``summary.json`` also records ``batch_size`` and ``compile``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
from PIL import Image
from tqdm.auto import tqdm

from ambiguity import plots
from ambiguity.cli import (
    ArgumentParser,
    add_condition_args,
    add_model_args,
    add_run_args,
    add_sampling_args,
    add_shard_args,
    check_out_dir,
    cli_main,
    default_out,
    device_from_args,
    positive_int,
    sampling_from_args,
)
from ambiguity.conditions import generation_conditions, parse_classes
from ambiguity.distributed import shard_from_args
from ambiguity.errors import UsageError
from ambiguity.io import abspath, atomic_path, write_json, write_table
from ambiguity.memory import check_run_size
from ambiguity.models.base import TokenModel
from ambiguity.models.registry import check_compile, check_spec_options, get_spec, load_model
from ambiguity.runs import RunDir, RunOptions, assemble_units, file_sha256, read_units, shard_units
from ambiguity.sampling import SamplingConfig
from lantern.drafter.model import DraftModel, drafter_digest, load_drafter
from lantern.engine.decode import (
    METHODS,
    DecodeConfig,
    check_depth,
    check_params,
    compile_forwards,
    decode,
    neighbour_table,
)
from lantern.engine.options import add_method_options, check_method_options
from lantern.engine.records import Decoded, summarize_decode, summary_table
from lantern.engine.slots import check_batching
from lantern.methods.registry import METHODS as PLUGINS
from lantern.methods.registry import OPTIONS
from lantern.methods.tree.spec import parse_tree
from lantern.run_reader import drafting_shape, run_label

__all__ = ["build_parser", "main", "run_generate", "decode_config_from_args", "COMMAND", "OUTPUTS"]

COMMAND = "python -m lantern.generate"
MERGE = "lantern.generate:merge_run"
OUTPUTS = ("steps.parquet", "drafts.parquet", "images.parquet", "summary.json", "grid.png", "grid.pdf", "images")
COMPILE_NOTE = "compiled (--compile): the first images' seconds include the compilation"


def add_decoding_args(p) -> None:
    """``--method`` and every method's own options (``--drafter`` among the drafted methods'), one group
    per method family
    (:data:`lantern.methods.registry.OPTIONS`; another method's option is refused by
    :func:`~lantern.engine.options.check_method_options`)."""
    p.add_argument("--method", default="lantern", choices=METHODS, help="decoding method (default: lantern)")
    add_method_options(p, OPTIONS)


def decode_config_from_args(args) -> DecodeConfig:
    """:class:`~lantern.engine.decode.DecodeConfig` from the decoding options: the method's plug-in
    reads its own (:attr:`lantern.methods.registry.Plugin.from_args`). UsageError for bad values."""
    plugin = PLUGINS[args.method]
    tree = parse_tree(args.tree, args.total_tokens, args.depth, args.tree_top_k) if plugin.drafter else None
    fields = plugin.from_args(args) if plugin.from_args is not None else {}
    return DecodeConfig.of(args.method, args.gamma, args.metric, args.matrix, tree, args.gamma_max, **fields)


def build_parser() -> ArgumentParser:
    """The argument parser of ``python -m lantern.generate`` (one-line errors, exit 2)."""
    p = ArgumentParser(
        prog=COMMAND,
        description="Generate images with AR, speculative (sd), LANTERN (lantern, lantern++, lantern-jsd), Cool-SD, "
        "FLy, Jacobi (sjd, gsd, scd, entropy-sd, sjd-pac: no drafter) or row-parallel (zipar, pjd) decoding and "
        "record every draft token.",
    )
    add_model_args(p, image_size=True)
    add_decoding_args(p)
    add_condition_args(p, num_images=8, batch_size=None)
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=1,
        metavar="B",
        help="images decoded together, one target forward per step for all (every method; default: 1). "
        "Same random streams: tokens equal batch 1's exactly with --dtype float64, almost always "
        "in float32",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the target's and the drafter's cached forwards (LlamaGen-architecture models: "
        "embedded, embedded-16, llamagen-*, text-twin; compiles on the first images; not bit-exact: an image's "
        "tokens occasionally diverge, in float64 too)",
    )
    add_sampling_args(p)
    add_run_args(p, "output directory (default: runs/generate/<model>-<method>)")
    add_shard_args(p)
    return p


def _settings(args, config: DecodeConfig, sampling: SamplingConfig, device, dtype) -> dict:
    """Everything that changes an image's tokens (the run record); --num-images is not part of it."""
    return {
        "model": args.model,
        "weights": abspath(args.weights),
        **({"image_size": args.image_size} if args.image_size else {}),  # a declared LlamaGen grid
        "device": device.type,
        "dtype": str(dtype).replace("torch.", ""),
        **config.as_dict(),
        "drafter": abspath(args.drafter),
        "classes": args.classes,
        "captions": abspath(args.captions),
        "guidance": sampling.guidance,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "seed": args.seed,
    }


def check_tree_support(spec, config: DecodeConfig) -> None:
    """Refuse ``--tree`` for a registered model whose layout draft trees do not model (end-of-row
    tokens: ``ModelSpec.trees`` is False), from the registry alone, before its weights load.
    spec: an :class:`ambiguity.models.catalog.ModelSpec`."""
    if config.tree is not None and not spec.trees:
        raise UsageError(
            f"{spec.name} inserts end-of-row tokens, which draft trees do not model yet; "
            f"use chain drafting (--tree chain)"
        )


def _write_png(image: np.ndarray, path: Path) -> None:
    """(C, H, W) float in [0, 1] -> 8-bit PNG, atomically."""
    x = np.clip(np.rint(image.transpose(1, 2, 0) * 255), 0, 255).astype(np.uint8)
    img = Image.fromarray(x[..., 0] if x.shape[-1] == 1 else x)
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG")


def _save_image(run: RunDir, i: int, condition, decoded: Decoded, computed_with: dict) -> None:
    """One image's records as a part (steps, drafts, the image row with its codes, and its PNG);
    ``computed_with``: the batch size it was decoded in and whether the forwards were compiled."""
    steps, drafts, images = decoded.frames()
    files = []
    if decoded.pixels is not None:
        png = run.path / "images" / f"{i:05d}.png"
        png.parent.mkdir(exist_ok=True)
        _write_png(decoded.pixels[0].numpy(), png)
        files.append(png)
    images = images.assign(codes=[decoded.tokens[0].tolist()])
    run.write_part(
        f"image_{i:05d}",
        {"image": i, "condition": str(condition)},
        tables={"steps": steps, "drafts": drafts, "image": images},
        files=files,
        meta={"computed_with": computed_with},
    )


def run_generate(
    model: TokenModel,
    conditions: list,
    config: DecodeConfig,
    sampling: SamplingConfig,
    options: RunOptions | str | Path | None = None,
    drafter: Optional[DraftModel] = None,
    seed: int = 0,
    *,
    settings: Optional[dict] = None,
    batch_size: int = 1,
    compiled: bool = False,
):
    """Decode ``conditions`` (image ``i`` from its own stream seeded by ``(seed, i)``) into a run
    directory, reusing the intact parts of finished images.

    options: :class:`~ambiguity.runs.RunOptions` (``out`` is required), or just the run directory. Its shard
    (:mod:`ambiguity.distributed`) decodes the images ``i % shard.count == shard.index``; the
    merging shard then reads every image's part. settings: the run record (default: the model,
    decoding config, sampling and seed); the target's :meth:`~ambiguity.models.base.TokenModel.weights_digest`
    and the drafter's :func:`~lantern.drafter.model.drafter_digest` join it, so that weights retrained in place
    refuse the run rather than resume it. batch_size: images decoded together
    (:func:`lantern.engine.decode.decode`); the parts are written after every ``16 * batch_size``
    images (a batch then drains, so resuming loses at most that many). compiled: whether the
    forwards run through torch.compile (``--compile``; seconds per image then include the
    compilation). Each image's part records the batch size it was decoded in (at most the images
    decoded together) and ``compiled``; the summary's ``batch_size`` / ``compile`` are those the
    images share (None when mixed), ``computed_with`` lists each setting with its image count, and
    a note says when this call asked for other ones (:func:`computed_with_record`). A run with
    ``captions`` in its settings records the file's SHA-256 (``captions_sha256``).
    Returns ``(steps, drafts, images, summary)``: the three DataFrames of the images of these
    conditions and the summary dict also written to ``summary.json``; None on a shard that does
    not merge. Raises UsageError as :func:`lantern.engine.decode.decode`, or for an ``out`` holding a
    run of other settings or another shard count; TypeError without ``out``.
    """
    t0 = time.perf_counter()
    opts = RunOptions.of(options)
    if opts.out is None:
        raise TypeError("run_generate needs a run directory: options=RunOptions(out=...) or out=...")
    shard = opts.shard
    run = _open_run(model, config, sampling, opts, drafter, seed, settings)
    check_depth(config, model)
    facts = _facts(model, config, sampling, drafter, conditions, batch_size, compiled)
    if shard.index == 0:  # what the merge needs to know: how many images, their conditions, the facts
        run.write_part("request", {"num_images": len(conditions)}, meta=facts)
    units = _image_units(conditions)
    todo = [i for i, done in shard_units(run, units, shard, load=False) if not _complete(done, facts["pixels"])]
    if todo:  # a finished run builds no neighbour table
        _decode_images(run, model, conditions, todo, config, sampling, drafter, seed, opts, batch_size, compiled)
    parts = assemble_units(run, units, shard, None, lambda part: part)  # the tables are the parts'
    if parts is None:
        return None  # rank 0 (torchrun) or `python -m ambiguity merge` writes the outputs
    return _assemble(run, facts, parts, len(todo), t0)


def _open_run(
    model: TokenModel, config: DecodeConfig, sampling: SamplingConfig, opts: RunOptions, drafter, seed, settings
) -> RunDir:
    """The run directory, opened for this shard, with the run record: the settings (default: model,
    decoding config, sampling, seed), the weights digests and the captions file's SHA-256."""
    record = (
        {**settings, "weights_digest": model.weights_digest()}  # the command line names files, not their contents
        if settings is not None
        else {"model": model.describe(), **config.as_dict(), **sampling.as_dict(), "seed": seed}
    )
    if drafter is not None:  # a target or drafter retrained in place must not continue another's run
        record["drafter_digest"] = drafter_digest(drafter)
    if record.get("captions"):  # the file's contents, not only its path, decide the conditions
        record["captions_sha256"] = file_sha256(Path(record["captions"]))
    return RunDir(opts.out, record, command=COMMAND, outputs=OUTPUTS, merge=MERGE).open_shared(
        opts.shard, opts.overwrite
    )


def _facts(
    model: TokenModel, config: DecodeConfig, sampling: SamplingConfig, drafter, conditions, batch_size, compiled
) -> dict:
    """What the summary and the merge need besides the parts (this call's requested batch size and compile)."""
    return {
        "model": model.describe(),
        "class_names": model.class_names,
        "method": config.method,
        "gamma": config.draft_depth,
        "sampling": sampling.as_dict(),
        "rule": config.as_dict(),
        "pixels": model.can_decode,
        "batch_size": batch_size,
        "compile": bool(compiled),
        "drafter": None
        if drafter is None
        else {"target": drafter.target.get("name"), "training": getattr(drafter, "info", {})},
        "conditions": [str(c) for c in conditions],
    }


def _decode_images(
    run: RunDir,
    model: TokenModel,
    conditions: list,
    todo: list[int],
    config: DecodeConfig,
    sampling: SamplingConfig,
    drafter,
    seed: int,
    opts: RunOptions,
    batch_size: int,
    compiled: bool,
) -> None:
    """Decode the images ``todo`` in chunks of ``16 * batch_size`` and save each as its part, with
    the batch size it was decoded in (at most the chunk's images) and ``compiled``."""
    neighbours = neighbour_table(model, config, progress=opts.progress)  # built once; decode() checks the drafter
    chunk = 1 if batch_size == 1 else 16 * batch_size
    shard = opts.shard
    bar = tqdm(
        total=len(todo),
        desc=f"{config.method} images" + (f" ({shard.label})" if shard.count > 1 else ""),
        disable=not opts.progress,
        unit="img",
    )
    for at in range(0, len(todo), chunk):
        these = todo[at : at + chunk]
        d = decode(
            model,
            [conditions[i] for i in these],
            config,
            sampling,
            drafter,
            neighbours,
            seed=seed,
            pixels=model.can_decode,
            indices=these,
            batch_size=batch_size,
        )
        used = {"batch_size": min(batch_size, len(these)), "compile": bool(compiled)}  # not the requested size
        for i, one in zip(these, d.split()):
            _save_image(run, i, conditions[i], one, used)
        bar.update(len(these))
    bar.close()


def _image_units(conditions: list) -> list[tuple[str, dict]]:
    """Name and content of every image's part: one unit per image."""
    return [(f"image_{i:05d}", {"image": i, "condition": str(c)}) for i, c in enumerate(conditions)]


def _complete(part, pixels: bool) -> bool:
    """Whether an image's part is finished: present, and with its PNG where the model draws pixels."""
    return part is not None and (not pixels or any(k.endswith(".png") for k in part.files))


def _assemble(run: RunDir, facts: dict, parts: list, computed: int, t0: float):
    """The run's tables, grid and summary from every image's part (read in order)."""
    conditions = facts["conditions"]
    if facts["pixels"] and not all(_complete(p, True) for p in parts):
        raise UsageError(f"{run.path} has image parts without their PNG; rerun the generate command to repair them")
    steps, drafts, images = (
        pd.concat([p.tables[w] for p in parts], ignore_index=True) for w in ("steps", "drafts", "image")
    )
    computed_with = computed_with_record(parts)
    summary = {
        "model": facts["model"],
        "settings": run.settings,
        "method": facts["method"],
        "gamma": facts["gamma"],
        "sampling": facts["sampling"],
        "rule": facts["rule"],
        "drafter": facts["drafter"],
        **computed_with,
        **summarize_decode(steps, drafts, images, facts["gamma"]),
        "images_resumed": len(conditions) - computed,
        "images_computed": computed,
        "notes": run.notes,
        "wall_time_s": round(time.perf_counter() - t0, 3),
    }
    if facts.get("compile") and computed:
        summary["notes"] = [*summary["notes"], COMPILE_NOTE]
    asked = {"batch_size": facts.get("batch_size"), "compile": facts.get("compile")}
    if any(asked[k] != v for part in computed_with["computed_with"] for k, v in part.items() if k in asked):
        summary["notes"] = [*summary["notes"], settings_note(asked, computed, computed_with)]
    write_table(steps, run.path / "steps.parquet")
    write_table(drafts, run.path / "drafts.parquet")
    write_table(images, run.path / "images.parquet")
    if facts["pixels"]:
        _grid(facts["class_names"], run.path, images, grid_title(summary, len(images)))
    write_json(summary, run.path / "summary.json")
    run.seal(
        ["steps.parquet", "drafts.parquet", "images.parquet", "summary.json"]  # lantern.runs.load_run checks them
        + ([f"images/{int(i):05d}.png" for i in images["image"]] if facts["pixels"] else [])
    )
    return steps, drafts, images, summary


def computed_with_record(parts: list) -> dict:
    """What the images were computed with, from their parts: ``batch_size`` and ``compile`` (the
    value every image shares, None when they differ or a part predates the record) and
    ``computed_with``: [{batch_size, compile, images}] per distinct setting (batch size used: at
    most the images decoded together, never the requested size)."""
    groups: dict = {}
    for part in parts:
        w = (part.meta or {}).get("computed_with") or {"batch_size": None, "compile": None}
        key = (w.get("batch_size"), w.get("compile"))
        groups[key] = groups.get(key, 0) + 1
    one = len(groups) == 1
    return {
        "batch_size": next(iter(groups))[0] if one else None,
        "compile": next(iter(groups))[1] if one else None,
        "computed_with": [{"batch_size": b, "compile": c, "images": n} for (b, c), n in groups.items()],
    }


def settings_note(asked: dict, computed: int, computed_with: dict) -> str:
    """The summary's note when this call's speed settings (batch size, compile) differ from those
    the images were computed with: its timings are the images' own."""
    said = ", ".join(
        f"{w['images']} image(s) with batch size {w['batch_size']}, compile {w['compile']}"
        for w in computed_with["computed_with"]
    )
    return (
        f"this call asked for batch size {asked['batch_size']}, compile {asked['compile']} and decoded "
        f"{computed} image(s); the images were computed with: {said} (unknown: computed before this was "
        f"recorded); the timings are those of each image's own settings"
    )


def grid_title(summary: dict, n: int) -> str:
    """The grid's title: method with k and δ (or λ), the drafting shape, sampling and image count."""
    rule = {**(summary.get("rule") or {}), "method": summary.get("method")}
    samp = summary.get("sampling") or {}
    what = " ".join(x for x in (run_label({"method": summary.get("method"), "rule": rule}), drafting_shape(rule)) if x)
    how = (
        f"cfg {samp.get('guidance', 1.0):g}, temperature {samp.get('temperature', 1.0):g}"
        + (f", top-k {samp['top_k']}" if samp.get("top_k") else "")
        + (f", top-p {samp['top_p']:g}" if samp.get("top_p", 1.0) < 1.0 else "")
    )
    return f"{what} — {how} — {n} images"


def merge_run(path: str | Path, figures: bool = True):
    """``python -m ambiguity merge RUN`` for a generate run: tables, grid and summary from the
    shards' parts. Raises UsageError when a part is missing, damaged or foreign."""
    t0 = time.perf_counter()
    record = RunDir(path, {}, command=COMMAND).stored()
    run = RunDir(path, record["settings"], command=COMMAND, outputs=OUTPUTS, merge=MERGE)
    request = run.read_part("request")
    if request is None or not {"pixels", "conditions"} <= set(request.meta):
        raise UsageError(f"{path} lacks its request part (shard 0 writes it); run shard 0 and merge again")
    facts = dict(request.meta, pixels=request.meta["pixels"] and figures)
    _, _, _, summary = _assemble(run, facts, read_units(run, _image_units(facts["conditions"])), 0, t0)
    print(summary_table([summary]))
    return summary


def _grid(class_names, out: Path, images, title: str) -> None:
    arr = [
        np.asarray(Image.open(out / "images" / f"{int(i):05d}.png"), dtype=np.float32) / 255.0 for i in images["image"]
    ]
    x = np.stack([a[None] if a.ndim == 2 else a.transpose(2, 0, 1) for a in arr])
    titles = [
        class_names[int(c)] if class_names and str(c).isdigit() and int(c) < len(class_names) else str(c)
        for c in images["condition"]
    ]
    fig = plots.image_grid(x, ncol=min(8, len(x)), titles=titles, title=title)
    plots.save_figure(fig, out / "grid")


def histogram_text(hist: list[int], limit: int = 17) -> str:
    """``accept_histogram`` for a terminal, ``(0..J): [n_0, ..., n_J]``: whole when it has at most
    ``limit`` entries; else cut after its last non-zero count, and the counts from ``limit - 1``
    on summed in one tail entry (a Jacobi window of L has L entries, most of them 0)."""
    hist = [int(n) for n in hist]
    if len(hist) > limit:
        hist = hist[: max((j for j, n in enumerate(hist) if n), default=0) + 1]
    last = len(hist) - 1
    if len(hist) <= limit:
        return f"(0..{last}): {hist}"
    head = ", ".join(map(str, hist[: limit - 1]))
    return f"(0..{last}): [{head}, {sum(hist[limit - 1 :])} at {limit - 1}..{last}]"


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    """CLI entry point; returns 0, or 2 with one line on stderr for a UsageError."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # cheap checks first: nothing is loaded or written before the settings are known to be valid
    check_method_options(parser, args)
    config = decode_config_from_args(args)
    sampling = sampling_from_args(args, get_spec(args.model).kind)  # `--cfg 4` = the c2i default
    check_tree_support(get_spec(args.model), config)
    classes = parse_classes(args.classes)
    dynamic = config.tree is not None and config.tree.kind == "dynamic"
    check_spec_options(
        args.model,
        args.weights,
        k=config.rule.k if config.rule is not None and config.rule.relaxed else None,
        classes=classes,
        captions=args.captions,
        tree_top_k=config.tree.top_k if dynamic else None,
    )
    if args.compile:
        check_compile(args.model)  # an eager-only adapter, from the registry, before its weights load
    device, dtype = device_from_args(args)
    out = check_out_dir(args.out or default_out("generate", f"{args.model}-{args.method}"))
    settings = _settings(args, config, sampling, device, dtype)
    if not args.overwrite:  # the options now; the weights digests once the files are loaded (run_generate)
        RunDir(out, settings, command=COMMAND).check(only=tuple(settings))

    shard = shard_from_args(args, device)
    model = load_model(
        args.model, weights=args.weights, device=shard.device(device), dtype=dtype, image_size=args.image_size
    )
    check_run_size(model, args.num_images)  # steps and drafts rows of every image; before the conditions list
    check_depth(config, model)
    check_params(config, model)
    drafter = load_drafter(model, args.drafter) if config.speculative else None
    if args.compile:
        compile_forwards(model, drafter)
    check_batching(model, drafter)  # the engine's slot protocol, before the run directory is written
    if args.batch_size > 1:
        check_run_size(model, args.num_images, args.batch_size, sampling.guided)
    conditions = generation_conditions(model, args.num_images, args.seed, classes, args.captions)
    options = RunOptions.from_args(args, shard, out)
    result = run_generate(
        model,
        conditions,
        config,
        sampling,
        options,
        drafter,
        args.seed,
        settings=settings,
        batch_size=args.batch_size,
        compiled=args.compile,
    )
    if result is None:
        print(
            f"{shard.label} done: its images are parts of {out}"
            + ("" if shard.group else f"; after every shard, run python -m ambiguity merge {out}")
        )
        return 0
    summary = result[3]
    print(summary_table([summary]))
    hist = histogram_text(summary["accept_histogram"])
    accepted = "" if config.method == "ar" else f"accepted drafts per step {hist}; "  # AR drafts nothing
    print(
        f"{accepted}cfg {sampling.guidance}, temperature {sampling.temperature}; "
        f"{summary['images_computed']} images computed, {summary['images_resumed']} resumed"
        + (f"; batch size {args.batch_size}" if args.batch_size > 1 else "")
    )
    if COMPILE_NOTE in summary["notes"]:
        print(f"note: {COMPILE_NOTE}")
    print(f"wrote {out}/: {', '.join(written_outputs(model.can_decode))}")
    return 0


def written_outputs(pixels: bool) -> list[str]:
    """The outputs a finished run holds: the PNGs and the grid only for a model that draws pixels."""
    return (["images/", "grid.png"] if pixels else []) + [
        "steps.parquet",
        "drafts.parquet",
        "images.parquet",
        "summary.json",
    ]


if __name__ == "__main__":
    raise SystemExit(main())
