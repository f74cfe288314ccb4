"""Train an EAGLE drafter on the target's teacher-forced hidden states.

    python -m lantern.drafter.train --model embedded --epochs 6 \\
        --out lantern/weights/embedded_drafter.safetensors --figure figures/drafter_accuracy.png
    python -m lantern.drafter.train --model llamagen-c2i-b --self-generate 50000 --cfg 4 --temperature 1
    python -m lantern.drafter.train --model llamagen-c2i-b --tokens imagenet_codes.safetensors
    python -m lantern.drafter.train --model embedded --classes 0,3,7 --run-dir runs/drafter-037   # some classes only
    python -m lantern.drafter.train --model embedded-16 --self-generate 10000 --with-data --epochs 20 --patience 2

Objective (EAGLE, Li et al., 2024, arXiv 2401.15077, Sec. 4.2; LANTERN, arXiv 2410.03355,
App. B): at every image-token position ``i`` the drafter gets (``x_i``, ``h_{i-1}``) and
predicts ``f_i``; the loss is ``SmoothL1(f_i, h_i) + 0.1 * CE(p_i, softmax(head(f_i)))`` where
``p_i = softmax(head(h_i))`` is the target's distribution of ``x_{i+1}`` at temperature 1 without
guidance for the row's own condition (soft labels, in nats). About 10 % of the rows come from
the unconditional (CFG) stream (none for text models, which have no guidance).

Test accuracy (LANTERN Fig. 2b): on held-out sequences, teacher-forced (true tokens, true
target features), the fraction of positions whose drafter top-k (k = 1, 2, 3) contains the
target's top-1 next token. Epoch 0 is the randomly initialised drafter. One Parquet row per
epoch; a PNG + PDF figure.

Everything lives in a run directory (default ``runs/drafter-<model>``, :mod:`ambiguity.runs`):
the token sequences and the cached target features (computed once, as checked parts),
``checkpoint.pt`` after every epoch, the per-epoch drafters and the accuracy table. Rerunning
the same command resumes; a larger ``--epochs`` continues training; other settings are refused
unless ``--overwrite``.

Data as EAGLE trains drafters (Li et al. 2024, Sec. 4.2 / EAGLE-2 App.): ``--self-generate N``
samples N sequences from the target; with ``--with-data`` they are mixed with the data tokens
(Fashion-MNIST train split for the embedded models, or the training part of ``--tokens``), and
the test set is the data's held-out split. ``--patience P`` stops once test top-1 has not risen
above its best for P epochs (``--epochs`` stays the most epochs and sets the cosine schedule).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pandas as pd
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ambiguity.cli import (
    ArgumentParser,
    add_data_arg,
    add_model_args,
    add_out_arg,
    add_overwrite_arg,
    add_progress_arg,
    add_sampling_args,
    add_shard_args,
    check_out_dir,
    check_out_file,
    cli_main,
    default_out,
    device_from_args,
    finite_float,
    nonneg_int,
    positive_int,
    print_written,
    sampling_from_args,
    seed_int,
    shown_path,
)
from ambiguity.conditions import parse_classes
from ambiguity.distributed import SINGLE, Shard, shard_from_args
from ambiguity.errors import FieldError, UsageError
from ambiguity.io import write_table
from ambiguity.models.base import TokenModel
from ambiguity.models.registry import check_image_size, check_spec_options, get_spec, load_model
from ambiguity.runs import RunDir
from ambiguity.seeding import drafter_epoch_seed, drafter_init_seed
from ambiguity.train_loop import lr_at as ambiguity_lr_at
from ambiguity.train_loop import save_checkpoint
from lantern.drafter.data import TokenSet, build_feature_cache, iterate_batches, shard_rows, token_digest
from lantern.drafter.model import Drafter, accuracy_table_path, target_fingerprint
from lantern.drafter.objective import KS, drafter_loss, evaluate, forward_rows
from lantern.drafter.report import plot_accuracy, summary
from lantern.drafter.sequences import check_sizes, data_settings, training_sequences

__all__ = [
    "TrainConfig",
    "lr_at",
    "train_step",
    "train_drafter",
    "warmup_note",
    "build_parser",
    "main",
    "COMMAND",
    "top1_stalled",
]

COMMAND = "python -m lantern.drafter.train"
OUTPUTS = (
    "accuracy.parquet",
    "checkpoint.pt",
    "drafter.safetensors",
    "drafter_accuracy.parquet",
    "drafter_accuracy.png",
    "drafter_accuracy.pdf",
)


@dataclass
class TrainConfig:
    """Drafter training settings.

    epochs: passes over the training rows. batch_size: sequences (rows) per optimiser step.
    lr: peak AdamW learning rate, reached after ``warmup_steps`` (linear), then cosine decay to
    ``lr * min_lr_ratio`` at the last step. grad_clip: max global gradient norm.
    ce_weight: weight of the soft cross-entropy term (EAGLE: 0.1). uncond_fraction: share of
    training rows from the unconditional (CFG) stream. seed: drafter init, shuffling, CFG subset.
    patience: stop once test top-1 has not risen above its best for this many epochs
    (:func:`top1_stalled`; 0: train all ``epochs``).
    """

    epochs: int = 6
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    ce_weight: float = 0.1
    uncond_fraction: float = 0.1
    seed: int = 0
    patience: int = 0

    def __post_init__(self):
        if self.epochs < 0:
            raise FieldError("TrainConfig", "epochs", f"must be >= 0, got {self.epochs}")
        if self.batch_size < 1:
            raise FieldError("TrainConfig", "batch_size", f"must be >= 1, got {self.batch_size}")
        if not 0 < self.lr <= 1:
            raise FieldError("TrainConfig", "lr", f"must be in (0, 1] (AdamW's peak learning rate), got {self.lr}")
        if not 0 <= self.uncond_fraction < 0.5:
            raise FieldError("TrainConfig", "uncond_fraction", f"must be in [0, 0.5), got {self.uncond_fraction}")
        if self.patience < 0:
            raise FieldError("TrainConfig", "patience", f"must be >= 0 (0: no early stop), got {self.patience}")


def lr_at(step: int, total: int, config: TrainConfig) -> float:
    """Learning rate at optimiser step ``step`` of ``total``: linear warmup, cosine decay
    (:func:`ambiguity.train_loop.lr_at` with this config's settings)."""
    return ambiguity_lr_at(step, config.lr, config.warmup_steps, total, config.min_lr_ratio)


# --------------------------------------------------------------------------- steps


def train_step(
    drafter: Drafter,
    model: TokenModel,
    optimizer: torch.optim.Optimizer,
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    config: TrainConfig,
    lr: Optional[float] = None,
    scale: float = 1.0,
    ddp: Optional[torch.nn.Module] = None,
) -> dict[str, float]:
    """One AdamW step on a batch of teacher-forced rows; only the drafter's weights change.

    tokens (R, N) int64, hidden (R, N, H) from the feature cache. scale multiplies the loss
    before the backward pass; ddp: the drafter wrapped in ``DistributedDataParallel``, whose
    backward averages the gradients over the ranks (each rank passes its slice of the global
    batch with ``scale = world * rows / global rows``, so the step equals the single-process
    step on the whole batch). Returns this call's loss, smooth_l1 and ce (nats) before the step.
    """
    drafter.train()
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    pred, tgt, dl, tl = forward_rows(drafter, model, tokens, hidden, ddp)
    loss, l1, ce = drafter_loss(pred, tgt, dl, tl, config.ce_weight)
    optimizer.zero_grad(set_to_none=True)
    params = [p for p in drafter.parameters() if p.requires_grad]
    (loss * scale).backward(inputs=params)  # the target's frozen head and embedding get no gradients
    if config.grad_clip:
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
    optimizer.step()
    return {"loss": loss.item(), "smooth_l1": l1.item(), "ce": ce.item()}


# --------------------------------------------------------------------------- the run
def top1_stalled(rows: Sequence[dict], patience: int) -> Optional[str]:
    """Why training should stop after the last of ``rows`` (per-epoch dicts with ``epoch`` and
    ``top1``; epoch 0 = random init), or None: the last ``patience`` epochs' test top-1 all stay
    at or below the best top-1 before them. ``patience`` 0 never stops."""
    if patience <= 0 or len(rows) <= patience:
        return None
    best_before = max(float(r["top1"]) for r in rows[:-patience])
    recent = max(float(r["top1"]) for r in rows[-patience:])
    if recent <= best_before:
        return (
            f"test top-1 did not rise above {best_before:.2%} (epoch "
            f"{int(max(rows[:-patience], key=lambda r: float(r['top1']))['epoch'])}) for {patience} epoch(s)"
        )
    return None


def _run_record(model: TokenModel, config: TrainConfig, data: dict) -> dict:
    """The training run's settings: the target, the data and the optimisation (epochs and
    patience excluded: a larger ``--epochs`` continues a run, the stop rule only ends it)."""
    train = dataclasses.asdict(config)
    train.pop("epochs")
    train.pop("patience")
    return {"target": target_fingerprint(model), "train": train, "data": data}


def train_drafter(
    model: TokenModel,
    train: TokenSet,
    test: TokenSet,
    run_dir: str | Path | RunDir,
    config: Optional[TrainConfig] = None,
    progress: bool = True,
    overwrite: bool = False,
    shard: Shard = SINGLE,
):
    """Train a drafter for ``model`` and measure its test accuracy after every epoch.

    Args:
        model: the target (any adapter with hidden states and ``draft_layer()``).
        train, test: token sequences (test: held out; evaluated on conditional rows only).
        run_dir: a run directory (path or :class:`ambiguity.runs.RunDir`) for features,
            checkpoints and the table; an existing run of the same settings resumes, other
            settings are refused unless ``overwrite``.
        shard: under torchrun (:mod:`ambiguity.distributed`) the ranks share the feature cache's
            parts and train data-parallel (``DistributedDataParallel``): every optimiser step
            takes the same global batch as one process, split across the ranks, so the result
            equals a single process's up to the order of floating-point reductions. Rank 0 writes
            checkpoints and tables; every rank returns the same drafter.
    Returns:
        (drafter, table): the drafter after the last epoch (float32, eval mode) and a pandas
        DataFrame with one row per epoch (0 = random init): model, epoch, top1, top2, top3 (fractions),
        test_smooth_l1, test_ce (nats), train_loss, train_smooth_l1, train_ce, lr, steps,
        train_rows, test_positions, seconds (wall-clock of the epoch incl. evaluation).
    Raises UsageError for a run dir holding another run.
    """
    config = config or TrainConfig()
    data = _data_facts(train, test)
    if isinstance(run_dir, RunDir):
        run = run_dir
    else:
        run = RunDir(run_dir, _run_record(model, config, data), command=COMMAND, outputs=OUTPUTS)
        run.open_shared(shard, overwrite, any_count=True)
    batch = max(1, config.batch_size)
    uncond = config.uncond_fraction if model.kind != "text" else 0.0  # text LMs have no guidance stream
    train_paths = build_feature_cache(model, train, run, "train", batch, uncond, config.seed, progress, shard)
    test_paths = build_feature_cache(model, test, run, "test", batch, 0.0, config.seed, progress, shard)
    steps_per_epoch = sum(math.ceil(r / config.batch_size) for r in shard_rows(train_paths))  # batches stay in a part

    drafter = Drafter.for_target(model, dtype=torch.float32, seed=config.seed)
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95))
    rows, step = _resume(run, drafter, optimizer, model.device)
    ddp = _data_parallel(drafter, shard)
    if not rows:
        t0 = time.perf_counter()
        ev = evaluate(drafter, model, test_paths, config.batch_size, shard=shard)
        rows.append(_epoch_row(model, 0, ev, torch.zeros(4, dtype=torch.float64), 0.0, 0, t0))
        _save_progress(run, shard, drafter, optimizer, rows, step)

    for epoch in range(rows[-1]["epoch"] + 1, config.epochs + 1):
        if top1_stalled(rows, config.patience):
            break
        t0 = time.perf_counter()
        sums, lr, step = _train_epoch(
            drafter, model, optimizer, ddp, train_paths, config, epoch, step, steps_per_epoch, progress, shard
        )
        ev = evaluate(drafter, model, test_paths, config.batch_size, shard=shard)
        rows.append(_epoch_row(model, epoch, ev, sums, lr, step, t0))
        _save_progress(run, shard, drafter, optimizer, rows, step, data, config)
        if progress and shard.index == 0:
            tqdm.write(
                f"epoch {epoch}: top-1 {ev['top1']:.2%}  top-2 {ev['top2']:.2%}  top-3 {ev['top3']:.2%}  "
                f"test ce {ev['test_ce']:.3f} nats"
            )
        if shard.index == 0 and top1_stalled(rows, config.patience):
            print(f"stopping after epoch {epoch}: {top1_stalled(rows, config.patience)}", flush=True)
    drafter.info.update(_training_info(data, config, rows))
    return drafter.eval(), pd.DataFrame(rows)


