"""How much the engine speculates each round, by expected committed tokens per second: the chains'
draft length (``gamma="auto"``, :class:`GammaPolicy`, below), the Jacobi methods' window
(``window="auto"``, :class:`WindowPolicy`) and a dynamic draft tree's node budget (``gamma="auto"``
with a dynamic tree, :class:`NodePolicy`), all on one measured :class:`CostModel`; AR's step where
nothing pays.

A chain of ``G`` drafts commits, per image, the accepted prefix and one more token; with
per-position acceptance probabilities ``a_1, a_2, ..`` the expected accepted drafts are
``sum_{j<=G} prod_{i<=j} a_i`` (a chain stops at its first rejection; Leviathan et al. 2023,
Sec. 3.5, for constant ``a``). The round costs one target forward over ``rows x (1 + G)`` tokens
and ``G`` drafter steps (:class:`CostModel`). :class:`GammaPolicy` picks the ``G`` that maximises
expected committed tokens per second of the round, for all images of the round at once: the
verify forward pads every chain to the longest, so a shorter chain for one image saves nothing
(image ``b`` drafts ``min(G, N - 1 - n_b)``). ``G = 0`` is a plain AR step (no drafter step, no
chain bookkeeping). Where even the predictor's most optimistic acceptance cannot pay for a draft
at the round's batch size (:meth:`GammaPolicy.may_draft`), the round is that AR step and nothing
is computed for the policy: speculation is off at that batch size. After a plan chooses ``G = 0``
the policy rests for 1, 3, then up to 7 plain rounds (:meth:`GammaPolicy.resting`), and a round
after plain ones prices the drafter's catch-up over the positions it has not read
(:meth:`CostModel.catch_up_s`).

Before drafting, ``a`` comes from the target's last distribution of each image (its top-1
probability and entropy, :class:`AcceptancePredictor`, with the drafter's mean top-1 for the
draft not drawn yet); while drafting, each draft's own ``q`` top-1 refines it and the survival
probability ``prod a_i`` so far: drafting stops as soon as no longer chain is expected to be
worth its cost. The draft length depends only on the past and on the drafter's own proposals,
never on the verification of them, so a lossless rule stays exactly lossless (tested by exact
enumeration at δ = 0, ``tests/test_policy.py``). The lengths do depend on the cost model: an image
of a given seed draws its random numbers in other places when its chains have other lengths, so
``gamma="auto"`` reproduces its tokens on a machine with the same cost file (it is measured once
and then read), not across machines.

The cost model is measured on the device in use by a few timed forwards (target forward and
the distribution of its logits; drafter step, head and distribution), calibrated on the engine's
own rounds (a plain AR round and a chain of 2, short decodes taking turns) and cached per (model,
dtype, device, threads, compiled, filter, rule) as JSON under :func:`default_cache_dir`; the
acceptance predictor is a
logistic fit to a drafter's recorded acceptance (the draft records' ``p_top1``, ``p_entropy``,
``q_top1``, ``accepted``) shipped next to the drafter (:func:`predictor_path`), rebuilt by

    python -m lantern.calibrate --model embedded-16
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ambiguity.errors import UsageError
from ambiguity.io import write_json
from ambiguity.sampling import invert
from ambiguity.stats import entropy, top1_prob

__all__ = [
    "AcceptancePredictor",
    "CALIBRATED",
    "CostModel",
    "GammaPolicy",
    "NodePolicy",
    "WindowPolicy",
    "cost_model",
    "window_costs",
    "default_cache_dir",
    "timing_clock",
    "fit_predictor",
    "load_predictor",
    "measure_costs",
    "predictor_path",
    "save_predictor",
]

FEATURES = ("p_top1", "p_entropy", "q_top1", "depth")  # the predictor's inputs (draft-record columns)


# --------------------------------------------------------------------------- acceptance
@dataclass(frozen=True)
class AcceptancePredictor:
    """P(a draft is accepted) = sigmoid(w0 + w1 p_top1 + w2 p_entropy + w3 q_top1 + w4 depth)
    (logistic; depth 1 = the chain's first draft).

    weights: the 5 coefficients (a file of 4 has no depth term); q_mean: the drafter's mean top-1
    probability (the value used for a draft not drawn yet); info: what it was fitted on (rule,
    sampling, drafts, images).
    """

    weights: tuple[float, ...]
    q_mean: float
    info: Optional[dict] = None

    def prob(self, p_top1, p_entropy, q_top1, depth=1) -> np.ndarray:
        """Acceptance probability for arrays of broadcastable shapes -> float64 array in [0, 1]."""
        w = (*self.weights, 0.0)[:5]
        z = w[0] + w[1] * np.asarray(p_top1) + w[2] * np.asarray(p_entropy) + w[3] * np.asarray(q_top1)
        z = z + w[4] * np.asarray(depth)
        with np.errstate(over="ignore"):
            return 1.0 / (1.0 + np.exp(-z))


def fit_predictor(drafts: dict, info: Optional[dict] = None, iterations: int = 50) -> AcceptancePredictor:
    """Logistic regression of the draft records' ``accepted`` on :data:`FEATURES` (Newton's
    method, a 1e-6 jitter on the Hessian; reached drafts only: a draft after a rejection was never judged).

    drafts: columns of a decode's drafts table (``reached``, ``accepted`` and the features).
    Raises UsageError when no draft was reached or the outcomes are all equal.
    """
    reached = np.asarray(drafts["reached"], dtype=bool)
    y = np.asarray(drafts["accepted"], dtype=np.float64)[reached]
    if y.size == 0 or y.min() == y.max():
        raise UsageError(
            f"cannot calibrate acceptance on {y.size} reached drafts of a single outcome; decode more images"
        )
    X = np.column_stack([np.ones_like(y)] + [np.asarray(drafts[c], dtype=np.float64)[reached] for c in FEATURES])
    w = np.zeros(X.shape[1])
    for _ in range(iterations):
        mu = 1.0 / (1.0 + np.exp(-np.clip(X @ w, -30.0, 30.0)))
        hess = (X * (mu * (1 - mu))[:, None]).T @ X + 1e-6 * np.eye(X.shape[1])
        step = np.linalg.solve(hess, X.T @ (y - mu))
        w += step
        if np.abs(step).max() < 1e-10:
            break
    q_mean = float(np.mean(np.asarray(drafts["q_top1"], dtype=np.float64)[reached]))
    return AcceptancePredictor(tuple(float(x) for x in w), q_mean, info)


CALIBRATED = ("lantern", "sd")  # the rules a drafter's predictor is fitted for (python -m lantern.calibrate --method)


def predictor_path(model_name: str, method: str = "lantern") -> Path:
    """The predictor shipped with the drafter of ``model_name`` for the acceptance rule ``method``:
    ``lantern/weights/<name>_drafter_acceptance.json`` (LANTERN at the paper's k and δ) or
    ``<name>_drafter_acceptance_<method>.json`` (another rule of :data:`CALIBRATED`)."""
    from lantern.drafter.model import shipped_drafter_path

    p = shipped_drafter_path(model_name)
    tail = "" if method == "lantern" else f"_{method}"
    return p.with_name(p.name.removesuffix(".safetensors") + f"_acceptance{tail}.json")


def _rebuild_hint(path: Path, model_name: str) -> str:
    method = path.stem.partition("_acceptance_")[2]
    rule = f" --method {method}" if method else ""
    return f"rebuild it with: python -m lantern.calibrate --model {model_name}{rule}"


def load_predictor(path: str | Path, model_name: str) -> AcceptancePredictor:
    """Read a predictor JSON (:func:`save_predictor`). Raises UsageError (one line naming the file
    and the command that rebuilds it) when it is missing or unreadable."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
        return AcceptancePredictor(tuple(float(x) for x in d["weights"]), float(d["q_mean"]), d.get("info"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = "is missing" if isinstance(e, FileNotFoundError) else f"is unreadable ({type(e).__name__})"
        raise UsageError(f"the acceptance predictor {path} {why}; {_rebuild_hint(path, model_name)}") from None


def save_predictor(pred: AcceptancePredictor, path: str | Path) -> Path:
    """Write ``pred`` as JSON (weights, q_mean, info) to ``path``; returns the path."""
    path = Path(path)
    path.write_text(json.dumps({"weights": list(pred.weights), "q_mean": pred.q_mean, "info": pred.info}, indent=1))
    return path


# --------------------------------------------------------------------------- cost
@dataclass(frozen=True)
class CostModel:
    """Seconds of one round's parts. ``target`` (one verify forward, the distribution of its logits
    and the rule's work) and ``drafter`` (one drafter step: forward, head, distribution, draw):
    per measured count of model rows R, a line ``a + b T`` in the tokens per row T, as
    ((R, a, b), ...) ascending in R; other row counts interpolate linearly between the two nearest
    (beyond the largest: proportional to the rows). Calibrated on the engine's own rounds
    (:func:`cost_model`): ``step`` ((R, seconds), ...), one plain AR round of the engine (the
    round of ``G = 0``; empty: the ``target`` line at one token), and ``scale`` ((R, factor), ...),
    a drafting round of the engine over the sum of its forwards above (its bookkeeping, and the
    forwards' own speed inside a decode; empty: 1). Row counts between and beyond those measured
    interpolate as the lines do."""

    target: tuple[tuple[float, float, float], ...]
    drafter: tuple[tuple[float, float, float], ...]
    step: tuple[tuple[float, float], ...] = ()
    scale: tuple[tuple[float, float], ...] = ()

    def target_s(self, rows: int, tokens: int) -> float:
        return _at(self.target, rows, tokens)

    def drafter_s(self, rows: int, tokens: int = 1) -> float:
        return _at(self.drafter, rows, tokens)

    def step_s(self, rows: int) -> float:
        """Seconds of one plain AR round over ``rows`` model rows (``step``, else ``target_s(rows, 1)``)."""
        if not self.step:
            return self.target_s(rows, 1)
        return _at(tuple((R, s, 0.0) for R, s in self.step), rows, 1)

    def forwards_s(self, rows: int, G: int, pending: int = 2) -> float:
        """The forwards of a round of ``G >= 1`` drafts: the verify over ``1 + G`` tokens a row, the
        drafter's first forward over ``pending`` positions and ``G - 1`` single steps."""
        drafts = self.drafter_s(rows, pending) + (G - 1) * self.drafter_s(rows, 1)
        return self.target_s(rows, 1 + G) + drafts

    def round_s(self, rows: int, G: int, pending: int = 2) -> float:
        """One round of ``G`` drafts: :meth:`forwards_s` times ``scale`` (``G = 0``: :meth:`step_s`)."""
        if G == 0:
            return self.step_s(rows)
        return self._factor(rows) * self.forwards_s(rows, G, pending)

    def catch_up_s(self, rows: int, pending: int) -> float:
        """What a drafting round costs beyond :meth:`round_s` when the drafter's first forward reads
        ``pending`` positions instead of 2 (positions committed by rounds without drafts)."""
        extra = self.drafter_s(rows, pending) - self.drafter_s(rows, 2)
        return self._factor(rows) * extra

    def window_s(self, rows: int, L: int) -> float:
        """One Jacobi forward reading ``L`` tokens a row (a :class:`WindowPolicy`'s cost model, whose
        ``scale`` is a Jacobi round of the engine over :meth:`target_s`): :meth:`step_s` at ``L = 1``
        (AR's step), else ``scale`` times the verify forward of ``L`` tokens."""
        if L == 1:
            return self.step_s(rows)
        return self._factor(rows) * self.target_s(rows, L)

    def _factor(self, rows: int) -> float:
        return float(np.interp(rows, *np.array(self.scale).T)) if self.scale else 1.0


def _at(lines: tuple, rows: int, tokens: int) -> float:
    """Seconds at ``rows`` and ``tokens`` from per-row-count lines ((R, a, b), ...) (:class:`CostModel`)."""
    R = np.array([line[0] for line in lines], dtype=np.float64)
    s = np.array([a + b * tokens for _, a, b in lines])
    if rows >= R[-1]:
        return float(s[-1] * rows / R[-1])
    return float(np.interp(rows, R, s))


def _fit(points: dict) -> tuple[float, float]:
    """Robust line ``s = a + b x`` over {x: seconds} (Theil-Sen: b the median of the pairwise
    slopes, a the median of ``s - b x``; both clamped at 0), so a timing that another process
    interrupted does not tilt it."""
    x = np.array([float(k) for k in points], dtype=np.float64)
    s = np.array(list(points.values()), dtype=np.float64)
    i, j = np.triu_indices(len(x), 1)
    apart = x[i] != x[j]
    if not apart.any():
        return float(np.median(s)), 0.0
    b = max(0.0, float(np.median((s[j] - s[i])[apart] / (x[j] - x[i])[apart])))
    return max(0.0, float(np.median(s - b * x))), b


def _lines(points: dict, least: int = 1) -> tuple[tuple[float, float, float], ...]:
    """{"rows,tokens": seconds} -> a :func:`_fit` line over the tokens (those >= ``least``) for
    every row count."""
    by_rows: dict[int, dict] = {}
    for key, seconds in points.items():
        R, T = (int(v) for v in key.split(","))
        if T >= least:
            by_rows.setdefault(R, {})[T] = seconds
    return tuple((R, *_fit(by_rows[R])) for R in sorted(by_rows))


def _steps(points: dict) -> tuple[tuple[float, float], ...]:
    """{"rows,tokens": seconds} -> ((R, seconds at one token), ...) ascending in R."""
    one = {int(key.split(",")[0]): s for key, s in points.items() if key.split(",")[1] == "1"}
    return tuple((R, one[R]) for R in sorted(one))


def default_cache_dir() -> Path:
    """Where measured costs are cached: ``$LANTERN_AMBIGUITY_CACHE/costs``, else
    ``$XDG_CACHE_HOME`` (default ``~/.cache``) ``/lantern-ambiguity/costs`` (the convention of
    :func:`ambiguity.neighbourhood.default_cache_dir`)."""
    if os.environ.get("LANTERN_AMBIGUITY_CACHE"):
        return Path(os.environ["LANTERN_AMBIGUITY_CACHE"]).expanduser() / "costs"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "lantern-ambiguity" / "costs"


def timing_clock(device) -> tuple:
    """(clock, sync) for timing on ``device``: on a CPU with one thread the process's CPU time (what
    the work needs, without the time other processes held the core), else wall-clock seconds with
    CUDA synchronised."""
    if torch.device(device).type == "cuda":
        return time.perf_counter, torch.cuda.synchronize
    return (time.process_time if torch.get_num_threads() == 1 else time.perf_counter), (lambda: None)


def _timed(fns: dict, device, repeats: int = 7) -> dict:
    """{key: least seconds of ``fn()``} over ``repeats`` rounds that call every fn once each, after
    one warm-up call (:func:`timing_clock`). Interleaved and the least: what the device needs, without
    another process's burst landing on one setting only."""
    clock, sync = timing_clock(device)
    for fn in fns.values():
        fn()
    out = {key: float("inf") for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            sync()
            t0 = clock()
            fn()
            sync()
            out[key] = min(out[key], clock() - t0)
    return out


def _judged(p: torch.Tensor, rule, table) -> torch.Tensor:
    """The acceptance work of a verified chain on p (R, T, V) (stand-in drafts: token 0, q = p):
    the rule on the T - 1 draft positions, one residual and the draft records' summaries of p
    (top-1, entropy), as a round of the chain does."""
    from lantern.rules.acceptance import judge, residual

    if rule is None or p.shape[1] < 2:
        return p
    drafts = torch.zeros(p.shape[0], p.shape[1] - 1, dtype=torch.long, device=p.device)
    q = p[:, 1:]
    judge(p[:, :-1], q, drafts, torch.rand(drafts.shape, device=p.device, dtype=p.dtype), table, rule, False)
    top1_prob(p[:, :-1]), entropy(p[:, :-1]), top1_prob(q)
    return residual(p[:, 0], q[:, 0], drafts[:, 0], table, rule, False)


@torch.no_grad()
def _time_target(model, sampling, R: int, tokens: Sequence[int], rule=None, table=None) -> dict:
    """{"rows,T": seconds} of the verify forward, its distribution and the rule's acceptance work
    (:func:`_judged`) for R images at mid-image."""
    from lantern.engine.slots import verify_chains
    from lantern.engine.steps import target_distribution

    guided, N = sampling.guided, model.num_tokens
    n, cache, fns = np.full(R, N // 2), model.new_slots_cache(R, guided, N, max(tokens)), {}
    for T in tokens:
        toks = torch.zeros(R, T, dtype=torch.long, device=model.device)

        def fwd(toks=toks):
            p = target_distribution(verify_chains(model, cache, toks, n, N, guided).logits, sampling, guided)
            return _judged(p, rule, table)

        fns[f"{R * (1 + guided)},{T}"] = fwd
    return _timed(fns, model.device)


@torch.no_grad()
def _time_drafter(model, drafter, sampling, R: int) -> dict:
    """{"rows,T": seconds} of one drafter step (forward over T = 1, 2 positions, head, distribution,
    the draft's draw)."""
    from lantern.engine.steps import target_distribution

    guided, N, dev = sampling.guided, model.num_tokens, model.device
    rows = R * (1 + guided)
    dcache, fns = drafter.new_cache(rows, 2), {}
    feats = torch.zeros(rows, 2, model.hidden_size, dtype=model.dtype, device=dev)
    for T in (1, 2):
        at = torch.full((rows, T), N // 2, device=dev) + torch.arange(T, device=dev)
        vis = torch.arange(N // 2 + T, device=dev)[None, None, :] <= at[:, :, None]

        def step(T=T, at=at, vis=vis):
            f = drafter.forward_slots(model, at * 0, feats[:, :T], dcache, at, at, vis)
            q = target_distribution(drafter.logits(model, f[:, -1]), sampling, guided)
            return invert(q, torch.rand(q.shape[0], device=dev, dtype=torch.float64))  # the draft's draw

        fns[f"{rows},{T}"] = step
    return _timed(fns, dev)


def measure_costs(model, drafter, sampling, rows: Sequence[int], tokens: Sequence[int], rule=None, table=None) -> dict:
    """Time the target's verify forward (with its distribution and the acceptance work of ``rule``
    with the neighbour ``table``, :func:`_judged`) and one drafter step on throwaway slot caches:
    {"target": {"R,T": s}, "drafter": {"R,T": s}} for every ``R`` images in ``rows`` (recorded as
    model rows, ``R (1 + guided)``) and ``T`` tokens a row in ``tokens`` (the drafter at T = 1
    and 2). Positions sit mid-image (N // 2)."""
    out = {"target": {}, "drafter": {}}
    for R in rows:
        out["target"].update(_time_target(model, sampling, R, tokens, rule, table))
        out["drafter"].update(_time_drafter(model, drafter, sampling, R))
    return out


def _cost_key(model, sampling, rule, judged: Optional[str] = None) -> str:
    dev = torch.device(model.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu{torch.get_num_threads()}"
    flags = f"top{sampling.top_k}" if sampling.top_k else "full"
    if judged is None:
        judged = "none" if rule is None else (f"{rule.method}{rule.k}" if rule.relaxed else rule.method)
    compiled = "-compiled" if getattr(model, "compiled", None) is not None else ""  # --compile: other costs
    key = f"{model.name}-{str(model.dtype).removeprefix('torch.')}-{name}{compiled}-{flags}-{judged}"
    return key.replace("/", "_").replace(" ", "_")


def _read_points(path: Path, cache: bool) -> dict:
    """A cost file's measured points ({"target", "drafter", "engine"}; empty where there is no
    readable file, or without ``cache``)."""
    points = {"target": {}, "drafter": {}, "engine": {}}
    if cache and path.is_file():
        try:
            points = {**points, **json.loads(path.read_text())}
            points.pop("overhead", None)  # an earlier file's additive overhead: the engine rounds replace it
        except ValueError:
            pass
    return points


def _calibrated(
    costs: CostModel, points: dict, images, g: int, engine, key: str, seconds, path, cache, measured
) -> CostModel:
    """``costs`` calibrated on the engine's rounds: ``engine(images)`` -> (seconds of AR's round, of
    the method's round at a fixed length) for every count in ``images`` not in the file yet (recorded
    per model rows ``images * g`` as {"ar", key}); the file is written when anything was measured
    (``measured``: the forward timings were). ``step``: AR's round; ``scale``: the method's round over
    ``seconds(rows)``, what the cost model says it costs."""
    todo = [R for R in images if engine is not None and str(R * g) not in points["engine"]]
    for R in todo:
        ar_s, other_s = engine(R)
        points["engine"][str(R * g)] = {"ar": float(ar_s), key: float(other_s)}
    if cache and (measured or todo):
        write_json(points, path)
    rounds = sorted((int(R), e) for R, e in points["engine"].items() if key in e)
    if not rounds:
        return costs
    step = tuple((R, e["ar"]) for R, e in rounds)
    return replace(costs, step=step, scale=tuple((R, e[key] / seconds(R)) for R, e in rounds))


def cost_model(
    model,
    drafter,
    sampling,
    rows: int,
    gamma_max: int,
    rule=None,
    table=None,
    engine=None,
    cache_dir=None,
    cache=True,
) -> CostModel:
    """The :class:`CostModel` of ``model`` and ``drafter`` on their device for up to ``rows``
    images: measured points read from ``<cache_dir>/<model>-<dtype>-<device>[-compiled]-<filter>-<rule>.json``
    (default :func:`default_cache_dir`); the points missing for these rows (1 and ``rows``
    images) and tokens (1, 2, 3, ``2 + gamma_max // 2`` and ``1 + gamma_max``) are measured and
    added to the file. The verify line is fitted on two or more tokens a row (a chain's forward,
    with per-row masks); one token a row is its own point (an AR step, no mask). engine: None, or
    ``engine(images)`` -> (seconds of one plain AR round, seconds of one round of a chain of 2) on
    the engine itself (measured by the caller on short decodes), recorded per model rows: the
    model's ``step`` and ``scale`` (a drafting round over :meth:`CostModel.forwards_s` at ``G = 2``)."""
    path = Path(cache_dir or default_cache_dir()) / f"{_cost_key(model, sampling, rule)}.json"
    points = _read_points(path, cache)
    want_rows = sorted({1, int(rows)})
    want_t = sorted({1, 2, 3, 2 + int(gamma_max) // 2, 1 + int(gamma_max)})
    g = 1 + sampling.guided
    missing = [R for R in want_rows if any(f"{R * g},{T}" not in points["target"] for T in want_t)]
    if missing:
        new = measure_costs(model, drafter, sampling, missing, want_t, rule, table)
        for part in ("target", "drafter"):
            points[part].update(new[part])
    # the verify line from chains (>= 2 tokens a row, per-row masks); one token a row is the AR step's own point
    costs = CostModel(_lines(points["target"], least=2), _lines(points["drafter"]), step=_steps(points["target"]))
    return _calibrated(
        costs, points, want_rows, g, engine, "chain2", lambda R: costs.forwards_s(R, 2), path, cache, missing
    )


# --------------------------------------------------------------------------- the policy
class GammaPolicy:
    """Per round, the number of drafts ``G`` in ``0..gamma_max`` that maximises expected committed
    tokens per second (module docstring).

    costs: a :class:`CostModel` (or None until :meth:`open` measures it); predictor: an
    :class:`AcceptancePredictor`; gamma_max: the longest chain.
    """

    MAX_REST = 7  # the longest run of plain rounds between two plans (:meth:`resting`)

    def __init__(
        self,
        predictor: AcceptancePredictor,
        gamma_max: int = 8,
        costs: Optional[CostModel] = None,
        max_entropy: float = 20.0,
    ):
        self.predictor, self.gamma_max, self.costs = predictor, int(gamma_max), costs
        self.max_entropy = float(max_entropy)  # nats: the most a target distribution can have (:meth:`open`)
        self._rounds: dict[int, np.ndarray] = {}  # rows -> round seconds per G (:meth:`_seconds`)
        self._may: dict[int, bool] = {}  # rows -> :meth:`may_draft`
        self._quiet, self._stretch = 0, 0  # plain rounds left before the next plan; the last stretch's length

    def open(self, model, drafter, sampling, rows: int, rule=None, table=None, engine=None) -> None:
        """Measure (or read) the cost model for up to ``rows`` images once (with the chain's
        acceptance ``rule``, neighbour ``table`` and ``engine`` rounds, :func:`cost_model`); the
        largest entropy a target distribution can have is ``ln`` of its support (top-k, else the
        vocabulary)."""
        self.max_entropy = float(np.log(min(sampling.top_k or model.vocab_size, model.vocab_size)))
        self._may, self._quiet, self._stretch = {}, 0, 0
        if self.costs is None:
            self.costs = cost_model(model, drafter, sampling, rows, self.gamma_max, rule, table, engine)
            self._rounds = {}

    def most_likely(self) -> np.ndarray:
        """(gamma_max,) the highest acceptance probability the predictor gives a draft at depth
        1..gamma_max over every target distribution on at most K = ``exp(max_entropy)`` codes and
        every drafter top-1 in [0, 1]. For a top-1 probability p1 the entropy lies between
        ``-ln p1`` (the min-entropy bound) and ``h(p1) + (1 - p1) ln(K - 1)`` (the rest spread
        evenly), so the logistic's largest value is the largest over a grid of p1 in [1/K, 1] at
        the end of that range its entropy weight favours."""
        w = (*self.predictor.weights, 0.0)[:5]
        K = float(np.exp(self.max_entropy))
        p1 = np.linspace(1.0 / K, 1.0, 1001)
        with np.errstate(divide="ignore", invalid="ignore"):
            rest = np.where(p1 < 1.0, -(1 - p1) * np.log((1 - p1) / max(K - 1.0, 1.0)), 0.0)
            most = -p1 * np.log(p1) + rest
        h = most if w[2] > 0 else -np.log(p1)
        z = w[0] + float(np.max(w[1] * p1 + w[2] * h)) + max(w[3], 0.0)
        depth = np.arange(1, self.gamma_max + 1)
        return 1.0 / (1.0 + np.exp(-(z + w[4] * depth)))

    def may_draft(self, rows: int) -> bool:
        """Whether a round over ``rows`` model rows can gain from drafting at all: False when even
        the most likely acceptance (:meth:`most_likely`, for every image and draft) makes ``G = 0``
        the best length, so the engine runs plain AR steps and skips the statistics the plan reads
        (speculation off at this batch size, as serving engines switch it off above a concurrency)."""
        if rows not in self._may:
            best = self._best(self.most_likely()[None, :], np.array([self.gamma_max]), self._seconds(rows))
            self._may[rows] = best > 0
        return self._may[rows]

    def resting(self) -> bool:
        """Whether this round is a plain AR step without a plan: after a plan chose ``G = 0``, the
        policy rests for 1, 3, then up to ``MAX_REST`` rounds while its plans keep choosing 0 (a
        drafting round ends the rest), so a stretch where AR is the better choice does not pay for
        a plan and the statistics it reads every round. The rest depends only on past plans."""
        if self._quiet == 0:
            return False
        self._quiet -= 1
        return True

    def plans_next(self) -> bool:
        """Whether the next round plans (so this round's target statistics are needed)."""
        return self._quiet == 0

    def _rest_after(self, G: int) -> int:
        self._stretch = 0 if G else min(2 * self._stretch + 1, self.MAX_REST)
        self._quiet = self._stretch
        return G

    def _seconds(self, rows: int) -> np.ndarray:
        """(gamma_max + 1,) seconds of a round of G = 0..gamma_max drafts over ``rows`` model rows."""
        if rows not in self._rounds:
            self._rounds[rows] = np.array([self.costs.round_s(rows, G) for G in range(self.gamma_max + 1)])
        return self._rounds[rows]

    def _best(self, a: np.ndarray, caps: np.ndarray, seconds: np.ndarray) -> int:
        """argmax over G in 0..max(caps) of expected committed tokens per second of a round in which
        draft j of image b passes with ``a[b, j - 1]`` (a (k, max caps); image b drafts ``min(G, cap_b)``)
        and a round of G drafts takes ``seconds[G]``."""
        table = np.cumprod(a, 1)
        top = table.shape[1]
        sums = np.concatenate([np.zeros((len(caps), 1)), np.cumsum(table, 1)], 1)  # (k, top + 1): E at each G
        G = np.arange(top + 1)
        tokens = len(caps) + np.take_along_axis(sums, np.minimum(G[None, :], caps[:, None]), 1).sum(0)
        return int(np.argmax(tokens / seconds[: top + 1]))

    def plan(self, p_stats: np.ndarray, caps: np.ndarray, rows: int, pending: int = 2) -> int:
        """Start a round: the first choice of ``G`` from each live image's last target distribution
        (p_stats (k, 2) float64: top-1 probability, entropy; the drafter's mean top-1 for the drafts),
        caps (k,) int64 the most drafts each may take (``min(gamma_max, N - 1 - n_b)``), rows: model
        rows of the forward, pending: the positions the drafter's first forward reads (the most of
        any image: committed tokens the drafter has not seen yet, :meth:`CostModel.catch_up_s`).
        0: a plain AR step; else draft and ask :meth:`go_on` after each step."""
        pt, pe = p_stats[:, :1], p_stats[:, 1:]
        seconds = self._seconds(rows)
        if pending > 2:  # every drafting round (G >= 1) first reads the positions the drafter has not seen
            seconds = seconds.copy()
            seconds[1:] += self.costs.catch_up_s(rows, pending)
        self._round = (pt[:, 0], pe[:, 0], caps, seconds)
        self._surv, self._tokens, self._j = np.ones(len(caps)), float(len(caps)), 0
        depth = np.arange(1, int(caps.max()) + 1)[None, :]
        return self._rest_after(self._best(self.predictor.prob(pt, pe, self.predictor.q_mean, depth), caps, seconds))

    def go_on(self, q_top1: np.ndarray) -> bool:
        """After one more drafting step of the round :meth:`plan` started (q_top1 (k,) the drafter's
        top-1 probability of each image's new draft): whether one more draft is expected to raise
        the round's tokens per second (its expected tokens ``sum_b s_b a_b`` per extra second above
        the round's rate so far; s_b the survival of image b's chain, a_b the next draft's
        acceptance probability at its depth, with the last draft's top-1)."""
        pt, pe, caps, seconds = self._round
        self._j += 1
        j = self._j
        self._surv = self._surv * self.predictor.prob(pt, pe, q_top1, j)
        self._tokens += float(self._surv[caps >= j].sum())
        if j >= int(caps.max()):
            return False
        gain = float((self._surv * self.predictor.prob(pt, pe, q_top1, j + 1))[caps > j].sum())
        return gain * seconds[j] > self._tokens * (seconds[j + 1] - seconds[j])


# --------------------------------------------------------------------------- Jacobi windows
def window_costs(
    model, sampling, rows: int, longest: int, method: str, engine=None, cache_dir=None, cache=True
) -> CostModel:
    """The :class:`CostModel` of a Jacobi ``method`` (:meth:`CostModel.window_s`) on the model's
    device for up to ``rows`` images: the verify forward and its distribution timed at 1, 2, 4, ..
    and ``longest`` tokens a row for 1 and ``rows`` images (the line fitted on two or more tokens,
    one token AR's own point), read from and added to ``<cache_dir>/<model>-...-jacobi-<method>.json``
    (:func:`cost_model`'s cache). engine: None, or ``engine(images)`` -> (seconds of one plain AR
    round, seconds of one Jacobi round of window 4) on the engine's short decodes: the model's
    ``step`` and ``scale`` (the Jacobi round over the verify forward of 4 tokens)."""
    path = Path(cache_dir or default_cache_dir()) / f"{_cost_key(model, sampling, None, f'jacobi-{method}')}.json"
    points = _read_points(path, cache)
    want_rows = sorted({1, int(rows)})
    want_t = sorted({1, int(longest), *(t for t in (2, 4, 8, 16, 32) if t < longest)})
    g = 1 + sampling.guided
    missing = [R for R in want_rows if any(f"{R * g},{T}" not in points["target"] for T in want_t)]
    for R in missing:
        points["target"].update(_time_target(model, sampling, R, want_t))
    costs = CostModel(_lines(points["target"], least=2), (), step=_steps(points["target"]))
    return _calibrated(
        costs, points, want_rows, g, engine, "window4", lambda R: costs.target_s(R, 4), path, cache, missing
    )


class WindowPolicy:
    """Per forward, the window ``L`` in ``1..longest`` (tokens read: the last committed token and
    ``L - 1`` drafts) of a Jacobi method (``window="auto"``) that maximises expected committed
    tokens per second, the window every image of the forward shares (the forward pads to the
    longest).

    Whether a Jacobi draft passes depends on how far its window has converged, not on the last
    distribution alone, so the acceptance is learnt online: ``alpha_j``, the share of the judged
    drafts at window index ``j`` (1 = the first draft; judged: up to the first rejection) that
    passed, counting only drafts a previous forward sampled (a new position's initial token, drawn
    before anything was known of it, says nothing of the window's steady state), with a decay of
    ``DECAY`` a forward and ``PRIOR`` pseudo-counts at ``ALPHA0``. A window ``L`` is expected to
    commit ``1 + sum_{j<L} prod_{i<=j} alpha_i`` tokens an image at :meth:`CostModel.window_s`
    seconds. ``L = 1`` is AR's step (the method then runs :func:`lantern.methods.ar.ar_round`);
    the counts do not move during AR's steps, so once the counts say AR, the decode stays AR (no
    probing: a probe's first forward has only new positions and commits about one token).
    Where no window could pay even if every draft passed (``L`` tokens for :meth:`CostModel.window_s`
    ``(rows, L)``), speculation is off at that batch size (:meth:`may_speculate`). The window depends
    only on past verdicts, so a lossless rule stays lossless (``tests/test_policy.py`` enumerates).

    longest: the longest window L >= 1; costs: a :class:`CostModel` (None until :meth:`open`).
    """

    DECAY = 0.9  # the weight of the counts one forward later
    PRIOR, ALPHA0 = 2.0, 0.5  # pseudo-counts of a draft passing with probability ALPHA0

    def __init__(self, longest: int, costs: Optional[CostModel] = None):
        self.longest, self.costs = int(longest), costs
        self._seconds: dict[int, np.ndarray] = {}
        self.open_counts()

    def open_counts(self) -> None:
        """Forget what was learnt (a new decode): the counts at their prior."""
        self.judged = np.zeros(max(self.longest - 1, 0))
        self.passed = np.zeros(max(self.longest - 1, 0))
        self._may: dict[int, bool] = {}

    def open(self, model, sampling, rows: int, method: str, engine=None) -> None:
        """Measure (or read) the cost model for up to ``rows`` images once (:func:`window_costs`)
        and start from the prior."""
        self.open_counts()
        if self.costs is None:
            self.costs = window_costs(model, sampling, rows, self.longest, method, engine)
            self._seconds = {}

    def seconds(self, rows: int) -> np.ndarray:
        """(longest,) seconds of a forward of window L = 1..longest over ``rows`` model rows."""
        if rows not in self._seconds:
            self._seconds[rows] = np.array([self.costs.window_s(rows, L) for L in range(1, self.longest + 1)])
        return self._seconds[rows]

    def alpha(self) -> np.ndarray:
        """(longest - 1,) the acceptance of a draft at window index 1..longest - 1 given the drafts
        before it passed (decayed counts and prior)."""
        return (self.passed + self.PRIOR * self.ALPHA0) / (self.judged + self.PRIOR)

    def may_speculate(self, rows: int) -> bool:
        """Whether some window ``L >= 2`` commits more tokens a second than AR's step when all its
        ``L - 1`` drafts pass (else speculation is off at this batch size: every forward is AR's)."""
        if rows not in self._may:
            s = self.seconds(rows)
            self._may[rows] = bool(np.any(np.arange(1, self.longest + 1) / s > 1.0 / s[0]))
        return self._may[rows]

    def plan(self, rows: int) -> int:
        """The window of the next forward over ``rows`` model rows (1: AR's step)."""
        if not self.may_speculate(rows):
            return 1
        tokens = 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(self.alpha()))])
        return int(np.argmax(tokens / self.seconds(rows))) + 1

    def observe(self, g: np.ndarray, a: np.ndarray, sampled: np.ndarray) -> None:
        """Count a forward's verdicts: ``g`` (k,) drafts and ``a`` (k,) accepted prefix of each live
        image (int64 numpy), ``sampled`` (k, >= max g) bool: the draft at index ``j`` (column
        ``j - 1``) was sampled by an earlier forward. A draft at index ``j`` was judged where
        ``j <= min(a + 1, g)`` and passed where ``j <= a``; only sampled drafts count."""
        j = np.arange(1, self.longest)[None, :]
        known = np.zeros((len(g), self.longest - 1), dtype=bool)
        w = min(sampled.shape[1], self.longest - 1)
        known[:, :w] = sampled[:, :w]
        self.judged = self.DECAY * self.judged + ((j <= np.minimum(a + 1, g)[:, None]) & known).sum(0)
        self.passed = self.DECAY * self.passed + ((j <= a[:, None]) & known).sum(0)


# --------------------------------------------------------------------------- draft trees
class NodePolicy:
    """Per round, whether an EAGLE-2 dynamic draft tree is drafted at all and how many of its
    candidates the target verifies (``gamma="auto"`` with a dynamic tree; the spec's
    ``total_tokens`` is the most), by expected committed tokens per second.

    Before drafting: a tree round is expected to commit ``tau`` tokens an image (accepted drafts and
    the bonus), learnt online (a decay of ``DECAY`` a round from ``PRIOR`` pseudo-rounds at the tree's
    depth + 1, the longest accepted path) at the seconds of its drafter forwards (the pending
    positions, then ``depth`` levels of ``top_k`` nodes) and of the verify forward over the budget
    the last tree used; where AR's step commits more a second, the round is AR's step (the counts do
    not move during AR's steps, so once they say AR the decode stays AR). Where even a tree
    whose every path passes (``depth + 2`` tokens) cannot beat AR's step, speculation is off at that
    batch size. After drafting (:meth:`budget`): the candidates' EAGLE-2 scores (the cumulative
    draft probability of each node's path, EAGLE-2 Sec. 4: its estimate of the node's acceptance)
    give ``sum_b (1 + sum_{i <= m} exp(s_b,(i)))`` expected tokens for the ``m`` best of every tree,
    and the budget maximises them per second of the drafting (spent) and the verify forward of
    ``1 + m`` tokens. The budget depends on the drafter's own proposals and the decision on past
    rounds only, so a lossless rule stays lossless.

    spec: the dynamic :class:`~lantern.methods.tree.spec.TreeSpec`; costs: a :class:`CostModel`
    (None until :meth:`open`, which measures the chains' cost model up to ``total_tokens``).
    """

    DECAY, PRIOR = 0.9, 2.0

    def __init__(self, spec, costs: Optional[CostModel] = None):
        self.spec, self.costs = spec, costs
        self.open_counts()

    def open_counts(self) -> None:
        """Forget what was learnt: the prior, the full budget."""
        self.rounds, self.tokens = 0.0, 0.0
        self.last = int(self.spec.total_tokens) - 1
        self._may: dict[int, bool] = {}
        self._rounds: dict[int, np.ndarray] = {}  # rows -> :meth:`round_s`

    def open(self, model, drafter, sampling, rows: int, rule=None, table=None, engine=None) -> None:
        """Measure (or read) the cost model for up to ``rows`` images (:func:`cost_model`, verify
        forwards up to ``total_tokens`` tokens a row) and start from the prior."""
        self.open_counts()
        if self.costs is None:
            self.costs = cost_model(
                model, drafter, sampling, rows, int(self.spec.total_tokens) - 1, rule, table, engine
            )

    def tau(self) -> float:
        """Expected tokens an image commits in a tree round (decayed mean, prior ``depth + 1``)."""
        return (self.tokens + self.PRIOR * (self.spec.depth + 1)) / (self.rounds + self.PRIOR)

    def drafting_s(self, rows: int) -> float:
        """Seconds of a round's drafter forwards over ``rows`` model rows: the pending positions (2),
        then ``depth`` levels of ``top_k`` nodes a row."""
        c, k = self.costs, int(self.spec.top_k)
        return c._factor(rows) * (c.drafter_s(rows, 2) + self.spec.depth * c.drafter_s(rows, k))

    def verify_s(self, rows: int, drafts: int) -> float:
        """Seconds of the verify forward of the root and ``drafts`` candidates a row."""
        return self.costs._factor(rows) * self.costs.target_s(rows, 1 + drafts)

    def round_s(self, rows: int) -> np.ndarray:
        """(total_tokens,) seconds of a tree round over ``rows`` model rows verifying 0..total_tokens - 1
        candidates (:meth:`drafting_s` + :meth:`verify_s`), computed once per row count."""
        if rows not in self._rounds:
            m = range(int(self.spec.total_tokens))
            self._rounds[rows] = self.drafting_s(rows) + np.array([self.verify_s(rows, x) for x in m])
        return self._rounds[rows]

    def may_draft(self, rows: int) -> bool:
        """Whether a tree whose every path passes (``depth + 2`` tokens an image) commits more tokens
        a second than AR's step at ``rows`` model rows (else speculation is off there)."""
        if rows not in self._may:
            self._may[rows] = (self.spec.depth + 2) / self.round_s(rows)[-1] > 1.0 / self.costs.step_s(rows)
        return self._may[rows]

    def plan(self, rows: int) -> bool:
        """Whether this round drafts a tree (else AR's step)."""
        if not self.may_draft(rows):
            return False
        return self.tau() / self.round_s(rows)[self.last] > 1.0 / self.costs.step_s(rows)

    def budget(self, score: torch.Tensor, most: int, rows: int) -> int:
        """The candidates to verify per tree, 1..``most``, from every tree's candidate scores
        (score (B, C) float64 cumulative log-probabilities, -inf for none): the count ``m`` that
        maximises ``sum_b (1 + sum_{i <= m} exp(s_b,(i)))`` over the drafting and verify seconds."""
        top = score.topk(min(most, score.shape[1]), dim=-1).values.exp().sum(0).cumsum(0).double().cpu().numpy()
        seconds = self.round_s(rows)[1 : len(top) + 1]
        self.last = int(np.argmax((score.shape[0] + top) / seconds)) + 1
        return self.last

    def observe(self, tokens: np.ndarray) -> None:
        """Count a tree round: ``tokens`` (k,) int64 the tokens each live image committed."""
        self.rounds = self.DECAY * self.rounds + len(tokens)
        self.tokens = self.DECAY * self.tokens + float(np.sum(tokens))
