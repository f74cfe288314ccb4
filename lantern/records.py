"""Decode records: what :mod:`lantern.decoding` returns, as pandas-ready tables, and their summary.

One decode of ``B`` images gives three tables (columns listed in :data:`STEP_COLUMNS`,
:data:`DRAFT_COLUMNS`, :data:`IMAGE_COLUMNS`):

* **steps** — one row per target forward *after* the prefill (a verification step): the image,
  the step index (1-based; the prefill is step 0 and has no row), the first drafted position,
  ``drafted`` (γ, fewer near the end of the image), ``accepted`` (draft tokens accepted, the
  accepted prefix), ``emitted = accepted + 1`` (the +1 is the token the same target forward
  samples: the *bonus* token from the bonus position when every draft was accepted, the
  *residual* token at the first rejection, or the plain *target* token when nothing was
  drafted), ``drafter_forwards`` (drafter calls that built the drafts: γ for a chain, one per
  tree level for a tree), and the wall-clock of the step split into target, drafter and
  acceptance seconds; ``proximity_s`` is the part of ``acceptance_s`` spent growing the
  proximity sets A (LANTERN App. F.2, timed inside the real step). ``batch_step`` is the
  forward of the whole batch the row belongs to and ``active`` the number of images in that
  forward (batched decoding, :mod:`lantern.batched`; one image at a time: ``batch_step = step``
  and ``active = 1``). Inside a batch an image's own latency cannot be measured: each section's
  seconds of a batch step are split equally among its ``active`` images.
* **drafts** — one row per draft token (per tree node for draft trees): position, token,
  ``p(x̂)``, ``q(x̂)`` (for a tree: the conditional probability it was drawn with, 1 for
  deterministic EAGLE-2 drafts), ``p̃(x̂)``, ``j*``, the divergence spent (units of the rule's
  bound: TVD for ``lantern``, nats for ``lantern-jsd``, relative mass for ``lantern++``), the
  uniform ``u`` (NaN when greedy), the per-token verdict ``accepted``, ``reached`` (the token
  was judged: at or before the first rejection of its chain; in a tree, a child of an accepted
  node tried before its parent's accepted child), ``committed`` (on the accepted path),
  ``out_of_support`` (committed although ``p(x̂) = 0``: only a relaxed rule can do that), the
  ambiguity of ``p`` there: top-1 probability and entropy (nats); ``q``'s top-1; and the tree
  coordinates ``node``, ``parent``, ``depth`` (1 = the first draft), ``sibling`` (trial order);
  ``proposed_step``: the step whose forward proposed the draft (its own step for a drafter; the
  previous Jacobi iteration for SJD/GSD/SCD, -1 for an initialised window position, :mod:`lantern.jacobi`).
* **images** — one row per image: condition, seed, tokens, target forwards (prefill
  included), drafted/accepted totals and seconds.

Definitions (:func:`summarize_decode`), per decode, summed over images:

* ``tokens_per_forward = tokens / target_forwards`` with ``target_forwards = images + steps``
  (the prefill counts as a target forward: it emits the first token). AR gives 1.
* ``tau`` (EAGLE's mean accepted length τ, *bonus token counted*; the official LANTERN code
  calls it ``step_compression``) ``= mean over steps of (accepted + 1)`` — tokens emitted per
  verification forward; ``= (tokens - images) / steps``.
* ``mean_accepted_drafts`` (*without* the bonus token) ``= mean over steps of accepted``
  ``= tau - 1``.
* ``acceptance_rate = committed / reached`` over draft tokens (the per-token acceptance rate α
  of speculative decoding; draft tokens after a rejection are not counted).
* ``accept_histogram[j]`` = number of steps that accepted exactly ``j`` draft tokens.
* ``out_of_support`` = committed drafts whose own target probability is 0 (and their share
  ``out_of_support_rate`` of the committed drafts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

__all__ = [
    "STEP_COLUMNS",
    "DRAFT_COLUMNS",
    "IMAGE_COLUMNS",
    "NEXT_KINDS",
    "Decoded",
    "StepLog",
    "summarize_decode",
    "accept_histogram",
    "summary_table",
]

STEP_COLUMNS = (
    "image",
    "step",
    "position",
    "drafted",
    "accepted",
    "emitted",
    "next_kind",
    "next_token",
    "drafter_forwards",
    "target_s",
    "drafter_s",
    "acceptance_s",
    "proximity_s",
    "batch_step",
    "active",
)
DRAFT_COLUMNS = (
    "image",
    "step",
    "draft_index",
    "position",
    "token",
    "p_draft",
    "q_draft",
    "p_tilde",
    "j_star",
    "spent",
    "accept_prob",
    "u",
    "accepted",
    "reached",
    "committed",
    "out_of_support",
    "p_top1",
    "p_entropy",
    "q_top1",
    "node",
    "parent",
    "depth",
    "sibling",
    "proposed_step",
)
_TREE_INT = ("token", "j_star", "node", "parent", "depth", "sibling", "position", "draft_index")
IMAGE_COLUMNS = (
    "image",
    "condition",
    "seed",
    "tokens",
    "target_forwards",
    "steps",
    "drafted",
    "accepted",
    "target_s",
    "drafter_s",
    "acceptance_s",
    "proximity_s",
    "total_s",
)
NEXT_KINDS = ("target", "bonus", "residual")  # how the token sampled by a verification forward was drawn


class StepLog:
    """Accumulates the records of one image while it is decoded (used by :mod:`lantern.decoding`).

    :meth:`add_step` takes tensors on any device; they are moved to the CPU once, in
    :meth:`tables`, so logging does not synchronise the accelerator more than decoding does.
    """

    def __init__(self, image: int = 0):
        self.image = image
        self.steps: list[dict] = []
        self.drafts: list[dict] = []

    def add_step(
        self,
        step: int,
        position: int,
        drafted: int,
        accepted: int,
        next_kind: str,
        next_token: int,
        seconds: dict,
        drafts: Optional[dict] = None,
        drafter_forwards: int = 0,
        batch_step: Optional[int] = None,
        active: int = 1,
    ) -> None:
        """One verification step; ``drafts`` maps draft columns to (γ,) tensors of a chain (absent
        when γ = 0), or — with a ``reached`` column — to the complete per-node arrays of a tree.
        batch_step / active: the batch forward and its image count (default: ``step`` and 1, one
        image at a time; batched Jacobi decoding, :func:`lantern.jacobi.batched_jacobi_decode`)."""
        self.steps.append(
            dict(
                image=self.image,
                step=step,
                position=position,
                drafted=drafted,
                accepted=accepted,
                emitted=accepted + 1,
                next_kind=next_kind,
                next_token=next_token,
                drafter_forwards=drafter_forwards,
                target_s=seconds.get("target", 0.0),
                drafter_s=seconds.get("drafter", 0.0),
                acceptance_s=seconds.get("acceptance", 0.0),
                proximity_s=seconds.get("proximity", 0.0),
                batch_step=step if batch_step is None else batch_step,
                active=active,
            )
        )
        if drafts is not None and drafted > 0:
            chain = "reached" not in drafts  # a tree brings its own per-node positions
            self.drafts.append(
                dict(drafts, step=step, accepted_count=accepted, **({"position": position} if chain else {}))
            )

    def tables(self) -> tuple[dict, dict]:
        """(steps, drafts) as dicts of numpy columns (see the module docstring)."""
        steps = {c: np.array([s[c] for s in self.steps]) for c in STEP_COLUMNS}
        if not self.steps:
            steps = _empty(STEP_COLUMNS)
        if not self.drafts:
            return steps, _empty(DRAFT_COLUMNS)
        cols: dict[str, list] = {c: [] for c in DRAFT_COLUMNS}
        for d in self.drafts:
            rows = _tree_rows(d) if "reached" in d else _chain_rows(d)
            g = len(rows["token"])
            rows["image"], rows["step"] = np.full(g, self.image), np.full(g, d["step"])
            rows["out_of_support"] = rows["committed"] & (rows["p_draft"] == 0)
            rows.setdefault("proposed_step", np.full(g, d["step"]))  # a drafter proposes in its own step
            for c in DRAFT_COLUMNS:
                cols[c].append(rows[c])
        return steps, {c: np.concatenate(v) for c, v in cols.items()}


def _chain_rows(d: dict) -> dict:
    """Columns of one chain step from its (γ,) tensors: the accepted prefix is committed."""
    g = int(d["token"].numel())
    idx = np.arange(g)
    a = d["accepted_count"]
    rows = {
        "draft_index": idx,
        "position": d["position"] + idx,
        "accepted": d["accepted"].cpu().numpy().astype(bool),
        "reached": idx <= a,
        "committed": idx < a,
        "node": idx + 1,
        "parent": idx,
        "depth": idx + 1,
        "sibling": np.zeros(g, dtype=np.int64),
    }
    for c in (
        "token",
        "p_draft",
        "q_draft",
        "p_tilde",
        "j_star",
        "spent",
        "accept_prob",
        "u",
        "p_top1",
        "p_entropy",
        "q_top1",
    ) + (("proposed_step",) if "proposed_step" in d else ()):
        rows[c] = (
            d[c].cpu().numpy().astype(np.int64)
            if c in ("token", "j_star", "proposed_step")
            else d[c].detach().double().cpu().numpy()
        )
    return rows


def _tree_rows(d: dict) -> dict:
    """Columns of one tree step, given complete per-node arrays (see ``lantern.tree_decoding``)."""
    rows = {c: np.asarray(v) for c, v in d.items() if c in DRAFT_COLUMNS}
    for c in _TREE_INT:
        rows[c] = rows[c].astype(np.int64)
    for c in ("accepted", "reached", "committed"):
        rows[c] = rows[c].astype(bool)
    for c in ("p_draft", "q_draft", "p_tilde", "spent", "accept_prob", "u", "p_top1", "p_entropy", "q_top1"):
        rows[c] = rows[c].astype(np.float64)
    return rows


def _empty(columns: Sequence[str]) -> dict:
    return {c: np.array([]) for c in columns}


@dataclass
class Decoded:
    """The output of a decode (:func:`lantern.decoding.decode` and the per-image functions).

    tokens: (B, N) int64 code indices on the CPU, raster order. pixels: (B, C, H, W) float32 in
    [0, 1] when decoded images were asked for, else None. steps / drafts / images: dicts of
    equal-length numpy columns (module docstring); :meth:`frames` turns them into DataFrames.
    method: ``"ar"``, ``"sd"``, ``"lantern"``, ``"lantern-jsd"`` or ``"lantern++"``;
    gamma: draft length γ (0 for AR); settings: the rule and sampling settings (JSON-able).
    """

    tokens: torch.Tensor
    steps: dict
    drafts: dict
    images: dict
    method: str = "ar"
    gamma: int = 0
    settings: dict = field(default_factory=dict)
    pixels: Optional[torch.Tensor] = None

    def frames(self):
        """(steps, drafts, images) as pandas DataFrames."""
        import pandas as pd

        return pd.DataFrame(self.steps), pd.DataFrame(self.drafts), pd.DataFrame(self.images)

    def summary(self) -> dict:
        """:func:`summarize_decode` of this decode plus method, γ and settings."""
        steps, drafts, images = self.frames()
        return {
            "method": self.method,
            "gamma": self.gamma,
            **self.settings,
            **summarize_decode(steps, drafts, images, self.gamma),
        }

    def split(self) -> list[Decoded]:
        """One Decoded per image (row of ``tokens``, in order), with that image's rows of every table."""
        out = []
        for j, image in enumerate(np.asarray(self.images["image"])):
            pick = lambda tab, image=image: {
                c: np.asarray(v)[np.asarray(tab["image"]) == image] for c, v in tab.items()
            }  # noqa: E731
            out.append(
                Decoded(
                    self.tokens[j : j + 1],
                    pick(self.steps),
                    pick(self.drafts),
                    {c: np.asarray(v)[j : j + 1] for c, v in self.images.items()},
                    self.method,
                    self.gamma,
                    dict(self.settings),
                    None if self.pixels is None else self.pixels[j : j + 1],
                )
            )
        return out

    @staticmethod
    def concat(parts: Sequence[Decoded]) -> Decoded:
        """Join per-image decodes (same method) in order; image indices are kept as recorded."""
        if not parts:
            raise ValueError("nothing to concatenate")
        cat = lambda key: {c: np.concatenate([getattr(p, key)[c] for p in parts]) for c in getattr(parts[0], key)}
        pixels = None if any(p.pixels is None for p in parts) else torch.cat([p.pixels for p in parts])
        return Decoded(
            torch.cat([p.tokens for p in parts]),
            cat("steps"),
            cat("drafts"),
            cat("images"),
            parts[0].method,
            parts[0].gamma,
            dict(parts[0].settings),
            pixels,
        )


