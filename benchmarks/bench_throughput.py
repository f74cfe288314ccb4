"""Throughput of batched decoding: images per second of AR, SD, LANTERN (chains, trees) and SJD / GSD / SCD at batch B.

    python benchmarks/bench_throughput.py --models embedded,embedded-16 --batch-sizes 1,8,32,64 --repeats 3
    python benchmarks/bench_throughput.py --models embedded --methods ar,lantern --batch-sizes 1,8,32 --compile
    python benchmarks/bench_throughput.py --quick

Sampling is the paper's (LANTERN, arXiv 2410.03355, Sec. 5): CFG 3 (image models; text models:
their default guidance), temperature 1, top-k 2000 of LlamaGen's 16384 codes mapped to the model's
codebook (:func:`lantern.paper.config.map_to_codebook`; none for text models), LANTERN k = 1000
mapped (``--k``) and δ = 0.1. ``ar-compiled`` is AR with ``torch.compile`` (a compiled copy of
the model, :func:`lantern.engine.decode.compile_forwards`); ``sd-auto`` / ``lantern-auto`` are the
chains with ``gamma="auto"`` (the engine's draft-length policy, :mod:`lantern.engine.policy`, up
to ``--gamma-max``) next to the fixed ``--gamma``; their cost model is measured (or read from its
cache) for every batch size before the timed cells. ``--quick``: a smoke run (embedded, B 1 and 8,
AR, LANTERN fixed and auto, two images a cell, one repeat).

Every (model, method, B) cell decodes ``max(--images, 2 B)`` images with
:func:`lantern.engine.decode.decode` ``(batch_size=B)`` (continuous batching, so the last images of a
cell run in a draining batch, as a real run's last batch does) and records images / wall second.
The ``profile`` method times ``ambiguity.profile.profile_model`` on the same images and batch (AR
sampling plus its statistics: the profiler's cost per image). Cells run interleaved: every
repeat visits all cells in a fresh random order (seeded), after one warm-up decode per model and
method; the table reports the median over repeats and the spread (min, max). Tree rows:
``lantern-static`` (EAGLE-1 static tree ``--static-tree``) and ``lantern-dynamic`` /
``sd-dynamic`` (EAGLE-2 dynamic tree ``--total-tokens``, ``--depth``, ``--tree-top-k``;
``lantern-dynamic-auto`` with its node policy, :class:`lantern.engine.policy.NodePolicy`), batched
like the chains (:mod:`lantern.engine.loop`). ``--methods`` also takes ``sjd``, ``gsd``, ``scd``
(batched Jacobi decoding with the official windows, no drafter:
:func:`lantern.methods.jacobi.method.Jacobi`) and ``sjd-auto``, ``gsd-auto``, ``scd-auto`` (the
window of each forward chosen by :class:`lantern.engine.policy.WindowPolicy`). A model's drafter
loads only for the drafting methods, its LANTERN neighbour table (which needs a VQ codebook) only
for the ``lantern`` ones, so ``--models text-twin --methods ar,sd`` runs. ``--device`` / ``--dtype``
as every model command (default: auto). The machine may be shared: compare ratios measured in one run, not absolute
numbers across runs.

``--compile`` adds a compiled copy of every model and drafter (:func:`lantern.engine.decode.compile_forwards`)
and times it interleaved with the eager one (column ``compiled``); its warm-up (batch 1 and 2, which
compiles every shape the timed cells meet) is reported as ``compile_s`` (the compiled warm-up's
seconds minus the eager one's), the share of images whose tokens equal the eager decode of the same
cell as ``same_tokens``, the target's seconds per image as ``target_s``, and ``vs_eager`` /
``target_vs_eager`` divide the compiled cell's images/s (target seconds) by the eager cell's.

Writes ``--out``/throughput.parquet (one row per cell and repeat) and throughput.json (medians,
spreads and the ratios: each method at B against itself at B = 1 and against AR at the same B).
The same table goes to throughput.csv. ``--out`` defaults to the untracked
``runs/benchmarks/bench_throughput``; the committed results were written with ``--out
benchmarks/results/throughput`` (``_trees``, ``_compile``; README).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.common

from ambiguity.cli import ArgumentParser, add_device_args, cli_main, finite_float, int_list, positive_int
from ambiguity.errors import UsageError
from ambiguity.models.registry import load_model
from ambiguity.profile import profile_model
from ambiguity.runs import RunOptions
from ambiguity.sampling import SamplingConfig, default_guidance
from benchmarks.common import add_results_arg, threads_and_device, torch_facts
from lantern.drafter.model import load_drafter
from lantern.engine.decode import DecodeConfig, compile_forwards, decode, neighbour_table
from lantern.methods.tree.spec import STATIC_TREES, TreeSpec
from lantern.paper.config import map_to_codebook

METHODS = (
    "ar",
    "ar-compiled",
    "sd",
    "sd-auto",
    "lantern",
    "lantern-auto",
    "lantern-static",
    "lantern-dynamic",
    "lantern-dynamic-auto",
    "sd-dynamic",
)
QUICK = dict(models="embedded", methods="ar,lantern,lantern-auto", batch_sizes="1,8", images=2, repeats=1)
JACOBI = ("sjd", "gsd", "scd", "sjd-auto", "gsd-auto", "scd-auto")  # accepted by --methods, not in the default


def config_of(method: str, args, k: int) -> DecodeConfig:
    """The DecodeConfig of a ``--methods`` entry (``profile`` times like AR's config)."""
    if method in JACOBI:  # -auto: the window policy (lantern.engine.policy.WindowPolicy)
        return DecodeConfig.of(method.removesuffix("-auto"), auto=method.endswith("-auto"))
    static = TreeSpec("static", STATIC_TREES[args.static_tree], name=args.static_tree)
    dynamic = TreeSpec("dynamic", total_tokens=args.total_tokens, depth=args.depth, top_k=args.tree_top_k)
    rule, parts = method.split("-")[0], method.split("-")[1:]
    tree = static if "static" in parts else (dynamic if "dynamic" in parts else None)
    if rule in ("ar", "profile"):
        return DecodeConfig.of("ar")
    gamma = "auto" if "auto" in parts else args.gamma  # lantern-dynamic-auto: the tree's node policy
    lantern = dict(k=k, delta=args.delta) if rule == "lantern" else {}
    return DecodeConfig.of(rule, gamma, tree=tree, gamma_max=args.gamma_max, **lantern)


def sampling_of(model) -> SamplingConfig:
    """The paper's sampling for an image model (CFG 3, temperature 1, top-k 2000 of 16384 mapped);
    a text model's default guidance, temperature 1, no filter."""
    if model.kind == "text":
        return SamplingConfig(guidance=default_guidance(model.kind), temperature=1.0)
    return SamplingConfig(guidance=3.0, temperature=1.0, top_k=map_to_codebook(2000, model.vocab_size))


def cell(model, drafter, table, method: str, config, sampling, B: int, n: int) -> dict:
    """Decode (or profile) ``n`` images at batch ``B`` once: images/s, τ (bonus counted), the target's
    seconds per image and the tokens (None for ``profile``)."""
    conditions = model.default_conditions(n)
    t0 = time.perf_counter()
    tokens, target_s = None, float("nan")
    if method == "profile":
        profile_model(model, conditions, sampling, batch_size=B, options=RunOptions(progress=False))
        tau = 1.0
    else:
        out = decode(
            model,
            conditions,
            config,
            sampling,
            drafter if config.speculative else None,
            table if config.speculative else None,
            seed=0,
            batch_size=B,
        )
        summary = out.summary()
        tau, target_s, tokens = summary["tau"], summary["target_s_per_image"], out.tokens
    seconds = time.perf_counter() - t0
    return {"images": n, "seconds": seconds, "images_per_s": n / seconds, "tau": tau, "target_s": target_s}, tokens


def add_method_args(ap) -> None:
    """The options :func:`config_of` reads: chain length, LANTERN's k and δ, the draft trees."""
    ap.add_argument("--gamma", type=positive_int, default=4, help="chain draft length (default: 4)")
    ap.add_argument("--gamma-max", type=positive_int, default=8, help="longest chain of the -auto rows (default: 8)")
    ap.add_argument(
        "--k", type=positive_int, default=None, help="LANTERN neighbourhood size (default: 1000 of 16384 codes mapped)"
    )
    ap.add_argument("--delta", type=finite_float, default=0.1, help="LANTERN TVD bound (default: 0.1)")
    ap.add_argument(
        "--static-tree",
        default="mc_sim_7b_63",
        choices=[n for n in STATIC_TREES if n != "chain"],
        help="the -static rows' EAGLE-1 tree (default: mc_sim_7b_63)",
    )
    ap.add_argument("--total-tokens", type=positive_int, default=59, help="dynamic tree: nodes incl. the root")
    ap.add_argument("--depth", type=positive_int, default=4, help="dynamic tree: expansion rounds")
    ap.add_argument("--tree-top-k", type=positive_int, default=10, help="dynamic tree: children per node")


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="bench_throughput.py", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--models", default="embedded,embedded-16", help="comma-separated registry names (default: %(default)s)"
    )
    ap.add_argument(
        "--methods",
        default="ar,ar-compiled,sd,sd-auto,lantern,lantern-auto,lantern-static,lantern-dynamic,profile",
        help="comma-separated, from: " + ", ".join((*METHODS, *JACOBI, "profile")) + " (default: %(default)s)",
    )
    ap.add_argument(
        "--batch-sizes", default="1,8,32,64", help="comma-separated images per forward (default: %(default)s)"
    )
    ap.add_argument(
        "--images", type=positive_int, default=8, help="images per cell at least (a cell takes max(this, 2B))"
    )
    ap.add_argument("--repeats", type=positive_int, default=3, help="timed repeats per cell, interleaved (default: 3)")
    add_method_args(ap)
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: " + ", ".join(f"--{k} {v}" for k, v in QUICK.items())
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also time a torch.compile-d copy of every model and drafter, interleaved with the eager one",
    )
    add_device_args(ap, threads=2, what="the models and drafters")
    add_results_arg(ap, "bench_throughput")
    return ap


