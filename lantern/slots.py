"""The slots of batched decoding: which image each holds, its random stream, the shared state.

A batched decoder keeps ``B`` *slots* (two model rows each with guidance: ``[conditional slots,
unconditional slots]``, the layout of :class:`ambiguity.models.base.Prompt`); each holds one
image at its own position. Continuous batching (:class:`Slots` and its free functions): the
first ``B`` conditions are admitted into the slots (:func:`admit`, prefilled by
:func:`prefill_admitted`); a finished image leaves its slot (:func:`release`) and the next
condition is admitted into it, so one slow image never holds the others; once no condition is
left and at most half the slots are busy, the empty slots are dropped from the caches
(:func:`drain`: one copy), so a draining batch does not compute them. :func:`verify_chains` is
the target forward over every slot's last token and chain (drafts or a Jacobi window). Both batched decoders use
it: AR / chains / draft trees (:func:`lantern.batched.batched_decode`) and the Jacobi methods
(:func:`lantern.jacobi.batched_jacobi_decode`).

Chains and draft trees also share: :class:`Streams` (image ``i`` draws from its own generator
:func:`ambiguity.seeding.image_generator` ``(seed, i)``, whatever its slot),
:class:`BatchState` (models, caches, token and feature buffers) and :func:`pending_features`
(the drafter over every slot's pending positions).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from ambiguity.errors import UsageError
from ambiguity.models.base import TokenModel
from ambiguity.sampling import SamplingConfig, expand_rows, invert, row_uniforms
from ambiguity.seeding import image_generator
from lantern.acceptance import AcceptanceRule
from lantern.drafter.model import DraftModel
from lantern.steps import Timer, target_distribution
from lantern.tree_spec import TreeSpec

__all__ = [
    "BatchState",
    "Slots",
    "Streams",
    "admit",
    "busy",
    "check_batching",
    "drain",
    "image_indices",
    "new_slots",
    "pending_features",
    "prefill_admitted",
    "release",
    "slot_rows",
    "verify_chains",
]


def check_batching(model: TokenModel, drafter: Optional[DraftModel]) -> None:
    """Raise UsageError (one line) when ``model`` or ``drafter`` cannot decode with ``--batch-size`` > 1:
    an adapter without per-image cache positions, or a drafter without :meth:`forward_slots`. What a
    decode configuration cannot batch is refused earlier, before any model
    loads, by :func:`lantern.decoding.check_batch_config`."""
    if not getattr(model, "can_batch_decode", False):
        why = getattr(model, "batch_limit", TokenModel.batch_limit)
        raise UsageError(f"{model.name} cannot decode several images per forward ({why}); use --batch-size 1")
    if drafter is not None and not hasattr(drafter, "forward_slots"):
        raise UsageError(
            f"the drafter {type(drafter).__name__} cannot run several images per forward; use --batch-size 1"
        )


# --------------------------------------------------------------------------- the slot scheduler
@dataclass
class Slots:
    """Which condition each slot of a batched decode holds (continuous batching).

    image_of: (B,) int64 numpy, the index j (into the decode's conditions) of the image in each
    slot, -1 for an empty slot; queue: the conditions not yet admitted, in order; waiting: how
    many; guided: two model rows per slot; bar: the progress bar (one tick per finished image).
    """

    image_of: np.ndarray
    queue: Iterator[int]
    waiting: int
    guided: bool
    bar: object

    @property
    def B(self) -> int:
        """The number of slots (fewer once a draining batch dropped its empty ones)."""
        return len(self.image_of)


def new_slots(conditions: int, batch_size: int, guided: bool, desc: str, progress: bool) -> Slots:
    """``min(batch_size, conditions)`` (at least one) empty slots for ``conditions`` images."""
    B = max(1, min(int(batch_size), conditions))
    bar = tqdm(total=conditions, desc=desc, disable=not progress, unit="img")
    return Slots(np.full(B, -1), iter(range(conditions)), conditions, guided, bar)


def image_indices(conditions: int, first_index: int, indices: Optional[Sequence[int]]) -> np.ndarray:
    """The image index (its seed stream) of each condition: ``first_index + j``, or ``indices[j]``."""
    if indices is None:
        return np.arange(first_index, first_index + conditions)
    return np.asarray(indices, dtype=np.int64)


def slot_rows(sl: Slots, slots: torch.Tensor) -> torch.Tensor:
    """The model rows of ``slots`` (k,) int64: the slots, then (guidance) their unconditional rows."""
    return torch.cat([slots, slots + sl.B]) if sl.guided else slots


def busy(sl: Slots) -> np.ndarray:
    """The slots that hold an image (int64 numpy, ascending)."""
    return np.flatnonzero(sl.image_of >= 0)


def admit(sl: Slots, free: Sequence[int]) -> list[tuple[int, int]]:
    """Give the free slots, in order, the next waiting conditions; returns the (slot, condition j)
    pairs admitted (fewer than ``free`` once the queue runs out)."""
    take = [(s, j) for s, j in zip(free, sl.queue)]
    sl.waiting -= len(take)
    for s, j in take:
        sl.image_of[s] = j
    return take


def prefill_admitted(model: TokenModel, cache, sl: Slots, take, conditions: Sequence, timer: Timer):
    """Prefill the admitted conditions' prompts into their slots' cache rows (timed as "target").

    take: the (slot, j) pairs of :func:`admit`. Returns the prefill's
    :class:`~ambiguity.models.base.Step` (rows ``[conditional, unconditional]`` of the admitted
    images), their slots (k,) and their model rows, int64 on the device."""
    slots = torch.tensor([s for s, _ in take], device=model.device)
    rows = slot_rows(sl, slots)
    prompt = model.make_prompt([conditions[j] for _, j in take], guided=sl.guided)
    with timer("target"):
        first = model.prefill_slots(cache, rows, prompt)
    return first, slots, rows


def release(sl: Slots, finished: Sequence[int]) -> None:
    """The images of ``finished`` slots are done: empty the slots (admit the next ones with :func:`admit`)."""
    sl.image_of[np.asarray(finished, dtype=np.int64)] = -1
    sl.bar.update(len(finished))


def drain(sl: Slots, caches: Sequence[tuple[object, object]]) -> Optional[tuple[np.ndarray, torch.Tensor]]:
    """A draining batch drops its empty slots: when no condition waits and at most half the slots
    are busy, every (owner, cache) of ``caches`` keeps only the busy slots' rows
    (``owner.select_slots``: one copy; the target's cache, the drafter's) and the slots are
    renumbered 0.. in order. Returns the kept slots' old numbers (int64 numpy) and their old model
    rows (int64 on the owners' device), for the caller to compact its own per-slot state the same
    way, or None when nothing was dropped."""
    live = busy(sl)
    if sl.waiting or not 0 < len(live) <= sl.B // 2:
        return None
    rows = slot_rows(sl, torch.as_tensor(live, device=caches[0][0].device))
    for owner, cache in caches:
        owner.select_slots(cache, rows)
    sl.image_of = sl.image_of[live]
    return live, rows


def verify_chains(model: TokenModel, cache, tokens: torch.Tensor, n, N: int, guided: bool):
    """One target forward over every slot's chain: ``tokens`` (B, T) int64 on the device, row b
    ``[x_{n_b-1}, d_{n_b} .. d_{n_b+T-2}]`` (the last committed token and the drafts or Jacobi
    window, padded to the longest), at cache slots and image positions ``n_b - 1 .. n_b + T - 2``
    (positions clamped to ``N - 1``: padding past the image's end), each token seeing its image's
    committed slots ``0..n_b-2`` and the chain's tokens up to itself; the padding and the slots past
    an image's length are never seen by a real token. n: (B,) int64 host array of committed tokens
    per slot. Returns the :class:`~ambiguity.models.base.Step` (R, T, .)."""
    T = tokens.shape[1]
    ar = torch.arange(int(n.max()) - 1 + T, device=tokens.device)
    at = torch.as_tensor(n - 1, device=tokens.device)[:, None] + ar[:T]
    visible = ar[None, None, :] <= at[:, :, None]
    return model.extend_slots(
        cache,
        expand_rows(tokens, guided),
        expand_rows(at, guided),
        expand_rows(at.clamp(max=N - 1), guided),
        expand_rows(visible, guided),
    )


# --------------------------------------------------------------------------- what chains and trees share
class Streams:
    """Each slot's source of random numbers: its image's generator (empty slots: an idle one), or,
    for exact enumeration in tests, a :class:`lantern.trees.Draws` given for that image."""

    def __init__(self, B: int, device, draws: Optional[dict] = None):
        self.device, self.draws = device, dict(draws or {})
        self.idle = torch.Generator(device=device)  # empty slots draw from it; no image's stream is touched
        self.gens: list = [self.idle] * B
        self.scripted: list = [None] * B

    def take(self, slot: int, seed: int, image: int) -> None:
        self.gens[slot] = image_generator(seed, image, self.device)
        self.scripted[slot] = self.draws.get(image)

    def keep(self, slots) -> None:
        """Only these slots remain, renumbered 0.. in this order (a compacted batch)."""
        self.gens = [self.gens[s] for s in slots]
        self.scripted = [self.scripted[s] for s in slots]

    def block(self, slot: int, k: int) -> torch.Tensor:
        """The next k float64 uniforms (k,) of the slot's stream: the numbers k one-at-a-time
        draws of :class:`lantern.trees.GeneratorDraws` give (a CPU generator draws the same
        numbers k at once; other devices draw them one by one)."""
        g = self.gens[slot]
        if torch.device(self.device).type == "cpu" or k == 0:
            return torch.rand(k, generator=g, device=self.device, dtype=torch.float64)
        return torch.stack([torch.rand((), generator=g, device=self.device, dtype=torch.float64) for _ in range(k)])

    def each(self, mask) -> torch.Tensor:
        """One float64 uniform (B,) from the stream of every slot where ``mask`` (B,) bool (host)
        says so (as one :class:`lantern.trees.GeneratorDraws` draw); 0.5 for the other slots and
        for scripted ones (their Draws decide)."""
        half = torch.full((), 0.5, dtype=torch.float64, device=self.device)
        return torch.stack(
            [
                torch.rand((), generator=g, device=self.device, dtype=torch.float64) if on and s is None else half
                for g, on, s in zip(self.gens, mask, self.scripted)
            ]
        )

    def free(self, slot: int) -> None:
        self.gens[slot], self.scripted[slot] = self.idle, None

    def categorical(self, probs: torch.Tensor, slots: Sequence[int], draw=None) -> torch.Tensor:
        """One token per row of probs (k, V) for ``slots`` (k,): inverse CDF with one float64 uniform
        of the slot's stream where ``draw`` (k,) bool says so (default all), the argmax elsewhere."""
        draw = np.ones(len(slots), dtype=bool) if draw is None else np.asarray(draw, dtype=bool)
        u = row_uniforms([self.gens[s] for s in slots], draw.astype(int), torch.float64, self.device)
        out = torch.where(
            torch.as_tensor(draw, device=probs.device),
            invert(probs, u[:, 0] if u.shape[1] else u.new_zeros(len(slots))),
            probs.argmax(-1),
        )
        for r, s in enumerate(slots):
            if self.scripted[s] is not None and draw[r]:
                out[r] = self.scripted[s].categorical(probs[r])
        return out

    def uniforms(self, counts, dtype, accept_prob: Optional[torch.Tensor]) -> torch.Tensor:
        """Acceptance uniforms (B, max counts): row b's first counts[b] from its stream. A scripted
        row walks its coins ``accept_prob`` (B, γ) until the first rejection (u = 0 accepts any
        draft of positive probability, u just below 1 rejects any draft accepted with probability < 1)."""
        u = row_uniforms(self.gens, counts, dtype, self.device)
        below_one = float(np.nextafter(1.0, 0.0))
        for b, d in enumerate(self.scripted):
            if d is not None:
                u[b] = below_one
                for j in range(int(counts[b])):
                    ok = d.coin(float(accept_prob[b, j]))
                    u[b, j] = 0.0 if ok else below_one
                    if not ok:
                        break
        return u


@dataclass
class BatchState:
    """The state a batched decode's step functions share: models, caches, buffers, configuration.

    model: the target model; drafter: None for AR decoding; cache: the target's slot cache
    (:meth:`~ambiguity.models.base.TokenModel.new_slots_cache`); dcache: the drafter's (None
    without a drafter); tokens (B, W) int64 on the device: ``tokens[b, i] = x_i`` of slot b's
    image (committed for ``i < n_b``); feats (R, W, H) in the model's dtype: ``feats[:, i] =
    h_{i-1}`` (None until the first prefill); rule: the acceptance rule (None for AR decoding);
    table: the (V, K) int64 neighbour table (None when the rule uses none); spec: the draft-tree
    shape (None for chains and AR decoding); N: image tokens per image. Rows ``R = B (1 + guided)``
    are ``[conditional slots, unconditional slots]``. The per-slot positions ``n`` (committed
    tokens) and ``d`` (drafter positions), (B,) int64 numpy arrays, are passed alongside.
    """

    model: TokenModel
    drafter: Optional[DraftModel]
    cache: object
    dcache: object
    tokens: torch.Tensor
    feats: Optional[torch.Tensor]
    sampling: SamplingConfig
    rule: Optional[AcceptanceRule]
    table: Optional[torch.Tensor]
    spec: Optional[TreeSpec]
    N: int
    timer: Timer
    streams: Streams

    @property
    def B(self) -> int:
        return self.tokens.shape[0]

    @property
    def H(self) -> int:
        return self.feats.shape[-1]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @property
    def guided(self) -> bool:
        return self.sampling.guided

    @property
    def convention(self) -> str:
        return self.rule.convention if self.rule is not None else "exact"

    def on_rows(self, x) -> torch.Tensor:
        """A per-slot host array (B, ...) as a tensor on the device, one row per model row (R, ...)."""
        return expand_rows(torch.as_tensor(x, device=self.device), self.guided)

    def target(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits (R, ..., V) -> the sampling distribution (B, ..., V) (guidance, temperature, top-k/top-p)."""
        return target_distribution(logits, self.sampling, self.guided, self.convention)


def pending_features(st: BatchState, n, d, drafting) -> torch.Tensor:
    """The drafter over every drafting slot's pending positions ``d_b..n_b-1`` with true target
    features (EAGLE's re-run on accepted tokens; padded to the longest; a slot that does not draft
    runs one throw-away position at ``d_b``). Returns (rows, 1, H): each row's last pending output,
    the feature that drafts ``x̂_{n_b}`` (the root of a draft tree)."""
    dev, H, guided = st.device, st.H, st.guided
    pend = np.where(drafting, n - d, 1)
    Tp = int(pend.max())
    d_t = torch.as_tensor(d, device=dev)
    ar = torch.arange(Tp + int(d.max()) + 1, device=dev)
    slots = d_t[:, None] + ar[:Tp]
    pos = slots.clamp(max=st.N - 1)
    toks = st.tokens.gather(1, pos)
    pos_r = expand_rows(pos, guided)
    fin = st.feats.gather(1, pos_r[..., None].expand(-1, -1, H))
    S = int(d.max()) + Tp
    visible = ar[None, None, :S] <= slots[:, :, None]
    f = st.drafter.forward_slots(
        st.model,
        expand_rows(toks, guided),
        fin,
        st.dcache,
        expand_rows(slots, guided),
        pos_r,
        expand_rows(visible, guided),
    )
    last = expand_rows(torch.as_tensor(pend - 1, device=dev), guided)
    return f.gather(1, last[:, None, None].expand(-1, 1, H))
