"""Caption encoders for text-conditional models.

LlamaGen t2i conditions on flan-t5-xl encoder features (Sun et al., 2024, arXiv 2406.06525,
Sec. 2.3; ``language/t5.py`` of the release): each caption is cleaned (twice, by the PixArt /
DeepFloyd-IF caption cleaner), tokenised with special tokens (the closing ``</s>``) to at most 120
tokens and padded to 120, and the encoder's last hidden states (B, 120, 2048) together with the
attention mask form the model's prefix. :class:`ambiguity.models.llamagen.LlamaGenModel` then
moves the padding to the front and zeroes the padded features, as LlamaGen's sampler does.
"""

from __future__ import annotations

import html
import re
import urllib.parse

import torch

from ambiguity.errors import UsageError
from ambiguity.models.hf_common import load_pretrained, load_tokenizer

__all__ = ["T5CaptionEncoder", "clean_caption", "T5_REPO", "T5_MAX_LENGTH"]

T5_REPO = "google/flan-t5-xl"
T5_MAX_LENGTH = 120

# Rules of the caption cleaner LlamaGen applies before T5 (written for this project; the ftfy
# mojibake fix of the original is not reproduced). Each pair is (pattern, replacement).
_CJK = "\u31c0-\u31ef\u31f0-\u31ff\u3200-\u32ff\u3300-\u33ff\u3400-\u4dbf\u4dc0-\u4dff\u4e00-\u9fff"
_DASHES = (
    "\u002d\u058a\u05be\u1400\u1806\u2010-\u2015\u2e17\u2e1a\u2e3a\u2e3b\u2e40\u301c\u3030\u30a0"
    "\ufe31\ufe32\ufe58\ufe63\uff0d"
)
_TLD = r"(?:com|co|ru|net|org|edu|gov|it)"
_EARLY = [
    (r"<person>", "person"),
    (r"\b(?:https?:(?:/{1,3}|[a-z0-9%])|[a-z0-9.\-]+[.]" + _TLD + r"[\w/-]*\b/?(?!@))", ""),  # URLs
    (r"\b(?:www:(?:/{1,3}|[a-z0-9%])|[a-z0-9.\-]+[.]" + _TLD + r"[\w/-]*\b/?(?!@))", ""),
    (r"<[^>]*>", ""),  # HTML tags
    (r"@[\w\d]+\b", ""),  # @nicknames
    ("[" + _CJK + "]+", ""),
    ("[" + _DASHES + "]+", "-"),
    ("[`\u00b4\u00ab\u00bb\u201c\u201d\u00a8]", '"'),
    ("[\u2018\u2019]", "'"),
    (r"&quot;?", ""),
    (r"&amp", ""),
    (r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),  # IP addresses
    (r"\d:\d\d\s+$", ""),  # article ids
    (r"\\n", " "),
    (r"#\d{1,3}\b", ""),
    (r"#\d{5,}\b", ""),
    (r"\b\d{6,}\b", ""),
    (r"[\S]+\.(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)", ""),  # file names
    (r"[\"']{2,}", '"'),
    (r"[.]{2,}", " "),
    (r"[#\u00ae\u2022\u00a9\u2122&@\u00b7\u00ba\u00bd\u00be\u00bf\u00a1\u00a7~)(\]\[}{|\\/*]+", " "),
    (r"\s+\.\s+", " "),
]
_LATE = [
    (r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""),
    (r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""),
    (r"\b\d+[a-zA-Z]+\d+\b", ""),
    (r"(worldwide\s+)?(free\s+)?shipping", ""),
    (r"(free\s)?download(\sfree)?", ""),
    (r"\bclick\b\s(?:for|on)\s\w+", ""),
    (r"\b(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)(\simage[s]?)?", ""),
    (r"\bpage\s+\d+\b", ""),
    (r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),
    (r"\b\d+\.?\d*[x\u0445\u00d7]\d+\.?\d*\b", ""),  # sizes like 1920x1080
    (r"\b\s+:\s+", ": "),
    (r"(\D[,./])\b", r"\1 "),  # a space after punctuation
    (r"\s+", " "),
]
_ENDS = [(r"^[\"']([\w\W]+)[\"']$", r"\1"), (r"^['_,\-:;]", ""), (r"['_,\-:+]$", ""), (r"^\.\S+$", "")]


