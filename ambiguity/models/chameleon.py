"""Anole / Chameleon / Lumina-mGPT behind the toolkit's protocol, through transformers' Chameleon classes.

:class:`ChameleonModel` wraps a ``transformers.ChameleonForConditionalGeneration`` (7B: 32
layers, hidden 4096, vocabulary 65536 of which 8192 are image tokens) and, when its weights are
found, the Chameleon VQGAN decoder (:mod:`ambiguity.models.chameleon_vqgan`).

Image-token logits. transformers' ``forward`` sets every image-token logit to the dtype minimum
(the released Chameleon does not generate images), so this adapter never calls it: it runs
``lm.model`` (the decoder stack, final RMSNorm included) and multiplies the last hidden states by
the ``lm_head`` rows of the image-token vocabulary ids, in float32.

Vocabulary map. Image tokens are named ``IMGIMG<digits>Z`` in the model's vocabulary
(``config.vocabulary_map``), the digits of code ``c`` spelled with the letters A..J for 0..9
(code 10 -> ``IMGIMGBAZ``); :func:`image_token_ids_from_vocab` reads the map from those names.

Prompt templates (conditional rows / unconditional CFG rows, left-padded with an attention mask;
position ids count only real tokens, so a padded row computes what it would alone):

* Anole / Chameleon (``facebookresearch/chameleon`` ``ImageDecoder``): ``<s> caption <racm3:break>``
  / ``<s> <racm3:break>``; 32 x 32 tokens (512 px), no row separators, ``<eoss>`` after 1024.
* Lumina-mGPT (``Alpha-VLLM/Lumina-mGPT`` FlexAR item processor and CFG processor): ``<s> Generate an
  image of {W}x{H} according to the following prompt:\\n{caption}<reserved08706> <racm3:break> <h> <w>``
  / ``<racm3:break> <h> <w>``, where ``<h>``/``<w>`` are ``<reserved{8800+n}>`` for n = side/32 (the
  model would emit them itself; they are forced here); each row of side/16 image tokens is followed
  by the end-of-row token ``<reserved08799>``, which :meth:`HFTokenModel.expand` inserts itself,
  so callers only ever see image tokens.

Checkpoints (``--weights`` or the local Hugging Face cache, never the network): the transformers
layout (``leloy/Anole-7b-v0.1-hf``, ``facebook/chameleon-7b``, ``Alpha-VLLM/Lumina-mGPT-7B-*``) and
Meta's release layout (``GAIR/Anole-7b-v0.1``), see :mod:`ambiguity.models.chameleon_weights`. The
VQGAN decoder comes from ``model.vqmodel.decoder.*`` weights inside the checkpoint (leloy's
conversion has them), else Meta's ``vqgan.ckpt`` + ``vqgan.yaml`` given by ``vqgan=`` or
``$AMBIGUITY_CHAMELEON_VQGAN``, next to the weights (also in ``tokenizer/``), or in the local
cache of the model's repo or of ``GAIR/Anole-7b-v0.1``; without it there are no pixels.

Source: Chameleon Team, arXiv 2405.09818; Chern et al., Anole, arXiv 2407.06135; Liu et al.,
Lumina-mGPT, arXiv 2408.02657; LANTERN (Jang et al., ICLR 2025) Sec. 3 uses Anole as a target.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import UsageError
from ambiguity.models.base import Prompt
from ambiguity.models.chameleon_vqgan import ChameleonVQGAN, load_vqgan, vqgan_config_from_hf, vqgan_from_state
from ambiguity.models.chameleon_weights import build_lm, locate_checkpoint, read_checkpoint
from ambiguity.models.hf_common import HFTokenModel, left_pad_ids
from ambiguity.models.hf_draft_layer import HFDraftLayer, make_draft_layer
from ambiguity.models.hub import find_weight

__all__ = [
    "ChameleonModel",
    "ImageTemplate",
    "load_chameleon",
    "image_token_ids_from_vocab",
    "make_template",
    "ANOLE_REPO",
    "ANOLE_META_REPO",
    "CHAMELEON_REPO",
    "LUMINA_REPO",
    "VQGAN_ENV",
]

ANOLE_REPO = "leloy/Anole-7b-v0.1-hf"
ANOLE_META_REPO = "GAIR/Anole-7b-v0.1"
CHAMELEON_REPO = "facebook/chameleon-7b"
LUMINA_REPO = "Alpha-VLLM/Lumina-mGPT-7B-768"
VQGAN_ENV = "AMBIGUITY_CHAMELEON_VQGAN"  # path to vqgan.ckpt (or its folder) when it is elsewhere

BOI, EOI = "<racm3:break>", "<eoss>"
LUMINA_SEP, LUMINA_EOL = "<reserved08706>", "<reserved08799>"
LUMINA_TEXT = "Generate an image of {width}x{height} according to the following prompt:\n{caption}"


# --------------------------------------------------------------------------- vocabulary and template
def image_token_ids_from_vocab(vocab: Mapping[str, int]) -> torch.Tensor:
    """Vocabulary ids of the image tokens in code-index order, (V,) int64, from ``IMGIMG...Z`` names.

    Raises UsageError when the vocabulary has no image tokens or their codes are not 0..V-1.
    """
    digits = {chr(ord("A") + i): str(i) for i in range(10)}
    by_code: dict[int, int] = {}
    for name, vid in vocab.items():
        if name.startswith("IMGIMG") and name.endswith("Z"):
            spelled = "".join(digits.get(ch, "?") for ch in name[len("IMGIMG") : -1])
            if not spelled.isdigit():
                raise UsageError(
                    f"image token name {name!r} is not IMGIMG<letters A-J>Z; the vocabulary is not Chameleon's"
                )
            by_code[int(spelled)] = int(vid)
    if not by_code:
        raise UsageError("the model vocabulary has no IMGIMG image tokens; this is not a Chameleon-family checkpoint")
    if sorted(by_code) != list(range(len(by_code))):
        raise UsageError(f"image token codes are not 0..{len(by_code) - 1}; the vocabulary map is damaged")
    return torch.tensor([by_code[c] for c in range(len(by_code))], dtype=torch.long)


@dataclass(frozen=True)
class ImageTemplate:
    """Token layout around one generated image (vocabulary ids); see the module docstring.

    ``style``: ``"chameleon"`` (Anole, Chameleon) or ``"lumina"``. ``grid``: (h, w) image tokens.
    ``eol``: Lumina's end-of-row id (None: no row separators). ``size_tokens``: Lumina's
    ``<h> <w>`` ids after the image start. ``text``: format string for captions.
    """

    style: str
    grid: tuple[int, int]
    bos: int
    boi: int
    pad: int
    sep: Optional[int] = None
    eol: Optional[int] = None
    size_tokens: tuple[int, ...] = ()
    text: str = "{caption}"

    def conditional(self, text_ids: Sequence[int]) -> list[int]:
        """Prefix for a caption's text ids (no BOS in ``text_ids``)."""
        sep = [self.sep] if self.sep is not None else []
        return [self.bos, *text_ids, *sep, self.boi, *self.size_tokens]

    def unconditional(self) -> list[int]:
        """Prefix of the unconditional CFG row (Chameleon: BOS + image start; Lumina: from the image start)."""
        return [self.boi, *self.size_tokens] if self.style == "lumina" else [self.bos, self.boi]

    def describe(self) -> str:
        return {
            "chameleon": "<s> {caption} <racm3:break> | uncond <s> <racm3:break>",
            "lumina": "<s> " + self.text.replace("\n", "\\n") + "<reserved08706> <racm3:break> <h> <w> | "
            "uncond <racm3:break> <h> <w>; <reserved08799> after each row",
        }[self.style]


