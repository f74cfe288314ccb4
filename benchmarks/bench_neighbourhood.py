"""Exact k-nearest-neighbour tables of codebook-shaped matrices: our builder vs two baselines.

Not a test. Times, in one run on this machine, the exact k = 1000 l2 neighbours of every row of
random codebooks shaped like LlamaGen's VQ-16 (16384 x 8), Chameleon/Anole's VQGAN (8192 x 256)
and Emu3's (32768 x 4):

* ``ours``: :func:`ambiguity.neighbourhood.exact_knn` (FAISS brute force in row blocks);
* ``official``: the approach of the official LANTERN code: the full pairwise distance matrix
  (``torch.cdist``), the diagonal set to +inf, a full sort of every row, the first k kept.
  When N x N distances plus the sort's outputs (16 bytes per entry) exceed ``--official-bytes``
  the same computation runs in row blocks (the table says so);
* ``sklearn``: ``sklearn.neighbors.NearestNeighbors(algorithm="brute")`` with k + 1 neighbours,
  self removed.

``drop`` splits ``ours`` into its parts: the raw FAISS search for k + 1 candidates (``faiss_s``),
and removing each code from its own list, now (``drop_s``: rows already in (distance, index) order
kept, self removed by a shift) and as the builder did before (``drop_resort_s``: two stable sorts
of every row), checking both give the same table.

All three must return the same neighbour sets up to ties at the k-th distance (checked against
float64 distances). Prints a table of seconds and ratios (baseline / ours) and writes JSON to
``--out`` (default ``runs/benchmarks/bench_neighbourhood/bench_neighbourhood.json``; the committed
results: ``--out benchmarks/results/bench_neighbourhood.json``). CPU heavy (minutes): run it alone, e.g.
``nohup python benchmarks/bench_neighbourhood.py > bench.log 2>&1 &``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import faiss
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.common

from ambiguity.cli import (
    ArgumentParser,
    add_threads_arg,
    check_out_file,
    cli_main,
    finite_float,
    positive_int,
    set_threads,
)
from ambiguity.errors import UsageError
from ambiguity.io import write_json
from ambiguity.knn import drop_self, exact_knn, faiss_search, to_distance
from benchmarks.common import add_results_arg

SHAPES = {"llamagen-vq16": (16384, 8), "chameleon-vqgan": (8192, 256), "emu3-vq": (32768, 4)}


def official_knn(x: torch.Tensor, k: int, max_bytes: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """cdist, +inf diagonal, full row sort, first k; in row blocks when N x N x 16 B > max_bytes."""
    n = x.shape[0]
    rows = n if n * n * 16 <= max_bytes else max(1, max_bytes // (n * 16))
    I = torch.empty(n, k, dtype=torch.long)
    D = torch.empty(n, k, dtype=torch.float32)
    for s in range(0, n, rows):
        d = torch.cdist(x[s : s + rows], x)
        r = torch.arange(d.shape[0])
        d[r, r + s] = float("inf")
        v, i = torch.sort(d, dim=1)
        I[s : s + rows], D[s : s + rows] = i[:, :k], v[:, :k]
        del d, v, i
    how = "full N x N" if rows >= n else f"row blocks of {rows}"
    return I, D, how


def sklearn_knn(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Brute-force NearestNeighbors with k + 1 results; self removed by index (else the last dropped)."""
    from sklearn.neighbors import NearestNeighbors

    xn = x.numpy()
    nn = NearestNeighbors(n_neighbors=k + 1, algorithm="brute", metric="euclidean").fit(xn)
    dist, idx = nn.kneighbors(xn)
    idx, dist = torch.from_numpy(idx), torch.from_numpy(dist).float()
    keep = idx != torch.arange(len(idx))[:, None]
    keep[~(~keep).any(1), -1] = False
    return idx[keep].view(-1, k), dist[keep].view(-1, k)


