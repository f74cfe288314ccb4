"""Cost of the exact per-step distortion over a (k, δ) grid: one rule at a time against the shared pass.

``lantern.distortion.distortion_table`` needs, at every (p, q) position, the exact distribution
one LANTERN verification step emits for each (k, δ) cell. Rule by rule
(:func:`lantern.rules.output.output_distribution`) every cell gathers p over every token's B_k and
takes its cumulative sum; :func:`lantern.rules.output.output_distributions` does that once at the
largest k and finds every δ of the TVD bound in one search. This script times both on the same
positions, interleaved (method order alternates per repeat) after a warm-up, and checks that
their outputs are the same floats.

Setting: LlamaGen's VQ shape (``--vocab`` 16384 codes x 8 dims; a seeded Gaussian codebook and
its exact L2 B_k table from FAISS), the paper's grid (k 100, 300, 1000 x δ 0.05, 0.1, 0.2, 0.4,
exact convention), ``--positions`` (p, q) pairs of peaked random logits. Prints the median and
the min-max spread of the seconds per position, and the ratio, and writes ``--out`` (JSON).

    python benchmarks/bench_distortion.py [--threads 2] [--positions 2] [--repeats 5]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.common

from ambiguity.cli import (
    ArgumentParser,
    add_threads_arg,
    check_out_file,
    cli_main,
    float_list,
    int_list,
    positive_int,
    set_threads,
)
from ambiguity.errors import UsageError
from ambiguity.io import write_json
from ambiguity.neighbourhood import build_neighbourhoods
from benchmarks.common import add_results_arg
from lantern.rules.acceptance import AcceptanceRule
from lantern.rules.output import output_distribution, output_distributions


def one_by_one(p, q, table, rules):
    """The outputs of ``rules`` through :func:`output_distribution`, one rule at a time."""
    return [output_distribution(p, q, table, rule) for rule in rules]


def shared(p, q, table, rules):
    """The outputs of ``rules`` through :func:`output_distributions` (one shared pass)."""
    return output_distributions(p, q, table, rules)


@cli_main
def main(argv=None) -> int:
    ap = ArgumentParser(prog="python benchmarks/bench_distortion.py", description=__doc__.splitlines()[0])
    add_threads_arg(ap, default=2)
    ap.add_argument("--vocab", type=positive_int, default=16384, help="codebook size V (default 16384)")
    ap.add_argument("--ks", default="100,300,1000", help="neighbourhood sizes, each < --vocab")
    ap.add_argument("--deltas", default="0.05,0.1,0.2,0.4", help="TVD bounds in [0, 1]")
    ap.add_argument("--positions", type=positive_int, default=2, help="(p, q) pairs per call (default 2)")
    ap.add_argument("--repeats", type=positive_int, default=5)
    add_results_arg(ap, "bench_distortion", "distortion_cost.json")
    args = ap.parse_args(argv)
    out = check_out_file(args.out)
    V = args.vocab
    ks, deltas = int_list(args.ks, "--ks", 1, V - 1), float_list(args.deltas, "--deltas", 0.0, 1.0)
    if V < 2:
        raise UsageError("--vocab must be >= 2")
    set_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    codebook = torch.randn(V, 8, generator=gen)
    table = build_neighbourhoods(codebook, max(ks), cache=False, progress=False).indices.long()
    p = torch.softmax(3 * torch.randn(args.positions, V, generator=gen), -1)
    q = torch.softmax(3 * torch.randn(args.positions, V, generator=gen), -1)
    rules = [AcceptanceRule("lantern", k=k, delta=d) for k in ks for d in deltas]

    methods = {"one_by_one": one_by_one, "shared": shared}
    same = all(torch.equal(a, b) for a, b in zip(one_by_one(p, q, table, rules), shared(p, q, table, rules)))
    seconds = {name: [] for name in methods}  # the calls above were the warm-up
    for r in range(args.repeats):
        for name in list(methods)[:: 1 if r % 2 == 0 else -1]:
            t0 = time.perf_counter()
            methods[name](p, q, table, rules)
            seconds[name].append((time.perf_counter() - t0) / args.positions)

    def summary(xs: list) -> dict:
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "all": xs}

    result = {
        "vocab": V,
        "ks": ks,
        "deltas": deltas,
        "cells": len(rules),
        "positions_per_call": args.positions,
        "threads": args.threads,
        "repeats": args.repeats,
        "same_floats": same,
        "seconds_per_position": {name: summary(xs) for name, xs in seconds.items()},
        "ratio_one_by_one_over_shared": statistics.median(seconds["one_by_one"]) / statistics.median(seconds["shared"]),
    }
    write_json(result, out)
    print(f"V={V}, {len(rules)} (k, δ) cells, {args.positions} positions per call, {args.threads} threads")
    for name, s in result["seconds_per_position"].items():
        print(f"{name:<12} {s['median']:.3f} s / position (min {s['min']:.3f}, max {s['max']:.3f})")
    print(f"ratio {result['ratio_one_by_one_over_shared']:.1f}x; same floats: {same}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
