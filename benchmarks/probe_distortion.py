"""How far LANTERN's output distribution moves from the target's p, exactly, on real (p, q) pairs.

Not a test. Decodes ``--num-images`` images of the embedded model with lossless SD (γ = 4,
``--cfg``, temperature 1), records the target distribution p and the drafter distribution q at
the first draft position of every verification step (by wrapping :func:`lantern.methods.chain.accept`),
and then computes, with no sampling, the distribution one LANTERN step emits
(:func:`lantern.rules.output.output_distribution`, ``exact`` residual) for every k and δ of the
decoding sweep. It prints the mean / median / max of TVD(out, p) per setting and writes ``--out``
(default ``runs/benchmarks/probe_distortion/distortion.json``; the committed results:
``--out benchmarks/results/distortion.json``).

The δ bound holds per draft (S_j* <= δ), so TVD(out, p) can exceed δ when q is far from p;
this is what drives the target NLL up in ``bench_decoding.py`` even at δ = 0.05.

    python benchmarks/probe_distortion.py --out benchmarks/results/distortion.json   # ~1 min on 2 CPU cores
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.common

import lantern.engine.decode as decoding
import lantern.methods.chain as chain
from ambiguity.cli import (
    ArgumentParser,
    add_guidance_arg,
    check_out_file,
    cli_main,
    float_list,
    int_list,
    positive_int,
    seed_int,
)
from ambiguity.io import write_json
from ambiguity.memory import check_count
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig
from benchmarks.common import add_results_arg
from lantern.drafter.model import load_drafter
from lantern.rules.acceptance import AcceptanceRule
from lantern.rules.divergences import tvd
from lantern.rules.output import output_distributions


def build_parser() -> ArgumentParser:
    """The options of ``python benchmarks/probe_distortion.py``."""
    ap = ArgumentParser(prog="python benchmarks/probe_distortion.py", description=__doc__.splitlines()[0])
    ap.add_argument("--num-images", type=positive_int, default=20)
    add_guidance_arg(ap, 4.0)
    ap.add_argument("--ks", default="8,32,128")
    ap.add_argument("--deltas", default="0.05,0.1,0.2,0.4")
    ap.add_argument("--seed", type=seed_int, default=0)
    add_results_arg(ap, "probe_distortion", "distortion.json")
    return ap


def recorded_pairs(model, drafter, args) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode ``args.num_images`` images with SD (γ = 4) and record (p, q) of the first draft of
    every step -> (p (P, V), q (P, V))."""
    pairs = []
    accept = chain.accept  # the chain decoder looks accept up in its own module

    def recording_accept(p, q, drafts, *rest, **kw):
        if q is not None:
            pairs.append((p[:, 0].clone(), q[:, 0].clone()))
        return accept(p, q, drafts, *rest, **kw)

    chain.accept = recording_accept
    try:
        conditions = [i % 10 for i in range(args.num_images)]
        decoding.decode(
            model,
            conditions,
            decoding.DecodeConfig.of("sd", gamma=4),
            SamplingConfig(guidance=args.cfg),
            drafter=drafter,
            seed=args.seed,
            progress=True,
        )
    finally:
        chain.accept = accept
    return torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs])


def tvd_row(what: str, t: torch.Tensor, k: int = 0, delta: float = 0.0) -> dict:
    """Mean, median and max of the per-position TVDs ``t``."""
    return {
        "k": k,
        "delta": delta,
        "what": what,
        "mean": float(t.mean()),
        "median": float(t.median()),
        "max": float(t.max()),
    }


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    ks, deltas = int_list(args.ks, "--ks", 1, 1023), float_list(args.deltas, "--deltas", 0.0, 1.0)
    SamplingConfig(guidance=args.cfg)  # one-line error for a bad --cfg before any work
    out = check_out_file(args.out)

    model = load_model("embedded", device="cpu")
    check_count(
        args.num_images,
        model.num_tokens * 2 * 4 * model.vocab_size,
        "--num-images",
        "the recorded (p, q) pairs (two distributions a token)",
    )
    drafter = load_drafter(model)
    p, q = recorded_pairs(model, drafter, args)
    table = decoding.neighbour_table(model, decoding.DecodeConfig.of("lantern", k=max(ks)))
    rows = [tvd_row("TVD(q, p)", tvd(q, p))]
    rules = [AcceptanceRule("lantern", k=k, delta=d) for k in ks for d in deltas]
    for rule, emitted in zip(rules, output_distributions(p, q, table, rules)):
        rows.append(tvd_row("TVD(out, p)", tvd(emitted, p), rule.k, rule.delta))
    print(f"embedded, {p.shape[0]} positions (first draft of each SD step), cfg {args.cfg}, temperature 1")
    for r in rows:
        print(
            f"{r['what']:12s} k={r['k']:4d} δ={r['delta']:.2f}: mean {r['mean']:.3f}  median {r['median']:.3f}  "
            f"max {r['max']:.3f}"
        )
    write_json(
        {
            "model": "embedded",
            "positions": int(p.shape[0]),
            "cfg": args.cfg,
            "temperature": 1.0,
            "num_images": args.num_images,
            "seed": args.seed,
            "rows": rows,
        },
        out,
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
