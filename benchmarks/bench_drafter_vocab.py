"""The drafter with a draft vocabulary (EAGLE-3's frequent-token head) against the full head.

    python benchmarks/bench_drafter_vocab.py --models embedded,embedded-16 \\
        --out benchmarks/results/drafter_vocab.csv

For each model and draft-vocabulary size V_d (``--sizes``; default 256, 512, 768 for ``embedded`` and
512, 1024, 2048, 4096, 8192 for ``embedded-16``) and the full head (``draft_vocab`` = V):

* ``coverage_select`` / ``coverage``: the target's mass on the V_d codes chosen from
  ``--select-images`` self-generated images (seed 0, :func:`lantern.drafter.vocab.code_mass`, what
  ``python -m lantern.drafter.vocab`` does), over those images and over ``--eval-images`` held-out
  ones (seed 1);
* ``top1`` .. ``top3``: teacher-forced drafter accuracy on the held-out images' conditional rows
  (the target's top-1 among the drafter's top-k, the drafter's logits -inf outside the draft
  vocabulary; :func:`lantern.drafter.objective.topk_accuracy`);
* ``tau`` / ``acceptance_rate``: LANTERN chains (γ 4, δ 0.1, k = 1000 scaled to the vocabulary as
  ``V * 1000 / 16384``) over ``--tau-images`` images decoded at batch ``--tau-batch``;
* ``s_per_image``, ``drafter_s_per_image``: latency per image at B = 1, one thread; every round
  decodes ``--images`` new images (their own streams and classes, the same for every decoder of
  the round) with AR and every chain drafter in a fresh random order (interleaved); ``ratio_vs_ar``
  is the median over rounds of (chain / AR of the same round) with its quartiles. The AR row has
  ``draft_vocab`` 0.

Sampling is the paper's: CFG 3, temperature 1, top-k 2000 scaled as ``V * 2000 / 16384``. The machine
may be shared: compare the ratios of one run, not absolute seconds across runs.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.common

from ambiguity.cli import ArgumentParser, add_threads_arg, cli_main, int_list, positive_int, set_threads
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig
from benchmarks.common import add_results_arg
from lantern.drafter.data import self_generate, teacher_forced_rows, training_inputs
from lantern.drafter.model import load_drafter
from lantern.drafter.objective import topk_accuracy
from lantern.drafter.vocab import check_size, code_mass, coverage, restrict_logits, select_draft_vocab
from lantern.engine.decode import DecodeConfig, decode, neighbour_table

SIZES = {"embedded": [256, 512, 768], "embedded-16": [512, 1024, 2048, 4096, 8192]}


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python benchmarks/bench_drafter_vocab.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="embedded,embedded-16", help="comma-separated (default: %(default)s)")
    ap.add_argument(
        "--sizes", type=int_list, default=None, metavar="LIST", help="V_d sizes for every model (default: per model)"
    )
    ap.add_argument("--select-images", type=positive_int, default=256, help="images the vocab is chosen from")
    ap.add_argument("--eval-images", type=positive_int, default=64, help="held-out images: coverage, accuracy")
    ap.add_argument("--tau-images", type=positive_int, default=64, help="images decoded for tau and acceptance")
    ap.add_argument("--tau-batch", type=positive_int, default=16, help="batch of the tau decodes (default 16)")
    ap.add_argument("--rounds", type=positive_int, default=6, help="interleaved latency rounds (default 6)")
    ap.add_argument("--images", type=positive_int, default=2, help="images per timed decode (default 2)")
    add_threads_arg(ap)
    add_results_arg(ap, "bench_drafter_vocab", "drafter_vocab.csv", "results CSV")
    return ap


def paper_sampling(V: int) -> tuple[SamplingConfig, DecodeConfig]:
    """CFG 3, temperature 1, top-k 2000 and LANTERN k 1000 (both scaled to V / 16384), δ 0.1, γ 4."""
    sampling = SamplingConfig(guidance=3.0, temperature=1.0, top_k=max(1, round(V * 2000 / 16384)))
    return sampling, DecodeConfig.of("lantern", 4, k=max(1, round(V * 1000 / 16384)), delta=0.1)


@torch.no_grad()
def accuracy(model, drafter, tokens, labels, vocabs: dict) -> dict:
    """Teacher-forced top-1/2/3 of ``drafter`` on the conditional rows of ``tokens`` for each draft
    vocabulary (None: the full head) -> {size: {"top1": ..}}."""
    out = {size: np.zeros(3) for size in vocabs}
    for i in range(0, tokens.shape[0], 16):
        toks, hidden, _ = teacher_forced_rows(
            model, tokens[i : i + 16], labels[i : i + 16], torch.zeros(len(labels[i : i + 16]), dtype=torch.bool)
        )
        tok_in, feat_in, feat_tgt = training_inputs(toks, hidden)
        dl = drafter.logits(model, drafter(model, tok_in, feat_in, None, 0))
        tl = model.head(feat_tgt.to(model.dtype))
        for size, vocab in vocabs.items():
            acc = topk_accuracy(restrict_logits(dl, vocab), tl)
            out[size] += np.array([acc["top1"], acc["top2"], acc["top3"]]) * toks[:, 1:].numel()
    n = tokens.shape[0] * (tokens.shape[1] - 1)
    return {size: dict(zip(("top1", "top2", "top3"), v / n)) for size, v in out.items()}


def vocab_quality(model, drafter, sizes: list[int], args) -> tuple[dict, list[dict]]:
    """Choose each size's vocabulary; its coverage and accuracy -> (vocabs by size, rows)."""
    V = model.vocab_size
    sampling, _ = paper_sampling(V)
    sel = self_generate(model, args.select_images, sampling, batch_size=16, seed=0, progress=False)
    ev = self_generate(model, args.eval_images, sampling, batch_size=16, seed=1, progress=False)
    mass_sel = code_mass(model, sel.tokens, sel.conditions, sampling)
    mass_ev = code_mass(model, ev.tokens, ev.conditions, sampling)
    vocabs = {V: None, **{s: select_draft_vocab(mass_sel, s) for s in sizes}}
    acc = accuracy(model, drafter, ev.tokens, ev.conditions, vocabs)
    rows = []
    for size, vocab in vocabs.items():
        full = torch.arange(V) if vocab is None else vocab
        rows.append(
            dict(
                model=model.name,
                vocab_size=V,
                draft_vocab=size,
                coverage_select=coverage(mass_sel, full),
                coverage=coverage(mass_ev, full),
                **acc[size],
            )
        )
    return vocabs, rows


