"""The engine's slots: which image each holds, its random stream, the batch state, the verify forward.

The engine (:func:`lantern.engine.loop.run`) keeps ``B`` *slots* (two model rows each with
guidance: ``[conditional slots, unconditional slots]``, the layout of
:class:`ambiguity.models.base.Prompt`); each holds one image at its own position. Continuous
batching (:class:`Slots` and its free functions): the first ``B`` conditions are admitted into the
slots (:func:`admit`, prefilled by :func:`prefill_admitted`); a finished image leaves its slot
(:func:`release`) and the next condition is admitted into it, so one slow image never holds the
others; once no condition is left and at most half the slots are busy, the empty slots are dropped
from the caches (:func:`drain`: one copy), so a draining batch does not compute them.
:func:`verify_chains` is the target forward over every slot's last token and chain (drafts or a
Jacobi window). :class:`Streams` gives image ``i`` its own generator
:func:`ambiguity.seeding.image_generator` ``(seed, i)`` whatever its slot (or a scripted
:class:`Draws` for exact enumeration); :class:`BatchState` holds the models, caches, token and
feature buffers and the per-slot positions every method's round reads and writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from ambiguity.errors import UsageError
from ambiguity.models.base import TokenModel
from ambiguity.sampling import SamplingConfig, expand_rows, invert, row_uniforms
from ambiguity.seeding import image_generator
from lantern.engine.steps import Timer, target_distribution

if TYPE_CHECKING:  # a method's own fields (the engine does not read them)
    from lantern.drafter.model import DraftModel
    from lantern.methods.tree.spec import TreeSpec
    from lantern.rules.acceptance import AcceptanceRule

__all__ = [
    "BatchState",
    "Draws",
    "GeneratorDraws",
    "Slots",
    "Streams",
    "admit",
    "busy",
    "check_batching",
    "drain",
    "image_indices",
    "new_slots",
    "prefill_admitted",
    "release",
    "slot_rows",
    "verify_chains",
]


def check_batching(model: TokenModel, drafter: Optional[DraftModel]) -> None:
    """Raise UsageError (one line) when ``model`` or ``drafter`` cannot decode on the slot engine:
    an adapter without per-image cache positions and 2D attention masks (its ``batch_limit`` says
    why), or a drafter without :meth:`forward_slots`."""
    if not getattr(model, "can_batch_decode", False):
        why = getattr(model, "batch_limit", TokenModel.batch_limit)
        raise UsageError(f"{model.name} cannot decode on the slot engine: {why}")
    if drafter is not None and not hasattr(drafter, "forward_slots"):
        raise UsageError(
            f"the drafter {type(drafter).__name__} cannot run on the slot engine (it has no forward_slots); "
            "load a drafter with lantern.drafter.model.load_drafter"
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
    T, rows = tokens.shape[1], expand_rows(tokens, guided)
    if T == 1 and (n == n[0]).all():  # one token per row, every row at one position (< N): all slots seen
        at = torch.full(rows.shape, int(n[0]) - 1, dtype=torch.long, device=tokens.device)
        return model.extend_slots(cache, rows, at, at, int(n[0]))
    ar = torch.arange(int(n.max()) - 1 + T, device=tokens.device)
    at = torch.as_tensor(n - 1, device=tokens.device)[:, None] + ar[:T]
    visible = ar[None, None, :] <= at[:, :, None]
    return model.extend_slots(
        cache,
        rows,
        expand_rows(at, guided),
        expand_rows(at.clamp(max=N - 1), guided),
        expand_rows(visible, guided),
    )


# --------------------------------------------------------------------------- randomness
class Draws(Protocol):
    """Where a tree decoder's random choices come from (one source per image).

    ``coin(prob)`` -> True with probability ``prob`` (clamped to [0, 1]); ``categorical(probs)``
    -> a token drawn from ``probs`` (V,) (any positive scale; zero-mass tokens never drawn).
    """

    def coin(self, prob: float) -> bool: ...

    def categorical(self, probs: torch.Tensor) -> int: ...


class GeneratorDraws:
    """:class:`Draws` from a torch.Generator: a coin is one uniform ``u < prob``; a categorical
    draw inverts the CDF with one uniform (:func:`ambiguity.sampling.invert`). ``last_u`` is the
    uniform of the last coin (recorded with each verdict)."""

    def __init__(self, generator: Optional[torch.Generator], device: torch.device | str = "cpu"):
        self.generator, self.device, self.last_u = generator, torch.device(device), float("nan")

    def _uniform(self) -> torch.Tensor:
        return torch.rand((), generator=self.generator, device=self.device, dtype=torch.float64)

    def coin(self, prob: float) -> bool:
        self.last_u = float(self._uniform())
        return self.last_u < float(prob)

    def categorical(self, probs: torch.Tensor) -> int:
        return int(invert(probs, self._uniform()))


# --------------------------------------------------------------------------- what chains and trees share
class Streams:
    """Each slot's source of random numbers: its image's generator (empty slots: an idle one), or,
    for exact enumeration in tests, a :class:`lantern.engine.slots.Draws` given for that image."""

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
        draws of :class:`lantern.engine.slots.GeneratorDraws` give (a CPU generator draws the same
        numbers k at once; other devices draw them one by one)."""
        g = self.gens[slot]
        if torch.device(self.device).type == "cpu" or k == 0:
            return torch.rand(k, generator=g, device=self.device, dtype=torch.float64)
        return torch.stack([torch.rand((), generator=g, device=self.device, dtype=torch.float64) for _ in range(k)])

    def each(self, mask) -> torch.Tensor:
        """One float64 uniform (B,) from the stream of every slot where ``mask`` (B,) bool (host)
        says so (as one :class:`lantern.engine.slots.GeneratorDraws` draw); 0.5 for the other slots and
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
        gens = [self.gens[s] for s in slots]
        if draw is None or bool(np.all(draw)):  # every row draws (the usual case): no argmax, no select
            u = [torch.rand(1, generator=g, device=self.device, dtype=torch.float64) for g in gens]
            u = u[0] if len(u) == 1 else torch.cat(u)
            out = invert(probs, u)
        else:
            draw = np.asarray(draw, dtype=bool)
            u = row_uniforms(gens, draw.astype(int), torch.float64, self.device)
            out = torch.where(
                torch.as_tensor(draw, device=probs.device),
                invert(probs, u[:, 0] if u.shape[1] else u.new_zeros(len(slots))),
                probs.argmax(-1),
            )
        if self.draws:  # scripted images (exact enumeration) draw through their Draws
            for r, s in enumerate(slots):
                if self.scripted[s] is not None and (draw is None or draw[r]):
                    out[r] = self.scripted[s].categorical(probs[r])
        return out

    def uniforms(self, counts, dtype, accept_prob: Optional[torch.Tensor]) -> torch.Tensor:
        """Acceptance uniforms (B, max counts): row b's first counts[b] from its stream. A scripted
        row walks its coins ``accept_prob`` (B, γ) until the first rejection (u = 0 accepts any
        draft of positive probability, u just below 1 rejects any draft accepted with probability < 1)."""
        width = int(max(counts, default=0))
        if all(int(c) == width for c in counts):  # every row draws a full chain (the usual case): no padding
            u = torch.stack([torch.rand(width, generator=g, device=self.device, dtype=dtype) for g in self.gens])
        else:
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
    """The engine's state over B slots, shared by the engine loop and the methods' rounds.

    model: the target; cache: its slot cache (:meth:`~ambiguity.models.base.TokenModel.new_slots_cache`);
    tokens (B, W) int64 on the device: ``tokens[b, i] = x_i`` of slot b's image (committed for
    ``i < n_b``); feats (R, W, H) in the model's dtype: ``feats[:, i] = h_{i-1}`` (None until the
    first prefill); N: image tokens per image; convention: the method's
    (:func:`lantern.engine.steps.target_distribution`). Per slot, (B,) int64 numpy arrays: ``n``
    committed tokens, ``d`` drafter positions (methods with a drafter), ``step`` the image's step
    count, ``image`` its image index (-1: empty). Rows ``R = B (1 + guided)`` are ``[conditional
    slots, unconditional slots]``. A method keeps its own state in the remaining fields: drafter
    and dcache (its cache, also listed in ``owned_caches`` so a draining batch compacts it), rule,
    table (the (V, K) int64 neighbour table), spec (a draft tree's shape), p_stats ((B, 2) float64
    numpy: each slot's top-1 probability and entropy of the target distribution its last token was
    drawn from, the input of a chain's draft-length policy, :mod:`lantern.engine.policy`), budget
    (``(score (B, C), most, rows) -> candidates`` a dynamic draft tree verifies this round:
    :meth:`lantern.engine.policy.NodePolicy.budget`; None: the tree's ``total_tokens - 1``).
    """

    model: TokenModel
    cache: object
    tokens: torch.Tensor
    feats: Optional[torch.Tensor]
    sampling: SamplingConfig
    N: int
    timer: Timer
    streams: Streams
    convention: str = "exact"
    drafter: Optional[DraftModel] = None
    dcache: object = None
    rule: Optional[AcceptanceRule] = None
    table: Optional[torch.Tensor] = None
    spec: Optional[TreeSpec] = None
    p_stats: Optional[np.ndarray] = None
    budget: Optional[Callable] = None
    n: np.ndarray = field(init=False)
    d: np.ndarray = field(init=False)
    step: np.ndarray = field(init=False)
    image: np.ndarray = field(init=False)

    def __post_init__(self):
        B = self.tokens.shape[0]
        self.n, self.d = np.ones(B, dtype=np.int64), np.zeros(B, dtype=np.int64)
        self.step, self.image = np.zeros(B, dtype=np.int64), np.full(B, -1, dtype=np.int64)

    @property
    def B(self) -> int:
        return self.tokens.shape[0]

    @property
    def rows(self) -> int:
        return self.B * (1 + self.guided)

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
    def owned_caches(self) -> list[tuple[object, object]]:
        """(owner, cache) pairs besides the target's that a draining batch compacts (the drafter's)."""
        return [(self.drafter, self.dcache)] if self.dcache is not None else []

    def keep(self, live: np.ndarray, rows: torch.Tensor) -> None:
        """Keep only the slots ``live`` (old numbers, renumbered 0..) and their model ``rows``."""
        self.tokens = self.tokens[torch.as_tensor(live, device=self.device)]
        if self.feats is not None:
            self.feats = self.feats[rows]
        self.n, self.d, self.step, self.image = self.n[live], self.d[live], self.step[live], self.image[live]
        if self.p_stats is not None:
            self.p_stats = self.p_stats[live]
        self.streams.keep(live)

    def target(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits (R, ..., V) -> the sampling distribution (B, ..., V) (guidance, temperature, top-k/top-p)."""
        return target_distribution(logits, self.sampling, self.guided, self.convention)
