"""How often an image's tokens depend on the batch size in float32, per method.

In float64 the engine's tokens do not depend on the batch size (``tests/test_engine.py``); in
float32 a matrix product over several rows rounds differently from one row, which now and then
moves a CDF boundary past a uniform and changes an image from that token on. This decodes the same
images (labels ``i % 10``, seed 0, one image per stream) at batch 1 and at each ``--batch-sizes``
and counts, per method, the images whose tokens equal batch 1's::

    python benchmarks/batch_identity.py --model embedded --num-images 32 --batch-sizes 8,32 \
        --out benchmarks/results/batch_identity.csv

Writes ``--out`` (default ``runs/benchmarks/batch_identity/batch_identity.csv``): one row per method and batch
size with the conditions (model, dtype, CFG, threads) and the count of identical images.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ambiguity.cli import ArgumentParser, add_threads_arg, cli_main, int_list, positive_int, set_threads
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig, default_guidance
from benchmarks.common import add_results_arg
from lantern.drafter.model import load_drafter
from lantern.engine.decode import DecodeConfig, decode


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python benchmarks/batch_identity.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded", help="registry name (default: %(default)s)")
    ap.add_argument("--num-images", type=positive_int, default=32, help="images (default: %(default)s)")
    ap.add_argument("--batch-sizes", type=int_list, default=[8, 32], help="comma-separated (default: 8,32)")
    add_threads_arg(ap)
    add_results_arg(ap, "batch_identity", "batch_identity.csv", "results CSV")
    return ap


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    set_threads(args.threads or 1)
    model = load_model(args.model)
    drafter = load_drafter(model)
    sampling = SamplingConfig(guidance=default_guidance(model.kind))
    k = max(1, round(model.vocab_size * 1000 / 16384))
    configs = {
        "ar": DecodeConfig.of("ar"),
        "sd": DecodeConfig.of("sd", 4),
        "lantern": DecodeConfig.of("lantern", 4, k=k, delta=0.1),
        "sjd": DecodeConfig.of("sjd"),
    }
    labels = [i % 10 for i in range(args.num_images)]
    rows = []
    for name, config in configs.items():
        one = decode(model, labels, config, sampling, drafter, seed=0).tokens
        for B in args.batch_sizes:
            many = decode(model, labels, config, sampling, drafter, seed=0, batch_size=B).tokens
            same = int((one == many).all(1).sum())
            rows.append(
                dict(
                    model=args.model,
                    dtype=str(next(model.gpt.parameters()).dtype).replace("torch.", ""),
                    method=name,
                    guidance=sampling.guidance,
                    threads=torch.get_num_threads(),
                    batch_size=B,
                    images=len(labels),
                    identical_to_batch_1=same,
                )
            )
            print(f"{name} B={B}: {same} of {len(labels)} images identical to batch 1", file=sys.stderr)
    df = pd.DataFrame(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(df.to_string(index=False))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
