"""Batched decoding: many images in flight, one target forward (and one drafter forward) per step for all.

:func:`batched_decode` keeps ``B`` *slots* (:mod:`lantern.slots`); each holds one image at its
own position. A step drafts a chain for every slot, verifies all chains in one target forward,
and lets each image commit its own accepted prefix (ragged acceptance): image ``b`` at ``n_b``
committed tokens drafts ``γ_b = min(γ, N - 1 - n_b)`` tokens and keeps ``a_b + 1`` of them. A
finished image leaves its slot and the next condition is prefilled into it (continuous
batching: :class:`lantern.slots.Slots`), so one slow image never holds the others; once no
condition is left and at most half the slots are busy, the empty slots are dropped from the
caches (one copy), so a draining batch does not compute them. AR decoding is the same step with
γ = 0 and no drafter.

Draft trees (``tree=``: EAGLE-1 static or EAGLE-2 dynamic :class:`lantern.trees.TreeSpec`, both
conventions) take the same slots: each step every image drafts, verifies, walks and commits its
own tree (:func:`lantern.batched_trees.tree_round`; that module says how).

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
:func:`ambiguity.seeding.image_generator` ``(seed, i)`` (:class:`lantern.slots.Streams`) exactly
the numbers one-image decoding draws (the first token, ``γ_b`` draft tokens, ``γ_b`` uniforms,
the next token), whatever the batch, slot or admission step. In float64 the tokens of every image
equal those of batch 1 (``tests/test_batched_decoding.py``); in float32 matrix products over
several rows round differently from one row, which now and then moves a CDF boundary past a
uniform and changes an image from that token on (see the README for the measured fraction of
identical images). The same holds for draft trees (:mod:`lantern.batched_trees`).

Vectorised over images: drafting, verification, acceptance (:func:`lantern.chain.accept` with
per-row lengths), residual sampling and the commits are tensor operations over all slots; the
per-image Python work is one ``torch.rand`` call per image's generator (each image owns a stream)
and record keeping. One host transfer per step brings the accepted lengths and the step's
records to the CPU (plus none for the tokens: they stay on the device until the end).

Timing: a step's seconds per section (target, drafter, acceptance, proximity; wall-clock) are
split equally among the images active in it, and a prefill's among the images it admitted;
``total_s`` of an image is its share of every step's wall time. Step rows carry ``batch_step``
and ``active`` (:mod:`lantern.records`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Optional

import numpy as np
import torch

from ambiguity.models.base import TokenModel
from ambiguity.sampling import SamplingConfig, expand_rows
from ambiguity.seeding import image_seed
from ambiguity.stats import entropy, top1_prob
from lantern.acceptance import AcceptanceRule, judge
from lantern.batched_trees import tree_round
from lantern.chain import accept
from lantern.drafter.model import DraftModel
from lantern.records import DRAFT_COLUMNS, NEXT_KINDS, STEP_COLUMNS, Decoded
from lantern.slots import (
    BatchState,
    Streams,
    admit,
    busy,
    check_batching,
    drain,
    image_indices,
    new_slots,
    pending_features,
    prefill_admitted,
    release,
    verify_chains,
)
from lantern.steps import Timer, elapsed_since, target_distribution
from lantern.tree_spec import TreeSpec

__all__ = ["batched_decode"]

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
    LANTERN rule with a drafter (:class:`lantern.drafter.model.Drafter`) and, for relaxed rules, the
    (V, K >= k) int64 neighbour table; gamma: chain length γ >= 1; image ``first_index + j``
    decodes ``conditions[j]`` with generator ``(seed, first_index + j)`` (or image ``indices[j]``
    when given). draws: {image index: :class:`lantern.trees.Draws`} for images whose coins and
    categorical draws come from that object instead of their generator (exact enumeration in the
    tests; a per-row Python path). tree: a static or dynamic :class:`lantern.trees.TreeSpec` to
    draft trees instead of chains (gamma unused; :func:`lantern.batched_trees.tree_round`), None for chains. Returns a
    :class:`~lantern.records.Decoded` (tokens (images, N) int64 on the CPU, rows in image order,
    records as :func:`lantern.chain.speculative_decode` (trees:
    :func:`lantern.tree_decoding.tree_decode`) writes them plus ``batch_step`` and ``active``).
    Raises UsageError when the model or drafter cannot batch (:func:`check_batching`).
    """
    check_batching(model, drafter if rule is not None else None)
    conds = list(conditions)
    index = image_indices(len(conds), first_index, indices)
    N = int(num_tokens or model.num_tokens)
    spec = tree if rule is not None and tree is not None and tree.kind != "chain" else None
    G = int(gamma) if rule is not None and spec is None else 0
    guided, greedy = sampling.guided, sampling.greedy
    convention = rule.convention if rule is not None else "exact"
    judge_rule = rule if rule is not None else AcceptanceRule("sd")
    table = rule.prepare_table(neighbours, model.vocab_size, model.device) if rule is not None else None
    dev = model.device
    sl = new_slots(len(conds), batch_size, guided, rule.method if rule is not None else "ar", progress)
    B = sl.B
    R = B * (1 + guided)
    spare = spec.nodes if spec is not None else G + 1  # a verified chain or tree beyond the image
    W = N + spare  # positions a row may write: the image plus the padding of one chain or tree
    cache = model.new_slots_cache(B, guided, N, spare)
    dcache = drafter.new_cache(R, G + 1) if G else None
    if spec is not None:  # the tree's drafter nodes after the committed positions, plus one level of padding
        dcache = drafter.new_cache(R, 2 * spec.drafter_nodes + 1)
    timer = Timer(dev)
    streams = Streams(B, dev, draws)
    tokens = torch.zeros(B, W, dtype=torch.long, device=dev)  # tokens[b, i] = x_i of slot b's image
    st = BatchState(model, drafter, cache, dcache, tokens, None, sampling, rule, table, spec, N, timer, streams)
    n, d = np.ones(B, dtype=np.int64), np.zeros(B, dtype=np.int64)  # committed tokens, drafter positions
    step_of = np.zeros(B, dtype=np.int64)
    out_tokens = torch.zeros(len(conds), N, dtype=torch.long, device=dev)
    per_image = {s: np.zeros(len(conds)) for s in _SECTIONS + ("total",)}
    counts = {c: np.zeros(len(conds), dtype=np.int64) for c in ("steps", "drafted", "accepted")}
    records = _Records()

    def fill(free) -> None:
        """Admit the next conditions into the free slots: prefill, then each image's first token."""
        take = admit(sl, free)
        if not take:
            return
        t0, before = time.perf_counter(), timer.snapshot()
        first, slots, rows = prefill_admitted(model, cache, sl, take, conds, timer)
        for s, j in take:
            streams.take(s, seed, int(index[j]))
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

    fill(range(B))
    batch_step = 0
    H = st.H
    ar = torch.arange(W, device=dev)
    while len(busy(sl)):
        batch_step += 1
        t0, before = time.perf_counter(), timer.snapshot()
        image_of = sl.image_of
        active = image_of >= 0
        if spec is not None:
            a_h, g, kind_h, next_h, fwd, cols, d = tree_round(st, n, d, active, index[image_of], step_of + 1)
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
                vin = torch.cat([st.tokens.gather(1, (n_t - 1)[:, None]), drafts], 1)  # x_{n-1} and the drafts
                out = verify_chains(model, cache, vin, n, N, guided)
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
            release(sl, finished)
            for s in finished:
                streams.free(s)
            n[finished], d[finished] = 1, 0
            fill(finished)
        kept = drain(sl, [(model, cache)] + ([(drafter, dcache)] if dcache is not None else []))
        if kept is not None:  # a draining batch dropped its empty slots
            live, rows = kept
            st.tokens, st.feats = st.tokens[torch.as_tensor(live, device=dev)], st.feats[rows]
            n, d, step_of = n[live], d[live], step_of[live]
            streams.keep(live)
            B = sl.B
    sl.bar.close()
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


def _draft(st: BatchState, n, d, g) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft a chain for every slot in ``max(g)`` drafter steps (:func:`lantern.chain.draft`, per row).

    The first forward covers each row's pending positions ``d_b..n_b-1`` (padded to the longest;
    each row's last real output drafts ``x̂_{n_b}``); row b draws only its first ``g_b`` drafts
    from its stream. Returns drafts (B, max g) int64 and q (B, max g, V)."""
    dev, B, guided = st.device, st.B, st.guided
    gmax = int(g.max())
    f = pending_features(st, n, d, g > 0)
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
