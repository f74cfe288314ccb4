"""Batched decoding: many images in flight, one target forward (and one drafter forward) per step for all.

:func:`batched_decode` keeps ``B`` *slots*; each holds one image at its own position. A step
drafts a chain for every slot, verifies all chains in one target forward, and lets each image
commit its own accepted prefix (ragged acceptance): image ``b`` at ``n_b`` committed tokens
drafts ``γ_b = min(γ, N - 1 - n_b)`` tokens and keeps ``a_b + 1`` of them. A finished image
leaves its slot and the next condition is prefilled into it (continuous batching), so one slow
image never holds the others; once no condition is left and at most half the slots are busy, the
empty slots are dropped from the caches (one copy), so a draining batch does not compute them.
AR decoding is the same step with γ = 0 and no drafter.

Draft trees (``tree=``: EAGLE-1 static or EAGLE-2 dynamic :class:`lantern.trees.TreeSpec`, both
conventions) take the same slots: each step every image drafts its own tree, all trees are
verified in one target forward (padded to the widest tree; column ``t`` of image ``b`` at
cache slot ``n_b - 1 + t``, image position ``n_b - 1 + depth_t``, seeing its image's committed
slots and its own ancestors), each image walks its tree and moves its accepted path's keys and
values behind its committed tokens (:meth:`~ambiguity.models.base.TokenModel.move_slots`, one
indexed copy for all images). See :func:`_tree_round`.

State per slot (the loop of :func:`lantern.chain.speculative_decode`, with ``n`` and ``d`` per
image): the target's KV cache (:meth:`ambiguity.models.base.TokenModel.new_slots_cache`,
preallocated for ``N + γ + 1`` image positions a row (trees: ``N`` + the node count) and written
in place at per-row slots) holds
``x_0..x_{n_b-2}``; the drafter's cache holds its positions ``0..d_b-1``; the target features
``h_{-1}..h_{n_b-2}`` sit in a (rows, N + γ + 1, H) buffer. Positions are per row (the 2D
rotary position of each image's own grid cell), and an attention mask per row shows a token
exactly the committed slots of its own image and the tokens before it in its chain; slots past an
image's length (rejected drafts, padding of shorter chains) are never seen and are overwritten
later, so a rejection needs no cache copy. Rows are ``[conditional slots, unconditional slots]``
with guidance (two rows per image, the layout of :class:`ambiguity.models.base.Prompt`).

Randomness is unchanged: image ``i`` draws from its own generator
:func:`ambiguity.seeding.image_generator` ``(seed, i)`` exactly the numbers one-image decoding
draws (the first token, ``γ_b`` draft tokens, ``γ_b`` uniforms, the next token), whatever the
batch, slot or admission step. In float64 the tokens of every image equal those of batch 1
(``tests/test_batched_decoding.py``); in float32 matrix products over several rows round
differently from one row, which now and then moves a CDF boundary past a uniform and changes an
image from that token on (see the README for the measured fraction of identical images). The
same holds for draft trees: in float64 tokens and every record (steps, per-node draft rows) equal
:func:`lantern.tree_decoding.tree_decode`'s; a tree draws its children (static trees, sampling),
coins and next token from the image's stream, one float64 uniform each in one-image decoding's
order (the numbers its :class:`lantern.trees.GeneratorDraws` draws).

Vectorised over images: drafting, verification, acceptance (:func:`lantern.chain.accept` with
per-row lengths), residual sampling and the commits are tensor operations over all slots; the
per-image Python work is one ``torch.rand`` call per image's generator (each image owns a stream)
and record keeping. One host transfer per step brings the accepted lengths and the step's
records to the CPU (plus none for the tokens: they stay on the device until the end).
Trees are vectorised the same way (:func:`_tree_round`): all images' trees are (B, T) tensors
(:class:`_Trees`) built level by level for all images at once (EAGLE-2 beams and reranking as
batched top-k and stable sorts; EAGLE-1 shapes as node tables), one drafter forward per level, one
target forward, a walk in which every image judges one child per round (tensor ops over images:
proximity sets, coins, residuals, the next token), the per-node records as tensors, and one
indexed copy for the commits. The per-image Python work left is drawing from each image's own
stream (one uniform per walking image per round; a static tree's children level by level) and
scripted Draws in tests. Host reads per tree step: which images still walk, once per walk round
(an image draws from its stream only while it walks), how many children each parent gets, once
per static-tree level when sampling, and one transfer of the step's outcomes and records.

Timing: a step's seconds per section (target, drafter, acceptance, proximity; wall-clock) are
split equally among the images active in it, and a prefill's among the images it admitted;
``total_s`` of an image is its share of every step's wall time. Step rows carry ``batch_step``
and ``active`` (:mod:`lantern.records`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from ambiguity.errors import UsageError
from ambiguity.models.base import TokenModel
from ambiguity.sampling import SamplingConfig, expand_rows, invert, row_uniforms
from ambiguity.seeding import image_generator, image_seed
from ambiguity.stats import entropy, top1_prob
from lantern.acceptance import AcceptanceRule, judge, judge_greedy, proximity, residual
from lantern.chain import accept
from lantern.drafter import DraftModel
from lantern.records import DRAFT_COLUMNS, NEXT_KINDS, STEP_COLUMNS, Decoded, _tree_rows
from lantern.steps import Timer, elapsed_since, target_distribution
from lantern.trees import TreeSpec

__all__ = ["batched_decode", "check_batching"]

_FLOAT_DRAFT = (
    "p_draft",
    "q_draft",
    "p_tilde",
    "j_star",
    "spent",
    "accept_prob",
    "u",
    "accepted",
    "p_top1",
    "p_entropy",
    "q_top1",
)
_SECTIONS = ("target", "drafter", "acceptance", "proximity")


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


class _Streams:
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


class _Records:
    """Step and draft rows of a batched decode, collected per step as numpy arrays."""

    def __init__(self):
        self.steps: list[dict] = []
        self.drafts: list[dict] = []

    def add(
        self,
        images,
        step_no,
        n,
        g,
        a,
        kind,
        token,
        seconds: dict,
        batch_step: int,
        draft_cols: Optional[dict],
        forwards=None,
    ):
        k = len(images)
        row = dict(
            image=images,
            step=step_no,
            position=n,
            drafted=g,
            accepted=a,
            emitted=a + 1,
            next_kind=np.asarray(NEXT_KINDS, dtype=object)[kind],
            next_token=token,
            drafter_forwards=g if forwards is None else forwards,
            batch_step=np.full(k, batch_step),
            active=np.full(k, k),
        )
        for s in _SECTIONS:
            row[f"{s}_s"] = np.full(k, seconds.get(s, 0.0) / max(k, 1))
        self.steps.append(row)
        if draft_cols is not None:
            draft_cols.setdefault("proposed_step", draft_cols["step"])  # a drafter proposes in its own step
            self.drafts.append(draft_cols)

    def tables(self) -> tuple[dict, dict]:
        steps = {c: np.concatenate([s[c] for s in self.steps]) if self.steps else np.array([]) for c in STEP_COLUMNS}
        order = np.lexsort((steps["step"], steps["image"])) if self.steps else np.array([], dtype=np.int64)
        steps = {c: v[order] for c, v in steps.items()}
        if not self.drafts:
            return steps, {c: np.array([]) for c in DRAFT_COLUMNS}
        drafts = {c: np.concatenate([d[c] for d in self.drafts]) for c in DRAFT_COLUMNS}
        order = np.lexsort((drafts["node"], drafts["step"], drafts["image"]))  # a chain's node = draft_index + 1
        return steps, {c: v[order] for c, v in drafts.items()}


def _chain_draft_columns(host: dict, images, step_no, n, g, a) -> Optional[dict]:
    """Draft rows (one per drafted token, t < γ_b) of one batch step from (k, γ) host arrays."""
    width = host["token"].shape[1]
    t = np.arange(width)[None, :]
    valid = t < g[:, None]
    if not valid.any():
        return None
    rep = lambda x: np.broadcast_to(np.asarray(x)[:, None], valid.shape)[valid]  # noqa: E731 - per image -> per draft
    cols = {
        "image": rep(images),
        "step": rep(step_no),
        "draft_index": np.broadcast_to(t, valid.shape)[valid],
        "token": host["token"][valid].astype(np.int64),
    }
    cols["position"] = rep(n) + cols["draft_index"]
    for c in _FLOAT_DRAFT:
        cols[c] = host[c][valid]
    cols["j_star"] = cols["j_star"].astype(np.int64)
    cols["accepted"] = cols["accepted"].astype(bool)
    acc = rep(a)
    cols["reached"] = cols["draft_index"] <= acc
    cols["committed"] = cols["draft_index"] < acc
    cols["out_of_support"] = cols["committed"] & (cols["p_draft"] == 0)
    cols["node"], cols["parent"] = cols["draft_index"] + 1, cols["draft_index"].copy()
    cols["depth"], cols["sibling"] = cols["draft_index"] + 1, np.zeros_like(cols["draft_index"])
    return cols


@dataclass
class _Batch:
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
    streams: _Streams

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


@torch.no_grad()
def batched_decode(
    model: TokenModel,
    conditions: Sequence,
    sampling: SamplingConfig,
    rule: Optional[AcceptanceRule] = None,
    drafter: Optional[DraftModel] = None,
    neighbours: Optional[torch.Tensor] = None,
    gamma: int = 4,
    batch_size: int = 8,
    seed: int = 0,
    first_index: int = 0,
    num_tokens: Optional[int] = None,
    progress: bool = False,
    indices: Optional[Sequence[int]] = None,
    draws: Optional[dict] = None,
    tree: Optional[TreeSpec] = None,
) -> Decoded:
    """Decode one image per condition with up to ``batch_size`` images per forward (module docstring).

    rule: None for AR decoding (then drafter, neighbours and gamma are unused), else ``"sd"`` or a
    LANTERN rule with a drafter (:class:`lantern.drafter.Drafter`) and, for relaxed rules, the
    (V, K >= k) int64 neighbour table; gamma: chain length γ >= 1; image ``first_index + j``
    decodes ``conditions[j]`` with generator ``(seed, first_index + j)`` (or image ``indices[j]``
    when given). draws: {image index: :class:`lantern.trees.Draws`} for images whose coins and
    categorical draws come from that object instead of their generator (exact enumeration in the
    tests; a per-row Python path). tree: a static or dynamic :class:`lantern.trees.TreeSpec` to
    draft trees instead of chains (gamma unused; :func:`_tree_round`), None for chains. Returns a
    :class:`~lantern.records.Decoded` (tokens (images, N) int64 on the CPU, rows in image order,
    records as :func:`lantern.chain.speculative_decode` (trees:
    :func:`lantern.tree_decoding.tree_decode`) writes them plus ``batch_step`` and ``active``).
    Raises UsageError when the model or drafter cannot batch (:func:`check_batching`).
    """
    check_batching(model, drafter if rule is not None else None)
    conds = list(conditions)
    index = np.arange(first_index, first_index + len(conds)) if indices is None else np.asarray(indices, dtype=np.int64)
    N = int(num_tokens or model.num_tokens)
    spec = tree if rule is not None and tree is not None and tree.kind != "chain" else None
    G = int(gamma) if rule is not None and spec is None else 0
    guided, greedy = sampling.guided, sampling.greedy
    convention = rule.convention if rule is not None else "exact"
    judge_rule = rule if rule is not None else AcceptanceRule("sd")
    table = rule.prepare_table(neighbours, model.vocab_size, model.device) if rule is not None else None
    dev = model.device
    B = max(1, min(int(batch_size), len(conds)))
    R = B * (1 + guided)
    spare = spec.nodes if spec is not None else G + 1  # a verified chain or tree beyond the image
    W = N + spare  # positions a row may write: the image plus the padding of one chain or tree
    cache = model.new_slots_cache(B, guided, N, spare)
    dcache = drafter.new_cache(R, G + 1) if G else None
    if spec is not None:  # the tree's drafter nodes after the committed positions, plus one level of padding
        dcache = drafter.new_cache(R, 2 * spec.drafter_nodes + 1)
    timer = Timer(dev)
    streams = _Streams(B, dev, draws)
    tokens = torch.zeros(B, W, dtype=torch.long, device=dev)  # tokens[b, i] = x_i of slot b's image
    st = _Batch(model, drafter, cache, dcache, tokens, None, sampling, rule, table, spec, N, timer, streams)
    image_of = np.full(B, -1)
    n, d = np.ones(B, dtype=np.int64), np.zeros(B, dtype=np.int64)  # committed tokens, drafter positions
    step_of = np.zeros(B, dtype=np.int64)
    out_tokens = torch.zeros(len(conds), N, dtype=torch.long, device=dev)
    per_image = {s: np.zeros(len(conds)) for s in _SECTIONS + ("total",)}
    counts = {c: np.zeros(len(conds), dtype=np.int64) for c in ("steps", "drafted", "accepted")}
    records = _Records()
    queue = iter(range(len(conds)))
    waiting = [len(conds)]  # conditions not yet admitted
    bar = tqdm(total=len(conds), desc=rule.method if rule is not None else "ar", disable=not progress, unit="img")
    rows_of = lambda slots: torch.cat([slots, slots + B]) if guided else slots  # noqa: E731 - slot -> its rows

    def admit(free: list[int]) -> None:
        take = [(s, j) for s, j in zip(free, queue)]
        waiting[0] -= len(take)
        if not take:
            return
        t0, before = time.perf_counter(), timer.snapshot()
        slots = torch.tensor([s for s, _ in take], device=dev)
        rows = rows_of(slots)
        prompt = model.make_prompt([conds[j] for _, j in take], guided=guided)
        with timer("target"):
            first = model.prefill_slots(cache, rows, prompt)
        for s, j in take:
            streams.take(s, seed, int(index[j]))
            image_of[s] = j
        with timer("acceptance"):
            p0 = target_distribution(first.logits[:, -1], sampling, guided, convention)
            x0 = p0.argmax(-1) if greedy else streams.categorical(p0, [s for s, _ in take])
        if st.feats is None:
            st.feats = first.hidden.new_zeros(R, W, first.hidden.shape[-1])  # (R, W, H): feats[:, i] = h_{i-1}
        st.tokens[slots, 0] = x0
        st.feats[rows, 0] = first.hidden[:, -1]
        idx = [s for s, _ in take]
        n[idx], d[idx], step_of[idx] = 1, 0, 0
        share = elapsed_since(timer, before)
        js = [j for _, j in take]
        for s in _SECTIONS:
            per_image[s][js] += share.get(s, 0.0) / len(take)
        per_image["total"][js] += (time.perf_counter() - t0) / len(take)

    admit(list(range(B)))
    batch_step = 0
    H = st.H
    ar = torch.arange(W, device=dev)
    while (image_of >= 0).any():
        batch_step += 1
        t0, before = time.perf_counter(), timer.snapshot()
        active = image_of >= 0
        if spec is not None:
            a_h, g, kind_h, next_h, fwd, cols, d = _tree_round(st, n, d, active, index[image_of], step_of + 1)
            live = np.flatnonzero(active)
            step_of[live] += 1
            imgs = image_of[live]
        else:
            fwd = None
            g = np.where(active, np.minimum(G, N - 1 - n), 0)
            gmax = int(g.max())
            n_t = torch.as_tensor(n, device=dev)
            g_t = torch.as_tensor(g, device=dev)
            drafts = st.tokens.new_zeros(B, gmax)
            q = None
            if gmax:
                with timer("drafter"):
                    drafts, q = _draft(st, n, d, g)
                d = np.where(g > 0, n, d)
            with timer("target"):
                T = gmax + 1
                slots = (n_t - 1)[:, None] + ar[:T]  # x_{n-1} and the drafts, at their own image positions
                vin = torch.cat([st.tokens.gather(1, slots[:, :1]), drafts], 1)
                S = int(n.max()) - 1 + T
                visible = ar[None, None, :S] <= slots[:, :, None]
                out = model.extend_slots(
                    cache,
                    expand_rows(vin, guided),
                    expand_rows(slots, guided),
                    expand_rows(slots.clamp(max=N - 1), guided),
                    expand_rows(visible, guided),
                )
            with timer("acceptance"):
                p = target_distribution(out.logits, sampling, guided, convention)  # (B, T, V)
                u = None
                if gmax and not greedy:
                    prob = (
                        judge(
                            p[:, :gmax], q, drafts, torch.zeros_like(drafts, dtype=p.dtype), table, judge_rule, False
                        ).accept_prob
                        if any(x is not None for x in streams.scripted)
                        else None
                    )
                    u = streams.uniforms(g, p.dtype, prob)
                res = accept(
                    p,
                    q,
                    drafts,
                    judge_rule,
                    table,
                    greedy,
                    None,
                    validate=False,
                    timer=timer,
                    lengths=g_t,
                    u=u,
                    choose=lambda probs, rows=range(B): streams.categorical(probs, rows),
                )
                a = res.accepted
                keep = ar[None, :T] <= a[:, None]  # committed: the accepted drafts and the next token
                cand = torch.cat([drafts, res.next_token[:, None]], 1)
                cand = cand.scatter(1, a[:, None], res.next_token[:, None])
                at = n_t[:, None] + ar[:T]
                st.tokens.scatter_(1, at, torch.where(keep, cand, st.tokens.gather(1, at)))
                at_r, keep_r = (
                    expand_rows(at, guided)[..., None].expand(-1, -1, H),
                    expand_rows(keep, guided)[..., None],
                )
                hid = torch.where(keep_r, out.hidden, st.feats.gather(1, at_r))  # h_{n-1}..h_{n+a-1}
                st.feats.scatter_(1, at_r, hid)
            host = _to_host(res, p, q, drafts, gmax, greedy)  # the step's one host transfer
            a_h = host["a"]
            live = np.flatnonzero(active)
            step_of[live] += 1
            imgs = image_of[live]
            cols = (
                _chain_draft_columns(
                    {c: host[c][live] for c in host if c not in ("a", "kind", "next")},
                    index[imgs],
                    step_of[live],
                    n[live],
                    g[live],
                    a_h[live],
                )
                if gmax
                else None
            )
            kind_h, next_h = host["kind"], host["next"]
        secs = elapsed_since(timer, before)
        n_before = n.copy()
        n = np.where(active, n + a_h + 1, n)
        finished = live[n[live] >= N]
        if len(finished):
            fin = torch.as_tensor(finished, device=dev)
            out_tokens[torch.as_tensor(image_of[finished], device=dev)] = st.tokens[fin, :N]
        wall = time.perf_counter() - t0
        records.add(
            index[imgs],
            step_of[live],
            n_before[live],
            g[live],
            a_h[live],
            kind_h[live],
            next_h[live],
            secs,
            batch_step,
            cols,
            None if fwd is None else fwd[live],
        )
        for s in _SECTIONS:
            per_image[s][imgs] += secs.get(s, 0.0) / len(live)
        per_image["total"][imgs] += wall / len(live)
        counts["steps"][imgs] += 1
        counts["drafted"][imgs] += g[live]
        counts["accepted"][imgs] += a_h[live]
        if len(finished):
            bar.update(len(finished))
            for s in finished:
                streams.free(s)
                image_of[s] = -1
            n[finished], d[finished] = 1, 0
            admit(list(finished))
        live = np.flatnonzero(image_of >= 0)
        if not waiting[0] and 0 < len(live) <= B // 2:  # a draining batch: drop the empty slots (one copy)
            keep = torch.as_tensor(live, device=dev)
            rows = rows_of(keep)
            model.select_slots(cache, rows)
            if dcache is not None:
                drafter.select_slots(dcache, rows)
            st.tokens, st.feats = st.tokens[keep], st.feats[rows]
            n, d, image_of, step_of = n[live], d[live], image_of[live], step_of[live]
            streams.keep(live)
            B = len(live)
    bar.close()
    steps, drafts_tab = records.tables()
    images = {
        "image": index,
        "condition": np.array([str(c) for c in conds]),
        "seed": np.array([image_seed(seed, int(i)) for i in index]),
        "tokens": np.full(len(conds), N),
        "target_forwards": 1 + counts["steps"],
        "steps": counts["steps"],
        "drafted": counts["drafted"],
        "accepted": counts["accepted"],
        **{f"{s}_s": per_image[s] for s in _SECTIONS},
        "total_s": per_image["total"],
    }
    depth = spec.max_depth if spec is not None else G
    return Decoded(out_tokens.cpu(), steps, drafts_tab, images, rule.method if rule is not None else "ar", depth)


def _draft(st: _Batch, n, d, g) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft a chain for every slot in ``max(g)`` drafter steps (:func:`lantern.chain.draft`, per row).

    The first forward covers each row's pending positions ``d_b..n_b-1`` (padded to the longest;
    each row's last real output drafts ``x̂_{n_b}``); row b draws only its first ``g_b`` drafts
    from its stream. Returns drafts (B, max g) int64 and q (B, max g, V)."""
    dev, B, guided = st.device, st.B, st.guided
    gmax = int(g.max())
    f = _pending(st, n, d, g > 0)
    ar = torch.arange(gmax + int(n.max()) + 1, device=dev)
    n_t = torch.as_tensor(n, device=dev)
    xs, qs = [], []
    for j in range(gmax):
        q = st.target(st.drafter.logits(st.model, f)[:, -1])  # (B, V)
        x = q.argmax(-1) if st.sampling.greedy else st.streams.categorical(q, range(B), g > j)
        xs.append(x)
        qs.append(q)
        if j + 1 < gmax:
            at = (n_t + j)[:, None]
            vis = ar[None, None, : int(n.max()) + j + 1] <= at[:, :, None]
            f = st.drafter.forward_slots(
                st.model,
                expand_rows(x, guided)[:, None],
                f,
                st.dcache,
                expand_rows(at, guided),
                expand_rows(at.clamp(max=st.N - 1), guided),
                expand_rows(vis, guided),
            )
    return torch.stack(xs, 1), torch.stack(qs, 1)