def with_vocab(drafter, vocab):
    """``drafter`` restricted to ``vocab`` (None: the full head); the drafter is shared, so set before use."""
    drafter.set_draft_vocab(vocab)
    return drafter


def acceptance(model, drafter, vocabs: dict, table, args) -> dict:
    """tau and acceptance rate of LANTERN chains per draft vocabulary, batched decodes."""
    sampling, config = paper_sampling(model.vocab_size)
    labels = [i % 10 for i in range(args.tau_images)]
    out = {}
    for size, vocab in vocabs.items():
        res = decode(
            model, labels, config, sampling, with_vocab(drafter, vocab), table, seed=5, batch_size=args.tau_batch
        )
        s = res.summary()
        out[size] = dict(tau=s["tau"], acceptance_rate=s["acceptance_rate"])
    return out


def latency(model, drafter, vocabs: dict, table, args) -> list[dict]:
    """Seconds per image at B = 1 of AR (key 0) and the chain per vocabulary, interleaved rounds."""
    sampling, config = paper_sampling(model.vocab_size)
    ar = DecodeConfig.of("ar")

    def run(size, r):  # round r decodes images r * n .. r * n + n - 1 (their own streams and classes)
        first = (r + 1) * args.images
        labels = [i % 10 for i in range(first, first + args.images)]
        if size == 0:
            return decode(model, labels, ar, sampling, seed=3, first_index=first)
        return decode(
            model, labels, config, sampling, with_vocab(drafter, vocabs[size]), table, seed=3, first_index=first
        )

    keys = [0, *vocabs]
    for key in keys:  # warm-up
        run(key, -1)
    rows = []
    for r in range(args.rounds):
        random.Random(r).shuffle(keys)
        for key in keys:
            t0 = time.perf_counter()
            res = run(key, r)
            s = res.summary()
            rows.append(
                dict(
                    draft_vocab=key,
                    round=r,
                    s_per_image=(time.perf_counter() - t0) / args.images,
                    drafter_s_per_image=s["drafter_s_per_image"],
                )
            )
        print(f"{model.name}: round {r + 1}/{args.rounds}", file=sys.stderr)
    return rows


def latency_table(rows: list[dict]) -> pd.DataFrame:
    """Per draft vocabulary: median seconds per image, drafter seconds, ratio to AR of the same round."""
    df = pd.DataFrame(rows)
    ar = df[df.draft_vocab == 0].set_index("round")["s_per_image"]
    df["ratio_vs_ar"] = df["s_per_image"] / df["round"].map(ar)
    return df.groupby("draft_vocab").agg(
        s_per_image=("s_per_image", "median"),
        drafter_s_per_image=("drafter_s_per_image", "median"),
        ratio_vs_ar=("ratio_vs_ar", "median"),
        ratio_q25=("ratio_vs_ar", lambda x: np.quantile(x, 0.25)),
        ratio_q75=("ratio_vs_ar", lambda x: np.quantile(x, 0.75)),
    )


def measure(name: str, sizes: list[int] | None, args) -> pd.DataFrame:
    """Every measurement of one model -> its rows (one per draft vocabulary, AR last)."""
    model = load_model(name)
    drafter = load_drafter(model)
    drafter.set_draft_vocab(None)  # the full head: a shipped draft vocabulary is one of the sizes
    sizes = [check_size(s, model.vocab_size, "--sizes") for s in (sizes or SIZES.get(name, [512]))]
    vocabs, rows = vocab_quality(model, drafter, sizes, args)
    _, config = paper_sampling(model.vocab_size)
    table = neighbour_table(model, config)
    acc = acceptance(model, drafter, vocabs, table, args)
    lat = latency_table(latency(model, drafter, vocabs, table, args))
    df = pd.DataFrame([{**row, **acc[row["draft_vocab"]]} for row in rows] + [dict(model=name, draft_vocab=0)])
    df["vocab_size"] = model.vocab_size
    return df.merge(lat.reset_index(), on="draft_vocab", how="left")


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    set_threads(args.threads or 1)
    df = pd.concat([measure(name, args.sizes, args) for name in args.models.split(",")], ignore_index=True)
    print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
