"""How far a relaxed rule's output distribution moves from the target's p, exactly, on real (p, q) pairs.

LANTERN bounds the mass moved *per draft* (``S_j* <= δ``), not the distance of what a
verification step emits from the target distribution: with the exact residual
``TVD(out, p) <= Σ_y min(max(q(y) - p(y), 0), δ)``, which exceeds δ when the drafter is far
from p. This module measures that distance with no sampling:

* :func:`real_pairs` — the (p, q) pairs a decoder meets: for token sequences of the target
  (e.g. its own samples), one teacher-forced pass of the target gives p at every position (with
  the same guidance, temperature and top-k/top-p processing as decoding) and one pass of the
  drafter on the target's true features gives q for the same position (what the first draft of
  a verification step starting there is drawn from);
* :func:`distortion_table` — ``TVD(out, p)`` of one verification step for each (k, δ)
  (:func:`lantern.acceptance.output_distribution`), next to ``TVD(q, p)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ambiguity.models.base import TokenModel
from ambiguity.sampling import SamplingConfig, expand_rows
from lantern.acceptance import AcceptanceRule, output_distribution
from lantern.divergences import tvd
from lantern.drafter import DraftModel
from lantern.steps import target_distribution

__all__ = ["real_pairs", "distortion_table"]


@torch.no_grad()
def real_pairs(
    model: TokenModel,
    drafter: DraftModel,
    tokens: torch.Tensor,
    conditions: Sequence,
    sampling: SamplingConfig,
    convention: str = "exact",
    batch_size: int = 8,
    positions: slice = slice(None),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and drafter distributions at every position of given sequences.

    tokens: (B, N) int64 code indices (raster order); conditions: B labels or captions;
    sampling: guidance, temperature, top-k/top-p, applied to both as in decoding (a
    temperature of 0 is treated as 1: the distributions, not the argmax). positions: which of
    the N - 1 predicted positions (1 .. N-1) to keep. Returns (p, q), each (B * n, V) float32.
    """
    if sampling.greedy:
        sampling = SamplingConfig(
            guidance=sampling.guidance, temperature=1.0, top_k=sampling.top_k, top_p=sampling.top_p
        )
    guided = sampling.guided
    ps, qs = [], []
    for s in range(0, len(tokens), batch_size):
        x = tokens[s : s + batch_size].to(model.device)
        prompt = model.make_prompt(list(conditions[s : s + batch_size]), guided=guided)
        rows = expand_rows(x, guided)
        step = model.teacher_force(prompt, rows)  # hidden[:, t] predicts x_t
        p = target_distribution(step.logits[:, 1:], sampling, guided, convention)  # (b, N-1, V): x_1 .. x_{N-1}
        f = drafter(model, rows[:, :-1], step.hidden[:, :-1].to(drafter.dtype), None, 0)  # f_i predicts x_{i+1}
        q = target_distribution(drafter.logits(model, f), sampling, guided, convention)
        ps.append(p[:, positions].reshape(-1, p.shape[-1]).float().cpu())
        qs.append(q[:, positions].reshape(-1, q.shape[-1]).float().cpu())
    return torch.cat(ps), torch.cat(qs)


def distortion_table(
    p: torch.Tensor,
    q: torch.Tensor,
    neighbours: torch.Tensor,
    ks: Sequence[int],
    deltas: Sequence[float],
    method: str = "lantern",
    convention: str = "exact",
    chunk: int = 256,
    max_bytes: int = 1 << 30,
) -> pd.DataFrame:
    """Exact per-step distortion of a relaxed rule on (p, q) pairs (P, V).

    neighbours: (V, >= max(ks)) int64 table (nearest first). Returns one row per (k, δ) with
    mean / median / q90 / max of ``TVD(out, p)`` (probabilities), plus a first row
    ``k = 0, δ = 0`` holding ``TVD(q, p)`` (what the drafter's own error is), and ``positions``.
    Positions go through :func:`~lantern.acceptance.output_distribution` ``chunk`` at a time, fewer
    when its (chunk, V, k) working set (and (chunk, V, V) for ``"official"``) would pass
    ``max_bytes`` (bytes; at least one position): at V = 16384, k = 1000 that is 2 positions.
    """

    def stats(t: torch.Tensor) -> dict:
        v = t.double().numpy()
        return {
            "mean": float(v.mean()),
            "median": float(np.median(v)),
            "q90": float(np.quantile(v, 0.9)),
            "max": float(v.max()),
            "positions": int(v.size),
        }

    rows = [{"what": "TVD(q, p)", "k": 0, "delta": 0.0, **stats(tvd(q, p))}]
    for k in ks:
        for d in deltas:
            rule = AcceptanceRule(method, k=int(k), delta=float(d), convention=convention)
            n = _positions_per_chunk(p.shape[-1], int(k), convention, chunk, max_bytes)
            t = torch.cat(
                [
                    tvd(output_distribution(p[i : i + n], q[i : i + n], neighbours[:, :k], rule), p[i : i + n])
                    for i in range(0, len(p), n)
                ]
            )
            rows.append({"what": "TVD(out, p)", "k": int(k), "delta": float(d), **stats(t)})
    return pd.DataFrame(rows)


def _positions_per_chunk(V: int, k: int, convention: str, chunk: int, max_bytes: int) -> int:
    """Positions per call of ``output_distribution`` whose working set stays under ``max_bytes``:
    about six float32 (V, k) tensors per position (gathered p, cumulative sums, masks), plus
    three (V, V) ones for the official residual."""
    per_position = 6 * 4 * V * max(k, 1) + (3 * 4 * V * V if convention == "official" else 0)
    return max(1, min(chunk, max_bytes // per_position))