def _need(vocab: Mapping[str, int], name: str) -> int:
    if name not in vocab:
        raise UsageError(f"the model vocabulary lacks {name}; this checkpoint is not a Chameleon-family model")
    return int(vocab[name])


def make_template(
    vocab: Mapping[str, int], bos: int, style: str = "chameleon", resolution: int = 512, downsample: int = 16
) -> ImageTemplate:
    """The :class:`ImageTemplate` of ``style`` for ``resolution`` px square images.

    Raises UsageError for an unknown style, a resolution the model family cannot make, or a
    vocabulary without the needed special tokens.
    """
    if resolution % (2 * downsample):
        raise UsageError(f"resolution must be a multiple of {2 * downsample} px; got {resolution}")
    side = resolution // downsample
    pad = int(vocab.get("<pad>", bos))
    if style == "chameleon":
        return ImageTemplate("chameleon", (side, side), bos, _need(vocab, BOI), pad)
    if style == "lumina":
        size = _need(vocab, f"<reserved{8800 + resolution // (2 * downsample):05d}>")
        return ImageTemplate(
            "lumina",
            (side, side),
            bos,
            _need(vocab, BOI),
            pad,
            sep=_need(vocab, LUMINA_SEP),
            eol=_need(vocab, LUMINA_EOL),
            size_tokens=(size, size),
            text=LUMINA_TEXT.replace("{width}", str(resolution)).replace("{height}", str(resolution)),
        )
    raise UsageError(f"unknown Chameleon prompt style {style!r}; use chameleon or lumina")