def _pending(st: _Batch, n, d, drafting) -> torch.Tensor:
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


# --------------------------------------------------------------------------- draft trees
@dataclass
class _Trees:
    """The draft trees of all slots, as (B, T) tensors on the device (row b: slot b's tree).

    Column 0 of a row is its root ``x_{n_b-1}``. tokens (B, T) int64 code indices; parent (B, T)
    int64 column of each node's parent (the root and padding: their own column); depth (B, T)
    int64 (0 at the root and padding); exists (B, T) bool: the row's nodes (the root always; the
    drafts of a drafting slot), the rest is padding; rank (B, T) int64: a node's place among its
    parent's children (their trial order); q: (B, T, V) float (the drafter's dtype) the drafter's distribution of
    each expanded node's children (static trees), None for dynamic trees (their drafts are the
    drafter's top ranks and count as deterministic); sampled: static children drawn from q
    (temperature > 0); static: a static shape (the official greedy walk orders its paths
    lexicographically); forwards (B,) int64: drafter forwards of each row's tree, the root's
    included (0 without a tree); depth_max: the deepest node any row may hold (host int).

    Layouts: a dynamic tree is packed (a row's drafts fill its columns ``1..drafted`` in the
    order of :func:`lantern.trees.tree_steps`, ascending candidate index); a static tree keeps
    its shape's order (column t is path t of :attr:`lantern.trees.TreeSpec.paths`, truncated to
    the deepest level any row may draft), so a child a row did not draw (fewer tokens with mass
    than ranks, or the image's last tokens) is padding in that row. A row's node number in the
    records is the count of its nodes before the column (one-image decoding's node index).
    """

    tokens: torch.Tensor
    parent: torch.Tensor
    depth: torch.Tensor
    exists: torch.Tensor
    rank: torch.Tensor
    q: Optional[torch.Tensor]
    sampled: bool
    static: bool
    forwards: torch.Tensor
    depth_max: int

    @property
    def nodes(self) -> torch.Tensor:
        """(B, T) bool: the drafts (existing nodes other than the root)."""
        return self.exists & (torch.arange(self.tokens.shape[1], device=self.tokens.device) > 0)

    def ancestors(self) -> torch.Tensor:
        """(B, T, T) bool: ``[b, t, s]`` is True when column s is t or an ancestor of t in row b
        (padding: itself only). ``depth_max`` gathers over the parents, no per-node loop."""
        B, T = self.tokens.shape
        eye = torch.eye(T, dtype=torch.bool, device=self.tokens.device)
        anc = eye.expand(B, T, T)
        for _ in range(self.depth_max):
            anc = eye | anc.gather(1, self.parent[..., None].expand(-1, -1, T))
        return anc


