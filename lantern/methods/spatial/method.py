"""Row-parallel decoding of an image grid: ZipAR and PJD, several rows of one image per target forward.

* ``"zipar"`` — ZipAR (He et al., ICML 2025, arXiv 2412.04062; official code
  github.com/ThisisBillhe/ZipAR, ``LlamaGen-ZipAR/autoregressive/models/generate_zipar.py``):
  "next-set" prediction. The first row is decoded token by token; row ``r + 1`` (``r >= 1``) starts
  once row ``r`` has ``s`` committed tokens (the local window, official 8); every forward then
  draws one token for every active row. A token at cell ``(r, c)`` is predicted from its left
  neighbour ``x_(r, c-1)`` at that cell's position, attending to every committed token before it
  in raster order (its own row's left part and the rows above as far as they have got). The first
  token of a row ``r >= 2`` has no left neighbour yet: as in the official code, the forward reads
  an auxiliary input at the position of ``(r - 1, W - 1)`` whose token is the newest committed
  token of row ``r - 2``; when row ``r - 1`` is already complete (``s = W``, or row 1) the true
  ``x_(r-1, W-1)`` is read instead, so ``s = W`` is AR decoding. ``adaptive`` is the paper's
  adaptive window (its text; the official code lacks it, ZipAR issue #3): the first token of a
  new row, drawn at the minimum window ``s``, is a *draft* ``d ~ q``; every later forward re-predicts
  the cell with the larger context (``p``) and accepts ``d`` with ``min(1, p(d)/q(d))``; a rejection
  draws ``d' ~ norm(max(p - q, 0))``, which becomes the draft (``q = p``) for the next forward, and
  once the row above is complete (the context AR would give) a rejection's draw is committed. An
  accepted ``d`` is fed in the same forward, so its right neighbour is drawn at once. A check that
  reads the whole row above is speculative sampling against the AR conditional (exact); an earlier
  one judges a re-drawn start with the ``q`` it was last checked against, though it came from the
  residual, so the committed start follows no single context's law (the tests enumerate it).
* ``"pjd"`` — Parallel Jacobi Decoding (Liao et al., CVPR 2026, arXiv 2606.05703; project page
  boyaliao.github.io/PJD): every active row runs its own Jacobi window of ``L`` tokens (the row's
  last committed token and ``L - 1`` drafts, SJD's rule: a draft drawn from ``q`` is accepted with
  ``min(1, p/q)``, the first rejection draws from ``norm(max(p - q, 0))``, the bonus from ``p``
  after a fully accepted window, this forward's samples at the later positions become the next
  drafts, new positions get a uniform random token); row ``r + 1`` starts once row ``r`` has
  ``offset`` committed tokens. The row-causal mask: a row's tokens see the committed tokens before
  them in raster order and their own row's drafts before them, never another row's drafts. Where
  the paper's text was not available to us (the defaults, the first token of a row), the choices
  are ours: window 8, offset 8, random initial drafts, and a new row's first input is the newest
  committed token of the row above at the position of ``(r - 1, W - 1)``. With ``offset = W`` rows
  run one after another and PJD is SJD within each row: lossless.

Neither is lossless in general: a token is drawn from the target conditioned on less than its
raster prefix (the unfinished part of the rows above is missing). The tests enumerate every
outcome on a 3 x 3 grid and give the exact joint of an image against AR's.

Both run on the engine (:mod:`lantern.engine.loop`): each image keeps its committed-cell mask and
feeds its tokens at cache slot = raster position (the auxiliary input at slot ``N``, padding at
``N + 1``) through ``model.extend_slots`` with a visibility mask built from that mask; ``st.tokens``
stays in raster order and ``st.n`` counts committed cells. Randomness: image ``i`` draws from its
generator ``(seed, i)`` in a fixed order (rows top to bottom), so in float64 the tokens do not
depend on the batch size. Greedy decoding (temperature 0) takes argmaxes: ZipAR with ``s = W`` and
PJD with ``offset = W`` give greedy AR's tokens; otherwise the tokens differ from greedy AR's where
the missing context changes an argmax.

Records: a step row per forward (``accepted`` = cells committed - 1, ``drafted`` = drafts fed);
a draft row per draft fed (PJD's window drafts, ``reached`` False after its row's first rejection;
ZipAR's adaptive row starts) with ``position`` = its raster cell, ``depth`` = its place in the
row's window, ``sibling`` = its grid row and ``proposed_step`` = the forward that drew it (-1: a
random initial draft).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ambiguity.sampling import expand_rows
from ambiguity.stats import entropy, top1_prob
from lantern.engine.method import Method, Round
from lantern.engine.records import DRAFT_COLUMNS
from lantern.engine.slots import BatchState, GeneratorDraws
from lantern.methods.spatial.config import SpatialConfig
from lantern.rules.jacobi import sjd_accept_prob, sjd_residual

__all__ = ["RowParallel"]


class _Canvas:
    """One image's grid: committed cells (``done``), cells whose keys/values are in the cache
    (``cached``), tokens per row (``count``), started rows, PJD's per-row drafts and ZipAR's
    adaptive row starts. :meth:`plan` lays out one forward's inputs, :meth:`judge` reads its
    distributions and commits. Host state only: no device sync to plan a forward."""

    def __init__(self, config: SpatialConfig, grid: tuple, V: int, greedy: bool, draws, device):
        self.config, (self.H, self.W), self.V = config, (int(grid[0]), int(grid[1])), V
        self.N, self.greedy, self.draws, self.device = self.H * self.W, greedy, draws, device
        self.x = [0] * self.N
        self.done, self.cached = np.zeros(self.N, dtype=bool), np.zeros(self.N, dtype=bool)
        self.count, self.started = np.zeros(self.H, dtype=np.int64), np.zeros(self.H, dtype=bool)
        self.window: dict[int, list] = {}  # PJD: row -> [(token, q or None, proposed step)]
        self.tentative: dict[int, tuple] = {}  # ZipAR adaptive: row -> (token, q, proposed step)
        self.step = 0

    def draw(self, p: torch.Tensor) -> int:
        return int(p.argmax()) if self.greedy else int(self.draws.categorical(p))

    def commit(self, cell: int, token: int, cached: bool = False) -> None:
        self.x[cell], self.done[cell], self.cached[cell] = int(token), True, cached
        self.count[cell // self.W] += 1

    def start(self, p0: torch.Tensor) -> int:
        """The first token from the prefill's distribution p0 (V,)."""
        self.commit(0, self.draw(p0))
        self.started[0] = True
        return self.x[0]

    # ------------------------------------------------------------------ one forward's layout
    def _activate(self) -> None:
        """Start the first unstarted row once the row above has enough tokens (ZipAR: row 1 after
        the whole first row, as the official code)."""
        cfg = self.config
        for r in range(1, self.H):
            if not self.started[r]:
                need = self.W if (cfg.method == "zipar" and r == 1) else cfg.start_after
                self.started[r] = self.count[r - 1] >= need
                return

    def _aux_token(self, r: int) -> int:
        """A new row's stand-in for ``x_(r-1, W-1)``: the newest token of row r - 2 (ZipAR, the
        official code) or of row r - 1 (PJD, our choice)."""
        src = r - 2 if self.config.method == "zipar" and r >= 2 else r - 1
        return self.x[src * self.W + int(self.count[src]) - 1]

    def _drafts(self, r: int) -> list:
        """The row's drafts for this forward: PJD's window (shrunk so the bonus stays in the row,
        topped up with uniform random tokens), ZipAR's adaptive row start, or none."""
        if self.config.method == "zipar":
            return [self.tentative[r]] if r in self.tentative else []
        g = min(self.config.draft_depth, self.W - 1 - int(self.count[r]))
        w = self.window.get(r, [])[:g]
        uniform = torch.ones(self.V, dtype=torch.float64, device=self.device)
        while len(w) < g:
            w.append((self.draw(uniform) if not self.greedy else 0, None, -1))
        self.window[r] = w
        return w

    def plan(self) -> tuple[list, list]:
        """This forward's inputs ``[token, slot, position, extra visible slots]`` (every committed
        token not yet cached, at its own cell; each active row's chain: its anchor, then its drafts)
        and the chains ``(row, input indices, exact)`` (``exact``: the anchor is the true left
        neighbour). Slot ``N`` holds a row start's auxiliary input."""
        self.step += 1
        self._activate()
        inputs, index = [], {}
        for i in np.flatnonzero(self.done & ~self.cached):
            index[int(i)] = len(inputs)
            inputs.append([self.x[i], int(i), int(i), []])
        chains = []
        for r in np.flatnonzero(self.started & (self.count < self.W)):
            r, c0 = int(r), int(self.count[r])
            left = r * self.W + c0 - 1  # the row's left neighbour of its next cell
            exact = bool(self.done[left])
            if not exact:  # a row start before the row above is complete: the auxiliary input
                inputs.append([self._aux_token(r), self.N, left, []])
            chain = [index[left] if exact else len(inputs) - 1]
            for j, (tok, _, _) in enumerate(self._drafts(r)):
                seen = [inputs[k][1] for k in chain]
                inputs.append([tok, left + 1 + j, left + 1 + j, seen])
                chain.append(len(inputs) - 1)
            chains.append((r, chain, exact))
        return inputs, chains

    def visible(self, inputs: list, S: int) -> np.ndarray:
        """(T, S) bool: input t sees the committed cells before or at its position, its own slot
        and its chain's earlier inputs (the row-causal mask)."""
        pos = np.asarray([p for _, _, p, _ in inputs])
        vis = np.zeros((len(inputs), S), dtype=bool)
        vis[:, : self.N] = self.done[None, :] & (np.arange(self.N)[None, :] <= pos[:, None])
        for t, (_, slot, _, extra) in enumerate(inputs):
            vis[t, [slot, *extra]] = True
        return vis

    # ------------------------------------------------------------------ after the forward
    def judge(self, p: torch.Tensor, inputs: list, chains: list) -> tuple[list, int, int, int, list]:
        """Read this forward's distributions ``p`` (T, V) (row t: the cell after input t) row by
        row, top to bottom; commit. Returns the committed cells, the drafts fed (judged, and PJD's
        drafts after a rejection), the kind and token of the top row's last commit and the draft
        records."""
        fed = [slot for _, slot, _, _ in inputs if slot < self.N and self.done[slot]]
        self.cached[fed] = True
        before, judged, top = set(np.flatnonzero(self.done).tolist()), [], None
        for r, chain, exact in chains:
            row = self._zipar_row if self.config.method == "zipar" else self._pjd_row
            kind, token = row(p, r, chain, exact, judged)
            top = (kind, token) if top is None else top
        cells = sorted(set(np.flatnonzero(self.done).tolist()) - before)
        return cells, len(judged), int(top[0]), int(top[1]), judged

    def _verdict(self, p: torch.Tensor, q: torch.Tensor, token: int) -> tuple[bool, dict]:
        """Judge a draft drawn from q against p: min(1, p/q) with one coin (greedy: is it the argmax)."""
        if self.greedy:
            prob = float(token == int(p.argmax()))
            ok, u = prob >= 1.0, float("nan")
        else:
            prob = float(sjd_accept_prob(p, q, torch.tensor(token, device=p.device)))
            ok = bool(self.draws.coin(prob))
            u = float(getattr(self.draws, "last_u", float("nan")))
        cols = self._summary(p, q, token)
        cols.update(accept_prob=prob, u=u, accepted=ok)
        return ok, cols

    @staticmethod
    def _summary(p: torch.Tensor, q: torch.Tensor, token: int) -> dict:
        """A draft's probabilities and the ambiguity of p and q there."""
        return dict(
            token=token,
            p_draft=float(p[token]),
            q_draft=float(q[token]),
            p_top1=float(top1_prob(p)),
            p_entropy=float(entropy(p.double())),
            q_top1=float(q.max()),
        )

    def _record(self, judged: list, cols: dict, cell: int, depth: int, proposed: int) -> None:
        cols.update(position=cell, depth=depth, sibling=cell // self.W, proposed_step=proposed)
        judged.append(cols)

    def _zipar_row(self, p: torch.Tensor, r: int, chain: list, exact: bool, judged: list) -> tuple[int, int]:
        """One ZipAR row: draw its next cell; an adaptive row start is drafted, then re-judged."""
        cell = r * self.W + int(self.count[r])
        pa = p[chain[0]]
        if len(chain) == 1:
            token = self.draw(pa)
            if self.config.adaptive and not exact and cell % self.W == 0:
                self.tentative[r] = (token, pa, self.step)  # the row start is a draft (q = pa)
            else:
                self.commit(cell, token)
            return 0, token
        token, q, proposed = self.tentative.pop(r)
        ok, cols = self._verdict(pa, q, token)
        self._record(judged, cols, cell, 1, proposed)
        if ok:  # fed in this forward: its right neighbour is drawn from its own prediction
            self.commit(cell, token, cached=True)
            if self.count[r] < self.W:
                self.commit(cell + 1, self.draw(p[chain[1]]))
            return 1, self.x[cell + int(self.count[r] > 1)]
        again = int(pa.argmax()) if self.greedy else int(self.draws.categorical(sjd_residual(pa, q)))
        if exact:
            self.commit(cell, again)
        else:
            self.tentative[r] = (again, pa, self.step)
        return 2, again

    def _pjd_row(self, p: torch.Tensor, r: int, chain: list, exact: bool, judged: list) -> tuple[int, int]:
        """One PJD row: SJD on its window (judge left to right, commit the accepted prefix and the
        residual or bonus token, this forward's later samples become the next drafts)."""
        base, window, g = r * self.W + int(self.count[r]), self.window.get(r, []), len(chain) - 1
        qs = [q if q is not None else _point(self.V, t, p) for t, q, _ in window[:g]]
        a = g
        for j in range(g):
            ok, cols = self._verdict(p[chain[j]], qs[j], window[j][0])
            self._record(judged, cols, base + j, j + 1, window[j][2])
            if not ok:
                a = j
                break
        for j in range(a + 1, g):  # after the first rejection: fed, not judged
            cols = self._summary(p[chain[j]], qs[j], window[j][0])
            cols.update(accept_prob=float("nan"), u=float("nan"), accepted=False, reached=False)
            self._record(judged, cols, base + j, j + 1, window[j][2])
        for j in range(a):
            self.commit(base + j, window[j][0], cached=True)
        if a < g:
            pa = p[chain[a]]
            token = int(pa.argmax()) if self.greedy else int(self.draws.categorical(sjd_residual(pa, qs[a])))
            kind = 2
        else:
            token, kind = self.draw(p[chain[g]]), (1 if g else 0)
        self.commit(base + a, token)
        self.window[r] = [(self.draw(p[chain[j]]), p[chain[j]], self.step) for j in range(a + 1, g + 1)]
        return kind, token


def _point(V: int, token: int, like: torch.Tensor) -> torch.Tensor:
    """A point mass (V,) at ``token`` (the q of a random initial draft)."""
    return torch.zeros(V, dtype=like.dtype, device=like.device).index_fill_(
        0, torch.tensor([token], device=like.device), 1.0
    )


def _forward(st: BatchState, plans: dict) -> torch.Tensor:
    """One target forward over every live image's planned inputs (padded to the longest: token 0
    at the padding slot ``N + 1``, seeing only itself). Returns p (B, T, V)."""
    N, S = st.N, st.N + 2
    T = max(len(inputs) for inputs, _, _ in plans.values())
    tokens = np.zeros((st.B, T), dtype=np.int64)
    slots = np.full((st.B, T), N + 1, dtype=np.int64)
    positions = np.zeros((st.B, T), dtype=np.int64)
    visible = np.zeros((st.B, T, S), dtype=bool)
    visible[:, :, N + 1] = True
    for b, (inputs, _, canvas) in plans.items():
        k = len(inputs)
        tokens[b, :k], slots[b, :k], positions[b, :k] = zip(*[(t, s, q) for t, s, q, _ in inputs])
        visible[b, :k] = canvas.visible(inputs, S)
    dev = st.device
    rows = [expand_rows(torch.as_tensor(x, device=dev), st.guided) for x in (tokens, slots, positions, visible)]
    out = st.model.extend_slots(st.cache, *rows)
    return st.target(out.logits)


def _draft_table(rows: list) -> Optional[dict]:
    """The :data:`~lantern.engine.records.DRAFT_COLUMNS` of one round's judged drafts (None: none)."""
    if not rows:
        return None
    ints = ("image", "step", "draft_index", "position", "token", "j_star", "node", "parent", "depth", "sibling")
    bools = ("accepted", "reached", "committed", "out_of_support")
    for row in rows:
        row.update(p_tilde=row["p_draft"], j_star=0, spent=0.0, reached=row.get("reached", True))
        row.update(committed=bool(row["accepted"]), out_of_support=bool(row["accepted"]) and row["p_draft"] == 0)
        row.update(node=row["depth"], parent=row["depth"] - 1)
    out = {}
    for c in DRAFT_COLUMNS:
        dtype = np.int64 if c in ints or c == "proposed_step" else (bool if c in bools else np.float64)
        out[c] = np.asarray([row[c] for row in rows], dtype=dtype)
    return out


class RowParallel(Method):
    """ZipAR or PJD on the engine (module docstring): every live image's rows in one target forward.

    config: the :class:`~lantern.methods.spatial.config.SpatialConfig` (checked against the model by
    :func:`~lantern.methods.spatial.config.check_spatial`); grid: the model's token grid (h, w).
    """

    spare = 2  # slot N: a row start's auxiliary input; slot N + 1: padding

    def __init__(self, config: SpatialConfig, grid: tuple):
        self.config, self.grid = config, tuple(int(g) for g in grid)
        self.name, self.depth = config.method, config.draft_depth
        self.images: dict[int, _Canvas] = {}  # slot -> its image's grid

    def start(self, st: BatchState, slots: list[int], p0: torch.Tensor) -> torch.Tensor:
        first = []
        for r, s in enumerate(slots):
            draws = st.streams.scripted[s] or GeneratorDraws(st.streams.gens[s], st.device)
            canvas = _Canvas(self.config, self.grid, p0.shape[-1], st.sampling.greedy, draws, st.device)
            first.append(canvas.start(p0[r]))
            self.images[s] = canvas
        return torch.tensor(first, dtype=torch.long, device=st.device)

    def round(self, st: BatchState, active: np.ndarray) -> Round:
        live = np.flatnonzero(active).tolist()
        with st.timer("acceptance"):
            plans = {b: (*self.images[b].plan(), self.images[b]) for b in live}
        with st.timer("target"):
            p = _forward(st, plans)
        B = st.B
        a, g, kind, nxt = (np.zeros(B, dtype=np.int64) for _ in range(4))
        rows = []
        with st.timer("acceptance"):
            for b in live:
                inputs, chains, canvas = plans[b]
                cells, g[b], kind[b], nxt[b], judged = canvas.judge(p[b, : len(inputs)], inputs, chains)
                assert cells, "the top active row commits a cell every forward"
                a[b] = len(cells) - 1
                st.tokens[b, cells] = torch.tensor([canvas.x[c] for c in cells], device=st.device)
                rows += [
                    dict(r, image=int(st.image[b]), step=int(st.step[b]), draft_index=k) for k, r in enumerate(judged)
                ]
        return Round(a, g, kind, nxt, np.zeros(B, dtype=np.int64), _draft_table(rows))

    def release(self, st: BatchState, slots) -> None:
        for s in slots:
            self.images.pop(int(s), None)

    def compact(self, st: BatchState, live: np.ndarray, rows: torch.Tensor) -> None:
        self.images = {new: self.images[int(old)] for new, old in enumerate(live) if int(old) in self.images}
