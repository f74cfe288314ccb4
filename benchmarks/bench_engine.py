"""Batch-1 latency of the decoding engine against the former one-image loops (``tests/reference``).

The engine decodes batch 1 as ``B = 1`` of its slot loop (per-row masks, gathers, one host
transfer per step); the former loops decoded one image with the batch-1 cache protocol. This
times both on the same images, interleaved and repeated: each round decodes ``--images`` images
with every (method, implementation) pair in a fresh random order, one thread. Reported per model
and method: median seconds per image of each implementation and the median and quartiles of
the per-round ratio engine / reference (below 1: the engine is faster). The tokens are checked
equal (the engine and the references draw the same random numbers).

    python benchmarks/bench_engine.py --models embedded,embedded-16 --rounds 5 --images 2 \
        --out benchmarks/results/engine_batch1.csv

``--clock cpu`` times the process's CPU seconds instead of wall seconds (one thread: the work
itself, without the time other processes held the core, for a shared machine); ``--methods``
picks rows of the table below.

The drafter drafts over its full head in both (the former loops predate the draft vocabulary of
the shipped ``embedded-16`` drafter). Settings are the paper's sampling (CFG 3, temperature 1,
top-k 2000 and k = 1000 scaled to the vocabulary: ``V * 2000 / 16384``, ``V * 1000 / 16384``),
δ = 0.1, γ = 4, EAGLE-2 dynamic tree (60 nodes, depth 6, top-k 10), SJD window 16.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]

from reference.decode import decode_one_by_one

from ambiguity.cli import ArgumentParser, add_threads_arg, cli_main, positive_int, set_threads
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig
from benchmarks.common import add_results_arg
from lantern.drafter.model import load_drafter
from lantern.engine.decode import DecodeConfig, decode, neighbour_table
from lantern.methods.tree.spec import TreeSpec


def configs(V: int) -> dict[str, DecodeConfig]:
    k = max(1, round(V * 1000 / 16384))
    return {
        "ar": DecodeConfig.of("ar"),
        "lantern-chain": DecodeConfig.of("lantern", 4, k=k, delta=0.1),
        "lantern-dynamic": DecodeConfig.of(
            "lantern", k=k, delta=0.1, tree=TreeSpec("dynamic", total_tokens=60, depth=6, top_k=10)
        ),
        "sjd": DecodeConfig.of("sjd", window=16),
    }


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python benchmarks/bench_engine.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="embedded,embedded-16", help="comma-separated (default: %(default)s)")
    ap.add_argument("--rounds", type=positive_int, default=5, help="interleaved rounds (default: %(default)s)")
    ap.add_argument("--images", type=positive_int, default=2, help="images per decode (default: %(default)s)")
    ap.add_argument(
        "--methods", default="ar,lantern-chain,lantern-dynamic,sjd", help="comma-separated (default: %(default)s)"
    )
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="what is timed (default: %(default)s)")
    add_threads_arg(ap)
    add_results_arg(ap, "bench_engine", "engine_batch1.csv", "results CSV")
    return ap


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    set_threads(args.threads or 1)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rows = []
    for name in args.models.split(","):
        model = load_model(name)
        drafter = load_drafter(model)
        drafter.set_draft_vocab(None)  # the former loops draft over the full head: compare the loops, not the heads
        V = model.vocab_size
        sampling = SamplingConfig(guidance=3.0, temperature=1.0, top_k=max(1, round(V * 2000 / 16384)))
        cfgs = {m: c for m, c in configs(V).items() if m in args.methods.split(",")}
        tables = {m: neighbour_table(model, c) for m, c in cfgs.items()}
        labels = list(range(args.images))
        impls = {
            "engine": lambda c, t: decode(model, labels, c, sampling, drafter, t, seed=3),
            "reference": lambda c, t: decode_one_by_one(model, labels, c, sampling, drafter, t, seed=3),
        }
        for m, c in cfgs.items():  # warm-up, and the tokens checked equal
            a, b = (impls[i](c, tables[m]).tokens for i in ("engine", "reference"))
            assert torch.equal(a, b), (name, m)
        pairs = [(m, i) for m in cfgs for i in impls]
        for r in range(args.rounds):
            random.Random(r).shuffle(pairs)
            for m, i in pairs:
                t0 = clock()
                impls[i](cfgs[m], tables[m])
                rows.append(dict(model=name, method=m, impl=i, round=r, s_per_image=(clock() - t0) / len(labels)))
            print(f"{name}: round {r + 1}/{args.rounds}", file=sys.stderr)
    df = pd.DataFrame(rows)
    wide = df.pivot_table(index=["model", "method", "round"], columns="impl", values="s_per_image").reset_index()
    wide["ratio"] = wide["engine"] / wide["reference"]
    table = wide.groupby(["model", "method"]).agg(
        engine_s=("engine", "median"),
        reference_s=("reference", "median"),
        ratio=("ratio", "median"),
        ratio_q25=("ratio", lambda x: np.quantile(x, 0.25)),
        ratio_q75=("ratio", lambda x: np.quantile(x, 0.75)),
    )
    print(table.to_string(float_format=lambda x: f"{x:.4g}"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table.reset_index().to_csv(args.out, index=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
