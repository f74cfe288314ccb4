"""``python -m lantern.evaluate``: image quality of generation runs against a reference set.

Example (the embedded model; the two extractors that work offline)::

    python -m lantern.evaluate runs/ar runs/sd runs/lantern --reference fashion-mnist:test \\
        --extractors fmnist,mobilenet --bootstrap 200 --out runs/evaluate

For every run and extractor X it reports ``fid_X`` (Fréchet distance of the features; the FID
proper with X = inception, FD-DINOv2 with X = dinov2), ``kid_X``, ``precision_X``, ``recall_X``
(Kynkäänniemi et al. 2019, k = 3), ``density_X`` and ``coverage_X`` (Naeem et al. 2020), each
with the number of images n and an interval (delete-a-group jackknife, Wilson for precision;
:mod:`lantern.quality.metrics`); with
``--clip-score`` the CLIP score (raw cosine unless ``--clip-scale x100``), with ``--hps`` HPS
v2.1 when open_clip and its weights are installed (else a note), and the offline proxies: with
``--proxy-reference RUN`` the PSNR and token match against the run's image of the same index,
with ``--target-scores`` the target's NLL of the tokens and class consistency
(:mod:`lantern.replay`). Runs' speed (acceptance rate, τ, step compression) is printed beside;
``--paired-with RUN`` adds every metric's difference to RUN with a paired jackknife interval
(same image indices, hence seeds and classes, in both leave-one-group-out sets).

Outputs in ``--out`` (a run directory, :mod:`ambiguity.runs`): ``metrics.parquet`` (one row per
run and metric: run, label, metric, extractor, value, ci_low, ci_high, n, bootstrap (jackknife groups),
reference_images), ``paired.parquet`` (with ``--paired-with``), ``sweep.parquet`` and
``quality_sweep.png`` / ``.pdf`` (when LANTERN runs are given, :mod:`lantern.quality.report`),
``evaluation.json`` (the protocol — reference set and split, image count,
caption rule, resize and crop rule, extractors with their weights' SHA-256, CLIP scale, seeds —
the runs and their results) and the printed table. Each (run, extractor) pair is saved as a part
when it is done, so an interrupted evaluation resumes and adding runs reuses the others;
reference statistics are cached per (reference, extractor, protocol) under ``--cache``.

FID is biased upward at small n: compare numbers only at equal n, and read them with the
real-data floor at that n (pass e.g. ``fashion-mnist:train@1000`` as one more run). Bad input
(runs of other image sizes, an empty run, a missing reference, an unknown extractor, absent
weights) ends with one ``error:`` line naming the fix and exit status 2; finished parts stay.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ambiguity.cli import (
    ArgumentParser,
    add_data_arg,
    add_device_args,
    add_out_arg,
    add_overwrite_arg,
    add_progress_arg,
    add_shard_args,
    check_out_dir,
    check_out_file,
    cli_main,
    nonneg_int,
    parse_mapping,
    positive_int,
    safe_name,
    seed_int,
    unit_float,
)
from ambiguity.distributed import SINGLE, Shard, merging_shard, shard_from_args
from ambiguity.errors import UsageError
from ambiguity.io import write_json, write_table
from ambiguity.memory import check_count
from ambiguity.models.base import resolve_device
from ambiguity.models.registry import load_model
from ambiguity.runs import RunDir, RunOptions, assemble_units, shard_units
from lantern.quality.features import (
    EXTRACTORS,
    OFFLINE,
    Extractor,
    default_extractors,
    extract,
    load_extractor,
    locate_weights,
)
from lantern.quality.report import plot_quality_sweep, sweep_frame
from lantern.quality.scoring import (
    PAPER_SAMPLE_SIZES,
    Protocol,
    feature_metrics,
    paired_differences,
    protocol_record,
    reference_stats,
    value_metrics,
)
from lantern.quality.sources import ImageSet, load_source, parse_spec
from lantern.quality.text import CLIP_SCALES, clip_scores, hps_scores, prompts_for
from lantern.run_reader import image_quality, load_run, run_label, target_scores

__all__ = [
    "evaluate_runs",
    "score_images",
    "flat_scores",
    "paired_table",
    "load_extractors",
    "check_sizes",
    "wide_table",
    "speed_quality_table",
    "build_parser",
    "main",
    "check_run_names",
    "check_counts",
    "COMMAND",
    "OUTPUTS",
]

COMMAND = "python -m lantern.evaluate"
MERGE = "lantern.evaluate:merge_run"
OUTPUTS = (
    "metrics.parquet",
    "paired.parquet",
    "evaluation.json",
    "sweep.parquet",
    "quality_sweep.png",
    "quality_sweep.pdf",
)
ROW_COLUMNS = ["metric", "extractor", "value", "ci_low", "ci_high", "n", "bootstrap"]
PART_FORMAT = 3  # parts hold the metric rows, the leave-one-group-out (jackknife) values and the features
_EXTRACTOR_CACHE: dict[tuple, Extractor] = {}


def load_extractors(names: Sequence[str], weights: Optional[dict] = None, device="cpu") -> list[Extractor]:
    """Check every name and weights file first (one-line errors before anything loads), then
    load each extractor once per process (reused by later calls)."""
    weights = {k: str(v) for k, v in (weights or {}).items()}
    names = list(dict.fromkeys(names))
    if not names:
        raise UsageError(f"--extractors is empty; name at least one of {', '.join(EXTRACTORS)}")
    for n in names:
        locate_weights(n, weights.get(n))
    out = []
    for n in names:
        key = (n, weights.get(n), str(device))
        if key not in _EXTRACTOR_CACHE:
            _EXTRACTOR_CACHE[key] = load_extractor(n, weights.get(n), device)
        out.append(_EXTRACTOR_CACHE[key])
    return out


def check_bootstrap(resamples: int, n: int) -> None:
    """Refuse ``--bootstrap`` before any image is scored when its resample counts of ``n`` images
    (float64, as :func:`lantern.quality.metrics.bootstrap_indices` holds them, with its working
    copies) cannot fit in memory; UsageError naming the largest count that fits."""
    check_count(resamples, 3 * 8 * max(n, 1), "--bootstrap", f"the resample counts of {n} images")


def check_sizes(runs: Sequence[ImageSet], reference: Optional[ImageSet]) -> None:
    """All runs must share one resolution, and a run or data-set reference must have it too."""
    sizes = {r.spec: r.hw for r in runs}
    first = runs[0]
    for r in runs[1:]:
        if r.hw != first.hw:
            raise UsageError(
                f"{r.spec} has {r.hw[0]}x{r.hw[1]} images but {first.spec} {first.hw[0]}x{first.hw[1]}; "
                f"evaluate runs of one resolution together (FID across resolutions is not comparable)"
            )
    if reference is not None and reference.info.get("kind") != "folder" and reference.hw != first.hw:
        raise UsageError(
            f"the reference {reference.spec} has {reference.hw[0]}x{reference.hw[1]} images but the runs "
            f"{first.hw[0]}x{first.hw[1]} ({', '.join(sizes)}); pass a reference at the runs' resolution "
            f"(an image folder reference is cropped and resized)"
        )


def check_run_names(runs: Sequence[str], paired_with: Optional[str] = None) -> None:
    """Refuse a run named twice (it would be scored twice, under one label) and a ``--paired-with``
    that is not one of the runs or has no other run to be compared with."""
    seen: dict[str, str] = {}
    for r in runs:
        key = str(Path(r).expanduser().resolve()) if Path(r).expanduser().exists() else r
        if key in seen:
            raise UsageError(f"{r} is named twice (also as {seen[key]}); name each run once")
        seen[key] = r
    if paired_with is not None and paired_with not in runs:
        raise UsageError(f"--paired-with {paired_with} is not one of the runs; name it among the runs too")
    if paired_with is not None and len(runs) < 2:
        raise UsageError(
            f"--paired-with {paired_with} compares the other runs with it, but it is the only run; "
            f"name the runs to compare with it too"
        )


def check_counts(runs: Sequence[ImageSet], reference: Optional[ImageSet], extractors) -> None:
    """Feature metrics (FID, KID, precision/recall) need at least 2 images in every set and in the
    reference: refuse a smaller one before any feature is extracted. ``extractors``: the names
    asked for (None: the defaults; an empty list computes no feature metric)."""
    if extractors is not None and not len(extractors):
        return
    for s in [*runs, *([reference] if reference is not None else [])]:
        if s.n < 2:
            raise UsageError(
                f"{s.spec} has {s.n} image; FID, KID and precision/recall need at least 2 per set "
                f"(generate more with --num-images)"
            )


def _text_values(s: ImageSet, p: Protocol, weights: dict, device, class_names) -> tuple[dict, list[str]]:
    values, notes = {}, []
    if not (p.clip_score or p.hps):
        return values, notes
    prompts = prompts_for(s.conditions, class_names or s.info.get("class_names"), p.prompt_template)
    if prompts is None:
        return values, [
            f"{s.label}: CLIP score / HPS skipped: no captions or class names for its images "
            f"(pass --class-names FILE for class-conditional runs)"
        ]
    if p.clip_score:
        d = locate_weights("clip", weights.get("clip") or p.clip_model)
        values["clip_score"] = clip_scores(s.images, prompts, d, device, p.clip_scale)
    if p.hps:
        v, note = hps_scores(s.images, prompts, weights.get("hps"), device)
        notes.append(note)
        if v is not None:
            values["hps_v2.1"] = v
    return values, notes


def _proxy_values(s: ImageSet, proxy_reference, target, device) -> dict:
    values = {}
    if s.info.get("kind") != "run":
        return values
    run = load_run(s.info["path"])
    keep = set(s.info.get("image_indices") or run["images"]["image"])  # the subset of SPEC@N / SPEC@:N
    run = {**run, "images": run["images"][run["images"]["image"].isin(keep)].reset_index(drop=True)}
    if proxy_reference is not None:
        q = image_quality(run, proxy_reference)
        values["psnr_vs_reference"] = q["psnr"].replace([np.inf], np.nan).to_numpy()
        values["token_match_vs_reference"] = q["token_match"].to_numpy()
    if target is not None:
        sc = target_scores(target, run["images"])
        values["target_nll"] = sc["nll"].to_numpy()
        if "consistent" in sc:
            values["class_consistency"] = sc["consistent"].to_numpy(dtype=float)
    return values


def _features(
    s: ImageSet, ex: Extractor, batch_size: int, run_dir: Optional[RunDir], key: str, shard: Shard
) -> Optional[np.ndarray]:
    """Features (N, D) of the set under ``ex``; across shards, chunks of ``16 * batch_size`` images
    (whole extractor batches, so each equals a single process's) are parts of ``run_dir`` owned by
    ``chunk % count``; None on a shard that does not merge."""
    if shard.count == 1:
        return extract(s.images, ex, batch_size)
    size = 16 * batch_size
    chunks = [
        (
            f"{key}.{ex.name}.chunk{c:05d}",
            {
                "set": s.spec,
                "fingerprint": s.fingerprint,
                "extractor": ex.describe(),
                "images": [lo, min(s.n, lo + size)],
            },
        )
        for c, lo in enumerate(range(0, s.n, size))
    ]
    for c, done in shard_units(run_dir, chunks, shard, load=False):
        if done is None:
            name, holds = chunks[c]
            lo, hi = holds["images"]
            run_dir.write_part(
                name,
                holds,
                tensors={"features": {"features": torch.from_numpy(extract(s.images[lo:hi], ex, batch_size))}},
            )
    parts = assemble_units(run_dir, chunks, shard, [], lambda p: p.tensors["features"]["features"].numpy())
    return None if parts is None else np.concatenate(parts)


def _score_set(
    s: ImageSet,
    ref: ImageSet,
    extractors,
    p: Protocol,
    *,
    cache,
    batch_size,
    run_dir: Optional[RunDir],
    weights: dict,
    device,
    class_names=None,
    proxy_reference=None,
    target=None,
    notes=None,
    shard: Shard = SINGLE,
) -> tuple[pd.DataFrame, dict]:
    """All metric rows of one image set (parts reused / written when ``run_dir`` is given) and
    the resampled values of each metric ({metric: (B,) array}); (None, None) on a shard that does
    not merge (it only extracts its chunks of features)."""
    key = safe_name(f"{s.label}-{s.fingerprint[:8]}")
    frames, boot = [], {}

    def keep(rows: list[dict]) -> pd.DataFrame:
        for r in rows:
            boot[r["metric"]] = r.pop("resamples")
        return pd.DataFrame(rows, columns=ROW_COLUMNS) if not rows else pd.DataFrame(rows)

    def reuse(part) -> None:
        frames.append(part.tables["metrics"])
        boot.update({k: v.numpy() for k, v in part.tensors.get("bootstrap", {}).items()})

    def save(name: str, holds: dict, df: pd.DataFrame, tensors: dict, meta=None) -> None:
        if run_dir is not None:
            resampled = {m: torch.from_numpy(np.ascontiguousarray(boot[m])) for m in df["metric"] if len(boot[m])}
            run_dir.write_part(
                name,
                holds,
                tables={"metrics": df},
                meta=meta,
                tensors={**tensors, **({"bootstrap": resampled} if resampled else {})},
            )
        frames.append(df)

    for ex in extractors:
        holds = {"set": s.spec, "fingerprint": s.fingerprint, "extractor": ex.describe(), "format": PART_FORMAT}
        part = run_dir.read_part(f"{key}.{ex.name}", holds) if run_dir is not None else None
        if part is not None:
            reuse(part)
            continue
        feats = _features(s, ex, batch_size, run_dir, key, shard)
        if feats is None:
            continue
        stats = reference_stats(ref, ex, cache, batch_size, use_cache=cache is not False)
        save(
            f"{key}.{ex.name}",
            holds,
            keep(feature_metrics(feats, stats, p, ex.name)),
            {"features": {"features": torch.from_numpy(feats)}},
        )
    if not shard.merges:
        return None, None
    extra = {
        "clip": p.clip_score,
        "hps": p.hps,
        "proxy": proxy_reference is not None and proxy_reference["path"].name,
        "target": target is not None,
    }
    if any(extra.values()):
        holds = {"set": s.spec, "fingerprint": s.fingerprint, "values": extra, "format": PART_FORMAT}
        part = run_dir.read_part(f"{key}.values", holds) if run_dir is not None else None
        if part is not None:
            reuse(part)
            if notes is not None:
                notes.extend(part.meta.get("notes", []))
        else:
            values, text_notes = _text_values(s, p, weights, device, class_names)
            values.update(_proxy_values(s, proxy_reference, target, device))
            save(f"{key}.values", holds, keep(value_metrics(values, p)), {}, {"notes": text_notes})
            if notes is not None:
                notes.extend(text_notes)
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return df.assign(run=s.spec, label=s.label), boot


def paired_table(df: pd.DataFrame, boot: dict, base: str, level: float = 0.95) -> pd.DataFrame:
    """Differences of every set's metrics to the set ``base`` (a spec) with paired bootstrap
    jackknife intervals (:func:`lantern.quality.scoring.paired_differences`); sets of another n are left out.
    Columns: run, label, baseline, metric, diff, ci_low, ci_high, p_greater, n."""
    rows = []
    b = df[df["run"] == base].set_index("metric")
    for (run, label), sub in df[df["run"] != base].groupby(["run", "label"], sort=False):
        for r in sub.to_dict(orient="records"):
            m = r["metric"]
            if m not in b.index or int(b.loc[m, "n"]) != int(r["n"]):
                continue
            d = paired_differences(
                {"value": b.loc[m, "value"], "resamples": boot[base].get(m, [])},
                {"value": r["value"], "resamples": boot[run].get(m, [])},
                level,
            )
            rows.append({"run": run, "label": label, "baseline": base, "metric": m, **d, "n": int(r["n"])})
    return pd.DataFrame(rows)


def _labels(sets: Sequence[ImageSet]) -> None:
    for s in sets:
        if s.info.get("kind") == "run":
            s.label = run_label({"method": s.info.get("method"), "rule": s.info.get("rule") or {}})
            k = parse_spec(s.spec)[1]
            s.label += "" if k is None else f" @{k}" if k > 0 else f" @:{-k}"
    seen = [s.label for s in sets]
    for s in sets:
        if seen.count(s.label) > 1:
            s.label = f"{s.label} ({Path(s.spec).name})"


def evaluate_runs(
    runs: Sequence[str],
    protocol: Protocol = Protocol(),
    extractors: Optional[Sequence[str]] = None,
    weights: Optional[dict] = None,
    options: RunOptions | str | Path | None = None,
    cache: Optional[str | Path] = None,
    data: Optional[str] = None,
    device="cpu",
    batch_size: int = 64,
    class_names=None,
    proxy_reference: Optional[str] = None,
    target_scores_model=None,
    paired_with: Optional[str] = None,
    request: Optional[dict] = None,
    **old,
) -> tuple[Optional[pd.DataFrame], Optional[dict]]:
    """Score generation runs (or image folders, or data-set splits) against ``protocol.reference``.

    runs: source specs (:mod:`lantern.quality.sources`); extractors: names of
    :data:`lantern.quality.features.EXTRACTORS` (None: the offline ones whose weights are present,
    :func:`lantern.quality.features.default_extractors`, with a note on what was skipped);
    weights: {extractor or "clip"/"hps": path};
    options: :class:`~ambiguity.runs.RunOptions`, or just ``out`` (the old keywords ``out``,
    ``overwrite``, ``progress`` and ``shard`` still work): ``out`` the run directory for
    resumable parts and the outputs (None: nothing written but the reference cache); cache:
    reference-statistics cache (False: none); proxy_reference: a generate run for PSNR / token
    match; target_scores_model: a loaded TokenModel for NLL and class consistency; paired_with:
    one of ``runs`` whose metrics every other set of the same n is compared with by a paired
    bootstrap (``record["paired"]``, ``paired.parquet``).
    The shard (:mod:`ambiguity.distributed`): every set's images are split into chunks of whole
    extractor batches; shard i extracts the chunks ``c % n == i`` as parts of ``out`` and the
    merging process computes every metric from all chunks (equal to one process's). request:
    stored with the run for ``python -m ambiguity merge`` (the CLI's arguments). Returns
    (metrics DataFrame, the evaluation record), (None, None) on a shard that does not merge.
    Every input is checked before anything is computed; raises UsageError (module docstring).
    """
    t0 = time.perf_counter()
    opts = RunOptions.of(options, **old)
    out, shard = opts.out, opts.shard
    if not runs:
        raise UsageError("name at least one run to evaluate")
    check_run_names(runs, paired_with)
    if not 0.0 < protocol.level < 1.0:
        raise UsageError(f"--level must be strictly between 0 and 1 (the intervals' coverage), got {protocol.level}")
    sets = [load_source(r, protocol.seed, data, what="run") for r in runs]
    ref = load_source(protocol.reference, protocol.seed, data, resize_to=sets[0].hw, what="reference")
    check_sizes(sets, ref)
    check_counts(sets, ref, extractors)
    check_bootstrap(protocol.bootstrap, max(s.n for s in sets))
    if protocol.clip_score:
        locate_weights("clip", (weights or {}).get("clip") or protocol.clip_model)
    notes: list[str] = [n for s in (*sets, ref) for n in s.info.get("notes", [])]
    if extractors is None:
        extractors, skipped = default_extractors(weights)
        notes += skipped
    exs = load_extractors(extractors, weights, device)
    proxy = load_run(proxy_reference) if proxy_reference else None
    _labels(sets)
    record = protocol_record(protocol, ref)
    run_dir = None
    if shard.count > 1 and out is None:
        raise UsageError("a sharded evaluation needs --out: the shards meet in its parts")
    if out is not None:
        run_dir = RunDir(
            out,
            {
                "protocol": {k: v for k, v in record.items() if k != "reference_set"},
                "reference_fingerprint": ref.fingerprint,
                "data": data,
            },
            command=COMMAND,
            outputs=OUTPUTS,
            merge=MERGE,
        )
        extra = {"request": request or {}}  # whichever shard starts the run records the command
        run_dir.open_shared(shard, opts.overwrite, extra)
    frames, boot = [], {}
    for s in tqdm(sets, desc="evaluate", unit="run", disable=not opts.progress):
        f, boot[s.spec] = _score_set(
            s,
            ref,
            exs,
            protocol,
            cache=cache,
            batch_size=batch_size,
            run_dir=run_dir,
            weights=dict(weights or {}),
            device=device,
            class_names=class_names,
            proxy_reference=proxy,
            target=target_scores_model,
            notes=notes,
            shard=shard,
        )
        frames.append(f)
    if not shard.merges:
        return None, None
    df = pd.concat(frames, ignore_index=True)
    paired = paired_table(df, boot, paired_with, protocol.level) if paired_with else pd.DataFrame()
    df = df[
        ["run", "label", "metric", "extractor", "value", "ci_low", "ci_high", "n", "bootstrap"]
        + [c for c in ("reference_images",) if c in df]
    ]
    if sets[0].n < 5000:
        notes.append(
            f"FID/KID at n = {sets[0].n} are biased upward (FID strongly); compare only at equal n; "
            f"papers use 5k-50k images ({', '.join(f'{k}: {v}' for k, v in PAPER_SAMPLE_SIZES.items())})"
        )
    rec = {
        "command": COMMAND,
        "protocol": record,
        "extractors": [e.describe() for e in exs],
        "runs": [
            {
                "spec": s.spec,
                "label": s.label,
                "images": s.n,
                "fingerprint": s.fingerprint,
                **{k: v for k, v in s.info.items() if k not in ("class_names", "seeds", "image_indices")},
            }
            for s in sets
        ],
        "results": df.to_dict(orient="records"),
        "paired": paired.to_dict(orient="records"),
        "notes": list(dict.fromkeys(notes)),
        "wall_time_s": round(time.perf_counter() - t0, 2),
    }
    if run_dir is not None:
        write_table(df, run_dir.path / "metrics.parquet")
        if len(paired):
            write_table(paired, run_dir.path / "paired.parquet")
        write_json(rec, run_dir.path / "evaluation.json")
    return df, rec


def score_images(
    images,
    reference: str = "fashion-mnist:test",
    extractors: Optional[Sequence[str]] = None,
    conditions: Optional[Sequence] = None,
    class_names: Optional[Sequence[str]] = None,
    protocol: Optional[Protocol] = None,
    weights: Optional[dict] = None,
    data: Optional[str] = None,
    cache: Optional[str | Path] = None,
    device="cpu",
    batch_size: int = 64,
    label: str = "images",
) -> dict:
    """Quality metrics of in-memory images, for the decoding sweep and notebooks.

    images: (N, C, H, W) float in [0, 1] (torch or numpy; grey or RGB); reference: a source
    spec (default the Fashion-MNIST test split); extractors: feature extractors to use (None:
    as :func:`evaluate_runs`);
    conditions / class_names: for the CLIP score (``protocol.clip_score``). Returns
    ``{metric: {"value", "ci_low", "ci_high", "n", "bootstrap"}, ..., "protocol": {...},
    "extractors": [...], "notes": [...]}`` with metric names as :func:`evaluate_runs`
    (``fid_fmnist``, ``precision_mobilenet``, ``clip_score``, ...). Extractors and reference
    statistics are loaded once per process (and the statistics cached on disk).
    """
    p = replace(protocol or Protocol(), reference=reference)
    x = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images, dtype=torch.float32)
    if x.ndim != 4 or x.shape[1] not in (1, 3) or len(x) == 0:
        raise UsageError(f"score_images needs images (N >= 1, 1 or 3, H, W), got shape {tuple(x.shape)}")
    s = ImageSet(
        label,
        label,
        x,
        None if conditions is None else list(conditions),
        "in-memory",
        {"kind": "memory", "class_names": list(class_names) if class_names else None},
    )
    ref = load_source(p.reference, p.seed, data, resize_to=s.hw, what="reference")
    check_sizes([s], ref)
    check_bootstrap(p.bootstrap, s.n)
    notes: list[str] = list(ref.info.get("notes", []))
    if extractors is None:
        extractors, skipped = default_extractors(weights)
        notes += skipped
    exs = load_extractors(extractors, weights, device)
    df, _ = _score_set(
        s,
        ref,
        exs,
        p,
        cache=cache,
        batch_size=batch_size,
        run_dir=None,
        weights=dict(weights or {}),
        device=device,
        class_names=class_names,
        notes=notes,
    )
    out = {
        r["metric"]: {k: r[k] for k in ("value", "ci_low", "ci_high", "n", "bootstrap")}
        for r in df.to_dict(orient="records")
    }
    out.update(protocol=protocol_record(p, ref), extractors=[e.describe() for e in exs], notes=notes)
    return out


def _cell(r) -> str:
    v, lo, hi = r["value"], r["ci_low"], r["ci_high"]
    fmt = (lambda z: f"{z:.4f}") if abs(v) < 10 else (lambda z: f"{z:.2f}")
    return fmt(v) + (f" [{fmt(lo)}, {fmt(hi)}]" if np.isfinite(lo) else "")


def wide_table(df: pd.DataFrame, metrics: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """One row per run (label), one column per metric (all, or those whose name starts with one
    of ``metrics``), cells ``value [lo, hi]``, and n."""
    if metrics is not None:
        df = df[[any(m.startswith(k + "_") or m == k for k in metrics) for m in df["metric"]]]
    cells = df.assign(cell=[_cell(r) for r in df.to_dict(orient="records")])
    wide = cells.pivot_table(index="label", columns="metric", values="cell", aggfunc="first", sort=False)
    wide.insert(0, "n", cells.groupby("label", sort=False)["n"].max())
    return wide[["n"] + [c for c in dict.fromkeys(df["metric"]) if c in wide.columns]]


SPEED = {"acceptance_rate": "α", "tau": "τ", "tokens_per_forward": "tok/fwd"}


def speed_quality_table(
    df: pd.DataFrame, record: dict, metrics: Sequence[str] = ("fid", "kid", "precision", "recall")
) -> pd.DataFrame:
    """Speed next to quality: per run, acceptance rate α, τ (bonus counted) and step compression
    from its summary, then ``metrics`` of every extractor (cells ``value [lo, hi]``)."""
    wide = wide_table(df, metrics)
    speed = {r["label"]: r.get("speed") or {} for r in record["runs"]}
    for i, (key, short) in enumerate(SPEED.items()):
        wide.insert(1 + i, short, [speed.get(lab, {}).get(key, np.nan) for lab in wide.index])
    return wide


def flat_scores(scores: dict) -> dict:
    """:func:`score_images` output -> one flat row: ``{metric: value, metric_lo: ..., metric_hi: ...}``
    (for a sweep table such as ``benchmarks/results/decoding.parquet``)."""
    row = {}
    for name, v in scores.items():
        if isinstance(v, dict) and "value" in v:
            row[name], row[f"{name}_lo"], row[f"{name}_hi"] = v["value"], v["ci_low"], v["ci_high"]
    return row


def build_parser() -> ArgumentParser:
    """The argument parser of ``python -m lantern.evaluate``."""
    p = ArgumentParser(
        prog=COMMAND,
        description="Image quality of generation runs against a reference set "
        "(FID, KID, precision/recall, density/coverage, CLIP score, HPS v2.1).",
    )
    p.add_argument("runs", nargs="+", help="lantern.generate run directories, image folders or fashion-mnist:SPLIT[@N]")
    p.add_argument(
        "--reference",
        default="fashion-mnist:test",
        help="reference set: fashion-mnist:test|train[@N], an image folder or a run (default: fashion-mnist:test)",
    )
    p.add_argument(
        "--extractors",
        default=None,
        help=f"feature extractors, comma-separated: {', '.join(EXTRACTORS)} (default: {','.join(OFFLINE)}, "
        f"mobilenet only when its weights are found, with a note otherwise)",
    )
    p.add_argument(
        "--weights",
        action="append",
        default=None,
        metavar="NAME=PATH",
        help="weights of an extractor (or clip / hps), e.g. mobilenet=~/mobilenet_v2-b0353104.pth",
    )
    p.add_argument(
        "--bootstrap",
        type=nonneg_int,
        default=100,
        help="groups of the jackknife behind the intervals (at most n), 0 = none (default: 100)",
    )
    p.add_argument("--level", type=unit_float, default=0.95, help="interval coverage (default: 0.95)")
    p.add_argument(
        "--nearest-k",
        "--k",
        dest="k",
        type=positive_int,
        default=3,
        metavar="K",
        help="k of the k-NN metrics (precision/recall, density/coverage) (default: 3); --k is its former "
        "name, still accepted (elsewhere --k is the latent neighbourhood size)",
    )
    p.add_argument(
        "--prdc-reference",
        choices=("matched", "full"),
        default="matched",
        help="precision/recall reference: a seeded subset of the run's size, or all (default: matched)",
    )
    p.add_argument("--seed", type=seed_int, default=0, help="seed of subsets and resamples (default: 0)")
    p.add_argument("--clip-score", action="store_true", help="CLIP score of images vs captions / class prompts")
    p.add_argument("--clip-model", default=Protocol.clip_model, help="CLIP repository in the HF cache or a directory")
    p.add_argument(
        "--clip-scale",
        choices=CLIP_SCALES,
        default="cosine",
        help="cosine: raw cosine as LANTERN reports; x100: 100*max(cos,0) as torchmetrics (default: cosine)",
    )
    p.add_argument("--prompt", default=Protocol.prompt_template, help="prompt template for class labels")
    p.add_argument("--class-names", default=None, metavar="FILE", help="class names, one per line (c2i CLIP score)")
    p.add_argument("--hps", action="store_true", help="HPS v2.1 (needs open_clip and HPS_v2.1_compressed.pt)")
    p.add_argument(
        "--proxy-reference",
        default=None,
        metavar="RUN",
        help="a run (usually --method ar, same seeds) for PSNR and token match of the same image index",
    )
    p.add_argument("--target-scores", action="store_true", help="target NLL and class consistency (loads the model)")
    p.add_argument(
        "--paired-with",
        default=None,
        metavar="RUN",
        help="one of the runs (e.g. runs/ar): print every metric's difference to it with a paired "
        "jackknife interval (same image indices = same seeds and classes)",
    )
    add_data_arg(p)
    p.add_argument("--cache", default=None, metavar="DIR", help="reference-statistics cache")
    add_device_args(p, dtype=False, what="for the extractors and --target-scores")
    p.add_argument("--batch-size", type=positive_int, default=64, help="images per extractor forward (default: 64)")
    add_out_arg(p, "output run directory (default: runs/evaluate)", default="runs/evaluate")
    p.add_argument(
        "--figure",
        default=None,
        metavar="PATH",
        help="figure path without suffix: τ and FID/precision/recall vs δ per k, when LANTERN runs are "
        "given (default: <out>/quality_sweep)",
    )
    add_overwrite_arg(p)
    add_progress_arg(p)
    add_shard_args(p)
    return p


def _class_names(path: Optional[str]) -> Optional[list[str]]:
    if path is None:
        return None
    try:
        names = [ln.strip() for ln in Path(path).expanduser().read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"cannot read --class-names {path} ({type(exc).__name__}); pass a text file, one name a line"
        ) from None
    if not names:
        raise UsageError(f"--class-names {path} is empty; pass one class name per line")
    return names


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    """CLI entry point (module docstring); 0, or 2 with one ``error:`` line."""
    args = build_parser().parse_args(argv)
    request = {"argv": [a for a in (argv if argv is not None else sys.argv[1:])]}
    return _run(args, shard_from_args(args, resolve_device(args.device)), request)


def merge_run(path: str | Path, figures: bool = True) -> int:
    """``python -m ambiguity merge RUN`` for an evaluation split over independent shards: the
    stored command's metrics and outputs from every shard's feature chunks (a missing chunk is
    refused with one line)."""
    record = RunDir(path, {}, command=COMMAND).stored() or {}
    argv = list((record.get("request") or {}).get("argv") or [])
    if not argv:
        raise UsageError(f"{path} does not record the evaluate command that wrote it; rerun that command")
    drop = {"--shard-index", "--num-shards"}
    kept = [a for i, a in enumerate(argv) if a not in drop and (i == 0 or argv[i - 1] not in drop)]
    args = build_parser().parse_args(kept)
    return _run(args, merging_shard(int(record.get("shards") or 1)), {"argv": kept})


def parse_extractors(text: Optional[str]) -> Optional[list[str]]:
    """``--extractors`` -> names (None when not given: :func:`default_extractors` decides);
    UsageError for an unknown name."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in EXTRACTORS]
    if bad:
        raise UsageError(f"unknown extractor {bad[0]!r}; --extractors takes {', '.join(EXTRACTORS)}")
    return names


def _run(args, shard: Shard, request: dict) -> int:
    names = parse_extractors(args.extractors)
    check_bootstrap(args.bootstrap, 1)  # the least any run needs: refused before a source or network loads
    weights = parse_mapping(args.weights, list(EXTRACTORS) + ["hps"], "--weights", must_exist=False)
    out = check_out_dir(args.out)
    if args.figure is not None:
        check_out_file(args.figure, "--figure")
    if args.cache is not None:
        check_out_dir(args.cache, "--cache")
    device = resolve_device(args.device)
    protocol = Protocol(
        reference=args.reference,
        k=args.k,
        bootstrap=args.bootstrap,
        level=args.level,
        seed=args.seed,
        prdc_reference=args.prdc_reference,
        clip_score=args.clip_score,
        clip_model=args.clip_model,
        clip_scale=args.clip_scale,
        prompt_template=args.prompt,
        hps=args.hps,
    )
    target = None
    if args.target_scores:
        gen = [parse_spec(r)[0] for r in [args.proxy_reference, *args.runs] if r]
        gen = [r for r in gen if (Path(r).expanduser() / "summary.json").is_file()]
        if not gen:
            raise UsageError(
                "--target-scores needs a lantern.generate run among the runs (its model scores the tokens)"
            )
        s = load_run(gen[0])["summary"].get("settings", {})
        target = load_model(s.get("model", "embedded"), weights=s.get("weights"), device=device)
    df, rec = evaluate_runs(
        args.runs,
        protocol,
        names,
        weights,
        RunOptions.from_args(args, shard, out),
        args.cache,
        args.data,
        device,
        args.batch_size,
        _class_names(args.class_names),
        args.proxy_reference,
        target,
        args.paired_with,
        request,
    )
    if df is None:
        print(
            f"{shard.label} done: its feature chunks are parts of {out}"
            + ("" if shard.group else f"; after every shard, run python -m ambiguity merge {out}")
        )
        return 0
    with pd.option_context("display.width", 250, "display.max_columns", 50):
        print(
            f"speed and quality against {args.reference} (jackknife over min({args.bootstrap}, n) groups, "
            f"{100 * args.level:g} % intervals):"
        )
        print(speed_quality_table(df, rec).to_string())
        names = [e["name"] for e in rec["extractors"]]
        for ex in [""] + names:
            sub = df[df["extractor"] == ex]
            if len(sub):
                print(f"\n== {ex or 'per-image scores'} ==")
                print(wide_table(sub).to_string())
        if rec["paired"]:
            pt = pd.DataFrame(rec["paired"]).rename(columns={"diff": "value"})
            print(f"\n== difference to {args.paired_with} (paired jackknife over image indices) ==")
            print(wide_table(pt.assign(n=pt["n"])).to_string())
    for note in rec["notes"]:
        print(f"note: {note}")
    files = []
    if any(r.get("method") in ("lantern", "lantern-jsd") for r in rec["runs"]):
        frame = sweep_frame(df, rec)
        write_table(frame, out / "sweep.parquet")
        files = plot_quality_sweep(frame, args.figure or out / "quality_sweep", names)
    print(f"wrote {out}/metrics.parquet, {out}/evaluation.json" + "".join(f", {f}" for f in files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
