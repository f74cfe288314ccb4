"""Decoding many images: the configuration, the neighbour table, the method, and :func:`decode`.

:class:`DecodeConfig` says how to decode (the method: ``"ar"``; a relaxed or exact acceptance
rule on chains of γ drafts or on EAGLE-1 static / EAGLE-2 dynamic draft trees; or a Jacobi
method; and the latent geometry of the neighbour table); :func:`build_method` checks it against
the model once and builds the method's plug-in (:mod:`lantern.methods`); :func:`decode` runs it
on the engine (:func:`lantern.engine.loop.run`) for every batch size — batch 1 is ``B = 1``.

Seams (as in transformers' assisted generation): the *drafter* (:class:`lantern.drafter.model.DraftModel`)
proposes tokens, the *verifier* (one target forward) scores them, and the *acceptance rule*
(:class:`lantern.rules.acceptance.AcceptanceRule`, pure tensor functions) decides.

Methods: ``"ar"`` (one target forward per token), ``"sd"`` (lossless speculative sampling,
Leviathan et al. 2023), ``"lantern"`` (TVD bound δ), ``"lantern-jsd"`` (JSD bound δ, nats),
``"lantern++"`` (relative bound λ) — the rules of :mod:`lantern.rules.acceptance` (LANTERN, Jang
et al., ICLR 2025, arXiv 2410.03355, Sec. 3-4; LANTERN++, arXiv 2502.06352) — and the Jacobi
methods ``"sjd"``, ``"gsd"``, ``"scd"``, ``"entropy-sd"`` (:mod:`lantern.methods.jacobi.method`), ``"sjd-pac"``
(:mod:`lantern.methods.sjd_pac.method`) and the row-parallel methods ``"zipar"``, ``"pjd"``
(:mod:`lantern.methods.spatial.method`). Temperature 0 uses
the greedy rule (:func:`lantern.rules.acceptance.judge_greedy`): the drafter drafts its argmax,
and with δ = 0 (or ``"sd"``) the tokens equal greedy AR decoding exactly.

Randomness: image ``i`` of a decode with seed ``s`` draws every random number (drafts, the
uniforms ``u``, residual and bonus tokens) from its own generator seeded by ``(s, i)``
(:mod:`ambiguity.seeding`); AR decoding of image ``i`` therefore gives the tokens
``python -m ambiguity.profile`` generates for image ``i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from ambiguity.errors import FieldError, UsageError
from ambiguity.knn import DEFAULT_METRIC, METRICS
from ambiguity.memory import PREFIX_ROOM, check_batch, check_count, kv_bytes_per_token
from ambiguity.models.base import TokenModel
from ambiguity.neighbourhood import MATRICES, model_neighbourhoods
from ambiguity.sampling import SamplingConfig
from lantern.drafter.model import DraftModel, fingerprint_mismatch, target_fingerprint
from lantern.engine.loop import run
from lantern.engine.method import Method
from lantern.engine.records import Decoded
from lantern.engine.slots import check_batching, image_indices
from lantern.methods.registry import METHODS as PLUGINS
from lantern.methods.tree.spec import TreeSpec
from lantern.rules.acceptance import RELAXATIONS, AcceptanceRule

__all__ = [
    "METHODS",
    "DecodeConfig",
    "neighbour_table",
    "check_drafter",
    "check_depth",
    "check_params",
    "check_batch_size",
    "decode",
    "build_method",
    "compile_forwards",
]

METHODS = tuple(PLUGINS)  # lantern.methods.registry: the one place a method is named


@dataclass(frozen=True)
class DecodeConfig:
    """What to decode with: the drafted family's config (the acceptance rule, the draft length or
    tree and the latent geometry of the rule's neighbour table), or a method's own config
    (``params``), or neither (plain AR decoding).

    rule: a :class:`lantern.rules.acceptance.AcceptanceRule` (method, k, δ, λ, convention) for the
    drafted methods, else None. gamma: draft tokens per verification of a chain (γ >= 1; unused by AR and
    trees). metric / matrix: the latent distance and the rows it is measured on
    (:data:`ambiguity.neighbourhood.METRICS`, :data:`ambiguity.neighbourhood.MATRICES`; default
    ``"l2"`` on the quantiser's codebook; ``"codebook-raw"`` is what the official code measures
    for LlamaGen). tree: a static or dynamic :class:`lantern.methods.tree.spec.TreeSpec`, or None for a chain.
    params: the config dataclass of a method that has its own (:attr:`lantern.methods.registry.Plugin.params`,
    e.g. :class:`lantern.methods.jacobi.config.JacobiConfig`), else None.
    Build one with :meth:`of`: ``DecodeConfig.of("lantern", gamma=4, k=64, delta=0.2)``,
    ``DecodeConfig.of("sjd", window=16)``.
    ``gamma="auto"``: the engine's draft-length policy picks each round's chain length in
    ``0..gamma_max`` (:mod:`lantern.engine.policy`), or, with a dynamic tree, whether to draft it
    and how many of its candidates to verify (:class:`lantern.engine.policy.NodePolicy`).
    Raises :class:`UsageError` for γ < 1 (or not ``"auto"``), gamma_max < 1, an unknown metric or matrix.
    """

    rule: Optional[AcceptanceRule] = field(default_factory=lambda: AcceptanceRule("lantern"))
    gamma: int | str = 4
    metric: str = DEFAULT_METRIC
    matrix: str = "codebook"
    tree: Optional[TreeSpec] = None
    params: Optional[Any] = None
    gamma_max: int = 8

    def __post_init__(self):
        if not _draft_length(self.gamma, auto=True):
            raise FieldError(
                "DecodeConfig",
                "gamma",
                f"(draft tokens per step) must be an integer >= 1 or 'auto', got {self.gamma!r}",
            )
        if not _draft_length(self.gamma_max, auto=False):
            raise FieldError("DecodeConfig", "gamma_max", f"must be an integer >= 1, got {self.gamma_max!r}")
        if self.gamma == "auto" and self.tree is not None and self.tree.kind != "dynamic":
            raise FieldError(
                "DecodeConfig", "gamma", "'auto' picks chain lengths or a dynamic tree's budget; a static tree is fixed"
            )
        if self.metric not in METRICS:
            raise FieldError("DecodeConfig", "metric", f"must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if self.matrix not in MATRICES:
            raise FieldError("DecodeConfig", "matrix", f"must be one of {', '.join(MATRICES)}, got {self.matrix!r}")
        if self.rule is not None and self.rule.method in RELAXATIONS and self.tree is not None:
            raise UsageError(
                f"--method {self.rule.method} relaxes by the draft's place in a chain and has no draft tree; "
                f"use --tree chain"
            )
        if self.rule is not None and self.rule.method in RELAXATIONS and self.gamma == "auto":
            raise UsageError(
                f"--gamma auto picks each round's chain length, but {self.rule.method}'s rule depends on the "
                f"chain's length; give --gamma N"
            )
        if self.rule is not None and self.rule.method == "fly" and self.gamma < 2:
            raise UsageError(f"--method fly needs --gamma >= 2 (a deferral needs a following draft), got {self.gamma}")
        if self.rule is not None and self.rule.method == "fly" and self.rule.fly_window >= self.gamma:
            raise UsageError(
                f"--fly-window {self.rule.fly_window} must be < --gamma {self.gamma} (the drafts after a rejection "
                f"within one chain; a longer window defers nothing); use --fly-window {max(1, self.gamma - 1)}"
            )

    @classmethod
    def of(
        cls,
        method: str = "lantern",
        gamma: int | str = 4,
        metric: str = DEFAULT_METRIC,
        matrix: str = "codebook",
        tree: Optional[TreeSpec] = None,
        gamma_max: int = 8,
        **fields,
    ) -> DecodeConfig:
        """``method`` in :data:`METHODS`; ``fields``: the method's config fields — the
        :class:`AcceptanceRule` fields (k, delta, lam, convention) of a drafted method, the fields of
        a method's own config (:attr:`lantern.methods.registry.Plugin.params`, e.g. window for
        ``"sjd"``), ignored for ``"ar"``; tree: None (a chain of ``gamma``) or a :class:`TreeSpec`
        (drafted methods). Raises UsageError for an unknown method and the config's own checks."""
        if method not in METHODS:
            raise UsageError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
        plugin = PLUGINS[method]
        if plugin.params is not None:
            return cls(None, gamma, metric, matrix, None, plugin.params(**fields))
        if not plugin.drafter:
            return cls(None, gamma, metric, matrix)
        return cls(AcceptanceRule(method, **fields), gamma, metric, matrix, tree, None, gamma_max)

    @property
    def method(self) -> str:
        if self.params is not None:
            return self.params.method
        return "ar" if self.rule is None else self.rule.method

    @property
    def speculative(self) -> bool:
        return self.rule is not None

    @property
    def draft_depth(self) -> int:
        """The longest possible accepted run: γ for chains, the tree's deepest draft, the method's own
        ``draft_depth`` (L - 1 for a Jacobi window), 0 for AR."""
        if self.params is not None:
            return int(self.params.draft_depth)
        if self.rule is None:
            return 0
        if self.tree is not None:
            return self.tree.max_depth
        return self.gamma_max if self.auto else self.gamma

    @property
    def auto(self) -> bool:
        """Whether the draft length is the engine's policy (``gamma="auto"``)."""
        return self.gamma == "auto"

    def as_dict(self) -> dict:
        """Flat JSON-able record: method, gamma, metric, matrix, tree and the rule's fields."""
        rule = self.rule.as_dict() if self.rule is not None else (self.params.as_dict() if self.params else {})
        rule.pop("method", None)
        return {
            "method": self.method,
            "gamma": self.gamma,
            **({"gamma_max": self.gamma_max} if self.auto else {}),
            "metric": self.metric,
            "matrix": self.matrix,
            "tree": self.tree.as_dict() if self.tree is not None else "chain",
            **rule,
        }