def load_entry(name: str, methods: list[str], args, device, dtype, compiled: bool = False) -> tuple:
    """The registry model ``name`` on ``device`` / ``dtype`` with what ``methods`` need: (model, drafter
    or None, LANTERN's neighbour table or None, sampling, k, AR's compiled copy or None); with
    ``compiled``, the model and drafter compiled (:func:`compile_forwards`). Raises UsageError as
    the loaders do (one line, exit 2)."""
    model = load_model(name, device=device, dtype=dtype)
    k = min(args.k or map_to_codebook(1000, model.vocab_size), model.vocab_size - 1)
    configs = [config_of(m, args, k) for m in methods]
    drafter = load_drafter(model) if any(c.speculative for c in configs) else None  # not for ar / Jacobi
    if compiled:
        compile_forwards(model, drafter)  # one line, exit 2, for a model that cannot be compiled
    relaxed = any(c.rule is not None and c.rule.relaxed for c in configs)  # the lantern rows
    table = neighbour_table(model, config_of("lantern", args, k)) if relaxed else None
    arc = None
    if "ar-compiled" in methods:  # AR on a compiled copy of the model
        arc = load_model(name, device=device, dtype=dtype)
        compile_forwards(arc)
    return model, drafter, table, sampling_of(model), k, arc


