"""The EAGLE drafter's training objective and its test metrics (arXiv 2401.15077, Sec. 4.2;
LANTERN arXiv 2410.03355, Fig. 2b): the loss on teacher-forced rows, top-k agreement with the
target, and the teacher-forced test pass over feature parts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from ambiguity.distributed import SINGLE, Shard
from ambiguity.models.base import TokenModel
from lantern.drafter.data import iterate_batches, training_inputs
from lantern.drafter.model import Drafter

__all__ = ["KS", "drafter_loss", "topk_hits", "topk_accuracy", "forward_rows", "evaluate"]

KS = (1, 2, 3)


def drafter_loss(
    pred: torch.Tensor,
    target_hidden: torch.Tensor,
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    ce_weight: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EAGLE loss (arXiv 2401.15077, Sec. 4.2): ``SmoothL1(f, h) + ce_weight * CE(p, q)``.

    Args:
        pred, target_hidden: (..., H) predicted features f and the target's h.
        draft_logits, target_logits: (..., V) float32; p = softmax(target_logits) are soft labels.
    Returns:
        (loss, smooth_l1, ce) scalars float32; smooth_l1 is the mean over all elements (beta 1),
        ce = mean over positions of -sum_v p(v) log q(v) in nats.
    """
    l1 = F.smooth_l1_loss(pred.float(), target_hidden.float())
    p = torch.softmax(target_logits.float(), dim=-1)
    ce = -(p * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1).mean()
    return l1 + ce_weight * ce, l1, ce


def topk_hits(draft_logits: torch.Tensor, target_logits: torch.Tensor, ks: Sequence[int] = KS) -> torch.Tensor:
    """How many positions have the target's top-1 token among the drafter's top-k, for each k.

    draft_logits, target_logits: (..., V). Returns (len(ks),) int64 counts over all positions.
    The target's top-1 is its argmax (lowest index on ties); the drafter's top-k is
    ``torch.topk``. LANTERN Fig. 2b reports these counts divided by the number of positions.
    """
    want = target_logits.argmax(-1).flatten()
    top = draft_logits.reshape(-1, draft_logits.shape[-1]).topk(max(ks), dim=-1).indices
    match = top == want[:, None]
    return torch.stack([match[:, :k].any(-1).sum() for k in ks]).long().cpu()


def topk_accuracy(draft_logits: torch.Tensor, target_logits: torch.Tensor, ks: Sequence[int] = KS) -> dict[str, float]:
    """{"top1": fraction, "top2": ..., ...}: :func:`topk_hits` over the number of positions."""
    n = draft_logits[..., 0].numel()
    hits = topk_hits(draft_logits, target_logits, ks)
    return {f"top{k}": float(h) / n for k, h in zip(ks, hits)}


def forward_rows(
    drafter: Drafter,
    model: TokenModel,
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    ddp: Optional[torch.nn.Module] = None,
):
    """Drafter outputs and targets for teacher-forced rows (tokens (R, N), hidden (R, N, H));
    the features pass through ``ddp`` (the wrapped drafter) when given."""
    tok_in, feat_in, feat_tgt = training_inputs(tokens, hidden)
    pred = (ddp or drafter)(model, tok_in, feat_in, None, 0)
    draft_logits = drafter.logits(model, pred)
    with torch.no_grad():
        target_logits = model.head(feat_tgt.to(model.dtype))
    return pred, feat_tgt, draft_logits, target_logits


@torch.no_grad()
def evaluate(
    drafter: Drafter,
    model: TokenModel,
    paths: Sequence[Path],
    batch_size: int = 64,
    ks: Sequence[int] = KS,
    shard: Shard = SINGLE,
) -> dict[str, float]:
    """Teacher-forced test metrics over feature parts: top-k accuracy (fractions), mean
    smooth_l1 and ce (nats) per position, and the number of positions.

    shard: under torchrun each rank evaluates the batches ``b % count == index`` and the sums
    are all-reduced (every rank returns the same metrics)."""
    drafter.eval()
    sums = torch.zeros(len(ks) + 3, dtype=torch.float64)  # hits per k, positions, smooth_l1 and ce sums
    for b, (tokens, hidden, _) in enumerate(iterate_batches(paths, batch_size, None, model.device)):
        if not shard.owns(b):
            continue
        pred, tgt, dl, tl = forward_rows(drafter, model, tokens, hidden)
        _, l1, ce = drafter_loss(pred, tgt, dl, tl)
        m = dl[..., 0].numel()
        sums[: len(ks)] += topk_hits(dl, tl, ks).double()
        sums[len(ks) :] += torch.tensor([m, float(l1) * m, float(ce) * m], dtype=torch.float64)
    sums = shard.all_sum(sums)
    hits, (n, l1_sum, ce_sum) = sums[: len(ks)], sums[len(ks) :].tolist()
    n = int(n)
    out = {f"top{k}": float(h) / max(n, 1) for k, h in zip(ks, hits.tolist())}
    out.update(test_smooth_l1=l1_sum / max(n, 1), test_ce=ce_sum / max(n, 1), test_positions=n)
    return out
