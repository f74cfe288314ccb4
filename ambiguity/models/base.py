"""The one protocol every model of the toolkit follows.

A *target model* here is anything that emits discrete tokens one at a time: a visual AR
generator over VQ codes (LlamaGen, Anole/Chameleon, Janus, Emu3, the embedded model) or a text
LM (the text twin, any Hugging Face causal LM). The profiler, the neighbourhood builder, the
drafter and the LANTERN decoder talk to models only through :class:`TokenModel`.

Index spaces
------------
All logits, probabilities, tokens and neighbourhoods are over the model's *image tokens* in
**code-index order**: column ``c`` of ``logits`` is code ``c`` of the VQ codebook, whose id in
the model's full vocabulary is ``image_token_ids[c]``. Adapters translate to and from
vocabulary ids internally (:meth:`TokenModel.to_vocab_ids`, :meth:`TokenModel.to_code_indices`).
For text models the "image tokens" are the whole vocabulary and the map is the identity.

Rows and classifier-free guidance
---------------------------------
A :class:`Prompt` for ``B`` conditions has ``rows = B`` or, with CFG, ``rows = 2B``: the
conditional rows first, then the unconditional rows in the same order (the LlamaGen layout).
Every call returns per-row outputs; :func:`ambiguity.sampling.split_rows` and
:func:`ambiguity.sampling.guide` combine them.

Decoding calls
--------------
One cache protocol, the slot cache of the decoding engine (:mod:`lantern.engine.loop`): ``cache =
model.new_slots_cache(B, guided, N, spare)`` holds ``B`` images, each at its own position;
``model.prefill_slots(cache, rows, prompt)`` runs a prompt's prefix into chosen rows and gives the
distribution of the first image token; ``model.extend_slots(cache, tokens, slots, positions,
visible)`` writes every row's tokens at its own image slots and returns, for each, the distribution
of the *next* token, each token attending to the slots ``visible`` allows (a rejected draft is
simply never visible again; a draft tree's nodes see their ancestors); ``select_slots`` drops rows
(a draining batch) and ``move_slots`` copies entries (the accepted path of a tree).
:func:`ambiguity.generation.sample_tokens` and :meth:`TokenModel.teacher_force` decode on it too.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn as nn

from ambiguity.errors import UsageError

__all__ = [
    "Prompt",
    "Step",
    "TokenModel",
    "DraftLayer",
    "resolve_device",
    "compile_refusal",
    "check_ids",
    "COMPILING_MODELS",
]


#: image tokens whose embedding and head rows :meth:`TokenModel.weights_digest` reads
DIGEST_ROWS = 16

#: the models whose cached forwards ``--compile`` can run through torch.compile (LlamaGen architecture)
COMPILING_MODELS = "embedded, embedded-16, llamagen-*, text-twin"


def compile_refusal(name: str) -> str:
    """The one-line refusal of ``--compile`` for the model ``name`` (an eager-only adapter)."""
    return (
        f"--compile works for the LlamaGen-architecture models ({COMPILING_MODELS}); "
        f"{name} runs eager only, drop --compile"
    )


def check_ids(ids: torch.Tensor, n: int, source: str, what: str = "image code", fix: str = "") -> None:
    """Refuse token ids outside ``0..n-1`` where they enter a model (the embedding would raise an
    ``IndexError``, or silently wrap a negative id to the end of the table).

    Args:
        ids: integer tensor of any shape (any device; read once, a host sync on CUDA).
        n: the size of the table the ids index (image codes V, or the embedding rows).
        source: where the ids come from, e.g. ``"the codes given to embedded.embed"`` or a file name.
        what: the kind of id for the message (``"image code"``, ``"token id"``).
        fix: what the user should do, appended after ``"; "`` (default: pass ids of this model).

    Raises :class:`ambiguity.errors.UsageError` (one line naming the first bad id, ``source`` and
    the valid range) for an id < 0 or >= n, or a tensor that does not hold integers.
    """
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise UsageError(f"{source} are {str(ids.dtype).replace('torch.', '')} values; {what}s must be integers")
    bad = ids[(ids < 0) | (ids >= n)]
    if bad.numel():
        hint = fix or f"pass {what}s of this model (made by its own tokenizer)"
        raise UsageError(f"{source}: {what} {int(bad.reshape(-1)[0])} is outside the valid range 0..{n - 1}; {hint}")


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"``/``None`` -> CUDA when available, else CPU; ``"cpu"``, ``"cuda"``, ``"cuda:N"``.

    Raises :class:`ambiguity.errors.UsageError` for another name, or when CUDA (or GPU N) is
    asked for but absent.
    """
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {device} was given but no CUDA device is visible; use --device cpu or auto")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: only {torch.cuda.device_count()} CUDA devices are visible")
    return dev