def drop_self_resorting(D: torch.Tensor, I: torch.Tensor, rows: torch.Tensor, k: int):
    """The builder's previous self removal: sort every row by (distance, index) with two stable sorts."""
    o = torch.argsort(I, dim=1, stable=True)
    D, I = D.gather(1, o), I.gather(1, o)
    o = torch.argsort(D, dim=1, stable=True)
    D, I = D.gather(1, o), I.gather(1, o)
    keep = I != rows[:, None]
    keep[~(~keep).any(1), -1] = False
    return D[keep].view(-1, k), I[keep].view(-1, k)


def drop_costs(x: torch.Tensor, k: int) -> dict:
    """Seconds (wall and this process's CPU, the machine may be shared) of the raw FAISS search (all
    rows at once) and of both self removals on its output, and whether they give the same table."""
    rows = torch.arange(x.shape[0])
    c0 = time.process_time()
    (scores, cand), faiss_s = timed(lambda: faiss_search(x, x.numpy(), k + 1, "l2", False))
    c1 = time.process_time()
    D = to_distance(scores, "l2")
    c2 = time.process_time()
    new, drop_s = timed(lambda: drop_self(D, cand, rows, k))
    c3 = time.process_time()
    old, resort_s = timed(lambda: drop_self_resorting(D, cand, rows, k))
    c4 = time.process_time()
    return {
        "faiss_s": faiss_s,
        "drop_s": drop_s,
        "drop_resort_s": resort_s,
        "faiss_cpu_s": c1 - c0,
        "drop_cpu_s": c3 - c2,
        "drop_resort_cpu_s": c4 - c3,
        "drop_same_table": bool(torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])),
    }


def same_sets(x: torch.Tensor, ref: torch.Tensor, other: torch.Tensor, rel_tol: float = 1e-4) -> dict:
    """Rows whose neighbour sets differ, and whether every difference is a tie at the k-th distance.

    A code in one set but not the other must sit, in float64, within ``rel_tol`` (relative) of
    the k-th neighbour's distance of that row.
    """
    a, b = ref.sort(1).values, other.sort(1).values
    differ = (a != b).any(1).nonzero().view(-1)
    bad = 0
    xd = x.double()
    for r in differ.tolist():
        sa, sb = set(ref[r].tolist()), set(other[r].tolist())
        sym = torch.tensor(sorted(sa ^ sb))
        union = torch.tensor(sorted(sa | sb))
        du = (xd[union] - xd[r]).norm(dim=1)
        kth = du.sort().values[ref.shape[1] - 1]
        ds = (xd[sym] - xd[r]).norm(dim=1)
        if ((ds - kth).abs() > rel_tol * kth.clamp_min(1e-12)).any():
            bad += 1
    return {"rows_differing": int(differ.numel()), "rows_not_ties": bad}


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def build_parser() -> ArgumentParser:
    """The options of ``python benchmarks/bench_neighbourhood.py``."""
    ap = ArgumentParser(prog="python benchmarks/bench_neighbourhood.py", description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=positive_int, default=1000)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names from: " + ", ".join(SHAPES))
    add_threads_arg(ap, 2)
    ap.add_argument("--official-bytes", type=finite_float, default=4.5e9, help="memory for one official block (bytes)")
    ap.add_argument("--skip", default="", help="comma-separated methods to skip: official, sklearn, drop")
    add_results_arg(ap, "bench_neighbourhood", "bench_neighbourhood.json")
    return ap


def check_args(args) -> tuple[list[str], set[str]]:
    """(codebook shapes, methods to skip) of the options. Raises UsageError for an unknown shape or
    method, a k not below every codebook size, no thread count or too small an official block."""
    shapes = [s for s in args.shapes.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES] + [
        s for s in args.skip.split(",") if s and s not in ("official", "sklearn", "drop")
    ]
    if bad or not shapes:
        raise UsageError(
            f"unknown --shapes/--skip entry {bad[0] if bad else '(none given)'}; shapes: "
            f"{', '.join(SHAPES)}; skip: official, sklearn, drop"
        )
    if any(args.k >= SHAPES[s][0] for s in shapes):
        raise UsageError(f"--k {args.k} must be smaller than every codebook size ({min(SHAPES[s][0] for s in shapes)})")
    if args.threads < 1:
        raise UsageError("--threads must be >= 1 here: the timings are reported for a stated thread count")
    if args.official_bytes < 1e6:
        raise UsageError(f"--official-bytes must be at least 1e6, got {args.official_bytes:g}")
    return shapes, {s for s in args.skip.split(",") if s}


