"""Where a speculative round's time goes, against AR's step, and the speed-up each part leaves room for.

    python benchmarks/bench_round_cost.py --models embedded,embedded-16 --methods lantern,sjd \
        --batch-sizes 1,8,32 --images 8 --repeats 3 --threads 2 --out benchmarks/results/round_cost.csv

Every (model, B, method) cell, and AR at the same B, decodes ``max(--images, 2 B)`` images once per
repeat, the cells in a fresh seeded order each repeat, after one untimed repeat in order. From a
decode's wall seconds ``W`` and its step records (each step's seconds per section, summed over the
images that shared it: :mod:`lantern.engine.loop`): ``T`` the target's forwards, ``D`` the drafter,
``R`` the acceptance rule and what it computes (the distribution, the records' columns, the
neighbourhood), ``O = W - T - D - R`` the rest (prefill, admission, the loop). Per cell, medians over
the repeats:

* ``tau``: tokens an image commits per round, the bonus counted; ``rounds_per_image``;
* ``ms_round`` = W / rounds and its parts ``ms_target``, ``ms_drafter``, ``ms_rule``, ``ms_other``;
* ``verify_cost``: the method's target milliseconds per round over AR's (a forward of
  ``1 + γ`` tokens, or of a Jacobi window, in AR forwards; about 1 where the forward is
  memory-bound, as on a GPU at LlamaGen sizes, up to ``1 + γ`` where it is compute-bound);
* ``speedup`` = W_AR / W (images/s over AR's, paired per repeat; ``speedup_min`` / ``speedup_max``);
* ``free_drafter`` = W_AR / (W - D): the speed-up if drafting cost nothing;
* ``ceiling`` = W_AR / T: if only the target's forwards were paid (no drafter, rule or loop) — no
  drafter, draft length or faster rule can beat it at this τ on this machine.

A drafted method at ``--gamma`` (LANTERN with k 1000 and δ 0.1 mapped to the vocabulary, the
paper's sampling; ``-auto``: the engine's draft-length policy), or a Jacobi method at its default
window (``sjd``, ``gsd``, ``scd``; ``-auto``: the window policy); names as in
``benchmarks/bench_throughput.py``. Writes the table as CSV (``--out``) and the per-repeat rows next to
it (``.parquet``: model, batch_size, method, repeat, images, rounds, image_rounds, tokens, and the seconds
``wall``, ``target``, ``drafter``, ``rule``, ``other``). ``speedup_min`` / ``speedup_max`` are the
spread the docs write as [min, max].
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.*

from ambiguity.cli import ArgumentParser, add_device_args, cli_main, int_list, positive_int
from ambiguity.errors import UsageError
from benchmarks.bench_throughput import JACOBI, METHODS, add_method_args, config_of, load_entry
from benchmarks.common import add_results_arg, threads_and_device
from lantern.engine.decode import decode

SECTIONS = {"target": ("target_s",), "drafter": ("drafter_s",), "rule": ("acceptance_s", "proximity_s")}
CHOICES = tuple(m for m in (*METHODS, *JACOBI) if m != "ar-compiled")


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="bench_round_cost.py", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--models", default="embedded,embedded-16", help="comma-separated registry names (default: %(default)s)"
    )
    ap.add_argument(
        "--methods", default="lantern", help="comma-separated, from: " + ", ".join(CHOICES) + " (default: lantern)"
    )
    ap.add_argument("--batch-sizes", default="1,8,32", help="comma-separated images per forward (default: 1,8,32)")
    ap.add_argument("--images", type=positive_int, default=8, help="images per cell at least (max(this, 2B))")
    ap.add_argument("--repeats", type=positive_int, default=3, help="timed repeats per cell, interleaved")
    add_method_args(ap)
    add_device_args(ap, threads=2, what="the models and drafters")
    add_results_arg(ap, "bench_round_cost", "round_cost.csv", "results CSV")
    return ap


def round_sections(steps: dict, wall: float) -> dict:
    """A decode's totals from its step records (columns as :class:`lantern.engine.records.Decoded`
    ``.steps``) and its wall seconds: rounds, image-rounds (an image's part in a round), committed
    tokens (the bonus counted), seconds per section and ``other``."""
    rounds = len(np.unique(np.asarray(steps["batch_step"])))
    accepted = np.asarray(steps["accepted"])  # one row per image and round it took part in
    out = {"rounds": rounds, "image_rounds": len(accepted), "tokens": float(np.sum(accepted + 1)), "wall": wall}
    for name, cols in SECTIONS.items():
        out[name] = float(sum(np.nansum(np.asarray(steps[c], dtype=float)) for c in cols))
    out["other"] = wall - out["target"] - out["drafter"] - out["rule"]
    return out


def run(entry: tuple, method: str, args, B: int) -> dict:
    """Decode ``max(--images, 2B)`` images of ``method`` at batch ``B`` once on a
    :func:`~bench_throughput.load_entry` entry: :func:`round_sections`."""
    model, drafter, table, sampling, k, _ = entry
    config = config_of(method, args, k)
    n = max(args.images, 2 * B)
    spec = dict(drafter=drafter, neighbours=table) if config.speculative else {}
    t0 = time.perf_counter()
    out = decode(model, model.default_conditions(n), config, sampling, seed=0, batch_size=B, **spec)
    return {"images": n, **round_sections(out.steps, time.perf_counter() - t0)}


def summarize(df: pd.DataFrame, methods: Sequence[str] = ()) -> pd.DataFrame:
    """Per (model, B, method): the medians of the module docstring's columns, AR's row first, then
    ``methods`` in their order (the others as they first appear in ``df``)."""
    df = df.copy()
    df["tau"] = df["tokens"] / df["image_rounds"]
    df["rounds_per_image"] = df["image_rounds"] / df["images"]
    ar = df[df["method"] == "ar"].set_index(["model", "batch_size", "repeat"])
    key = list(zip(df["model"], df["batch_size"], df["repeat"]))
    ar_wall, ar_target = ar["wall"].reindex(key).to_numpy(), ar["target"] / ar["rounds"]
    df["speedup"] = ar_wall / df["wall"]
    df["free_drafter"] = ar_wall / (df["wall"] - df["drafter"])
    df["ceiling"] = ar_wall / df["target"]
    df["verify_cost"] = (df["target"] / df["rounds"]).to_numpy() / ar_target.reindex(key).to_numpy()
    for part in ("round", *SECTIONS, "other"):
        df[f"ms_{part}"] = 1e3 * df["wall" if part == "round" else part] / df["rounds"]
    g = df.groupby(["model", "batch_size", "method"], sort=False)
    cols = ["tau", "rounds_per_image", "ms_round", "ms_target", "ms_drafter", "ms_rule", "ms_other"]
    cols += ["verify_cost", "speedup", "free_drafter", "ceiling"]
    table = g[cols].median()
    table["speedup_min"], table["speedup_max"] = g["speedup"].min(), g["speedup"].max()
    order = {m: i for i, m in enumerate(dict.fromkeys(["ar", *methods, *df["method"]]))}
    return table.reset_index().sort_values(
        ["model", "batch_size", "method"], key=lambda c: c.map(order) if c.name == "method" else c, ignore_index=True
    )


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    sizes = int_list(args.batch_sizes, "--batch-sizes", 1)
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in CHOICES]
    if bad or not methods:
        raise UsageError(
            f"unknown method {bad[0] if bad else '(none)'!r} in --methods; choose from {', '.join(CHOICES)}"
        )
    methods = ["ar", *[m for m in methods if m != "ar"]]
    device, dtype = threads_and_device(args)
    loaded = {}
    for name in [m for m in args.models.split(",") if m]:
        loaded[name] = load_entry(name, methods, args, device, dtype)
        for m in methods:  # an untimed repeat: the first full-length decodes allocate what later ones reuse,
            for B in sizes:  # and an -auto row's first decode at a B measures its cost file there
                run(loaded[name], m, args, B)
    cells = [(name, B, m) for name in loaded for B in sizes for m in methods]
    rng, rows = random.Random(0), []
    for r in range(args.repeats):
        rng.shuffle(cells)
        for name, B, m in cells:
            rows.append({"model": name, "batch_size": B, "method": m, "repeat": r, **run(loaded[name], m, args, B)})
            print(f"r{r} {name:12s} B={B:3d} {m:14s} {rows[-1]['wall']:.2f} s", flush=True)
    df = pd.DataFrame(rows)
    table = summarize(df, methods)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(out.with_suffix(".parquet"))
    table.to_csv(out, index=False, float_format="%.4g")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print(f"wrote {out} and {out.with_suffix('.parquet')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
