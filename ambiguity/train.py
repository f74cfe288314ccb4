"""Training of the embedded model: a LlamaGen VQ tokenizer and a class-conditional GPT.

Small free functions and two loops (:func:`train_vq`, :func:`train_gpt`) in the style of
nanoGPT. Each loop runs a fixed number of optimiser steps with a seeded, stateless data order
(the batch of step ``s`` depends only on ``seed`` and ``s``), writes a checkpoint every
``ckpt_every`` steps (atomically) and resumes from it, and returns its statistics. This module
holds the GPT's loop, its epoch stop rule and the recipes; the VQ's loop is
:mod:`ambiguity.train_vq` and the pieces both share :mod:`ambiguity.train_loop`.

Recipe (LlamaGen, Sun et al. 2024, arXiv 2406.06525, Sec. 2.1-2.3, scaled down; no GAN or
perceptual loss, which need pretrained networks and far more compute than 2 CPU cores give):

* VQ: ``loss = MSE + l1_weight * L1 + codebook loss + beta * commitment loss`` on images in
  [-1, 1]; l2-normalised codebook. Codes unused for ``dead_after`` steps are re-initialised
  from random (l2-normalised) encoder outputs of the current batch, and their Adam moments
  are zeroed ("dead-code restart", as in Dhariwal et al. 2020 Jukebox Sec. 3.1 / Zeghidour
  et al. 2021 SoundStream Sec. 3.3). Restarts stop for the last ``reinit_stop`` fraction of
  training so that the decoder settles on a fixed codebook. Optionally (``entropy_weight``)
  LlamaGen's codebook entropy loss (from MAGVIT): on softmax(-distance / T) over the codes,
  the mean per-latent entropy minus the entropy of the batch-mean distribution, which pushes
  latents to commit to one code each while the batch spreads over the whole codebook.
* GPT: next-token cross-entropy on the VQ codes of the training images, class label prefix
  with 10% label dropout (the null class, needed for classifier-free guidance), AdamW with
  linear warmup and cosine decay, gradient clipping.
* ``bf16``: forward passes under CPU/CUDA bf16 autocast (parameters, optimiser state and the
  quantiser's nearest-code search stay fp32); about 2x faster on CPUs with avx512_bf16.

Nothing heavy happens at import time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ambiguity.data.fashion_mnist import CLASSES
from ambiguity.io import write_json
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.vq import VQConfig
from ambiguity.seeding import gpt_init_seed
from ambiguity.train_loop import (
    batch_indices,
    check_resume,
    epoch_ends,
    load_checkpoint,
    lr_at,
    save_checkpoint,
)
from ambiguity.train_vq import (
    VQTrainConfig,
)

__all__ = [
    "GPTTrainConfig",
    "train_gpt",
    "gpt_nll",
    "embedded_recipe",
    "embedded16_recipe",
    "EpochStopConfig",
    "stop_reason",
    "CURVE_FILE",
    "embedded16_long_recipe",
]


@dataclass
class GPTTrainConfig:
    """Optimisation of the GPT. ``lr`` is the peak AdamW learning rate."""

    steps: int = 1800
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.05
    beta2: float = 0.95
    grad_clip: float = 1.0
    ckpt_every: int = 50
    bf16: bool = False


@dataclass
class EpochStopConfig:
    """Test evaluation after every epoch of GPT training and the early-stop rule on it.

    After each pass over the training sequences the GPT's test NLL (bits/token) is measured;
    training stops once it improved by less than ``min_gain_bits`` bits/token per epoch since
    the previous evaluation, provided at least ``min_epochs`` epochs were trained (issue 23:
    0.02 bits/token per epoch after at least the ``embedded`` model's 1.9 epochs). The
    learning-rate schedule still spans the whole step budget (an early stop leaves it mid-decay).

    ``evals_per_epoch`` > 1 measures the test NLL that many times per pass (a finer curve); the
    rule then compares the last evaluation with the latest one at least a full epoch before it
    (none yet: no stop), so the gain is still per epoch and a warm restart's first epoch, whose
    learning-rate warmup can raise the NLL for a while, is never judged on a part of an epoch.
    ``eval_at_start`` adds a row before the first step (the init's NLL: with a warm restart, the
    starting point of the curve).
    """

    min_gain_bits: float = 0.02
    min_epochs: float = 1.9
    evals_per_epoch: int = 1
    eval_at_start: bool = False


def stop_reason(curve: list[dict], stop: EpochStopConfig) -> Optional[str]:
    """Why training should stop after the last row of ``curve`` (rows with ``epoch`` and
    ``test_nll_bits``), or None to go on: the test NLL improved by less than
    ``stop.min_gain_bits`` bits/token per epoch since the row a full epoch before the last one
    (the latest row at least 1 epoch older; with one evaluation per epoch, the previous row; None
    while no row is that old, e.g. in a warm restart's first epoch), at ``epoch`` >=
    ``stop.min_epochs``. A rise counts as a negative gain."""
    if len(curve) < 2 or curve[-1]["epoch"] < stop.min_epochs - 1e-9:
        return None
    b = curve[-1]
    older = [r for r in curve[:-1] if r["epoch"] <= b["epoch"] - 1.0 + 1e-9]
    if not older:
        return None  # less than an epoch of this run's curve: e.g. a warm restart's warmup
    a = older[-1]
    gain = (a["test_nll_bits"] - b["test_nll_bits"]) / (b["epoch"] - a["epoch"])
    if gain < stop.min_gain_bits:
        return (
            f"test NLL improved by {gain:.4f} bits/token per epoch from epoch {a['epoch']:.2f} "
            f"to {b['epoch']:.2f} (< {stop.min_gain_bits})"
        )
    return None


# ----------------------------------------------------------------------------- GPT
def gpt_loss(gpt: GPT, labels: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats. labels (B,) int64, tokens (B, N) int64."""
    logits = gpt.teacher_forced_logits(labels, tokens).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))


