"""Plain autoregressive sampling through the model protocol, with a per-step hook.

This is the autoregressive baseline of the toolkit (``lantern.engine.decode`` builds speculative
decoding on the same calls) and the generator behind ``python -m ambiguity.profile``, the
analyses and drafter self-generation. Each image draws from its own random stream
(:mod:`ambiguity.seeding`), so a batch of images gives every image the tokens it would get alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import torch

from ambiguity.models.base import Prompt, TokenModel
from ambiguity.sampling import Generators, SamplingConfig, distribution, expand_rows, pick

__all__ = ["sample_tokens", "StepHook"]

# on_step(t, logits (rows, V) float32, p (B, V) float32, tokens (B,) int64)
StepHook = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


@torch.no_grad()
def sample_tokens(
    model: TokenModel,
    prompt: Prompt,
    sampling: SamplingConfig,
    generator: Generators = None,
    on_step: Optional[StepHook] = None,
    num_tokens: Optional[int] = None,
) -> torch.Tensor:
    """Sample ``num_tokens`` (default: one image, ``model.num_tokens``) tokens per condition.

    One target forward per token on the model's slot cache (``new_slots_cache`` for the batch,
    ``prefill_slots``, then ``extend_slots`` of every image's last token at slot ``t``, all slots
    ``0..t`` visible): the forwards of the decoding engine's autoregressive method, so
    ``lantern``'s AR decoding of image ``i`` gives these tokens. ``prompt.guided`` must equal
    ``sampling.guided`` (build the prompt with ``model.make_prompt(c, guided=sampling.guided)``).
    ``generator``: one per image (``ambiguity.seeding.image_generators``; each image's tokens
    then depend only on its own stream) or one for the whole batch (see
    :func:`ambiguity.sampling.pick`). Returns code indices (B, num_tokens) int64.
    Raises ValueError for a prompt/sampling mismatch.
    """
    if prompt.guided != sampling.guided:
        raise ValueError("prompt.guided must equal sampling.guided")
    n = num_tokens or model.num_tokens
    cache = model.new_slots_cache(prompt.batch_size, prompt.guided, n)
    step = model.prefill_slots(cache, torch.arange(prompt.rows, device=model.device), prompt)
    out = torch.empty(prompt.batch_size, n, dtype=torch.long, device=model.device)
    for t in range(n):
        logits = step.logits[:, -1]
        p = distribution(logits, sampling, prompt.guided)
        x = pick(p, sampling.greedy, generator)
        if on_step is not None:
            on_step(t, logits, p, x)
        out[:, t] = x
        if t + 1 < n:
            at = torch.full((prompt.rows, 1), t, dtype=torch.long, device=model.device)
            step = model.extend_slots(cache, expand_rows(x, prompt.guided)[:, None], at, at, t + 1)
    return out
