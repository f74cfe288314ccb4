"""The Chameleon / Anole / Lumina-mGPT image tokenizer: a taming-transformers VQGAN.

transformers ships only the encoder half of this tokenizer (``ChameleonVQVAE``), so turning
generated tokens into pixels needs the decoder from Meta's released ``vqgan.ckpt`` (with
``vqgan.yaml``). :class:`ChameleonVQGAN` reproduces the released architecture with the official
parameter names, so that checkpoint loads strictly:

* encoder: ``conv_in``; per level ``num_res_blocks`` residual blocks (GroupNorm(32, eps 1e-6),
  swish, 3x3 conv, twice; 1x1 ``nin_shortcut`` when the width changes), a vanilla attention
  block after each when the level's resolution is in ``attn_resolutions``, and a stride-2
  3x3 conv after right/bottom zero padding between levels; ``mid`` = block, attention, block;
  GroupNorm, swish, ``conv_out`` to ``z_channels``;
* ``quant_conv`` (1x1) -> nearest codebook vector by squared Euclidean distance, the codebook
  used *as stored* (no normalisation) -> ``post_quant_conv`` (1x1);
* decoder: ``conv_in``; ``mid``; levels from coarse to fine with ``num_res_blocks + 1`` blocks
  (and attention where configured), nearest x2 upsampling + 3x3 conv between levels; GroupNorm,
  swish, ``conv_out``. Output pixels are in [-1, 1] (not clamped).

Source: Esser et al., "Taming Transformers", CVPR 2021 (VQGAN); Chameleon Team, arXiv
2405.09818, Sec. 2.1 (the 8192-code, 512 px -> 32 x 32 tokenizer); the released
``chameleon/inference/vqgan.py`` for parameter names.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ambiguity.errors import UsageError
from ambiguity.models.checkpoints import load_checkpoint_state, load_strict
from ambiguity.models.vq import AttnBlock, Downsample, ResnetBlock, Upsample, _norm

__all__ = [
    "VQGANConfig",
    "ChameleonVQGAN",
    "vqgan_config_from_official",
    "vqgan_config_from_hf",
    "read_vqgan_config",
    "load_vqgan",
    "vqgan_from_state",
    "TRAINING_ONLY_PREFIXES",
]

# Keys a training checkpoint may carry that are not part of the tokenizer (the GAN loss).
TRAINING_ONLY_PREFIXES = ("loss.",)


@dataclass(frozen=True)
class VQGANConfig:
    """Architecture of a Chameleon VQGAN in the official argument names (``ddconfig`` + codebook).

    The defaults are the released tokenizer: 512 px, ch 128, ch_mult (1, 1, 2, 2, 4) (16x
    downsampling -> 32 x 32 tokens), 2 residual blocks per level, z_channels 256, attention only
    in the middle blocks, 8192 codes of dimension 256.
    """

    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = ()
    in_channels: int = 3
    out_ch: int = 3
    resolution: int = 512
    z_channels: int = 256
    double_z: bool = False
    dropout: float = 0.0
    attn_type: str = "vanilla"
    n_embed: int = 8192
    embed_dim: int = 256

    @property
    def downsample(self) -> int:
        """Pixels per token side: 2 ** (levels - 1)."""
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def grid(self) -> int:
        """Tokens per side at the configured ``resolution``."""
        return self.resolution // self.downsample


def vqgan_config_from_official(params: dict) -> VQGANConfig:
    """``{"ddconfig": {...}, "n_embed": int, "embed_dim": int, ...}`` (``vqgan.yaml``'s
    ``model.params``, or a whole yaml dict with ``model``) -> :class:`VQGANConfig`.

    Raises UsageError when a required entry is absent.
    """
    if "model" in params and isinstance(params["model"], dict):
        params = params["model"].get("params", params["model"])
    try:
        dd = params["ddconfig"]
        kw = dict(
            ch=int(dd["ch"]),
            ch_mult=tuple(int(m) for m in dd["ch_mult"]),
            num_res_blocks=int(dd["num_res_blocks"]),
            attn_resolutions=tuple(int(r) for r in dd.get("attn_resolutions") or ()),
            in_channels=int(dd.get("in_channels", 3)),
            out_ch=int(dd.get("out_ch", 3)),
            resolution=int(dd["resolution"]),
            z_channels=int(dd["z_channels"]),
            double_z=bool(dd.get("double_z", False)),
            dropout=float(dd.get("dropout", 0.0)),
            attn_type=str(dd.get("attn_type", "vanilla")),
            n_embed=int(params["n_embed"]),
            embed_dim=int(params["embed_dim"]),
        )
    except (KeyError, TypeError) as exc:
        raise UsageError(f"VQGAN config lacks {exc}; pass the vqgan.yaml released with vqgan.ckpt") from None
    return VQGANConfig(**kw)


def vqgan_config_from_hf(vq_config) -> VQGANConfig:
    """transformers' ``ChameleonVQVAEConfig`` (object or dict) -> :class:`VQGANConfig`."""
    get = (
        (lambda k, d=None: vq_config.get(k, d))
        if isinstance(vq_config, dict)
        else (lambda k, d=None: getattr(vq_config, k, d))
    )
    return VQGANConfig(
        ch=int(get("base_channels", 128)),
        ch_mult=tuple(get("channel_multiplier", (1, 1, 2, 2, 4))),
        num_res_blocks=int(get("num_res_blocks", 2)),
        attn_resolutions=tuple(get("attn_resolutions") or ()),
        in_channels=int(get("in_channels", 3)),
        out_ch=int(get("out_channels", 3) or 3),
        resolution=int(get("resolution", 512)),
        z_channels=int(get("latent_channels", 256)),
        double_z=bool(get("double_latent", False)),
        dropout=float(get("dropout", 0.0)),
        attn_type=str(get("attn_type", "vanilla") or "none"),
        n_embed=int(get("num_embeddings", 8192)),
        embed_dim=int(get("embed_dim", 256)),
    )


