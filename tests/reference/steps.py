"""Pieces every decoding loop shares: the prefill, the distribution acceptance compares, timing, records.

Used by :mod:`lantern.chain` (chain drafts) and :mod:`lantern.tree_decoding` (draft trees).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import torch

from ambiguity.errors import UsageError
from ambiguity.models.base import Prompt, Step, TokenModel
from ambiguity.sampling import SamplingConfig, distribution
from reference.cache import OneImageCache

__all__ = ["Timer", "elapsed_since", "prefill", "target_distribution", "check_prompt", "image_row"]


class Timer:
    """Wall-clock seconds per named section; synchronises CUDA before and after each section.

    ``with timer("target"): ...`` adds to ``timer.seconds["target"]``; :meth:`snapshot` copies.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.sync = torch.device(device).type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - t0

    def snapshot(self) -> dict:
        return dict(self.seconds)


def elapsed_since(timer: Timer, before: dict) -> dict:
    """Seconds per section since ``before`` (a :meth:`Timer.snapshot`)."""
    return {k: v - before.get(k, 0.0) for k, v in timer.seconds.items()}


def prefill(model: TokenModel, prompt: Prompt, num_tokens: int, spare: int = 0) -> tuple[OneImageCache, Step]:
    """A fresh target cache (:class:`~reference.cache.OneImageCache`) for ``num_tokens`` image tokens
    and ``spare`` further slots, and the prefix forward.

    Returns ``(cache, step)``: step.logits (rows, 1, V) float32 for ``x_0``, step.hidden
    (rows, 1, H) = ``h_{-1}``.
    """
    cache = OneImageCache(model, prompt, num_tokens, spare)
    return cache, cache.prefill()


def target_distribution(
    logits: torch.Tensor, sampling: SamplingConfig, guided: bool, convention: str = "exact"
) -> torch.Tensor:
    """Per-row logits (rows, ..., V) -> the distribution acceptance compares (B, ..., V), float32.

    ``"exact"``: :func:`ambiguity.sampling.distribution` (guidance, temperature, top-k then top-p).
    ``"official"``: as the official LANTERN code: top-p before top-k when sampling, and the
    unfiltered softmax of the guided logits when greedy (its greedy test ignores the filters).
    """
    if convention != "official":
        return distribution(logits, sampling, guided)
    if sampling.greedy:
        return distribution(logits, SamplingConfig(guidance=sampling.guidance), guided)
    return distribution(logits, sampling, guided, order="pk")


def check_prompt(prompt: Prompt, sampling: SamplingConfig) -> None:
    """Raise UsageError unless ``prompt`` is one condition whose guidance rows match ``sampling``."""
    if prompt.guided != sampling.guided:
        raise UsageError(
            "the prompt's guidance rows must match the sampling config; build it with "
            "model.make_prompt(conditions, guided=sampling.guided)"
        )
    if prompt.batch_size != 1:
        raise UsageError(
            "decoding takes one condition at a time (rows accept different numbers of tokens); "
            "use lantern.decoding.decode for several images"
        )


def image_row(image: int, prompt: Prompt, seed, N: int, steps_n: int, steps: dict, seconds: dict, total: float) -> dict:
    """The images-table row (dict of length-1 arrays) of one decoded image (:mod:`lantern.records`)."""
    cond = prompt.conditions[0] if prompt.conditions else ""
    return {
        "image": np.array([image]),
        "condition": np.array([str(cond)]),
        "seed": np.array([-1 if seed is None else int(seed)]),
        "tokens": np.array([N]),
        "target_forwards": np.array([1 + steps_n]),
        "steps": np.array([steps_n]),
        "drafted": np.array([int(np.sum(steps["drafted"])) if steps_n else 0]),
        "accepted": np.array([int(np.sum(steps["accepted"])) if steps_n else 0]),
        "target_s": np.array([seconds.get("target", 0.0)]),
        "drafter_s": np.array([seconds.get("drafter", 0.0)]),
        "acceptance_s": np.array([seconds.get("acceptance", 0.0)]),
        "proximity_s": np.array([seconds.get("proximity", 0.0)]),
        "total_s": np.array([total]),
    }
