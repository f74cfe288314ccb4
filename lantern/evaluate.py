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
``evaluation.json`` (the protocol — reference set and split, image count, the
caption rule each set's prompts came from (with the captions file's SHA-256 a generate run
records), resize and crop rule, extractors with their weights' SHA-256, CLIP scale, seeds, the
intervals' measured coverage — the runs with their image count n and distinct images, and their
results) and the printed table. A run's label names its method, k, δ (or λ) and drafting shape
(``chain γ=4``, ``static tree NAME``, ``dynamic tree (59,4,10)``); a set holding repeated images
(greedy decoding with CFG) gets a ``note:`` saying how many are distinct, a negative KID one saying
why; the ``quality_sweep`` figure needs two or more LANTERN settings (else a note). Each (run,
extractor) pair is saved as a part when it is done, so an interrupted evaluation resumes and adding
runs reuses the others;
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
    seed_int,
    unit_float,
)
from ambiguity.distributed import Shard, merging_shard, shard_from_args
from ambiguity.errors import UsageError
from ambiguity.io import write_json, write_table
from ambiguity.models.base import resolve_device
from ambiguity.models.registry import load_model
from ambiguity.runs import RunDir, RunOptions
from lantern.quality.checks import (
    check_bootstrap,
    check_counts,
    check_run_names,
    check_sizes,
    parse_extractors,
    read_class_names,
)
from lantern.quality.features import EXTRACTORS, OFFLINE, default_extractors, load_extractors, locate_weights
from lantern.quality.report import plot_quality_sweep, sweep_frame, sweep_settings
from lantern.quality.scoring import PAPER_SAMPLE_SIZES, QualityProtocol, protocol_record
from lantern.quality.set_scoring import caption_rule, score_set
from lantern.quality.sources import ImageSet, distinct_images, duplicate_note, load_source, parse_spec
from lantern.quality.tables import paired_table, speed_quality_table, wide_table
from lantern.quality.text import CLIP_SCALES
from lantern.run_reader import drafting_shape, load_run, run_label

__all__ = ["evaluate_runs", "score_images", "kid_notes", "build_parser", "main", "COMMAND", "OUTPUTS"]

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


def _labels(sets: Sequence[ImageSet]) -> None:
    """Legend text of every set: a run's method, k, δ and drafting shape (chain γ, static or
    dynamic tree) and its subset; a label that repeats gets its folder's name."""
    for s in sets:
        if s.info.get("kind") == "run":
            rule = {**(s.info.get("rule") or {}), "method": s.info.get("method")}
            s.label = " ".join(
                x for x in (run_label({"method": s.info.get("method"), "rule": rule}), drafting_shape(rule)) if x
            )
            k = parse_spec(s.spec)[1]
            s.label += "" if k is None else f" @{k}" if k > 0 else f" @:{-k}"
    seen = [s.label for s in sets]
    for s in sets:
        if seen.count(s.label) > 1:
            s.label = f"{s.label} ({Path(s.spec).name})"


def _load_sets(runs, protocol: QualityProtocol, extractors, weights, data, paired_with):
    """The generated sets and the reference, every input checked (UsageError) before any work."""
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
    _labels(sets)
    return sets, ref


def _extractors(sets, ref: ImageSet, extractors, weights, device) -> tuple[list, list[str]]:
    """The loaded extractors and the notes so far: the sources' own, repeated images, skipped extractors."""
    notes: list[str] = [n for s in (*sets, ref) for n in s.info.get("notes", [])]
    notes += [n for n in (duplicate_note(s) for s in sets) if n]
    if extractors is None:
        extractors, skipped = default_extractors(weights)
        notes += skipped
    return load_extractors(extractors, weights, device), notes


def _caption_rules(sets, protocol: QualityProtocol, class_names) -> dict:
    """{spec: the caption rule applied to that set} (:func:`lantern.quality.set_scoring.caption_rule`)."""
    return {s.spec: caption_rule(s, protocol, class_names) for s in sets}


