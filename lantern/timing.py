"""Wall-clock speed of decoding methods, measured so that the ratios mean something.

A speed-up is a ratio of two latencies measured on the same machine at nearly the same time.
:func:`interleaved_timing` therefore

1. **warms up**: decodes one image with every configuration before anything is recorded
   (imports, allocator, kernel caches, FAISS tables, page cache);
2. **interleaves**: in every round, every configuration decodes the round's images, in a fresh
   random order per round, so drift and background load hit all methods alike;
3. **repeats**: many rounds, so the spread is visible.

:func:`speedup_table` reports, per configuration, the median and quartiles of seconds per image
over rounds, the speed-up over the baseline as the ratio of total (equivalently mean) latencies,
the quantity the paper reports (LANTERN Table 2: mean latency of AR / mean latency of the
method), and as its spread the median and quartiles of the per-round ratios (baseline and
method timed in the same round; with one image per round, per-image ratios), the
baseline's milliseconds per target forward, the tokens per target forward, and a flag where the
speed-up exceeds the tokens per forward (more than step compression can explain: a slow
baseline loop). :func:`speedup_curve` gives the speed-up over the first n rounds (LANTERN
App. F.1: where the measured speed-up stabilises).

Rounds are given as a *schedule* of (first image index, image count): ``[(r, 1) for r in
range(n)]`` decodes a new image every round (the paper's protocol: each caption once);
``[(0, 8)] * 5`` repeats the same eight images five times (the decoding benchmark).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ambiguity.models.base import TokenModel
from ambiguity.sampling import SamplingConfig
from lantern.drafter.model import DraftModel
from lantern.engine.decode import DecodeConfig, decode, neighbour_table
from lantern.engine.records import Decoded

__all__ = ["TIMING_COLUMNS", "neighbour_tables", "time_decode", "interleaved_timing", "speedup_table", "speedup_curve"]

TIMING_COLUMNS = (
    "round",
    "config",
    "first",
    "images",
    "seconds",
    "tokens",
    "target_forwards",
    "target_s",
    "drafter_s",
    "acceptance_s",
    "proximity_s",
)


def neighbour_tables(model: TokenModel, configs: Mapping[str, DecodeConfig], progress: Optional[bool] = None) -> dict:
    """The neighbour table of every relaxed configuration, built before any timing (name -> (V, k)).
    progress: the builder's bar (None: its default, shown for codebooks of 8192 codes or more)."""
    return {
        name: neighbour_table(model, c, progress=progress)
        for name, c in configs.items()
        if c.speculative and c.rule.relaxed
    }


def time_decode(
    model: TokenModel,
    config: DecodeConfig,
    sampling: SamplingConfig,
    conditions: Sequence,
    first: int,
    drafter: Optional[DraftModel],
    table,
    seed: int,
    batch_size: int = 1,
) -> tuple[dict, Decoded]:
    """Decode ``conditions`` (image indices ``first ..``) once, ``batch_size`` images per forward:
    (one timing row, the decode). seconds: wall clock of the whole decode call; the rest from the
    decode's own records."""
    t0 = time.perf_counter()
    d = decode(
        model,
        list(conditions),
        config,
        sampling,
        drafter if config.speculative else None,
        table,
        seed=seed,
        first_index=first,
        batch_size=batch_size,
    )
    seconds = time.perf_counter() - t0
    im = d.images
    row = {
        "first": first,
        "images": len(conditions),
        "seconds": seconds,
        "tokens": int(np.sum(im["tokens"])),
        "target_forwards": int(np.sum(im["target_forwards"])),
        **{c: float(np.sum(im[c])) for c in ("target_s", "drafter_s", "acceptance_s", "proximity_s")},
    }
    return row, d


def interleaved_timing(
    model: TokenModel,
    configs: Mapping[str, DecodeConfig],
    sampling: SamplingConfig,
    conditions: Sequence,
    schedule: Sequence[tuple[int, int]],
    drafter: Optional[DraftModel | Mapping[str, DraftModel]] = None,
    tables: Optional[Mapping] = None,
    seed: int = 0,
    warmup: bool = True,
    order_seed: int = 0,
    progress: bool = False,
    done: Optional[pd.DataFrame] = None,
    on_round=None,
    desc: str = "timing (interleaved)",
    only: Optional[Sequence[int]] = None,
    rounds_of: Optional[Mapping[str, int]] = None,
    batch_size: int = 1,
) -> pd.DataFrame:
    """Time every configuration on every round of ``schedule``, interleaved (module docstring).

    configs: name -> :class:`~lantern.engine.decode.DecodeConfig`; conditions: the conditions by image
    index; schedule: per round (first image index, count); drafter: one for every configuration
    or name -> drafter; only: the rounds to run (default all; e.g. a shard's share);
    rounds_of: name -> number of leading rounds the configuration takes part in (default all:
    a large grid can join the first rounds of a long measurement); batch_size: images per forward
    of every decode (:func:`lantern.engine.decode.decode`; throughput rather than latency); tables: name ->
    neighbour table
    (default :func:`neighbour_tables`, built before timing); done: rows of rounds already timed
    (skipped: a resumed measurement); on_round: called as ``on_round(r, frame, decodes)`` after
    each new round with its timing rows and ``{name: Decoded}`` (e.g. to save them as run parts:
    the decodes are the method's samples, so one pass gives speed and quality). Returns a DataFrame
    with :data:`TIMING_COLUMNS` (seconds of wall clock, sums over the round's images).
    """
    tables = dict(tables) if tables is not None else neighbour_tables(model, configs)
    names = list(configs)
    drafters = drafter if isinstance(drafter, Mapping) else {name: drafter for name in names}
    active = lambda r: [n for n in names if rounds_of is None or r < rounds_of.get(n, len(schedule))]
    finished = set() if done is None or not len(done) else set(int(r) for r in done["round"])
    todo = [r for r in (range(len(schedule)) if only is None else only) if r not in finished]
    if warmup and todo:
        first, _ = schedule[todo[0]]
        for name in active(todo[0]):
            time_decode(
                model,
                configs[name],
                sampling,
                conditions[first : first + (1 if batch_size == 1 else 2)],  # batched: the batched loop
                first,
                drafters.get(name),
                tables.get(name),
                seed,
                batch_size,
            )  # not recorded
    frames = [done] if done is not None and len(done) else []
    for r in tqdm(todo, desc=desc, unit="round", disable=not progress):
        first, count = schedule[r]
        order = active(r)
        random.Random(order_seed * 1_000_003 + r).shuffle(order)
        rows, decodes = [], {}
        for name in order:
            row, decodes[name] = time_decode(
                model,
                configs[name],
                sampling,
                conditions[first : first + count],
                first,
                drafters.get(name),
                tables.get(name),
                seed,
                batch_size,
            )
            rows.append({"round": r, "config": name, **row})
        frame = pd.DataFrame(rows, columns=list(TIMING_COLUMNS))
        if on_round is not None:
            on_round(r, frame, decodes)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(TIMING_COLUMNS))