def _tree_round(st: _Batch, n, d, active, images, steps):
    """One batch step of draft trees: every drafting slot drafts its tree (:func:`_draft_trees`),
    one target forward verifies all trees (:func:`_verify_trees`), all images walk their trees at
    once (:func:`_walk_trees`), one host transfer brings the outcomes and per-node records
    (:func:`_tree_host`) and every image commits its accepted path (:func:`_commit_paths`).

    n, d: (B,) int64 committed tokens and drafter positions per slot; active: (B,) bool;
    images / steps: the image index and step number of each slot. Returns accepted (B,), drafted
    (B,), kind (B,) index into NEXT_KINDS, next token (B,), drafter forwards (B,) (int64 numpy
    arrays), the draft columns of the step (None when no image drafted) and the new drafter
    positions d (B,).
    """
    drafting = active & (n < st.N - 1)  # an image with one token left verifies its root alone
    with st.timer("drafter"):
        trees = _draft_trees(st, n, d, drafting)
    with st.timer("target"):
        anc = trees.ancestors()
        out = _verify_trees(st, n, trees, anc)
    with st.timer("acceptance"):
        p = st.target(out.logits)  # (B, T, V)
        walk = _walk_trees(st, trees, p, anc, active, drafting)
        host = _tree_host(trees, p, walk)  # the step's last host transfer
        _commit_paths(st, n, host["m"], walk["path"], walk["next"], trees.tokens, out.hidden)
    cols = _tree_draft_columns(host, active, n, images, steps)
    return host["m"], host["drafted"], host["kind"], host["next"], host["forwards"], cols, np.where(drafting, n, d)


