"""Cost of LANTERN's acceptance against the forwards it sits between, at LlamaGen-XL shapes.

One run measures, side by side on the same device (median wall-clock of ``--repeats`` runs,
``torch.cuda.synchronize`` around each on CUDA):

* **target forward** — the verification forward of speculative decoding: LlamaGen GPT-XL
  c2i 256 px (1280 hidden, 36 layers, 16384 codes; random weights) appends the last token and
  γ draft tokens for 2 rows (classifier-free guidance) at image position ``--position`` with the
  KV cache, then rolls back;
* **drafter forward** — one EAGLE drafter step (``fc`` + one GPT-XL layer + the frozen
  16384-way head, 2 rows), and the whole chain of γ steps with ``q`` and sampling;
* **p from logits** — CFG, temperature, softmax of the verification logits;
* **build A** — :func:`lantern.rules.acceptance.relaxed_mass`: the proximity sets
  ``A_{k,δ}`` of the γ drafts (k = 1000, δ = 0.4): gather + cumsum over ``B_k``;
* **accept** — :func:`lantern.rules.acceptance.judge` (builds A and decides) plus the residual of
  the first rejected position (:func:`lantern.rules.acceptance.residual`);
* once: the exact k-NN table ``B_1000`` of a 16384 x 8 codebook (FAISS), cached in practice.

LANTERN (Jang et al., ICLR 2025, App.) reports building A 9.1x cheaper than a target forward.
Prints a table with the ratios and writes ``--out`` (default
``runs/benchmarks/bench_acceptance/acceptance.json``; the committed results:
``--out benchmarks/results/acceptance.json``).

    python benchmarks/bench_acceptance.py [--device auto] [--gamma 4] [--k 1000] [--delta 0.4]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.common

from ambiguity.cli import (
    ArgumentParser,
    add_device_args,
    check_out_file,
    cli_main,
    finite_float,
    nonneg_int,
    positive_int,
)
from ambiguity.errors import UsageError
from ambiguity.io import write_json
from ambiguity.models.gpt import GPT
from ambiguity.models.llamagen import LlamaGenModel, official_gpt_config
from ambiguity.neighbourhood import build_neighbourhoods
from ambiguity.sampling import SamplingConfig, distribution, expand_rows
from benchmarks.common import add_results_arg, threads_and_device
from lantern.drafter.model import Drafter
from lantern.engine.slots import verify_chains
from lantern.rules.acceptance import AcceptanceRule, judge, relaxed_mass, residual


def timed(fn, device, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    sync = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def build_parser() -> ArgumentParser:
    """The options of ``python benchmarks/bench_acceptance.py``."""
    ap = ArgumentParser(prog="python benchmarks/bench_acceptance.py", description=__doc__.splitlines()[0])
    add_device_args(ap, threads=2)
    ap.add_argument("--gamma", type=positive_int, default=4)
    ap.add_argument("--k", type=positive_int, default=1000, help="neighbourhood size, < 16384")
    ap.add_argument("--delta", type=finite_float, default=0.4)
    ap.add_argument("--position", type=nonneg_int, default=128, help="image tokens already in the KV cache")
    ap.add_argument("--repeats", type=positive_int, default=5)
    add_results_arg(ap, "bench_acceptance", "acceptance.json")
    return ap


def random_xl_target(device: torch.device, dtype: torch.dtype):
    """LlamaGen GPT-XL c2i 256 with random weights (a shaped head) and its EAGLE drafter ->
    (GPT config, target, drafter, seconds to build them)."""
    t0 = time.perf_counter()
    config = official_gpt_config("GPT-XL", "c2i", 256)
    gpt = GPT(config)
    torch.nn.init.normal_(gpt.output.weight, 0.0, 0.02)  # the official init zeroes the head: give p some shape
    model = LlamaGenModel(gpt.to(device, dtype).eval(), name="llamagen-c2i-xl-random")
    drafter = Drafter.for_target(model, seed=0).eval()
    return config, model, drafter, time.perf_counter() - t0


@torch.no_grad()
def time_forwards(
    model, drafter, sampling: SamplingConfig, args, device, dtype
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Seconds of the verification forward (γ + 1 tokens, 2 CFG rows, at ``args.position``), one
    drafter step and a chain of γ steps, and of p from the logits -> (seconds, the verification's
    logits, the γ random drafts)."""
    g, rows, V = args.gamma, 2, model.vocab_size
    prompt = model.make_prompt([207], guided=True)
    cache = model.new_slots_cache(1, True, model.num_tokens)
    model.prefill_slots(cache, torch.arange(rows, device=device), prompt)
    ctx = torch.randint(0, V, (1, args.position + 1), device=device)
    if args.position:  # the image so far, at slots 0 .. position - 1
        at = torch.arange(args.position, device=device)
        causal = (at[None, :] <= at[:, None])[None].expand(rows, -1, -1)
        where = at[None].expand(rows, -1)
        model.extend_slots(cache, expand_rows(ctx[:, :-1], True), where, where, causal)
    drafts = torch.randint(0, V, (1, g), device=device)
    chain = torch.cat([ctx[:, -1:], drafts], 1)  # the last committed token, then the drafts
    n = np.array([args.position + 1])

    def target_forward():  # the engine's verification forward (its slots past n are never seen again)
        return verify_chains(model, cache, chain, n, model.num_tokens, True)

    logits = target_forward().logits
    seconds = {"target_forward": timed(target_forward, device, args.repeats)}
    dcache = drafter.new_cache(rows)
    feats = torch.randn(rows, args.position + 1, model.hidden_size, device=device, dtype=dtype)
    toks = expand_rows(ctx, True)
    drafter(model, toks[:, :-1], feats[:, :-1], dcache, 0)

    def drafter_step():
        f = drafter(model, toks[:, -1:], feats[:, -1:], dcache, args.position)
        return drafter.logits(model, f)

    seconds["drafter_forward"] = timed(drafter_step, device, args.repeats)

    def drafter_chain():  # γ drafter steps of one image (the drafter's batch-1 forward, its own features)
        f = drafter(model, toks[:, -1:], feats[:, -1:], dcache, args.position)[:, -1:]
        for j in range(g):
            q = distribution(drafter.logits(model, f)[:, -1], sampling, True)
            x = q.argmax(-1)
            if j + 1 < g:
                f = drafter(model, expand_rows(x, True)[:, None], f, dcache, args.position + 1 + j)

    seconds["drafter_chain"] = timed(drafter_chain, device, args.repeats)
    seconds["p_from_logits"] = timed(lambda: distribution(logits, sampling, True), device, args.repeats * 4)
    return seconds, logits, drafts


