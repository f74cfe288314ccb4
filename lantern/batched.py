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
verified in one target forward (padded to the largest node count; node ``t`` of image ``b`` at
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
coins and next token from the image's :class:`lantern.trees.GeneratorDraws`.

Vectorised over images: drafting, verification, acceptance (:func:`lantern.chain.accept` with
per-row lengths), residual sampling and the commits are tensor operations over all slots; the
per-image Python work is one ``torch.rand`` call per image's generator (each image owns a stream)
and record keeping. One host transfer per step brings the accepted lengths and the step's
records to the CPU (plus none for the tokens: they stay on the device until the end).
Trees are vectorised in their forwards (one drafter forward per tree level for all images, one
target forward) and in the commit; per-image Python loops remain where one-image tree decoding
has them: building each tree (its top-k / draws without replacement, the per-level node lists),
the verification walk (:func:`lantern.tree_decoding.walk_tree`: sibling trials, residuals) and
the per-node draft records, each with its own small host transfers (several per step, not one).

Timing: a step's seconds per section (target, drafter, acceptance, proximity; wall-clock) are
split equally among the images active in it, and a prefill's among the images it admitted;
``total_s`` of an image is its share of every step's wall time. Step rows carry ``batch_step``
and ``active`` (:mod:`lantern.records`).
"""

from __future__ import annotations

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
from lantern.acceptance import AcceptanceRule, judge
from lantern.chain import accept
from lantern.drafter import DraftModel
from lantern.records import DRAFT_COLUMNS, NEXT_KINDS, STEP_COLUMNS, Decoded, _tree_rows
from lantern.steps import Timer, elapsed_since, target_distribution
from lantern.tree_decoding import tree_draft_columns, walk_tree
from lantern.trees import Draws, GeneratorDraws, TreeSpec, tree_steps

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

    def draws_of(self, slot: int) -> Draws:
        """The slot's :class:`lantern.trees.Draws` (tree drafting and walking): the scripted one, or its
        image's generator (one float64 uniform per coin or categorical draw, as one-image decoding)."""
        return self.scripted[slot] if self.scripted[slot] is not None else GeneratorDraws(self.gens[slot], self.device)

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


def _tree_round(st: _Batch, n, d, active, images, steps):
    """One batch step of draft trees: every active slot drafts its own tree (:func:`_draft_trees`),
    one target forward verifies all trees (:func:`_verify_trees`), each image walks its tree
    (:func:`_walk_trees`) and commits its accepted path (:func:`_commit_paths`).

    n, d: (B,) int64 committed tokens and drafter positions per slot; active: (B,) bool;
    images / steps: the image index and step number of each slot. Returns accepted (B,), drafted
    (B,), kind (B,) index into NEXT_KINDS, next token (B,), drafter forwards (B,), the draft columns
    of the step (None when no image drafted) and the new drafter positions d (B,).
    """
    drafting = active & (n < st.N - 1)  # an image with one token left verifies its root alone
    draws = [st.streams.draws_of(b) if active[b] else None for b in range(st.B)]
    trees: list = [None] * st.B
    if drafting.any():
        with st.timer("drafter"):
            trees = _draft_trees(st, n, d, drafting, draws)
    with st.timer("target"):
        vin, out = _verify_trees(st, n, trees)
    with st.timer("acceptance"):
        m, path, kind, nxt, draft_cols = _walk_trees(st, n, active, trees, draws, out.logits, images, steps)
        _commit_paths(st, n, m, path, nxt, vin, out.hidden)
    drafted = np.array([len(t) - 1 if t is not None else 0 for t in trees])
    forwards = np.array([t.forwards if t is not None else 0 for t in trees])
    return m, drafted, kind, nxt, forwards, draft_cols, np.where(drafting, n, d)


def _draft_trees(st: _Batch, n, d, drafting, draws) -> list:
    """Every drafting slot's draft tree; returns a list of B :class:`lantern.trees.Tree` (None where
    a slot does not draft). draws: the B slots' :class:`lantern.trees.Draws` (None for empty slots).

    One drafter forward over the pending positions (:func:`_pending`) gives each root's feature;
    then every image's tree drafter (:func:`lantern.trees.tree_steps`, a generator) asks for its
    next level of nodes, and the levels of all images run in one ``forward_slots`` (padded to the
    widest; an image's nodes sit at its own drafter slots ``n_b, n_b + 1, ..`` in the order
    one-image decoding appends them, and see its committed positions and their tree ancestors).
    The drafter's tree entries are simply left behind (recomputed from true features next round,
    as :func:`lantern.tree_decoding.tree_decode` rolls its drafter cache back)."""
    dev, B, H, guided = st.device, st.B, st.H, st.guided
    rows = [[b, b + B] if guided else [b] for b in range(B)]
    trees: list = [None] * B
    f_root = _pending(st, n, d, drafting)  # (R, 1, H)
    root_q = st.target(st.drafter.logits(st.model, f_root)[:, -1])  # (B, V)
    root_tok = st.tokens.gather(1, torch.as_tensor(n - 1, device=dev)[:, None])[:, 0].tolist()
    gens, asks = {}, {}
    for b in np.flatnonzero(drafting):
        room = st.N - 1 - int(n[b])
        gens[b] = tree_steps(
            st.spec, root_tok[b], f_root[rows[b]], root_q[b], int(n[b]), room, st.sampling.greedy, draws[b], dev
        )
        try:
            asks[b] = next(gens[b])
        except StopIteration as done:
            trees[b] = done.value
    used = np.zeros(B, dtype=np.int64)  # drafter slots the tree nodes took after n_b
    while asks:
        F = max(len(a.tokens) for a in asks.values())
        L = n + used
        S = int(L.max()) + F
        toks = np.zeros((B, F), dtype=np.int64)
        pos = np.repeat((n - 1)[:, None], F, 1)
        slots = L[:, None] + np.arange(F)[None]
        vis = np.zeros((B, F, S), dtype=bool)
        vis[np.arange(B)[:, None], np.arange(F)[None], slots] = True  # padding sees itself
        pf = f_root.new_zeros(len(f_root), F, H)
        for b, a in asks.items():
            k = len(a.tokens)
            toks[b, :k] = a.tokens
            pos[b] += a.depth
            vis[b, :k, : L[b] + k] = a.visible(int(L[b])).numpy()
            pf[rows[b], :k] = a.parent_f
        pos = np.minimum(pos, st.N - 1)
        out = st.drafter.forward_slots(
            st.model, st.on_rows(toks), pf, st.dcache, st.on_rows(slots), st.on_rows(pos), st.on_rows(vis)
        )
        q = st.target(st.drafter.logits(st.model, out))  # (B, F, V)
        for b, a in list(asks.items()):
            k = len(a.tokens)
            try:
                asks[b] = gens[b].send((out[rows[b], :k], q[b, :k], int(L[b])))
            except StopIteration as done:
                trees[b] = done.value
                del asks[b]
            used[b] += k
    return trees


def _verify_trees(st: _Batch, n, trees: list):
    """One target forward over every slot's tree; returns the node tokens (B, T) int64 on the
    device (node 0: the root ``x_{n_b-1}``) and the :class:`~ambiguity.models.base.Step` (R, T, .).

    Node t of image b sits at cache slot ``n_b - 1 + t`` (the root at slot ``n_b - 1``), image
    position ``n_b - 1 + depth_t``, and sees slots ``0..n_b-2`` and its ancestors; trees are padded
    to the largest node count T (padding sees the committed slots and itself; its outputs are unused
    and its cache entries never seen). A slot without a tree (one token left, or empty) verifies
    its root alone (a plain target step)."""
    dev, B = st.device, st.B
    T = max(len(t) if t is not None else 1 for t in trees)
    node_tok = np.zeros((B, T), dtype=np.int64)
    depth = np.zeros((B, T), dtype=np.int64)
    S = int(n.max()) - 1 + T
    slots = (n - 1)[:, None] + np.arange(T)[None]
    vis = np.arange(S)[None, None, :] < (n - 1)[:, None, None]  # committed x_0..x_{n_b-2}
    vis = np.broadcast_to(vis, (B, T, S)).copy()
    vis[np.arange(B)[:, None], np.arange(T)[None], slots] = True  # every node sees itself
    for b, t in enumerate(trees):
        if t is not None:
            k = len(t)
            node_tok[b, 1:k] = t.tokens[1:].tolist()
            depth[b, :k] = t.depths
            vis[b, :k, n[b] - 1 : n[b] - 1 + k] = t.ancestors().numpy()
    vin = torch.as_tensor(node_tok, device=dev)
    vin[:, 0] = st.tokens.gather(1, torch.as_tensor(n - 1, device=dev)[:, None])[:, 0]
    pos = np.minimum((n - 1)[:, None] + depth, st.N - 1)
    rows = expand_rows(vin, st.guided)
    out = st.model.extend_slots(st.cache, rows, st.on_rows(slots), st.on_rows(pos), st.on_rows(vis))
    return vin, out


def _walk_trees(st: _Batch, n, active, trees: list, draws, logits: torch.Tensor, images, steps):
    """Every active image's acceptance walk over its tree (:func:`lantern.tree_decoding.walk_tree`,
    per image in Python, with its own Draws; a slot without a tree draws its next token from the
    target at its root) and the step's per-node draft records.

    logits: (R, T, V) float32 of :func:`_verify_trees`. Returns accepted m (B,) int64, path (B, T)
    int64 (node indices of the root and the accepted nodes, ``path[b, :m_b + 1]``), kind (B,)
    index into NEXT_KINDS, next token (B,) int64 and the draft columns (None when no image drafted).
    """
    B, greedy = st.B, st.sampling.greedy
    p = st.target(logits)  # (B, T, V)
    path = np.zeros((B, p.shape[1]), dtype=np.int64)
    m = np.zeros(B, dtype=np.int64)
    kind = np.zeros(B, dtype=np.int64)
    nxt = np.zeros(B, dtype=np.int64)
    cols = []
    for b in np.flatnonzero(active):
        if trees[b] is None:  # one token left: a plain target step
            nxt[b] = int(p[b, 0].argmax()) if greedy else draws[b].categorical(p[b, 0])
            continue
        k = len(trees[b])
        outcome = walk_tree(trees[b], p[b, :k], st.rule, st.table, greedy, draws[b], st.timer)
        m[b] = len(outcome.path) - 1
        path[b, : m[b] + 1] = outcome.path
        kind[b], nxt[b] = NEXT_KINDS.index(outcome.kind), outcome.token
        c = tree_draft_columns(trees[b], p[b, :k], outcome, int(n[b]))
        c["image"], c["step"] = np.full(k - 1, images[b]), np.full(k - 1, steps[b])
        cols.append(c)
    if not cols:
        return m, path, kind, nxt, None
    draft_cols = _tree_rows({c: np.concatenate([x[c] for x in cols]) for c in cols[0]})
    draft_cols["out_of_support"] = draft_cols["committed"] & (draft_cols["p_draft"] == 0)
    return m, path, kind, nxt, draft_cols


def _commit_paths(st: _Batch, n, m, path, nxt, vin: torch.Tensor, hidden: torch.Tensor) -> None:
    """Commit every image's accepted path and next token, vectorised over images: tokens, target
    features and the target's keys/values of the accepted path move behind the committed tokens
    (:meth:`~ambiguity.models.base.TokenModel.move_slots`, one indexed copy for all images).

    m, path, nxt: of :func:`_walk_trees`; vin (B, T) int64 node tokens and hidden (R, T, H) of
    :func:`_verify_trees`. Writes ``x_{n_b}..x_{n_b+m_b}`` into st.tokens and
    ``h_{n_b-1}..h_{n_b+m_b-1}`` into st.feats (slots ``n_b..n_b+m_b``)."""
    dev, B, H, guided = st.device, st.B, st.H, st.guided
    M = int(m.max()) + 1
    keep = torch.as_tensor(np.arange(M)[None] <= m[:, None], device=dev)  # root, accepted nodes, next token
    path_t = torch.as_tensor(path[:, :M], device=dev)
    n_t = torch.as_tensor(n, device=dev)
    dest = n_t[:, None] + torch.arange(M, device=dev)
    cand = torch.cat([vin.gather(1, path_t[:, 1:]), vin.new_zeros(B, 1)], 1)
    cand.scatter_(1, torch.as_tensor(m, device=dev)[:, None], torch.as_tensor(nxt, device=dev)[:, None])
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