def _draft_trees(st: _Batch, n, d, drafting) -> _Trees:
    """Every drafting slot's draft tree, vectorised over slots (:class:`_Trees`; a slot that does
    not draft holds its root alone).

    One drafter forward over the pending positions (:func:`_pending`) gives each root's feature
    and the drafter's distribution after it; then :func:`_draft_dynamic` or
    :func:`_draft_static` grow all trees level by level, one ``forward_slots`` per level for all
    images (an image's level-l nodes at its own drafter slots after ``n_b``, seeing its
    committed positions and their tree ancestors). The drafter's tree entries are simply left
    behind (recomputed from true features next round, as
    :func:`lantern.tree_decoding.tree_decode` rolls its drafter cache back)."""
    dev = st.device
    root = st.tokens.gather(1, torch.as_tensor(n - 1, device=dev)[:, None])  # (B, 1)
    if not drafting.any():
        zeros = torch.zeros_like(root)
        return _Trees(
            root, zeros, zeros, torch.ones_like(root, dtype=torch.bool), zeros, None, False, False, zeros[:, 0], 0
        )
    f_root = _pending(st, n, d, drafting)  # (R, 1, H)
    root_q = st.target(st.drafter.logits(st.model, f_root)[:, -1])  # (B, V)
    room = np.where(drafting, st.N - 1 - n, 0)  # the deepest draft each slot may have (0: no tree)
    if st.spec.kind == "dynamic":
        return _draft_dynamic(st, n, room, root, f_root, root_q)
    return _draft_static(st, n, room, root, f_root, root_q)


def _log_q(q: torch.Tensor) -> torch.Tensor:
    """Drafter probabilities (..., V) -> float64 log-probabilities, -inf where q has no mass (as
    :func:`lantern.trees.tree_steps` scores candidates)."""
    return torch.log(q.double().clamp_min(1e-300)).masked_fill(q <= 0, float("-inf"))


