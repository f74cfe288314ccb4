"""AR, SD, EAGLE-2, LANTERN, LANTERN++, SJD, GSD and SCD on the same images: one table, one figure.

    PYTHONPATH=$PWD python benchmarks/compare_jacobi.py --model embedded --num-images 4 --rounds 2

Per method, on the same conditions and per-image seeds: tokens per target forward, τ (mean
accepted length, bonus counted), acceptance rate of reached drafts, latency speed-up over AR at
batch 1 (interleaved rounds, :mod:`lantern.timing`), the exact per-step distortion (mean
``TVD(out, p)`` of one verification: LANTERN / LANTERN++ on the (p, q) pairs of the drafter along
AR samples, :mod:`lantern.distortion`; GSD on the (p, q) pairs its own decodes judged,
:func:`lantern.jacobi.gsd_output_distribution`; 0 for the lossless methods) and the acceptance
rate by the target's top-1 probability (:func:`lantern.replay.ambiguity_bins`). Writes
``benchmarks/results/compare_jacobi_<model>.{csv,md}`` and ``figures/compare_jacobi_<model>.{png,pdf}``.
Wall-clock numbers depend on the machine (and its load); the ratios are what to read.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from ambiguity import plots  # noqa: E402
from ambiguity.conditions import generation_conditions  # noqa: E402
from ambiguity.models.registry import get_spec, load_model  # noqa: E402
from ambiguity.sampling import SamplingConfig, default_guidance  # noqa: E402
from ambiguity.seeding import image_generator  # noqa: E402
from lantern.acceptance import AcceptanceRule, output_distribution  # noqa: E402
from lantern.decoding import DecodeConfig, decode, neighbour_table  # noqa: E402
from lantern.distortion import real_pairs  # noqa: E402
from lantern.divergences import tvd  # noqa: E402
from lantern.drafter import load_drafter  # noqa: E402
from lantern.jacobi import gsd_output_distribution, jacobi_decode  # noqa: E402
from lantern.replay import ambiguity_bins  # noqa: E402
from lantern.timing import interleaved_timing, speedup_table  # noqa: E402
from lantern.trees import TreeSpec  # noqa: E402

RULE = AcceptanceRule()


def configs() -> dict:
    """The compared methods at the toolkit's defaults (LANTERN k, δ; LANTERN++ λ; official Jacobi knobs)."""
    return {
        "ar": DecodeConfig.of("ar"),
        "sd": DecodeConfig.of("sd", gamma=4),
        "eagle-2": DecodeConfig.of("sd", tree=TreeSpec()),
        "lantern": DecodeConfig.of("lantern", gamma=4, k=RULE.k, delta=RULE.delta),
        "lantern++": DecodeConfig.of("lantern++", gamma=4, k=RULE.k, lam=RULE.lam),
        "sjd": DecodeConfig.of("sjd"),
        "gsd": DecodeConfig.of("gsd"),
        "scd": DecodeConfig.of("scd"),
    }