def load(args, methods: list[str], sizes: list[int], device, dtype) -> tuple[dict, dict]:
    """Every model (eager, and compiled with ``--compile``) with its drafter, LANTERN table, sampling
    and k: {(name, compiled): (model, drafter, table, sampling, k, AR's compiled copy or None)}; and
    the warm-up seconds of every (name, method, compiled) (one decode of 2 images per batch size
    that compiles)."""
    loaded, warm = {}, {}
    for name in args.models.split(","):
        for compiled in (False, True) if args.compile else (False,):
            loaded[name, compiled] = load_entry(name, methods, args, device, dtype, compiled)
            for m in methods:  # warm-up (batch 1 when that is all that is asked: text-twin cannot batch)
                t0 = time.perf_counter()
                for B in sorted({1, min(2, *sizes)} if (args.compile or m == "ar-compiled") else {min(2, *sizes)}):
                    run_cell(loaded[name, compiled], m, args, B, 2)
                warm[name, m, compiled] = time.perf_counter() - t0
                if m.endswith("-auto"):  # the policy's cost model for every batch size, before the timed cells
                    measure_policy_costs(loaded[name, compiled], m, args, sizes)
    return loaded, warm


def measure_policy_costs(entry: tuple, method: str, args, sizes: list[int]) -> None:
    """Decode B images of 16 tokens at every batch size B: a ``-auto`` row's first decode at a new
    B measures (and caches) the policy's cost model there (:func:`lantern.engine.policy.cost_model`),
    which a timed cell must not pay for."""
    model, drafter, table, sampling, k, _ = entry
    config = config_of(method, args, k)
    for B in sizes:
        conditions = model.default_conditions(B)
        decode(model, conditions, config, sampling, drafter, table, batch_size=B, num_tokens=min(16, model.num_tokens))


def run_cell(entry: tuple, method: str, args, B: int, n: int) -> tuple[dict, object]:
    """:func:`cell` of ``method`` on a :func:`load` entry."""
    model, drafter, table, sampling, k, arc = entry
    target = arc if method == "ar-compiled" else model
    return cell(target, drafter, table, method, config_of(method, args, k), sampling, B, n)


