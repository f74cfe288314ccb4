"""What every round of the engine shares: the distribution acceptance compares (:func:`target_distribution`)
and the wall-clock sections of a step (:class:`Timer`)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator

import torch

from ambiguity.sampling import SamplingConfig, distribution

__all__ = ["Timer", "elapsed_since", "target_distribution"]


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