def _per_round(timing: pd.DataFrame, baseline: str) -> pd.DataFrame:
    base = timing[timing["config"] == baseline].set_index("round")["seconds"]
    base_seconds = timing["round"].map(base).astype(float)
    paired = base_seconds.notna()
    return timing.assign(
        ratio=base_seconds / timing["seconds"],
        base_seconds=base_seconds,
        paired_seconds=timing["seconds"].where(paired),
        seconds_per_image=timing["seconds"] / timing["images"],
    )


def speedup_table(timing: pd.DataFrame, baseline: str = "ar") -> pd.DataFrame:
    """Per configuration: ms_per_image (median over rounds) and its quartiles; speedup, the
    headline: total baseline seconds / total seconds over the same rounds (the ratio of mean
    latencies, as LANTERN Table 2 reports it); its spread speedup_median, speedup_q25 and
    speedup_q75 (median and quartiles of the per-round ratios baseline / method);
    baseline_ms_per_forward (the baseline's target milliseconds per target forward),
    target_ms_per_forward, tokens_per_forward, rounds, and speedup_exceeds_tokens_per_forward
    (the headline speed-up above the tokens per target forward)."""
    t = _per_round(timing, baseline)
    base = t[t["config"] == baseline]
    base_ms = 1e3 * base["target_s"].sum() / max(base["target_forwards"].sum(), 1)
    g = t.groupby("config", sort=False)
    out = pd.DataFrame(
        {
            "ms_per_image": 1e3 * g["seconds_per_image"].median(),
            "ms_per_image_q25": 1e3 * g["seconds_per_image"].quantile(0.25),
            "ms_per_image_q75": 1e3 * g["seconds_per_image"].quantile(0.75),
            "speedup": g["base_seconds"].sum() / g["paired_seconds"].sum(),  # rounds the baseline also ran
            "speedup_median": g["ratio"].median(),
            "speedup_q25": g["ratio"].quantile(0.25),
            "speedup_q75": g["ratio"].quantile(0.75),
            "baseline_ms_per_forward": base_ms,
            "target_ms_per_forward": 1e3 * g["target_s"].sum() / g["target_forwards"].sum(),
            "tokens_per_forward": g["tokens"].sum() / g["target_forwards"].sum(),
            "rounds": g["ratio"].count(),  # rounds paired with the baseline
        }
    ).reset_index()
    out["speedup_exceeds_tokens_per_forward"] = out["speedup"] > out["tokens_per_forward"]
    return out


def speedup_curve(
    timing: pd.DataFrame,
    config: str,
    baseline: str = "ar",
    ns: Optional[Sequence[int]] = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Speed-up of ``config`` over ``baseline`` measured on the first n rounds, for each n in ``ns``
    (default 1 .. all): n, speedup (ratio of total latencies), ci_low / ci_high (95 % bootstrap
    over those rounds). LANTERN App. F.1."""
    t = (
        timing[timing["config"].isin([config, baseline])]
        .pivot_table(index="round", columns="config", values="seconds", aggfunc="sum")
        .dropna()
    )
    a, b = t[baseline].to_numpy(), t[config].to_numpy()
    ns = list(ns) if ns is not None else list(range(1, len(t) + 1))
    rng = np.random.default_rng(seed)
    rows = []
    for n in ns:
        if n > len(t):
            break
        idx = rng.integers(0, n, size=(n_boot, n))
        boot = a[:n][idx].sum(1) / b[:n][idx].sum(1)
        rows.append(
            {
                "n": n,
                "speedup": a[:n].sum() / b[:n].sum(),
                "ci_low": float(np.quantile(boot, 0.025)),
                "ci_high": float(np.quantile(boot, 0.975)),
            }
        )
    return pd.DataFrame(rows)