def warmup_note(steps: int, config: TrainConfig) -> Optional[str]:
    """The ``note:`` text for a run whose ``steps`` optimiser steps all fell inside the learning-rate
    warm-up (``config.warmup_steps``): the rate never reached its peak, so the drafter may stay near
    its random-init accuracy. None when the warm-up ended (or no step was taken)."""
    if steps == 0 or steps >= config.warmup_steps:
        return None
    return (
        f"training took {steps} optimiser steps, all inside the {config.warmup_steps}-step learning-rate warm-up "
        f"(the rate reached {lr_at(steps - 1, steps, config):.3g} of its peak {config.lr:g}), so the drafter may "
        f"stay near its random-init accuracy; train more --epochs or on more sequences"
    )


def _data_facts(train: TokenSet, test: TokenSet) -> dict:
    """What the run record and the drafter's info say about the training and test sequences."""
    return {
        "train_source": train.source,
        "test_source": test.source,
        "train_sequences": len(train),
        "test_sequences": len(test),
        "sequence_length": int(train.tokens.shape[1]),
        "train_digest": token_digest(train),
        "test_digest": token_digest(test),
    }


def _resume(run: RunDir, drafter: Drafter, optimizer, device) -> tuple[list, int]:
    """(rows, step) of the run's checkpoint, loaded into ``drafter`` and ``optimizer``; ([], 0) for a new run."""
    if run.read_part("checkpoint", load=False) is None:
        return [], 0
    state = torch.load(run.path / "checkpoint.pt", map_location=device, weights_only=True)
    drafter.load_state_dict(state["drafter"])
    optimizer.load_state_dict(state["optimizer"])
    return state["rows"], state["step"]