def _open_run_dir(opts: RunOptions, record: dict, ref: ImageSet, data, request) -> Optional[RunDir]:
    """The evaluation's run directory (None without ``out``), opened for this shard."""
    if opts.shard.count > 1 and opts.out is None:
        raise UsageError("a sharded evaluation needs --out: the shards meet in its parts")
    if opts.out is None:
        return None
    run_dir = RunDir(
        opts.out,
        {
            "protocol": {k: v for k, v in record.items() if k != "reference_set"},
            "reference_fingerprint": ref.fingerprint,
            "data": data,
        },
        command=COMMAND,
        outputs=OUTPUTS,
        merge=MERGE,
    )
    run_dir.open_shared(opts.shard, opts.overwrite, {"request": request or {}})  # whichever shard starts records it
    return run_dir


def kid_notes(df: pd.DataFrame) -> list[str]:
    """A note for every KID row whose value or interval lies below 0: KID is an unbiased estimate of
    MMD² (>= 0), negative when the two sets are closer than its noise at this n."""
    out = []
    for r in df[df["metric"].str.startswith("kid") & (df["value"] < 0)].itertuples():
        below = "its whole interval" if r.ci_high < 0 else "its value"
        out.append(
            f"{r.label}: {r.metric} = {r.value:.3g} [{r.ci_low:.3g}, {r.ci_high:.3g}], {below} below 0: KID is an "
            f"unbiased estimate of MMD² >= 0 whose noise at n = {r.n} exceeds the distance; read it as "
            f"no difference detected from the reference at this n, not as a negative distance"
        )
    return out


def _run_entry(s: ImageSet, rules: dict) -> dict:
    """A set's entry in ``evaluation.json``'s ``runs``: spec, label, image count, distinct images, facts."""
    return {
        "spec": s.spec,
        "label": s.label,
        "images": s.n,
        "distinct_images": distinct_images(s.images),
        "caption_rule": rules[s.spec],
        "fingerprint": s.fingerprint,
        **{k: v for k, v in s.info.items() if k not in ("class_names", "seeds", "image_indices")},
    }


def evaluate_runs(
    runs: Sequence[str],
    protocol: QualityProtocol = QualityProtocol(),
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
) -> tuple[Optional[pd.DataFrame], Optional[dict]]:
    """Score generation runs (or image folders, or data-set splits) against ``protocol.reference``.

    runs: source specs (:mod:`lantern.quality.sources`); extractors: names of
    :data:`lantern.quality.features.EXTRACTORS` (None: :func:`lantern.quality.features.default_extractors`,
    with a note on what was skipped); weights: {extractor or "clip"/"hps": path}; options:
    :class:`~ambiguity.runs.RunOptions` or just ``out``, the run directory of resumable parts and
    outputs (None: nothing written but the reference cache); cache: reference-statistics cache
    (False: none); proxy_reference: a generate run for PSNR / token match; target_scores_model: a
    loaded TokenModel for NLL and class consistency; paired_with: one of ``runs`` that every other
    set of the same n is compared with (``record["paired"]``, ``paired.parquet``). A shard
    (:mod:`ambiguity.distributed`) extracts its chunks ``c % n == i`` of whole extractor batches as
    parts of ``out``; the merging process computes every metric (equal to one process's). request:
    the CLI's arguments, stored for ``python -m ambiguity merge``. Returns (metrics DataFrame, the
    evaluation record: each run's ``images`` (n), ``distinct_images`` (a note when fewer) and
    ``caption_rule``), (None, None) on a shard that does not merge. Every input is checked before
    anything is computed; raises UsageError (module docstring).
    """
    t0 = time.perf_counter()
    opts = RunOptions.of(options)
    sets, ref = _load_sets(runs, protocol, extractors, weights, data, paired_with)
    exs, notes = _extractors(sets, ref, extractors, weights, device)
    proxy = load_run(proxy_reference) if proxy_reference else None
    rules = _caption_rules(sets, protocol, class_names)
    record = protocol_record(protocol, ref, "; ".join(dict.fromkeys(rules.values())))
    run_dir = _open_run_dir(opts, record, ref, data, request)
    options = dict(cache=cache, batch_size=batch_size, run_dir=run_dir, weights=dict(weights or {}), device=device)
    options.update(class_names=class_names, proxy_reference=proxy, target=target_scores_model, notes=notes)
    frames, boot = _score_sets(sets, ref, exs, protocol, opts, options)
    if not opts.shard.merges:
        return None, None
    df = pd.concat(frames, ignore_index=True)
    paired = paired_table(df, boot, paired_with, protocol.level) if paired_with else pd.DataFrame()
    df = df[
        ["run", "label", "metric", "extractor", "value", "ci_low", "ci_high", "n", "bootstrap"]
        + [c for c in ("reference_images",) if c in df]
    ]
    notes += kid_notes(df) + _small_n_notes(sets[0].n)
    rec = {
        "command": COMMAND,
        "protocol": record,
        "extractors": [e.describe() for e in exs],
        "runs": [_run_entry(s, rules) for s in sets],
        "results": df.to_dict(orient="records"),
        "paired": paired.to_dict(orient="records"),
        "notes": list(dict.fromkeys(notes)),
        "wall_time_s": round(time.perf_counter() - t0, 2),
    }
    if run_dir is not None:
        _write_outputs(run_dir.path, df, paired, rec)
    return df, rec


