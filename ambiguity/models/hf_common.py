"""Shared machinery for target models that live behind ``transformers`` classes.

Janus / Janus-Pro, Emu3 and any Hugging Face causal LM (``--model hf:<repo>``) are thin
adapters over a transformers *decoder* (the base model that returns the last hidden states
after the final norm: ``LlamaModel``, ``Emu3TextModel``, ``GPT2Model`` ...). What they share
lives here so the Chameleon/Anole adapter can use it too:

* :func:`run_decoder` - one full decoder call (no past) with left-padding-aware position ids,
  optionally keeping its keys and values in a ``DynamicCache`` (the ``DynamicCache`` helpers live in
  :mod:`ambiguity.models.hf_cache`).
* :class:`HFTokenModel` - the decoding half of :class:`~ambiguity.models.base.TokenModel` for any
  adapter that can embed its prefix and its image tokens: the slot caches of
  :mod:`ambiguity.models.hf_slots` (:class:`~ambiguity.models.hf_slots.SlotKV`,
  :class:`~ambiguity.models.hf_slots.HFSlotsCache`): keys and values preallocated per row and
  written in place at per-row cache indices, a 4D additive attention mask built from each row's
  ``visible`` slots (and, for sliding-window layers, each query's window), per-row position ids
  (:meth:`HFTokenModel.new_slots_cache`, ``prefill_slots``, ``extend_slots``, ``select_slots``,
  ``move_slots``), and ``teacher_force``. Adapters that insert layout tokens between image tokens
  (Emu3's end-of-row) set ``eol_id`` (:meth:`HFTokenModel.expand`, :meth:`HFTokenModel.cache_positions`).
* :class:`HFDraftLayer` - one freshly initialised decoder layer of the target's architecture
  (built from its config) wrapped to the :class:`~ambiguity.models.base.DraftLayer` interface,
  with its own ``DynamicCache`` and rotary positions (and a
  :class:`~ambiguity.models.hf_slots.SlotKV` for batched decoding); in
  :mod:`ambiguity.models.hf_draft_layer`.
* :func:`load_pretrained` / :func:`load_tokenizer` - offline loading from ``--weights`` or the
  local Hugging Face cache (:mod:`ambiguity.models.hub`); absent weights raise
  :class:`~ambiguity.errors.WeightsNotFoundError` naming the repo id to download.

Rows follow the toolkit's CFG layout (conditional rows, then unconditional rows). Prompts of
different lengths are left-padded; padded positions get attention-mask 0 and the position ids
of real tokens count from 0 in every row (``cumsum(mask) - 1``), so a padded row computes what
the same prompt computes alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn as nn

from ambiguity.errors import UsageError
from ambiguity.memory import check_weights_fit
from ambiguity.models.base import Prompt, Step, TokenModel, check_ids
from ambiguity.models.hf_cache import additive_mask, cache_kwarg, new_dynamic_cache, slots_cache_plan
from ambiguity.models.hf_slots import HFSlotsCache
from ambiguity.models.hub import hf_snapshot_dir

__all__ = [
    "HFTokenModel",
    "run_decoder",
    "left_pad_ids",
    "position_ids",
    "load_pretrained",
    "load_tokenizer",
    "rows_of",
    "token_id",
    "token_name",
    "local_dir",
]


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Position ids (rows, T) int64 of positions with mask (rows, T) (1 real, 0 padding).

    A position's id is the number of real positions before it, so left padding does not shift
    the positions of real tokens; padded positions get 0.
    """
    return (mask.cumsum(1) - 1).clamp(min=0)


def run_decoder(decoder: nn.Module, embeds: torch.Tensor, mask: Optional[torch.Tensor] = None, kv=None) -> torch.Tensor:
    """One full call of a transformers decoder on ``embeds`` (rows, T, H); returns hidden (rows, T, H).

    ``mask`` (rows, T) marks real (1) and padded (0) positions (all real when None); the decoder
    builds its own causal (and sliding-window) masks from it. ``kv``: an empty ``DynamicCache`` that
    keeps the call's keys and values (a prompt prefilled for the slots cache), or None. The hidden
    states are the decoder's ``last_hidden_state`` (after the final norm), in the model's dtype.
    """
    rows, T = embeds.shape[:2]
    if mask is None:
        mask = torch.ones(rows, T, dtype=torch.long, device=embeds.device)
    mask = mask.long()
    kwargs: dict[str, Any] = dict(
        inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids(mask), use_cache=kv is not None
    )
    if kv is not None:
        kwargs[cache_kwarg(decoder.forward)] = kv
    return decoder(**kwargs).last_hidden_state


