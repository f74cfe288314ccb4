"""Eager vs ``torch.compile``-d target forwards: milliseconds per verification forward at batch B.

    python benchmarks/bench_compile.py --model embedded --batch-sizes 1,8,32 --repeats 40
    python benchmarks/bench_compile.py --model embedded-16 --device cuda --dtype bfloat16

For every B the forward is the one batched decoding runs once per step
(:meth:`ambiguity.models.llamagen.LlamaGenModel.extend_slots`: ``B`` images, ``2 B`` rows with
CFG, ``--gamma`` + 1 tokens per row, every row at its own cache slots), on two copies of the model:
eager, and compiled with :func:`lantern.engine.decode.compile_forwards` (in-place KV writes, the natural
attended span, symbolic sizes); B = 1 is one image's forward (the models have no other cache than
the slot cache; the committed results' ``append`` rows timed the former batch-1 ``extend``). The
first compiled call of each cell is timed separately as
``compile_s``; with symbolic sizes only the first cell compiles, later cells reuse its graph (cold unless inductor's
on-disk cache already holds the graph; set ``TORCHINDUCTOR_CACHE_DIR`` to a new directory for a cold
number). Then ``--repeats`` rounds, eager and compiled interleaved, each at a new cache position
(the span of attended positions grows as in a real decode); reported: median milliseconds per
forward and the ratio eager / compiled. On CUDA every timing synchronises the device.

Writes ``--out``/compile.parquet (one row per forward timed) and compile.json (the medians).
``--out`` defaults to the untracked ``runs/benchmarks/bench_compile``; the committed results were
written with ``--out benchmarks/results/compile`` (``compile_embedded-16`` for embedded-16; README).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.common

from ambiguity.cli import ArgumentParser, add_device_args, cli_main, int_list, positive_int
from ambiguity.errors import UsageError
from ambiguity.models.registry import load_model
from benchmarks.common import add_results_arg, threads_and_device, torch_facts
from lantern.engine.decode import compile_forwards


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def slots_forward(model, B: int, T: int):
    """A callable ``f(n)``: one batched verification forward of ``B`` images (CFG rows) whose first of
    ``T`` tokens sits at image position ``n - 1`` (random tokens; the cache is preallocated once)."""
    N = model.num_tokens
    cache = model.new_slots_cache(B, True, N, T)
    dev, R = model.device, 2 * B
    ar = torch.arange(N + T, device=dev)
    gen = torch.Generator().manual_seed(0)

    def f(n: int) -> torch.Tensor:
        slots = (n - 1 + ar[:T])[None].expand(R, T)
        tokens = torch.randint(0, model.vocab_size, (R, T), generator=gen).to(dev)
        visible = ar[None, None, : n - 1 + T] <= slots[:, :, None]
        return model.extend_slots(cache, tokens, slots, slots.clamp(max=N - 1), visible).logits

    return f


@cli_main
def main(argv=None) -> int:
    ap = ArgumentParser(prog="bench_compile.py", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", help="a LlamaGen-architecture model (default: embedded)")
    ap.add_argument("--batch-sizes", default="1,8,32", help="comma-separated images per forward (default: %(default)s)")
    ap.add_argument("--gamma", type=positive_int, default=4, help="draft length: gamma + 1 tokens per forward")
    ap.add_argument("--repeats", type=positive_int, default=40, help="timed forwards per cell and variant")
    add_device_args(ap, threads=1, what="the model")
    add_results_arg(ap, "bench_compile")
    args = ap.parse_args(argv)
    sizes = int_list(args.batch_sizes, "--batch-sizes", 1)
    device, dtype = threads_and_device(args)
    eager = load_model(args.model, device=device, dtype=dtype)
    compiled = load_model(args.model, device=device, dtype=dtype)
    compile_forwards(compiled)  # one line, exit 2, for a model whose forward cannot be compiled
    T = args.gamma + 1
    N = eager.num_tokens
    if N < T + 2:
        raise UsageError(f"{args.model} has {N} image tokens; use --gamma below {N - 2}")
    cells = [("slots", B) for B in sizes]
    rows, summary = [], []
    with torch.no_grad():
        for kind, B in cells:
            fe, fc = slots_forward(eager, B, T), slots_forward(compiled, B, T)
            t0 = time.perf_counter()
            fc(2)
            _sync(device)
            compile_s = time.perf_counter() - t0
            for f in (fe, fc, fe, fc):  # warm-up (a second shape-stable call of each)
                f(3)
            times = {"eager": [], "compiled": []}
            for r in range(args.repeats):
                n = 1 + r % (N - T)
                for name, f in (("eager", fe), ("compiled", fc)):
                    _sync(device)
                    t = time.perf_counter()
                    f(n)
                    _sync(device)
                    ms = 1000 * (time.perf_counter() - t)
                    times[name].append(ms)
                    rows.append({"kind": kind, "batch_size": B, "variant": name, "repeat": r, "position": n, "ms": ms})
            e, c = statistics.median(times["eager"]), statistics.median(times["compiled"])
            summary.append(
                {
                    "kind": kind,
                    "batch_size": B,
                    "eager_ms": e,
                    "compiled_ms": c,
                    "speedup": e / c,
                    "compile_s": compile_s,
                }
            )
            label = f"slots B = {B}"
            first = f"{compile_s:.1f} s" if compile_s >= 0.5 else "reused an earlier graph"
            print(
                f"{label:15s} eager {e:7.2f} ms  compiled {c:7.2f} ms  x{e / c:.2f}  (first call: {first})",
                flush=True,
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(out / "compile.parquet")
    info = {"settings": vars(args), **torch_facts(device, dtype), "cells": summary}
    (out / "compile.json").write_text(json.dumps(info, indent=1))
    print(f"wrote {out / 'compile.parquet'}, {out / 'compile.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
