"""entropy-sd's entropy-dependent window against fixed windows and SJD, in target forwards and tokens fed.

    python benchmarks/bench_entropy_window.py --model embedded --num-images 8 --out benchmarks/results
    python benchmarks/bench_entropy_window.py --model embedded --num-images 128 --out benchmarks/results

Every configuration decodes the same conditions with the same per-image seeds (CFG 3, temperature
1, top-k 125: the sampling the threshold's floor was set at, :class:`lantern.methods.jacobi.config.JacobiConfig`),
batch 8, float32: SJD at its official window 16 and at 24, entropy-sd with a fixed window
(``entropy_min_window = L``) of 8, 12, 16, 24 and 32, and with the entropy-dependent window
``L(H) = clamp(round(L exp(-H / scale)), L_min, L)`` at the defaults (L 24, L_min 4, scale 6 nats)
and at L 16 and 32. Counts only: target forwards per image (the prefill counted), tokens fed to the
target per image (each forward's window, the per-forward cost on a CPU), tokens per forward and the
acceptance rate of judged drafts; wall-clock on a shared CPU says little. Writes
``--out``/bench_entropy_window_<model>_<images>.csv``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
    fixed = lambda L: DecodeConfig.of("entropy-sd", window=w(L), entropy_min_window=w(L))
    dynamic = lambda L: DecodeConfig.of("entropy-sd", window=w(L), entropy_min_window=4, entropy_window_scale=6.0)
    return {
        "sjd L16": DecodeConfig.of("sjd", window=w(16)),
        "sjd L24": DecodeConfig.of("sjd", window=w(24)),
        **{f"entropy-sd fixed L{L}": fixed(L) for L in (8, 12, 16, 24, 32)},
        "entropy-sd dynamic L16 (L_min 4, scale 6)": dynamic(16),
        "entropy-sd dynamic L24 (default)": DecodeConfig.of("entropy-sd", window=w(24)),
        "entropy-sd dynamic L32 (L_min 4, scale 6)": dynamic(32),
    }


def row(model: str, label: str, out) -> dict:
    """One table row of a decode's counts (per image: target forwards and tokens fed)."""
    s = summarize_decode(out.steps, out.drafts, out.images, out.gamma)
    n = int(s["images"])
    fed = int((np.asarray(out.steps["drafted"]) + 1).sum())  # each forward's window (last token + drafts)
    return dict(
        model=model,
        method=label,
        images=n,
        forwards_per_image=round(s["target_forwards"] / n, 2),
        tokens_fed_per_image=round(fed / n, 1),
        mean_window=round(fed / len(out.steps["step"]), 2),
        tokens_per_forward=round(s["tokens_per_forward"], 3),
        acceptance_rate=round(s["acceptance_rate"], 3),
    )


@cli_main
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--num-images", type=positive_int, default=8)
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--seed", type=int, default=0)
    add_results_arg(p, "bench_entropy_window")
    args = p.parse_args(argv)
    model = load_model(args.model)
    sampling = SamplingConfig(guidance=3.0, temperature=1.0, top_k=125)
    conditions = generation_conditions(model, args.num_images, args.seed)
    rows = []
    for label, cfg in configs(model.num_tokens).items():
        out = decode(model, conditions, cfg, sampling, seed=args.seed, batch_size=args.batch_size)
        rows.append(row(args.model, label, out))
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    table.to_csv(Path(args.out) / f"bench_entropy_window_{args.model}_{args.num_images}.csv", index=False)
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
