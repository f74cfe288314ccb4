"""Training of the embedded model's VQ tokenizer (LlamaGen, Sun et al. 2024, arXiv 2406.06525,
Sec. 2.1, scaled down; no GAN or perceptual loss).

``loss = MSE + l1_weight * L1 + codebook loss + beta * commitment loss`` on images in [-1, 1];
l2-normalised codebook. Codes unused for ``dead_after`` steps are re-initialised from random
(l2-normalised) encoder outputs of the current batch, and their Adam moments are zeroed
("dead-code restart", Dhariwal et al. 2020 Jukebox Sec. 3.1 / Zeghidour et al. 2021 SoundStream
Sec. 3.3); restarts stop for the last ``reinit_stop`` fraction of training so that the decoder
settles on a fixed codebook. Optionally (``entropy_weight``) LlamaGen's codebook entropy loss
(from MAGVIT). :func:`train_vq` resumes from its checkpoint; :func:`tokenize` and
:func:`vq_metrics` use the trained tokenizer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ambiguity.models.vq import VQConfig, VQModel
from ambiguity.seeding import vq_init_seed, vq_step_seed
from ambiguity.train_loop import batch_indices, check_resume, load_checkpoint, lr_at, save_checkpoint

__all__ = [
    "VQTrainConfig",
    "codebook_entropy_loss",
    "vq_loss",
    "reinit_dead_codes",
    "train_vq",
    "tokenize",
    "code_usage",
    "vq_metrics",
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


def _resume_vq(
    path: Path, recipe: dict, model: VQModel, opt: torch.optim.Optimizer, last_used: torch.Tensor, steps: int, log
) -> tuple[dict, torch.Tensor]:
    """(loop state, last_used) from the checkpoint at ``path`` (model, optimiser and RNG restored),
    or fresh ones. Raises UsageError for a checkpoint of another recipe."""
    state = {"step": 0, "time_s": 0.0, "history": [], "restarts": 0}
    ck = load_checkpoint(path)
    if ck is not None:
        check_resume(ck, recipe, path)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        last_used = ck["last_used"].to(last_used.device)
        torch.set_rng_state(ck["rng"])
        state = ck["state"]
        log(f"resuming VQ training at step {state['step']}/{steps}")
    return state, last_used


def _vq_step(
    model: VQModel, opt: torch.optim.Optimizer, train: VQTrainConfig, step: int, x: torch.Tensor, seed: int
) -> tuple[torch.Tensor, dict, torch.Tensor, torch.Tensor]:
    """Optimiser step ``step`` (0-based: its learning rate and entropy-sample seed) on images x in
    [-1, 1]; returns :func:`vq_loss`'s (loss, parts, codes, restart pool)."""
    for g in opt.param_groups:
        g["lr"] = lr_at(step, train.lr, train.warmup, train.steps, train.min_lr_ratio)
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
    return loss, parts, codes, pool


def _restart_codes(
    model: VQModel,
    opt: torch.optim.Optimizer,
    train: VQTrainConfig,
    step: int,
    last_used: torch.Tensor,
    codes: torch.Tensor,
    pool: torch.Tensor,
) -> int:
    """:func:`reinit_dead_codes` after 1-based ``step``, drawing pool rows as ``train.restart_pick``
    says; returns the number of restarted codes."""
    weights = None
    if train.restart_pick == "error":
        weights = (pool - model.quantize.codebook().detach()[codes.flatten()]).pow(2).sum(1)
    return reinit_dead_codes(model, last_used, step, train.dead_after, pool, opt, weights)


def _vq_stats(state: dict, train: VQTrainConfig) -> dict:
    """What :func:`train_vq` returns besides the model (see there)."""
    tail = state["history"][-50:]
    keys = [k for k in ("loss", "mse", "l1", "codebook", "commit", "entropy") if tail and k in tail[-1]]
    final = {k: sum(h[k] for h in tail) / len(tail) for k in keys} if tail else {}
    return {
        "steps": train.steps,
        "batch_size": train.batch_size,
        "images_seen": train.steps * train.batch_size,
        "train_time_s": state["time_s"],
        "code_restarts": state["restarts"],
        "final_train": final,
    }


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
    state, last_used = _resume_vq(path, recipe, model, opt, last_used, train.steps, log)
    model.train()
    stop_reinit = int(train.steps * (1 - train.reinit_stop))
    bar = tqdm(total=train.steps, initial=state["step"], desc="VQ", disable=not progress, mininterval=5)
    t0 = time.perf_counter()
    while state["step"] < train.steps:
        step = state["step"]
        x = images[batch_indices(step, train.batch_size, images.shape[0], seed)].to(device) * 2 - 1
        loss, parts, codes, pool = _vq_step(model, opt, train, step, x, seed)
        last_used[codes.unique()] = step + 1
        state["step"] = step = step + 1
        if step % train.reinit_every == 0 and step <= stop_reinit:
            state["restarts"] += _restart_codes(model, opt, train, step, last_used, codes, pool)
        state["history"].append({"step": step, "loss": loss.item(), **parts})
        bar.update(1)
        bar.set_postfix(mse=f"{parts['mse']:.4f}", l1=f"{parts['l1']:.3f}", refresh=False)
        if step % train.ckpt_every == 0 or step == train.steps:
            state["time_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            save_checkpoint(
                path,
                recipe=recipe,
                model=model.state_dict(),
                optimizer=opt.state_dict(),
                last_used=last_used.cpu(),
                rng=torch.get_rng_state(),
                state=state,
            )
    bar.close()
    return model.eval(), _vq_stats(state, train)


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