def _train_epoch(
    drafter: Drafter,
    model: TokenModel,
    optimizer,
    ddp,
    train_paths,
    config: TrainConfig,
    epoch: int,
    step: int,
    steps_per_epoch: int,
    progress: bool,
    shard: Shard,
) -> tuple[torch.Tensor, float, int]:
    """One pass (``steps_per_epoch`` optimiser steps) over the training rows from optimiser step
    ``step``. Returns (sums, lr, step): sums (4,) float64 = row-weighted loss, smooth_l1, ce and the
    rows, summed over the ranks; the last learning rate; the step count after the epoch."""
    gen = torch.Generator().manual_seed(drafter_epoch_seed(config.seed, epoch))
    sums = torch.zeros(4, dtype=torch.float64)  # loss, smooth_l1, ce (row-weighted), rows
    total = steps_per_epoch * config.epochs
    bar = tqdm(
        total=steps_per_epoch,
        desc=f"epoch {epoch}/{config.epochs}",
        unit="step",
        disable=not progress or shard.index != 0,
    )
    lr = config.lr
    for tokens, hidden, _ in iterate_batches(train_paths, config.batch_size, gen, model.device):
        lr = lr_at(step, total, config)
        mine = _rank_rows(tokens.shape[0], shard)
        n_mine = len(mine)
        scale = shard.count * n_mine / tokens.shape[0]
        if n_mine == 0:  # fewer rows than ranks: join the gradient all-reduce with a zero gradient
            mine = torch.arange(1)
        stats = train_step(drafter, model, optimizer, tokens[mine], hidden[mine], config, lr, scale, ddp)
        sums += torch.tensor(
            [stats["loss"] * n_mine, stats["smooth_l1"] * n_mine, stats["ce"] * n_mine, n_mine], dtype=torch.float64
        )
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{stats['loss']:.4f}", ce=f"{stats['ce']:.3f}")
    bar.close()
    return shard.all_sum(sums), lr, step


