"""The EAGLE drafter: one decoder layer that predicts the target model's next last-hidden state.

EAGLE (Li et al., 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
arXiv 2401.15077, Sec. 4.1) drafts at the feature level. At image-token position ``i`` the
drafter takes

* the target's frozen input embedding of the token ``x_i`` and
* the feature ``f_{i-1}``: the target's last hidden state at the position of ``x_{i-1}`` (the
  one that predicted ``x_i``; for ``i = 0`` the last prefix position), or, when drafting ahead,
  the drafter's own previous prediction,

concatenates them, maps them back to the hidden size with ``fc: Linear(2H -> H)``, runs one
decoder layer of the target's own architecture (:meth:`TokenModel.draft_layer`, with the
target's positions and its own KV cache) and returns the predicted feature ``f_i``. The
target's frozen output head turns ``f_i`` into logits for ``x_{i+1}``. LANTERN (Jang et al.,
ICLR 2025, arXiv 2410.03355, Sec. 5 and App. B) uses exactly this drafter for LlamaGen and
Anole.

Only ``fc`` and the layer are the drafter's own weights; the embedding and the head stay in the
target and are passed in as ``model`` on every call. Under classifier-free guidance the drafter
runs on all rows (conditional rows first, then unconditional) with the target features of the
matching row.

Draft vocabulary (EAGLE-3, Li et al., 2025, arXiv 2503.01840, Sec. 3: the drafter predicts over
the most frequent tokens only): a drafter may carry ``draft_vocab``, the V_d codes (ascending)
that hold most of the target's probability mass (:mod:`lantern.drafter.vocab` chooses them). Its
head is then a row slice of the target's head, V_d x H instead of V x H, and its q
(:func:`draft_q`) is a distribution on the full vocabulary that is exactly zero outside the draft
vocabulary (logits -inf there), through the same guidance / temperature / top-k / top-p pipeline.

Files are safetensors (``fc.*``, ``layer.*`` and, when set, the int64 ``draft_vocab``) with the
config, the target fingerprint (:func:`target_fingerprint`) and training information as JSON
metadata.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Any, Optional, Protocol, runtime_checkable

import torch
import torch.nn as nn

from ambiguity.errors import UsageError
from ambiguity.io import save_tensors
from ambiguity.models.base import DraftLayer, TokenModel
from ambiguity.models.checkpoints import check_finite, load_strict, read_safetensors
from ambiguity.seeding import FINGERPRINT_PROBE_SEED

__all__ = [
    "DraftModel",
    "Drafter",
    "load_drafter",
    "draft_q",
    "check_draft_vocab",
    "drafter_digest",
    "target_fingerprint",
    "fingerprint_mismatch",
    "shipped_drafter_path",
    "accuracy_table_path",
    "shipped_accuracy_path",
    "WEIGHTS_DIR",
    "FORMAT",
]

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"  # lantern/weights
FORMAT = "lantern-eagle-drafter/1"
_PROBES = 8  # logits / embedding values recorded to tell two weight sets of one architecture apart


def shipped_drafter_path(model_name: str) -> Path:
    """Where the drafter shipped for ``model_name`` lives: ``lantern/weights/<name>_drafter.safetensors``."""
    return WEIGHTS_DIR / f"{model_name.replace('/', '_').replace(':', '_')}_drafter.safetensors"


def accuracy_table_path(drafter_path: str | Path) -> Path:
    """``x/name.safetensors`` -> ``x/name_accuracy.parquet`` (the table written next to a drafter)."""
    p = Path(drafter_path)
    return p.with_name(p.name.removesuffix(".safetensors") + "_accuracy.parquet")


def shipped_accuracy_path(model_name: str) -> Optional[Path]:
    """The test-accuracy table of the drafter shipped for ``model_name``, or None when there is none
    (what ``python -m lantern.drafter.comparison`` gives :func:`ambiguity.compare.compare`)."""
    path = accuracy_table_path(shipped_drafter_path(model_name))
    return path if path.is_file() else None


@runtime_checkable
class DraftModel(Protocol):
    """The drafter seam of :mod:`lantern.engine.decode`: what a decoder needs from a drafter network.

    ``target``: the fingerprint of the target model it was built for (:func:`target_fingerprint`).
    ``new_cache(rows, spare=0)`` / ``rollback(cache, n)``: its own KV cache (with room for
    ``spare`` draft-tree nodes), kept to the first ``n``
    image-token positions after a rejection. ``__call__(model, tokens (rows, T), features
    (rows, T, H), cache, start, positions=None, attend=None)`` -> predicted features (rows, T, H)
    for positions ``start .. start + T - 1`` (or, for draft-tree nodes, at ``positions`` with the
    visibility ``attend``, appended after the cache); ``logits(model, features (..., H))`` -> float32 (..., V) through
    the target's frozen head. :class:`Drafter` (EAGLE) implements it. Optional:
    ``compile_forwards()`` (``--compile``; :func:`lantern.engine.decode.compile_forwards` refuses a
    drafter without it); ``draft_vocab`` ((V_d,) int64 or None) with ``draft_logits(model, features)``
    -> (..., V_d), the drafter's head restricted to a draft vocabulary (:func:`draft_q`).
    """

    target: dict

    def new_cache(self, rows: int, spare: int = 0) -> Any: ...

    def rollback(self, cache: Any, n: int) -> None: ...

    def __call__(
        self,
        model: TokenModel,
        tokens: torch.Tensor,
        features: torch.Tensor,
        cache: Any = None,
        start: int = 0,
        positions: Optional[torch.Tensor] = None,
        attend: Optional[torch.Tensor] = None,
    ) -> torch.Tensor: ...

    def logits(self, model: TokenModel, features: torch.Tensor) -> torch.Tensor: ...


def _draft_layer(model: TokenModel) -> DraftLayer:
    try:
        return model.draft_layer()
    except NotImplementedError:
        raise UsageError(
            f"{model.name} has no drafter layer (its adapter lacks draft_layer()); "
            f"use a model whose adapter exposes hidden states and a decoder layer"
        ) from None


def _train_hint(name: str) -> str:
    return f"train one with python -m lantern.drafter.train --model {name}"


@torch.no_grad()
def target_fingerprint(model: TokenModel) -> dict:
    """What identifies a target model for a drafter: name, kind, sizes, grid and weight probes.

    ``head_probe``: the frozen head's logits (float32) at ``_PROBES`` evenly spaced code indices
    for a fixed unit-RMS probe feature (seed 0); ``embed_probe``: the first ``_PROBES`` channels
    of the input embedding of code ``V // 2``. Two checkpoints of one architecture differ
    there, so a drafter trained for one is refused for the other (:func:`fingerprint_mismatch`).
    Returns a JSON-able dict.
    """
    H, V = model.hidden_size, model.vocab_size
    gen = torch.Generator().manual_seed(FINGERPRINT_PROBE_SEED)
    probe = torch.randn(H, generator=gen)
    probe = probe / probe.pow(2).mean().sqrt()
    logits = model.head(probe.to(model.device, model.dtype)[None])[0].float().cpu()
    at = torch.linspace(0, V - 1, _PROBES).round().long()
    emb = model.embed_codes(torch.tensor([[V // 2]], device=model.device))[0, 0, :_PROBES].float().cpu()
    return {
        "name": model.name,
        "kind": model.kind,
        "hidden_size": int(H),
        "vocab_size": int(V),
        "grid": [int(g) for g in model.grid],
        "num_classes": model.num_classes,
        "head_probe": [round(float(v), 6) for v in logits[at]],
        "embed_probe": [round(float(v), 6) for v in emb],
    }


def _close(a: list, b: list) -> bool:
    """Probe values agree up to bf16/fp16 rounding (5 % of the larger magnitude)."""
    ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    if ta.shape != tb.shape:
        return False
    scale = max(float(ta.abs().max()), float(tb.abs().max()), 1e-6)
    return bool(((ta - tb).abs() <= 0.05 * scale + 1e-4).all())


def fingerprint_mismatch(saved: dict, current: dict) -> Optional[str]:
    """None when a drafter trained for ``saved`` fits ``current``; else why not (one phrase).

    Compares name, kind, hidden size, vocabulary size and grid exactly and the weight probes
    up to dtype rounding (:func:`target_fingerprint`).
    """
    for key in ("name", "kind", "hidden_size", "vocab_size", "grid"):
        if key in saved and saved[key] != current.get(key):
            if key == "name":
                return f"{saved['name']}"
            return f"{saved.get('name')} with {key} {saved[key]}"
    for key in ("head_probe", "embed_probe"):
        if key in saved and key in current and not _close(saved[key], current[key]):
            return f"{saved.get('name')} with other weights"
    return None


class Drafter(nn.Module):
    """EAGLE drafter (Li et al., 2024, arXiv 2401.15077): input = concat(target's frozen token
    embedding of token x_i, a feature f_{i-1}) -> fc: Linear(2H -> H) -> one decoder layer of the
    target's architecture (``model.draft_layer()``) -> predicted feature f_i; logits = target's
    frozen output head(f_i) predict x_{i+1}.

    Attributes: ``fc`` (Linear(2H, H), with bias as in EAGLE), ``layer`` (a
    :class:`~ambiguity.models.base.DraftLayer`), ``target`` (:func:`target_fingerprint` of the
    model it was built for), ``info`` (training information, JSON-able dict; empty when fresh).
    """

    def __init__(self, layer: DraftLayer, hidden_size: int, target: dict, info: Optional[dict] = None):
        super().__init__()
        self.hidden_size = int(hidden_size)
        self.fc = nn.Linear(2 * self.hidden_size, self.hidden_size, bias=True)
        self.layer = layer
        self.target = dict(target)
        self.info = dict(info or {})
        self.register_buffer("draft_vocab", None)  # (V_d,) int64 ascending, or None: the full vocabulary
        self._head_rows = None  # (model id, device, dtype, vocab) -> head rows of the draft vocab (draft_logits)

    # ------------------------------------------------------------------ building
    @classmethod
    def for_target(cls, model: TokenModel, dtype: Optional[torch.dtype] = None, seed: Optional[int] = None) -> Drafter:
        """A freshly initialised drafter for ``model`` on its device, in ``dtype`` (default the
        model's). ``seed`` makes the initialisation reproducible without touching the global RNG.

        Raises UsageError when the adapter has no ``draft_layer()``.
        """
        fork = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
        with fork:
            if seed is not None:
                torch.manual_seed(seed)
            layer = _draft_layer(model)
            drafter = cls(layer, model.hidden_size, target_fingerprint(model))
        return drafter.to(model.device, dtype or model.dtype)

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the drafter's weights (its outputs come in this dtype)."""
        return self.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        """Device of the drafter's weights."""
        return self.fc.weight.device

    # ------------------------------------------------------------------ KV cache
    def new_cache(self, rows: int, spare: int = 0) -> Any:
        """A fresh drafter-layer KV cache for ``rows`` rows: all image-token positions of one image
        plus room for ``spare`` draft-tree nodes."""
        return self.layer.new_cache(rows, spare)

    def rollback(self, cache: Any, n: int) -> None:
        """Keep the first ``n`` drafter positions (image tokens 0..n-1) of every row; drop the rest."""
        self.layer.rollback(cache, n)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        model: TokenModel,
        tokens: torch.Tensor,
        features: torch.Tensor,
        cache: Any = None,
        start: int = 0,
        positions: Optional[torch.Tensor] = None,
        attend: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Predicted features for ``T`` consecutive image-token positions.

        Args:
            model: the target (its frozen ``embed_codes`` is used; it is not modified).
            tokens: (rows, T) int64 code indices ``x_{start} .. x_{start+T-1}``.
            features: (rows, T, H) any float dtype; position ``i`` holds ``f_{start+i-1}``, the
                target's last hidden state at the position that predicted ``x_{start+i}`` (or the
                drafter's own previous prediction when drafting ahead).
            cache: from :meth:`new_cache`, or None for a plain causal pass over the ``T``
                positions (training). With a cache the positions before ``start`` must be in
                it; entries at ``>= start`` are overwritten.
            start: absolute image-token index of ``tokens[:, 0]`` (sets the rotary positions).
            positions, attend: draft-tree nodes (see :class:`ambiguity.models.base.DraftLayer`):
                (T,) int64 image positions and (T, cache length + T) bool visibility.
        Returns:
            (rows, T, H) predicted features ``f_{start} .. f_{start+T-1}`` in the drafter's dtype.
        """
        with torch.no_grad():
            emb = model.embed_codes(tokens.to(model.device))
        x = torch.cat([emb.to(self.dtype), features.to(self.device, self.dtype)], dim=-1)
        return self.layer(self.fc(x), cache, start, positions, attend)

    def compile_forwards(self) -> None:
        """Run the drafter layer's cached forwards through ``torch.compile`` from now on (``--compile``;
        idempotent; ``fc`` stays eager). Raises UsageError when the layer cannot be compiled."""
        self.layer.compile_forwards()

    def select_slots(self, cache: Any, rows: torch.Tensor) -> None:
        """Keep only the rows ``rows`` (int64) of a batched decode's drafter cache (a draining batch)."""
        self.layer.select_slots(cache, rows.to(self.device))

    def forward_slots(
        self,
        model: TokenModel,
        tokens: torch.Tensor,
        features: torch.Tensor,
        cache: Any,
        slots: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor | int,
    ) -> torch.Tensor:
        """Batched decoding: every row runs T positions at its own cache slots (rows, T) int64 and
        rotary positions (rows, T), seeing the slots ``visible`` (rows, T, S) bool (or int S) allows (see
        :meth:`ambiguity.models.base.DraftLayer.forward_slots`); tokens (rows, T), features
        (rows, T, H) as in :meth:`forward`. Returns (rows, T, H) in the drafter's dtype. Raises
        NotImplementedError when the layer cannot batch."""
        with torch.no_grad():
            emb = model.embed_codes(tokens.to(model.device))
        x = torch.cat([emb.to(self.dtype), features.to(self.device, self.dtype)], dim=-1)
        return self.layer.forward_slots(self.fc(x), cache, slots, positions, visible)

    def logits(self, model: TokenModel, features: torch.Tensor) -> torch.Tensor:
        """Next-token logits (..., V) float32 from features (..., H) through the target's frozen head
        (the full vocabulary, whatever :attr:`draft_vocab`: training and accuracy use these)."""
        return model.head(features.to(model.dtype))

    def set_draft_vocab(self, vocab: Optional[torch.Tensor]) -> None:
        """Restrict drafting to ``vocab`` ((V_d,) int64 code indices, strictly ascending, in
        ``0..V-1``; :func:`check_draft_vocab`), or lift the restriction with None. Raises UsageError
        for a bad vocabulary."""
        if vocab is not None:
            vocab = check_draft_vocab(vocab, int(self.target.get("vocab_size", 0)) or None)
            vocab = vocab.to(self.device)
        self.draft_vocab = vocab
        self._head_rows = None

    def draft_logits(self, model: TokenModel, features: torch.Tensor) -> torch.Tensor:
        """Logits (..., V_d) over the draft vocabulary (in its order) from features (..., H): the rows
        :attr:`draft_vocab` of the target's frozen head (EAGLE-3's draft vocabulary head, arXiv
        2503.01840), float32 (float64 for a float64 model); the full (..., V) :meth:`logits` without
        a draft vocabulary. The head rows come from ``model.output_embeddings()`` once per model,
        device and dtype; an adapter whose head is not that linear map (checked on a probe) runs
        its full head and keeps the columns."""
        if self.draft_vocab is None:
            return self.logits(model, features)
        rows = self._draft_head_rows(model)
        x = features.to(model.dtype)
        if rows is None:
            return model.head(x)[..., self.draft_vocab.to(x.device)]
        out = torch.nn.functional.linear(x, rows)
        return out if out.dtype == torch.float64 else out.float()

    def _draft_head_rows(self, model: TokenModel) -> Optional[torch.Tensor]:
        """(V_d, H) head rows of the draft vocabulary in the model's dtype, cached; None when the
        adapter exposes no rows or its head is not ``hidden @ rows.T``."""
        key = (id(model), str(model.device), model.dtype, self.draft_vocab.data_ptr())
        if self._head_rows is not None and self._head_rows[0] == key:
            return self._head_rows[1]
        vocab = self.draft_vocab.to(model.device)
        try:
            rows = model.output_embeddings()[vocab].to(model.device, model.dtype)
        except NotImplementedError:
            rows = None
        if rows is not None:
            gen = torch.Generator().manual_seed(FINGERPRINT_PROBE_SEED)
            probe = torch.randn(2, model.hidden_size, generator=gen).to(model.device, model.dtype)
            with torch.no_grad():
                full = model.head(probe)[..., vocab].double()
            mine = torch.nn.functional.linear(probe, rows).double()
            if not torch.allclose(mine, full, rtol=1e-2, atol=1e-3 * float(full.abs().max()) + 1e-6):
                rows = None
        self._head_rows = (key, rows)
        return rows

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path, dtype: torch.dtype = torch.float16, **info) -> Path:
        """Write the drafter's own weights (``fc``, ``layer``; cast to ``dtype``; the int64
        ``draft_vocab`` when set) as safetensors, atomically, with the config, target fingerprint and
        ``self.info`` (updated by ``info``) as JSON metadata. Returns the path."""
        self.info.update(info)
        state = {
            k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()) for k, v in self.state_dict().items()
        }
        meta = {
            "format": FORMAT,
            "config": {"hidden_size": self.hidden_size, "layer": type(self.layer).__name__, "fc_bias": True},
            "target": self.target,
            "training": self.info,
            "dtype": str(dtype).replace("torch.", ""),
        }
        if self.draft_vocab is not None:
            meta["config"]["draft_vocab_size"] = int(self.draft_vocab.numel())
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return save_tensors(state, path, meta)

    @classmethod
    def load(cls, path: str | Path, model: TokenModel) -> Drafter:
        """Rebuild a drafter written by :meth:`save` for ``model`` (on its device and dtype).

        Raises UsageError when the file is absent or unreadable, is not a drafter file, or was
        trained for another target ("drafter was trained for <X>, not <Y>; train one with ...").
        """
        path = Path(path).expanduser()
        if not path.is_file():
            raise UsageError(f"drafter file {path} does not exist; {_train_hint(model.name)} or pass its path")
        state, meta = read_safetensors(path, _train_hint(model.name))
        if meta.get("format") != FORMAT or not isinstance(meta.get("target"), dict):
            raise UsageError(
                f"{path} is not a drafter file written by lantern.drafter.model; {_train_hint(model.name)}"
            )
        current = target_fingerprint(model)
        why = fingerprint_mismatch(meta["target"], current)
        if why is not None:
            these = " (these weights)" if why.endswith("other weights") else ""
            raise UsageError(f"drafter was trained for {why}, not {model.name}{these}; {_train_hint(model.name)}")
        drafter = cls(_draft_layer(model), model.hidden_size, meta["target"], meta.get("training") or {})
        state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
        drafter = drafter.float()
        if "draft_vocab" in state:
            try:
                drafter.set_draft_vocab(state["draft_vocab"])
            except UsageError as e:
                raise UsageError(f"{path}: {e}") from None
        load_strict(drafter, state, path.name)
        check_finite(drafter, f"drafter {path}", _train_hint(model.name))
        return drafter.to(model.device, model.dtype).eval()