def _draft_length(x, auto: bool) -> bool:
    """Whether ``x`` is an integer >= 1 (or, with ``auto``, the string ``"auto"``)."""
    if auto and x == "auto":
        return True
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1


# --------------------------------------------------------------------------- many images
def neighbour_table(model: TokenModel, config: DecodeConfig, **kwargs) -> Optional[torch.Tensor]:
    """The (V, K) int64 code-index table B_K of ``config.matrix`` rows of the model for ``config``,
    on the model's device, or None when the rule does not use neighbours.

    K = k, or k + 1 for the ``"official"`` convention (it zeroes ``B_{k+1}``), capped at V - 1.
    Built (or read from the cache) by :func:`ambiguity.neighbourhood.model_neighbourhoods` with
    ``config.metric`` (LANTERN Sec. 4.1). Raises UsageError when k >= V or the model has no codebook.
    """
    rule = config.rule
    if rule is None or not rule.relaxed:
        return None
    V = model.vocab_size
    if rule.k >= V:
        raise UsageError(f"--k {rule.k} must be smaller than the vocabulary size {V} of {model.name}; lower --k")
    try:
        model.codebook()
    except NotImplementedError:
        raise UsageError(
            f"{config.method} needs the VQ codebook of {model.name} for latent neighbourhoods; "
            f"load its tokenizer weights or use --method sd"
        ) from None
    K = min(rule.k + 1, V - 1) if rule.convention == "official" else rule.k
    nb = model_neighbourhoods(model, K, config.metric, config.matrix, **kwargs)
    return nb.indices.to(model.device)


