"""What the project's training loops share (the embedded VQ and GPT, :mod:`ambiguity.train`; the
Fashion-MNIST classifier): step counts for a number of epochs, the learning-rate schedule, a
stateless seeded batch order (the batch of step ``s`` depends only on ``seed`` and ``s``, so a
resumed run sees the batches an uninterrupted one would) and atomic, checked checkpoints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import UsageError
from ambiguity.io import atomic_path
from ambiguity.seeding import epoch_permutation_seed

__all__ = [
    "steps_for_epochs",
    "epoch_ends",
    "count_params",
    "lr_at",
    "batch_indices",
    "save_checkpoint",
    "load_checkpoint",
    "check_resume",
]


def steps_for_epochs(epochs: float, n: int, batch_size: int) -> int:
    """Optimiser steps that cover ``epochs`` passes over ``n`` sequences: ceil(epochs * n / batch_size)."""
    return math.ceil(epochs * n / batch_size - 1e-9)


def epoch_ends(step: int, batch_size: int, n: int, per_epoch: int = 1) -> bool:
    """Whether 1-based ``step`` (its batch: sequences ``(step-1)*batch_size .. step*batch_size - 1``
    of the stream of :func:`batch_indices`) completes a pass over the ``n`` sequences, or with
    ``per_epoch`` > 1 one of the ``per_epoch`` equal parts of a pass."""
    return (step * batch_size * per_epoch) // n > ((step - 1) * batch_size * per_epoch) // n


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


def check_resume(ck: dict, expected: dict, path: Path) -> None:
    """Refuse to resume from checkpoint ``ck`` at ``path`` when its recorded ``recipe`` differs from
    ``expected`` (UsageError naming the fields that differ and the fix)."""
    if ck["recipe"] != expected:
        diff = [k for k in expected if ck["recipe"].get(k) != expected[k]]
        raise UsageError(
            f"checkpoint {path} was written with a different {', '.join(diff) or 'recipe'}; "
            f"pass --fresh to start over or another --run-dir"
        )