@dataclass
class Prompt:
    """Conditioning for a batch of ``batch_size`` images (or text continuations).

    ``inputs`` is adapter-specific (class labels, caption features and masks, token ids).
    ``conditions`` keeps what the user gave (labels or strings) for tables and captions.
    ``rows`` is ``2 * batch_size`` when ``guided`` (conditional rows first, then the unconditional
    rows classifier-free guidance needs), else ``batch_size``.
    """

    inputs: Any
    batch_size: int
    guided: bool
    conditions: list = field(default_factory=list)

    @property
    def rows(self) -> int:
        return 2 * self.batch_size if self.guided else self.batch_size


@dataclass
class Step:
    """Model outputs at ``T`` consecutive positions.

    ``logits``: (rows, T, V) float32 over image tokens in code-index order; position ``t``
    predicts the token that follows the ``t``-th input.
    ``hidden``: (rows, T, H), the last hidden states (after the final norm: the input of the
    output head), in the model's dtype.
    """

    logits: torch.Tensor
    hidden: torch.Tensor


class DraftLayer(nn.Module, abc.ABC):
    """One decoder layer of the target's architecture, with its own KV cache, for EAGLE drafters.

    ``forward(x, cache, start, positions=None, attend=None)``: x (rows, T, H) at image-token
    positions ``start..start+T-1`` -> (rows, T, H), written at cache positions ``start..``; with
    ``positions`` (T,) int64 (draft-tree nodes) the inputs take those positions, are appended
    after the cache and see the cache positions ``attend`` (T, cache length + T) bool allows.
    ``new_cache(rows, spare)``: a cache for ``rows`` rows with room for one image and ``spare``
    draft-tree nodes; ``rollback(cache, n)`` keeps its first ``n`` positions. The layer's
    batched decoding is :meth:`forward_slots` (the target's slot protocol, see :class:`TokenModel`).
    """

    @abc.abstractmethod
    def new_cache(self, rows: int, spare: int = 0) -> Any: ...

    @abc.abstractmethod
    def rollback(self, cache: Any, n: int) -> None: ...

    @abc.abstractmethod
    def forward(
        self,
        x: torch.Tensor,
        cache: Any,
        start: int,
        positions: Optional[torch.Tensor] = None,
        attend: Optional[torch.Tensor] = None,
    ) -> torch.Tensor: ...

    def forward_slots(
        self, x: torch.Tensor, cache: Any, slots: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor | int
    ) -> torch.Tensor:
        """Batched decoding (see :meth:`TokenModel.extend_slots`): x (rows, T, H) written at cache
        slots (rows, T), rotary positions (rows, T), attending to the slots ``visible`` (rows, T, S)
        allows -> (rows, T, H); ``visible`` an int S with T = 1: every row writes slot S - 1 and sees
        the slots 0..S-1. Raises NotImplementedError when the layer cannot batch."""
        raise NotImplementedError(f"{type(self).__name__} cannot decode several images per forward")

    def select_slots(self, cache: Any, rows: torch.Tensor) -> None:
        """Keep only the rows ``rows`` (int64, in this order) of a batched decode's cache (a draining
        batch). The default calls ``cache.select_rows(rows)``."""
        cache.select_rows(rows)

    def compile_forwards(self) -> None:
        """Run the cached forwards through ``torch.compile`` from now on (``--compile``). Raises
        UsageError when the layer's forward cannot be compiled (the default)."""
        raise UsageError(f"--compile: the drafter layer {type(self).__name__} cannot be compiled; drop --compile")


