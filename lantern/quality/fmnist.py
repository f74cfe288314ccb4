"""The domain feature extractor of the embedded model: a small Fashion-MNIST classifier.

ImageNet networks (Inception, MobileNetV2) see a 32 x 32 grey Fashion-MNIST item as an
up-sampled blob far from their training data, so their features are a weak judge of this
domain. :class:`FashionNet` is trained by this project (``scripts/train_fmnist_classifier.py``,
fixed seed) on the 60k Fashion-MNIST training images in the embedded model's own format
(1 x 32 x 32, 28 x 28 padded by 2 px, pixels in [0, 1]) and shipped in
``lantern/weights/fmnist_classifier.safetensors`` with its test accuracy in
``lantern/weights/fmnist_classifier_metrics.json``. Its penultimate layer (``feature_dim``
post-ReLU activations) is the feature space of the ``fmnist`` metrics (``fid_fmnist``, ...),
in the spirit of the domain classifiers used for MNIST-like FIDs.

Architecture: three stages of two 3 x 3 conv + BatchNorm + ReLU blocks (``widths`` channels),
2 x 2 max-pooling between stages, global average pooling, Linear -> ReLU (the features), Linear
-> 10 logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ambiguity.models.checkpoints import load_module

__all__ = ["FashionNetConfig", "FashionNet", "WEIGHTS_FILE", "METRICS_FILE", "load_fashion_net"]

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
WEIGHTS_FILE = WEIGHTS_DIR / "fmnist_classifier.safetensors"
METRICS_FILE = WEIGHTS_DIR / "fmnist_classifier_metrics.json"


@dataclass
class FashionNetConfig:
    """Sizes of :class:`FashionNet` (defaults: the shipped network)."""

    in_channels: int = 1
    widths: list = field(default_factory=lambda: [16, 32, 64])
    feature_dim: int = 128
    num_classes: int = 10


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class FashionNet(nn.Module):
    """Small CNN classifier; ``features(x)`` -> (N, feature_dim), ``forward(x)`` -> (N, num_classes) logits.

    x: (N, in_channels, H, W) float in [0, 1] (H, W divisible by 4; 32 x 32 for the shipped weights).
    """

    def __init__(self, config: FashionNetConfig):
        super().__init__()
        self.config = config
        layers, cin = [], config.in_channels
        for s, w in enumerate(config.widths):
            if s:
                layers.append(nn.MaxPool2d(2))
            layers += [_block(cin, w), _block(w, w)]
            cin = w
        self.trunk = nn.Sequential(*layers)
        self.embed = nn.Linear(cin, config.feature_dim)
        self.head = nn.Linear(config.feature_dim, config.num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) float in [0, 1] -> (N, feature_dim) float, post-ReLU penultimate activations."""
        h = self.trunk(x * 2.0 - 1.0).mean(dim=(2, 3))
        return torch.relu(self.embed(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def load_fashion_net(path: str | Path | None = None, device="cpu") -> tuple[FashionNet, dict]:
    """The shipped (or ``path``) classifier in eval mode, float32, and its file metadata.

    Raises UsageError for a missing or foreign file (the message names the training script).
    """
    return load_module(
        path or WEIGHTS_FILE,
        FashionNet,
        FashionNetConfig,
        device=device,
        fix="re-create it with `python scripts/train_fmnist_classifier.py`",
    )