def _score_sets(sets, ref, exs, protocol, opts: RunOptions, options: dict):
    """Every set's metric rows and resampled values (:func:`lantern.quality.set_scoring.score_set`
    with the keyword arguments ``options``: cache, batch_size, run_dir, weights, device, ...)."""
    frames, boot = [], {}
    for s in tqdm(sets, desc="evaluate", unit="run", disable=not opts.progress):
        f, boot[s.spec] = score_set(s, ref, exs, protocol, shard=opts.shard, **options)
        frames.append(f)
    return frames, boot


def _write_outputs(out: Path, df: pd.DataFrame, paired: pd.DataFrame, rec: dict) -> None:
    """metrics.parquet, paired.parquet (when there are paired rows) and evaluation.json."""
    write_table(df, out / "metrics.parquet")
    if len(paired):
        write_table(paired, out / "paired.parquet")
    write_json(rec, out / "evaluation.json")


def _small_n_notes(n: int) -> list[str]:
    """The small-n bias note of FID / KID (none from 5,000 images on)."""
    if n >= 5000:
        return []
    return [
        f"FID/KID at n = {n} are biased upward (FID strongly); compare only at equal n; "
        f"papers use 5k-50k images ({', '.join(f'{k}: {v}' for k, v in PAPER_SAMPLE_SIZES.items())}); "
        f"their 95 % intervals cover 0.915-0.935 in a simulation, the misses above them (evaluation.json: "
        f"protocol.bootstrap_scheme)"
    ]