def _epoch_row(model: TokenModel, epoch: int, ev: dict, sums: torch.Tensor, lr: float, step: int, t0: float) -> dict:
    """One row of the accuracy table: the evaluation ``ev`` and the epoch's summed training losses
    ``sums`` (NaN for epoch 0, the random init)."""
    n = int(sums[3])
    mean = (lambda i: float(sums[i]) / n) if n else (lambda i: float("nan"))
    return {
        "model": model.name,
        "epoch": epoch,
        **ev,
        "train_loss": mean(0),
        "train_smooth_l1": mean(1),
        "train_ce": mean(2),
        "lr": lr,
        "steps": step,
        "train_rows": n,
        "seconds": time.perf_counter() - t0,
    }


def _rank_rows(rows: int, shard: Shard) -> torch.Tensor:
    """This rank's contiguous slice of a global batch of ``rows`` rows (all rows without a group)."""
    if not shard.group:
        return torch.arange(rows)
    return torch.tensor_split(torch.arange(rows), shard.count)[shard.index]


def _data_parallel(drafter: Drafter, shard: Shard) -> Optional[torch.nn.Module]:
    """The drafter wrapped in ``DistributedDataParallel`` under torchrun (None otherwise); its
    backward all-reduces (averages) the gradients of the ranks."""
    if not shard.group:
        return None
    ids = [drafter.device.index] if drafter.device.type == "cuda" else None
    return DistributedDataParallel(drafter, device_ids=ids)


