"""LlamaGen behind the toolkit's protocol, and loading of official checkpoints.

:class:`LlamaGenModel` wraps a :class:`~ambiguity.models.gpt.GPT` and (optionally) a
:class:`~ambiguity.models.vq.VQModel`. The embedded Fashion-MNIST model is the same class with
small configs. Image-token ids equal code indices (LlamaGen's vocabulary *is* the codebook).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import UsageError
from ambiguity.models.base import DraftLayer, Prompt, Step, TokenModel, check_ids
from ambiguity.models.checkpoints import load_checkpoint, load_checkpoint_state, load_strict
from ambiguity.models.gpt import GPT, GPTConfig, KVCache, TransformerBlock, gpt_config_from_official, rope_table
from ambiguity.models.hub import find_weight, require_weight
from ambiguity.models.text_encoders import T5CaptionEncoder
from ambiguity.models.vq import VQModel, vq_config_from_official

__all__ = [
    "LlamaGenModel",
    "GPTCache",
    "GPTDraftLayer",
    "load_llamagen",
    "official_gpt_config",
    "check_checkpoint_name",
    "LLAMAGEN_C2I_REPO",
    "LLAMAGEN_T2I_REPO",
    "T5_REPO",
]


class GPTCache:
    """KV cache of a LlamaGen GPT plus the prefix length (positions before the first image token)."""

    def __init__(self, kv: KVCache, prefix: int):
        self.kv, self.prefix = kv, prefix


class GPTDraftLayer(DraftLayer):
    """One LlamaGen decoder block with the target's rotary positions (EAGLE drafter layer)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.block = TransformerBlock(config)
        self.register_buffer("rope", rope_table(config), persistent=False)

    def new_cache(self, rows: int, spare: int = 0) -> KVCache:
        p = next(self.parameters())
        return KVCache(
            1, rows, self.config.block_size + int(spare), self.config.kv_heads, self.config.head_dim, p.dtype, p.device
        )

    def rollback(self, cache: KVCache, n: int) -> None:
        cache.crop(n)

    compiled = None  # torch.compile(self.forward_rows) once compile_forwards() ran (a function, not a submodule)

    def compile_forwards(self) -> None:
        """Run the cached forwards through a compiled :meth:`forward_rows` from now on (idempotent; as
        :meth:`LlamaGenModel.compile_forwards`)."""
        if self.compiled is None:
            self.compiled = torch.compile(self.forward_rows, dynamic=True)

    def forward_rows(
        self, x: torch.Tensor, cache: KVCache, slots: torch.Tensor, rope_rows: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """x (R, T, H) written at cache slots (R, T) int64, rotary table rows rope_rows (R, T) int64,
        attending as mask (R, 1, T, span) bool allows -> (R, T, H) (the unit ``--compile`` compiles)."""
        return self.block(x, self.rope[rope_rows], 0, cache, mask, slots)

    def forward_slots(
        self, x: torch.Tensor, cache: KVCache, slots: torch.Tensor, positions: torch.Tensor, visible
    ) -> torch.Tensor:
        off = self.config.cls_token_num  # the drafter's cache holds image positions; its rope keeps the prefix rows
        if isinstance(visible, int):  # one token a row at slot visible - 1, seeing slots 0..visible-1: a slice write
            if self.compiled is not None:
                visible = torch.ones(x.shape[0], 1, visible, dtype=torch.bool, device=x.device)
            else:
                return self.block(x, self.rope[off + positions], 0, cache, None, slots, visible)
        if self.compiled is not None:  # contiguous: a stride that differs from call to call would recompile
            return self.compiled(x, cache, slots.contiguous(), off + positions, visible[:, None].contiguous())
        return self.block(x, self.rope[off + positions], 0, cache, visible[:, None], slots)

    def forward(
        self,
        x: torch.Tensor,
        cache: Optional[KVCache],
        start: int,
        positions: Optional[torch.Tensor] = None,
        attend: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        T = x.shape[1]
        off = self.config.cls_token_num
        pos = torch.arange(start, start + T) if positions is None else positions.cpu()
        if off + int(pos.max()) + 1 > self.rope.shape[0]:
            self.rope = rope_table(self.config, off + int(pos.max()) + 1).to(self.rope.device)
        rows = (off + pos).to(self.rope.device)
        rope = self.rope[rows]
        if cache is None:
            return self.block(x, rope, 0, None, None)
        at = cache.length if positions is not None else start  # tree nodes are appended after the cache
        if at != cache.length:
            cache.crop(at)
        if self.compiled is not None:
            if at + T > cache.max_len:
                raise ValueError(f"KV cache holds {cache.max_len} positions; cannot write {at}..{at + T}")
            slots, mask = append_slots(x.shape[0], T, at, cache, attend)
            out = self.compiled(x, cache, slots, rows[None].repeat(x.shape[0], 1), mask)
        else:
            mask = GPT.attention_mask(T, at, cache, attend)
            out = self.block(x, rope, 0, cache, mask)
        cache.length = at + T
        return out


class LlamaGenModel(TokenModel):
    """A LlamaGen GPT (c2i or t2i) with its VQ tokenizer.

    Args:
        gpt: the AR model, eval mode.
        vq: the tokenizer, or None when only the GPT checkpoint is available (no pixels).
        name: registry name.
        caption_encoder: for t2i, an object with ``encode(list[str]) -> (features (B, P, D),
            mask (B, P))``; captions may also be given as a features tensor.
        class_names: optional labels for c2i classes.
        text: treat the model as a text LM (the embedded text twin): kind ``"text"``.
    """

    def __init__(
        self,
        gpt: GPT,
        vq=None,
        name: str = "llamagen",
        caption_encoder=None,
        class_names: Optional[list[str]] = None,
        text: bool = False,
    ):
        config = gpt.config
        self.gpt, self.vq, self.name = gpt.eval(), (vq.eval() if vq is not None else None), name
        self.caption_encoder = caption_encoder
        self.kind = "text" if text else config.model_type
        self.grid = (1, config.block_size) if (text or config.rope == "1d") else (config.grid_size, config.grid_size)
        self.num_classes = config.num_classes if config.model_type == "c2i" else None
        self.class_names = class_names
        self.hidden_size = config.dim
        p = gpt.tok_embeddings.weight
        self.device, self.dtype = p.device, p.dtype
        self.image_token_ids = torch.arange(config.vocab_size, device=p.device)

    # ------------------------------------------------------------------ prompt
    def make_prompt(self, conditions: Sequence | torch.Tensor, guided: bool = False) -> Prompt:
        gpt = self.gpt
        if gpt.config.model_type == "c2i":
            labels = class_labels(conditions, self.name).to(self.device)
            if labels.numel() == 0:
                raise UsageError("no conditions given; ask for at least one image")
            if labels.min() < 0 or labels.max() >= gpt.config.num_classes:
                raise UsageError(f"class labels must be in 0..{gpt.config.num_classes - 1} for {self.name}")
            B = labels.numel()
            inputs = {"cond": torch.cat([labels, gpt.null_condition(B)]) if guided else labels, "mask": None}
            return Prompt(inputs, B, guided, labels.tolist())
        # t2i: caption strings through the text encoder, or caption features directly
        if torch.is_tensor(conditions):
            feats = conditions.to(self.device, self.dtype)
            mask = torch.ones(feats.shape[:2], dtype=torch.bool, device=self.device)
            shown = [f"<caption features {i}>" for i in range(feats.shape[0])]
        else:
            captions = list(conditions)
            if not captions:
                raise UsageError("no captions given; pass a non-empty captions file")
            if self.caption_encoder is None:
                raise UsageError(f"{self.name} needs a caption encoder (flan-t5-xl) for text captions")
            feats, mask = self.caption_encoder.encode(captions)
            feats, mask = left_pad(feats.to(self.device, self.dtype), mask.to(self.device).bool())
            shown = captions
        P = gpt.config.cls_token_num
        if feats.ndim != 3 or feats.shape[1] != P:
            raise UsageError(
                f"caption features have shape {tuple(feats.shape)}; {self.name} expects (B, {P}, "
                f"{gpt.config.caption_dim})"
            )
        if feats.shape[2] != gpt.config.caption_dim:
            raise UsageError(
                f"the caption encoder gives {feats.shape[2]}-wide features but {self.name} takes "
                f"{gpt.config.caption_dim}; use the text encoder it was trained with (flan-t5-xl for "
                f"LlamaGen t2i)"
            )
        feats = feats * mask[..., None]
        B = feats.shape[0]
        if guided:
            feats = torch.cat([feats, gpt.null_condition(B, self.device).to(feats.dtype)])
            mask = torch.cat([mask, mask])
        return Prompt({"cond": feats, "mask": mask}, B, guided, shown)

    # ----------------------------------------------------------------- decoding
    # The two hooks a subclass with another condition prefix overrides (the text twin: BOS + prompt).
    def prefix_length(self, prompt: Prompt) -> int:
        """Cache positions the condition prefix takes: ``cls_token_num`` (class token, or caption tokens)."""
        return self.gpt.config.cls_token_num

    def prefix_embeddings(self, prompt: Prompt) -> torch.Tensor:
        """The condition prefix: (rows, :meth:`prefix_length`, dim) in the model dtype."""
        return self.gpt.embed_condition(prompt.inputs["cond"])

    def prefix_cache(self, prompt: Prompt) -> tuple[KVCache, Step]:
        """Run ``prompt``'s condition prefix alone, as every image's decoding starts: a KV cache of
        ``prompt.rows`` rows holding the :meth:`prefix_length` prefix positions (padded caption
        tokens masked), and the Step (rows, 1, .) of the first image token. :meth:`prefill_slots`
        copies it into the slot cache."""
        kv = self.gpt.new_cache(prompt.rows, self.prefix_length(prompt))
        if prompt.inputs.get("mask") is not None:
            kv.set_prefix_mask(prompt.inputs["mask"])
        h = self.gpt.forward(self.prefix_embeddings(prompt), kv)[:, -1:]
        return kv, Step(self.gpt.head(h), h)

    # ------------------------------------------------------- compiled forwards
    compiled = None  # torch.compile(gpt.forward_rows) once compile_forwards() ran

    def compile_forwards(self) -> None:
        """Run the target's cached forwards through ``torch.compile`` from now on (idempotent).

        Every cached call (:meth:`extend_slots`; the prefill stays eager) then goes through one
        compiled :meth:`GPT.forward_rows` that writes the static KV cache in place
        (:func:`~ambiguity.models.gpt.slot_index`; the buffer keeps its shape). Rows, tokens per
        forward and the attended span are symbolic sizes (``dynamic=True``): one graph for every
        batch size, draft length and position, another for one token per forward (padding the mask
        to the whole cache, for static shapes, made the forward slower on the CPU). Compilation
        happens on the first calls.
        """
        if self.compiled is None:
            self.compiled = torch.compile(self.gpt.forward_rows, dynamic=True)

    can_batch_decode = True  # a fixed condition prefix (cls_token_num), then per-image slots

    def new_slots_cache(self, slots: int, guided: bool, num_tokens: int, spare: int = 0) -> GPTCache:
        prefix = self.gpt.config.cls_token_num
        kv = self.gpt.new_cache(slots * (1 + bool(guided)), prefix + num_tokens + spare)
        cache = GPTCache(kv, prefix)
        cache.padded = False  # a prompt with masked prefix keys (padded captions) was prefilled
        return cache

    def prefill_slots(self, cache: GPTCache, rows: torch.Tensor, prompt: Prompt) -> Step:
        own, step = self.prefix_cache(prompt)
        P = cache.prefix
        rows = rows.to(self.device)
        cache.kv.k[:, rows, :, :P] = own.k[:, :, :, :P]
        cache.kv.v[:, rows, :, :P] = own.v[:, :, :, :P]
        cache.kv.key_mask[rows, :P] = own.key_mask[:, :P]
        cache.padded = cache.padded or prompt.inputs.get("mask") is not None
        return step

    def select_slots(self, cache: GPTCache, rows: torch.Tensor) -> None:
        cache.kv.select_rows(rows.to(self.device))

    def move_slots(self, cache: GPTCache, src: torch.Tensor, dst: torch.Tensor) -> None:
        cache.kv.move(cache.prefix + src.to(self.device), cache.prefix + dst.to(self.device))

    def extend_slots(
        self, cache: GPTCache, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor
    ) -> Step:
        P, (R, T) = cache.prefix, tokens.shape
        rows = self.gpt.forward_rows if self.compiled is None else self.compiled
        if isinstance(visible, int) and not cache.padded:  # every token sees every slot: no mask
            h = rows(self.gpt.embed_tokens(tokens), cache.kv, P + slots, P + positions, None, P + visible)
            return Step(self.gpt.head(h), h)
        if isinstance(visible, int):
            visible = torch.ones(R, T, visible, dtype=torch.bool, device=self.device)
        prefix = cache.kv.key_mask[:, None, :P].expand(R, T, P)  # padded caption tokens stay hidden
        mask = torch.cat([prefix, visible], -1)[:, None]
        h = rows(self.gpt.embed_tokens(tokens), cache.kv, P + slots, P + positions, mask)
        return Step(self.gpt.head(h), h)

    def teacher_force(self, prompt: Prompt, tokens: torch.Tensor) -> Step:
        """One full forward over the prefix and ``tokens[:, :-1]`` (rows, N) int64; see TokenModel.
        Raises UsageError for a code outside ``0..V-1`` (:func:`~ambiguity.models.base.check_ids`)."""
        if prompt.inputs.get("mask") is not None and not bool(prompt.inputs["mask"].all()):
            return super().teacher_force(prompt, tokens)  # padded captions: the slot cache's masked prefix (checks too)
        check_ids(tokens, self.vocab_size, f"the codes given to {self.name}.teacher_force")
        prefix = self.prefix_embeddings(prompt)
        h = torch.cat([prefix, self.gpt.embed_tokens(tokens[:, :-1])], dim=1)
        hidden = self.gpt.forward(h)[:, prefix.shape[1] - 1 :]
        return Step(self.gpt.head(hidden), hidden)

    # ------------------------------------------------------------------ drafter
    def embed_codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """Input embeddings (rows, T, dim) of codes (rows, T) int64 in 0..V-1 (code = vocabulary id), unchecked."""
        return self.gpt.embed_tokens(tokens)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.gpt.head(hidden)

    def draft_layer(self) -> GPTDraftLayer:
        layer = GPTDraftLayer(self.gpt.config)
        return layer.to(self.device, self.dtype)

    # ---------------------------------------------------------------- codebook
    def codebook(self) -> torch.Tensor:
        if self.vq is None:
            raise NotImplementedError(f"{self.name}: no VQ tokenizer loaded (pass its checkpoint)")
        return self.vq.quantize.codebook().detach().float()

    def raw_codebook(self) -> torch.Tensor:
        if self.vq is None:
            raise NotImplementedError(f"{self.name}: no VQ tokenizer loaded (pass its checkpoint)")
        return self.vq.quantize.embedding.weight.detach().float()

    def input_embeddings(self) -> torch.Tensor:
        return self.gpt.tok_embeddings.weight.detach().float()

    def output_embeddings(self) -> torch.Tensor:
        return self.gpt.output.weight.detach().float()

    @property
    def can_decode(self) -> bool:
        return self.vq is not None

    @property
    def image_shape(self) -> tuple[int, int, int]:
        if self.vq is None:
            raise NotImplementedError(f"{self.name}: no VQ tokenizer loaded")
        f = self.vq.config.downsample
        return (self.vq.config.in_channels, self.grid[0] * f, self.grid[1] * f)

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        if self.vq is None:
            raise NotImplementedError(f"{self.name}: no VQ tokenizer loaded, cannot decode to pixels")
        with torch.no_grad():
            x = self.vq.decode_codes(codes.to(self.vq.quant_conv.weight.device))
        return ((x.float() + 1) / 2).clamp(0, 1)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        if self.vq is None:
            raise NotImplementedError(f"{self.name}: no VQ tokenizer loaded, cannot encode images")
        w = self.vq.quant_conv.weight
        with torch.no_grad():
            return self.vq.encode(images.to(w.device, w.dtype) * 2 - 1)

    #: where the grid of an official checkpoint came from (:func:`load_llamagen`): "declared (--image-size)",
    #: "read" (its file name or stored config) or "assumed" (the model name's size); None for other builds
    image_size_from: Optional[str] = None

    def describe(self) -> dict:
        """TokenModel facts plus parameter counts and, for official checkpoints, ``image_size_from``."""
        d = super().describe()
        if self.image_size_from is not None:
            d["image_size_from"] = self.image_size_from
        d["parameters"] = sum(p.numel() for p in self.gpt.parameters())
        if self.vq is not None:
            d["tokenizer_parameters"] = sum(p.numel() for p in self.vq.parameters())
        return d


def append_slots(R: int, T: int, start: int, cache: KVCache, attend=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots and mask of ``T`` tokens appended at ``start`` in every row (a drafter layer's one-image
    cache through the compiled rows forward): slots (R, T) int64 ``start..start+T-1`` and mask (R, 1, T, start + T)
    bool as :meth:`GPT.attention_mask` (default causal), both materialised (the batched path's
    strides: one graph for both)."""
    dev = cache.k.device
    q = start + torch.arange(T, device=dev)
    if attend is None:
        attend = torch.arange(start + T, device=dev)[None] <= q[:, None]
    mask = GPT.attention_mask(T, start, cache, attend).expand(R, 1, T, start + T).contiguous()
    return q[None].repeat(R, 1), mask


def left_pad(feats: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move padding of right-padded caption features (B, P, D) / mask (B, P) to the front.

    LlamaGen's t2i sampler does this before generation so that the caption ends right before
    the first image token.
    """
    out_f, out_m = torch.zeros_like(feats), torch.zeros_like(mask)
    for i in range(feats.shape[0]):
        n = int(mask[i].sum())
        P = feats.shape[1]
        out_f[i, P - n :] = feats[i, :n]
        out_m[i, P - n :] = True
    return out_f, out_m


_STAGE = re.compile(r"stage(\d)", re.I)
_RES = re.compile(r"_(256|384|512)(?:L)?\.pt$", re.I)


def check_checkpoint_name(path: str | Path, name: str, stage: Optional[int], resolution: int) -> None:
    """Refuse a checkpoint whose official file name says another stage or resolution.

    The state dict does not record the token grid, so loading a Stage II (32 x 32) checkpoint
    into the Stage I (16 x 16) model would silently generate zoomed-in crops.
    """
    fname = Path(path).name
    m = _STAGE.search(fname)
    if stage is not None and m and int(m.group(1)) != stage:
        other = f"llamagen-t2i-stage{m.group(1)}"
        raise UsageError(
            f"{fname} is a Stage {m.group(1)} checkpoint but --model {name} is Stage {stage}; use --model {other}"
        )
    r = _RES.search(fname)
    if r and int(r.group(1)) != resolution:
        raise UsageError(
            f"{fname} is a {r.group(1)} px checkpoint but --model {name} generates {resolution} px; "
            f"pick the model name with -{r.group(1)} or the matching file"
        )


#: the image size of each official text-to-image stage (its file names say the stage)
STAGE_SIZES = {1: 256, 2: 512}


def llamagen_image_size(
    path: str | Path,
    name: str,
    resolution: int,
    declared: Optional[int] = None,
    stored: Optional[int] = None,
    stage: Optional[int] = None,
) -> tuple[int, Optional[str]]:
    """The image size (px) of the LlamaGen checkpoint ``path``, which sets its token grid.

    A LlamaGen state dict does not record its grid (the official model keeps the rotary
    frequencies outside it), so a Stage II file (512 px, 32 x 32) loads into a Stage I model
    (16 x 16) without a word. The size comes from what says it: ``declared`` (``--image-size``),
    ``stored`` (an ``image_size`` the checkpoint file keeps beside its weights) and the file name
    (``..._384.pt``, ``..._stage2_...``); they must agree. When none says it, the model name's
    ``resolution`` is assumed.

    Returns (size, note): note is the one-line text saying which grid was assumed and from what
    (None when the size was declared or read). Raises UsageError when two sources disagree, or
    a declared size is not a positive multiple of 16.
    """
    fname = Path(path).name
    if declared is not None and (declared < 16 or declared % 16):
        raise UsageError(f"--image-size must be a positive multiple of 16 (LlamaGen's VQ downsampling), got {declared}")
    said = []  # (size, where)
    if declared is not None:
        said.append((int(declared), f"--image-size {declared}"))
    if stored is not None:
        said.append((int(stored), f"the image_size {stored} stored in {fname}"))
    r, m = _RES.search(fname), _STAGE.search(fname)
    if r:
        said.append((int(r.group(1)), f"the file name {fname}"))
    elif m and stage is not None and int(m.group(1)) in STAGE_SIZES:
        said.append((STAGE_SIZES[int(m.group(1))], f"the file name {fname} (Stage {m.group(1)})"))
    for size, where in said[1:]:
        if size != said[0][0]:
            raise UsageError(
                f"{said[0][1]} says {said[0][0]} px but {where} says {size} px; pass the --image-size the "
                f"checkpoint was trained at, or the matching file"
            )
    if said:
        return said[0][0], None
    g = resolution // 16
    return resolution, (
        f"{name}: {fname} does not record its image size; assuming {resolution} px ({g} x {g} tokens) from the "
        f"model name; pass --image-size if it was trained at another size"
    )


def stored_image_size(extras: dict) -> Optional[int]:
    """The ``image_size`` a checkpoint keeps beside its weights (its training ``"args"`` or ``"config"``
    dict, :func:`~ambiguity.models.checkpoints.load_checkpoint`), or None."""
    for key in ("args", "config"):
        size = extras.get(key, {}).get("image_size") if isinstance(extras.get(key), dict) else None
        if isinstance(size, int) and not isinstance(size, bool):
            return size
    return None


def class_labels(conditions: Sequence | torch.Tensor, name: str) -> torch.Tensor:
    """Class-label conditions -> (B,) int64 tensor; UsageError for anything that is not an integer
    label (a caption given to a class-conditional model, say). Ranges are checked by the caller."""
    if torch.is_tensor(conditions):
        if conditions.is_floating_point() or conditions.is_complex():
            raise UsageError(
                f"{name} is class-conditional: conditions must be integer class labels, got a {conditions.dtype} tensor"
            )
        return conditions.long().view(-1)
    bad = next((c for c in conditions if not _is_label(c)), None)
    if bad is not None:
        raise UsageError(
            f"{name} is class-conditional: conditions must be class labels, got {str(bad)[:40]!r}; "
            f"captions are for text-to-image models"
        )
    return torch.tensor([int(c) for c in conditions], dtype=torch.long)


def _is_label(c) -> bool:
    try:
        if isinstance(c, str):
            return c.strip().lstrip("-").isdigit() and abs(int(c)) < 2**62
        return not isinstance(c, bool) and int(c) == c and abs(int(c)) < 2**62
    except (TypeError, ValueError, OverflowError):
        return False


# --------------------------------------------------------------------------- official checkpoints
LLAMAGEN_C2I_REPO = "FoundationVision/LlamaGen"
LLAMAGEN_T2I_REPO = "peizesun/llamagen_t2i"
T5_REPO = "google/flan-t5-xl"

VQ16 = dict(
    codebook_size=16384,
    codebook_embed_dim=8,
    encoder_ch_mult=[1, 1, 2, 2, 4],
    decoder_ch_mult=[1, 1, 2, 2, 4],
    z_channels=256,
    ch=128,
)


def official_gpt_config(preset: str, model_type: str, resolution: int, downsample: int = 16) -> GPTConfig:
    """GPTConfig of an official LlamaGen checkpoint: preset, c2i/t2i, image size in pixels."""
    grid = resolution // downsample
    extra = (
        dict(num_classes=1000, cls_token_num=1) if model_type == "c2i" else dict(caption_dim=2048, cls_token_num=120)
    )
    return gpt_config_from_official(
        preset=preset, model_type=model_type, block_size=grid * grid, vocab_size=16384, **extra
    )


def load_llamagen(
    weights=None,
    device="cpu",
    dtype=torch.float32,
    *,
    preset: str,
    model_type: str,
    resolution: int,
    gpt_file: str,
    vq_file: str,
    repo: str,
    stage: Optional[int] = None,
    name: str = "llamagen",
    image_size: Optional[int] = None,
) -> LlamaGenModel:
    """Load an official LlamaGen GPT + VQ-16 pair (see :data:`ambiguity.models.catalog`).

    ``image_size`` (``--image-size``) declares the checkpoint's image size in pixels, and so its
    token grid (``image_size // 16``), which its file does not record; without it the size comes
    from the file name, else the model name's ``resolution`` is assumed with a ``note:``
    (:func:`llamagen_image_size`). The loaded model's :meth:`~LlamaGenModel.describe` records the
    size and where it came from.

    ``weights``: the GPT checkpoint file, or a directory with the official file names; else
    the local Hugging Face cache of ``repo``. The VQ checkpoint is optional (no pixels without
    it); t2i models also need flan-t5-xl in the local cache for text captions.
    """
    gpt_path = require_weight(gpt_file, repo, weights, primary=True, model=name)
    if image_size is not None:  # a declared size replaces the model name's; the file name must agree
        llamagen_image_size(gpt_path, name, resolution, image_size, None, stage)
    check_checkpoint_name(gpt_path, name, stage, resolution if image_size is None else image_size)
    state, extras = load_checkpoint(gpt_path)  # the names first: a wrong file is refused before it is read
    size, note = llamagen_image_size(gpt_path, name, resolution, image_size, stored_image_size(extras), stage)
    if note:
        warnings.warn(note, stacklevel=2)
    config = official_gpt_config(preset, model_type, size)
    with torch.device("meta"):
        gpt = GPT(config)
    gpt = gpt.to_empty(device="cpu")
    gpt.rope = rope_table(config)
    load_strict(gpt, state, f"{gpt_path.name}")
    gpt = gpt.to(device=device, dtype=dtype).eval()
    vq = None
    vq_path = find_weight(vq_file, repo, weights) or find_weight(vq_file, repo)
    if vq_path is not None:
        vq = VQModel(vq_config_from_official(VQ16))
        load_strict(vq, load_checkpoint_state(vq_path), vq_path.name)
        vq = vq.to(device).eval()
    encoder = None
    if model_type == "t2i":
        encoder = T5CaptionEncoder(T5_REPO, device=device, dtype=dtype, lazy=True)
    model = LlamaGenModel(gpt, vq, name=name, caption_encoder=encoder)
    model.image_size_from = "declared (--image-size)" if image_size is not None else ("assumed" if note else "read")
    return model
