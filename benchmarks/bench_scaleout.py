"""Throughput of one process vs N processes under torchrun, for the same command and output.

Not a test. Runs a command (default: ``python -m ambiguity.profile`` on the embedded model) as
one process and under ``torchrun --standalone --nproc_per_node N``, alternating the two for
``--repeats`` rounds after one warm-up round of each, every run into a fresh run directory.
Reports images per second (median and quartiles over the rounds, start-up included: the wall
clock a user waits) and the per-round ratio N / 1. On a CPU machine both get all cores: the one
process ``--threads`` (default all) threads, each of the N processes cores / N
(:mod:`ambiguity.distributed`). Checks that the outputs are identical when both use one thread
per process (``--same-threads``). Writes ``--out`` (default
``runs/benchmarks/bench_scaleout/scaleout_<command>.json``, untracked; the committed results are
``benchmarks/results/scaleout_<command>.json``: pass that ``--out`` to replace them).

    python benchmarks/bench_scaleout.py --command profile --num-images 64 --repeats 3
    python benchmarks/bench_scaleout.py --command generate --num-images 16 --repeats 3
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import pandas as pd

from ambiguity.cli import ArgumentParser, add_out_arg, check_out_file, cli_main, positive_int
from ambiguity.errors import UsageError
from ambiguity.io import write_json

OUT = Path(__file__).resolve().parents[1] / "runs" / "benchmarks" / "bench_scaleout"  # untracked
COMMANDS = {
    "profile": lambda n: ["ambiguity.profile", "--num-images", str(n), "--no-figures", "--no-progress"],
    "generate": lambda n: ["lantern.generate", "--num-images", str(n), "--no-progress"],
}


def launch(argv: list[str], out: Path, procs: int, threads: Optional[int]) -> float:
    """Seconds of wall clock for one run of ``python -m argv --out out`` on ``procs`` processes."""
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.pop("OMP_NUM_THREADS", None)
    cmd = [sys.executable, "-m"]
    if procs > 1:
        cmd += ["torch.distributed.run", "--standalone", "--nproc_per_node", str(procs), "-m"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd + argv + ["--out", str(out)], capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise UsageError(f"{' '.join(cmd + argv)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return seconds


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    ap = ArgumentParser(prog="python benchmarks/bench_scaleout.py", description=__doc__.splitlines()[0])
    ap.add_argument("--command", choices=sorted(COMMANDS), default="profile")
    ap.add_argument("--num-images", type=positive_int, default=64)
    ap.add_argument("--procs", type=positive_int, default=2, help="processes under torchrun (default 2)")
    ap.add_argument("--repeats", type=positive_int, default=3, help="timed rounds after the warm-up")
    ap.add_argument(
        "--same-threads", action="store_true", help="one thread per process in both (outputs then identical; checked)"
    )
    add_out_arg(ap, "results JSON (default: runs/benchmarks/bench_scaleout/scaleout_<command>.json)", metavar="FILE")
    args = ap.parse_args(argv)
    args.out = args.out or str(OUT / f"scaleout_{args.command}.json")
    check_out_file(args.out)
    argv_ = COMMANDS[args.command](args.num_images)
    threads = 1 if args.same_threads else None  # None: the defaults (all cores; cores / N per process)
    work = Path(tempfile.mkdtemp(prefix="scaleout-"))
    times = {1: [], args.procs: []}
    try:
        for r in range(args.repeats + 1):  # round 0 warms caches (imports, weights, page cache)
            order = (1, args.procs) if r % 2 == 0 else (args.procs, 1)  # alternate who goes first
            for procs in order:
                out = work / f"r{r}_p{procs}"
                t = launch(argv_, out, procs, threads)
                if r > 0:
                    times[procs].append(t)
                print(f"round {r}{' (warm-up)' if r == 0 else ''}: {procs} process(es) {t:.1f} s", flush=True)
        identical = None
        if args.same_threads and args.command == "profile":
            a = pd.read_parquet(work / "r1_p1/tokens.parquet")
            b = pd.read_parquet(work / f"r1_p{args.procs}/tokens.parquet")
            cols = [c for c in a.columns if not c.endswith("_s")]
            identical = bool(a[cols].equals(b[cols]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rate = {p: [args.num_images / t for t in ts] for p, ts in times.items()}
    ratio = [b / a for a, b in zip(rate[1], rate[args.procs])]
    result = {
        "command": args.command,
        "num_images": args.num_images,
        "procs": args.procs,
        "repeats": args.repeats,
        "same_threads": args.same_threads,
        "cpus": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "seconds": {str(p): ts for p, ts in times.items()},
        "images_per_s": {str(p): dict(zip(("q1", "median", "q3"), quartiles(r))) for p, r in rate.items()},
        "ratio_median": statistics.median(ratio),
        "ratio_per_round": ratio,
        "identical_outputs": identical,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(result, args.out)
    for p in (1, args.procs):
        q1, med, q3 = quartiles(rate[p])
        print(f"{p} process(es): {med:.2f} images/s (quartiles {q1:.2f}-{q3:.2f})")
    print(
        f"ratio {args.procs}/1: {result['ratio_median']:.2f} (per round: {', '.join(f'{x:.2f}' for x in ratio)})"
        + ("" if identical is None else f"; identical outputs: {identical}")
        + f"  -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