def _save_progress(
    run: RunDir,
    shard: Shard,
    drafter: Drafter,
    optimizer,
    rows: list,
    step: int,
    data: Optional[dict] = None,
    config: Optional[TrainConfig] = None,
) -> None:
    """After an epoch: the checkpoint, the epoch's drafter (when ``data``) and the accuracy table,
    written by the merging rank while the others wait."""
    if shard.index == 0:
        _save_checkpoint(run, drafter, optimizer, rows, step)
        epoch = int(rows[-1]["epoch"])
        if data is not None:
            drafter.save(
                run.path / f"drafter_epoch{epoch:03d}.safetensors",
                dtype=torch.float32,
                **_training_info(data, config, rows),
            )
        write_table(pd.DataFrame(rows), run.path / "accuracy.parquet")
    shard.barrier()


def _training_info(data: dict, config: TrainConfig, rows: list) -> dict:
    last = rows[-1]
    stop = top1_stalled(rows, config.patience) or f"epoch budget ({config.epochs}) reached"
    return {
        "data": data,
        "config": dataclasses.asdict(config),
        "epochs_done": int(last["epoch"]),
        "stop_reason": stop,
        "test_accuracy": {f"top{k}": round(float(last[f"top{k}"]), 4) for k in KS},
        "random_init_accuracy": {f"top{k}": round(float(rows[0][f"top{k}"]), 4) for k in KS},
    }


def _save_checkpoint(run: RunDir, drafter: Drafter, optimizer, rows: list, step: int) -> None:
    """``checkpoint.pt`` (atomic) and its manifest: a damaged checkpoint restarts training, never resumes."""
    path = run.path / "checkpoint.pt"
    save_checkpoint(path, drafter=drafter.state_dict(), optimizer=optimizer.state_dict(), rows=rows, step=step)
    run.write_part("checkpoint", {"epoch": int(rows[-1]["epoch"])}, files=[path])


# the training options of the command line: the TrainConfig field (flag --field-name), its type and help
_TRAINING_OPTIONS = (
    ("epochs", nonneg_int, "most epochs (sets the cosine schedule)"),
    ("patience", nonneg_int, "stop once test top-1 has not risen for this many epochs (0: train all --epochs)"),
    ("batch_size", positive_int, "sequences per step"),
    ("lr", finite_float, "peak learning rate (warmup, cosine decay)"),
    ("uncond_fraction", finite_float, "share of rows from the unconditional (guidance) stream"),
    ("seed", seed_int, None),
)