def check_draft_vocab(vocab: torch.Tensor, vocab_size: Optional[int] = None) -> torch.Tensor:
    """A draft vocabulary as (V_d,) int64: 1-D, non-empty, strictly ascending code indices in
    ``0..vocab_size-1`` (any range when ``vocab_size`` is None). Returns it as int64; raises
    UsageError naming the problem."""
    if not isinstance(vocab, torch.Tensor) or vocab.ndim != 1 or vocab.numel() == 0:
        raise UsageError(
            "a draft vocabulary is a non-empty 1-D tensor of code indices; rebuild it with lantern.drafter.vocab"
        )
    if vocab.is_floating_point() or vocab.dtype == torch.bool:
        raise UsageError(f"a draft vocabulary holds integer code indices, got {vocab.dtype}; rebuild it")
    vocab = vocab.long()
    if vocab.numel() > 1 and not bool((vocab[1:] > vocab[:-1]).all()):
        raise UsageError(
            "a draft vocabulary must be strictly ascending (no repeats); rebuild it with lantern.drafter.vocab"
        )
    lo, hi = int(vocab[0]), int(vocab[-1])
    if lo < 0 or (vocab_size is not None and hi >= vocab_size):
        raise UsageError(f"draft vocabulary codes must lie in 0..{(vocab_size or 1) - 1}, got {lo}..{hi}; rebuild it")
    return vocab


