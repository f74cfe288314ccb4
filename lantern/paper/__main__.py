"""``python -m lantern.paper``: the command line of :mod:`lantern.paper`."""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional

from ambiguity.cli import (
    ArgumentParser,
    add_data_arg,
    add_device_args,
    add_run_args,
    add_shard_args,
    check_out_dir,
    cli_main,
    default_out,
    device_from_args,
    float_list,
    int_list,
    parse_mapping,
    positive_int,
    seed_int,
)
from ambiguity.compare import parse_models
from ambiguity.distributed import shard_from_args
from ambiguity.errors import UsageError
from ambiguity.models.registry import check_compile
from ambiguity.runs import RunOptions
from lantern.paper import COMMAND, run_paper, select
from lantern.paper.config import QUICK, PaperConfig
from lantern.paper.experiments import EXPERIMENTS, TITLES
from lantern.quality.features import EXTRACTORS, default_extractors

SIZES = (
    "main_images",
    "greedy_images",
    "grid_images",
    "fig2a_images",
    "random_init_images",
    "profile_images",
    "interchange_images",
    "pairs_images",
    "timing_images",
)


def _size_help(name: str, default: int) -> str:
    if name == "timing_images":
        return (
            f"rounds timed (batch 1, interleaved) when --batch-size > 1 (default {default}; "
            "at --batch-size 1, the --quick default, every round is timed)"
        )
    quick = QUICK.get(name)
    sizes = f"default {default}" + (f", {quick} with --quick" if quick is not None else "")
    if name == "pairs_images":
        return (
            f"AR samples (an AR-only session: the temperature-1 session's first images) whose (p, q) pairs "
            f"at every position the distortion item measures ({sizes})"
        )
    return f"default {default}" + (f" ({quick} with --quick)" if quick is not None else "")


def build_parser() -> ArgumentParser:
    defaults = PaperConfig()
    p = ArgumentParser(
        prog=COMMAND,
        description="Regenerate the LANTERN paper's figures and tables next to its published values.",
        epilog="experiments: " + "; ".join(f"{k}: {v.rstrip('.')}" for k, v in TITLES.items()) + ".",
    )
    p.add_argument(
        "--models",
        default=",".join(defaults.models),
        help="comma-separated registry names; the first image model runs the decoding experiments "
        "(default: embedded,text-twin)",
    )
    p.add_argument("--weights", action="append", default=None, metavar="NAME=PATH", help="checkpoint per model")
    p.add_argument(
        "--drafter",
        action="append",
        default=None,
        metavar="NAME=PATH",
        help="drafter per model (default: the shipped one; train with python -m lantern.drafter.train)",
    )
    add_device_args(p)
    p.add_argument("--only", default=None, metavar="LIST", help=f"experiments to run: {', '.join(EXPERIMENTS)}")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a few images per measurement (< 10 min on 2 CPU cores); every figure is marked as such",
    )
    p.add_argument("--seed", type=seed_int, default=defaults.seed)
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        metavar="B",
        help=f"images per forward for statistics, samples and quality (every method batches; default "
        f"{defaults.batch_size}, with --quick 1); with B > 1 latency is timed at batch 1, interleaved, on the first "
        f"--timing-images rounds; with 1 every image is also timed",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the target's and the drafter's cached forwards (LlamaGen-architecture models; "
        "about 1.3x per forward on a CPU, worth it for long runs; the warm-up absorbs the compilation; "
        "not bit-exact)",
    )
    sizes = p.add_argument_group("sizes (defaults: full run; --quick lowers them)")
    for name in SIZES:
        sizes.add_argument(
            "--" + name.replace("_", "-"),
            type=positive_int,
            default=None,
            help=_size_help(name, getattr(defaults, name)),
        )
    grid = p.add_argument_group("the paper's grid (k on its 16384-code codebook, mapped to the model's)")
    grid.add_argument("--ks", default=None, help="default 100,300,1000")
    grid.add_argument("--deltas", default=None, help="default 0.05,0.1,0.2,0.4")
    grid.add_argument("--jsd-deltas", default=None, help="JSD bounds in nats for Table 3 (default 0.01,0.03,0.1,0.3)")
    q = p.add_argument_group("quality")
    q.add_argument(
        "--extractors",
        default=None,
        help=f"feature extractors ({', '.join(EXTRACTORS)}; default "
        f"fmnist,mobilenet where MobileNetV2's weights are found, fmnist with --quick)",
    )
    q.add_argument("--reference", default=defaults.reference, help="real-image set (lantern.evaluate source spec)")
    q.add_argument("--captions", default=None, help="t2i captions: a text file or an MS-COCO captions_*.json")
    add_data_arg(q)
    p.add_argument("--name", default=None, help="run name under runs/paper/ (default: default, or quick)")
    add_run_args(p, "run directory (default runs/paper/<name>)")
    add_shard_args(p)
    return p


def config_from_args(args) -> PaperConfig:
    """The :class:`PaperConfig` of the parsed options (``--quick`` presets, then explicit values)."""
    models = tuple(parse_models(args.models))
    values = dict(QUICK) if args.quick else {}
    values.update({n: getattr(args, n) for n in SIZES if getattr(args, n) is not None})
    if args.batch_size is not None:
        values["batch_size"] = args.batch_size
    if args.compile:
        for name in models:  # before any weights load
            check_compile(name)
        values["compile"] = True
    if args.ks:
        values["ks"] = tuple(int_list(args.ks, "--ks", 1))
    if args.deltas:
        values["deltas"] = tuple(float_list(args.deltas, "--deltas", 0.0, 1.0))
    if args.jsd_deltas:
        values["jsd_deltas"] = tuple(float_list(args.jsd_deltas, "--jsd-deltas", 0.0, 1.0))
    if args.extractors:
        ex = tuple(x.strip() for x in args.extractors.split(",") if x.strip())
        bad = [x for x in ex if x not in EXTRACTORS]
        if bad or not ex:
            raise UsageError(f"unknown extractor {bad[0] if bad else '(none)'!r}; choose from {', '.join(EXTRACTORS)}")
        values["extractors"] = ex
    elif not args.quick:  # fmnist, plus mobilenet where its weights are found (main's last note says when skipped)
        values["extractors"] = tuple(default_extractors()[0])
    weights = {k: str(v) for k, v in parse_mapping(args.weights, models, "--weights").items()}
    drafters = {k: str(v) for k, v in parse_mapping(args.drafter, models, "--drafter").items()}
    device, _ = device_from_args(args)
    return dataclasses.replace(
        PaperConfig(),
        models=models,
        weights=weights,
        drafters=drafters,
        device=str(device),
        dtype=args.dtype,
        seed=args.seed,
        reference=args.reference,
        captions=args.captions,
        data=args.data,
        **values,
    )


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    only = select(args.only)
    config = config_from_args(args)
    out = check_out_dir(args.out or default_out("paper", args.name or ("quick" if args.quick else "default")))
    shard = shard_from_args(args, device_from_args(args)[0])
    report = run_paper(config, RunOptions.from_args(args, shard, out), only)
    if report is None:
        print(
            f"{shard.label} done: its decoding rounds are parts of {out}/sessions"
            + ("" if shard.group else "; after every shard, run the same command without --shard-index")
        )
    if args.extractors is None and not args.quick:
        for note in default_extractors()[1]:
            print(f"note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