@torch.no_grad()
def gpt_nll(gpt: GPT, tokens: torch.Tensor, labels: torch.Tensor, batch_size: int = 250, progress: bool = True) -> dict:
    """Teacher-forced test negative log-likelihood with the true labels and no CFG (eval mode, so
    no label dropout). tokens (N, T) int64, labels (N,) int64.

    Returns {"nll_nats_per_token", "nll_bits_per_token" (= nats / ln 2), "tokens"}.
    """
    gpt = gpt.eval()
    dev = gpt.tok_embeddings.weight.device
    total, count = 0.0, 0
    for i in tqdm(range(0, tokens.shape[0], batch_size), desc="GPT test", disable=not progress, mininterval=5):
        t, y = tokens[i : i + batch_size].to(dev), labels[i : i + batch_size].to(dev)
        logits = gpt.teacher_forced_logits(y, t).float()
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1), reduction="sum").item()
        count += t.numel()
    nats = total / count
    return {"nll_nats_per_token": nats, "nll_bits_per_token": nats / math.log(2), "tokens": count}


CURVE_FILE = "gpt_curve.json"


def _print_now(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class _CurveSetup:
    """What the test curve of one GPT run needs besides the model and the loop state: the
    evaluation, the stop rule, the curve file (with ``info`` merged in), the number of training
    sequences ``n`` and the epochs the initial weights had already seen (``offset``)."""

    evaluate: Callable[[GPT], float]
    stop: Optional[EpochStopConfig]
    info: dict
    path: Path
    n: int
    offset: float


def _gpt_recipe(
    gpt_config: GPTConfig,
    train: GPTTrainConfig,
    tokens: torch.Tensor,
    seed: int,
    stop: Optional[EpochStopConfig],
    init: Optional[tuple[str, dict, float]],
) -> dict:
    """What a resumed checkpoint must have been written with."""
    recipe = {
        "gpt_config": asdict(gpt_config),
        "train": asdict(train),
        "seed": seed,
        "n_sequences": int(tokens.shape[0]),
        "tokens_sum": int(tokens.sum()),
    }
    if stop is not None:
        recipe["stop"] = asdict(stop)
    if init is not None:
        recipe["init"] = init[0]
        recipe["init_epochs"] = float(init[2])
    return recipe


def _new_gpt(
    gpt_config: GPTConfig, train: GPTTrainConfig, seed: int, device: torch.device, init: Optional[tuple]
) -> tuple[GPT, torch.optim.Optimizer]:
    """The seeded (or ``init``-loaded) GPT and its AdamW (no weight decay on vectors)."""
    torch.manual_seed(gpt_init_seed(seed))
    model = GPT(gpt_config).to(device)
    if init is not None:
        model.load_state_dict({k: v.float() for k, v in init[1].items()})
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": train.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=train.lr,
        betas=(0.9, train.beta2),
    )
    return model, opt


