"""Caption encoders for text-conditional models.

LlamaGen t2i conditions on flan-t5-xl encoder features: captions are tokenised to at most
120 tokens (padded to 120), and the encoder's last hidden states (B, 120, 2048) with the
attention mask are the model's prefix (LlamaGen Sec. 2.3; ``language/t5.py`` of the release).
"""
from __future__ import annotations

import re
from typing import Optional

import torch

from ambiguity.errors import WeightsNotFoundError

__all__ = ["T5CaptionEncoder", "clean_caption"]

_URL = re.compile(r"\b(?:https?://|www\.)\S+", re.I)


def clean_caption(text: str) -> str:
    """Light version of LlamaGen's caption cleaning: unquote-free lowercase, no URLs, single spaces."""
    text = _URL.sub("", str(text)).strip().lower()
    return re.sub(r"\s+", " ", text)


class T5CaptionEncoder:
    """flan-t5-xl (or any T5 encoder) from a local path or the local Hugging Face cache.

    ``encode(captions)`` -> (features (B, max_length, d_model) in ``dtype``, mask (B, max_length) bool).
    With ``lazy=True`` the weights are read on first use, so a c2i-style run never pays for them.
    Raises WeightsNotFoundError with the repo id to download when absent.
    """

    def __init__(self, repo_or_path: str = "google/flan-t5-xl", device="cpu", dtype=torch.float32,
                 max_length: int = 120, lazy: bool = False):
        self.repo, self.device, self.dtype, self.max_length = repo_or_path, torch.device(device), dtype, max_length
        self.model = self.tokenizer = None
        if not lazy:
            self._load()

    def _load(self) -> None:
        if self.model is not None:
            return
        from transformers import AutoTokenizer, T5EncoderModel

        from ambiguity.models.hub import download_hint

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.repo, local_files_only=True)
            self.model = T5EncoderModel.from_pretrained(self.repo, local_files_only=True, dtype=self.dtype)
        except (OSError, ValueError) as exc:
            raise WeightsNotFoundError(f"caption encoder {self.repo} is not available offline; "
                                       f"{download_hint(self.repo)}") from None
        self.model = self.model.to(self.device).eval()

    @torch.no_grad()
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        self._load()
        batch = self.tokenizer([clean_caption(c) for c in captions], max_length=self.max_length,
                               padding="max_length", truncation=True, return_tensors="pt")
        ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        feats = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return feats.to(self.dtype), mask.bool()
