"""Turning logits into the distribution a target model samples from.

The order is the one LlamaGen and the LANTERN code use: classifier-free guidance on logits
(``uncond + s * (cond - uncond)``), then temperature, then top-k, then top-p (nucleus), then a
softmax. ``temperature == 0`` means greedy decoding: the distribution ``p`` is then the one at
temperature 1 after the filters, and the token is its argmax (LANTERN's greedy acceptance
compares probabilities of that ``p``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ambiguity.errors import UsageError

__all__ = ["SamplingConfig", "split_cfg", "guide", "filter_logits", "distribution", "pick"]


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings as the field uses them.

    cfg: guidance scale s >= 0; s == 1 means no guidance (and no doubled batch).
    temperature: >= 0; 0 is greedy. top_k: 0 disables; top_p: in (0, 1], 1 disables.
    Raises :class:`UsageError` for out-of-range values.
    """

    cfg: float = 1.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.cfg >= 0:
            raise UsageError(f"--cfg must be >= 0 (1 disables guidance), got {self.cfg}")
        if not self.temperature >= 0:
            raise UsageError(f"--temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise UsageError(f"--top-k must be an integer >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p must be in (0, 1] (1 disables it), got {self.top_p}")

    @property
    def use_cfg(self) -> bool:
        """Whether the unconditional rows are needed (any scale other than 1)."""
        return self.cfg != 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict:
        return asdict(self)


def split_cfg(x: torch.Tensor, cfg: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows (2B, ...) -> (cond (B, ...), uncond (B, ...)); without CFG (B, ...) -> (x, None)."""
    if not cfg:
        return x, None
    cond, uncond = x.chunk(2, dim=0)
    return cond, uncond


def guide(logits: torch.Tensor, scale: float, cfg: bool) -> torch.Tensor:
    """Classifier-free guidance on per-row logits: (rows, ..., V) -> (B, ..., V), float32.

    guided = uncond + scale * (cond - uncond). Without CFG rows the logits pass through.
    """
    cond, uncond = split_cfg(logits.float(), cfg)
    if uncond is None:
        return cond
    return uncond + scale * (cond - uncond)


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Top-k then top-p filtering on (..., V) logits; removed entries become -inf.

    top-k keeps every token whose logit is >= the k-th largest (ties kept). top-p keeps the
    smallest prefix of the sorted distribution whose mass reaches ``top_p`` (always >= 1 token).
    """
    out = logits.clone()
    V = out.shape[-1]
    if top_k and top_k < V:
        kth = torch.topk(out, int(top_k), dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        remove = cum > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        out = out.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return out


def distribution(logits: torch.Tensor, cfg: SamplingConfig, rows_have_cfg: bool | None = None) -> torch.Tensor:
    """Per-row logits (rows, ..., V) -> the sampling distribution p (B, ..., V), float32.

    Applies guidance (when the rows carry unconditional halves), temperature (skipped when
    greedy), top-k and top-p, then softmax. Each row of the result sums to 1.
    """
    has = cfg.use_cfg if rows_have_cfg is None else rows_have_cfg
    x = guide(logits, cfg.cfg, has)
    if cfg.temperature > 0:
        x = x / cfg.temperature
    x = filter_logits(x, cfg.top_k, cfg.top_p)
    return torch.softmax(x, dim=-1)


def pick(probs: torch.Tensor, greedy: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample (or argmax when greedy) one token per row: probs (..., V) -> (...) int64."""
    if greedy:
        return probs.argmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