def _resume_gpt(
    path: Path, recipe: dict, model: GPT, opt: torch.optim.Optimizer, steps: int, log: Callable[[str], None]
) -> dict:
    """The loop state from the checkpoint at ``path`` (model, optimiser and RNG restored), or a
    fresh one. Raises UsageError for a checkpoint of another recipe."""
    state = {"step": 0, "time_s": 0.0, "history": []}
    ck = load_checkpoint(path)
    if ck is not None:
        check_resume(ck, recipe, path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["rng"])
        state = ck["state"]
        log(f"resuming GPT training at step {state['step']}/{steps}")
    state.setdefault("curve", [])
    return state


def _curve_row(
    state: dict, train: GPTTrainConfig, curve: _CurveSetup, step: int, nll: float, seconds: float, eval_s: float
) -> dict:
    """One row of the test curve: the test NLL at ``step`` and the mean train loss since the last row."""
    since = state["curve"][-1]["step"] if state["curve"] else 0
    losses = [h["loss"] for h in state["history"] if h["step"] > since]
    mean = sum(losses) / len(losses) if losses else None  # None: the row before the first step
    return {
        "epoch": curve.offset + step * train.batch_size / curve.n,
        "step": step,
        "test_nll_bits": nll,
        "train_loss_nats": mean,
        "train_loss_bits": None if mean is None else mean / math.log(2),
        "lr": lr_at(step - 1, train.lr, train.warmup, train.steps, train.min_lr_ratio),
        "seconds": seconds + eval_s,
        "eval_seconds": eval_s,
    }


def _write_curve(state: dict, train: GPTTrainConfig, curve: _CurveSetup) -> None:
    """The curve so far, with the run's facts, to ``curve.path``."""
    write_json(
        {
            **curve.info,
            "batch_size": train.batch_size,
            "max_steps": train.steps,
            "train_sequences": curve.n,
            "stop": asdict(curve.stop) if curve.stop else None,
            "stop_reason": state.get("stop_reason"),
            "rows": state["curve"],
        },
        curve.path,
    )


def _record_eval(
    model: GPT,
    state: dict,
    train: GPTTrainConfig,
    curve: _CurveSetup,
    step: int,
    seconds: float,
    log: Callable[[str], None],
) -> None:
    """Evaluate the model at ``step``, add the curve row, decide whether to stop, write the curve
    file and log a line. Leaves the model in train mode."""
    t_eval = time.perf_counter()
    nll = float(curve.evaluate(model.eval()))
    model.train()
    row = _curve_row(state, train, curve, step, nll, seconds, time.perf_counter() - t_eval)
    state["curve"].append(row)
    reason = stop_reason(state["curve"], curve.stop) if curve.stop is not None else None
    state["stop_reason"] = reason or (f"step budget reached ({train.steps} steps)" if step >= train.steps else None)
    _write_curve(state, train, curve)
    mean = row["train_loss_nats"]
    log(
        f"epoch {row['epoch']:.2f} (step {step}): test NLL {nll:.4f} bits/token, "
        + ("" if mean is None else f"train loss {mean / math.log(2):.4f} bits/token, ")
        + f"eval {row['eval_seconds']:.0f} s"
        + (f"; stopping: {state['stop_reason']}" if state.get("stop_reason") else "")
    )


