"""Plain autoregressive sampling through the model protocol, with a per-step hook.

This is the autoregressive baseline of the toolkit (``lantern.decoding`` builds speculative
decoding on the same calls) and the generator behind ``python -m ambiguity.profile``.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ambiguity.models.base import Prompt, TokenModel
from ambiguity.sampling import SamplingConfig, distribution, pick

__all__ = ["cfg_rows", "sample_tokens", "make_generator", "StepHook"]

# on_step(t, logits (rows, V) float32, p (B, V) float32, tokens (B,) int64)
StepHook = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


def cfg_rows(tokens: torch.Tensor, cfg: bool) -> torch.Tensor:
    """Per-image tokens (B, ...) -> per-row tokens (rows, ...): duplicated for the CFG rows."""
    return torch.cat([tokens, tokens]) if cfg else tokens


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A torch.Generator on ``device`` seeded with ``seed`` (sampling is reproducible per device)."""
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


@torch.no_grad()
def sample_tokens(model: TokenModel, prompt: Prompt, sampling: SamplingConfig,
                  generator: Optional[torch.Generator] = None, on_step: Optional[StepHook] = None,
                  num_tokens: Optional[int] = None) -> torch.Tensor:
    """Sample ``num_tokens`` (default: one image, ``model.num_tokens``) tokens per condition.

    One target forward per token, with the KV cache. ``prompt.cfg`` must match
    ``sampling.use_cfg`` (build the prompt with ``model.make_prompt(c, cfg=sampling.use_cfg)``).
    Returns code indices (B, num_tokens) int64.
    """
    if prompt.cfg != sampling.use_cfg:
        raise ValueError("prompt.cfg must equal sampling.use_cfg")
    n = num_tokens or model.num_tokens
    cache = model.new_cache(prompt, n)
    step = model.prefill(prompt, cache)
    out = torch.empty(prompt.batch_size, n, dtype=torch.long, device=model.device)
    for t in range(n):
        logits = step.logits[:, -1]
        p = distribution(logits, sampling, prompt.cfg)
        x = pick(p, sampling.greedy, generator)
        if on_step is not None:
            on_step(t, logits, p, x)
        out[:, t] = x
        if t + 1 < n:
            step = model.extend(cache, cfg_rows(x, prompt.cfg)[:, None])
    return out
