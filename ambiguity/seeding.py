"""The toolkit's one seed scheme: every image has its own random stream, fixed by (seed, image index).

Image ``i`` of a run with ``--seed s`` draws every random number it needs (sampled tokens, draft
tokens, acceptance uniforms, residual samples) from one :class:`torch.Generator` seeded with
:func:`image_seed` ``(s, i)``. Nothing else enters that stream, so an image's random numbers do
not depend on the batch size, on how many processes or shards share the work, on which images
were resumed, or on which command produced them: ``python -m ambiguity.profile`` and ``python -m
lantern.generate --method ar`` give image ``i`` the same tokens for the same seed, condition and
sampling settings. What holds exactly depends on the dtype: in float64 the tokens are the same
for every batch size (tested); in float32 (and bf16) a batched matrix product rounds differently
from a single-row one, which now and then moves a CDF boundary past a uniform and changes an image
from that token on (measured on the embedded model: 31 of 32 images identical between batch 1
and batches of 8 or 32, AR and LANTERN alike). The same batch size always reproduces itself.

Random choices that are not per image (a data subset, the random neighbour control, the
replacement draws of an analysis) use :func:`derived_seed` of the run seed and what they are for.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

__all__ = ["image_seed", "image_generator", "image_generators", "derived_seed"]


def derived_seed(*parts: int) -> int:
    """A 63-bit seed derived from integers by numpy's SeedSequence (well mixed, no collisions in
    practice): ``derived_seed(seed, 7)`` differs from ``derived_seed(seed + 7)``."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)
    return int(state[0] >> np.uint64(1))


def image_seed(seed: int, index: int) -> int:
    """Seed of image ``index``'s random stream in a run with seed ``seed`` (0 <= both < 2**63)."""
    return derived_seed(seed, index)


def image_generator(seed: int, index: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A :class:`torch.Generator` on ``device`` seeded with :func:`image_seed` ``(seed, index)``."""
    g = torch.Generator(device=device)
    g.manual_seed(image_seed(seed, index))
    return g


def image_generators(seed: int, indices: Sequence[int], device: torch.device | str = "cpu") -> list[torch.Generator]:
    """One generator per image index (a batch of rows each drawing from its own stream)."""
    return [image_generator(seed, int(i), device) for i in indices]
