"""Emu3-Gen (BAAI) behind the toolkit's protocol.

Emu3 (Wang et al., 2024, "Emu3: Next-Token Prediction is All You Need", arXiv 2409.18869,
Sec. 2) puts its 32768 SBER-MoVQGAN codes into the text vocabulary as tokens named
``<|visual token XXXXXX|>``; code index = the six digits. :attr:`Emu3Model.image_token_ids` is
read from the checkpoint's own ``vocabulary_map`` (never an offset), and logits are the
``lm_head`` rows of those ids in code-index order.

An image of h x w codes is written row by row with an end-of-row token after every row
(``<|extra_200|>``, the ``eol_token_id`` of transformers' ``Emu3ImageVocabularyMapping``), then
``<|extra_201|>`` (end of frame) and ``<|image end|>``. The adapter hides the end-of-row tokens:
:meth:`Emu3Model.extend_slots` inserts one after each completed row in the same decoder call and
returns, for the row's last code, the distribution *after* the end-of-row token (i.e. of the next
row's first code); image slot ``n`` sits after ``n`` codes and their ``n // w`` end-of-row tokens.
So the decoder's positions match Emu3's generation exactly while the toolkit sees only codes.

Prompt (as Emu3's processor builds it for generation): ``<bos>`` + caption + ``<|image start|>``
+ ``"{h}*{w}"`` + ``<|image token|>``, with (h, w) from ``ratio`` and ``image_area`` (720 x 720 px
-> 90 x 90 codes by default; the VQ downsamples by 8). Emu3's README appends
``" masterpiece, film grained, best quality."`` to captions (``positive_suffix``; off by default so
captions stay the user's). Classifier-free guidance (as Emu3 does it): the unconditional row is
the *negative prompt* (Emu3's README one by default, ``negative_prompt=""`` for an empty prompt)
in the same template, image-size header included; Emu3 samples with guidance 3.0, top-k 2048.

Weights: ``transformers.Emu3ForConditionalGeneration`` checkpoints (``BAAI/Emu3-Gen-hf``) from
``--weights DIR`` or the local HF cache.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import UsageError
from ambiguity.models.base import Prompt
from ambiguity.models.hf_common import HFTokenModel, left_pad_ids, load_pretrained, load_tokenizer, local_dir, rows_of
from ambiguity.models.hf_draft_layer import make_draft_layer
from ambiguity.models.hub import hf_snapshot_dir

__all__ = [
    "Emu3Model",
    "load_emu3",
    "emu3_grid",
    "visual_token_ids",
    "EMU3_GEN_REPO",
    "EMU3_NEGATIVE_PROMPT",
    "EMU3_POSITIVE_SUFFIX",
]

EMU3_GEN_REPO = "BAAI/Emu3-Gen-hf"
EMU3_NEGATIVE_PROMPT = (
    "lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, "
    "cropped, worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, "
    "username, blurry."
)
EMU3_POSITIVE_SUFFIX = " masterpiece, film grained, best quality."
_VISUAL = re.compile(r"^<\|visual token(\d+)\|>$")
EOL, EOF, BOI, EOI, IMG = "<|extra_200|>", "<|extra_201|>", "<|image start|>", "<|image end|>", "<|image token|>"


def visual_token_ids(vocabulary_map: dict[str, int], codebook_size: int) -> torch.Tensor:
    """Vocabulary ids of codes 0..V-1, (V,) int64, from ``<|visual token XXXXXX|>`` names.

    Raises UsageError unless the names cover exactly the codes 0..codebook_size-1.
    """
    found = {}
    for name, i in vocabulary_map.items():
        m = _VISUAL.match(name)
        if m:
            found[int(m.group(1))] = int(i)
    if sorted(found) != list(range(codebook_size)):
        raise UsageError(
            f"the vocabulary names {len(found)} visual tokens but the VQ codebook has {codebook_size}; "
            f"the checkpoint's vocabulary_map and vq_config disagree"
        )
    return torch.tensor([found[c] for c in range(codebook_size)], dtype=torch.long)


def emu3_grid(ratio: str = "1:1", image_area: int = 720 * 720, factor: int = 8) -> tuple[int, int]:
    """(h, w) in codes for an aspect ``"W:H"`` ratio and an image area in pixels (Emu3's processor)."""
    try:
        rw, rh = (int(x) for x in ratio.split(":"))
        if rw <= 0 or rh <= 0:
            raise ValueError
    except ValueError:
        raise UsageError(f"ratio must look like '1:1' or '16:9' (width:height), got {ratio!r}") from None
    scale = (image_area / (rw * rh)) ** 0.5
    h, w = int(round(rh * scale / factor)), int(round(rw * scale / factor))
    if h < 1 or w < 1:
        raise UsageError(f"image_area {image_area} is too small for ratio {ratio}")
    return h, w


class Emu3Model(HFTokenModel):
    """An ``Emu3ForConditionalGeneration`` as a t2i :class:`~ambiguity.models.base.TokenModel`.

    Args:
        model: the transformers model, eval mode.
        tokenizer: its tokenizer (text of captions and of the ``"h*w"`` header).
        name: registry name.
        grid: (h, w) codes per image.
        negative_prompt: text of the unconditional (CFG) rows.
        positive_suffix: appended to every caption.
        pixel_mean, pixel_std: the VQ's pixel normalisation (Emu3: 0.5, 0.5 -> [-1, 1]).

    Raises UsageError when the vocabulary lacks Emu3's special tokens or its visual tokens do
    not match the codebook.
    """

    kind = "t2i"

    def __init__(
        self,
        model,
        tokenizer,
        name: str = "emu3",
        grid: tuple[int, int] = (90, 90),
        negative_prompt: str = EMU3_NEGATIVE_PROMPT,
        positive_suffix: str = "",
        pixel_mean: float | Sequence[float] = 0.5,
        pixel_std: float | Sequence[float] = 0.5,
    ):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.decoder, self.text_embeddings = model.model.text_model, model.get_input_embeddings()
        self.lm_head, self.vq = model.lm_head, model.model.vqmodel
        self.negative_prompt, self.positive_suffix = negative_prompt, positive_suffix
        config = model.config
        vocab = dict(config.vocabulary_map or {})
        missing = [t for t in (EOL, BOI, IMG) if t not in vocab]
        if missing:
            raise UsageError(f"{name}: the vocabulary_map lacks {missing[0]}; this is not an Emu3 checkpoint")
        p = next(self.decoder.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.image_token_ids = visual_token_ids(vocab, int(config.vq_config.codebook_size)).to(self.device)
        self.eol_id, self.boi_id, self.img_id = vocab[EOL], vocab[BOI], vocab[IMG]
        self.grid = (int(grid[0]), int(grid[1]))
        self.hidden_size = int(config.text_config.hidden_size)
        self.max_positions = getattr(config.text_config, "max_position_embeddings", None)
        self.bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else config.text_config.bos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else config.text_config.pad_token_id
        ids = self.image_token_ids
        contiguous = bool((ids == torch.arange(int(ids[0]), int(ids[0]) + ids.numel(), device=ids.device)).all())
        W = self.lm_head.weight
        self._head_weight = W[int(ids[0]) : int(ids[0]) + ids.numel()] if contiguous else W[ids]
        shape = (3, 1, 1)
        self.pixel_mean = torch.as_tensor(pixel_mean, dtype=torch.float32).reshape(-1, 1, 1).expand(shape).clone()
        self.pixel_std = torch.as_tensor(pixel_std, dtype=torch.float32).reshape(-1, 1, 1).expand(shape).clone()

    # ------------------------------------------------------------------ prompt
    def prompt_ids(self, text: str) -> list[int]:
        """``<bos>`` + text + ``<|image start|>`` + ``"h*w"`` + ``<|image token|>`` as token ids."""
        enc = lambda s: list(self.tokenizer(s, add_special_tokens=False)["input_ids"])
        head = [self.bos_id] if self.bos_id is not None else []
        return head + enc(text) + [self.boi_id] + enc(f"{self.grid[0]}*{self.grid[1]}") + [self.img_id]

    def make_prompt(self, conditions: Sequence[str], guided: bool = False) -> Prompt:
        """Captions -> Prompt with ``inputs = {"ids": (rows, P), "mask": (rows, P)}`` (left-padded);
        with ``guided`` the unconditional rows hold the negative prompt. UsageError for bad captions."""
        captions = rows_of(conditions)
        seqs = [self.prompt_ids(c + self.positive_suffix) for c in captions]
        if guided:
            seqs += [self.prompt_ids(self.negative_prompt)] * len(captions)
        self.check_prompt_ids(seqs, captions)
        ids, mask = left_pad_ids(seqs, self.pad_id, self.device)
        return Prompt({"ids": ids, "mask": mask}, len(captions), guided, captions)

    # ----------------------------------------------------------------- drafter
    def embed_codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """Codes (rows, T) -> text-embedding rows of their visual tokens (rows, T, H)."""
        return self.text_embeddings(self.lookup_vocab_ids(tokens.to(self.device)))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """``lm_head`` rows of the visual tokens: (..., H) -> float32 logits (..., V) in code order."""
        return torch.nn.functional.linear(hidden, self._head_weight).float()

    def draft_layer(self):
        """A fresh Emu3 decoder layer from ``text_config`` (see :class:`HFDraftLayer`)."""
        return make_draft_layer(self.decoder, self.model.config.text_config, self.device, self.dtype)

    def input_embeddings(self) -> torch.Tensor:
        """Text-embedding rows of the visual tokens, (V, H) float32 in code order."""
        return self.text_embeddings.weight[self.image_token_ids].detach().float()

    def output_embeddings(self) -> torch.Tensor:
        """``lm_head`` rows of the visual tokens, (V, H) float32 in code order."""
        return self._head_weight.detach().float()

    # ---------------------------------------------------------------- codebook
    def codebook(self) -> torch.Tensor:
        """The MoVQGAN codebook (V, 4) float32 (the quantiser compares raw vectors, no normalisation)."""
        return self.vq.quantize.embedding.weight.detach().float()

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(3, 8h, 8w) for Emu3's VQ (spatial factor from the checkpoint)."""
        f = int(self.vq.spatial_scale_factor)
        return (int(self.vq.config.out_channels), self.grid[0] * f, self.grid[1] * f)

    @torch.no_grad()
    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Code grids (B, h, w) int64 -> images (B, 3, 8h, 8w) float32 in [0, 1]."""
        x = self.vq.decode(codes.to(self.device)).float()
        return (x * self.pixel_std.to(x.device) + self.pixel_mean.to(x.device)).clamp(0, 1)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [0, 1] (H, W multiples of 8) -> codes (B, H/8, W/8) int64."""
        x = (images.float() - self.pixel_mean.to(images.device)) / self.pixel_std.to(images.device)
        B, _, H, W = x.shape
        sizes = torch.tensor([[H, W]] * B)
        out = self.vq.encode(x.to(self.device, next(self.vq.parameters()).dtype), sizes, return_dict=True)
        return torch.stack(list(out.image_tokens)).long()

    def describe(self) -> dict:
        """Model facts plus the VQ tokenizer's parameter count."""
        d = super().describe()
        d["tokenizer_parameters"] = sum(p.numel() for p in self.vq.parameters())
        return d


def _pixel_norm(path: Optional[Path]) -> tuple[list[float] | float, list[float] | float]:
    """image_mean / image_std from ``preprocessor_config.json`` when the checkpoint has one."""
    if path is not None and (path / "preprocessor_config.json").is_file():
        settings = json.loads((path / "preprocessor_config.json").read_text())
        return settings.get("image_mean", 0.5), settings.get("image_std", 0.5)
    return 0.5, 0.5


def load_emu3(
    weights=None,
    device="cpu",
    dtype=torch.float32,
    repo: str = EMU3_GEN_REPO,
    name: Optional[str] = None,
    grid: Optional[tuple[int, int]] = None,
    ratio: str = "1:1",
    image_area: int = 720 * 720,
    negative_prompt: str = EMU3_NEGATIVE_PROMPT,
    positive_suffix: str = "",
) -> Emu3Model:
    """Load Emu3-Gen in the transformers layout, offline.

    ``grid`` (h, w) overrides ``ratio``/``image_area`` (Emu3's defaults give 90 x 90 codes).
    Raises WeightsNotFoundError naming ``repo`` when absent.
    """
    from transformers import Emu3ForConditionalGeneration

    label = name or repo
    model = load_pretrained(Emu3ForConditionalGeneration, repo, weights, device, dtype, label)
    tokenizer = load_tokenizer(repo, weights, label)
    factor = int(model.model.vqmodel.spatial_scale_factor)
    mean, std = _pixel_norm(hf_snapshot_dir(repo, local_dir(repo, weights), model=label))
    return Emu3Model(
        model,
        tokenizer,
        name=label,
        grid=grid or emu3_grid(ratio, image_area, factor),
        negative_prompt=negative_prompt,
        positive_suffix=positive_suffix,
        pixel_mean=mean,
        pixel_std=std,
    )
