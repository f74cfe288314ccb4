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

Every other stream is listed in :data:`STREAMS`, one row per purpose, and seeded by the named
function of that row. Streams added since the per-image scheme use :func:`tagged_seed`
(:func:`derived_seed` of the run seed and the stream's tag in :data:`SEED_TAGS`). Older streams keep
their historic formulas (``seed * 100003 + epoch`` and so on) behind named functions, because
the shipped weights (the embedded VQ and GPT, the Fashion-MNIST classifier, the drafters) and
the recorded results were produced with them; changing one would change those files.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "image_seed",
    "image_generator",
    "image_generators",
    "derived_seed",
    "SEED_TAGS",
    "tagged_seed",
    "STREAMS",
    "vq_init_seed",
    "gpt_init_seed",
    "epoch_permutation_seed",
    "vq_step_seed",
    "drafter_init_seed",
    "drafter_epoch_seed",
    "classifier_init_seed",
    "holdout_seed",
    "uncond_rows_seed",
    "subset_seed",
    "augment_seed",
    "random_control_seed",
    "replacement_seed",
    "FINGERPRINT_PROBE_SEED",
]


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


# --------------------------------------------------------------------------- the other streams
#: Tags of the streams seeded by :func:`tagged_seed` (``derived_seed(seed, tag, *parts)``).
#: The values are part of recorded results (``lantern.quality`` writes them into its protocol); never reuse one.
SEED_TAGS: dict[str, int] = {
    "quality-subset": 11,  # lantern.quality.sources: the random subset of ``SPEC@N``
    "quality-bootstrap": 12,  # lantern.quality.scoring: bootstrap resamples of the generated images
    "quality-prdc-reference": 13,  # lantern.quality.scoring: the reference subset for precision/recall
}


def tagged_seed(seed: int, name: str, *parts: int) -> int:
    """The seed of stream ``name`` (a key of :data:`SEED_TAGS`): ``derived_seed(seed, tag, *parts)``.

    Raises KeyError for an unknown name (add the stream to the table first).
    """
    return derived_seed(seed, SEED_TAGS[name], *parts)


#: The drafter fingerprint's probe feature (:func:`lantern.drafter.model.target_fingerprint`); shipped
#: drafters record the logits it produces, so it never changes.
FINGERPRINT_PROBE_SEED = 0


def vq_init_seed(seed: int) -> int:
    """Global torch seed before initialising the embedded VQ model (``ambiguity.train_vq.train_vq``): ``seed``."""
    return int(seed)


def gpt_init_seed(seed: int) -> int:
    """Global torch seed before initialising the embedded GPT (``ambiguity.train.train_gpt``): ``seed + 1``."""
    return int(seed) + 1


def epoch_permutation_seed(seed: int, epoch: int) -> int:
    """Seed of epoch ``epoch``'s permutation of the training examples (``ambiguity.train_loop.batch_indices``,
    also the Fashion-MNIST classifier's): ``seed * 100003 + epoch``."""
    return int(seed) * 100003 + int(epoch)


def classifier_init_seed(seed: int) -> int:
    """Global torch seed before initialising the Fashion-MNIST classifier (``scripts/train_fmnist_classifier.py``):
    ``seed``."""
    return int(seed)


def vq_step_seed(seed: int, step: int) -> int:
    """Seed of the VQ loss's random draws at step ``step`` (entropy-loss sample): ``seed * 7919 + step``."""
    return int(seed) * 7919 + int(step)


def drafter_init_seed(seed: int) -> int:
    """Global torch seed set by ``python -m lantern.drafter.train`` before loading the target and
    initialising the drafter: ``seed``."""
    return int(seed)


def drafter_epoch_seed(seed: int, epoch: int) -> int:
    """Seed of the drafter's batch order in epoch ``epoch`` (``lantern.drafter.train``): ``seed * 1000 + epoch``."""
    return int(seed) * 1000 + int(epoch)


def holdout_seed(seed: int) -> int:
    """Seed of a held-out / training-subset permutation of sequences (``lantern.drafter.data.split_holdout``,
    the text twin's held-out passages and training subset): ``seed``."""
    return int(seed)


def uncond_rows_seed(seed: int) -> int:
    """Seed of the choice of rows trained unconditionally (``lantern.drafter.data.build_feature_cache``): ``seed``."""
    return int(seed)


def subset_seed(seed: int) -> int:
    """Seed of a random choice of conditions (Fashion-MNIST test images, captions) for a run: ``seed``."""
    return int(seed)


def augment_seed(seed: int, step: int) -> int:
    """Seed of the Fashion-MNIST classifier's augmentation at step ``step``: ``derived_seed(seed, step)``."""
    return derived_seed(seed, step)


def random_control_seed(seed: int, chunk: int) -> int:
    """Seed of the random-neighbour control's keys for row chunk ``chunk`` (``ambiguity.neighbourhood``):
    the first 32-bit word of ``SeedSequence([seed, chunk])``."""
    return int(np.random.SeedSequence([int(seed), int(chunk)]).generate_state(1)[0])


def replacement_seed(seed: int, random_mode: bool, k: int, rate: float, repeat: int) -> int:
    """Seed of one replacement draw of the interchangeability analysis: ``derived_seed(seed, random_mode,
    k, round(rate * 1e6), repeat)``."""
    return derived_seed(seed, bool(random_mode), int(k), int(round(rate * 1e6)), int(repeat))


#: Every random stream besides the per-image one: name -> (seed function, where it is used).
STREAMS: dict[str, tuple] = {
    "image": (image_seed, "every image's tokens, drafts and acceptance draws (all generating commands)"),
    **{name: (lambda seed, *parts, _n=name: tagged_seed(seed, _n, *parts), "lantern.quality") for name in SEED_TAGS},
    "vq-init": (vq_init_seed, "ambiguity.train_vq.train_vq"),
    "gpt-init": (gpt_init_seed, "ambiguity.train.train_gpt"),
    "epoch-permutation": (
        epoch_permutation_seed,
        "ambiguity.train_loop.batch_indices, scripts/train_fmnist_classifier.py",
    ),
    "vq-step": (vq_step_seed, "ambiguity.train_vq.train_vq"),
    "drafter-init": (drafter_init_seed, "lantern.drafter.train"),
    "drafter-epoch": (drafter_epoch_seed, "lantern.drafter.train"),
    "holdout": (holdout_seed, "lantern.drafter.data.split_holdout, the text twin"),
    "uncond-rows": (uncond_rows_seed, "lantern.drafter.data.build_feature_cache"),
    "subset": (subset_seed, "ambiguity.conditions, ambiguity.data.captions, scripts/figure_embedded_samples.py"),
    "classifier-init": (classifier_init_seed, "scripts/train_fmnist_classifier.py"),
    "augment": (augment_seed, "scripts/train_fmnist_classifier.py"),
    "random-control": (random_control_seed, "ambiguity.neighbourhood (metric 'random')"),
    "replacement": (replacement_seed, "ambiguity.analyses.interchangeability"),
    "fingerprint-probe": (lambda seed=0: FINGERPRINT_PROBE_SEED, "lantern.drafter.model.target_fingerprint"),
}
