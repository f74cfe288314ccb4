"""Where one relaxed verification step puts the mass it moves: drafts sampled from q against a tree's top-m.

Not a test. TVD(out, p) says how far one LANTERN step's output moves from the target's p, not
where the moved mass goes; the target's NLL of the samples depends on that. On the (p, q) pairs
of ``--num-images`` AR samples (:func:`lantern.distortion.real_pairs`, temperature 1, ``--cfg``,
``--top-k``) this computes, exactly, the distribution ``out`` of the first token one step emits

* with a draft sampled from q and accepted with ``min(1, p̃/q)`` (chains, EAGLE-1 static trees:
  :func:`lantern.rules.output.output_distributions`), and
* at a dynamic-tree node whose children are the drafter's top ``--siblings`` tokens judged as
  point masses, ``min(1, p̃)`` (EAGLE-2, the paper's decoder:
  :func:`lantern.distortion.sibling_output_distribution`),

plus the drafter's q itself as a reference, each at every ``--ks`` x ``--deltas``, and reports per
position, as means with 95 % image-bootstrap intervals:

* ``tvd``: TVD(out, p) (probability);
* ``out_of_support``: out's mass on tokens the filtered target gives probability 0 (probability);
* ``excess_nll``: ``E_out[-log p | p > 0] - H(p)`` in nats, the target's surprise at the emitted
  token beyond its own entropy (0 for out = p; positive when the mass goes to tokens the target
  finds unlikely, negative when it goes to its likely ones).

    python benchmarks/probe_emitted_tokens.py --model embedded-16 --num-images 4   # ~10 min on 1 core
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from ambiguity.cli import (
    ArgumentParser,
    add_guidance_arg,
    add_model_args,
    add_out_arg,
    add_threads_arg,
    check_out_file,
    cli_main,
    device_from_args,
    float_list,
    int_list,
    nonneg_int,
    positive_int,
    set_threads,
)
from ambiguity.io import write_table
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig
from ambiguity.stats import bootstrap_mean_ci, entropy
from lantern.distortion import real_pairs, sibling_output_distribution
from lantern.drafter.model import load_drafter
from lantern.engine.decode import DecodeConfig, decode, neighbour_table
from lantern.rules.acceptance import AcceptanceRule
from lantern.rules.divergences import tvd
from lantern.rules.output import output_distributions

OUT = Path(__file__).resolve().parents[1] / "runs" / "benchmarks" / "probe_emitted_tokens" / "emitted_tokens.csv"


def emitted_stats(out: torch.Tensor, p: torch.Tensor) -> dict:
    """Per position (P,) float64: ``tvd``, ``out_of_support`` and ``excess_nll`` (module docstring)
    of out (P, V) against p (P, V), both probabilities."""
    support = p > 0
    inside = torch.where(support, out, torch.zeros_like(out))
    mass = inside.sum(-1)
    nll = torch.where(support, -torch.log(torch.where(support, p, torch.ones_like(p))), torch.zeros_like(p))
    surprise = (inside * nll).sum(-1) / mass.clamp_min(1e-30)
    return {
        "tvd": tvd(out, p).double(),
        "out_of_support": (1.0 - mass).clamp_min(0.0).double(),
        "excess_nll": (surprise - entropy(p)).double(),
    }


def parse_args(argv=None):
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap, "embedded-16")
    ap.add_argument("--drafter", default=None, help="drafter file (default: the shipped drafter of --model)")
    ap.add_argument("--num-images", type=positive_int, default=4, help="AR samples whose (p, q) pairs are measured")
    add_guidance_arg(ap, 3.0, "guidance scale (default: 3, the paper's)")
    ap.add_argument(
        "--top-k", type=nonneg_int, default=2000, metavar="K", help="top-k filter, 0 = none (default: 2000)"
    )
    ap.add_argument("--ks", default="1000")
    ap.add_argument("--deltas", default="0.1,0.4")
    ap.add_argument("--siblings", type=positive_int, default=10, help="tree children per node (EAGLE-2's top-k: 10)")
    ap.add_argument("--chunk", type=positive_int, default=2, help="positions per exact chain output (memory)")
    add_threads_arg(ap, 2)
    add_out_arg(ap, "results table (.csv or .parquet)", str(OUT), metavar="FILE")
    return ap.parse_args(argv)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    check_out_file(args.out, "--out")
    set_threads(args.threads)
    sampling = SamplingConfig(guidance=args.cfg, top_k=args.top_k)
    device, _ = device_from_args(args)
    model = load_model(args.model, weights=args.weights, device=device)
    ks = int_list(args.ks, "--ks", 1, model.vocab_size - 1)
    deltas = float_list(args.deltas, "--deltas", 0.0, 1.0)
    drafter = load_drafter(model, args.drafter)
    conditions = model.default_conditions(args.num_images)
    tokens = decode(model, conditions, DecodeConfig.of("ar"), sampling, seed=0).tokens
    p, q, groups = real_pairs(model, drafter, tokens, conditions, sampling, with_groups=True)
    p, q = p.double(), q.double()
    table = neighbour_table(model, DecodeConfig.of("lantern", k=max(ks)))
    rules = [AcceptanceRule("lantern", k=k, delta=d) for k in ks for d in deltas]
    per = {("drafter q", 0, 0.0): [emitted_stats(q, p)]}
    for i in tqdm(range(0, len(p), args.chunk), desc="positions", unit="chunk"):
        pi, qi = p[i : i + args.chunk], q[i : i + args.chunk]
        top = qi.topk(args.siblings, dim=-1).indices
        for rule, out in zip(rules, output_distributions(pi, qi, table, rules)):
            per.setdefault(("drafts ~ q", rule.k, rule.delta), []).append(emitted_stats(out, pi))
            tree = sibling_output_distribution(pi, top, table, rule)
            per.setdefault((f"tree top-{args.siblings}", rule.k, rule.delta), []).append(emitted_stats(tree, pi))
    rows = []
    for (drafts, k, delta), parts in per.items():
        row = {"drafts": drafts, "k": k, "delta": delta, "positions": len(p)}
        for what in ("tvd", "out_of_support", "excess_nll"):
            v = torch.cat([part[what] for part in parts]).numpy()
            lo, hi = bootstrap_mean_ci(v, groups)
            row.update({what: float(v.mean()), f"{what}_low": lo, f"{what}_high": hi})
        rows.append(row)
    df = pd.DataFrame(rows)
    write_table(df, args.out)
    print(
        f"{model.name}: {args.num_images} AR images, {len(p)} (p, q) pairs, cfg {args.cfg:g}, top-k "
        f"{args.top_k or 'off'}; H(p) {float(entropy(p).mean()):.2f} nats; means with 95 % image-bootstrap intervals"
    )
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