def check_depth(config: DecodeConfig, model: TokenModel, num_tokens: Optional[int] = None) -> None:
    """Raise UsageError when the chain or tree drafts deeper than an image has tokens to draft
    (N - 1: the first token comes from the prefill), when a dynamic tree asks for more children
    per node than the vocabulary has, or when the tree's nodes do not fit in memory (their key/value
    cache and distributions, two rows a node)."""
    N = int(num_tokens or model.num_tokens)
    if config.rule is not None and config.draft_depth > N - 1:
        what = (
            f"the tree {config.tree.label} drafts {config.draft_depth} deep"
            if config.tree is not None
            else (f"--gamma-max {config.gamma_max}" if config.auto else f"--gamma {config.gamma}")
        )
        raise UsageError(
            f"{what} but an image of {model.name} has {N} tokens (at most {N - 1} can be drafted); "
            f"use a smaller tree (--depth) or --gamma"
        )
    tree = config.tree if config.rule is not None else None
    if tree is None:
        return
    if tree.kind == "dynamic" and tree.top_k > model.vocab_size:
        raise UsageError(
            f"--tree-top-k {tree.top_k} exceeds the vocabulary size {model.vocab_size} of {model.name}; "
            f"use --tree-top-k {model.vocab_size} or less"
        )
    per_node = 2 * ((kv_bytes_per_token(model) or 0) + 3 * 4 * model.vocab_size)
    check_count(
        tree.nodes,
        per_node,
        "--total-tokens" if tree.kind == "dynamic" else "the tree's node count",
        "the key/value cache and distributions of the tree's nodes",
        device=model.device,
    )


