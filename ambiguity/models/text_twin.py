"""The embedded text twin: the embedded image model's GPT, trained on English prose instead of images.

Same class (:class:`~ambiguity.models.gpt.GPT`), same width, depth, heads, feed-forward size and
vocabulary size as the embedded Fashion-MNIST model, same sequence length (64 tokens: one
8 x 8 image = one 64-token passage), same token budget and optimiser (``scripts/train_text_twin.py``).
Only the modality differs, which makes LANTERN's first finding (Jang et al., ICLR 2025, Sec. 3,
Fig. 2: visual AR next-token distributions are far flatter than text ones) a controlled
comparison (``python -m ambiguity.compare``).

Two architectural choices follow from the modality:

* ``rope="1d"``: ordinary rotary positions over the sequence (BOS at position 0), because a
  text passage is a sequence, not a grid.
* The condition prefix is LlamaGen's c2i class token with a single class (``num_classes=1``):
  that one learned embedding is the beginning-of-sequence (BOS) token, so no vocabulary entry
  is spent on it and the vocabulary matches the codebook size exactly. There is no class
  dropout and no null class: text has no condition to drop.

Prompts are strings. ``""`` (the default condition) is the BOS-only prompt, the analogue of
generating an image from its class token. A non-empty string is tokenised (with a leading space
added, as every training verse has one) and appended after BOS as a continuation prompt. Under
classifier-free guidance the unconditional row is the BOS-only prompt (the prompt dropped;
Sanchez et al., 2023, "Stay on topic with classifier-free guidance"), so for BOS-only prompts
guidance is the identity. Prompts of different lengths are left-padded with masked keys; rotary
attention depends only on relative positions, so padding does not change the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch

from ambiguity.data.text_corpus import load_tokenizer
from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.io import load_tensors
from ambiguity.models.base import Prompt, Step, check_ids
from ambiguity.models.embedded import load_gpt, weights_dir
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.llamagen import GPTCache, LlamaGenModel
from ambiguity.seeding import holdout_seed

__all__ = [
    "TWIN_FILE",
    "TOKENIZER_FILE",
    "HELDOUT_FILE",
    "METRICS_FILE",
    "twin_config",
    "TextTwinModel",
    "load_text_twin",
    "load_heldout",
]

TWIN_FILE = "text_twin.safetensors"
TOKENIZER_FILE = "text_twin_tokenizer.json"
HELDOUT_FILE = "text_twin_heldout.safetensors"
METRICS_FILE = "text_twin_metrics.json"

# Fields copied from the image model's GPTConfig: everything that sets the size and the training.
_SHARED = (
    "dim",
    "n_layer",
    "n_head",
    "n_kv_head",
    "multiple_of",
    "ffn_dim_multiplier",
    "rope_base",
    "norm_eps",
    "initializer_range",
    "token_dropout_p",
    "attn_dropout_p",
    "resid_dropout_p",
    "ffn_dropout_p",
    "vocab_size",
)


def twin_config(image: GPTConfig, length: Optional[int] = None) -> GPTConfig:
    """The text twin's GPTConfig for an image model's config.

    Copies width, depth, heads, feed-forward size, dropouts and ``vocab_size`` (the codebook
    size); sets ``model_type="c2i"`` with ``num_classes=1`` (the BOS token), no class dropout,
    ``cls_token_num=1``, ``rope="1d"`` and ``block_size = length`` (default: the image model's
    tokens per image).
    """
    values = {k: getattr(image, k) for k in _SHARED}
    return GPTConfig(
        **values,
        model_type="c2i",
        num_classes=1,
        class_dropout_prob=0.0,
        cls_token_num=1,
        block_size=int(length or image.block_size),
        rope="1d",
    )


class TextTwinModel(LlamaGenModel):
    """A text LM behind the toolkit protocol: a LlamaGen GPT with ``rope="1d"`` and a BOS class token.

    ``kind == "text"``, ``grid == (1, block_size)``, no codebook, no pixels. Conditions are
    strings (see the module docstring), or an int64 tensor (B, P) of prompt token ids.
    ``tokenizer``: a ``tokenizers.Tokenizer`` (needed for string prompts and :meth:`decode`).
    """

    def __init__(self, gpt: GPT, tokenizer=None, name: str = "text-twin"):
        config = gpt.config
        if config.model_type != "c2i" or config.num_classes != 1:
            raise ValueError("a text twin GPT has model_type 'c2i' with num_classes=1 (the BOS token)")
        super().__init__(gpt, None, name=name, text=True)
        self.tokenizer = tokenizer
        self.num_classes = None
        self.heldout_path: Optional[Path] = None  # set by load_text_twin

    def dataset_sequences(self, n: int, seed: int = 0) -> tuple[torch.Tensor, list[str]]:
        """``n`` held-out passages drawn with ``seed``, for teacher-forcing ("--source dataset").

        Returns (tokens (n, L) int64, n BOS-only conditions ``""``). The passages come from
        chapters the twin never trained on. Raises UsageError when the shipped file is absent
        or holds fewer than ``n`` passages.
        """
        if self.heldout_path is None or not Path(self.heldout_path).is_file():
            raise UsageError(
                f"{self.name} has no held-out passages ({HELDOUT_FILE}); "
                f"run `python scripts/train_text_twin.py` or use --source generate"
            )
        tokens = load_heldout(self.heldout_path)
        if tokens.shape[0] < n:
            raise UsageError(f"only {tokens.shape[0]} held-out passages ship with {self.name}; lower --num-images")
        idx = torch.randperm(tokens.shape[0], generator=torch.Generator().manual_seed(holdout_seed(seed)))[:n]
        return tokens[idx], [""] * n

    # ------------------------------------------------------------------ text
    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Strings -> token ids (no BOS). Raises UsageError without a tokenizer."""
        if self.tokenizer is None:
            raise UsageError(f"{self.name} was loaded without its tokenizer; pass text prompts as token ids")
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))] if texts else []

    def decode(self, tokens: torch.Tensor) -> list[str]:
        """Token ids (B, T) or (T,) int64 -> B strings (byte-level BPE decoding)."""
        if self.tokenizer is None:
            raise UsageError(f"{self.name} was loaded without its tokenizer; cannot turn tokens into text")
        rows = tokens.view(-1, tokens.shape[-1]).tolist()
        return self.tokenizer.decode_batch(rows, skip_special_tokens=False)

    def default_conditions(self, n: int, seed: int = 0) -> list:
        """``n`` BOS-only prompts (``""``): unconditional text, like images from their class token."""
        return [""] * n

    # ---------------------------------------------------------------- prompt
    def make_prompt(self, conditions, guided: bool = False) -> Prompt:
        """Strings (or a (B, P) int64 tensor of token ids; a (B,) tensor of zeros = BOS only) -> Prompt.

        ``inputs``: ``cond`` (rows,) zeros (the BOS class), ``ids`` (rows, P) left-padded prompt
        tokens, ``mask`` (rows, 1 + P) bool key mask or None when no row is padded.
        Raises UsageError for an empty batch, a prompt of ``block_size`` tokens or more, or a token id
        outside the vocabulary (:func:`~ambiguity.models.base.check_ids`).
        """
        if isinstance(conditions, str):
            conditions = [conditions]
        if torch.is_tensor(conditions):
            t = conditions.to(torch.long)
            if t.dim() == 1:
                if t.numel() and bool((t != 0).any()):
                    raise UsageError(f"{self.name} has one condition (BOS = 0); pass text prompts as strings")
                rows = [[] for _ in range(t.numel())]
            else:
                rows = t.tolist()
            shown = [self.decode(torch.tensor(r))[0] if (r and self.tokenizer is not None) else "" for r in rows]
        else:
            conds = list(conditions)
            if any(isinstance(c, int) and c == 0 for c in conds):
                conds = ["" if (isinstance(c, int) and c == 0) else c for c in conds]
            if not all(isinstance(c, str) for c in conds):
                raise UsageError(f"{self.name} takes text prompts (strings; '' for BOS only)")
            # training verses start with a space (" And it came to pass"): prompts do too
            conds = [c if (not c or c[0].isspace()) else " " + c for c in conds]
            rows = self.encode(conds) if any(conds) else [[] for _ in conds]
            shown = conds
        if not rows:
            raise UsageError("no prompts given; ask for at least one text sample")
        limit = self.gpt.config.block_size - 1
        longest = max(len(r) for r in rows)
        if longest > limit:
            raise UsageError(
                f"a prompt is {longest} tokens; {self.name} was trained on {limit + 1}-token passages, "
                f"shorten prompts to at most {limit} tokens"
            )
        B = len(rows)
        if guided:
            rows = rows + [[] for _ in range(B)]
        P = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), P, dtype=torch.long)
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        for i, r in enumerate(rows):
            if r:
                ids[i, P - len(r) :] = torch.tensor(r, dtype=torch.long)
        check_ids(
            ids, self.vocab_size, f"the prompts given to {self.name}", "token id", "use this model's tokenizer.json"
        )
        mask = torch.arange(P + 1)[None] >= (P - lengths)[:, None]
        inputs = {
            "cond": torch.zeros(len(rows), dtype=torch.long, device=self.device),
            "ids": ids.to(self.device),
            "lengths": lengths.to(self.device),
            "mask": None if bool(mask.all()) else mask.to(self.device),
        }
        return Prompt(inputs, B, guided, list(shown))

    def prefix_embeddings(self, prompt: Prompt) -> torch.Tensor:
        """BOS + prompt tokens, left-padded: (rows, 1 + P, dim) in the model dtype."""
        gpt, inp = self.gpt, prompt.inputs
        bos = gpt.embed_condition(inp["cond"])  # (rows, 1, dim)
        P = inp["ids"].shape[1]
        shifted = torch.cat([bos, gpt.embed_tokens(inp["ids"])], dim=1)  # position j>=1 holds ids[:, j-1]
        at_bos = torch.arange(P + 1, device=self.device)[None] == (P - inp["lengths"])[:, None]
        return torch.where(at_bos[..., None], bos, shifted)

    def prefix_length(self, prompt: Prompt) -> int:
        """BOS + the (left-padded) prompt tokens: ``1 + P``. LlamaGen's prefix cache and teacher
        forcing use this and :meth:`prefix_embeddings` (its hooks)."""
        return 1 + prompt.inputs["ids"].shape[1]

    # ------------------------------------------------------------ slot cache
    # Prompts differ in length, so each row keeps its own prefix: the slot cache reserves
    # ``block_size`` prefix positions a row, a prompt's keys sit left-aligned in them (the unused
    # ones masked), and the rotary position of image token i is the row's own prefix length + i:
    # the positions and keys of decoding that prompt alone.
    def new_slots_cache(self, slots: int, guided: bool, num_tokens: int, spare: int = 0) -> GPTCache:
        P = self.gpt.config.block_size  # BOS + the longest prompt make_prompt accepts
        kv = self.gpt.new_cache(slots * (1 + bool(guided)), P + num_tokens + spare)
        cache = GPTCache(kv, P)
        cache.lengths = torch.ones(kv.k.shape[1], dtype=torch.long, device=self.device)
        return cache

    def prefill_slots(self, cache: GPTCache, rows: torch.Tensor, prompt: Prompt) -> Step:
        own, step = self.prefix_cache(prompt)  # the prefix alone, as decoding this prompt alone computes it
        L, rows = self.prefix_length(prompt), rows.to(self.device)
        cache.kv.k[:, rows, :, :L] = own.k[:, :, :, :L]
        cache.kv.v[:, rows, :, :L] = own.v[:, :, :, :L]
        cache.kv.key_mask[rows, : cache.prefix] = False
        cache.kv.key_mask[rows, :L] = own.key_mask[:, :L]
        cache.lengths[rows] = L
        return step

    def extend_slots(
        self, cache: GPTCache, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor
    ) -> Step:
        P, (R, T) = cache.prefix, tokens.shape
        if isinstance(visible, int):
            visible = torch.ones(R, T, visible, dtype=torch.bool, device=self.device)
        mask = torch.cat([cache.kv.key_mask[:, None, :P].expand(R, T, P), visible], -1)[:, None]
        rope = cache.lengths[:, None] + positions
        self.gpt.rope_at(int(rope.max()), 1)  # extends the 1D table
        rows = self.gpt.forward_rows if self.compiled is None else self.compiled
        h = rows(self.gpt.embed_tokens(tokens), cache.kv, P + slots, rope, mask)
        return Step(self.gpt.head(h), h)

    def select_slots(self, cache: GPTCache, rows: torch.Tensor) -> None:
        super().select_slots(cache, rows)
        cache.lengths = cache.lengths[rows.to(self.device)]

    def describe(self) -> dict:
        d = super().describe()
        d["tokenizer"] = "byte-level BPE" if self.tokenizer is not None else None
        return d