def read_vqgan_config(path: str | Path) -> VQGANConfig:
    """Read ``vqgan.yaml`` (Meta's release) or a JSON file with the same ``ddconfig`` layout."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(
            f"cannot read VQGAN config {path} ({exc.strerror or exc}); pass the vqgan.yaml released with vqgan.ckpt"
        ) from None
    if path.suffix == ".json":
        return vqgan_config_from_official(json.loads(text))
    import yaml

    return vqgan_config_from_official(yaml.safe_load(text))


# --------------------------------------------------------------------------- building blocks
# The taming-transformers blocks (same parameter names as Meta's checkpoint) are LlamaGen's: ambiguity.models.vq.
def _attn(config: VQGANConfig, channels: int) -> nn.Module:
    return AttnBlock(channels) if config.attn_type == "vanilla" else nn.Identity()


class Level(nn.Module):
    """One resolution level: ``block`` (residual blocks), ``attn`` (one per block or none) and an
    optional ``downsample``/``upsample``; the attribute names are the official key names."""

    def __init__(self, blocks: list[nn.Module], attn: list[nn.Module]):
        super().__init__()
        self.block, self.attn = nn.ModuleList(blocks), nn.ModuleList(attn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.block):
            x = block(x)
            if len(self.attn):
                x = self.attn[i](x)
        return x


def _mid(config: VQGANConfig, channels: int) -> nn.Module:
    mid = nn.Module()
    mid.block_1, mid.attn_1, mid.block_2 = (
        ResnetBlock(channels, channels, config.dropout),
        _attn(config, channels),
        ResnetBlock(channels, channels, config.dropout),
    )
    return mid


def _run_mid(mid: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return mid.block_2(mid.attn_1(mid.block_1(x)))


class Encoder(nn.Module):
    """Images (B, in_channels, H, W) in [-1, 1] -> latents (B, z_channels, H/f, W/f), f = config.downsample."""

    def __init__(self, config: VQGANConfig):
        super().__init__()
        self.conv_in = nn.Conv2d(config.in_channels, config.ch, 3, padding=1)
        res, width, levels = config.resolution, config.ch, []
        for i, mult in enumerate(config.ch_mult):
            out = config.ch * mult
            blocks = [ResnetBlock(width if j == 0 else out, out, config.dropout) for j in range(config.num_res_blocks)]
            attn = [_attn(config, out) for _ in blocks] if res in config.attn_resolutions else []
            level = Level(blocks, attn)
            if i != len(config.ch_mult) - 1:
                level.downsample = Downsample(out)
                res //= 2
            levels.append(level)
            width = out
        self.down = nn.ModuleList(levels)
        self.mid = _mid(config, width)
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, 2 * config.z_channels if config.double_z else config.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        h = _run_mid(self.mid, h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    """Latents (B, z_channels, h, w) -> images (B, out_ch, h*f, w*f), roughly in [-1, 1]."""

    def __init__(self, config: VQGANConfig):
        super().__init__()
        n = len(config.ch_mult)
        width = config.ch * config.ch_mult[-1]
        res = config.resolution // config.downsample
        self.conv_in = nn.Conv2d(config.z_channels, width, 3, padding=1)
        self.mid = _mid(config, width)
        levels: list[Optional[Level]] = [None] * n
        for i in reversed(range(n)):
            out = config.ch * config.ch_mult[i]
            blocks = [
                ResnetBlock(width if j == 0 else out, out, config.dropout) for j in range(config.num_res_blocks + 1)
            ]
            attn = [_attn(config, out) for _ in blocks] if res in config.attn_resolutions else []
            level = Level(blocks, attn)
            if i != 0:
                level.upsample = Upsample(out)
                res *= 2
            levels[i] = level
            width = out
        self.up = nn.ModuleList(levels)  # indexed by level, run from the coarsest (last) to the finest
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, config.out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = _run_mid(self.mid, self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Codebook(nn.Module):
    """The VQ codebook ``embedding.weight`` (n_embed, embed_dim), used unnormalised."""

    def __init__(self, n_embed: int, embed_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(n_embed, embed_dim)

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """Latents (B, d, h, w) -> codes (B, h, w) int64: argmin_j ||z - e_j||^2, computed as
        ||z||^2 + ||e_j||^2 - 2 z.e_j (ties -> the lowest index)."""
        B, d, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, d)
        e = self.embedding.weight
        dist = flat.pow(2).sum(1, keepdim=True) + e.pow(2).sum(1) - 2 * flat @ e.t()
        return dist.argmin(1).view(B, h, w)

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, h, w) int64 -> quantised latents (B, d, h, w)."""
        return self.embedding(codes).permute(0, 3, 1, 2).contiguous()


