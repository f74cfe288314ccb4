"""The FID Inception-v3 (Szegedy et al. 2016, "Rethinking the Inception Architecture", Fig. 5-7)
as the TensorFlow FID graph computes it, with the parameter names of pytorch-fid's port.

Two weight files are accepted by the ``inception`` extractor (:mod:`lantern.quality.features`):

* clean-fid's / StyleGAN2-ADA's TorchScript ``inception-2015-12-05.pt`` (loaded with
  ``torch.jit.load``; it holds its own graph);
* pytorch-fid's state dict ``pt_inception-2015-12-05-6726825d.pth``, loaded strictly into
  :class:`FIDInceptionV3` below (written here: torchvision is not a dependency).

The FID variant differs from ImageNet Inception-v3 in its pooling (Heusel et al.'s TF graph):
average pools in the A, C and first E blocks exclude padding from the mean, and the last E
block max-pools its pool branch. Input: (N, 3, 299, 299) in [0, 1], scaled to [-1, 1] inside;
output of :meth:`FIDInceptionV3.pool3`: (N, 2048), the global average pool before the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FIDInceptionV3", "PYTORCH_FID_FILE"]

PYTORCH_FID_FILE = "pt_inception-2015-12-05-6726825d.pth"


class BasicConv2d(nn.Module):
    """Conv (no bias) -> BatchNorm (eps 0.001) -> ReLU."""

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def _avg(x):
    return F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, 1)
        self.branch5x5_1, self.branch5x5_2 = BasicConv2d(cin, 48, 1), BasicConv2d(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, padding=1)
        self.branch_pool = BasicConv2d(cin, pool, 1)

    def forward(self, x):
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([self.branch1x1(x), self.branch5x5_2(self.branch5x5_1(x)), b3, self.branch_pool(_avg(x))], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, 3, stride=2)

    def forward(self, x):
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([self.branch3x3(x), b3, F.max_pool2d(x, 3, 2)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, 1)
        self.branch7x7_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7_2 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(cin, c7, 1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, (1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x):
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        d = x
        for i in range(1, 6):
            d = getattr(self, f"branch7x7dbl_{i}")(d)
        return torch.cat([self.branch1x1(x), b7, d, self.branch_pool(_avg(x))], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3_1, self.branch3x3_2 = BasicConv2d(cin, 192, 1), BasicConv2d(192, 320, 3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(cin, 192, 1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, 3, stride=2)

    def forward(self, x):
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        return torch.cat([self.branch3x3_2(self.branch3x3_1(x)), b7, F.max_pool2d(x, 3, 2)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int, max_pool: bool):
        super().__init__()
        self.max_pool = max_pool
        self.branch1x1 = BasicConv2d(cin, 320, 1)
        self.branch3x3_1 = BasicConv2d(cin, 384, 1)
        self.branch3x3_2a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(cin, 448, 1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(cin, 192, 1)

    def forward(self, x):
        a = self.branch3x3_1(x)
        d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        pool = F.max_pool2d(x, 3, 1, 1) if self.max_pool else _avg(x)
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch3x3_2a(a),
                self.branch3x3_2b(a),
                self.branch3x3dbl_3a(d),
                self.branch3x3dbl_3b(d),
                self.branch_pool(pool),
            ],
            1,
        )


class FIDInceptionV3(nn.Module):
    """The FID network (module docstring); parameter names as pytorch-fid's state dict (1008 logits)."""

    def __init__(self):
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, 3)
        self.Mixed_5b, self.Mixed_5c, self.Mixed_5d = InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b, self.Mixed_6c = InceptionC(768, 128), InceptionC(768, 160)
        self.Mixed_6d, self.Mixed_6e = InceptionC(768, 160), InceptionC(768, 192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b, self.Mixed_7c = InceptionE(1280, max_pool=False), InceptionE(2048, max_pool=True)
        self.fc = nn.Linear(2048, 1008)

    def pool3(self, x: torch.Tensor) -> torch.Tensor:
        """(N, 3, 299, 299) in [0, 1] -> (N, 2048) pool3 features."""
        x = x * 2 - 1
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(F.max_pool2d(x, 3, 2)))
        x = F.max_pool2d(x, 3, 2)
        for name in ("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e", "7a", "7b", "7c"):
            x = getattr(self, f"Mixed_{name}")(x)
        return x.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool3(x))