def build_parser() -> ArgumentParser:
    """The CLI's argument parser (one-line errors, exit status 2)."""
    p = ArgumentParser(
        prog=COMMAND,
        description="Train an EAGLE drafter on the target's teacher-forced hidden states and report "
        "its test accuracy per epoch (LANTERN Fig. 2b).",
    )
    add_model_args(p, image_size=True)
    d = p.add_argument_group("data (default for the embedded model: Fashion-MNIST train / test images)")
    d.add_argument(
        "--tokens",
        default=None,
        help="token file: .safetensors/.pt/.npz/.npy of (N, h*w) code indices "
        "plus labels or conditions (see lantern.drafter.data)",
    )
    d.add_argument("--conditions", default=None, help="text file, one class label or caption a line")
    d.add_argument(
        "--classes",
        default=None,
        metavar="LIST",
        help="c2i: train and test on these class labels only, e.g. 0,3,7 (cycled by --self-generate)",
    )
    d.add_argument(
        "--self-generate",
        type=positive_int,
        default=None,
        metavar="N",
        help="sample N sequences from the target itself and train on them (kept as parts of the run)",
    )
    add_sampling_args(d, guidance=1.0, guidance_help="guidance scale for --self-generate (1 = none)")
    d.add_argument("--gen-batch-size", type=positive_int, default=32, help="images per batch for --self-generate")
    add_data_arg(d, "Fashion-MNIST IDX directory (embedded model)")
    d.add_argument(
        "--with-data",
        action="store_true",
        help="with --self-generate: also train on the data tokens (--tokens, else Fashion-MNIST train), "
        "test on the data's held-out split (as EAGLE trains drafters)",
    )
    d.add_argument(
        "--train-size",
        type=positive_int,
        default=None,
        help="use at most this many training sequences (with --with-data: data sequences)",
    )
    d.add_argument("--test-size", type=positive_int, default=1000, help="held-out test sequences (default 1000)")
    t = p.add_argument_group("training")
    defaults = TrainConfig()
    for field, kind, text in _TRAINING_OPTIONS:
        t.add_argument("--" + field.replace("_", "-"), type=kind, default=getattr(defaults, field), help=text)
    o = p.add_argument_group("output")
    o.add_argument("--run-dir", default=None, help="features, checkpoints, tables (default runs/drafter-<model>)")
    add_out_arg(
        o,
        "final drafter file (default <run-dir>/drafter.safetensors); the accuracy table goes next to it "
        "as <name>_accuracy.parquet",
        metavar="FILE",
    )
    o.add_argument(
        "--figure", default=None, help="accuracy figure .png (+.pdf) (default <run-dir>/drafter_accuracy.png)"
    )
    o.add_argument("--save-dtype", default="fp16", choices=["fp16", "bf16", "fp32"], help="dtype of the saved drafter")
    add_overwrite_arg(o, "--run-dir")
    add_progress_arg(o)
    add_shard_args(o)
    return p


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    """Command-line entry point (see the module docstring); returns the exit status."""
    args = build_parser().parse_args(argv)
    config = TrainConfig(**{field: getattr(args, field) for field, _, _ in _TRAINING_OPTIONS})
    sampling_from_args(args, get_spec(args.model).kind)  # validates --cfg/--temperature/--top-k/--top-p
    check_spec_options(args.model, args.weights, classes=parse_classes(args.classes))  # before any weights
    check_image_size(args.model, args.image_size)
    device, dtype = device_from_args(args)
    run_dir = check_out_dir(args.run_dir or default_out(f"drafter-{args.model}"), "--run-dir")
    out = Path(args.out) if args.out else run_dir / "drafter.safetensors"
    check_out_file(out, "--out")
    if args.figure is not None:
        check_out_file(args.figure, "--figure")
    shard = shard_from_args(args, device)
    if shard.count > 1 and not shard.group and not args.self_generate:
        raise UsageError(
            "--shard-index/--num-shards split --self-generate N across independent processes; to "
            "train data-parallel launch with torchrun --nproc_per_node=N instead"
        )
    torch.manual_seed(drafter_init_seed(args.seed))
    model = load_model(
        args.model, weights=args.weights, device=shard.device(device), dtype=dtype, image_size=args.image_size
    )
    check_sizes(args, model)
    record = _run_record(model, config, data_settings(args))
    run = RunDir(run_dir, record, command=COMMAND, flag="--run-dir", outputs=OUTPUTS)
    run.open_shared(shard, args.overwrite, any_count=True)
    data = training_sequences(args, model, run, shard)
    if data is None:
        print(
            f"{shard.label} done: its --self-generate batches are parts of {shown_path(run_dir)}; after every "
            f"shard, train with the same command without --shard-index/--num-shards (or under torchrun)"
        )
        return 0
    train, test = data
    if shard.index == 0:
        print(
            f"target {model.name}: {len(train)} training and {len(test)} test sequences of "
            f"{train.tokens.shape[1]} tokens; run dir {shown_path(run_dir)}"
            + (f"; {shard.count} ranks" if shard.group else "")
        )
    drafter, table = train_drafter(model, train, test, run, config, progress=not args.no_progress, shard=shard)
    if shard.index != 0:
        return 0
    save_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.save_dtype]
    drafter.save(out, dtype=save_dtype)
    write_table(table, accuracy_table_path(out))
    figs = plot_accuracy(
        table, args.figure or run_dir / "drafter_accuracy.png", title=f"EAGLE drafter for {model.name}: test accuracy"
    )
    print(summary(table))
    print(f"stop: {drafter.info['stop_reason']}")
    note = warmup_note(int(table["steps"].iloc[-1]), config)
    if note:
        print(f"note: {note}")  # under the table that shows it
    print_written([out, accuracy_table_path(out), *figs], f" (drafter {out.stat().st_size / 2**20:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