class ChameleonVQGAN(nn.Module):
    """The Chameleon VQGAN (encoder, codebook, decoder) with the official state-dict keys.

    Pixels are (B, 3, H, W) float in [-1, 1]; codes are (B, H/16, W/16) int64 for the released
    config. Works at any H, W divisible by ``config.downsample`` (Lumina-mGPT decodes 48 x 48
    token grids to 768 px with the same weights).
    """

    def __init__(self, config: VQGANConfig = VQGANConfig()):
        super().__init__()
        self.config = config
        self.encoder, self.decoder = Encoder(config), Decoder(config)
        self.quantize = Codebook(config.n_embed, config.embed_dim)
        self.quant_conv = nn.Conv2d(config.z_channels, config.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.z_channels, 1)

    def codebook(self) -> torch.Tensor:
        """Codebook vectors (n_embed, embed_dim) as the quantiser compares them (unnormalised)."""
        return self.quantize.embedding.weight

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) in [-1, 1] -> codes (B, H/f, W/f) int64 (nearest codebook vectors)."""
        return self.quantize.nearest(self.quant_conv(self.encoder(images)))

    def decode(self, quant: torch.Tensor) -> torch.Tensor:
        """Quantised latents (B, embed_dim, h, w) -> images (B, out_ch, h*f, w*f), float, ~[-1, 1]."""
        return self.decoder(self.post_quant_conv(quant))

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes (B, h, w) int64 -> images (B, out_ch, h*f, w*f) in ~[-1, 1] (codebook lookup,
        ``post_quant_conv``, decoder). Raises UsageError for codes outside [0, n_embed)."""
        if codes.dim() != 3:
            raise UsageError(f"codes must be (batch, height, width); got shape {tuple(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.config.n_embed):
            raise UsageError(f"codes must lie in 0..{self.config.n_embed - 1} for this VQGAN")
        return self.decode(self.quantize.lookup(codes.to(self.quant_conv.weight.device)))


def vqgan_from_state(
    state: dict[str, torch.Tensor], config: VQGANConfig, what: str = "VQGAN checkpoint", device="cpu"
) -> ChameleonVQGAN:
    """Build a float32 :class:`ChameleonVQGAN` and load ``state`` strictly (official key names).

    GAN-loss entries (``loss.*``) of a training checkpoint are dropped; any other missing,
    unexpected or mis-shaped key raises a one-line UsageError.
    """
    state = {k: v.float() for k, v in state.items() if not k.startswith(TRAINING_ONLY_PREFIXES)}
    model = ChameleonVQGAN(config)
    load_strict(model, state, what)
    return model.to(device).eval().requires_grad_(False)


def load_vqgan(ckpt: str | Path, config: Optional[VQGANConfig | str | Path] = None, device="cpu") -> ChameleonVQGAN:
    """Load Meta's ``vqgan.ckpt`` (``{"state_dict": ...}``) strictly.

    ``config``: a :class:`VQGANConfig`, a path to ``vqgan.yaml`` / a JSON file with ``ddconfig``,
    or None to read ``vqgan.yaml`` (else ``config.json``) next to the checkpoint.
    Raises UsageError when the file or its config is missing or does not match.
    """
    ckpt = Path(ckpt).expanduser()
    if config is None:
        for name in ("vqgan.yaml", "config.json"):
            if (ckpt.parent / name).is_file():
                config = ckpt.parent / name
                break
        else:
            raise UsageError(f"no vqgan.yaml next to {ckpt}; put the vqgan.yaml released with vqgan.ckpt beside it")
    if not isinstance(config, VQGANConfig):
        config = read_vqgan_config(config)
    return vqgan_from_state(load_checkpoint_state(ckpt), config, ckpt.name, device)


def config_dict(config: VQGANConfig) -> dict:
    """The config as a JSON-able dict (for summaries)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}
