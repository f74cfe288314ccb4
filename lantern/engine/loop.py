"""The decoding engine: one loop over slots for every method and every batch size.

:func:`run` keeps ``B`` *slots* (:mod:`lantern.engine.slots`); each holds one image at its own
position. A step asks the method for one :meth:`~lantern.methods.base.Method.round` over all
slots (draft, one target forward, accept, commit the accepted tokens; ragged: image ``b`` at
``n_b`` committed tokens keeps ``a_b + 1``), then the engine does the bookkeeping every method
shares: positions, finished images, records, per-image time, admission. A finished image leaves
its slot and the next condition is prefilled into it (continuous batching), so one slow image
never holds the others; once no condition is left and at most half the slots are busy, the empty
slots are dropped from the caches (one copy). Batch 1 is ``B = 1``.

State per slot: the target's KV cache (:meth:`ambiguity.models.base.TokenModel.new_slots_cache`,
preallocated for ``N`` image positions plus the method's ``spare`` a row, written in place at
per-row slots) holds ``x_0..x_{n_b-2}``; ``tokens[b, i] = x_i`` (committed for ``i < n_b``);
``feats[:, i] = h_{i-1}`` (the target features a drafter reads). Positions are per row (the 2D
rotary position of each image's own grid cell) and an attention mask per row shows a token
exactly the committed slots of its own image and the verified tokens before it; slots past an
image's length are never seen and are overwritten later, so a rejection needs no cache copy.
Rows are ``[conditional slots, unconditional slots]`` with guidance.

Randomness: image ``i`` draws every random number from its own generator
:func:`ambiguity.seeding.image_generator` ``(seed, i)`` (:class:`lantern.engine.slots.Streams`),
the same numbers in the same order whatever the batch, slot or admission step: in float64 the
tokens of every image do not depend on the batch size (``tests/test_engine.py`` holds them to
the one-image reference loops of ``tests/reference/``); in float32 matrix products over several
rows round differently from one row, which now and then moves a CDF boundary past a uniform and
changes an image from that token on.

Timing: a step's seconds per section (target, drafter, acceptance, proximity; wall-clock) are
split equally among the images active in it, and a prefill's among the images it admitted;
``total_s`` of an image is its share of every step's wall time. Step rows carry ``batch_step``
and ``active`` (:mod:`lantern.engine.records`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch

from ambiguity.allocator import reuse_freed_blocks
from ambiguity.models.base import TokenModel
from ambiguity.sampling import SamplingConfig
from lantern.engine.method import Method
from lantern.engine.policy import timing_clock
from lantern.engine.records import Book, Decoded
from lantern.engine.slots import (
    BatchState,
    Slots,
    Streams,
    admit,
    busy,
    drain,
    new_slots,
    prefill_admitted,
    release,
)
from lantern.engine.steps import Timer, elapsed_since, target_distribution

__all__ = ["run", "engine_rounds"]


def run(
    model: TokenModel,
    method: Method,
    conditions: Sequence,
    sampling: SamplingConfig,
    index: np.ndarray,
    seed: int = 0,
    batch_size: int = 1,
    num_tokens: Optional[int] = None,
    progress: bool = False,
    draws: Optional[dict] = None,
) -> Decoded:
    """Decode one image per condition with up to ``batch_size`` images per forward (module docstring).

    method: a :class:`~lantern.methods.base.Method` (checked by :func:`lantern.engine.decode.decode`);
    index: (len(conditions),) int64, the image index (its random stream ``(seed, index[j])``) of
    each condition; draws: {image index: :class:`lantern.engine.slots.Draws`} for images whose
    coins and categorical draws come from that object instead of their generator (exact
    enumeration in the tests). Returns a :class:`~lantern.engine.records.Decoded` (tokens
    (images, N) int64 on the CPU, rows in condition order).
    """
    if torch.device(model.device).type == "cpu":
        reuse_freed_blocks()  # a step's (rows, window, V) tensors reuse heap blocks instead of fresh pages
    with torch.inference_mode():  # no autograd bookkeeping on the many small ops of a step
        out = _loop(model, method, list(conditions), sampling, index, seed, batch_size, num_tokens, progress, draws)
    out.tokens = out.tokens.clone()  # a normal tensor (an inference tensor refuses in-place writes later)
    return out


def _loop(model, method: Method, conds: list, sampling, index, seed: int, batch_size: int, num_tokens, progress, draws):
    """:func:`run`'s loop (under inference mode)."""
    N = int(num_tokens or model.num_tokens)
    sl = new_slots(len(conds), batch_size, sampling.guided, method.name, progress)
    st = _open_state(model, method, sl.B, sampling, N, draws)
    book = Book(conds, index, seed, N, model.device)
    _fill(st, method, sl, book, conds, range(sl.B), seed)
    live = busy(sl)
    while len(live):
        book.batch_step += 1
        t0, before = time.perf_counter(), st.timer.snapshot()
        st.step[live] += 1
        r = method.round(st, sl.image_of >= 0)
        seconds = elapsed_since(st.timer, before)
        book.record(st, sl.image_of, live, r, seconds, time.perf_counter() - t0)
        st.n[live] += r.accepted[live] + 1
        finished = live[st.n[live] >= N]
        if len(finished):  # the slots change only here
            _finish(st, method, sl, book, finished)
            _fill(st, method, sl, book, conds, finished, seed)
            _drain(st, method, sl)
            live = busy(sl)
    sl.bar.close()
    return book.decoded(method.name, method.depth)