def _gpt_step(
    model: GPT,
    opt: torch.optim.Optimizer,
    train: GPTTrainConfig,
    step: int,
    labels: torch.Tensor,
    tokens: torch.Tensor,
    device: torch.device,
) -> torch.Tensor:
    """Optimiser step ``step`` (0-based: its learning rate) on the batch (labels (B,), tokens (B, N)
    int64); returns the loss."""
    for g in opt.param_groups:
        g["lr"] = lr_at(step, train.lr, train.warmup, train.steps, train.min_lr_ratio)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=train.bf16):
        loss = gpt_loss(model, labels.to(device), tokens.to(device))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if train.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
    opt.step()
    return loss


def _save_gpt(path: Path, recipe: dict, model: GPT, opt: torch.optim.Optimizer, state: dict) -> None:
    """The checkpoint a resumed run starts from (recipe, weights, optimiser, RNG, loop state)."""
    save_checkpoint(
        path,
        recipe=recipe,
        model=model.state_dict(),
        optimizer=opt.state_dict(),
        rng=torch.get_rng_state(),
        state=state,
    )


def _log_progress(
    state: dict, train: GPTTrainConfig, opt: torch.optim.Optimizer, epoch: float, since_s: float, log
) -> None:
    """The line written at a checkpoint without a progress bar."""
    recent = [h["loss"] for h in state["history"][-train.ckpt_every :]]
    log(
        f"step {state['step']}/{train.steps}  epoch {epoch:.3f}  "
        f"train loss {sum(recent) / len(recent):.4f} nats  lr {opt.param_groups[0]['lr']:.2e}  "
        f"{since_s:.1f} s since last line  {state['time_s'] / 3600:.2f} h in all"
    )


def _gpt_stats(state: dict, train: GPTTrainConfig, tokens: torch.Tensor, offset: float, curve: bool) -> dict:
    """What :func:`train_gpt` returns besides the model (see there)."""
    done, n = state["step"], tokens.shape[0]
    tail = state["history"][-25:]
    stats = {
        "steps": done,
        "max_steps": train.steps,
        "batch_size": train.batch_size,
        "token_budget": done * train.batch_size * tokens.shape[1],
        "sequences_seen": done * train.batch_size,
        "epochs": offset + done * train.batch_size / n,
        "epochs_this_run": done * train.batch_size / n,
        "init_epochs": offset,
        "train_time_s": state["time_s"],
        "final_train_loss_nats": sum(h["loss"] for h in tail) / len(tail) if tail else float("nan"),
    }
    if curve:
        stats["curve"] = state["curve"]
        stats["stop_reason"] = state.get("stop_reason") or f"step budget reached ({train.steps} steps)"
    return stats


