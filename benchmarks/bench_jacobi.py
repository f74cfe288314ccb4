"""Where a Jacobi step's time goes, and images/s against the batch size (SJD, GSD, SCD).

Each round decodes ``--images`` images with every (method, batch size) pair in a fresh random
order (interleaved and repeated, one thread), at the paper's sampling (CFG 3, temperature 1,
top-k 2000 scaled to the vocabulary: ``V * 2000 / 16384``) and each method's official window.
Reported per model, method and batch size B, medians over rounds: images/s (images / wall
seconds of the decode); ``verification_share``, the part of the wall time not spent in target
forwards, ``1 - target_s / wall`` (``target_s``: the decode records' target seconds, summed over
images; the rest is verification: the distributions, the rule, the residual / bonus token, the
next drafts, the window and the records, timed or not: the former per-image code built its
records outside its timed sections); and ``rule_share``, the same without the seconds spent
turning logits into the sampling distribution (guidance, top-k, softmax:
:meth:`lantern.engine.slots.BatchState.target`, timed here by a wrapper), i.e. the Jacobi
verification proper.

    python benchmarks/bench_jacobi.py --models embedded-16 --batches 1,8,32 --images 32 --rounds 3

Run it on two checkouts (say the current one and a worktree at an older commit) with the same
arguments to compare implementations; the CSV has one row per (model, method, B).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from ambiguity.cli import ArgumentParser, add_threads_arg, cli_main, positive_int, set_threads
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig
from benchmarks.common import add_results_arg
from lantern.engine.decode import DecodeConfig, decode
from lantern.engine.slots import BatchState

DISTRIBUTION = {"s": 0.0}  # seconds in BatchState.target during the current decode


def _timed_target(target):
    def wrapper(self, logits):
        t0 = time.perf_counter()
        out = target(self, logits)
        DISTRIBUTION["s"] += time.perf_counter() - t0
        return out

    return wrapper


BatchState.target = _timed_target(BatchState.target)


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python benchmarks/bench_jacobi.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="embedded-16", help="comma-separated (default: %(default)s)")
    ap.add_argument("--methods", default="sjd,gsd,scd", help="comma-separated (default: %(default)s)")
    ap.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes (default: %(default)s)")
    ap.add_argument("--images", type=positive_int, default=32, help="images per decode (default: %(default)s)")
    ap.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds (default: %(default)s)")
    ap.add_argument("--label", default="", help="a name for this checkout in the CSV (default: none)")
    add_threads_arg(ap)
    add_results_arg(ap, "bench_jacobi", "jacobi.csv", "results CSV")
    return ap


def one_decode(model, method: str, sampling: SamplingConfig, images: int, batch: int) -> dict:
    """Decode ``images`` images (class labels 0..9 in turn, seed 3) with ``method`` at batch size ``batch``:
    images/s (wall clock), target, acceptance and distribution seconds (summed over images) and the
    acceptance and rule shares of the step seconds."""
    DISTRIBUTION["s"] = 0.0
    t0 = time.perf_counter()
    labels = [i % 10 for i in range(images)]
    out = decode(model, labels, DecodeConfig.of(method), sampling, seed=3, batch_size=batch)
    wall = time.perf_counter() - t0
    im = out.images
    target, acc, dist = float(np.sum(im["target_s"])), float(np.sum(im["acceptance_s"])), DISTRIBUTION["s"]
    return dict(
        images_per_s=images / wall,
        target_s=target,
        acceptance_s=acc,
        distribution_s=dist,
        share=1.0 - target / wall,
        rule_share=1.0 - (target + dist) / wall,
        wall_s=wall,
    )


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    set_threads(args.threads or 1)
    methods, batches = args.methods.split(","), [int(b) for b in args.batches.split(",")]
    rows = []
    for name in args.models.split(","):
        model = load_model(name)
        V = model.vocab_size
        sampling = SamplingConfig(guidance=3.0, temperature=1.0, top_k=max(1, round(V * 2000 / 16384)))
        pairs = [(m, b) for m in methods for b in batches]
        for m in methods:  # warm-up
            one_decode(model, m, sampling, 1, 1)
        for r in range(args.rounds):
            random.Random(r).shuffle(pairs)
            for m, b in pairs:
                rows.append(dict(model=name, method=m, B=b, round=r, **one_decode(model, m, sampling, args.images, b)))
            print(f"{name}: round {r + 1}/{args.rounds}", file=sys.stderr)
    df = pd.DataFrame(rows)
    table = df.groupby(["model", "method", "B"]).agg(
        images_per_s=("images_per_s", "median"),
        images_per_s_min=("images_per_s", "min"),
        images_per_s_max=("images_per_s", "max"),
        verification_share=("share", "median"),
        rule_share=("rule_share", "median"),
        acceptance_s=("acceptance_s", "median"),
        target_s=("target_s", "median"),
        distribution_s=("distribution_s", "median"),
    )
    table["label"] = args.label
    print(table.to_string(float_format=lambda x: f"{x:.4g}"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.reset_index().to_csv(args.out, index=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
