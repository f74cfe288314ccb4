"""SJD-PAC against SJD (and its two halves) in target forwards: tokens per forward on the same images.

    python benchmarks/bench_sjd_pac.py --model embedded --num-images 16 --out benchmarks/results
    python benchmarks/bench_sjd_pac.py --model embedded-16 --num-images 4 --out benchmarks/results

Every configuration decodes the same conditions with the same per-image seeds at the paper's
sampling (CFG 3, temperature 1, top-k 2000; :mod:`lantern.methods.sjd_pac.method`): SJD at its
official window 16 and at SJD-PAC's 64, SCD's maximal coupling at 64 (adaptive continuation on a
chain, point-mass new positions), SJD-PAC with SJD's continuation (proactive drafting alone), with
K = 1 (adaptive continuation alone, uniform ``q`` for new positions), at the official L = 64,
K = 3, D = 3 and at the README's K = 4. Windows are capped at the model's tokens per image. Counts
only (tokens per forward, τ, acceptance rate of reached drafts): wall-clock on a shared CPU says
little. Writes ``--out``/bench_sjd_pac_<model>.csv``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ambiguity.cli import ArgumentParser, cli_main, positive_int
from ambiguity.conditions import generation_conditions
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig
from benchmarks.common import add_results_arg
from lantern.engine.decode import DecodeConfig, decode
from lantern.engine.records import summarize_decode


def configs(N: int) -> dict:
    """The compared decoders by label, windows capped at the N tokens of an image."""
    w = lambda L: min(L, N)
    return {
        "sjd L16": DecodeConfig.of("sjd", window=w(16)),
        "sjd L64": DecodeConfig.of("sjd", window=w(64)),
        "scd-maximal L64": DecodeConfig.of("scd", window=w(64), coupling="maximal"),
        "sjd-pac resample (PD only)": DecodeConfig.of("sjd-pac", window=w(64), continuation="resample"),
        "sjd-pac K1 (AC only)": DecodeConfig.of("sjd-pac", window=w(64), width=1),
        "sjd-pac L64 K3 D3 (official)": DecodeConfig.of("sjd-pac", window=w(64)),
        "sjd-pac L64 K4 D3": DecodeConfig.of("sjd-pac", window=w(64), width=4),
    }


@cli_main
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--num-images", type=positive_int, default=16)
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--seed", type=int, default=0)
    add_results_arg(p, "bench_sjd_pac")
    args = p.parse_args(argv)
    model = load_model(args.model)
    sampling = SamplingConfig(guidance=3.0, temperature=1.0, top_k=2000)
    conditions = generation_conditions(model, args.num_images, args.seed)
    rows = []
    for label, cfg in configs(model.num_tokens).items():
        out = decode(model, conditions, cfg, sampling, seed=args.seed, batch_size=args.batch_size)
        s = summarize_decode(out.steps, out.drafts, out.images, out.gamma)
        rows.append(
            dict(
                model=args.model,
                method=label,
                images=s["images"],
                tokens_per_forward=round(s["tokens_per_forward"], 3),
                tau=round(s["tau"], 3),
                acceptance_rate=round(s["acceptance_rate"], 3),
                target_forwards=s["target_forwards"],
            )
        )
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    table.to_csv(Path(args.out) / f"bench_sjd_pac_{args.model}.csv", index=False)
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