def accept_histogram(steps, gamma: int) -> list[int]:
    """Number of verification steps that accepted exactly ``j`` draft tokens, ``j = 0..γ``.

    steps: a steps DataFrame (or dict with an ``accepted`` column). Sums to the number of steps.
    """
    acc = np.asarray(steps["accepted"], dtype=np.int64)
    return np.bincount(acc, minlength=gamma + 1).tolist() if acc.size else [0] * (gamma + 1)


def summarize_decode(steps, drafts, images, gamma: int) -> dict:
    """Scalar statistics of a decode (definitions in the module docstring).

    Returns a JSON-able dict: images, tokens, target_forwards, steps, tokens_per_forward,
    tau (mean accepted length, bonus counted, EAGLE τ), mean_accepted_drafts (no bonus),
    acceptance_rate (committed / reached draft tokens; NaN without drafts), accept_histogram,
    out_of_support (count) and out_of_support_rate (of committed drafts), mean j* and spent over
    committed drafts, and seconds per image (total, target, drafter, acceptance; wall-clock).
    """
    n_img = len(images["image"])
    tokens = int(np.sum(images["tokens"])) if n_img else 0
    forwards = int(np.sum(images["target_forwards"])) if n_img else 0
    acc = np.asarray(steps["accepted"], dtype=np.int64)
    n_steps = int(acc.size)
    reached = np.asarray(drafts["reached"], dtype=bool) if len(drafts["reached"]) else np.zeros(0, bool)
    committed = np.asarray(drafts["committed"], dtype=bool) if len(drafts["committed"]) else np.zeros(0, bool)
    nan = float("nan")
    per = lambda col: float(np.sum(images[col]) / n_img) if n_img else nan
    out = {
        "images": n_img,
        "tokens": tokens,
        "target_forwards": forwards,
        "steps": n_steps,
        "tokens_per_forward": tokens / forwards if forwards else nan,
        "tau": float(np.mean(acc + 1)) if n_steps else nan,
        "mean_accepted_drafts": float(np.mean(acc)) if n_steps else nan,
        "acceptance_rate": float(committed.sum() / reached.sum()) if reached.sum() else nan,
        "accept_histogram": accept_histogram(steps, gamma),
        "out_of_support": int(np.sum(np.asarray(drafts["out_of_support"], dtype=bool))) if len(drafts["token"]) else 0,
        "out_of_support_rate": (
            float(np.sum(np.asarray(drafts["out_of_support"], dtype=bool)) / committed.sum())
            if committed.sum()
            else nan
        ),
        "mean_j_star": float(np.mean(np.asarray(drafts["j_star"])[committed])) if committed.any() else nan,
        "mean_spent": float(np.mean(np.asarray(drafts["spent"])[committed])) if committed.any() else nan,
        "seconds_per_image": per("total_s"),
        "target_s_per_image": per("target_s"),
        "drafter_s_per_image": per("drafter_s"),
        "acceptance_s_per_image": per("acceptance_s"),
    }
    return out