def check_params(config: DecodeConfig, model: TokenModel) -> None:
    """Raise UsageError when ``model`` cannot run the method's own config (``config.params``; its
    plug-in's :attr:`~lantern.methods.registry.Plugin.check`, e.g. a Jacobi window longer than an image)."""
    check = PLUGINS[config.method].check
    if config.params is not None and check is not None:
        check(config.params, model)


def check_batch_size(batch_size) -> None:
    """Raise UsageError unless ``batch_size`` (images per forward) is an integer >= 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise UsageError(f"--batch-size (images decoded together) must be an integer >= 1, got {batch_size}")


def check_drafter(drafter: DraftModel, model: TokenModel) -> None:
    """Raise UsageError unless ``drafter`` was built for ``model`` (fingerprint, see lantern.drafter.model)."""
    why = fingerprint_mismatch(getattr(drafter, "target", {}) or {}, target_fingerprint(model))
    if why is not None:
        raise UsageError(
            f"drafter was built for {why}, not {model.name}; pass --drafter for this model or train "
            f"one with python -m lantern.drafter.train --model {model.name}"
        )


def compile_forwards(model: TokenModel, drafter: Optional[DraftModel] = None) -> None:
    """``--compile``: run the target's cached forwards, and the drafter layer's, through
    ``torch.compile`` (inductor) from now on; idempotent, compilation happens on the first calls.

    The LlamaGen-architecture adapters write their static KV cache in place inside the compiled
    graph, with batch rows, tokens per forward and attended span as symbolic sizes (no recompile
    from step to step; see :meth:`ambiguity.models.llamagen.LlamaGenModel.compile_forwards`). Not bit-exact, in
    float64 either: RMSNorm and the rotary product run in float32 and the fused kernels round them
    differently (probabilities differ by up to ~1e-6), so an image occasionally diverges from some
    token on. Raises UsageError (one line) for an adapter or
    drafter whose forward cannot be compiled (the transformers adapters).
    """
    model.compile_forwards()
    if drafter is not None:
        if not hasattr(drafter, "compile_forwards"):
            raise UsageError(f"--compile: the drafter {type(drafter).__name__} cannot be compiled; drop --compile")
        drafter.compile_forwards()


def decode(
    model: TokenModel,
    conditions: Sequence,
    config: DecodeConfig,
    sampling: SamplingConfig,
    drafter: Optional[DraftModel] = None,
    neighbours: Optional[torch.Tensor] = None,
    seed: int = 0,
    num_tokens: Optional[int] = None,
    pixels: bool = False,
    progress: bool = False,
    first_index: int = 0,
    batch_size: int = 1,
    indices: Optional[Sequence[int]] = None,
    compile: bool = False,
    draws: Optional[dict] = None,
) -> Decoded:
    """Decode one image per condition on the engine (:func:`lantern.engine.loop.run`); image ``i``
    draws from its own stream.

    batch_size: images in flight, one target forward per step for all of them (continuous
    batching; 1 decodes one image after another). The random streams are the same at every
    batch size: in float64 the tokens of every image do not depend on it; in float32 batched
    matrix products round differently and an image occasionally diverges at some position (both
    are exact samples of the method).

    conditions: class labels / captions (``model.make_prompt``); config: the method and its
    settings; drafter: required by the drafter methods (checked against the model once);
    neighbours: a (V, >= k) table, built with :func:`neighbour_table` when None and needed;
    pixels: also decode the tokens to images ((B, C, H, W) float32 in [0, 1]); first_index:
    image index of ``conditions[0]``; image ``i``'s generator is
    :func:`ambiguity.seeding.image_generator` ``(seed, i)``, so the same seed and condition give
    the same random stream for every method and every batching or sharding of the run;
    indices: the image index of each condition when they are not ``first_index, first_index + 1, ...``;
    compile: run the target's (and the drafter's) cached forwards through ``torch.compile``
    (:func:`compile_forwards`); draws: {image index: :class:`lantern.engine.slots.Draws`} whose
    coins and categorical draws replace that image's generator (exact enumeration in the tests).
    Returns the :class:`~lantern.engine.records.Decoded` (rows in condition order). Raises
    UsageError for a missing or mismatched drafter, a batch size below 1, a batch that does not
    fit in memory, a model that cannot decode on the slot engine or (with ``compile``) a model or
    drafter whose forward cannot be compiled.
    """
    check_batch_size(batch_size)
    method = build_method(model, config, drafter, neighbours, num_tokens)
    uses_drafter = drafter if config.speculative else None
    if compile:
        compile_forwards(model, uses_drafter)
    check_batching(model, uses_drafter)
    N = int(num_tokens or model.num_tokens)
    B = max(1, min(batch_size, len(conditions)))
    check_batch(model, B, N + method.spare + PREFIX_ROOM, "--batch-size", 1 + sampling.guided)
    index = image_indices(len(conditions), first_index, indices)
    result = run(model, method, conditions, sampling, index, seed, batch_size, num_tokens, progress, draws)
    if pixels:
        h, w = model.grid
        result.pixels = torch.cat(
            [model.decode_codes(chunk.view(-1, h, w).to(model.device)).cpu() for chunk in result.tokens.split(B)]
        )
    result.settings = {**config.as_dict(), **{f"sampling_{k}": v for k, v in sampling.as_dict().items()}}
    return result


def build_method(
    model: TokenModel,
    config: DecodeConfig,
    drafter: Optional[DraftModel],
    neighbours: Optional[torch.Tensor],
    num_tokens: Optional[int] = None,
) -> Method:
    """The :class:`~lantern.engine.method.Method` that decodes ``config`` on ``model``, its inputs
    checked once: the draft depth against the image, the Jacobi knobs against the model, the
    drafter against the model (fingerprint), the neighbour table (built when None and needed).
    Raises UsageError naming the fix."""
    check_depth(config, model, num_tokens)
    check_params(config, model)
    table = None
    if config.speculative:
        if drafter is None:
            raise UsageError(f"method {config.method} needs a drafter; pass --drafter or use --method ar")
        check_drafter(drafter, model)
        if neighbours is None:
            neighbours = neighbour_table(model, config)
        table = config.rule.prepare_table(neighbours, model.vocab_size, model.device)
    return PLUGINS[config.method].build(config, model, drafter, table)