def draft_q(drafter: DraftModel, model: TokenModel, features: torch.Tensor, to_q) -> torch.Tensor:
    """The drafter's q (B, ..., V) on the full vocabulary from features (rows, ..., H).

    ``to_q``: the sampling pipeline, per-row logits (rows, ..., n) -> distribution (B, ..., n)
    (guidance, temperature, top-k / top-p, softmax; e.g. :meth:`lantern.engine.slots.BatchState.target`).
    Without a ``draft_vocab`` (or for a drafter that has none): ``to_q(drafter.logits(...))``.
    With one (EAGLE-3's draft vocabulary, arXiv 2503.01840): ``to_q`` of the V_d logits
    (:meth:`Drafter.draft_logits`), placed at the draft-vocabulary codes; exactly 0 elsewhere. That
    equals ``to_q`` of full logits that are -inf outside the draft vocabulary (guidance, top-k, top-p
    and softmax never move mass onto a -inf code) without the NaN that guidance would make of
    -inf - -inf. Greedy drafting (argmax of q) therefore picks within the draft vocabulary.
    """
    vocab = getattr(drafter, "draft_vocab", None)
    if vocab is None:
        return to_q(drafter.logits(model, features))
    sub = to_q(drafter.draft_logits(model, features))
    q = sub.new_zeros(*sub.shape[:-1], model.vocab_size)
    q[..., vocab.to(q.device)] = sub
    return q


@torch.no_grad()
def drafter_digest(drafter) -> Optional[str]:
    """First 16 hex digits of the SHA-256 of a drafter's weights (its state dict, tensors in name
    order as float32 bytes), for run records: a run decoded with one drafter file is refused when
    resumed with another, e.g. a retrained shipped drafter. None for None (no drafter) and for a
    drafter that is not an ``nn.Module`` (a custom :class:`DraftModel`: nothing to read)."""
    if not isinstance(drafter, nn.Module):
        return None
    h = hashlib.sha256()
    for name, t in sorted(drafter.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def load_drafter(model: TokenModel, path: str | Path | None = None) -> Drafter:
    """The drafter for ``model``: ``path``, or the one shipped in ``lantern/weights/<name>_drafter.safetensors``.

    Raises UsageError naming the training command when no drafter file exists, and the errors
    of :meth:`Drafter.load`.
    """
    if path is None:
        path = shipped_drafter_path(model.name)
        if not path.is_file():
            raise UsageError(
                f"no drafter is shipped for {model.name} (looked for {path}); "
                f"{_train_hint(model.name)} and pass --drafter FILE"
            )
    return Drafter.load(path, model)