SUMMARY_SHOWN = (
    ("method", "method"),
    ("images", "images"),
    ("tokens", "tokens"),
    ("target_forwards", "fwd"),
    ("acceptance_rate", "α"),
    ("tau", "τ (+bonus)"),
    ("mean_accepted_drafts", "accepted/step"),
    ("tokens_per_forward", "tokens/fwd"),
    ("seconds_per_image", "s/img"),
    ("target_s_per_image", "target s"),
    ("drafter_s_per_image", "drafter s"),
    ("acceptance_s_per_image", "accept s"),
)


def _shown_value(summary: dict, key: str):
    """One cell of :func:`summary_table`: ``n/a`` for the acceptance rate of an AR run."""
    value = summary.get(key, "")
    if key == "acceptance_rate" and summary.get("method") == "ar":
        return "n/a"
    return value


def summary_table(summaries: Sequence[dict], extra: Sequence[str] = ()) -> str:
    """Summaries (dicts from :func:`summarize_decode` / :meth:`Decoded.summary`) as an aligned text table.
    An AR row shows ``n/a`` for the acceptance rate α (AR drafts nothing; its summary holds NaN)."""
    import pandas as pd

    shown = [(k, k) for k in extra] + [kv for kv in SUMMARY_SHOWN]
    rows = [{label: _shown_value(s, key) for key, label in shown} for s in summaries]
    df = pd.DataFrame(rows)
    return df.to_string(index=False, float_format=lambda x: f"{x:.4g}")
