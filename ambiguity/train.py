"""Training of the embedded model: a LlamaGen VQ tokenizer and a class-conditional GPT.

Small free functions and two loops (:func:`train_vq`, :func:`train_gpt`) in the style of
nanoGPT. Each loop runs a fixed number of optimiser steps with a seeded, stateless data order
(the batch of step ``s`` depends only on ``seed`` and ``s``), writes a checkpoint every
``ckpt_every`` steps (atomically) and resumes from it, and returns its statistics.

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
from ambiguity.errors import UsageError
from ambiguity.io import atomic_path, write_json
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.vq import VQConfig, VQModel
from ambiguity.seeding import epoch_permutation_seed, gpt_init_seed, vq_init_seed, vq_step_seed

__all__ = [
    "VQTrainConfig",
    "GPTTrainConfig",
    "lr_at",
    "batch_indices",
    "vq_loss",
    "reinit_dead_codes",
    "train_vq",
    "train_gpt",
    "tokenize",
    "vq_metrics",
    "code_usage",
    "gpt_nll",
    "count_params",
    "save_checkpoint",
    "load_checkpoint",
    "codebook_entropy_loss",
    "embedded_recipe",
    "embedded16_recipe",
    "EpochStopConfig",
    "epoch_ends",
    "stop_reason",
    "steps_for_epochs",
    "CURVE_FILE",
    "embedded16_long_recipe",
]


@dataclass
class VQTrainConfig:
    """Optimisation of the VQ tokenizer. ``lr`` is the peak AdamW learning rate."""

    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.0
    l1_weight: float = 1.0
    dead_after: int = 50  # steps a code may stay unused before it is restarted
    reinit_every: int = 25  # how often (steps) dead codes are looked for
    reinit_stop: float = 0.2  # no restarts in the last 20% of the steps
    ckpt_every: int = 50
    entropy_weight: float = 0.0  # LlamaGen's entropy_loss_ratio (0: off)
    entropy_temperature: float = 0.01
    entropy_sample: int = 0  # latents per step the entropy loss sees (0: all)
    restart_pick: str = "uniform"  # restart pool rows drawn uniformly, or "error": by squared distance to their code
    bf16: bool = False


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


def steps_for_epochs(epochs: float, n: int, batch_size: int) -> int:
    """Optimiser steps that cover ``epochs`` passes over ``n`` sequences: ceil(epochs * n / batch_size)."""
    return math.ceil(epochs * n / batch_size - 1e-9)


def epoch_ends(step: int, batch_size: int, n: int, per_epoch: int = 1) -> bool:
    """Whether 1-based ``step`` (its batch: sequences ``(step-1)*batch_size .. step*batch_size - 1``
    of the stream of :func:`batch_indices`) completes a pass over the ``n`` sequences, or with
    ``per_epoch`` > 1 one of the ``per_epoch`` equal parts of a pass."""
    return (step * batch_size * per_epoch) // n > ((step - 1) * batch_size * per_epoch) // n


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


def count_params(module: torch.nn.Module) -> int:
    """Number of trainable parameters (buffers excluded)."""
    return sum(p.numel() for p in module.parameters())


def lr_at(step: int, base: float, warmup: int, total: int, min_ratio: float) -> float:
    """Learning rate at 0-based ``step``: linear warmup over ``warmup`` steps, then cosine decay
    from ``base`` to ``min_ratio * base`` at ``total`` (nanoGPT's schedule)."""
    if step < warmup:
        return base * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def batch_indices(step: int, batch_size: int, n: int, seed: int) -> torch.Tensor:
    """Indices (batch_size,) int64 of the examples of ``step``: consecutive slices of per-epoch
    permutations of ``range(n)`` (permutation of epoch e seeded with ``seed * 100003 + e``).

    Stateless, so a resumed run sees exactly the batches an uninterrupted run would.
    """
    start = step * batch_size
    out, pos = [], start
    while pos < start + batch_size:
        epoch, offset = divmod(pos, n)
        g = torch.Generator().manual_seed(epoch_permutation_seed(seed, epoch))
        perm = torch.randperm(n, generator=g)
        take = min(n - offset, start + batch_size - pos)
        out.append(perm[offset : offset + take])
        pos += take
    return torch.cat(out)


# ----------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: Path, **state) -> None:
    """torch.save ``state`` atomically (a crash never leaves a half-written checkpoint)."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(
    path: Path, keys: tuple[str, ...] = ("recipe",), fix: str = "pass --fresh to start over or another --run-dir"
) -> Optional[dict]:
    """The checkpoint at ``path`` (a dict holding ``keys``), or None when there is none.

    Raises UsageError (naming ``fix``) when the file is damaged, truncated or not such a
    checkpoint: resuming from it could only be wrong.
    """
    if not Path(path).is_file():
        return None
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # truncated zip, foreign pickle, ...: nothing to resume from
        ck = exc
    if not isinstance(ck, dict) or not all(k in ck for k in keys):
        why = type(ck).__name__ if isinstance(ck, Exception) else f"it lacks {', '.join(keys)}"
        raise UsageError(f"checkpoint {path} is damaged ({why}); {fix}")
    return ck


def _check_resume(ck: dict, expected: dict, path: Path) -> None:
    if ck["recipe"] != expected:
        diff = [k for k in expected if ck["recipe"].get(k) != expected[k]]
        raise UsageError(
            f"checkpoint {path} was written with a different {', '.join(diff) or 'recipe'}; "
            f"pass --fresh to start over or another --run-dir"
        )


# ----------------------------------------------------------------------------- VQ
def codebook_entropy_loss(z: torch.Tensor, codebook: torch.Tensor, temperature: float = 0.01) -> torch.Tensor:
    """LlamaGen's (MAGVIT's) codebook entropy loss for latents z (M, d) and codes (K, d).

    With p_i = softmax(-||z_i - e||^2 / temperature) over the K codes: mean_i H(p_i) - H(mean_i p_i)
    in nats. Minimising it makes each latent pick one code (low per-latent entropy) while the
    batch uses many codes (high entropy of the average assignment). Between -log K and log K.
    """
    z, codebook = z.float(), codebook.float()
    d = z.pow(2).sum(1, keepdim=True) + codebook.pow(2).sum(1) - 2 * z @ codebook.t()
    logits = -d / temperature
    logp = F.log_softmax(logits, dim=-1)
    p = logp.exp()
    sample_entropy = -(p * logp).sum(-1).mean()
    avg = p.mean(0)
    avg_entropy = -(avg * torch.log(avg.clamp_min(1e-12))).sum()
    return sample_entropy - avg_entropy


def vq_loss(
    model: VQModel,
    x: torch.Tensor,
    l1_weight: float,
    entropy_weight: float = 0.0,
    entropy_temperature: float = 0.01,
    entropy_sample: int = 0,
    bf16: bool = False,
    generator: Optional[torch.Generator] = None,
) -> tuple[torch.Tensor, dict, torch.Tensor, torch.Tensor]:
    """One VQ training loss on images x (B, C, H, W) in [-1, 1].

    ``entropy_weight`` > 0 adds :func:`codebook_entropy_loss` on the (l2-normalised) latents, on
    ``entropy_sample`` random ones of them when > 0 (drawn with ``generator``); ``bf16`` runs
    encoder and decoder under bf16 autocast (the quantiser and the losses in fp32).
    Returns (loss scalar, parts {mse, l1, codebook, commit[, entropy]} as floats, codes (B, h, w)
    int64, l2-normalised latents (B*h*w, d) detached — the restart pool for dead codes).
    """
    dev = x.device.type
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
        z = model.encode_latent(x)
    z = z.float()
    zq, codes, cb, commit = model.quantize(z)
    with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
        rec = model.decode_latent(zq)
    rec = rec.float()
    mse, l1 = F.mse_loss(rec, x), F.l1_loss(rec, x)
    loss = mse + l1_weight * l1 + cb + commit
    zf = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
    if model.quantize.l2_norm:
        zf = F.normalize(zf, dim=-1)
    parts = {"mse": mse.item(), "l1": l1.item(), "codebook": cb.item(), "commit": commit.item()}
    if entropy_weight > 0:
        ze = zf
        if 0 < entropy_sample < zf.shape[0]:
            ze = zf[torch.randperm(zf.shape[0], generator=generator)[:entropy_sample].to(zf.device)]
        ent = codebook_entropy_loss(ze, model.quantize.codebook(), entropy_temperature)
        loss = loss + entropy_weight * ent
        parts["entropy"] = ent.item()
    return loss, parts, codes, zf.detach()


@torch.no_grad()
def reinit_dead_codes(
    model: VQModel,
    last_used: torch.Tensor,
    step: int,
    dead_after: int,
    pool: torch.Tensor,
    optimizer: Optional[torch.optim.Optimizer] = None,
    weights: Optional[torch.Tensor] = None,
) -> int:
    """Restart codes not used since ``step - dead_after`` from random rows of ``pool``.

    last_used: (K,) int64, the last step each code was chosen (updated in place for restarts).
    pool: (M, d) float encoder outputs (l2-normalised when the codebook is). ``weights`` (M,)
    >= 0: draw pool rows with these probabilities (e.g. their squared quantisation error, so
    that restarts go where the codebook fits the latents worst, not to the many identical
    background latents); None: uniformly. Adam moments of the restarted rows are zeroed.
    Returns the number of restarted codes.
    """
    dead = (step - last_used >= dead_after).nonzero().flatten()
    if dead.numel() == 0:
        return 0
    if weights is not None and float(weights.sum()) > 0:
        pick = torch.multinomial(weights.float(), dead.numel(), replacement=True)
    else:
        pick = torch.randint(0, pool.shape[0], (dead.numel(),), device=pool.device)
    new = pool[pick] + 0.01 * torch.randn(dead.numel(), pool.shape[1], device=pool.device) / math.sqrt(pool.shape[1])
    w = model.quantize.embedding.weight
    w[dead] = new.to(w.dtype)
    if optimizer is not None and w in optimizer.state:
        for key in ("exp_avg", "exp_avg_sq"):
            if key in optimizer.state[w]:
                optimizer.state[w][key][dead] = 0
    last_used[dead] = step
    return int(dead.numel())


def train_vq(
    vq_config: VQConfig,
    train: VQTrainConfig,
    images: torch.Tensor,
    run_dir: Path,
    seed: int,
    device: torch.device,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[VQModel, dict]:
    """Train a :class:`VQModel` on ``images`` (N, C, H, W) float32 in [0, 1]; resumable.

    Checkpoint: ``run_dir/vq_ckpt.pt`` every ``train.ckpt_every`` steps and at the end.
    Returns (model in eval mode, stats: steps, images_seen, train_time_s (active seconds, summed
    over resumed sessions), final loss parts averaged over the last 50 steps, restarts).
    Raises UsageError if the checkpoint was written with another recipe.
    """
    path = Path(run_dir) / "vq_ckpt.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    recipe = {"vq_config": asdict(vq_config), "train": asdict(train), "seed": seed, "n_images": int(images.shape[0])}
    torch.manual_seed(vq_init_seed(seed))
    model = VQModel(vq_config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=train.lr, betas=(0.9, 0.99), weight_decay=train.weight_decay)
    last_used = torch.zeros(vq_config.codebook_size, dtype=torch.long, device=device)
    state = {"step": 0, "time_s": 0.0, "history": [], "restarts": 0}
    ck = load_checkpoint(path)
    if ck is not None:
        _check_resume(ck, recipe, path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        last_used = ck["last_used"].to(device)
        torch.set_rng_state(ck["rng"])
        state = ck["state"]
        log(f"resuming VQ training at step {state['step']}/{train.steps}")

    def checkpoint():
        save_checkpoint(
            path,
            recipe=recipe,
            model=model.state_dict(),
            optimizer=opt.state_dict(),
            last_used=last_used.cpu(),
            rng=torch.get_rng_state(),
            state=state,
        )

    model.train()
    stop_reinit = int(train.steps * (1 - train.reinit_stop))
    bar = tqdm(total=train.steps, initial=state["step"], desc="VQ", disable=not progress, mininterval=5)
    t0 = time.perf_counter()
    while state["step"] < train.steps:
        step = state["step"]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, train.lr, train.warmup, train.steps, train.min_lr_ratio)
        x = images[batch_indices(step, train.batch_size, images.shape[0], seed)].to(device) * 2 - 1
        gen = torch.Generator().manual_seed(vq_step_seed(seed, step))
        loss, parts, codes, pool = vq_loss(
            model,
            x,
            train.l1_weight,
            train.entropy_weight,
            train.entropy_temperature,
            train.entropy_sample,
            train.bf16,
            gen,
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        last_used[codes.unique()] = step + 1
        state["step"] = step = step + 1
        if step % train.reinit_every == 0 and step <= stop_reinit:
            weights = None
            if train.restart_pick == "error":
                weights = (pool - model.quantize.codebook().detach()[codes.flatten()]).pow(2).sum(1)
            state["restarts"] += reinit_dead_codes(model, last_used, step, train.dead_after, pool, opt, weights)
        state["history"].append({"step": step, "loss": loss.item(), **parts})
        bar.update(1)
        bar.set_postfix(mse=f"{parts['mse']:.4f}", l1=f"{parts['l1']:.3f}", refresh=False)
        if step % train.ckpt_every == 0 or step == train.steps:
            state["time_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            checkpoint()
    bar.close()
    tail = state["history"][-50:]
    keys = [k for k in ("loss", "mse", "l1", "codebook", "commit", "entropy") if tail and k in tail[-1]]
    final = {k: sum(h[k] for h in tail) / len(tail) for k in keys} if tail else {}
    stats = {
        "steps": train.steps,
        "batch_size": train.batch_size,
        "images_seen": train.steps * train.batch_size,
        "train_time_s": state["time_s"],
        "code_restarts": state["restarts"],
        "final_train": final,
    }
    return model.eval(), stats


@torch.no_grad()
def tokenize(
    vq: VQModel, images: torch.Tensor, batch_size: int = 500, progress: bool = True, desc: str = "tokenize"
) -> torch.Tensor:
    """Images (N, C, H, W) float32 in [0, 1] -> code indices (N, h*w) int64 (raster order)."""
    vq = vq.eval()
    dev = vq.quant_conv.weight.device
    out = []
    for i in tqdm(range(0, images.shape[0], batch_size), desc=desc, disable=not progress, mininterval=5):
        out.append(vq.encode(images[i : i + batch_size].to(dev) * 2 - 1).flatten(1).cpu())
    return torch.cat(out)


def code_usage(codes: torch.Tensor, codebook_size: int) -> dict:
    """Usage of a codebook by ``codes`` (any shape, int64).

    Returns {"fraction_used": codes used at least once / codebook_size,
    "perplexity": exp(entropy in nats of the empirical code distribution) — the effective
    number of codes, between 1 and codebook_size}.
    """
    counts = torch.bincount(codes.flatten(), minlength=codebook_size).double()
    p = counts / counts.sum()
    nz = p[p > 0]
    return {
        "fraction_used": float((counts > 0).double().mean()),
        "perplexity": float(torch.exp(-(nz * nz.log()).sum())),
    }


@torch.no_grad()
def vq_metrics(
    vq: VQModel, images: torch.Tensor, batch_size: int = 250, progress: bool = True
) -> tuple[dict, torch.Tensor]:
    """Reconstruction error and codebook usage of ``vq`` on images (N, C, H, W) in [0, 1].

    Reconstructions are decoded, mapped to [0, 1] and clamped (what the model adapter shows).
    Returns (metrics, codes (N, h*w) int64) with metrics: mse and l1 (mean over all pixels, [0, 1]
    scale), psnr_db = 10 log10(1 / mse) of the pooled MSE, psnr_db_per_image (mean of per-image
    PSNRs), codebook_size, codebook_usage (fraction of codes used), code_perplexity.
    """
    vq = vq.eval()
    dev = vq.quant_conv.weight.device
    se = ae = 0.0
    psnrs, codes = [], []
    for i in tqdm(range(0, images.shape[0], batch_size), desc="VQ test", disable=not progress, mininterval=5):
        x = images[i : i + batch_size].to(dev)
        c = vq.encode(x * 2 - 1)
        rec = ((vq.decode_codes(c) + 1) / 2).clamp(0, 1)
        err = (rec - x).flatten(1)
        se += err.pow(2).sum().item()
        ae += err.abs().sum().item()
        psnrs.append(10 * torch.log10(1 / err.pow(2).mean(1).clamp_min(1e-10)).cpu())
        codes.append(c.flatten(1).cpu())
    n = images[0].numel() * images.shape[0]
    codes = torch.cat(codes)
    usage = code_usage(codes, vq.config.codebook_size)
    mse = se / n
    return {
        "mse": mse,
        "l1": ae / n,
        "psnr_db": 10 * math.log10(1 / mse),
        "psnr_db_per_image": float(torch.cat(psnrs).mean()),
        "codebook_size": vq.config.codebook_size,
        "codebook_usage": usage["fraction_used"],
        "code_perplexity": usage["perplexity"],
    }, codes


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
    recipe = {
        "gpt_config": asdict(gpt_config),
        "train": asdict(train),
        "seed": seed,
        "n_sequences": int(tokens.shape[0]),
        "tokens_sum": int(tokens.sum()),
    }
    if stop is not None:
        recipe["stop"] = asdict(stop)
    offset = 0.0
    if init is not None:
        recipe["init"], offset = init[0], float(init[2])
        recipe["init_epochs"] = offset
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
    state = {"step": 0, "time_s": 0.0, "history": []}
    ck = load_checkpoint(path)
    if ck is not None:
        _check_resume(ck, recipe, path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["rng"])
        state = ck["state"]
        log(f"resuming GPT training at step {state['step']}/{train.steps}")

    state.setdefault("curve", [])
    n = tokens.shape[0]
    per_epoch = stop.evals_per_epoch if stop is not None else 1

    def record_eval(step: int, seconds: float) -> None:
        t_eval = time.perf_counter()
        nll = float(evaluate(model.eval()))
        model.train()
        since = state["curve"][-1]["step"] if state["curve"] else 0
        losses = [h["loss"] for h in state["history"] if h["step"] > since]
        mean = sum(losses) / len(losses) if losses else None  # None: the row before the first step
        eval_s = time.perf_counter() - t_eval
        state["curve"].append(
            {
                "epoch": offset + step * train.batch_size / n,
                "step": step,
                "test_nll_bits": nll,
                "train_loss_nats": mean,
                "train_loss_bits": None if mean is None else mean / math.log(2),
                "lr": lr_at(step - 1, train.lr, train.warmup, train.steps, train.min_lr_ratio),
                "seconds": seconds + eval_s,
                "eval_seconds": eval_s,
            }
        )
        reason = stop_reason(state["curve"], stop) if stop is not None else None
        state["stop_reason"] = reason or (f"step budget reached ({train.steps} steps)" if step >= train.steps else None)
        write_json(
            {
                **(curve_info or {}),
                "batch_size": train.batch_size,
                "max_steps": train.steps,
                "train_sequences": n,
                "stop": asdict(stop) if stop else None,
                "stop_reason": state.get("stop_reason"),
                "rows": state["curve"],
            },
            Path(run_dir) / CURVE_FILE,
        )
        log(
            f"epoch {state['curve'][-1]['epoch']:.2f} (step {step}): test NLL {nll:.4f} bits/token, "
            + ("" if mean is None else f"train loss {mean / math.log(2):.4f} bits/token, ")
            + f"eval {eval_s:.0f} s"
            + (f"; stopping: {state['stop_reason']}" if state.get("stop_reason") else "")
        )

    if stop is not None and stop.eval_at_start and state["step"] == 0 and not state["curve"]:
        record_eval(0, 0.0)
    model.train()
    bar = tqdm(total=train.steps, initial=state["step"], desc="GPT", disable=not progress, mininterval=5)
    t0 = t_log = time.perf_counter()
    while state["step"] < train.steps and not state.get("stop_reason"):
        step = state["step"]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, train.lr, train.warmup, train.steps, train.min_lr_ratio)
        idx = batch_indices(step, train.batch_size, n, seed)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=train.bf16):
            loss = gpt_loss(model, labels[idx].to(device), tokens[idx].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if train.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        opt.step()
        state["step"] = step = step + 1
        state["history"].append({"step": step, "loss": loss.item()})
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        evaluated = evaluate is not None and (epoch_ends(step, train.batch_size, n, per_epoch) or step == train.steps)
        if evaluated:
            record_eval(step, state["time_s"] + time.perf_counter() - t0)
        if step % train.ckpt_every == 0 or step == train.steps or evaluated:
            state["time_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            save_checkpoint(
                path,
                recipe=recipe,
                model=model.state_dict(),
                optimizer=opt.state_dict(),
                rng=torch.get_rng_state(),
                state=state,
            )
            if not progress:
                recent = [h["loss"] for h in state["history"][-train.ckpt_every :]]
                log(
                    f"step {step}/{train.steps}  epoch {offset + step * train.batch_size / n:.3f}  "
                    f"train loss {sum(recent) / len(recent):.4f} nats  lr {opt.param_groups[0]['lr']:.2e}  "
                    f"{t0 - t_log:.1f} s since last line  {state['time_s'] / 3600:.2f} h in all"
                )
                t_log = t0
    bar.close()
    done = state["step"]
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
    if evaluate is not None:
        stats["curve"] = state["curve"]
        stats["stop_reason"] = state.get("stop_reason") or f"step budget reached ({train.steps} steps)"
    return model.eval(), stats


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
    vq, _, gpt, _ = embedded_recipe(quick)  # the same networks, with LlamaGen's codebook size and a 16 x 16 grid
    K = 64 if quick else 16384
    vq = replace(vq, codebook_size=K, commit_loss_beta=0.25)
    gpt = replace(gpt, vocab_size=K, block_size=256)
    if quick:
        return (
            vq,
            VQTrainConfig(
                steps=4,
                batch_size=8,
                warmup=1,
                dead_after=2,
                reinit_every=2,
                ckpt_every=2,
                restart_pick="error",
                bf16=True,
            ),
            gpt,
            GPTTrainConfig(steps=4, batch_size=8, warmup=1, ckpt_every=2, bf16=True),
        )
    return (
        vq,
        VQTrainConfig(
            steps=1000,
            batch_size=32,
            warmup=50,
            dead_after=100,
            reinit_every=25,
            restart_pick="error",
            bf16=True,
            ckpt_every=25,
        ),
        gpt,
        GPTTrainConfig(steps=900, batch_size=32, bf16=True, ckpt_every=25),
    )


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
