"""Regenerate the LANTERN paper (Jang et al., ICLR 2025, arXiv 2410.03355) with one command.

    python -m lantern.paper                    # the embedded model and its text twin, full size
    python -m lantern.paper --quick            # a few images per measurement (< 10 min on 2 CPU cores)
    python -m lantern.paper --models llamagen-t2i-stage1,hf:meta-llama/Llama-3.1-8B \\
        --weights llamagen-t2i-stage1=/ckpt/llamagen --captions coco_val.txt --device cuda
    torchrun --nproc_per_node=8 -m lantern.paper --models anole ...     # decoding rounds split across GPUs

writes ``runs/paper/<name>/`` (``--name``, default ``default`` or ``quick``): one folder per item
with its figure (PNG + PDF) and tables (CSV + Markdown), and ``report.md``, which shows every
item next to the paper's published values (:mod:`lantern.paper.published`) and states every
setting. Items (:data:`lantern.paper.experiments.EXPERIMENTS`, ``--only`` picks some):

* ``fig2a`` mean accepted length of lossless SD (EAGLE-2 tree) per model; ``fig2b`` drafter test
  accuracy per epoch and a random-init vs trained drafter; ``fig2c`` average top-1 probability
  and top-10 mass with intervals; ``fig3`` latent interchangeability; ``fig4`` samples over δ
  and k; ``fig5`` quality vs speed-up and τ over δ and k; ``table2`` AR / EAGLE-2 / LANTERN at
  temperature 0 and 1, plus the precision/recall grid; ``table3`` neighbour metric and TVD vs
  JSD; ``f1`` speed-up vs number of images; ``f2`` cost of building A inside the real decoding
  step; ``distortion`` the exact per-step TVD(output, p) and its drivers on ``pairs_images`` AR samples.

The items are functions of :mod:`lantern.paper.experiments` (``distortion`` of
:mod:`lantern.paper.distortion_item`); the methods, main sessions, method rows and notes they share
are in :mod:`lantern.paper.methods`, Fig. 5's plot in :mod:`lantern.paper.quality_speed`.

Resumable at two levels: a finished item is a checked part of the run (not recomputed), and the
decoding sessions it reads keep every finished image (:mod:`lantern.paper.sessions`). The
decoding experiments run on the first image model of ``--models``; k and top-k are mapped to its
codebook by the paper's fraction (:func:`lantern.paper.config.map_to_codebook`).
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tqdm.auto import tqdm

from ambiguity.errors import UsageError
from ambiguity.run_records import normalise, versions
from ambiguity.runs import RunDir, RunOptions, shard_units
from lantern.paper.config import PaperConfig
from lantern.paper.context import Context
from lantern.paper.experiments import EXPERIMENTS
from lantern.paper.report import Item, item_of, item_unit, load_item, save_item, write_report

__all__ = ["run_paper", "select", "COMMAND"]

COMMAND = "python -m lantern.paper"
OUTPUTS = ("report.md",) + tuple(EXPERIMENTS)


def select(only: Optional[Sequence[str] | str]) -> list[str]:
    """The experiments to run, in the paper's order; raises UsageError naming an unknown one."""
    if only is None:
        return list(EXPERIMENTS)
    names = [n.strip() for n in (only.split(",") if isinstance(only, str) else only) if n.strip()]
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown or not names:
        raise UsageError(
            f"unknown experiment {unknown[0] if unknown else '(none given)'!r} in --only; choose from "
            f"{', '.join(EXPERIMENTS)}"
        )
    return [n for n in EXPERIMENTS if n in names]


def run_paper(
    config: PaperConfig,
    options: RunOptions | str | Path | None = None,
    only: Optional[Sequence[str] | str] = None,
) -> Optional[Path]:
    """Run (or resume) the selected experiments into the run directory and write ``report.md``.

    options: :class:`~ambiguity.runs.RunOptions` (``out`` is required), or just the run
    directory.
    Every shard takes part in every item (the decoding sessions split their rounds across
    shards, :mod:`lantern.paper.sessions`); the merging one keeps the items and writes the report.
    Returns the report's path (None on a shard that does not merge). Raises UsageError for an
    unknown experiment, an ``out`` holding a run of other settings (unless ``overwrite``), a model
    without a drafter (naming the command that trains one) or without a codebook / decoder where
    an experiment needs one; TypeError without ``out``.
    """
    opts = RunOptions.of(options)
    if opts.out is None:
        raise TypeError("run_paper needs a run directory: options=RunOptions(out=...) or out=...")
    shard = opts.shard
    names = select(only)
    t0 = time.perf_counter()
    run = RunDir(opts.out, {"config": config.settings()}, command=COMMAND, outputs=OUTPUTS)
    if not opts.overwrite:
        run.check(only=("config",))  # another run's settings: refused before anything loads (digests after)
    ctx = Context(config, run, shard, opts.progress)
    run = ctx.run = _open(ctx, names, opts.overwrite)
    timings = {}
    units = [item_unit(n) for n in names]
    bar = tqdm(total=len(names), desc="paper", unit="item", disable=not opts.progress or not shard.merges, position=0)
    for i, done in shard_units(run, units, shard, every_shard=True):
        name = names[i]
        bar.set_postfix_str(name)
        if item_of(run, done) is not None:
            timings[name] = "resumed"
        else:
            t1 = time.perf_counter()
            item = EXPERIMENTS[name](ctx)
            item.seconds = time.perf_counter() - t1
            if shard.merges:
                save_item(run, item)
            timings[name] = f"{time.perf_counter() - t1:.0f} s"
        bar.update()
    bar.close()
    if not shard.merges:
        return None
    items = [it for it in (load_item(run, n) for n in EXPERIMENTS) if it is not None]
    report = write_report(
        run.path / "report.md",
        items,
        _header(ctx, items, time.perf_counter() - t0),
        {"config": config.settings(), "versions": versions()},
    )
    _print_summary(items, timings, report)
    return report