# --------------------------------------------------------------------------- the adapter
class ChameleonModel(HFTokenModel):
    """A Chameleon-architecture target model (Anole, Chameleon, Lumina-mGPT); kind ``"t2i"``.

    Args:
        lm: ``transformers.ChameleonForConditionalGeneration`` in eval mode.
        template: the prompt / image token layout (:func:`make_template`).
        tokenizer: a ``tokenizers.Tokenizer`` for caption strings (None: captions must be given
            as lists of text token ids).
        vqgan: the VQGAN with its decoder for pixels, or None.
        name: registry name.
    """

    kind = "t2i"

    def __init__(
        self, lm, template: ImageTemplate, tokenizer=None, vqgan: Optional[ChameleonVQGAN] = None, name: str = "anole"
    ):
        config = lm.config
        vocab = config.vocabulary_map or (tokenizer.get_vocab() if tokenizer is not None else None)
        if not vocab:
            raise UsageError("the checkpoint has neither a vocabulary_map in config.json nor a tokenizer.json")
        self.lm, self.template, self.tokenizer, self.vqgan, self.name = lm.eval(), template, tokenizer, vqgan, name
        w = lm.lm_head.weight
        self.device, self.dtype = w.device, w.dtype
        self.image_token_ids = image_token_ids_from_vocab(vocab).to(self.device)
        if int(self.image_token_ids.max()) >= w.shape[0]:
            raise UsageError("image token ids exceed the output head; config.json and the weights disagree")
        self.grid, self.hidden_size = template.grid, config.hidden_size
        # (V, H) output rows of the image tokens, at least float32 (float64 stays float64: a float32 matmul's
        # rounding depends on the batch shape and the CPU's kernels, which broke batched == batch-1 exactness)
        self._head = w.detach()[self.image_token_ids].to(torch.promote_types(w.dtype, torch.float32))
        # decoding (the slots cache, teacher_force) is HFTokenModel's over the base model;
        # Lumina-mGPT's end-of-row token enters through HFTokenModel.expand
        self.decoder, self.text_embeddings, self.eol_id = lm.model, lm.model.embed_tokens, template.eol

    # ------------------------------------------------------------------ prompt
    def text_ids(self, condition) -> list[int]:
        """One caption (str) or its text token ids (ints, no BOS) -> text ids in the template."""
        if isinstance(condition, str):
            if self.tokenizer is None:
                raise UsageError(f"{self.name}: no tokenizer.json next to the weights; give captions as token id lists")
            return self.tokenizer.encode(
                self.template.text.replace("{caption}", condition), add_special_tokens=False
            ).ids
        return [int(i) for i in (condition.tolist() if torch.is_tensor(condition) else condition)]

    def make_prompt(self, conditions: Sequence, guided: bool = False) -> Prompt:
        """Captions (strings, or lists of text token ids) -> left-padded prefix ids and mask.

        ``inputs``: ``{"ids": (rows, P) int64, "mask": (rows, P) int64}``; with ``guided`` the
        unconditional rows follow the conditional ones. Raises UsageError for no captions, or a token id
        beyond the embedding table (:meth:`~ambiguity.models.hf_common.HFTokenModel.check_prompt_ids`).
        """
        conditions = list(conditions)
        if not conditions:
            raise UsageError("no captions given; pass a non-empty captions file")
        rows = [self.template.conditional(self.text_ids(c)) for c in conditions]
        if guided:
            rows += [self.template.unconditional()] * len(rows)
        shown = [c if isinstance(c, str) else f"<token ids {i}>" for i, c in enumerate(conditions)]
        self.check_prompt_ids(rows, shown)
        ids, mask = left_pad_ids(rows, self.template.pad, self.device)
        return Prompt({"ids": ids, "mask": mask}, len(conditions), guided, shown)

    # ------------------------------------------------------------------ drafter
    def embed_codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """Input embeddings of image tokens: (rows, T) code indices -> (rows, T, H) in the model dtype."""
        return self.lm.model.embed_tokens(self.lookup_vocab_ids(tokens.to(self.device)))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Image-token logits (..., V) float32 = hidden @ lm_head.weight[image_token_ids].T, computed in
        float32 (float64 for a float64 model) and returned as float32."""
        return (hidden.to(self._head.dtype) @ self._head.t()).float()

    def draft_layer(self) -> HFDraftLayer:
        """A freshly initialised decoder layer of this architecture (swin-norm or not, as the target)
        with a copy of the target's rotary table, on the model's device and dtype."""
        return make_draft_layer(self.lm.model, self.lm.config, self.device, self.dtype)

    # ----------------------------------------------------------------- codebook
    def codebook(self) -> torch.Tensor:
        """VQ codebook (8192, 256) float32 in code order: ``model.vqmodel.quantize.embedding`` (else the VQGAN's)."""
        vq = getattr(self.lm.model, "vqmodel", None)
        if vq is not None:
            return vq.quantize.embedding.weight.detach().float()
        if self.vqgan is not None:
            return self.vqgan.codebook().detach().float()
        raise NotImplementedError(f"{self.name}: the checkpoint has no VQ codebook (model.vqmodel) and no vqgan.ckpt")

    def input_embeddings(self) -> torch.Tensor:
        """Input-embedding rows of the image tokens, (V, H) float32 in code order."""
        return self.lm.model.embed_tokens.weight.detach()[self.image_token_ids].float()

    def output_embeddings(self) -> torch.Tensor:
        """``lm_head`` rows of the image tokens, (V, H) float32 in code order."""
        return self._head.float()

    @property
    def can_decode(self) -> bool:
        return self.vqgan is not None

    @property
    def image_shape(self) -> tuple[int, int, int]:
        f = self.vqgan.config.downsample if self.vqgan is not None else 16
        return (3, self.grid[0] * f, self.grid[1] * f)

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Code grids (B, h, w) int64 -> images (B, 3, 16h, 16w) float32 in [0, 1] through the VQGAN
        decoder; NotImplementedError without vqgan.ckpt."""
        if self.vqgan is None:
            raise NotImplementedError(
                f"{self.name}: no VQGAN decoder (vqgan.ckpt + vqgan.yaml) found; put them next to "
                f"the weights or set {VQGAN_ENV}"
            )
        with torch.no_grad():
            x = self.vqgan.decode_codes(codes)
        return ((x.float() + 1) / 2).clamp(0, 1)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [0, 1] -> code grids (B, H/16, W/16) int64 (VQGAN or transformers' encoder)."""
        x = images * 2 - 1
        with torch.no_grad():
            if self.vqgan is not None:
                return self.vqgan.encode(x.to(self.vqgan.quant_conv.weight.device, torch.float32))
            vq = getattr(self.lm.model, "vqmodel", None)
            if vq is None:
                raise NotImplementedError(f"{self.name}: no VQ encoder in the checkpoint")
            w = vq.quant_conv.weight
            codes = vq.encode(x.to(w.device, w.dtype)).image_tokens
        f = 2 ** (len(self.lm.config.vq_config.channel_multiplier) - 1)
        return codes.view(images.shape[0], images.shape[2] // f, images.shape[3] // f)

    def describe(self) -> dict:
        """Summary facts plus parameter count (without the VQ model), prompt template and pixel support."""
        d = super().describe()
        d.update(
            parameters=sum(p.numel() for n, p in self.lm.named_parameters() if ".vqmodel." not in n),
            template=self.template.describe(),
            can_decode=self.can_decode,
        )
        return d


# --------------------------------------------------------------------------- checkpoints
def _find_vqgan(
    vqgan, folders: Sequence[Path], repos: Sequence[str], fallback_config, device
) -> Optional[ChameleonVQGAN]:
    """Meta's vqgan.ckpt: the explicit path (or $AMBIGUITY_CHAMELEON_VQGAN), else next to the
    weights, else in the local Hugging Face cache of ``repos``; None when nowhere."""
    explicit = vqgan if vqgan is not None else os.environ.get(VQGAN_ENV)
    if explicit:
        p = Path(explicit).expanduser()
        p = p / "vqgan.ckpt" if p.is_dir() else p
        if not p.is_file():
            raise UsageError(f"VQGAN checkpoint {p} does not exist; pass the path of Meta's vqgan.ckpt")
        cands = [p]
    else:
        cands = [d / "vqgan.ckpt" for d in folders] + [
            find_weight(f, r) for r in repos for f in ("tokenizer/vqgan.ckpt", "vqgan.ckpt")
        ]
    for c in cands:
        if c is not None and Path(c).is_file():
            c = Path(c)
            config = None if (c.parent / "vqgan.yaml").is_file() else fallback_config
            return load_vqgan(c, config, device)
    return None


def load_chameleon(
    weights=None,
    device="cpu",
    dtype=torch.float32,
    *,
    repo: str = ANOLE_REPO,
    alt_repos: Sequence[str] = (),
    style: Optional[str] = None,
    resolution: Optional[int] = None,
    vqgan: Optional[str | Path] = None,
    name: Optional[str] = None,
) -> ChameleonModel:
    """Load Anole / Chameleon / Lumina-mGPT (see :data:`ambiguity.models.catalog`).

    ``weights``: a checkpoint folder in either layout (module docstring); else the local Hugging
    Face cache of ``repo`` then ``alt_repos``. ``style``: ``"chameleon"`` or ``"lumina"`` (default:
    from the repo name). ``resolution``: image side in px (Anole/Chameleon 512; Lumina-mGPT from the
    repo suffix, else 768). ``vqgan``: Meta's ``vqgan.ckpt`` when it is not next to the weights.
    Raises WeightsNotFoundError (absent weights, naming ``repo``) or UsageError (mismatch).
    """
    name = name or repo.split("/")[-1].lower()
    style = style or ("lumina" if "lumina" in repo.lower() else "chameleon")
    if resolution is None:
        resolution = next((r for r in (512, 768, 1024) if repo.endswith(f"-{r}")), 768) if style == "lumina" else 512
    root = locate_checkpoint(repo, alt_repos, weights, name)
    config, state, tok_file, folders = read_checkpoint(root, device)
    lm, vq_state = build_lm(config, state, device, dtype, f"{root}")
    del state  # consumed by build_lm
    hf_vq = vqgan_config_from_hf(lm.config.vq_config)
    vq = None
    if vqgan is None and any(k.startswith("decoder.") for k in vq_state):
        vq = vqgan_from_state(vq_state, hf_vq, f"{root} model.vqmodel", device)
    if vq is None:
        vq = _find_vqgan(vqgan, folders, (repo, *alt_repos, ANOLE_META_REPO), hf_vq, device)
    tokenizer = None
    if tok_file is not None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tok_file))
    vocab = lm.config.vocabulary_map or (tokenizer.get_vocab() if tokenizer is not None else {})
    bos = lm.config.bos_token_id if lm.config.bos_token_id is not None else int(vocab.get("<s>", 0))
    template = make_template(vocab, int(bos), style, resolution, 2 ** (len(hf_vq.ch_mult) - 1))
    return ChameleonModel(lm, template, tokenizer, vq, name=name)
