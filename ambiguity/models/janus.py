"""Janus / Janus-Pro (DeepSeek) text-to-image behind the toolkit's protocol.

Janus generates images with a Llama decoder whose image tokens never touch the text vocabulary
(Chen et al., 2025, "Janus-Pro", arXiv 2501.17811, Sec. 2.1; Wu et al., 2024, "Janus",
arXiv 2410.13848, Sec. 2.1):

* a generated code ``c`` enters the decoder as ``gen_aligner(gen_embed(c))`` (transformers:
  ``generation_embeddings`` + ``generation_aligner``), not through the text embeddings;
* next-token logits come from the generation head (``gen_head``: Linear-GELU-Linear to the
  16384 codes), not from the text ``lm_head``. Its outputs are already in code-index order, so
  the image "vocabulary" is the head's output space: ``image_token_ids[c] = c`` (sized from
  ``vq_config.num_embeddings`` and checked against the head and the embedding);
* the tokenizer is Janus's VQ-16 (the LlamaGen design): an l2-normalised 16384 x 8 codebook,
  a 24 x 24 grid for 384 x 384 px, and a decoder back to pixels.

Prompt (as Janus's ``generation_inference.py`` builds it): BOS + the DeepSeek SFT template with an
empty system prompt, ``"<|User|>: {caption}\\n\\n<|Assistant|>:"``, + ``<begin_of_image>``.
Classifier-free guidance (as Janus does it): the unconditional row is the same token sequence
with every token except the first (BOS) and the last (``<begin_of_image>``) replaced by the pad
token; those pad tokens are attended (they are content, not padding). Janus samples with
``cfg_weight = 5`` and temperature 1.

Weights: ``transformers.JanusForConditionalGeneration`` checkpoints
(``deepseek-community/Janus-Pro-1B`` / ``-7B``) from ``--weights DIR`` or the local HF cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
import torch.nn.functional as F

from ambiguity.errors import UsageError
from ambiguity.models.base import Prompt
from ambiguity.models.hf_common import HFTokenModel, left_pad_ids, load_pretrained, load_tokenizer, rows_of, token_id
from ambiguity.models.hf_draft_layer import make_draft_layer

__all__ = ["JanusModel", "load_janus", "JANUS_TEMPLATE", "JANUS_PRO_1B_REPO", "JANUS_PRO_7B_REPO"]

JANUS_PRO_1B_REPO = "deepseek-community/Janus-Pro-1B"
JANUS_PRO_7B_REPO = "deepseek-community/Janus-Pro-7B"
JANUS_TEMPLATE = "<|User|>: {caption}\n\n<|Assistant|>:"
BOI_TOKEN = "<begin_of_image>"


class JanusModel(HFTokenModel):
    """A ``JanusForConditionalGeneration`` as a t2i :class:`~ambiguity.models.base.TokenModel`.

    Args:
        model: the transformers model, eval mode.
        tokenizer: its tokenizer (BOS, pad and ``<begin_of_image>`` come from it).
        name: registry name.
        template: the SFT template with a ``{caption}`` field (Janus's by default).
        boi_token: the image-start token string.

    Raises UsageError when the tokenizer lacks the pad or image-start token, or the generation
    head, image embedding and VQ codebook disagree in size.
    """

    kind = "t2i"

    def __init__(
        self, model, tokenizer, name: str = "janus", template: str = JANUS_TEMPLATE, boi_token: str = BOI_TOKEN
    ):
        self.model, self.tokenizer, self.name, self.template = model, tokenizer, name, template
        inner = model.model
        self.decoder, self.text_embeddings = inner.language_model, model.get_input_embeddings()
        self.vq, self.gen_head = inner.vqmodel, inner.generation_head
        config = model.config
        V = int(config.vq_config.num_embeddings)
        sizes = {
            "generation head": self.gen_head.vision_head.out_features,
            "image embedding": inner.generation_embeddings.num_embeddings,
            "VQ codebook": self.vq.quantize.embedding.num_embeddings,
        }
        if any(int(v) != V for v in sizes.values()):
            raise UsageError(
                f"{name}: vq_config.num_embeddings={V} but "
                + ", ".join(f"{k} {v}" for k, v in sizes.items())
                + "; the checkpoint is inconsistent"
            )
        side = int(config.vision_config.image_size) // int(config.vision_config.patch_size)
        self.grid = (side, side)
        p = next(self.decoder.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.image_token_ids = torch.arange(V, device=self.device)  # gen_head outputs are code indices
        self.hidden_size = int(config.text_config.hidden_size)
        self.max_positions = getattr(config.text_config, "max_position_embeddings", None)
        self.bos_id = tokenizer.bos_token_id
        if tokenizer.pad_token_id is None:
            raise UsageError(
                f"{name}: the tokenizer has no pad token (Janus's CFG needs it); use the checkpoint's tokenizer"
            )
        self.pad_id = int(tokenizer.pad_token_id)
        self.boi_id = token_id(tokenizer, getattr(tokenizer, "boi_token", None) or boi_token, "image-start")

    # ------------------------------------------------------------------ prompt
    def prompt_ids(self, caption: str) -> list[int]:
        """Token ids of the conditional prompt: BOS + template(caption) + ``<begin_of_image>``."""
        text = self.template.format(caption=caption)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ([self.bos_id] if self.bos_id is not None else []) + list(ids) + [self.boi_id]

    def unconditional_ids(self, ids: list[int]) -> list[int]:
        """Janus's unconditional prompt: every token but the first and the last -> pad."""
        return [ids[0]] + [self.pad_id] * (len(ids) - 2) + [ids[-1]] if len(ids) > 2 else list(ids)

    def make_prompt(self, conditions: Sequence[str], guided: bool = False) -> Prompt:
        """Captions -> Prompt with ``inputs = {"ids": (rows, P), "mask": (rows, P)}`` (left-padded).

        Raises UsageError for an empty list or non-string conditions.
        """
        captions = rows_of(conditions)
        seqs = [self.prompt_ids(c) for c in captions]
        if guided:
            seqs = seqs + [self.unconditional_ids(s) for s in seqs]
        self.check_prompt_ids(seqs, captions)
        ids, mask = left_pad_ids(seqs, self.pad_id, self.device)
        return Prompt({"ids": ids, "mask": mask}, len(captions), guided, captions)

    # ----------------------------------------------------------------- drafter
    def embed_codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """Codes (rows, T) -> gen_aligner(gen_embed(codes)) (rows, T, H) in the model dtype."""
        return self.model.prepare_embeddings_for_image_generation(tokens.to(self.device))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Janus's generation head (Linear-GELU-Linear): (..., H) -> float32 logits (..., V)."""
        return self.gen_head(hidden).float()

    def draft_layer(self):
        """A fresh Llama decoder layer from ``text_config`` (see :class:`HFDraftLayer`)."""
        return make_draft_layer(self.decoder, self.model.config.text_config, self.device, self.dtype)

    def output_embeddings(self) -> torch.Tensor:
        """Rows of the generation head's last Linear, (V, projection_dim) float32.

        Janus's head is an MLP, so these rows live after its hidden layer, not in the decoder's
        H-dimensional space.
        """
        return self.gen_head.vision_head.weight.detach().float()

    # ---------------------------------------------------------------- codebook
    def codebook(self) -> torch.Tensor:
        """The l2-normalised VQ codebook (V, 8) float32 that both quantiser and decoder use."""
        return F.normalize(self.raw_codebook(), dim=-1)

    def raw_codebook(self) -> torch.Tensor:
        """The stored codebook weights (V, 8) float32, before normalisation."""
        return self.vq.quantize.embedding.weight.detach().float()

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(3, 384, 384) for Janus-Pro: grid times the VQ's downsampling factor."""
        f = 2 ** (len(self.vq.config.channel_multiplier) - 1)
        return (int(self.vq.config.out_channels), self.grid[0] * f, self.grid[1] * f)

    @torch.no_grad()
    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Code grids (B, h, w) int64 -> images (B, 3, 384, 384) float32 in [0, 1] (Janus: (x + 1) / 2)."""
        B = codes.shape[0]
        x = self.vq.decode(codes.reshape(B, -1).to(self.device))
        return ((x.float() + 1) / 2).clamp(0, 1)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [0, 1] -> codes (B, h, w): nearest l2-normalised code to the
        l2-normalised latent (Janus's VQ-16 quantiser)."""
        w = self.vq.quant_conv.weight
        z = self.vq.quant_conv(self.vq.encoder(images.to(w.device, w.dtype) * 2 - 1))
        zf = F.normalize(z.permute(0, 2, 3, 1).reshape(-1, z.shape[1]).float(), dim=-1)
        idx = torch.cdist(zf, self.codebook().to(zf.device)).argmin(1)
        return idx.view(z.shape[0], z.shape[2], z.shape[3])

    def describe(self) -> dict:
        """Model facts plus the VQ tokenizer's parameter count."""
        d = super().describe()
        d["tokenizer_parameters"] = sum(p.numel() for p in self.vq.parameters())
        return d


def load_janus(
    weights=None,
    device="cpu",
    dtype=torch.float32,
    repo: str = JANUS_PRO_1B_REPO,
    name: Optional[str] = None,
    template: str = JANUS_TEMPLATE,
) -> JanusModel:
    """Load a Janus / Janus-Pro checkpoint in the transformers layout, offline.

    ``weights``: a directory with ``config.json``, weights and tokenizer files; else the local HF
    cache of ``repo``. Raises WeightsNotFoundError naming ``repo`` when absent.
    """
    from transformers import JanusForConditionalGeneration

    label = name or repo
    model = load_pretrained(JanusForConditionalGeneration, repo, weights, device, dtype, label)
    return JanusModel(model, load_tokenizer(repo, weights, label), name=label, template=template)