def _clean_once(text: str) -> str:
    text = urllib.parse.unquote_plus(str(text)).strip().lower()
    for pat, rep in _EARLY:
        text = re.sub(pat, rep, text)
    if len(re.findall(r"[-_]", text)) > 3:  # this-is-a-slug / this_is_a_slug
        text = re.sub(r"[-_]", " ", text)
    text = html.unescape(html.unescape(text)).strip()
    for pat, rep in _LATE:
        text = re.sub(pat, rep, text)
    text = text.strip()
    for pat, rep in _ENDS:
        text = re.sub(pat, rep, text)
    return text.strip()


def clean_caption(text: str) -> str:
    """LlamaGen's caption preprocessing for T5: the caption cleaner applied twice.

    Lower-cases, URL-unquotes, drops URLs, HTML tags, @handles, CJK characters, file names and
    long digit runs, normalises dashes and quotes, replaces stray punctuation by spaces, puts a
    space after ``,``/``.``/``/`` before a word and collapses whitespace. E.g.
    ``"A photo of a Cat,sitting on https://x.com/a"`` -> ``"a photo of a cat, sitting on"``.
    """
    return _clean_once(_clean_once(text))


class T5CaptionEncoder:
    """flan-t5-xl (or any T5 encoder) from a local directory or the local Hugging Face cache.

    ``encode(captions)`` -> (features (B, max_length, d_model) in ``dtype``, mask (B, max_length)
    bool), right-padded as the tokenizer pads; padded features are the encoder's outputs there
    (LlamaGen zeroes them after moving the padding to the front).

    Args:
        repo_or_path: HF repo id (searched in the local cache, never downloaded) or a directory.
        device, dtype: where and in which precision the encoder runs (LlamaGen uses bfloat16 on GPU).
        max_length: tokens per caption (LlamaGen: 120).
        lazy: read the weights on first use, so a run that never encodes captions does not pay.
        clean: apply :func:`clean_caption` (LlamaGen does).

    Raises WeightsNotFoundError naming the repo id when the weights are absent and UsageError
    for an empty caption list.
    """

    def __init__(
        self,
        repo_or_path: str = T5_REPO,
        device="cpu",
        dtype=torch.float32,
        max_length: int = T5_MAX_LENGTH,
        lazy: bool = False,
        clean: bool = True,
    ):
        self.repo, self.device, self.dtype, self.max_length = str(repo_or_path), torch.device(device), dtype, max_length
        self.clean = clean
        self.model = self.tokenizer = None
        if not lazy:
            self._load()

    @property
    def dim(self) -> int:
        """Feature width (d_model; 2048 for flan-t5-xl)."""
        self._load()
        return int(self.model.config.d_model)

    def _load(self) -> None:
        if self.model is not None:
            return
        from transformers import T5EncoderModel

        self.tokenizer = load_tokenizer(self.repo, name="caption encoder")
        self.model = load_pretrained(
            T5EncoderModel, self.repo, device=self.device, dtype=self.dtype, name="caption encoder"
        )

    def tokenize(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions -> (input ids (B, max_length) int64, mask (B, max_length) int64), cleaned,
        with special tokens, truncated and padded to ``max_length``."""
        self._load()
        texts = [clean_caption(c) if self.clean else str(c).lower().strip() for c in captions]
        batch = self.tokenizer(
            texts,
            max_length=self.max_length,
            padding="max_length",
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        )
        return batch["input_ids"], batch["attention_mask"]

    @torch.no_grad()
    def encode(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Captions -> (features (B, max_length, d_model) ``dtype``, mask (B, max_length) bool)."""
        captions = list(captions)
        if not captions:
            raise UsageError("no captions given; pass a non-empty captions file")
        ids, mask = self.tokenize(captions)
        ids, mask = ids.to(self.device), mask.to(self.device)
        feats = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return feats.to(self.dtype), mask.bool()