def limit_threads(n: int) -> None:
    """torch, faiss and (when threadpoolctl is there) the BLAS pools to ``n`` threads."""
    set_threads(n)
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
    except ImportError:
        pass


def time_codebook(name: str, k: int, official_bytes: int, skip: set[str]) -> dict:
    """The record of one random codebook of shape ``SHAPES[name]``: our seconds and, unless
    skipped, the self-removal costs and the official and sklearn baselines with their checks."""
    n, d = SHAPES[name]
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    rec = {"codebook": name, "n": n, "d": d, "k": k, "load_before": os.getloadavg()[0]}
    (I, D), rec["ours_s"] = timed(lambda: exact_knn(x, k, "l2", progress=False))
    print(f"{name}: ours {rec['ours_s']:.2f} s", flush=True)
    if "drop" not in skip:
        rec.update(drop_costs(x, k))
        print(
            f"{name}: faiss {rec['faiss_s']:.2f} s (CPU {rec['faiss_cpu_s']:.2f} s), drop self "
            f"{rec['drop_s']:.2f} s (CPU {rec['drop_cpu_s']:.2f} s), re-sorting {rec['drop_resort_s']:.2f} s "
            f"(CPU {rec['drop_resort_cpu_s']:.2f} s), same table: {rec['drop_same_table']}",
            flush=True,
        )
    if "official" not in skip:
        (Io, Do, how), rec["official_s"] = timed(lambda: official_knn(x, k, official_bytes))
        rec["official_how"] = how
        rec["official_check"] = same_sets(x, I, Io)
        rec["official_max_abs_distance_diff"] = float((D - Do).abs().max())
        del Io, Do
        print(f"{name}: official {rec['official_s']:.2f} s ({how})", flush=True)
    if "sklearn" not in skip:
        (Is, Ds), rec["sklearn_s"] = timed(lambda: sklearn_knn(x, k))
        rec["sklearn_check"] = same_sets(x, I, Is)
        rec["sklearn_max_abs_distance_diff"] = float((D - Ds).abs().max())
        del Is, Ds
        print(f"{name}: sklearn {rec['sklearn_s']:.2f} s", flush=True)
    rec["load_after"] = os.getloadavg()[0]
    return rec


TABLE_COLUMNS = (
    "codebook",
    "n",
    "d",
    "k",
    "ours_s",
    "faiss_s",
    "drop_s",
    "drop_resort_s",
    "official_s",
    "sklearn_s",
    "official/ours",
    "sklearn/ours",
    "official_how",
    "load_before",
)


def print_results(records: list[dict]) -> None:
    """The seconds and ratios of every codebook, then how far each baseline's sets differ from ours."""
    df = pd.DataFrame(records)
    for m in ("official", "sklearn"):
        if f"{m}_s" in df:
            df[f"{m}/ours"] = df[f"{m}_s"] / df["ours_s"]
    cols = [c for c in TABLE_COLUMNS if c in df]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    for r in records:
        for m in ("official", "sklearn"):
            if f"{m}_check" in r:
                c = r[f"{m}_check"]
                print(
                    f"{r['codebook']} vs {m}: {c['rows_differing']} rows differ, {c['rows_not_ties']} not explained "
                    f"by ties at the k-th distance"
                )


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    check_out_file(args.out)
    shapes, skip = check_args(args)
    limit_threads(args.threads)
    exact_knn(torch.randn(64, 4), 8)  # warm-up: imports, thread pools
    records = [time_codebook(name, args.k, int(args.official_bytes), skip) for name in shapes]
    print_results(records)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {
        "machine": platform.platform(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "torch": torch.__version__,
        "faiss": faiss.__version__,
        "note": "shared machine: load averages recorded per codebook",
    }
    write_json({"env": env, "results": records}, out)
    print(f"wrote {out}")
    ok = all(r.get(f"{m}_check", {}).get("rows_not_ties", 0) == 0 for r in records for m in ("official", "sklearn"))
    ok = ok and all(r.get("drop_same_table", True) for r in records)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