def gsd_distortion(model, conditions, sampling, config, seed) -> float:
    """Mean exact TVD(out, p) of one GSD verification over the (p, q) pairs its decodes judged."""
    vals = []
    for i, c in enumerate(conditions):
        pairs = []
        jacobi_decode(
            model,
            model.make_prompt([c], guided=sampling.guided),
            sampling,
            config,
            image_generator(seed, i, model.device),
            pairs=pairs,
        )
        p = torch.stack([a for a, _ in pairs]).double()
        q = torch.stack([b for _, b in pairs]).double()
        out = gsd_output_distribution(p, q, config.group, config.prob_gap)
        vals.append(tvd(out, p))
    return float(torch.cat(vals).mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--num-images", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cfg", type=float, default=None)
    ap.add_argument("--only", default=None, help="comma-separated subset of methods (ar always included)")
    args = ap.parse_args(argv)
    model = load_model(args.model)
    kind = get_spec(args.model).kind
    sampling = SamplingConfig(guidance=args.cfg if args.cfg is not None else default_guidance(kind), temperature=1.0)
    conditions = generation_conditions(model, args.num_images, args.seed, None, None)
    cfgs = configs()
    if args.only:
        keep = {"ar", *args.only.split(",")}
        cfgs = {k: v for k, v in cfgs.items() if k in keep}
    drafter = load_drafter(model, None)
    timing = interleaved_timing(
        model, cfgs, sampling, conditions, [(0, len(conditions))] * args.rounds, drafter, seed=args.seed, progress=True
    )
    speed = speedup_table(timing).set_index("config")
    rows, bins = [], []
    nb = neighbour_table(model, cfgs["lantern"]) if "lantern" in cfgs else None
    ar_tokens = None
    for name, c in cfgs.items():
        d = decode(model, conditions, c, sampling, drafter if c.speculative else None, seed=args.seed)
        if name == "ar":
            ar_tokens = d.tokens
        s = d.summary()
        _, drafts, _ = d.frames()
        if len(drafts):
            bins.append(ambiguity_bins(drafts, "p_top1", np.linspace(0, 1, 11)).assign(method=name))
        rows.append(
            {
                "method": name,
                "tokens_per_forward": s["tokens_per_forward"],
                "tau": s["tau"],
                "acceptance_rate": s["acceptance_rate"],
                "speedup": speed.loc[name, "speedup"],
                "ms_per_image": speed.loc[name, "ms_per_image"],
            }
        )
    table = pd.DataFrame(rows).set_index("method")
    table["distortion_tvd"] = 0.0
    if nb is not None and ar_tokens is not None:
        p, q = real_pairs(model, drafter, ar_tokens, conditions, sampling)
        for name, method, kw in (
            ("lantern", "lantern", dict(delta=RULE.delta)),
            ("lantern++", "lantern++", dict(lam=RULE.lam)),
        ):
            if name in table.index:
                rule = AcceptanceRule(method, k=RULE.k, **kw)
                n = max(1, (1 << 28) // (24 * p.shape[-1] * RULE.k))  # positions per chunk: ~256 MB working set
                t = torch.cat(
                    [
                        tvd(output_distribution(p[i : i + n], q[i : i + n], nb[:, : RULE.k].cpu(), rule), p[i : i + n])
                        for i in range(0, len(p), n)
                    ]
                )
                table.loc[name, "distortion_tvd"] = float(t.mean())
    if "gsd" in cfgs:
        table.loc["gsd", "distortion_tvd"] = gsd_distortion(model, conditions, sampling, cfgs["gsd"].jacobi, args.seed)
    out = Path("benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / f"compare_jacobi_{args.model}.csv")
    md = table.to_markdown(floatfmt=".3g")
    (out / f"compare_jacobi_{args.model}.md").write_text(
        f"{args.model}: {len(conditions)} images x {args.rounds} interleaved rounds, cfg {sampling.guidance}, "
        f"temperature 1, batch 1, shared 2-core CPU\n\n{md}\n"
    )
    print(md)
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    x = np.arange(len(table))
    ax[0].bar(x - 0.2, table["tokens_per_forward"], 0.4, label="tokens / target forward")
    ax[0].bar(x + 0.2, table["speedup"], 0.4, label="latency speed-up (batch 1)")
    ax[0].set_xticks(x, table.index, rotation=30)
    ax[0].axhline(1, color="k", lw=0.5)
    ax[0].legend(frameon=False)
    ax[0].set_title(f"{args.model}: speed")
    if bins:
        b = pd.concat(bins)
        for name, g in b.groupby("method", sort=False):
            g = g[g["drafts"] >= 20]
            ax[1].plot(g["mid"], g["acceptance_rate"], marker="o", label=name)
    ax[1].set_xlabel("target top-1 probability")
    ax[1].set_ylabel("acceptance rate of reached drafts")
    ax[1].legend(frameon=False, fontsize=8)
    ax[1].set_title("acceptance vs ambiguity")
    fig.tight_layout()
    plots.save_figure(fig, Path("figures") / f"compare_jacobi_{args.model}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