def _resolve(weights) -> tuple[Path, Path]:

    p = weights_dir(weights)
    if p.suffix == ".safetensors":
        return p, p.parent
    return p / TWIN_FILE, p


def load_text_twin(weights=None, device="cpu", dtype=torch.float32) -> TextTwinModel:
    """The shipped text twin (``weights``: a directory with text_twin.safetensors and
    text_twin_tokenizer.json, or the .safetensors file with the tokenizer beside it).

    Raises WeightsNotFoundError (with the command that trains it) when the GPT file is missing.
    The tokenizer is optional: without it prompts must be token ids.
    """
    path, folder = _resolve(weights)
    if not path.is_file():
        raise WeightsNotFoundError(
            f"text twin weights {path.name} not found in {folder}; "
            f"run `python scripts/train_text_twin.py` to train them"
        )
    gpt, _ = load_gpt(path, device, dtype)
    tok_path = folder / TOKENIZER_FILE
    tokenizer = load_tokenizer(tok_path) if tok_path.is_file() else None
    model = TextTwinModel(gpt, tokenizer, name="text-twin")
    model.heldout_path = folder / HELDOUT_FILE
    return model


def load_heldout(weights=None, n: Optional[int] = None) -> torch.Tensor:
    """Held-out passages shipped with the twin: (N, 64) int64 token ids (chapters never trained on).

    ``weights``: the weights directory, or the held-out .safetensors file itself.
    Raises UsageError when the file is missing (``scripts/train_text_twin.py`` writes it).
    """
    p = Path(weights) if weights is not None else None
    path = p if (p is not None and p.name == HELDOUT_FILE) else _resolve(weights)[1] / HELDOUT_FILE
    folder = path.parent
    if not path.is_file():
        raise UsageError(
            f"held-out passages {HELDOUT_FILE} not found in {folder}; "
            f"run `python scripts/train_text_twin.py` or use --source generate"
        )
    tokens = load_tensors(path)[0]["tokens"].long()
    return tokens if n is None else tokens[:n]