def _sibling_rank(parent: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """(B, T) int64: how many earlier nodes of the row share each node's parent."""
    T = parent.shape[1]
    ar = torch.arange(T, device=parent.device)
    same = (parent[:, :, None] == parent[:, None, :]) & nodes[:, None, :] & (ar[None, :] < ar[:, None])
    return same.sum(-1)


def _draft_dynamic(st: _Batch, n, room, root, f_root, root_q) -> _Trees:
    """EAGLE-2 dynamic trees of all slots at once (:func:`lantern.trees.tree_steps`, ``"dynamic"``,
    the same candidates, scores and ties): the root's top-k children form each beam; every round
    expands all beams in one drafter forward ((B, k) nodes), scores the (B, k, k) children by
    cumulative float64 log-probability and keeps each row's k best (a stable descending sort: ties
    to the earlier candidate); the rerank keeps each row's ``total_tokens - 1`` best finite
    candidates in candidate order. A slot near the end of its image runs fewer rounds
    (``min(depth, room_b - 1)``); its later candidates are -inf and never kept.
    room (B,) int64: the deepest draft per slot (0: no tree); root (B, 1) int64; f_root (R, 1, H);
    root_q (B, V)."""
    spec, dev, B, H, guided = st.spec, st.device, st.B, st.H, st.guided
    k = min(spec.top_k, root_q.shape[-1])
    rounds = np.where(room > 0, np.minimum(spec.depth, room - 1), 0)
    n_t = torch.as_tensor(n, device=dev)
    ninf = torch.tensor(float("-inf"), dtype=torch.float64, device=dev)
    top = _log_q(root_q).topk(k)
    beam_score = torch.where(torch.as_tensor(room > 0, device=dev)[:, None], top.values, ninf)
    toks, scores = [top.indices], [beam_score]
    pars, depths = [torch.full((B, k), -1, device=dev)], [torch.ones(B, k, dtype=torch.long, device=dev)]
    beam = torch.arange(k, device=dev).expand(B, k)  # candidate index of each beam node
    chain = torch.zeros(B, k, 0, dtype=torch.long, device=dev)  # beam column of each node's ancestor per round
    pf = f_root.expand(-1, k, -1)
    first = k
    for r in range(int(rounds.max())):
        part = rounds > r
        part_t = torch.as_tensor(part, device=dev)
        slots_h = (n + k * np.minimum(r, rounds))[:, None] + np.arange(k)
        slots = torch.as_tensor(slots_h, device=dev)
        S = int(slots_h.max()) + 1
        vis = ((torch.arange(S, device=dev) < n_t[:, None]) & part_t[:, None])[:, None, :].expand(B, k, S).clone()
        if r:  # the ancestors' drafter slots (a resting row sees only itself)
            cols = n_t[:, None, None] + k * torch.arange(r, device=dev) + chain
            vis.scatter_(2, torch.where(part_t[:, None, None], cols, slots[:, :, None]), True)
        vis.scatter_(2, slots[:, :, None], True)
        pos = torch.as_tensor(np.minimum(n + r, st.N - 1), device=dev)[:, None].expand(B, k)  # depth r + 1
        out = st.drafter.forward_slots(
            st.model,
            expand_rows(torch.cat(toks, 1).gather(1, beam), guided),
            pf,
            st.dcache,
            expand_rows(slots, guided),
            expand_rows(pos, guided),
            expand_rows(vis, guided),
        )
        child = _log_q(st.target(st.drafter.logits(st.model, out))).topk(k, dim=-1)  # (B, k, k)
        pool = torch.where(part_t[:, None], (beam_score[..., None] + child.values).reshape(B, k * k), ninf)
        toks.append(child.indices.reshape(B, k * k))
        scores.append(pool)
        pars.append(beam.repeat_interleave(k, 1))
        depths.append(torch.full((B, k * k), r + 2, device=dev))
        pick = pool.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        j = pick // k  # the beam column of each new beam node's parent
        beam, beam_score = first + pick, pool.gather(1, pick)
        first += k * k
        chain = torch.cat([chain.gather(1, j[..., None].expand(-1, -1, r)), j[..., None]], 2)
        pf = out.gather(1, expand_rows(j, guided)[..., None].expand(-1, -1, H))
    score = torch.cat(scores, 1)
    C = score.shape[1]
    keep = min(spec.total_tokens - 1, C)
    best = score.sort(dim=-1, descending=True, stable=True).indices[:, :keep]
    kept = torch.where(score.gather(1, best) > ninf, best, C).sort(-1).values  # candidate order; C: none
    exists = torch.cat([torch.ones_like(root, dtype=torch.bool), kept < C], 1)
    kc = kept.clamp(max=C - 1)
    column = torch.zeros(B, C + 2, dtype=torch.long, device=dev)  # candidate + 1 -> its column (0: the root)
    column.scatter_(1, kept + 1, torch.arange(1, keep + 1, device=dev).expand(B, -1))
    ar = torch.arange(keep + 1, device=dev)
    parent = torch.cat([torch.zeros_like(root), column.gather(1, torch.cat(pars, 1).gather(1, kc) + 1)], 1)
    parent = torch.where(exists, parent, ar)
    tokens = torch.cat([root, torch.cat(toks, 1).gather(1, kc)], 1) * exists
    depth = torch.cat([torch.zeros_like(root), torch.cat(depths, 1).gather(1, kc)], 1) * exists
    nodes = exists & (ar > 0)
    forwards = torch.as_tensor(np.where(room > 0, 1 + rounds, 0), device=dev)
    return _Trees(
        tokens, parent, depth, exists, _sibling_rank(parent, nodes), None, False, False, forwards, 1 + int(rounds.max())
    )


@functools.lru_cache(maxsize=32)
def _static_shape(paths: tuple) -> dict:
    """A static shape's node tables (numpy, column t = path t - 1 of ``paths``; column 0 the root):
    parent, rank, depth, kids (children per node), and per level l >= 1: its columns, its
    parents (columns with children at depth l - 1), each node's parent's place among them, and the
    drafter slot offset (after ``n_b``) of each node the level expands (-1: a leaf)."""
    T = len(paths) + 1
    col = {(): 0}
    parent, rank, depth = np.zeros(T, np.int64), np.zeros(T, np.int64), np.zeros(T, np.int64)
    for t, p in enumerate(paths, 1):
        col[p] = t
        parent[t], rank[t], depth[t] = col[p[:-1]], p[-1], len(p)
    kids = np.bincount(parent[1:], minlength=T)
    slot = np.full(T, -1)
    expanded = np.flatnonzero((kids > 0) & (np.arange(T) > 0))  # in (depth, path) order
    slot[expanded] = np.arange(len(expanded))
    return dict(T=T, parent=parent, rank=rank, depth=depth, kids=kids, slot=slot)


def _draft_static(st: _Batch, n, room, root, f_root, root_q) -> _Trees:
    """EAGLE-1 static trees of all slots at once (:func:`lantern.trees.tree_steps`, ``"static"``):
    level by level, every parent's children are its top ranks (greedy) or drawn from its q
    without replacement in rank order (:func:`_draw_children`: each slot's uniforms from its own
    stream in one-image decoding's order); a parent has ``min(children, tokens with mass)``
    children, and a slot drafts no deeper than ``room_b``. All expanded nodes of a level run in
    one drafter forward (each at the drafter slot ``n_b`` + its place among the shape's expanded
    nodes). room (B,) int64 (0: no tree); root (B, 1) int64; f_root (R, 1, H); root_q (B, V)."""
    spec, dev, B, guided = st.spec, st.device, st.B, st.guided
    shape = _static_shape(spec.paths)
    D = min(spec.max_depth, int(room.max()))
    T = int((shape["depth"] <= D).sum())  # paths are sorted by depth: the first T columns
    depth_h, parent_h, rank_h, kids, slot = (shape[c][:T] for c in ("depth", "parent", "rank", "kids", "slot"))
    V = root_q.shape[-1]
    n_t, room_t = torch.as_tensor(n, device=dev), torch.as_tensor(room, device=dev)
    tokens = root.new_zeros(B, T)
    tokens[:, :1] = root
    exists = torch.zeros(B, T, dtype=torch.bool, device=dev)
    exists[:, 0] = True
    q = root_q.new_zeros(B, T, V)
    q[:, 0] = root_q
    feats = f_root.new_zeros(f_root.shape[0], T, f_root.shape[-1])
    feats[:, :1] = f_root
    forwards = (room_t > 0).long()
    for level in range(1, D + 1):
        cols = np.flatnonzero(depth_h == level)
        pars = np.unique(parent_h[cols])  # parents in column order (the frontier's order)
        at = np.searchsorted(pars, parent_h[cols])  # each node's parent's place among pars
        qp = q[:, pars]  # (B, P, V)
        want = torch.as_tensor(kids[pars], device=dev)[None] * (room_t >= level)[:, None]
        m = torch.minimum(want, (qp > 0).sum(-1)) * exists[:, pars]  # children drawn per parent
        M = int(kids[pars].max())
        if st.sampling.greedy:
            picks = qp.topk(min(M, V), dim=-1).indices
        else:
            picks = _draw_children(st, qp, m, M)
        r = torch.as_tensor(rank_h[cols], device=dev)
        at_t = torch.as_tensor(at, device=dev)
        here = r[None] < m[:, at_t]  # (B, level width)
        tokens[:, cols] = torch.where(here, picks[:, at_t, r.clamp(max=picks.shape[-1] - 1)], 0)
        exists[:, cols] = here
        grow = cols[kids[cols] > 0] if level < D else cols[:0]
        if len(grow):  # one drafter forward for the level's nodes with children
            off = slot[grow]
            S = int(n.max()) + int(off.max()) + 1
            vis = (torch.arange(S, device=dev) < n_t[:, None])[:, None, :].expand(B, len(grow), S).clone()
            chain, up = np.empty((len(grow), level), dtype=np.int64), grow
            for i in range(level):  # the node itself, then its (expanded) ancestors up to depth 1
                chain[:, i], up = slot[up], parent_h[up]
            vis.scatter_(2, n_t[:, None, None] + torch.as_tensor(chain, device=dev), True)
            pos = torch.as_tensor(np.minimum(n - 1 + level, st.N - 1), device=dev)
            out = st.drafter.forward_slots(
                st.model,
                expand_rows(tokens[:, grow], guided),
                feats[:, parent_h[grow]],
                st.dcache,
                expand_rows(n_t[:, None] + torch.as_tensor(off, device=dev), guided),
                expand_rows(pos[:, None].expand(B, len(grow)), guided),
                expand_rows(vis, guided),
            )
            feats[:, grow] = out
            q[:, grow] = st.target(st.drafter.logits(st.model, out))
            forwards += (exists[:, grow].any(-1) & (room_t > level)).long()
    parent = torch.as_tensor(parent_h, device=dev).expand(B, T)
    ar = torch.arange(T, device=dev)
    parent = torch.where(exists, parent, ar)
    depth = torch.as_tensor(depth_h, device=dev).expand(B, T) * exists
    rank = torch.as_tensor(rank_h, device=dev).expand(B, T) * exists
    return _Trees(tokens, parent, depth, exists, rank, q, not st.sampling.greedy, True, forwards, D)


def _draw_children(st: _Batch, qp: torch.Tensor, m: torch.Tensor, M: int) -> torch.Tensor:
    """Static-tree children drawn without replacement: qp (B, P, V) the parents' drafter
    distributions, m (B, P) int64 children per parent -> (B, P, M) int64 tokens (rank r of parent
    u: inverse CDF of the mass not yet drawn; columns r >= m[b, u] unused). Slot b uses the next
    ``sum(m[b])`` uniforms of its stream in one-image decoding's order (parent by parent, rank by
    rank: :func:`lantern.trees._choose` with :class:`lantern.trees.GeneratorDraws`); a scripted
    slot calls its Draws. The one host read of a level: m."""
    B, P, V = qp.shape
    dev = qp.device
    m_h = m.cpu().numpy()
    count = m_h.sum(1)
    width = max(int(count.max()), 1)
    flat = torch.stack(
        [
            torch.cat(
                [
                    st.streams.block(b, int(count[b])),
                    torch.full((width - int(count[b]),), 0.5, dtype=torch.float64, device=dev),
                ]
            )
            for b in range(B)
        ]
    )  # (B, width): slot b's uniforms of this level
    start = np.cumsum(m_h, 1) - m_h
    index = np.minimum(start[:, :, None] + np.arange(M), width - 1)
    u = flat.gather(1, torch.as_tensor(index.reshape(B, -1), device=dev)).view(B, P, M)
    left = qp.double().clone()
    picks = torch.zeros(B, P, M, dtype=torch.long, device=dev)
    zero = left.new_zeros(())
    for r in range(M):
        x = invert(left, u[:, :, r])[..., None]
        picks[:, :, r] = x[..., 0]
        left.scatter_(-1, x, torch.where(r < m[..., None], zero, left.gather(-1, x)))
    for b, d in enumerate(st.streams.scripted):
        if d is None:
            continue
        for j in range(P):
            rest = qp[b, j].double().clone()
            for r in range(int(m_h[b, j])):
                picks[b, j, r] = x = d.categorical(rest)
                rest[x] = 0.0
    return picks


def _verify_trees(st: _Batch, n, trees: _Trees, anc: torch.Tensor):
    """One target forward over every slot's tree; returns the
    :class:`~ambiguity.models.base.Step` (R, T, .).

    Column t of row b sits at cache slot ``n_b - 1 + t`` (the root at slot ``n_b - 1``), image
    position ``n_b - 1 + depth_t``, and sees slots ``0..n_b-2`` and its ancestors (anc (B, T, T)
    bool of :meth:`_Trees.ancestors`); padding sees the committed slots and itself (its outputs
    are unused and its cache entries never seen). A slot without a tree verifies its root alone
    (a plain target step)."""
    dev, (B, T) = st.device, trees.tokens.shape
    n_t = torch.as_tensor(n, device=dev)
    S = int(n.max()) - 1 + T
    slots = (n_t - 1)[:, None] + torch.arange(T, device=dev)
    vis = (torch.arange(S, device=dev) < (n_t - 1)[:, None])[:, None, :].expand(B, T, S).clone()
    vis.scatter_(2, slots[:, None, :].expand(B, T, T), anc)
    pos = ((n_t - 1)[:, None] + trees.depth).clamp(max=st.N - 1)
    g = st.guided
    return st.model.extend_slots(
        st.cache, expand_rows(trees.tokens, g), expand_rows(slots, g), expand_rows(pos, g), expand_rows(vis, g)
    )


_TRIALS = ("p_tilde", "spent", "q_draft", "accept_prob", "u")


def _walk_trees(st: _Batch, trees: _Trees, p: torch.Tensor, anc: torch.Tensor, active, drafting) -> dict:
    """All images' acceptance walks at once (:func:`lantern.tree_decoding.walk_tree`: the same
    verdicts, residuals, draws and records), one trial per image per round.

    From the root, each walking image judges the child of rank r of its current node against its
    current target (:func:`lantern.acceptance.proximity`, :func:`~lantern.acceptance.judge_greedy`
    or a coin ``u < min(1, p̃/q)``, q the conditional q of the mass not yet drawn for sampled
    static trees, 1 for deterministic drafts); a rejection replaces the target by the residual
    and moves to the next sibling, an acceptance moves down; an image with no child left draws
    its next token from its target (argmax when greedy) and stops. Every walking image draws one
    uniform per round from its own stream (a coin or its next token: the order of one-image
    decoding); the round's only host read is which images still walk. Greedy ``"official"``:
    :func:`_walk_official_greedy`.

    p: (B, T, V) the target after each column; anc: (B, T, T) of :meth:`_Trees.ancestors`;
    active / drafting: (B,) bool host arrays. Returns device tensors: m (B,) accepted drafts,
    path (B, depth_max + 1) columns of the root and the accepted nodes (``path[b, :m_b + 1]``),
    next (B,) int64, kind (B,) index into NEXT_KINDS, and the per-column trial records (B, T):
    reached, accepted (bool), j_star (int64) and p_tilde, spent, q_draft, accept_prob, u
    (float64, NaN where not judged)."""
    if st.sampling.greedy and st.convention == "official":
        return _walk_official_greedy(st, trees, p, anc, active, drafting)
    dev, (B, T, _) = st.device, p.shape
    greedy, rule, table = st.sampling.greedy, st.rule, st.table
    rows = torch.arange(B, device=dev)
    nodes = trees.nodes
    kid = torch.full((B, T * (T + 1)), -1, dtype=torch.long, device=dev)  # [b, u (T + 1) + r]: child r of u
    kid.scatter_(
        1, trees.parent * (T + 1) + torch.where(nodes, trees.rank, T), torch.arange(T, device=dev).expand(B, T)
    )
    kid[:, T :: T + 1] = -1  # the padding's column
    cur, r = rows.new_zeros(B), rows.new_zeros(B)
    walking = torch.as_tensor(active, device=dev)
    rejected = torch.zeros(B, dtype=torch.bool, device=dev)
    target = p[:, 0]
    sampled = trees.sampled and not greedy
    left = trees.q[:, 0].double() if sampled else None
    path = rows.new_zeros(B, trees.depth_max + 1)
    m, nxt, kind = rows.new_zeros(B), rows.new_zeros(B), rows.new_zeros(B)
    trials, judged = [], []  # per round: (B, 8) trial values and (B,) the column each image judged
    scripted = [b for b, d in enumerate(st.streams.scripted) if d is not None]
    below_one = float(np.nextafter(1.0, 0.0))
    one = torch.ones(B, dtype=torch.float64, device=dev)
    walking_h = np.asarray(active, dtype=bool)
    while walking_h.any():
        c = kid.gather(1, (cur * (T + 1) + r)[:, None])[:, 0]
        has = walking & (c >= 0)
        cc = c.clamp(min=0)
        x = trees.tokens.gather(1, cc[:, None])[:, 0]
        with st.timer("proximity"):
            prox = proximity(target, x, table, rule)
        q_cond = None
        if greedy:
            ok = judge_greedy(target, x, table, rule, False, prox).accepted & has
            qx, prob, u, u_rec = one, ok.double(), None, torch.full_like(one, float("nan"))
        else:
            u = st.streams.each(walking_h)  # one draw per walking image: a coin, or its next token
            if left is not None:
                q_cond = (left / left.sum(-1, keepdim=True)).to(p.dtype)
                qx = q_cond.gather(1, x[:, None])[:, 0].double()
            else:
                qx = one
            pt = prox[1].double()
            prob = torch.where(qx > 0, (pt / torch.where(qx > 0, qx, one)).clamp(max=1.0), (pt > 0).double())
            u_rec = u.clone()
            if scripted:  # a scripted image's coin: its Draws decides (exact enumeration in tests)
                has_h, prob_h = has.cpu().numpy(), prob.cpu().numpy()
                for b in scripted:
                    if has_h[b]:
                        d = st.streams.scripted[b]
                        u[b] = 0.0 if d.coin(float(prob_h[b])) else below_one
                        u_rec[b] = getattr(d, "last_u", float("nan"))
            ok = has & (u < prob)
        bad = has & ~ok
        trial = (prox[1].double(), prox[3].double(), qx, prob, u_rec, prox[2].double(), ok.double(), has.double())
        trials.append(torch.stack(trial, 1))
        judged.append(torch.where(has, c, T))  # the column judged this round (T: none)
        if not greedy:
            target = torch.where(bad[:, None], residual(target, q_cond, x, table, rule, validate=False), target)
            if left is not None:
                left = torch.where(bad[:, None], left.scatter(1, x[:, None], 0.0), left)
        done = walking & ~has
        token = target.argmax(-1) if greedy else invert(target, u)
        if scripted and not greedy:
            done_h = done.cpu().numpy()
            for b in scripted:
                if done_h[b]:
                    token[b] = st.streams.scripted[b].categorical(target[b])
        nxt = torch.where(done, token, nxt)
        kind = torch.where(done, 1 + rejected.long(), kind)  # NEXT_KINDS: bonus, residual
        m = m + ok.long()
        path.scatter_(1, m[:, None], torch.where(ok, c, path.gather(1, m[:, None])[:, 0])[:, None])
        cur = torch.where(ok, c, cur)
        r = torch.where(ok, 0, r + bad.long())
        rejected = ~ok & (rejected | bad)
        target = torch.where(ok[:, None], p[rows, cc], target)
        if left is not None:
            left = torch.where(ok[:, None], trees.q[rows, cc].double(), left)
        walking = walking & ~done
        walking_h = walking.cpu().numpy()  # the round's host read: who walks on (and draws)
    kind = torch.where(torch.as_tensor(drafting, device=dev), kind, 0)  # one token left: a target step
    nan = float("nan")
    book = torch.tensor([nan] * len(_TRIALS) + [0.0, 0.0, 0.0], dtype=torch.float64, device=dev)
    book = book.expand(B, T + 1, -1).clone()  # (B, T + 1, 8); column T takes the rounds without a trial
    if trials:
        book.scatter_(1, torch.stack(judged, 1)[..., None].expand(-1, -1, 8), torch.stack(trials, 1))
    rec = {c: book[:, :T, i] for i, c in enumerate(_TRIALS)}
    rec.update(j_star=book[:, :T, 5].long(), accepted=book[:, :T, 6] > 0, reached=book[:, :T, 7] > 0)
    return dict(m=m, path=path, next=nxt, kind=kind, **rec)


def _walk_official_greedy(st: _Batch, trees: _Trees, p: torch.Tensor, anc: torch.Tensor, active, drafting) -> dict:
    """:func:`lantern.tree_decoding.walk_official_greedy` for all images at once: every node
    passes or fails on its own against the target at its parent; a node's path passes when it
    and its ancestors pass; each leaf's longest passing prefix, the first leaf with the longest
    winning (static trees: leaves in lexicographic path order, so the winner is the first
    passing node at that depth; dynamic trees: leaves by column). Shapes as :func:`_walk_trees`
    (no draws, no host read)."""
    dev, (B, T, V) = st.device, p.shape
    rows, ar = torch.arange(B, device=dev), torch.arange(T, device=dev)
    nodes, parent, depth = trees.nodes, trees.parent, trees.depth
    p_par = p.gather(1, parent[..., None].expand(-1, -1, V))
    with st.timer("proximity"):
        prox = proximity(p_par, trees.tokens, st.table, st.rule)
    v = judge_greedy(p_par, trees.tokens, st.table, st.rule, False, prox)
    passed = (v.accepted & nodes) | (ar == 0)
    full = passed
    for _ in range(trees.depth_max):
        full = passed & full.gather(1, parent)
    has_kid = torch.zeros(B, T + 1, dtype=torch.bool, device=dev)
    has_kid.scatter_(1, torch.where(nodes, parent, T), True)
    has_kid = has_kid[:, :T]
    leaf = trees.exists & ~has_kid
    anchor = torch.where(full, ar, -1)  # the deepest passing node on the way to each node
    for _ in range(trees.depth_max):
        anchor = torch.where(anchor >= 0, anchor, anchor.gather(1, parent))
    reach = depth.gather(1, anchor.clamp(min=0))
    best = torch.where(leaf, reach, -1).amax(-1)
    if trees.static:
        chosen = torch.where(full & trees.exists & (depth == best[:, None]), ar, T).amin(-1)
    else:
        first = torch.where(leaf & (reach == best[:, None]), ar, T).amin(-1)
        chosen = anchor.gather(1, first[:, None])[:, 0]
    on_path = anc[rows, chosen]  # (B, T): the chosen node and its ancestors
    D = trees.depth_max
    path = rows.new_zeros(B, D + 2).scatter_(1, torch.where(on_path, depth, D + 1), ar.expand(B, T))[:, : D + 1]
    act = torch.as_tensor(active, device=dev)
    m = torch.where(act, depth.gather(1, chosen[:, None])[:, 0], 0)
    nxt = p[rows, chosen].argmax(-1)
    kind = torch.where(torch.as_tensor(drafting, device=dev), 1 + has_kid.gather(1, chosen[:, None])[:, 0].long(), 0)
    reached = nodes & on_path.gather(1, parent)
    nan = torch.full((B, T), float("nan"), dtype=torch.float64, device=dev)
    rec = dict(
        p_tilde=torch.where(reached, v.p_tilde.double(), nan),
        spent=torch.where(reached, v.spent.double(), nan),
        q_draft=torch.where(reached, 1.0, nan),
        accept_prob=torch.where(reached, passed.double(), nan),
        u=nan,
        j_star=torch.where(reached, v.j_star, 0),
        accepted=reached & passed,
        reached=reached,
    )
    return dict(m=m, path=path * act[:, None], next=torch.where(act, nxt, 0), kind=kind * act, **rec)


_NODE_COLUMNS = ("token", "p_draft", *_TRIALS, "j_star", "accepted", "reached", "committed", "p_top1", "p_entropy")
_NODE_COLUMNS += ("q_top1", "node", "parent", "depth", "sibling", "draft")


def _tree_host(trees: _Trees, p: torch.Tensor, walk: dict) -> dict:
    """The step's outcomes and per-column draft records moved to the CPU in one transfer.

    Per image (B,) int64: m, kind, next, drafted, forwards; per column (B, T) numpy: the
    :data:`_NODE_COLUMNS` (``draft``: the column is a draft; node / parent: one-image node
    numbers; p_draft, p_top1, p_entropy: the target at the node's parent; q_top1: the drafter's
    top probability there, NaN for dynamic trees) as :func:`lantern.tree_decoding.tree_draft_columns`
    computes them."""
    B, T, V = p.shape
    nodes, parent = trees.nodes, trees.parent
    number = trees.exists.long().cumsum(1) - 1
    committed = torch.zeros(B, T, dtype=torch.bool, device=p.device)
    steps = torch.arange(walk["path"].shape[1], device=p.device)
    committed.scatter_(1, walk["path"], (steps > 0) & (steps <= walk["m"][:, None]))
    nan = torch.full((B, T), float("nan"), device=p.device)
    cols = dict(
        token=trees.tokens,
        p_draft=p.reshape(B, T * V).gather(1, parent * V + trees.tokens),  # p at the parent, of the draft
        **{c: walk[c] for c in (*_TRIALS, "j_star", "accepted", "reached")},
        committed=committed & nodes,
        p_top1=p.amax(-1).gather(1, parent),
        p_entropy=-(torch.xlogy(p, p)).sum(-1).gather(1, parent),
        q_top1=trees.q.amax(-1).gather(1, parent) if trees.q is not None else nan,
        node=number,
        parent=number.gather(1, parent),
        depth=trees.depth,
        sibling=trees.rank,
        draft=nodes,
    )
    per_image = [walk["m"], walk["kind"], walk["next"], nodes.sum(1), trees.forwards]
    flat = torch.cat([torch.stack(per_image, 1).double(), *(cols[c].double() for c in _NODE_COLUMNS)], 1).cpu().numpy()
    host = {c: flat[:, i].astype(np.int64) for i, c in enumerate(("m", "kind", "next", "drafted", "forwards"))}
    for i, c in enumerate(_NODE_COLUMNS):
        host[c] = flat[:, 5 + i * T : 5 + (i + 1) * T]
    return host


def _tree_draft_columns(host: dict, active, n, images, steps) -> Optional[dict]:
    """The step's draft rows (one per draft of every active image's tree; see
    :data:`lantern.records.DRAFT_COLUMNS`) from the (B, T) host columns of :func:`_tree_host`."""
    keep = (host["draft"] > 0) & np.asarray(active, dtype=bool)[:, None]
    if not keep.any():
        return None
    b = np.nonzero(keep)[0]
    cols = {c: host[c][keep] for c in _NODE_COLUMNS if c != "draft"}
    cols["image"], cols["step"] = np.asarray(images)[b], np.asarray(steps)[b]
    cols["draft_index"] = cols["depth"] - 1
    cols["position"] = np.asarray(n)[b] + cols["draft_index"]
    rows = _tree_rows(cols)
    rows["out_of_support"] = rows["committed"] & (rows["p_draft"] == 0)
    return rows


def _commit_paths(
    st: _Batch, n, m, path: torch.Tensor, nxt: torch.Tensor, vin: torch.Tensor, hidden: torch.Tensor
) -> None:
    """Commit every image's accepted path and next token, vectorised over images: tokens, target
    features and the target's keys/values of the accepted path move behind the committed tokens
    (:meth:`~ambiguity.models.base.TokenModel.move_slots`, one indexed copy for all images).

    m (B,) int64 numpy (accepted drafts); path (B, >= max m + 1) int64 and nxt (B,) int64 on the
    device, of :func:`_walk_trees`; vin (B, T) int64 node tokens and hidden (R, T, H) of
    :func:`_verify_trees`. Writes ``x_{n_b}..x_{n_b+m_b}`` into st.tokens and
    ``h_{n_b-1}..h_{n_b+m_b-1}`` into st.feats (slots ``n_b..n_b+m_b``)."""
    dev, B, H, guided = st.device, st.B, st.H, st.guided
    M = int(m.max()) + 1
    keep = torch.as_tensor(np.arange(M)[None] <= m[:, None], device=dev)  # root, accepted nodes, next token
    path_t = path[:, :M]
    n_t = torch.as_tensor(n, device=dev)
    dest = n_t[:, None] + torch.arange(M, device=dev)
    cand = torch.cat([vin.gather(1, path_t[:, 1:]), vin.new_zeros(B, 1)], 1)
    cand.scatter_(1, torch.as_tensor(m, device=dev)[:, None], nxt[:, None])
    st.tokens.scatter_(1, dest, torch.where(keep, cand, st.tokens.gather(1, dest)))
    dest_r = expand_rows(dest, guided)[..., None].expand(-1, -1, H)
    hid = hidden.gather(1, expand_rows(path_t, guided)[..., None].expand(-1, -1, H))  # h_{n-1}..h_{n+m-1}
    st.feats.scatter_(1, dest_r, torch.where(expand_rows(keep, guided)[..., None], hid, st.feats.gather(1, dest_r)))
    if M > 1:  # the accepted nodes' keys/values move behind the committed tokens (slots n_b ..)
        moved = keep[:, 1:]
        dst = n_t[:, None] - 1 + torch.arange(1, M, device=dev)
        src = torch.where(moved, n_t[:, None] - 1 + path_t[:, 1:], dst)
        st.model.move_slots(st.cache, expand_rows(src, guided), expand_rows(dst, guided))


def _to_host(res, p, q, drafts, gmax: int, greedy: bool) -> dict:
    """The step's accepted lengths, next tokens and kinds and its (B, γ) draft columns as numpy
    arrays, moved to the CPU in one transfer."""
    cols = [res.accepted, res.next_token, res.next_kind]
    names = ["a", "next", "kind"]
    B = drafts.shape[0]
    parts = [torch.stack(cols, 1).double()]
    if gmax:
        v, pg = res.verdict, p[:, :gmax]
        u = res.u if res.u is not None else torch.full_like(v.p_draft, float("nan"))
        draft = {
            "token": drafts,
            "p_draft": v.p_draft,
            "q_draft": q.gather(-1, drafts[..., None])[..., 0],
            "p_tilde": v.p_tilde,
            "j_star": v.j_star,
            "spent": v.spent,
            "accept_prob": v.accept_prob,
            "u": u,
            "accepted": v.accepted,
            "p_top1": top1_prob(pg),
            "p_entropy": entropy(pg),
            "q_top1": top1_prob(q),
        }
        parts += [x.double() for x in draft.values()]
    flat = torch.cat([x.reshape(B, -1) for x in parts], 1).cpu().numpy()
    host = {name: flat[:, i].astype(np.int64) for i, name in enumerate(names)}
    for i, name in enumerate(["token", *_FLOAT_DRAFT] if gmax else []):
        host[name] = flat[:, 3 + i * gmax : 3 + (i + 1) * gmax]
    return host
