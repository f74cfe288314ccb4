"""The former ``decode(..., batch_size=1)``: one image after another through the reference loops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from ambiguity.sampling import SamplingConfig
from ambiguity.seeding import image_generator, image_seed
from lantern.engine.decode import DecodeConfig, neighbour_table
from lantern.engine.records import Decoded
from reference.chain import autoregressive_decode, speculative_decode
from reference.jacobi import jacobi_decode
from reference.tree_decoding import tree_decode


def decode_one_by_one(
    model,
    conditions: Sequence,
    config: DecodeConfig,
    sampling: SamplingConfig,
    drafter=None,
    neighbours: Optional[torch.Tensor] = None,
    seed: int = 0,
    num_tokens: Optional[int] = None,
    first_index: int = 0,
    indices: Optional[Sequence[int]] = None,
    draws: Optional[dict] = None,
) -> Decoded:
    """Decode each condition alone with its method's reference loop (image ``i`` from stream
    ``(seed, i)``, or ``draws[i]`` where given for trees and Jacobi methods)."""
    rule = config.rule
    if rule is not None and neighbours is None:
        neighbours = neighbour_table(model, config)
    parts = []
    for j, c in enumerate(conditions):
        i = first_index + j if indices is None else int(indices[j])
        prompt = model.make_prompt([c], guided=sampling.guided)
        gen = image_generator(seed, i, model.device)
        kw = dict(image=i, seed=image_seed(seed, i))
        if config.params is not None:
            out = jacobi_decode(
                model, prompt, sampling, config.params, gen, num_tokens, draws=(draws or {}).get(i), **kw
            )
        elif rule is None:
            out = autoregressive_decode(model, prompt, sampling, gen, num_tokens, **kw)
        elif config.tree is None:
            out = speculative_decode(
                model, drafter, prompt, sampling, rule, neighbours, config.gamma, gen, num_tokens, **kw
            )
        else:
            d = (draws or {}).get(i)
            out = tree_decode(
                model, drafter, prompt, sampling, rule, neighbours, config.tree, gen, num_tokens, draws=d, **kw
            )
        parts.append(out)
    return Decoded.concat(parts)