def score_images(
    images,
    reference: str = "fashion-mnist:test",
    extractors: Optional[Sequence[str]] = None,
    conditions: Optional[Sequence] = None,
    class_names: Optional[Sequence[str]] = None,
    protocol: Optional[QualityProtocol] = None,
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
    p = replace(protocol or QualityProtocol(), reference=reference)
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
    options = dict(cache=cache, batch_size=batch_size, run_dir=None, weights=dict(weights or {}), device=device)
    options.update(class_names=class_names, notes=notes)
    (df,), _ = _score_sets([s], ref, exs, p, RunOptions(progress=False), options)
    out = {
        r["metric"]: {k: r[k] for k in ("value", "ci_low", "ci_high", "n", "bootstrap")}
        for r in df.to_dict(orient="records")
    }
    notes += [n for n in (duplicate_note(s),) if n]
    record = protocol_record(p, ref, caption_rule(s, p, class_names))
    out.update(protocol=record, extractors=[e.describe() for e in exs], notes=notes)
    return out


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
    _add_interval_args(p)
    _add_text_args(p)
    _add_proxy_args(p)
    _add_output_args(p)
    return p


def _add_interval_args(p: ArgumentParser) -> None:
    """The intervals and the k-NN metrics: --bootstrap, --level, --nearest-k, --prdc-reference, --seed."""
    p.add_argument(
        "--bootstrap",
        type=nonneg_int,
        default=100,
        help="groups of the jackknife behind the intervals (at most n), 0 = none (default: 100)",
    )
    p.add_argument("--level", type=unit_float, default=0.95, help="interval coverage (default: 0.95)")
    p.add_argument(
        "--nearest-k",
        dest="k",
        type=positive_int,
        default=3,
        metavar="K",
        help="k of the k-NN metrics (precision/recall, density/coverage) (default: 3)",
    )
    p.add_argument(
        "--prdc-reference",
        choices=("matched", "full"),
        default="matched",
        help="precision/recall reference: a seeded subset of the run's size, or all (default: matched)",
    )
    p.add_argument("--seed", type=seed_int, default=0, help="seed of subsets and resamples (default: 0)")


def _add_text_args(p: ArgumentParser) -> None:
    """CLIP score and HPS: --clip-score, --clip-model, --clip-scale, --prompt, --class-names, --hps."""
    p.add_argument("--clip-score", action="store_true", help="CLIP score of images vs captions / class prompts")
    p.add_argument(
        "--clip-model", default=QualityProtocol.clip_model, help="CLIP repository in the HF cache or a directory"
    )
    p.add_argument(
        "--clip-scale",
        choices=CLIP_SCALES,
        default="cosine",
        help="cosine: raw cosine as LANTERN reports; x100: 100*max(cos,0) as torchmetrics (default: cosine)",
    )
    p.add_argument("--prompt", default=QualityProtocol.prompt_template, help="prompt template for class labels")
    p.add_argument("--class-names", default=None, metavar="FILE", help="class names, one per line (c2i CLIP score)")
    p.add_argument("--hps", action="store_true", help="HPS v2.1 (needs open_clip and HPS_v2.1_compressed.pt)")


def _add_proxy_args(p: ArgumentParser) -> None:
    """The offline proxies and paired differences: --proxy-reference, --target-scores, --paired-with."""
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


def _add_output_args(p: ArgumentParser) -> None:
    """Data, cache, device, batch size, outputs, resume and shards."""
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


def _print_tables(df: pd.DataFrame, rec: dict, args) -> None:
    """The printed tables: speed and quality, one table per extractor, the paired differences."""
    with pd.option_context("display.width", 250, "display.max_columns", 50):
        print(
            f"speed and quality against {args.reference} (jackknife over min({args.bootstrap}, n) groups, "
            f"{100 * args.level:g} % intervals):"
        )
        print(speed_quality_table(df, rec).to_string())
        for ex in [""] + [e["name"] for e in rec["extractors"]]:
            sub = df[df["extractor"] == ex]
            if len(sub):
                print(f"\n== {ex or 'per-image scores'} ==")
                print(wide_table(sub).to_string())
        if rec["paired"]:
            pt = pd.DataFrame(rec["paired"]).rename(columns={"diff": "value"})
            print(f"\n== difference to {args.paired_with} (paired jackknife over image indices) ==")
            print(wide_table(pt.assign(n=pt["n"])).to_string())


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
    protocol = QualityProtocol(
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
        target = load_model(
            s.get("model", "embedded"), weights=s.get("weights"), device=device, image_size=s.get("image_size")
        )
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
        read_class_names(args.class_names),
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
    _print_tables(df, rec, args)
    for note in rec["notes"]:
        print(f"note: {note}")
    files = []
    if any(r.get("method") in ("lantern", "lantern-jsd") for r in rec["runs"]):
        frame = sweep_frame(df, rec)
        write_table(frame, out / "sweep.parquet")
        if sweep_settings(frame) > 1:
            files = plot_quality_sweep(
                frame, args.figure or out / "quality_sweep", [e["name"] for e in rec["extractors"]]
            )
        else:
            print("note: one LANTERN setting (k, δ) only: no quality_sweep figure, a sweep needs two or more")
    print(f"wrote {out}/metrics.parquet, {out}/evaluation.json" + "".join(f", {f}" for f in files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