def timed_rows(args, loaded: dict, methods: list[str], sizes: list[int]) -> list[dict]:
    """Every (model, method, B, compiled) cell ``--repeats`` times, interleaved in a fresh seeded
    order per repeat (the eager cells first in the first repeat): one row per cell and repeat."""
    cells = [(name, m, B, c) for name, c in loaded for m in methods for B in sizes]
    rng, eager_tokens, rows = random.Random(0), {}, []
    for r in range(args.repeats):
        rng.shuffle(cells)
        for name, m, B, compiled in sorted(cells, key=lambda c: c[3]) if r == 0 else cells:  # eager first once
            res, tokens = run_cell(loaded[name, compiled], m, args, B, max(args.images, 2 * B))
            if tokens is not None and not compiled:
                eager_tokens[name, m, B] = tokens
            same = float("nan")
            if tokens is not None and compiled:
                same = float((tokens == eager_tokens[name, m, B]).all(1).float().mean())
            row = {"model": name, "method": m, "batch_size": B, "compiled": compiled, "repeat": r}
            rows.append({**row, **res, "same_tokens": same})
            print(
                f"r{r} {name:12s} {m:12s} B={B:3d}{' compiled' if compiled else ''} {res['images_per_s']:7.2f} img/s  "
                f"τ={res['tau']:.2f}",
                flush=True,
            )
    return rows


def summarize(df: pd.DataFrame, warm: dict, compiled: bool) -> pd.DataFrame:
    """Medians and spreads per cell and the ratios to the method at B = 1 and to AR at the same B
    (with ``compiled``: the compiled cells against the eager ones too)."""
    keys = ["model", "method", "batch_size", "compiled"]
    g = df.groupby(keys)["images_per_s"]
    table = pd.DataFrame(
        {
            "median": g.median(),
            "min": g.min(),
            "max": g.max(),
            "tau": df.groupby(keys)["tau"].median(),
            "target_s": df.groupby(keys)["target_s"].median(),
        }
    ).reset_index()
    base = table[table["batch_size"] == 1].set_index(["model", "method", "compiled"])["median"]
    ar = table[table["method"] == "ar"].set_index(["model", "batch_size", "compiled"])["median"]
    table["vs_batch_1"] = [
        row.median / base.get((row.model, row.method, row.compiled), np.nan) for row in table.itertuples()
    ]
    table["vs_ar_same_batch"] = [
        row.median / ar.get((row.model, row.batch_size, row.compiled), np.nan) for row in table.itertuples()
    ]
    if compiled:
        _compiled_columns(table, df, warm)
    return table


def _compiled_columns(table: pd.DataFrame, df: pd.DataFrame, warm: dict) -> None:
    """``--compile``: vs_eager, target_vs_eager, same_tokens and compile_s of every cell, in place."""
    eager = table[~table["compiled"]].set_index(["model", "method", "batch_size"])
    at = [(row.model, row.method, row.batch_size) for row in table.itertuples()]
    table["vs_eager"] = [row.median / eager["median"].get(a, np.nan) for row, a in zip(table.itertuples(), at)]
    table["target_vs_eager"] = [
        row.target_s / eager["target_s"].get(a, np.nan) for row, a in zip(table.itertuples(), at)
    ]
    table["same_tokens"] = [
        df[(df.model == a[0]) & (df.method == a[1]) & (df.batch_size == a[2]) & (df.compiled == row.compiled)][
            "same_tokens"
        ].mean()
        for row, a in zip(table.itertuples(), at)
    ]
    table["compile_s"] = [
        warm[row.model, row.method, True] - warm[row.model, row.method, False] if row.compiled else np.nan
        for row in table.itertuples()
    ]


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    sizes = int_list(args.batch_sizes, "--batch-sizes", 1)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in (*METHODS, *JACOBI, "profile")]
    if unknown or not methods:
        raise UsageError(
            f"unknown method {unknown[0] if unknown else '(none)'!r} in --methods; "
            f"choose from {', '.join([*METHODS, *JACOBI, 'profile'])}"
        )
    device, dtype = threads_and_device(args)
    loaded, warm = load(args, methods, sizes, device, dtype)
    df = pd.DataFrame(timed_rows(args, loaded, methods, sizes))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_parquet(out / "throughput.parquet")
    table = summarize(df, warm, args.compile)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    summary = {
        "settings": vars(args),
        **torch_facts(device, dtype),
        "note": "the machine may be shared; compare ratios within this run",
        "cells": table.to_dict(orient="records"),
    }
    (out / "throughput.json").write_text(json.dumps(summary, indent=1, default=float))
    table.to_csv(out / "throughput.csv", index=False)
    print(f"wrote {out / 'throughput.parquet'}, {out / 'throughput.json'}, {out / 'throughput.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
