"""The LlamaGen VQ image tokenizer (a VQGAN-style convolutional autoencoder).

Written for this project from the published LlamaGen tokenizer design (Sun et al., 2024,
arXiv 2406.06525, Sec. 2.1): a convolutional encoder with GroupNorm/Swish residual blocks and
self-attention at the lowest resolution, an l2-normalised codebook (nearest code by Euclidean
distance between normalised vectors, i.e. by cosine similarity), and a mirrored decoder.
Parameter names follow the official ``vq_ds16_*.pt`` checkpoints.

Images are float tensors in [-1, 1] (the official convention); the model adapters convert
from and to [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["VQConfig", "VQModel", "vq_config_from_official"]


@dataclass
class VQConfig:
    """Tokenizer architecture. ``ch`` is the base width (the official class fixes it at 128).

    The spatial downsampling factor is ``2 ** (len(encoder_ch_mult) - 1)``.
    """

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    encoder_ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    decoder_ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    z_channels: int = 256
    ch: int = 128
    num_res_blocks: int = 2
    in_channels: int = 3
    dropout_p: float = 0.0
    commit_loss_beta: float = 0.25
    usage_buffer: int = 65536  # length of the official ``codebook_used`` buffer

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.encoder_ch_mult) - 1)


def vq_config_from_official(model_args: dict | None = None, **overrides) -> VQConfig:
    """Build a :class:`VQConfig` from official ``ModelArgs`` values; unknown keys are ignored."""
    names = {f.name for f in fields(VQConfig)}
    values = {k: v for k, v in {**(model_args or {}), **overrides}.items() if k in names}
    return VQConfig(**values)


def _norm(c: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, c, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, dropout: float):
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.dropout = nn.Dropout(dropout)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        if hasattr(self, "nin_shortcut"):
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with 1x1 convolutions for q, k, v and output."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = _norm(c)
        self.q, self.k, self.v = (nn.Conv2d(c, c, 1) for _ in range(3))
        self.proj_out = nn.Conv2d(c, c, 1)

    def forward(self, x):
        h = self.norm(x)
        B, C, H, W = x.shape
        q, k, v = (m(h).flatten(2).transpose(1, 2) for m in (self.q, self.k, self.v))  # (B, HW, C)
        attn = torch.softmax(q @ k.transpose(1, 2) * C**-0.5, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(B, C, H, W)
        return x + self.proj_out(out)


class Downsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2, padding=0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Level(nn.Module):
    """One resolution level: ``res`` blocks, ``attn`` blocks (lowest resolution only), resampler."""


class Encoder(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        ch, mult = config.ch, config.encoder_ch_mult
        self.conv_in = nn.Conv2d(config.in_channels, ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList()
        cin = ch
        for i, m in enumerate(mult):
            level, cout, last = _Level(), ch * m, i == len(mult) - 1
            level.res = nn.ModuleList()
            level.attn = nn.ModuleList()
            for _ in range(config.num_res_blocks):
                level.res.append(ResnetBlock(cin, cout, config.dropout_p))
                cin = cout
                if last:
                    level.attn.append(AttnBlock(cin))
            if not last:
                level.downsample = Downsample(cin)
            self.conv_blocks.append(level)
        self.mid = nn.ModuleList(
            [ResnetBlock(cin, cin, config.dropout_p), AttnBlock(cin), ResnetBlock(cin, cin, config.dropout_p)]
        )
        self.norm_out = _norm(cin)
        self.conv_out = nn.Conv2d(cin, config.z_channels, 3, padding=1)

    def forward(self, x):
        h = self.conv_in(x)
        for level in self.conv_blocks:
            h = _level_blocks(level, h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(F.silu(self.norm_out(h)))


def _level_blocks(level: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """A resolution level's residual blocks on h (N, C, H, W), each followed by its attention
    block when the level has them; the level's down- or upsampling is the caller's."""
    for i, block in enumerate(level.res):
        h = block(h)
        if len(level.attn):
            h = level.attn[i](h)
    return h


class Decoder(nn.Module):
    def __init__(self, config: VQConfig):
        super().__init__()
        ch, mult = config.ch, config.decoder_ch_mult
        cin = ch * mult[-1]
        self.conv_in = nn.Conv2d(config.z_channels, cin, 3, padding=1)
        self.mid = nn.ModuleList(
            [ResnetBlock(cin, cin, config.dropout_p), AttnBlock(cin), ResnetBlock(cin, cin, config.dropout_p)]
        )
        self.conv_blocks = nn.ModuleList()
        for i in reversed(range(len(mult))):
            level, cout, first = _Level(), ch * mult[i], i == len(mult) - 1
            level.res = nn.ModuleList()
            level.attn = nn.ModuleList()
            for _ in range(config.num_res_blocks + 1):
                level.res.append(ResnetBlock(cin, cout, config.dropout_p))
                cin = cout
                if first:
                    level.attn.append(AttnBlock(cin))
            if i != 0:
                level.upsample = Upsample(cin)
            self.conv_blocks.append(level)
        self.norm_out = _norm(cin)
        self.conv_out = nn.Conv2d(cin, config.in_channels, 3, padding=1)

    def forward(self, z):
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            h = _level_blocks(level, h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    """Nearest-code quantiser. With ``l2_norm`` both latents and codes are unit-normalised first."""

    def __init__(self, config: VQConfig):
        super().__init__()
        self.l2_norm = config.codebook_l2_norm
        self.beta = config.commit_loss_beta
        self.embedding = nn.Embedding(config.codebook_size, config.codebook_embed_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / config.codebook_size, 1.0 / config.codebook_size)
        if self.l2_norm:
            with torch.no_grad():
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, dim=-1))
        self.register_buffer("codebook_used", torch.zeros(config.usage_buffer))

    def codebook(self) -> torch.Tensor:
        """The vectors the decoder sees, (codebook_size, embed_dim): normalised when l2_norm."""
        w = self.embedding.weight
        return F.normalize(w, dim=-1) if self.l2_norm else w

    def indices(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, d, h, w) -> code indices (B, h, w) int64."""
        zf = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        if self.l2_norm:
            zf = F.normalize(zf, dim=-1)
        e = self.codebook()
        e2 = e.pow(2).sum(1)
        rows = max(1, 2**20 // e.shape[0])  # cache-sized distance blocks (16384 codes: 64 rows); same result
        codes = [(c.pow(2).sum(1, keepdim=True) + e2 - 2 * c @ e.t()).argmin(1) for c in zf.split(rows)]
        return torch.cat(codes).view(z.shape[0], z.shape[2], z.shape[3])

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, h, w) -> latents (B, d, h, w)."""
        return self.codebook()[codes].permute(0, 3, 1, 2).contiguous()

    def forward(self, z: torch.Tensor):
        """Quantise with a straight-through gradient; returns (z_q, codes, codebook_loss, commit_loss)."""
        codes = self.indices(z)
        zq = self.lookup(codes)
        zn = F.normalize(z, dim=1) if self.l2_norm else z
        codebook_loss = F.mse_loss(zq, zn.detach())
        commit_loss = self.beta * F.mse_loss(zn, zq.detach())
        return zn + (zq - zn).detach(), codes, codebook_loss, commit_loss


class VQModel(nn.Module):
    """Encoder -> ``quant_conv`` -> quantiser -> ``post_quant_conv`` -> decoder."""

    def __init__(self, config: VQConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    def encode_latent(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) in [-1, 1] -> pre-quantisation latents (B, d, H/f, W/f)."""
        return self.quant_conv(self.encoder(x))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) in [-1, 1] -> code indices (B, H/f, W/f) int64."""
        return self.quantize.indices(self.encode_latent(x))

    def decode_latent(self, zq: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(zq))

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Code indices (B, h, w) int64 -> images (B, C, h*f, w*f) in about [-1, 1]."""
        return self.decode_latent(self.quantize.lookup(codes))

    def forward(self, x: torch.Tensor):
        """Training pass: returns (reconstruction, codes, codebook_loss, commit_loss)."""
        zq, codes, cb, commit = self.quantize(self.encode_latent(x))
        return self.decode_latent(zq), codes, cb, commit