def _open_state(model: TokenModel, method: Method, B: int, sampling: SamplingConfig, N: int, draws) -> BatchState:
    """The engine's state for ``B`` empty slots: the target's slot cache with the method's spare
    positions, the token buffer, the streams; then the method's own state (:meth:`Method.open`)."""
    dev = model.device
    st = BatchState(
        model=model,
        cache=model.new_slots_cache(B, sampling.guided, N, method.spare),
        tokens=torch.zeros(B, N + method.spare, dtype=torch.long, device=dev),
        feats=None,
        sampling=sampling,
        N=N,
        timer=Timer(dev),
        streams=Streams(B, dev, draws),
        convention=method.convention,
    )
    method.open(st)
    return st


def _fill(st: BatchState, method: Method, sl: Slots, book: Book, conds: list, free, seed: int) -> None:
    """Admit the next conditions into the ``free`` slots: prefill, then each image's first token
    (:meth:`Method.start`); an image of one token is complete at once and its slot takes the next."""
    while len(free):
        free = _admit(st, method, sl, book, conds, free, seed)


def _admit(st: BatchState, method: Method, sl: Slots, book: Book, conds: list, free, seed: int) -> np.ndarray:
    """One admission into the ``free`` slots; returns the slots whose images are already complete."""
    take = admit(sl, free)
    if not take:
        return np.zeros(0, dtype=np.int64)
    t0, before = time.perf_counter(), st.timer.snapshot()
    first, slots_t, rows = prefill_admitted(st.model, st.cache, sl, take, conds, st.timer)
    slots = [s for s, _ in take]
    for s, j in take:
        st.streams.take(s, seed, int(book.index[j]))
        st.image[s] = int(book.index[j])
    st.n[slots], st.d[slots], st.step[slots] = 1, 0, 0
    with st.timer("acceptance"):
        p0 = target_distribution(first.logits[:, -1], st.sampling, st.sampling.guided, st.convention)
        x0 = method.start(st, slots, p0)
    if st.feats is None:  # (R, W, H): feats[:, i] = h_{i-1}
        st.feats = first.hidden.new_zeros(st.rows, st.tokens.shape[1], first.hidden.shape[-1])
    st.tokens[slots_t, 0] = x0
    st.feats[rows, 0] = first.hidden[:, -1]
    book.admitted([j for _, j in take], elapsed_since(st.timer, before), time.perf_counter() - t0)
    done = np.asarray([s for s in slots if st.n[s] >= st.N], dtype=np.int64)
    _finish(st, method, sl, book, done)
    return done


def _finish(st: BatchState, method: Method, sl: Slots, book: Book, finished: np.ndarray) -> None:
    """The images of ``finished`` slots are complete: keep their tokens and free the slots."""
    if not len(finished):
        return
    book.finished(sl.image_of[finished], st.tokens[torch.as_tensor(finished, device=st.device), : st.N])
    method.release(st, finished)
    release(sl, finished)
    for s in finished:
        st.streams.free(int(s))
        st.image[s] = -1
    st.n[finished], st.d[finished] = 1, 0


def _drain(st: BatchState, method: Method, sl: Slots) -> None:
    """A draining batch drops its empty slots from every cache and per-slot buffer."""
    kept = drain(sl, [(st.model, st.cache)] + st.owned_caches)
    if kept is None:
        return
    live, rows = kept
    st.keep(live, rows)
    method.compact(st, live, rows)


def engine_rounds(st, images: int, ar, other) -> tuple[float, float]:
    """Seconds of one round of ``ar`` (a plain AR method) and of ``other`` (a method of a fixed
    draft length: a chain of 2, a Jacobi window of 4) over ``images`` images on the engine, timed
    as :func:`lantern.engine.policy.timing_clock`: decodes of up to 64 tokens an image, less a decode of the first token
    alone (the prefill), per round. The three decodes take turns, a warm-up and then three turns,
    and each keeps its least time, so a slower spell of a shared machine does not tilt one against
    the other. st: the engine's batch state (model, sampling, device)."""
    model, N = st.model, min(64, st.N)
    conds = model.default_conditions(images)
    clock, sync = timing_clock(st.device)
    jobs = {"prefill": (ar, 1), "ar": (ar, N), "other": (other, N)}
    best, rounds = dict.fromkeys(jobs, float("inf")), {}
    for turn in range(4):
        for key, (method, tokens) in jobs.items():
            sync()
            t0 = clock()
            out = run(model, method, conds, st.sampling, np.arange(images), batch_size=images, num_tokens=tokens)
            sync()
            if turn:  # the first turn warms up
                best[key] = min(best[key], clock() - t0)
            rounds[key] = int(np.max(out.steps["batch_step"], initial=0))
    return tuple(max(best[key] - best["prefill"], 1e-9) / rounds[key] for key in ("ar", "other"))