def train_gpt(
    gpt_config: GPTConfig,
    train: GPTTrainConfig,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    run_dir: Path,
    seed: int,
    device: torch.device,
    progress: bool = True,
    log: Callable[[str], None] = _print_now,
    evaluate: Optional[Callable[[GPT], float]] = None,
    stop: Optional[EpochStopConfig] = None,
    curve_info: Optional[dict] = None,
    init: Optional[tuple[str, dict, float]] = None,
) -> tuple[GPT, dict]:
    """Train a c2i :class:`GPT` on code sequences tokens (N, block_size) int64 with labels (N,).

    Checkpoint: ``run_dir/gpt_ckpt.pt`` every ``train.ckpt_every`` steps and at the end.
    Without ``progress`` a line per checkpoint goes to ``log`` (step, mean train loss, seconds).

    ``evaluate`` (the model in eval mode -> test NLL in bits/token): called at the end of every
    epoch (:func:`epoch_ends`) and after the last step; each call adds a row to the curve
    (epoch, step, test_nll_bits, train_loss_nats and _bits (mean over the steps since the
    previous row), lr, seconds (active training + evaluation seconds so far), eval_seconds),
    which is kept in the checkpoint and written to ``run_dir/gpt_curve.json`` (with
    ``curve_info`` merged in) right away; a checkpoint follows every evaluation, so a resumed
    run never repeats one. ``stop`` (needs ``evaluate``): end training early by
    :func:`stop_reason`.

    ``init`` (tag, state dict, epochs): continue from these weights instead of a random init
    (a warm restart: fresh optimiser state, the warmup and cosine schedule over this run's
    steps); ``epochs`` is how many passes the weights have already seen and is added to every
    epoch count (curve rows, the stop rule's ``min_epochs``, stats ``epochs``). ``tag`` (e.g.
    the file's hash) is part of the recipe a resumed checkpoint must match.

    Returns (model in eval mode, stats: steps (done), max_steps, batch_size, token_budget
    (training tokens seen = steps * batch_size * block_size), epochs, train_time_s, final train
    loss in nats (mean of the last 25 steps); with ``evaluate`` also curve and stop_reason).
    Raises UsageError if the checkpoint was written with another recipe (or stop rule).
    """
    if stop is not None and evaluate is None:
        raise ValueError("an early-stop rule needs evaluate")
    path = Path(run_dir) / "gpt_ckpt.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    recipe = _gpt_recipe(gpt_config, train, tokens, seed, stop, init)
    offset = float(init[2]) if init is not None else 0.0
    model, opt = _new_gpt(gpt_config, train, seed, device, init)
    state = _resume_gpt(path, recipe, model, opt, train.steps, log)
    n = tokens.shape[0]
    per_epoch = stop.evals_per_epoch if stop is not None else 1
    curve = _CurveSetup(evaluate, stop, curve_info or {}, Path(run_dir) / CURVE_FILE, n, offset)
    if stop is not None and stop.eval_at_start and state["step"] == 0 and not state["curve"]:
        _record_eval(model, state, train, curve, 0, 0.0, log)
    model.train()
    bar = tqdm(total=train.steps, initial=state["step"], desc="GPT", disable=not progress, mininterval=5)
    t0 = t_log = time.perf_counter()
    while state["step"] < train.steps and not state.get("stop_reason"):
        step = state["step"]
        idx = batch_indices(step, train.batch_size, n, seed)
        loss = _gpt_step(model, opt, train, step, labels[idx], tokens[idx], device)
        state["step"] = step = step + 1
        state["history"].append({"step": step, "loss": loss.item()})
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        evaluated = evaluate is not None and (epoch_ends(step, train.batch_size, n, per_epoch) or step == train.steps)
        if evaluated:
            _record_eval(model, state, train, curve, step, state["time_s"] + time.perf_counter() - t0, log)
        if step % train.ckpt_every == 0 or step == train.steps or evaluated:
            state["time_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            _save_gpt(path, recipe, model, opt, state)
            if not progress:
                _log_progress(state, train, opt, offset + step * train.batch_size / n, t0 - t_log, log)
                t_log = t0
    bar.close()
    return model.eval(), _gpt_stats(state, train, tokens, offset, evaluate is not None)


# --------------------------------------------------------------------------- recipes
def embedded_recipe(quick: bool = False):
    """Architectures and optimisation of the shipped model -> (VQConfig, VQTrainConfig,
    GPTConfig, GPTTrainConfig).

    Shipped: VQ with base width 32, ch_mult [1, 2, 2] (32 x 32 px -> 8 x 8 tokens), 1024 codes
    of dim 8 (l2-normalised); c2i GPT with dim 192, 6 layers, 6 heads, 10 classes, 10% label
    dropout. Optimisation: :class:`VQTrainConfig` and
    :class:`GPTTrainConfig` defaults (VQ 1000 steps x 32 images; GPT 1800 steps
    x 64 sequences = 7,372,800 training tokens, about 1.9 epochs). ``quick``: tiny versions
    (64 codes, dim 32, 2 layers, 4 steps each) for smoke tests. Sized to train in about 100
    minutes on 2 shared CPU cores and to ship in under 10 MB (fp16).
    """
    K = 64 if quick else 1024
    vq = VQConfig(
        codebook_size=K,
        codebook_embed_dim=8,
        codebook_l2_norm=True,
        encoder_ch_mult=[1, 2, 2],
        decoder_ch_mult=[1, 2, 2],
        z_channels=32 if quick else 64,
        ch=32,
        num_res_blocks=1,
        in_channels=1,
    )
    gpt = GPTConfig(
        dim=32 if quick else 192,
        n_layer=2 if quick else 6,
        n_head=2 if quick else 6,
        multiple_of=32,
        num_classes=len(CLASSES),
        class_dropout_prob=0.1,
        model_type="c2i",
        vocab_size=K,
        cls_token_num=1,
        block_size=64,
        rope="2d",
    )
    if quick:
        return (
            vq,
            VQTrainConfig(steps=4, batch_size=8, warmup=1, dead_after=2, reinit_every=2, ckpt_every=2),
            gpt,
            GPTTrainConfig(steps=4, batch_size=8, warmup=1, ckpt_every=2),
        )
    return vq, VQTrainConfig(), gpt, GPTTrainConfig()


def embedded16_recipe(quick: bool = False):
    """The ``embedded-16`` model: LlamaGen's token geometry on Fashion-MNIST -> (VQConfig,
    VQTrainConfig, GPTConfig, GPTTrainConfig).

    VQ: LlamaGen's quantiser (16384 codes of dim 8, l2-normalised, commitment beta 0.25) behind
    the embedded model's small convolutional encoder/decoder (base width 32, ch_mult [1, 2, 2]:
    4x downsampling), on Fashion-MNIST padded to 32 x 32 and bilinearly upsampled to 64 x 64
    (:func:`ambiguity.data.fashion_mnist.upsample`), so 16 x 16 tokens. Dead codes are restarted
    from encoder outputs drawn by their quantisation error (not uniformly: most latents are
    identical black background). GPT: the embedded model's body (dim 192, 6 layers, 6 heads,
    2D RoPE, 10 classes, 10% label dropout) with a 16384-token embedding and head, block 256,
    trained on the embedded model's token budget (900 steps x 32 sequences x 256 tokens =
    7,372,800 tokens, 0.48 epochs), so the two differ only in the token geometry.
    VQ: 1000 steps x 32 images. Both train under bf16 autocast. ``quick``: tiny versions (64 codes, still 16 x 16
    tokens on 64 x 64 px, GPT dim 32, 2 layers, 4 steps each) for smoke tests.
    """
    # the embedded model's networks and optimisers, with LlamaGen's codebook size and a 16 x 16 grid
    vq, vq_train, gpt, gpt_train = embedded_recipe(quick)
    K = 64 if quick else 16384
    vq = replace(vq, codebook_size=K, commit_loss_beta=0.25)
    gpt = replace(gpt, vocab_size=K, block_size=256)
    vq_train = replace(vq_train, restart_pick="error", bf16=True)
    if quick:
        return vq, vq_train, gpt, replace(gpt_train, bf16=True)
    vq_train = replace(vq_train, dead_after=100, ckpt_every=25)
    return vq, vq_train, gpt, replace(gpt_train, steps=900, batch_size=32, bf16=True, ckpt_every=25)


def embedded16_long_recipe(quick: bool = False):
    """The ``embedded-16`` model trained towards convergence (issue 23) -> (VQConfig,
    VQTrainConfig, GPTConfig, GPTTrainConfig, EpochStopConfig).

    The same networks and optimiser as :func:`embedded16_recipe` (the shipped VQ is reused), but
    the GPT's step budget is set by the caller from a number of epochs
    (:func:`steps_for_epochs`; ``steps`` here is 0 as a placeholder) with the cosine schedule over
    the whole budget, a test evaluation after every epoch and an early stop once the test NLL
    gains less than 0.02 bits/token per epoch after at least 1.9 epochs (:class:`EpochStopConfig`).
    Checkpoints every 25 steps (every 2 with ``quick``). Trains in fp32: on CPUs without native
    bf16 (AVX2 only, ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` False) bf16 autocast made a
    step of this GPT at least 4x slower than fp32 (Dec 2026, on the project's 2-core machine).
    """
    vq, vq_train, gpt, gpt_train = embedded16_recipe(quick)
    return vq, vq_train, gpt, replace(gpt_train, steps=0, bf16=False), EpochStopConfig()