def _attend_decoder(decoder: nn.Module, embeds: torch.Tensor, mask, pos: torch.Tensor, kv: Any) -> torch.Tensor:
    """One call of a transformers decoder whose queries attend to chosen keys: ``embeds`` (rows,
    T, H), ``mask`` the decoder's ``attention_mask`` (an additive (rows, 1, T, keys) mask, or a dict
    of them by layer type: :meth:`HFTokenModel.attention_masks`), ``pos`` (rows, T) int64 position
    ids, ``kv`` the cache the call writes. Returns the hidden states (rows, T, H),
    ``last_hidden_state`` in the model's dtype."""
    kwargs: dict[str, Any] = dict(inputs_embeds=embeds, attention_mask=mask, position_ids=pos, use_cache=True)
    kwargs[cache_kwarg(decoder.forward)] = kv
    return decoder(**kwargs).last_hidden_state


def left_pad_ids(seqs: Sequence[Sequence[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists -> (ids (rows, P) int64, mask (rows, P) int64), left-padded with ``pad_id``."""
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), int(pad_id), dtype=torch.long)
    mask = torch.zeros(len(seqs), P, dtype=torch.long)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, P - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, P - len(s) :] = 1
    return ids.to(device), mask.to(device)


def rows_of(conditions, what: str = "captions") -> list[str]:
    """User conditions -> list of strings; UsageError for tensors, non-strings or an empty list."""
    if torch.is_tensor(conditions):
        raise UsageError(f"this model takes text {what}, not a tensor; pass a list of strings")
    items = [conditions] if isinstance(conditions, str) else list(conditions)
    if not items:
        raise UsageError(f"no {what} given; pass at least one (one per line in the {what} file)")
    bad = [c for c in items if not isinstance(c, str)]
    if bad:
        raise UsageError(f"{what} must be strings, got {type(bad[0]).__name__}; pass text, e.g. from a {what} file")
    return items


def token_id(tokenizer, token: str, what: str) -> int:
    """Vocabulary id of a special token string; UsageError when the tokenizer lacks it."""
    i = tokenizer.convert_tokens_to_ids(token)
    unk = getattr(tokenizer, "unk_token_id", None)
    if i is None or (unk is not None and i == unk and token != getattr(tokenizer, "unk_token", None)):
        raise UsageError(f"the tokenizer has no {what} token {token!r}; pass the checkpoint's own tokenizer files")
    return int(i)


def token_name(tokenizer, i: int) -> str:
    """`` ('word')``: the string a tokenizer (transformers or ``tokenizers``) maps id ``i`` to; ``""``
    when there is no tokenizer or it has no such id."""
    if tokenizer is None:
        return ""
    try:
        name = tokenizer.id_to_token(i) if hasattr(tokenizer, "id_to_token") else tokenizer.convert_ids_to_tokens(i)
    except (IndexError, KeyError, OverflowError, TypeError, ValueError):
        return ""
    return f" ({name!r})" if isinstance(name, str) else ""


# --------------------------------------------------------------------------- the protocol's decoding half
class HFTokenModel(TokenModel):
    """Decoding calls of :class:`TokenModel` for adapters over a transformers decoder.

    Subclasses set ``self.decoder`` (the base model returning ``last_hidden_state``),
    ``self.text_embeddings`` (the ``nn.Embedding`` of prompt tokens) and implement
    :meth:`embed_codes`, :meth:`head` and :meth:`make_prompt` (``prompt.inputs`` = ``{"ids": (rows, P),
    "mask": (rows, P)}``, left-padded vocabulary ids); ``eol_id`` when every row of image tokens is
    followed by an end-of-row token. Image tokens enter the decoder through :meth:`expand`, which
    inserts those separators (and :meth:`cache_positions` counts them). Used by the Chameleon
    (Anole, Lumina-mGPT), Janus, Emu3 and Hugging Face text adapters.

    Decoding (the engine, :mod:`lantern.engine.loop`; :func:`ambiguity.generation.sample_tokens`)
    runs on an :class:`HFSlotsCache`: per-row prompts of any length (left-padded in one prefix
    region), per-row position ids and a 4D additive attention mask (windowed for sliding-window
    layers); in float64 every image's tokens equal one-image decoding's (``tests/test_hf_batched.py``)
    and a full forward's (``tests/test_hf_text.py``). Draft trees stay refused for layouts with
    end-of-row tokens.
    """

    decoder: nn.Module
    text_embeddings: nn.Module
    max_positions: Optional[int] = None
    eol_id: Optional[int] = None  # vocabulary id of an end-of-row token fed after every row (Emu3, Lumina-mGPT)

    # ----------------------------------------------------------- layout hooks
    def expand(self, tokens: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Image tokens (rows, T) code indices at image positions ``start..start+T-1`` ->
        (decoder input embeddings (rows, T', H), pick (T,) int64): ``pick[t]`` is the index among the
        T' inputs whose output predicts the image token after ``tokens[:, t]``.

        Without ``eol_id``, T' = T. With it, the end-of-row token follows every completed row of
        ``grid[1]`` codes, and ``pick`` of a row's last code points at that separator (its output
        predicts the next row's first code).
        """
        T = tokens.shape[1]
        t = torch.arange(T, device=tokens.device)
        if self.eol_id is None:
            return self.embed_codes(tokens), t
        w = self.grid[1]
        slot = t + (start + t) // w - start // w  # separators of the rows completed before token t
        ids = torch.full(
            (tokens.shape[0], T + (start + T) // w - start // w),
            int(self.eol_id),
            dtype=torch.long,
            device=tokens.device,
        )
        ids[:, slot] = self.lookup_vocab_ids(tokens)
        return self.text_embeddings(ids), slot + ((start + t + 1) % w == 0).long()

    def check_prompt_ids(self, seqs: Sequence[Sequence[int]], shown: Sequence[str]) -> None:
        """Refuse prompt token ids beyond the text embedding table before they reach it.

        seqs: the token ids of every prompt row (conditional rows, then unconditional ones); shown:
        what the user gave for each condition (row ``r < len(shown)``; later rows are unconditional).
        A tokenizer whose ``tokenizer.json`` belongs to another model maps words past the
        checkpoint's embedding rows (an ``IndexError`` deep in the decoder otherwise). Raises
        UsageError naming the id, its token and prompt, and the valid range.
        """
        n = int(self.text_embeddings.num_embeddings)
        for r, ids in enumerate(seqs):
            bad = next((int(i) for i in ids if not 0 <= int(i) < n), None)
            if bad is None:
                continue
            what = shown[r] if r < len(shown) else "the unconditional prompt"
            raise UsageError(
                f"prompt {str(what)[:40]!r} of {self.name}: the tokenizer gives token id {bad}"
                f"{token_name(getattr(self, 'tokenizer', None), bad)}, outside the valid range 0..{n - 1} of "
                f"the model's embedding table; use the tokenizer files of this checkpoint"
            )

    def cache_positions(self, n: int) -> int:
        """Cache positions taken by the first ``n`` image tokens (end-of-row tokens included)."""
        return n + (n // self.grid[1] if self.eol_id is not None else 0)

    # ------------------------------------------------------- decoding on the slots cache (many images in flight)
    def check_positions(self, prompt: Prompt, n: int) -> None:
        """Raise UsageError when ``prompt`` (its padded length) plus ``n`` image tokens (with their
        layout tokens) exceed the model's positions (``max_positions``)."""
        need = prompt.inputs["ids"].shape[1] + self.cache_positions(int(n))
        if self.max_positions and need > self.max_positions:
            raise UsageError(
                f"{self.name}: prompt plus {n} tokens need {need} positions but the model has "
                f"{self.max_positions}; shorten the prompts or generate fewer tokens"
            )

    @torch.no_grad()
    def prefix_cache(self, prompt: Prompt) -> tuple[Any, Step]:
        """Run the (left-padded) prompt alone, as every image's decoding starts: a ``DynamicCache``
        holding the keys and values of all its positions (full layers, whatever the decoder's
        attention: its sliding-window masks apply within the prompt) and the Step (rows, 1, .) of
        the first image token: logits float32, hidden in the model's dtype."""
        ids, mask = prompt.inputs["ids"], prompt.inputs["mask"]
        kv = new_dynamic_cache()
        h = run_decoder(self.decoder, self.text_embeddings(ids), mask, kv)[:, -1:]
        return kv, Step(self.head(h), h)

    def _plan(self) -> tuple[str, tuple]:
        """``(batch_limit, windows)`` of the decoder's config (:func:`slots_cache_plan`), decided once per
        config (an empty ``DynamicCache`` built from it on the first call)."""
        config = getattr(self.decoder, "config", None)
        known = getattr(self, "_plan_of", None)
        if known is None or known[0] is not config:
            self._plan_of = (config, *slots_cache_plan(config))
        return self._plan_of[1], self._plan_of[2]

    @property
    def batch_limit(self) -> str:
        """Why this adapter cannot decode on the slots cache, '' when it can: every layer of its decoder
        must attend to all earlier positions (a ``transformers`` ``DynamicLayer``) or to a sliding
        window of them (``DynamicSlidingWindowLayer``: Mistral, Gemma 2, Qwen 2 ...); chunked or
        recurrent layers (Llama 4, hybrid linear-attention models) are not modelled
        (:func:`~ambiguity.models.hf_cache.slots_cache_plan`)."""
        return self._plan()[0]

    @property
    def can_batch_decode(self) -> bool:
        """True when :attr:`batch_limit` is empty: per-row prompts of any length (left-padded), per-row
        position ids and a 4D attention mask over full-attention and sliding-window layers."""
        return not self.batch_limit

    def attention_masks(self, allowed: torch.Tensor, pos: torch.Tensor, keys: torch.Tensor, dtype: torch.dtype):
        """The decoder's ``attention_mask`` for queries at position ids ``pos`` (R, T) that may see the
        keys ``allowed`` (R, T, K) bool, whose position ids are ``keys`` (R, K) int64.

        Full-attention layers see ``allowed``; a sliding-window layer of window w only the allowed keys
        with ``pos - key position < w`` (transformers' sliding-window mask). Returns one additive
        (R, 1, T, K) mask in ``dtype`` when every layer has the same attention, else a dict by layer
        type (``"full_attention"``, ``"sliding_attention"``: the masks a decoder with
        ``config.layer_types`` takes as given)."""
        windows = self._plan()[1]
        full = additive_mask(allowed[:, None], dtype)
        w = next((w for w in windows if w is not None), None)
        if w is None:
            return full
        near = additive_mask((allowed & (pos[:, :, None] - keys[:, None, :] < w))[:, None], dtype)
        return near if None not in windows else {"full_attention": full, "sliding_attention": near}

    def new_slots_cache(self, slots: int, guided: bool, num_tokens: int, spare: int = 0) -> HFSlotsCache:
        """An :class:`HFSlotsCache` for ``slots`` images (``2 * slots`` rows with guidance), each
        with ``num_tokens + spare`` image slots; keys and values are allocated by the first
        :meth:`prefill_slots` (their shapes come from the decoder) and updated in place. Raises
        UsageError (one line, :attr:`batch_limit`) for a decoder the slots cache does not model."""
        if self.batch_limit:
            raise UsageError(f"{self.name} cannot decode: {self.batch_limit}")
        width = int(num_tokens) + int(spare)
        return HFSlotsCache(slots * (1 + bool(guided)), num_tokens, width, self.cache_positions(width), self.device)

    @torch.no_grad()
    def prefill_slots(self, cache: HFSlotsCache, rows: torch.Tensor, prompt: Prompt) -> Step:
        """Run ``prompt``'s (left-padded) prefix alone (:meth:`prefix_cache`) and copy its keys/values
        into cache rows ``rows`` (prompt.rows,) int64, right-aligned in the prefix region (widened when
        this prompt is longer). Returns the Step (prompt.rows, 1, .) of the first image token.
        Raises UsageError when the prompt plus one image exceed the model's positions."""
        self.check_positions(prompt, cache.num_tokens)
        own, step = self.prefix_cache(prompt)
        mask = prompt.inputs["mask"].to(self.device)
        P = mask.shape[1]
        cache.widen(P)
        rows = rows.to(self.device)
        at = cache.prefix - P
        for i, layer in enumerate(own.layers):
            cache.kv.put(i, rows, at, layer.keys, layer.values)
        cache.key_mask[rows] = False
        cache.key_mask[rows, at:] = mask.bool()
        cache.positions[rows, at : at + P] = position_ids(mask.long())
        cache.start[rows] = mask.long().sum(1)
        return step

    def select_slots(self, cache: HFSlotsCache, rows: torch.Tensor) -> None:
        """Keep only the cache rows ``rows`` (int64, in this order)."""
        cache.select_rows(rows.to(self.device))

    def move_slots(self, cache: HFSlotsCache, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy each row's keys/values at image slots ``src`` (rows, m) to ``dst`` (rows, m) (see TokenModel)."""
        at = lambda x: cache.prefix + self.cache_positions(x.to(self.device))
        cache.move(at(src), at(dst))

    def _entries(self, S: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The image entries covering slots ``0..S-1``: (slot of each entry (E,) int64, whether it is an
        end-of-row separator (E,) bool), E = ``cache_positions(S)``."""
        s = torch.arange(S, device=self.device)
        c = self.cache_positions(s)
        slot = torch.empty(self.cache_positions(S), dtype=torch.long, device=self.device)
        sep = torch.zeros_like(slot, dtype=torch.bool)
        slot[c] = s
        if self.eol_id is not None:
            ends = s[(s + 1) % self.grid[1] == 0]
            slot[c[ends] + 1], sep[c[ends] + 1] = ends, True
        return slot, sep

    def _separators(self, cache: HFSlotsCache, embeds, write, pos, seen, where, entry_slot):
        """The end-of-row separators of a slots forward (``eol_id`` layouts): every token that ends a
        grid row at its own slot brings its separator as an extra input, appended after the T tokens
        (rows padded to the most separators; padding writes the scratch entry). ``where`` = (slots,
        positions, visible) of :meth:`extend_slots`. Returns (embeds, write, pos, seen) with the
        separators appended, src (R, K) int64 (the token each separator follows) and valid (R, K)
        bool (real separators), or None twice when no token ends a row. Raises UsageError for
        draft-tree positions (``positions`` other than the slots)."""
        slots, positions, visible = where
        if bool((positions != slots.clamp(max=cache.num_tokens - 1)).any()):
            raise UsageError(
                f"{self.name} inserts end-of-row tokens, which draft trees do not model yet; "
                f"use chain drafting (--tree chain)"
            )
        need = ((positions + 1) % self.grid[1] == 0) & (positions == slots)
        k = need.sum(1)
        K = int(k.max())
        if not K:
            return embeds, write, pos, seen, None, None
        R, S = slots.shape[0], visible.shape[-1]
        src = torch.sort((~need).to(torch.int8), dim=1, stable=True).indices[:, :K]  # tokens with a separator
        valid = torch.arange(K, device=slots.device)[None] < k[:, None]
        ids = torch.full((R, K), int(self.eol_id), dtype=torch.long, device=slots.device)
        embeds = torch.cat([embeds, self.text_embeddings(ids).to(embeds.dtype)], 1)
        write = torch.cat([write, torch.where(valid, write.gather(1, src) + 1, cache.scratch)], 1)
        pos = torch.cat([pos, pos.gather(1, src) + 1], 1)
        seen = torch.cat([seen, visible.gather(1, src[..., None].expand(-1, -1, S))[:, :, entry_slot]], 1)
        return embeds, write, pos, seen, src, valid

    @torch.no_grad()
    def extend_slots(
        self,
        cache: HFSlotsCache,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor | int,
    ) -> Step:
        """Every row appends T tokens at its own image slots, in one decoder call (see
        :meth:`TokenModel.extend_slots`): keys/values written in place at entry ``prefix +
        cache_positions(slot)``, position ids ``start + cache_positions(position)`` per row (one-image
        decoding's positions), a 4D additive mask = the row's real prompt tokens + the entries of its
        ``visible`` slots (within the window of a sliding-window layer, :meth:`attention_masks`). With
        end-of-row tokens (Emu3, Lumina-mGPT) a token at the end of a grid row brings its separator as
        an extra input (:meth:`_separators`) and the separator's output is the token's; the separator
        after slot ``s`` is visible with ``s`` to later tokens. Returns Step (rows, T, .). Raises
        UsageError for draft-tree positions (``positions`` other than the slots) in a layout with
        end-of-row tokens."""
        dev = self.device
        if isinstance(visible, int):
            visible = torch.ones(*tokens.shape, visible, dtype=torch.bool, device=dev)
        tokens, slots, positions, visible = (x.to(dev) for x in (tokens, slots, positions, visible.bool()))
        R, T = tokens.shape
        P, S = cache.prefix, visible.shape[-1]
        entry_slot, entry_sep = self._entries(S)
        # a token sees the visible slots' entries, but not the separator after its own slot (it comes later)
        own_sep = entry_sep[None, None] & (entry_slot[None, None] == slots[:, :, None])
        seen = visible[:, :, entry_slot] & ~own_sep  # (R, T, E)
        embeds = self.embed_codes(tokens)
        write = P + self.cache_positions(slots)
        pos = cache.start[:, None] + self.cache_positions(positions)
        src = valid = None
        if self.eol_id is not None:
            embeds, write, pos, seen, src, valid = self._separators(
                cache, embeds, write, pos, seen, (slots, positions, visible), entry_slot
            )
        Tq = embeds.shape[1]
        allowed = torch.cat([cache.key_mask[:, None, :].expand(R, Tq, P), seen], 2)
        cache.positions.scatter_(1, write, pos)
        cache.kv.write, cache.kv.span = write, P + seen.shape[-1]
        mask = self.attention_masks(allowed, pos, cache.positions[:, : allowed.shape[-1]], embeds.dtype)
        h = _attend_decoder(self.decoder, embeds, mask, pos, cache.kv)
        if src is not None:  # a row-ending token's next-token distribution comes from its separator
            out = h[:, :T].clone()
            r = torch.arange(R, device=dev)[:, None].expand_as(src)
            out[r[valid], src[valid]] = h[:, T:][valid]
            h = out
        return Step(self.head(h), h)

    @torch.no_grad()
    def teacher_force(self, prompt: Prompt, tokens: torch.Tensor) -> Step:
        """One full forward (no cache) over the prompt and ``tokens[:, :-1]``; see TokenModel. Raises
        UsageError for a code outside ``0..V-1`` (:func:`~ambiguity.models.base.check_ids`)."""
        check_ids(tokens, self.vocab_size, f"the codes given to {self.name}.teacher_force")
        ids, mask = prompt.inputs["ids"], prompt.inputs["mask"]
        P = ids.shape[1]
        embeds, pick = self.expand(tokens[:, :-1].to(self.device), 0)
        full = torch.cat([self.text_embeddings(ids), embeds.to(self.dtype)], 1)
        ones = torch.ones(mask.shape[0], embeds.shape[1], dtype=mask.dtype, device=mask.device)
        full_mask = torch.cat([mask, ones], 1)
        h = run_decoder(self.decoder, full, full_mask)
        hidden = torch.cat([h[:, P - 1 : P], h[:, P + pick]], 1)
        return Step(self.head(hidden), hidden)

    def describe(self) -> dict:
        """TokenModel facts plus ``parameters``: the decoder's parameter count."""
        d = super().describe()
        d["parameters"] = sum(p.numel() for p in self.decoder.parameters())
        return d


# --------------------------------------------------------------------------- loading
def local_dir(repo: str, weights=None) -> Optional[Path]:
    """``weights``, or ``repo`` itself when it names an existing directory; else None."""
    if weights is not None:
        return Path(weights).expanduser()
    p = Path(repo).expanduser()
    return p if p.is_dir() else None


def load_pretrained(model_cls, repo: str, weights=None, device="cpu", dtype=torch.float32, name: str = ""):
    """``model_cls.from_pretrained`` from ``weights`` (a directory) or the local HF cache of ``repo``.

    Never downloads. Returns the model in eval mode with gradients off, on ``device`` in ``dtype``.
    Raises WeightsNotFoundError (one line naming ``repo``) when absent, UsageError when the
    files do not load as ``model_cls`` or their weights at ``dtype`` cannot fit in memory
    (:func:`ambiguity.memory.check_weights_fit`, before anything loads).
    """
    import importlib.util

    path = hf_snapshot_dir(repo, local_dir(repo, weights), model=name or repo)
    shards = sorted(Path(path).glob("*.safetensors")) or sorted(Path(path).glob("*.bin"))
    check_weights_fit(shards, dtype, device, name or repo)  # before from_pretrained fills the memory
    kwargs = dict(dtype=dtype, local_files_only=True)
    if torch.device(device).type == "cuda" and importlib.util.find_spec("accelerate") is not None:
        kwargs["device_map"] = str(device)  # load shards straight onto the GPU
    try:
        model = model_cls.from_pretrained(str(path), **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"{name or repo}: {path} does not load as {model_cls.__name__} ({msg}); "
            f"check that --model matches the checkpoint"
        ) from None
    return model.to(device).eval().requires_grad_(False)


def load_tokenizer(repo: str, weights=None, name: str = ""):
    """``AutoTokenizer`` from the same place as :func:`load_pretrained` (offline)."""
    from transformers import AutoTokenizer

    path = hf_snapshot_dir(repo, local_dir(repo, weights), model=name or repo)
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"{name or repo}: no usable tokenizer in {path} ({msg}); download the full repository"
        ) from None
