"""Decode records: what :mod:`lantern.engine.decode` returns, as pandas-ready tables, and their summary.

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
  forward (batched decoding, :mod:`lantern.engine.loop`; one image at a time: ``batch_step = step``
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
  previous Jacobi iteration for SJD/GSD/SCD, -1 for an initialised window position,
  :mod:`lantern.methods.jacobi.method`).
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

from ambiguity.seeding import image_seed

__all__ = [
    "STEP_COLUMNS",
    "DRAFT_COLUMNS",
    "IMAGE_COLUMNS",
    "NEXT_KINDS",
    "Decoded",
    "SECTIONS",
    "CHAIN_VALUES",
    "chain_rows",
    "ChainDrafts",
    "CHAIN_COLUMNS",
    "tree_rows",
    "Book",
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
# a draft's verdict columns and the target / drafter summaries at its position, shared by the
# draft rows (DRAFT_COLUMNS) and a chain's host values (CHAIN_VALUES)
_VERDICT = ("p_draft", "q_draft", "p_tilde", "j_star", "spent", "accept_prob", "u", "accepted")
_SUMMARIES = ("p_top1", "p_entropy", "q_top1")
DRAFT_COLUMNS = (
    "image",
    "step",
    "draft_index",
    "position",
    "token",
    *_VERDICT,
    "reached",
    "committed",
    "out_of_support",
    *_SUMMARIES,
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
SECTIONS = ("target", "drafter", "acceptance", "proximity")  # timed sections of a step (seconds)
# the per-draft value columns a chain (or a Jacobi window) brings, (k, width) host arrays
CHAIN_VALUES = (*_VERDICT, *_SUMMARIES)


def chain_rows(host: dict, images, steps, n, g, a) -> Optional[dict]:
    """The draft rows of one engine step for chains of drafts (a drafter's chain, a Jacobi window).

    host: ``token`` and :data:`CHAIN_VALUES` as (k, width) arrays, optionally ``proposed_step``
    (k, width) (default: each row's own step); images / steps / n / g / a: (k,) int64 image
    index, step, first drafted position, drafts judged and accepted of each row. Row b has
    ``g[b]`` drafts; the accepted prefix ``a[b]`` is committed and the drafts up to the first
    rejection were reached. Returns the columns of :data:`DRAFT_COLUMNS` (None without drafts).
    """
    width = host["token"].shape[1]
    t = np.arange(width)[None, :]
    valid = t < np.asarray(g)[:, None]
    if not valid.any():
        return None
    rep = lambda x: np.broadcast_to(np.asarray(x)[:, None], valid.shape)[valid]  # per row -> per draft
    idx = np.broadcast_to(t, valid.shape)[valid]
    cols = {
        "image": rep(images),
        "step": rep(steps),
        "draft_index": idx,
        "token": host["token"][valid].astype(np.int64),
    }
    cols["position"] = rep(n) + idx
    for c in CHAIN_VALUES:
        cols[c] = np.asarray(host[c])[valid].astype(np.float64)
    cols["j_star"] = cols["j_star"].astype(np.int64)
    cols["accepted"] = cols["accepted"].astype(bool)
    acc = rep(a)
    cols["reached"], cols["committed"] = idx <= acc, idx < acc
    cols["out_of_support"] = cols["committed"] & (cols["p_draft"] == 0)
    cols["node"], cols["parent"], cols["depth"] = idx + 1, idx.copy(), idx + 1
    cols["sibling"] = np.zeros_like(idx)
    proposed = host.get("proposed_step")
    cols["proposed_step"] = cols["step"].copy() if proposed is None else np.asarray(proposed)[valid].astype(np.int64)
    return cols


@dataclass
class ChainDrafts:
    """A chain method's draft records of one engine step, kept as one tensor until the decode ends
    (:meth:`Book.decoded` turns the steps of one width into rows with one :func:`chain_rows` call).

    values: (B, len(CHAIN_COLUMNS), width) float tensor on the device, row b's ``token`` and
    :data:`CHAIN_VALUES` (ints stored exactly as floats); live: (k,) int64 numpy, the slots with an
    image; images / steps / n / g / a: (k,) int64 numpy of those slots, as :func:`chain_rows` takes them.
    """

    values: torch.Tensor
    live: np.ndarray
    images: np.ndarray
    steps: np.ndarray
    n: np.ndarray
    g: np.ndarray
    a: np.ndarray


CHAIN_COLUMNS = ("token", *CHAIN_VALUES)  # the rows of ChainDrafts.values


def _chain_blocks(blocks: Sequence[ChainDrafts]) -> list[dict]:
    """The draft rows of many :class:`ChainDrafts`: one :func:`chain_rows` per width, one host transfer each."""
    out = []
    for width in sorted({b.values.shape[-1] for b in blocks}):
        same = [b for b in blocks if b.values.shape[-1] == width]
        offsets = np.cumsum([0] + [b.values.shape[0] for b in same[:-1]])
        pick = np.concatenate([o + b.live for o, b in zip(offsets, same)])
        flat = torch.cat([b.values for b in same]).double().cpu().numpy()[pick]
        host = {c: flat[:, i] for i, c in enumerate(CHAIN_COLUMNS)}
        meta = [np.concatenate([getattr(b, f) for b in same]) for f in ("images", "steps", "n", "g", "a")]
        rows = chain_rows(host, *meta)
        if rows is not None:
            out.append(rows)
    return out


class Book:
    """The engine's record keeping for one decode: step and draft rows, per-image counts and
    seconds, and the finished images' tokens (the one accumulator every method writes through).

    Each step is kept as it came (its arrays, a chain's :class:`ChainDrafts`) and turned into the
    tables once, by :meth:`decoded`. conds: the conditions (images in this order); index: (images,)
    int64 image index of each; seed: the decode's seed (recorded per image); N: tokens per image;
    device: where the tokens are.
    """

    def __init__(self, conds: Sequence, index: np.ndarray, seed: int, N: int, device):
        self.conds, self.index, self.seed, self.N = list(conds), np.asarray(index, dtype=np.int64), seed, N
        k = len(self.conds)
        self.tokens = torch.zeros(k, N, dtype=torch.long, device=device)
        self.seconds = {s: np.zeros(k) for s in SECTIONS + ("total",)}
        self.counts = {c: np.zeros(k, dtype=np.int64) for c in ("steps", "drafted", "accepted")}
        self.steps: list[tuple] = []
        self.drafts: list = []  # draft-row dicts and ChainDrafts, in step order
        self.shares: list[tuple] = []  # (images, seconds, wall) of every forward, in order
        self.batch_step = 0

    def _add_shares(self) -> None:
        """Split every forward's seconds per section and its wall time equally among its images."""
        if not self.shares:
            return
        k = np.array([len(js) for js, _, _ in self.shares])
        js = np.concatenate([js for js, _, _ in self.shares]).astype(np.int64)
        for s in SECTIONS:
            np.add.at(self.seconds[s], js, np.repeat([sec.get(s, 0.0) for _, sec, _ in self.shares] / k, k))
        np.add.at(self.seconds["total"], js, np.repeat([w for _, _, w in self.shares] / k, k))
        self.shares = []

    def admitted(self, js: list[int], seconds: dict, wall: float) -> None:
        """The prefill that admitted images ``js`` (their share of its time)."""
        self.shares.append((np.asarray(js, dtype=np.int64), seconds, wall))

    def record(self, st, image_of: np.ndarray, live: np.ndarray, r, seconds: dict, wall: float) -> None:
        """One engine step: a step row per live slot (``r``: the :class:`~lantern.engine.method.Round`),
        the round's draft rows, the images' counts and their share of the step's time."""
        js = image_of[live]
        forwards = None if r.forwards is None else r.forwards[live]
        a, g, kind, nxt = r.accepted[live], r.drafted[live], r.kind[live], r.next_token[live]
        self.steps.append((js, st.step[live], st.n[live], g, a, kind, nxt, forwards, self.batch_step, seconds))
        if r.drafts is not None:
            self.drafts.append(r.drafts)
        self.shares.append((js, seconds, wall))

    def finished(self, js: np.ndarray, tokens: torch.Tensor) -> None:
        """Images ``js`` are complete with ``tokens`` (k, N)."""
        self.tokens[torch.as_tensor(js, device=self.tokens.device)] = tokens

    def _step_rows(self) -> dict:
        """The steps table's columns, in step order (before sorting), and the per-image counts."""
        self._add_shares()
        if not self.steps:
            return {c: np.array([]) for c in STEP_COLUMNS}
        steps, self.steps = self.steps, []
        k = np.array([len(s[0]) for s in steps])

        def column(i: int) -> np.ndarray:
            return np.concatenate([s[i] for s in steps])

        js, g, a = column(0), column(3), column(4)
        rows = dict(
            image=self.index[js],
            step=column(1),
            position=column(2),
            drafted=g,
            accepted=a,
            emitted=a + 1,
            next_kind=np.asarray(NEXT_KINDS, dtype=object)[column(5)],
            next_token=column(6),
            drafter_forwards=np.concatenate([s[3] if s[7] is None else s[7] for s in steps]),
            batch_step=np.repeat([s[8] for s in steps], k),
            active=np.repeat(k, k),
        )
        for sec in SECTIONS:
            rows[f"{sec}_s"] = np.repeat([s[9].get(sec, 0.0) for s in steps] / k, k)
        np.add.at(self.counts["steps"], js, 1)
        np.add.at(self.counts["drafted"], js, g)
        np.add.at(self.counts["accepted"], js, a)
        return {c: rows[c] for c in STEP_COLUMNS}

    def _draft_rows(self) -> list[dict]:
        """Every step's draft rows (a chain's :class:`ChainDrafts` turned into rows per width)."""
        for d in self.drafts:
            if not isinstance(d, ChainDrafts):
                d.setdefault("proposed_step", d["step"])  # a drafter proposes in its own step
        rows = [d for d in self.drafts if not isinstance(d, ChainDrafts)]
        blocks = _chain_blocks([d for d in self.drafts if isinstance(d, ChainDrafts)])
        for d in blocks:
            d["proposed_step"] = d["step"]
        return rows + blocks

    def decoded(self, method: str, depth: int) -> Decoded:
        """The decode's :class:`Decoded`: rows ordered by (image, step) and drafts by (image, step, node)."""
        steps = self._step_rows()
        order = np.lexsort((steps["step"], steps["image"])) if len(steps["image"]) else np.array([], dtype=np.int64)
        steps = {c: v[order] for c, v in steps.items()}
        drafts = _empty(DRAFT_COLUMNS)
        parts = self._draft_rows()
        if parts:
            drafts = {c: np.concatenate([d[c] for d in parts]) for c in DRAFT_COLUMNS}
            order = np.lexsort((drafts["node"], drafts["step"], drafts["image"]))  # a chain's node = draft_index + 1
            drafts = {c: v[order] for c, v in drafts.items()}
        images = {
            "image": self.index,
            "condition": np.array([str(c) for c in self.conds]),
            "seed": np.array([image_seed(self.seed, int(i)) for i in self.index]),
            "tokens": np.full(len(self.conds), self.N),
            "target_forwards": 1 + self.counts["steps"],
            **self.counts,
            **{f"{s}_s": self.seconds[s] for s in SECTIONS},
            "total_s": self.seconds["total"],
        }
        return Decoded(self.tokens.cpu(), steps, drafts, images, method, depth)


def tree_rows(d: dict) -> dict:
    """Columns of one tree step, given complete per-node arrays (see ``tests/reference/tree_decoding.py``)."""
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
    """The output of a decode (:func:`lantern.engine.decode.decode` and the per-image functions).

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
            }
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
