"""``python -m lantern.generate``: images by AR, speculative or LANTERN decoding, with records.

Example::

    python -m lantern.generate --method lantern --k 64 --delta 0.2 --num-images 16 --out runs/lantern

writes into ``--out``:

* ``images/00000.png`` … (one PNG per image) and ``grid.png`` / ``grid.pdf``;
* ``steps.parquet`` (one row per verification step), ``drafts.parquet`` (one row per draft
  token), ``images.parquet`` (one row per image, with its code grid in ``codes``) — the columns
  are documented in :mod:`lantern.records`;
* ``summary.json`` (settings, model, drafter, and :func:`lantern.records.summarize`), also
  printed as a table.

Image ``i`` is decoded with seed ``--seed + i`` (its own generator), so a rerun of the same
command resumes after the last finished image (``parts/`` holds each image's records, written
atomically), ``--num-images`` can be raised later, and AR and LANTERN runs with the same seed
are comparable image by image (:mod:`lantern.replay`). A rerun with other settings into the
same ``--out`` is refused unless ``--overwrite``. Bad parameters (δ < 0, λ < 1, k >= the
vocabulary size, γ < 1, a drafter built for another model, an unknown method) end with one
line on stderr and exit status 2.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Optional

import numpy as np

from ambiguity.errors import ArgumentParser, UsageError, cli_main
from lantern.decoding import DEFAULT_METRIC, METHODS, DecodeConfig

__all__ = ["build_parser", "main", "run_generate", "PART_DIR", "RUN_FILE"]

PART_DIR = "parts"
RUN_FILE = "run.json"
FINAL_FILES = ("steps.parquet", "drafts.parquet", "images.parquet", "summary.json", "grid.png", "grid.pdf")


def build_parser() -> ArgumentParser:
    """The argument parser of ``python -m lantern.generate`` (one-line errors, exit 2)."""
    from ambiguity.neighbourhood import METRICS

    p = ArgumentParser(prog="python -m lantern.generate",
                       description="Generate images with AR, speculative (sd) or LANTERN decoding and record "
                                   "every draft token.")
    p.add_argument("--model", default="embedded", help="registry name (default: embedded)")
    p.add_argument("--weights", default=None, help="target checkpoint file or directory (default: shipped / HF cache)")
    p.add_argument("--method", default="lantern", choices=METHODS, help="decoding method (default: lantern)")
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per verification step, >= 1 (default: 4)")
    p.add_argument("--k", type=int, default=64, help="latent neighbourhood size |B_k|, 0 <= k < vocabulary size; 0 = no neighbours, i.e. plain SD (default: 64)")
    p.add_argument("--delta", type=float, default=0.2,
                   help="bound δ: TVD (lantern) or JSD in nats (lantern-jsd), in [0, 1] (default: 0.2)")
    p.add_argument("--lam", type=float, default=2.0, help="relative bound λ >= 1 of lantern++ (default: 2.0)")
    p.add_argument("--metric", default=DEFAULT_METRIC, choices=METRICS,
                   help="latent distance on the VQ codebook (default: l2, as the official LANTERN code)")
    p.add_argument("--residual", default="exact", choices=("exact", "official"),
                   help="distribution after a rejection: exact = norm(max(p-q,0)); official = LANTERN code's")
    p.add_argument("--drafter", default=None, help="drafter .safetensors (default: lantern/weights/<model>_drafter)")
    p.add_argument("--num-images", type=int, default=8, help="images to generate (default: 8)")
    p.add_argument("--classes", default=None, help="class labels for c2i models, e.g. 0,3,7 (cycled)")
    p.add_argument("--captions", default=None, help="captions for t2i models: text file (one per line)")
    p.add_argument("--cfg", type=float, default=None,
                   help="classifier-free guidance scale, 1 = none (default: 4.0 c2i, 7.5 t2i, 1.0 text)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, 0 = greedy (default: 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens, 0 = all (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1], 1 = all (default: 1.0)")
    p.add_argument("--seed", type=int, default=0, help="image i uses seed + i (default: 0)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    p.add_argument("--dtype", default=None, help="auto | float32 | bfloat16 | float16 (default: fp32 CPU, bf16 CUDA)")
    p.add_argument("--out", default=None, help="output directory (default: runs/generate/<model>-<method>)")
    p.add_argument("--overwrite", action="store_true", help="discard results of other settings in --out")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return p


def _settings(args, config: DecodeConfig, device, dtype) -> dict:
    """Everything that changes an image's tokens (the resume key); --num-images is not part of it."""
    from ambiguity.io import abspath
    from ambiguity.models.registry import get_spec
    from ambiguity.profile import default_cfg

    cfg = default_cfg(get_spec(args.model).kind) if args.cfg is None else args.cfg  # `--cfg 4` = the c2i default
    return {"model": args.model, "weights": abspath(args.weights), "device": str(device),
            "dtype": str(dtype).replace("torch.", ""), **config.as_dict(), "drafter": abspath(args.drafter),
            "classes": args.classes, "captions": abspath(args.captions), "cfg": cfg, "temperature": args.temperature,
            "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed}


def _check_run(out: Path, settings: dict, overwrite: bool) -> None:
    """Refuse to mix images of other settings into ``out``; ``overwrite`` clears them."""
    from ambiguity.io import settings_difference, write_json

    run_file = out / RUN_FILE
    if overwrite:
        shutil.rmtree(out / PART_DIR, ignore_errors=True)
        shutil.rmtree(out / "images", ignore_errors=True)
        for f in (RUN_FILE,) + FINAL_FILES:
            (out / f).unlink(missing_ok=True)
    if run_file.is_file():
        try:
            old = json.loads(run_file.read_text()).get("settings")
        except (OSError, json.JSONDecodeError, AttributeError):
            old = None
        new = json.loads(json.dumps(settings, default=str))
        if old != new:
            raise UsageError(f"--out {out} holds images of a run with other settings ({settings_difference(old, new)}); "
                             f"pass another --out or add --overwrite")
        return
    write_json({"settings": settings}, run_file)


def _part(out: Path, i: int, what: str) -> Path:
    return out / PART_DIR / f"{i:05d}.{what}.parquet"


def _write_png(image: np.ndarray, path: Path) -> None:
    """(C, H, W) float in [0, 1] -> 8-bit PNG, atomically."""
    from PIL import Image

    from ambiguity.io import atomic_path

    x = np.clip(np.rint(image.transpose(1, 2, 0) * 255), 0, 255).astype(np.uint8)
    img = Image.fromarray(x[..., 0] if x.shape[-1] == 1 else x)
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG")


def _save_image_parts(out: Path, decoded, model) -> None:
    """Write one image's records (steps, drafts, then the image row last: the 'done' marker)."""
    import pandas as pd

    from ambiguity.io import write_table

    steps, drafts, images = decoded.frames()
    i = int(images["image"].iloc[0])
    if decoded.pixels is not None:
        _write_png(decoded.pixels[0].numpy(), out / "images" / f"{i:05d}.png")
    write_table(steps, _part(out, i, "steps"))
    write_table(drafts, _part(out, i, "drafts"))
    images = images.assign(codes=[decoded.tokens[0].tolist()])
    write_table(pd.DataFrame(images), _part(out, i, "image"))


def _done(out: Path, i: int, pixels: bool) -> bool:
    return _part(out, i, "image").is_file() and (not pixels or (out / "images" / f"{i:05d}.png").is_file())


def run_generate(model, conditions: list, config: DecodeConfig, sampling, out: Path, drafter=None,
                 seed: int = 0, progress: bool = True, settings: Optional[dict] = None):
    """Decode ``conditions`` (image i with seed ``seed + i``) into ``out``, resuming finished images.

    Returns ``(steps, drafts, images, summary)``: the three DataFrames of every image in ``out``
    for these conditions and the summary dict also written to ``summary.json``. Raises
    UsageError as :func:`lantern.decoding.decode`.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from ambiguity.io import read_table, write_json, write_table
    from lantern.decoding import decode, neighbour_table
    from lantern.records import summarize

    t0 = time.perf_counter()
    pixels = model.can_decode
    (out / PART_DIR).mkdir(parents=True, exist_ok=True)
    if pixels:
        (out / "images").mkdir(exist_ok=True)
    neighbours = neighbour_table(model, config)  # built once; decode() checks the drafter before any image
    todo = [i for i in range(len(conditions)) if not _done(out, i, pixels)]
    for i in tqdm(todo, desc=f"{config.method} images", disable=not progress, unit="img"):
        d = decode(model, [conditions[i]], config, sampling, drafter, neighbours, seed=seed, pixels=pixels,
                   first_index=i)
        _save_image_parts(out, d, model)
    read = lambda what: pd.concat([read_table(_part(out, i, what)) for i in range(len(conditions))], ignore_index=True)
    steps, drafts, images = read("steps"), read("drafts"), read("image")
    gamma = 0 if config.method == "ar" else config.gamma
    summary = {"model": model.describe(), "settings": settings or {}, "method": config.method, "gamma": gamma,
               "sampling": sampling.as_dict(), "rule": config.as_dict(),
               "drafter": None if drafter is None else {"target": drafter.target.get("name"),
                                                         "training": drafter.info},
               **summarize(steps, drafts, images, gamma),
               "images_resumed": len(conditions) - len(todo), "images_computed": len(todo),
               "wall_time_s": round(time.perf_counter() - t0, 3)}
    write_table(steps, out / "steps.parquet")
    write_table(drafts, out / "drafts.parquet")
    write_table(images, out / "images.parquet")
    if pixels:
        _grid(model, out, images)
    write_json(summary, out / "summary.json")
    return steps, drafts, images, summary


def _grid(model, out: Path, images) -> None:
    from PIL import Image

    from ambiguity import plots

    arr = [np.asarray(Image.open(out / "images" / f"{int(i):05d}.png"), dtype=np.float32) / 255.0
           for i in images["image"]]
    x = np.stack([a[None] if a.ndim == 2 else a.transpose(2, 0, 1) for a in arr])
    names = model.class_names
    titles = [names[int(c)] if names and str(c).isdigit() and int(c) < len(names) else str(c)
              for c in images["condition"]]
    fig = plots.image_grid(x, ncol=min(8, len(x)), titles=titles)
    plots.save_figure(fig, out / "grid")


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    """CLI entry point; returns 0, or 2 with one line on stderr for a UsageError."""
    from ambiguity.models.base import resolve_device
    from ambiguity.models.registry import get_spec, load_model, resolve_dtype
    from ambiguity.profile_inputs import generation_conditions, parse_classes
    from ambiguity.profile_report import check_out_dir
    from ambiguity.sampling import SamplingConfig
    from lantern.records import summary_table

    args = build_parser().parse_args(argv)
    # cheap checks first: nothing is loaded or written before the settings are known to be valid
    config = DecodeConfig(args.method, args.gamma, args.k, args.delta, args.lam, args.residual, args.metric)
    SamplingConfig(cfg=1.0 if args.cfg is None else args.cfg, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p)
    if args.num_images < 1:
        raise UsageError(f"--num-images must be >= 1, got {args.num_images}")
    classes = parse_classes(args.classes)
    get_spec(args.model)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    out = Path(args.out or Path("runs") / "generate" / f"{args.model.replace(':', '_').replace('/', '_')}-{args.method}")
    check_out_dir(out)
    settings = _settings(args, config, device, dtype)

    model = load_model(args.model, weights=args.weights, device=device, dtype=dtype)
    if config.speculative and config.rule().relaxed and config.k >= model.vocab_size:
        raise UsageError(f"--k {config.k} must be smaller than the vocabulary size {model.vocab_size} of "
                         f"{model.name}; lower --k")
    sampling = SamplingConfig(cfg=settings["cfg"], temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    drafter = None
    if config.speculative:
        from lantern.drafter import load_drafter

        drafter = load_drafter(model, args.drafter)
    conditions = generation_conditions(model, args.num_images, args.seed, classes, args.captions)
    from ambiguity.io import ensure_writable_dir

    ensure_writable_dir(out)
    _check_run(out, settings, args.overwrite)
    _, _, _, summary = run_generate(model, conditions, config, sampling, out, drafter, args.seed,
                                    progress=not args.no_progress, settings=settings)
    print(summary_table([summary]))
    hist = summary["accept_histogram"]
    print(f"accepted drafts per step (0..{len(hist) - 1}): {hist}; cfg {sampling.cfg}, temperature "
          f"{sampling.temperature}; {summary['images_computed']} images computed, {summary['images_resumed']} resumed")
    print(f"wrote {out}/(images/, grid.png, steps.parquet, drafts.parquet, images.parquet, summary.json)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