class TokenModel(abc.ABC):
    """A target model behind the toolkit's protocol (see the module docstring).

    Attributes every adapter sets:

    * ``name`` (str): registry name, e.g. ``"embedded"``, ``"llamagen-c2i-b"``.
    * ``kind`` (str): ``"c2i"`` (class labels), ``"t2i"`` (captions) or ``"text"``.
    * ``grid`` (tuple[int, int]): token grid (h, w) of one image; for text ``(1, length)``.
    * ``num_classes`` (int | None): for ``c2i``.
    * ``class_names`` (list[str] | None): for ``c2i`` when known.
    * ``image_token_ids`` (LongTensor, (V,)): vocabulary id of each code index.
    * ``hidden_size`` (int), ``device`` (torch.device), ``dtype`` (torch.dtype).
    """

    name: str = "model"
    kind: str = "c2i"
    grid: tuple[int, int] = (16, 16)
    num_classes: Optional[int] = None
    class_names: Optional[list[str]] = None
    image_token_ids: torch.Tensor
    hidden_size: int
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32

    # ----------------------------------------------------------------- sizes
    @property
    def vocab_size(self) -> int:
        """Number of image tokens V (= codebook size), the width of every logits tensor."""
        return int(self.image_token_ids.numel())

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the images :meth:`decode_codes` returns and :meth:`encode_images` takes."""
        raise NotImplementedError(f"{self.name} has no pixel space")

    @property
    def num_tokens(self) -> int:
        """Image tokens per image, h * w."""
        return self.grid[0] * self.grid[1]

    def to_vocab_ids(self, codes: torch.Tensor) -> torch.Tensor:
        """Code indices (any shape, int64) -> vocabulary ids, same shape. Raises UsageError for a
        code outside ``0..V-1`` (:func:`check_ids`)."""
        check_ids(codes, self.vocab_size, f"the codes given to {self.name}.to_vocab_ids")
        return self.lookup_vocab_ids(codes)

    def lookup_vocab_ids(self, codes: torch.Tensor) -> torch.Tensor:
        """:meth:`to_vocab_ids` without the range check, for codes known to be in ``0..V-1``
        (sampled by the model, or checked where they entered)."""
        return self.image_token_ids.to(codes.device)[codes]

    def to_code_indices(self, vocab_ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids -> code indices; raises ValueError for ids that are not image tokens."""
        ids = self.image_token_ids.to(vocab_ids.device)
        lookup = torch.full((int(ids.max()) + 1,), -1, dtype=torch.long, device=ids.device)
        lookup[ids] = torch.arange(ids.numel(), device=ids.device)
        if (vocab_ids > ids.max()).any() or (lookup[vocab_ids.clamp(max=int(ids.max()))] < 0).any():
            raise ValueError("some vocabulary ids are not image tokens of this model")
        return lookup[vocab_ids]

    # ---------------------------------------------------------- conditioning
    @abc.abstractmethod
    def make_prompt(self, conditions: Sequence | torch.Tensor, guided: bool = False) -> Prompt:
        """Class labels (c2i), captions (t2i) or prompts (text) -> :class:`Prompt`.

        Raises :class:`ambiguity.errors.UsageError` for conditions the model cannot take.
        """

    def default_conditions(self, n: int, seed: int = 0) -> list:
        """Conditions to use when the user gives none: classes round-robin for c2i."""
        if self.kind == "c2i" and self.num_classes:
            return [i % self.num_classes for i in range(n)]
        raise NotImplementedError(f"{self.name} needs explicit conditions (captions or prompts)")

    # ------------------------------------------------- compiled forwards
    def compile_forwards(self) -> None:
        """Run the cached target forwards through ``torch.compile`` from now on (``--compile``;
        idempotent). Raises UsageError when the adapter's forward cannot be compiled (the default:
        only the LlamaGen-architecture models, whose KV cache is a static buffer, can)."""
        raise UsageError(compile_refusal(self.name))

    # ------------------------------------------------- decoding: the slot cache (many images in flight)
    #: whether :meth:`new_slots_cache`, :meth:`prefill_slots` and :meth:`extend_slots` work, and why not
    #: (every adapter of the toolkit decodes on them; a transformers decoder with layers the slot
    #: cache does not model names them in ``batch_limit``)
    can_batch_decode: bool = False
    batch_limit: str = "its adapter has no per-image cache positions and 2D attention masks"

    def new_slots_cache(self, slots: int, guided: bool, num_tokens: int, spare: int = 0) -> Any:
        """A KV cache for ``slots`` images decoded together (``2 * slots`` rows with guidance:
        conditional rows ``0..slots-1``, then unconditional rows in the same order), each with room
        for ``num_tokens + spare`` image positions. Every slot keeps its own length (the caller's);
        the cache is preallocated once and updated in place (:meth:`prefill_slots`,
        :meth:`extend_slots`). Raises NotImplementedError when the adapter cannot batch."""
        raise NotImplementedError(
            f"{self.name} cannot decode several images per forward (its adapter has no per-image cache positions)"
        )

    def prefill_slots(self, cache: Any, rows: torch.Tensor, prompt: Prompt) -> Step:
        """Run ``prompt``'s prefix and store it in cache rows ``rows`` (prompt.rows,) int64 (a new image
        takes a freed slot). Returns the Step (prompt.rows, 1, .) of the first image token."""
        raise NotImplementedError(f"{self.name} cannot decode several images per forward")

    def extend_slots(
        self, cache: Any, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor
    ) -> Step:
        """Every row appends T tokens at its own image positions, in one forward.

        tokens: (rows, T) int64 code indices; slots: (rows, T) int64 image positions (cache slots
        after the prefix) the tokens' keys/values are written to; positions: (rows, T) int64 image
        positions of the tokens (rotary embedding; < num_tokens); visible: (rows, T, S) bool, which
        image slots ``0..S-1`` each token attends to (the prefix is always seen), or an int ``S``
        when every token sees all of them (one token per row, every row at one position: no mask).
        Returns a Step (rows, T, .). Rows that carry padding simply see nothing new of it."""
        raise NotImplementedError(f"{self.name} cannot decode several images per forward")

    def select_slots(self, cache: Any, rows: torch.Tensor) -> None:
        """Keep only the cache rows ``rows`` (int64, in this order): a draining batch drops its empty slots."""
        raise NotImplementedError(f"{self.name} cannot decode several images per forward")

    def move_slots(self, cache: Any, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Batched draft trees: copy each row's keys/values at image slots ``src`` (rows, m) int64 to
        ``dst`` (rows, m) (all read before any is written; the accepted path of a verified tree moved
        behind its image's committed tokens). A pair with
        ``src == dst`` leaves that slot as it is. Raises NotImplementedError when the adapter cannot batch."""
        raise NotImplementedError(f"{self.name} cannot decode several images per forward")

    def teacher_force(self, prompt: Prompt, tokens: torch.Tensor) -> Step:
        """Logits and hidden states (rows, N, .) for known sequences tokens (rows, N).

        Position ``t`` predicts ``tokens[:, t]`` from the prefix and ``tokens[:, :t]``.
        The default runs on the slot cache: :meth:`prefill_slots`, then one :meth:`extend_slots` of
        ``tokens[:, :-1]`` at slots and positions ``0..N-2``, causally visible. Raises UsageError for
        a code outside ``0..V-1`` (:func:`check_ids`).
        """
        check_ids(tokens, self.vocab_size, f"the codes given to {self.name}.teacher_force")
        N = tokens.shape[1]
        cache = self.new_slots_cache(prompt.batch_size, prompt.guided, N)
        first = self.prefill_slots(cache, torch.arange(prompt.rows, device=self.device), prompt)
        if N == 1:
            return first
        at = torch.arange(N - 1, device=self.device)
        where = at[None].expand(prompt.rows, -1)
        visible = (at[None, :] <= at[:, None])[None].expand(prompt.rows, -1, -1)
        rest = self.extend_slots(cache, tokens[:, :-1].to(self.device), where, where, visible)
        return Step(torch.cat([first.logits, rest.logits], 1), torch.cat([first.hidden, rest.hidden], 1))

    # ------------------------------------------------------ drafter support
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Frozen input embeddings of image tokens: (rows, T) int64 code indices -> (rows, T, H) in
        the model's dtype. Raises UsageError for a code outside ``0..V-1`` (:func:`check_ids`); codes
        the model produced itself (decoding) go through :meth:`embed_codes` unchecked."""
        check_ids(tokens, self.vocab_size, f"the codes given to {self.name}.embed")
        return self.embed_codes(tokens)

    @abc.abstractmethod
    def embed_codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """:meth:`embed` without the range check, for codes known to be in ``0..V-1`` (sampled by the
        model, or checked where they entered): (rows, T) int64 -> (rows, T, H)."""

    @abc.abstractmethod
    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Frozen output head restricted to image tokens: (..., H) -> float32 logits (..., V)."""

    def draft_layer(self) -> DraftLayer:
        """A freshly initialised decoder layer of this model's architecture (EAGLE drafter)."""
        raise NotImplementedError(f"{self.name} does not provide a drafter layer")

    # --------------------------------------------------- codebook and pixels
    def codebook(self) -> torch.Tensor:
        """VQ codebook vectors (V, d) float32 in code-index order, as the quantiser compares them."""
        raise NotImplementedError(f"{self.name} has no VQ codebook")

    def raw_codebook(self) -> torch.Tensor:
        """The stored codebook weights (V, d) float32 before any normalisation the quantiser applies.

        Equal to :meth:`codebook` unless the tokenizer normalises its codes (LlamaGen, Janus).
        The official LANTERN code measures latent distances on these raw weights.
        """
        return self.codebook()

    def input_embeddings(self) -> torch.Tensor:
        """Rows of the AR model's input embedding for image tokens, (V, H) float32."""
        return self.embed_codes(torch.arange(self.vocab_size, device=self.device)[None])[0].float()

    def output_embeddings(self) -> torch.Tensor:
        """Rows of the AR model's output head for image tokens, (V, H) float32."""
        raise NotImplementedError(f"{self.name} does not expose its output head rows")

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Code grids (B, h, w) int64 -> images (B, C, H, W) float32 in [0, 1], C in {1, 3}."""
        raise NotImplementedError(f"{self.name} cannot decode tokens to pixels (no VQ decoder weights)")

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) float in [0, 1] -> code grids (B, h, w) int64."""
        raise NotImplementedError(f"{self.name} has no VQ encoder")

    @property
    def can_decode(self) -> bool:
        return type(self).decode_codes is not TokenModel.decode_codes

    @torch.no_grad()
    def weights_digest(self) -> str:
        """What tells two checkpoints of one architecture apart: the first 16 hex digits of the
        SHA-256 of the float32 bytes of the input-embedding rows (:meth:`embed`) and output-head
        rows (:meth:`output_embeddings`; :meth:`head` of a fixed unit probe where an adapter does not
        expose them) of :data:`DIGEST_ROWS` evenly spaced image tokens.

        Run records carry it (:meth:`describe`), so a run directory computed with other weights
        (e.g. a retrained shipped model) is refused instead of resumed into a mix. The rows are
        read, not computed, for every adapter with a lookup embedding, so the digest is the same
        in every process on one device type and dtype (which :meth:`describe` also records).
        """
        rows = torch.linspace(0, self.vocab_size - 1, DIGEST_ROWS).round().long().to(self.device)
        emb = self.embed_codes(rows[None])[0].float().cpu()
        try:
            out = self.output_embeddings()[rows].float().cpu()
        except NotImplementedError:
            probe = torch.ones(self.hidden_size, device=self.device, dtype=self.dtype)
            out = self.head(probe[None])[0, rows].float().cpu()
        h = hashlib.sha256(emb.contiguous().numpy().tobytes())
        h.update(out.contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def describe(self) -> dict:
        """Facts for summaries and run records: name, kind, grid, vocabulary, hidden size, device,
        dtype and :meth:`weights_digest` (adapters add parameter counts and the like)."""
        return {
            "model": self.name,
            "kind": self.kind,
            "grid": list(self.grid),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "weights_digest": self.weights_digest(),
        }