@torch.no_grad()
def time_acceptance(p, q, drafts, u, rule: AcceptanceRule, args, device) -> dict:
    """Seconds of building A (:func:`relaxed_mass`), of LANTERN's and SD's acceptance with the
    residual of the first rejected position, and of the k-NN table of a 16384 x 8 codebook (once)."""
    g = args.gamma
    codebook = torch.nn.functional.normalize(torch.randn(p.shape[-1], 8), dim=-1)
    t1 = time.perf_counter()
    table = build_neighbourhoods(codebook, args.k, "l2", cache=False).indices.to(device)
    t_table = time.perf_counter() - t1
    t_build = timed(lambda: relaxed_mass(p, drafts, table, rule), device, args.repeats * 4)

    def decide():
        v = judge(p, q, drafts, u, table, rule)
        n = int(v.accepted.long().cumprod(-1).sum(-1)[0])
        at = min(n, g - 1)
        return residual(p[:, at], q[:, at], drafts[:, at], table, rule)

    t_accept = timed(decide, device, args.repeats * 4)
    sd = AcceptanceRule("sd")
    t_accept_sd = timed(lambda: judge(p, q, drafts, u, None, sd), device, args.repeats * 4)
    return {"build_A": t_build, "accept_lantern": t_accept, "accept_sd": t_accept_sd, "neighbour_table_once": t_table}


def ratios(s: dict) -> dict:
    """The ratios the paper and the goal speak of, from the seconds of both timings."""
    return {
        "target_forward / build_A": s["target_forward"] / s["build_A"],
        "target_forward / accept_lantern": s["target_forward"] / s["accept_lantern"],
        "drafter_forward / build_A": s["drafter_forward"] / s["build_A"],
        "drafter_chain / accept_lantern": s["drafter_chain"] / s["accept_lantern"],
        "accept_lantern / accept_sd": s["accept_lantern"] / s["accept_sd"],
    }


def print_report(result: dict, args, device, out: Path) -> None:
    """The table of milliseconds per operation and the ratios."""
    t_target = result["seconds"]["target_forward"]
    print(
        f"{result['target']}, {device} {result['dtype']}, {args.threads} threads; γ={args.gamma}, k={args.k}, "
        f"δ={args.delta}, 2 CFG rows, {args.position} image tokens in the cache"
    )
    print(f"{'operation':<34}{'ms':>10}{'target / op':>14}")
    for name, s in result["seconds"].items():
        if name == "model_build":
            continue
        print(f"{name:<34}{1e3 * s:>10.3f}{t_target / s:>14.1f}")
    for name, r in result["ratios"].items():
        print(f"{name:<40}{r:>10.1f}x")
    print(f"wrote {out}")


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    check_out_file(args.out)
    rule = AcceptanceRule("lantern", k=args.k, delta=args.delta)
    if args.k >= 16384 or args.position + args.gamma + 1 > 256:
        raise UsageError("--k must be < 16384 and --position + --gamma + 1 <= 256 (a 16 x 16 LlamaGen grid)")
    device, dtype = threads_and_device(args)
    g = args.gamma
    torch.manual_seed(0)
    config, model, drafter, build_s = random_xl_target(device, dtype)
    sampling = SamplingConfig(guidance=4.0, temperature=1.0)
    V = model.vocab_size
    seconds, logits, drafts = time_forwards(model, drafter, sampling, args, device, dtype)
    p = distribution(logits, sampling, True)[:, :g]
    q = torch.softmax(torch.randn(1, g, V, device=device), -1)
    u = torch.rand(1, g, device=device)
    acceptance = time_acceptance(p, q, drafts, u, rule, args, device)
    seconds = {
        **{k: seconds[k] for k in ("target_forward", "drafter_forward", "drafter_chain", "p_from_logits")},
        **{k: acceptance[k] for k in ("build_A", "accept_lantern", "accept_sd", "neighbour_table_once")},
        "model_build": build_s,
    }
    result = {
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "threads": args.threads,
        "target": "LlamaGen GPT-XL c2i 256 (random weights)",
        "hidden": config.dim,
        "layers": config.n_layer,
        "vocab": V,
        "gamma": g,
        "k": args.k,
        "delta": args.delta,
        "rows": 2,
        "position": args.position,
        "seconds": seconds,
        "ratios": ratios(seconds),
        "paper": "LANTERN App.: building A 9.1x cheaper than a target forward (LlamaGen-XL); goal here >= 100x",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(result, out)
    print_report(result, args, device, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