def _resumed_digests(run: RunDir, config: PaperConfig, overwrite: bool) -> Optional[dict]:
    """The weights digests a run of this configuration recorded (None for a new run, or one that
    ``overwrite`` discards)."""
    stored = None if overwrite else run.stored()
    settings = (stored or {}).get("settings") or {}
    if settings.get("config") != normalise(config.settings()) or not isinstance(settings.get("weights_digest"), dict):
        return None
    return settings["weights_digest"]


def _open(ctx: Context, names: list[str], overwrite: bool) -> RunDir:
    """Open the run directory with the weights digests in its record. A new run loads every model,
    drafter and codebook before anything is written (:func:`_preflight`); a resumed one loads only
    what its unfinished items need, and each model or drafter checks its digest against the
    recorded one when it loads (:class:`lantern.paper.context.Context`), so a finished run loads none."""
    digests = _resumed_digests(ctx.run, ctx.config, overwrite)
    resumed = digests is not None
    if not resumed:
        _preflight(ctx, names)
        digests = ctx.weights_digests()
    run = RunDir(
        ctx.run.path,
        {"config": ctx.config.settings(), "weights_digest": digests},
        command=COMMAND,
        outputs=OUTPUTS,
    )
    if resumed:
        ctx.expected_digests = digests
        _preflight(ctx, [n for n in names if item_of(run, run.read_part(*item_unit(n), load=False)) is None])
    run.open_shared(ctx.shard, overwrite, any_count=True)
    return run


MODEL_ITEMS = {"fig2a", "fig2b", "fig2c"}  # the items that read every model of --models
DECODING_ITEMS = {"fig2b", "fig3", "fig4", "fig5", "table2", "table3", "f1", "f2", "distortion"}


def _preflight(ctx: Context, names: list[str]) -> None:
    """Fail before the work of ``names``: the models they read load, decoding experiments have a
    drafter and a codebook (nothing loads for no names)."""
    if MODEL_ITEMS & set(names):
        for m in ctx.config.models:
            ctx.model(m)
            if "fig2a" in names:
                ctx.drafter(m)
    if DECODING_ITEMS & set(names):
        model = ctx.model(ctx.primary)
        ctx.drafter(ctx.primary)
        try:
            model.codebook()
        except NotImplementedError:
            raise UsageError(
                f"{ctx.primary} has no VQ codebook loaded, which the neighbour experiments need; pass "
                f"its tokenizer with --weights {ctx.primary}=DIR or drop it from --models"
            ) from None


def _header(ctx: Context, items: list[Item], seconds: float) -> str:
    c = ctx.config
    when = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    lines = [
        "# LANTERN, regenerated",
        "",
        f"`{' '.join(['python -m lantern.paper'] + sys.argv[1:])}` — {when}, device {ctx.device}, "
        f"{seconds / 60:.1f} min for this invocation{_total(items)}.",
        "",
        f"Models: {', '.join(c.models)} (decoding experiments on **{ctx.primary}**). Paper: Jang et al., "
        f"LANTERN, ICLR 2025 (arXiv 2410.03355). τ here is the mean accepted length (bonus token counted); the "
        f"paper writes τ for the temperature.",
        "",
    ]
    if c.quick:
        lines += [
            "> **QUICK MODE** — a handful of images per measurement: every number below only shows that the "
            "pipeline runs end to end. Run without `--quick` for the real measurement.",
            "",
        ]
    lines += [
        "Items: " + ", ".join(it.name for it in items) + ". Each item's folder holds its figure (PNG + PDF) "
        "and tables (CSV with every column, Markdown as shown here); intervals are written `value [lo, hi]`.",
        "",
    ]
    return "\n".join(lines)


def _total(items: list[Item]) -> str:
    """ ", 52.3 min computing the items over all invocations" (or which items' times are unknown)."""
    known = [it.seconds for it in items if it.seconds is not None]
    if not known:
        return ""
    unknown = [it.name for it in items if it.seconds is None]
    return f", {sum(known) / 60:.1f} min computing the items over all invocations" + (
        f" (not counting {', '.join(unknown)}: computed before times were kept)" if unknown else ""
    )


def _print_summary(items: list[Item], timings: dict, report: Path) -> None:
    for it in items:
        print(f"{it.name:11s} {timings.get(it.name, 'earlier run'):>11s}  {it.title}")
    print(f"report: {report}")
