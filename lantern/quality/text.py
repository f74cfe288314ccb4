"""Text-image agreement: CLIP score and HPS v2.1, per image.

* **CLIP score** (Hessel et al. 2021; LANTERN, Jang et al. 2025, Table 2): the cosine similarity
  of the CLIP image and text embeddings of each (image, prompt) pair. LANTERN reports the raw
  cosine (e.g. 0.32); torchmetrics' ``CLIPScore`` reports ``100 * max(cos, 0)`` (e.g. 32). The
  scale is chosen with ``scale="cosine"`` (default) or ``"x100"`` and recorded in every result as
  ``clip_scale``. Images go through the ``clip`` extractor's rule
  (:func:`lantern.quality.features.prepare`); prompts are truncated to the text tower's length.
* **HPS v2.1** (Wu et al. 2023, "Human Preference Score v2"): an OpenCLIP ViT-H/14 fine-tuned on
  human preferences; the score is the cosine of image and text embeddings (the hpsv2 package's
  convention). Needs ``open_clip`` (``pip install open-clip-torch``) and the file
  ``HPS_v2.1_compressed.pt`` (Hugging Face ``xswu/HPSv2``); without them :func:`hps_scores`
  returns None and a note that says what to install, and the evaluation goes on.

For class-conditional runs the prompt of an image is ``template.format(class name)`` (default
``"a photo of a {}"``), with class names from the run's model (Fashion-MNIST names for the
embedded model); for text-to-image runs it is the caption the image was generated from (the
generator's caption rule: longest MS-COCO caption per image, seeded subset).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from ambiguity.errors import UsageError
from ambiguity.models.hub import find_weight
from lantern.quality.features import CLIP_MEAN, CLIP_STD, Extractor, prepare

__all__ = [
    "CLIP_SCALES",
    "prompts_for",
    "clip_text_embeddings",
    "clip_scores",
    "find_hps_weights",
    "hps_scores",
    "HPS_REPO",
    "HPS_FILE",
]

CLIP_SCALES = ("cosine", "x100")
HPS_REPO, HPS_FILE = "xswu/HPSv2", "HPS_v2.1_compressed.pt"


def prompts_for(
    conditions: Optional[Sequence],
    class_names: Optional[Sequence[str]],
    template: str = "a photo of a {}",
    labels: Optional[bool] = None,
) -> Optional[list[str]]:
    """One prompt per image: captions as they are, class labels through ``template`` and
    ``class_names``; None when the conditions are unknown or a label has no name.

    labels: True when the conditions are class labels (a class-conditional run, a data set),
    False when they are captions (a text-to-image run: a caption made of digits, e.g. "1984",
    stays a caption), None to tell each condition by its form (an integer, or a string of digits,
    is a label)."""
    if conditions is None:
        return None
    out = []
    for c in conditions:
        s = str(c)
        label = s.lstrip("-").isdigit() if labels is None else labels
        if label:
            if not class_names or not s.lstrip("-").isdigit() or not 0 <= int(s) < len(class_names):
                return None
            out.append(template.format(class_names[int(s)]))
        else:
            out.append(s)
    return out


@torch.no_grad()
def clip_text_embeddings(model, tokenizer, prompts: Sequence[str], device="cpu", batch_size: int = 64) -> torch.Tensor:
    """(P,) prompts -> (P, projection_dim) unit-norm float32 text embeddings."""
    limit = int(getattr(model.config.text_config, "max_position_embeddings", 77))
    out = []
    for s in range(0, len(prompts), batch_size):
        tok = tokenizer(
            list(prompts[s : s + batch_size]), padding=True, truncation=True, max_length=limit, return_tensors="pt"
        )
        e = model.get_text_features(
            input_ids=tok["input_ids"].to(device), attention_mask=tok["attention_mask"].to(device)
        )
        out.append(F.normalize(getattr(e, "pooler_output", e).float(), dim=-1).cpu())
    return torch.cat(out)


@torch.no_grad()
def clip_scores(
    images: torch.Tensor,
    prompts: Sequence[str],
    model_dir: str | Path,
    device="cpu",
    scale: str = "cosine",
    batch_size: int = 64,
) -> np.ndarray:
    """Per-image CLIP score of images (N, C, H, W) float in [0, 1] against ``prompts`` (N,).

    model_dir: a transformers CLIP checkpoint directory (config, weights, tokenizer files).
    scale: ``"cosine"`` (raw cosine in [-1, 1], as LANTERN reports) or ``"x100"`` (torchmetrics:
    100 * max(cos, 0)). Returns (N,) float64. Raises UsageError for an unknown scale or a prompt
    count that differs from the image count.
    """
    from transformers import AutoTokenizer, CLIPModel

    if scale not in CLIP_SCALES:
        raise UsageError(f"--clip-scale must be one of {', '.join(CLIP_SCALES)}, got {scale!r}")
    if len(prompts) != len(images):
        raise UsageError(f"CLIP score needs one prompt per image: {len(prompts)} prompts for {len(images)} images")
    model = CLIPModel.from_pretrained(model_dir).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    size = int(model.config.vision_config.image_size)
    ex = Extractor("clip", int(model.config.projection_dim), size, 3, "bicubic", lambda x: x, CLIP_MEAN, CLIP_STD)
    unique = list(dict.fromkeys(prompts))
    text = clip_text_embeddings(model, tokenizer, unique, device)
    row = {p: i for i, p in enumerate(unique)}
    out = []
    for s in range(0, len(images), batch_size):
        x = prepare(images[s : s + batch_size].to(device), ex)
        e = model.get_image_features(pixel_values=x)
        e = F.normalize(getattr(e, "pooler_output", e).float(), dim=-1).cpu()
        t = text[[row[p] for p in prompts[s : s + batch_size]]]
        out.append((e * t).sum(-1))
    cos = torch.cat(out).double().numpy()
    return cos if scale == "cosine" else 100.0 * np.clip(cos, 0, None)


def find_hps_weights(path: Optional[str] = None) -> Optional[Path]:
    """``HPS_v2.1_compressed.pt`` from ``path`` (file or directory) or the local HF cache of xswu/HPSv2."""
    return find_weight(HPS_FILE, HPS_REPO, path)


@torch.no_grad()
def hps_scores(
    images: torch.Tensor, prompts: Sequence[str], weights: Optional[str] = None, device="cpu", batch_size: int = 16
) -> tuple[Optional[np.ndarray], str]:
    """Per-image HPS v2.1 -> (scores (N,) float64 or None, a note saying what was used or why not).

    Images are resized (bicubic, antialias) to 224 x 224 and normalised with OpenCLIP's mean/std,
    as the hpsv2 package's preprocessing does after its centre crop.
    """
    if importlib.util.find_spec("open_clip") is None:
        return None, "HPS v2.1 skipped: open_clip is not installed (pip install open-clip-torch)"
    f = find_hps_weights(weights)
    if f is None:
        return None, (
            f"HPS v2.1 skipped: {HPS_FILE} not found; `hf download {HPS_REPO} {HPS_FILE}` or pass --weights hps=FILE"
        )
    import open_clip

    model, _, _ = open_clip.create_model_and_transforms("ViT-H-14", pretrained=None, device=device)
    state = torch.load(f, map_location="cpu", weights_only=False)
    model.load_state_dict(state.get("state_dict", state))
    model.eval()
    tokenizer = open_clip.get_tokenizer("ViT-H-14")
    ex = Extractor("hps", 1024, 224, 3, "bicubic", lambda x: x, CLIP_MEAN, CLIP_STD)  # OpenCLIP's OpenAI mean/std
    out = []
    for s in range(0, len(images), batch_size):
        x = prepare(images[s : s + batch_size].to(device), ex)
        img = F.normalize(model.encode_image(x).float(), dim=-1)
        txt = F.normalize(model.encode_text(tokenizer(list(prompts[s : s + batch_size])).to(device)).float(), dim=-1)
        out.append((img * txt).sum(-1).cpu())
    return torch.cat(out).double().numpy(), f"HPS v2.1 from {f}"
