"""The LlamaGen GPT: a Llama-style decoder over VQ image tokens.

Written for this project from the architecture published with LlamaGen (Sun et al., 2024,
"Autoregressive Model Beats Diffusion", arXiv 2406.06525, Sec. 2.2): pre-norm RMSNorm blocks,
SwiGLU feed-forward, fused ``wqkv`` attention, 2D rotary position embedding over the token grid,
and a condition prefix (one class token for ``c2i``, 120 projected caption tokens for ``t2i``).
Parameter names follow the official checkpoints so ``load_state_dict(strict=True)`` accepts them.

Two behaviours of the official model are kept on purpose because checkpoints depend on them:

* the rotary table holds zeros at the condition-prefix positions, so queries and keys of prefix
  tokens are multiplied by zero;
* classifier-free guidance uses the extra "null" class row (``c2i``) or the learned
  ``uncond_embedding`` buffer (``t2i``).

The KV cache is a static buffer in the style of gpt-fast: batched decoding writes each row's
entries in place at its own slots (:meth:`GPT.forward_rows`); :meth:`KVCache.crop` rolls back an
appending cache (the EAGLE drafter layer's) after a rejected speculative draft.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ambiguity.models.kv_ops import move_cache_entries

__all__ = ["GPTConfig", "GPT", "KVCache", "GPT_PRESETS", "gpt_config_from_official"]


def _round_up(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


@dataclass
class GPTConfig:
    """Architecture of a LlamaGen GPT.

    Field names match the official ``ModelArgs`` where they exist, so a dict of official
    arguments can be passed through :func:`gpt_config_from_official`.

    ``rope`` selects ``"2d"`` (LlamaGen: a rotary table over the ``sqrt(block_size)``-square
    grid, zeros at prefix positions) or ``"1d"`` (ordinary 1D rotary positions; used by the
    embedded text twin, whose tokens are a sequence, not a grid).
    """

    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: Optional[int] = None
    multiple_of: int = 256
    ffn_dim_multiplier: Optional[float] = None
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    initializer_range: float = 0.02
    token_dropout_p: float = 0.0
    attn_dropout_p: float = 0.0
    resid_dropout_p: float = 0.0
    ffn_dropout_p: float = 0.0
    num_classes: int = 1000
    caption_dim: int = 2048
    class_dropout_prob: float = 0.1
    model_type: str = "c2i"
    vocab_size: int = 16384
    cls_token_num: int = 1
    block_size: int = 256
    rope: str = "2d"

    def __post_init__(self) -> None:
        if self.model_type not in ("c2i", "t2i"):
            raise ValueError(f"model_type must be 'c2i' or 't2i', got {self.model_type!r}")
        if self.rope not in ("1d", "2d"):
            raise ValueError(f"rope must be '1d' or '2d', got {self.rope!r}")
        if self.dim % self.n_head:
            raise ValueError(f"dim {self.dim} is not divisible by n_head {self.n_head}")
        if self.rope == "2d" and math.isqrt(self.block_size) ** 2 != self.block_size:
            raise ValueError(f"2D RoPE needs a square token grid; block_size {self.block_size} is not a square")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ffn_dim(self) -> int:
        hidden = int(2 * (4 * self.dim) / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return _round_up(hidden, self.multiple_of)

    @property
    def grid_size(self) -> int:
        return math.isqrt(self.block_size)

    @property
    def max_len(self) -> int:
        """Prefix plus all image tokens: the longest sequence the model ever sees."""
        return self.cls_token_num + self.block_size


# (n_layer, n_head, dim) of the official presets (LlamaGen Table 1 / gpt.py).
GPT_PRESETS: dict[str, tuple[int, int, int]] = {
    "GPT-B": (12, 12, 768),
    "GPT-L": (24, 16, 1024),
    "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536),
    "GPT-XXXL": (48, 40, 2560),
    "GPT-1B": (22, 32, 2048),
    "GPT-3B": (24, 32, 3200),
    "GPT-7B": (32, 32, 4096),
}


def gpt_config_from_official(model_args: dict | None = None, preset: str | None = None, **overrides) -> GPTConfig:
    """Build a :class:`GPTConfig` from official ``ModelArgs`` values and/or a preset name.

    Unknown official fields (``max_batch_size``, ``drop_path_rate`` ...) are ignored.
    Raises ``KeyError`` for an unknown preset.
    """
    values: dict = {}
    if preset is not None:
        n_layer, n_head, dim = GPT_PRESETS[preset]
        values.update(n_layer=n_layer, n_head=n_head, dim=dim)
    names = {f.name for f in fields(GPTConfig)}
    for source in (model_args or {}, overrides):
        values.update({k: v for k, v in source.items() if k in names})
    return GPTConfig(**values)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


class FeedForward(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False)
        self.dropout = nn.Dropout(config.ffn_dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


def rope_table(config: GPTConfig, length: int | None = None) -> torch.Tensor:
    """Rotary (cos, sin) table, shape (positions, head_dim // 2, 2), float32.

    ``"2d"``: the first ``cls_token_num`` rows are zeros (official behaviour), then one row per
    grid cell in raster order; half of the rotary pairs encode the row, half the column.
    ``"1d"``: standard rotary positions 0..length-1 for the whole sequence.
    """
    n = config.head_dim
    if config.rope == "1d":
        length = length or config.max_len
        inv = 1.0 / (config.rope_base ** (torch.arange(0, n, 2)[: n // 2].float() / n))
        ang = torch.outer(torch.arange(length).float(), inv)
        return torch.stack([ang.cos(), ang.sin()], dim=-1)
    half = n // 2
    inv = 1.0 / (config.rope_base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    g = config.grid_size
    ang = torch.outer(torch.arange(g).float(), inv)  # (g, half/2)
    grid = torch.cat([ang[:, None, :].expand(g, g, -1), ang[None, :, :].expand(g, g, -1)], dim=-1)
    table = torch.stack([grid.cos(), grid.sin()], dim=-1).flatten(0, 1)  # (g*g, n/2, 2)
    prefix = torch.zeros(config.cls_token_num, n // 2, 2)
    return torch.cat([prefix, table])


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels. x: (R, T, heads, head_dim); table: (T, head_dim//2, 2) shared by the
    rows, or (R, T, head_dim//2, 2) with each row's own positions (batched decoding).

    Pair ``(x0, x1)`` becomes ``(x0 cos - x1 sin, x1 cos + x0 sin)`` (in float32, or the table's
    dtype when wider), written as ``x * [cos, cos] + [x1, x0] * [-sin, sin]`` over whole rows of
    ``head_dim`` channels: the same products and sums, so the same floats as the per-pair form
    (:func:`_apply_rope_pairs`), in fewer and better vectorised tensor ops. A ``torch.compile``-d
    forward traces the per-pair form (its graphs stay as they were).
    """
    if torch.compiler.is_compiling():
        return _apply_rope_pairs(x, table)
    xf = x.float()
    rows = table if table.ndim == 4 else table[None]  # (R | 1, T, head_dim//2, 2)
    cos = rows[..., :1].expand(rows.shape).flatten(-2)[:, :, None]  # (R | 1, T, 1, head_dim): c0 c0 c1 c1 ..
    sin = (rows[..., 1:] * _rope_signs(rows.device, rows.dtype)).flatten(-2)[:, :, None]  # -s0 s0 -s1 s1 ..
    xs = xf.unflatten(-1, (-1, 2))
    swapped = torch.stack([xs[..., 1], xs[..., 0]], dim=-1).flatten(-2)  # x1 x0 x3 x2 ..
    return (xf * cos).add_(swapped * sin).type_as(x)


@functools.lru_cache(maxsize=8)
def _rope_signs(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(2,) ``[-1, 1]``: the signs of sin in the two channels of a rotary pair (negation is exact)."""
    return torch.tensor([-1.0, 1.0], device=device, dtype=dtype)


def _apply_rope_pairs(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rope` pair by pair (the reference form; what compiled forwards trace)."""
    xs = x.float().unflatten(-1, (-1, 2))
    rows = table if table.ndim == 4 else table[None]
    cos = rows[:, :, None, :, 0]
    sin = rows[:, :, None, :, 1]
    out = torch.stack([xs[..., 0] * cos - xs[..., 1] * sin, xs[..., 1] * cos + xs[..., 0] * sin], dim=-1)
    return out.flatten(-2).type_as(x)


class KVCache:
    """Static key/value buffers for every layer (gpt-fast style).

    ``k``/``v``: (n_layer, rows, kv_heads, max_len, head_dim). ``length`` is the number of
    positions already written; :meth:`crop` shortens it (KV rollback after a rejection: the
    stale entries beyond ``length`` are never attended to and are overwritten later).
    ``key_mask``: (rows, max_len) bool, False where a key must never be attended (padded
    caption tokens of the ``t2i`` prefix).
    """

    def __init__(
        self,
        n_layer: int,
        rows: int,
        max_len: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (n_layer, rows, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.key_mask = torch.ones(rows, max_len, dtype=torch.bool, device=device)
        self.has_key_mask = False
        self.length = 0
        self.max_len = max_len

    def set_prefix_mask(self, mask: torch.Tensor) -> None:
        """mask: (rows, P) bool/int, 1 for real prefix tokens, 0 for padding."""
        self.key_mask[:, : mask.shape[1]] = mask.bool()
        self.has_key_mask = not bool(mask.bool().all())

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Per row, copy the entries at cache positions ``src`` (rows, m) int64 to ``dst`` (rows, m),
        every layer (all read first, then written; batched draft trees keep their accepted paths)."""
        move_cache_entries(self.k, src, dst)
        move_cache_entries(self.v, src, dst)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given batch rows (e.g. to drop finished images)."""
        self.k, self.v, self.key_mask = self.k[:, rows], self.v[:, rows], self.key_mask[rows]


def slot_index(layer: int, slots: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, ...]:
    """Index of the cache entries that rows write: (layer, row, head, slot) int64 tensors that
    broadcast to (R, T, kv_heads), for ``KVCache.k.index_put_`` with values (R, T, kv_heads, head_dim).

    One ``index_put_`` on the whole static buffer (not on the per-layer view ``k[layer]``) is what
    lets a ``torch.compile``-d forward update the cache in place: a write into a view of a graph
    input is functionalised into a copy of the whole buffer on every call.
    """
    dev = slots.device
    rows = torch.arange(slots.shape[0], device=dev)[:, None, None]
    return (
        torch.full((1, 1, 1), layer, dtype=torch.long, device=dev),
        rows,
        torch.arange(kv_heads, device=dev),
        slots[:, :, None],
    )


class Attention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wqkv = nn.Linear(config.dim, (config.n_head + 2 * config.kv_heads) * config.head_dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.resid_dropout = nn.Dropout(config.resid_dropout_p)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        layer: int,
        cache: Optional[KVCache],
        mask: Optional[torch.Tensor],
        slots: Optional[torch.Tensor] = None,
        span: Optional[int] = None,
    ) -> torch.Tensor:
        """x (R, T, dim). slots: (R, T) int64 cache positions each row writes its T keys/values to
        (batched decoding, in place); the keys are then the first ``span`` cache positions
        (default ``mask.shape[-1]``) and ``mask`` (R, 1, T, span) bool says which each query sees
        (None with T = 1: all of them, every row writing slot ``span - 1``). Without slots the T
        entries are written at ``cache.length``."""
        config = self.config
        R, T, _ = x.shape
        kv = config.kv_heads * config.head_dim
        q, k, v = self.wqkv(x).split([config.dim, kv, kv], dim=-1)
        q = apply_rope(q.view(R, T, config.n_head, config.head_dim), rope).transpose(1, 2)
        k = apply_rope(k.view(R, T, config.kv_heads, config.head_dim), rope).transpose(1, 2)
        v = v.view(R, T, config.kv_heads, config.head_dim).transpose(1, 2)
        if slots is not None:
            if mask is None and not torch.compiler.is_compiling():  # every row writes slot span - 1: a slice
                cache.k[layer, :, :, span - 1 : span] = k
                cache.v[layer, :, :, span - 1 : span] = v
            else:
                span = mask.shape[-1] if mask is not None else span
                at = slot_index(layer, slots, config.kv_heads)
                cache.k.index_put_(at, k.transpose(1, 2))  # (R, T, kv_heads, head_dim) into each row's slots
                cache.v.index_put_(at, v.transpose(1, 2))
            k = cache.k[layer, :, :, :span]
            v = cache.v[layer, :, :, :span]
        elif cache is not None:
            start = cache.length
            cache.k[layer, :, :, start : start + T] = k
            cache.v[layer, :, :, start : start + T] = v
            k = cache.k[layer, :, :, : start + T]
            v = cache.v[layer, :, :, : start + T]
        if config.kv_heads != config.n_head:
            rep = config.n_head // config.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        drop = config.attn_dropout_p if self.training else 0.0
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, dropout_p=drop)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        return self.resid_dropout(self.wo(out.transpose(1, 2).reshape(R, T, config.dim)))


class TransformerBlock(nn.Module):
    """One pre-norm decoder layer (attention + SwiGLU). Also the drafter's layer (EAGLE)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x, rope, layer=0, cache=None, mask=None, slots=None, span=None):
        h = x + self.attention(self.attention_norm(x), rope, layer, cache, mask, slots, span)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    """Class label -> one prefix token. Row ``num_classes`` is the null class used for CFG."""

    def __init__(self, num_classes: int, dim: int, dropout_prob: float):
        super().__init__()
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), dim)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        if self.training and self.dropout_prob > 0:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
            labels = torch.where(drop, torch.full_like(labels, self.num_classes), labels)
        return self.embedding_table(labels).unsqueeze(1)

    def null(self, n: int, device) -> torch.Tensor:
        return torch.full((n,), self.num_classes, dtype=torch.long, device=device)


class CaptionMLP(nn.Module):
    def __init__(self, in_features: int, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, dim, bias=False)
        self.fc2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """Caption features (R, cls_token_num, caption_dim) -> prefix tokens via a 2-layer MLP.

    ``uncond_embedding`` (a buffer, as in the official checkpoints) is the learned
    unconditional caption used for CFG and caption dropout.
    """

    def __init__(self, caption_dim: int, dim: int, dropout_prob: float, token_num: int):
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(token_num, caption_dim) / caption_dim**0.5)
        self.dropout_prob = dropout_prob

    def forward(self, caption: torch.Tensor) -> torch.Tensor:
        if self.training and self.dropout_prob > 0:
            drop = torch.rand(caption.shape[0], device=caption.device) < self.dropout_prob
            caption = torch.where(drop[:, None, None], self.uncond_embedding.to(caption.dtype), caption)
        return self.cap_proj(caption)

    def null(self, n: int, device) -> torch.Tensor:
        return self.uncond_embedding[None].expand(n, -1, -1).to(device)


class GPT(nn.Module):
    """LlamaGen GPT (``c2i`` or ``t2i``), float32 by default.

    The model is used through four small calls so that the profiler, the decoder and the
    drafter can share it:

    * :meth:`embed_condition` -> prefix embeddings (R, P, dim)
    * :meth:`embed_tokens`    -> token embeddings (R, T, dim)
    * :meth:`forward`         -> last hidden states after the final norm (R, T, dim)
    * :meth:`head`            -> logits (R, T, vocab_size), float32

    ``forward`` without a cache runs causal attention over its input; with a
    :class:`KVCache` it appends the input at ``cache.length`` and attends to everything before.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        if config.model_type == "c2i":
            self.cls_embedding = LabelEmbedder(config.num_classes, config.dim, config.class_dropout_prob)
        else:
            self.cls_embedding = CaptionEmbedder(
                config.caption_dim, config.dim, config.class_dropout_prob, config.cls_token_num
            )
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.tok_dropout = nn.Dropout(config.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.register_buffer("rope", rope_table(config), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, std)
        nn.init.zeros_(self.output.weight)

    # ---------------------------------------------------------------- inputs
    def embed_condition(self, cond: torch.Tensor) -> torch.Tensor:
        """c2i: labels (R,) int64 -> (R, 1, dim); t2i: features (R, P, caption_dim) -> (R, P, dim)."""
        return self.cls_embedding(cond)[:, : self.config.cls_token_num]

    def null_condition(self, n: int, device=None) -> torch.Tensor:
        """The unconditional input for classifier-free guidance, batch of n."""
        return self.cls_embedding.null(n, device or self.tok_embeddings.weight.device)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (R, T) int64 -> (R, T, dim)."""
        return self.tok_embeddings(tokens)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Post-norm hidden (..., dim) -> float32 logits (..., vocab_size) (float64 for a float64 model)."""
        out = self.output(hidden)
        return out if out.dtype == torch.float64 else out.float()

    # ---------------------------------------------------------------- cache
    def new_cache(self, rows: int, max_len: int | None = None, dtype=None, device=None) -> KVCache:
        w = self.tok_embeddings.weight
        return KVCache(
            self.config.n_layer,
            rows,
            max_len or self.config.max_len,
            self.config.kv_heads,
            self.config.head_dim,
            dtype or w.dtype,
            device or w.device,
        )

    def rope_at(self, start: int, length: int) -> torch.Tensor:
        if start + length > self.rope.shape[0]:
            if self.config.rope == "1d":
                self.rope = rope_table(self.config, start + length).to(self.rope.device)
            else:
                raise ValueError(
                    f"position {start + length} is past the {self.config.grid_size}x"
                    f"{self.config.grid_size} token grid (max {self.rope.shape[0]})"
                )
        return self.rope[start : start + length]

    @staticmethod
    def attention_mask(
        T: int, start: int, cache: Optional[KVCache], attend: Optional[torch.Tensor] = None
    ) -> Optional[torch.Tensor]:
        """Bool mask (R|1, 1, T, start+T) or None when plain causal attention suffices.

        ``attend``: (T, start+T) bool, which cache positions each new token sees (a draft tree's
        ancestry); default causal. Padded prefix keys (``cache.key_mask``) are never seen.
        """
        if cache is None or (attend is None and T == 1 and not cache.has_key_mask):
            return None
        total = start + T
        q = torch.arange(start, total, device=cache.k.device)[:, None]
        kpos = torch.arange(total, device=cache.k.device)[None, :]
        allowed = (kpos <= q) if attend is None else attend.to(cache.k.device, torch.bool)  # (T, total)
        if not cache.has_key_mask:
            return allowed[None, None]
        allowed = allowed[None] & cache.key_mask[:, None, :total]
        allowed |= (kpos == q)[None]  # a padded prefix token still attends to itself (official)
        return allowed[:, None]

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        h: torch.Tensor,
        cache: Optional[KVCache] = None,
        start: int | None = None,
        positions: Optional[torch.Tensor] = None,
        attend: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Run the blocks over input embeddings h (R, T, dim) -> hidden after final norm (R, T, dim).

        The new entries are written at cache positions ``start .. start+T-1`` (default:
        ``cache.length``, or 0 without a cache) and ``cache.length`` advances to ``start + T``.
        positions: (T,) int64 rows of the rotary table (default ``start .. start+T-1``): tree
        nodes take the position of their depth. attend: (T, start+T) bool attention over the
        cache and the new tokens (default causal): tree nodes see only their ancestors.
        """
        R, T, _ = h.shape
        if start is None:
            start = cache.length if cache is not None else 0
        if cache is not None and start + T > cache.max_len:
            raise ValueError(f"KV cache holds {cache.max_len} positions; cannot write {start}..{start + T}")
        if cache is not None and start != cache.length:
            cache.crop(start)
        if positions is None:
            rope = self.rope_at(start, T)
        else:
            self.rope_at(int(positions.max()), 1)  # extends a 1D table / checks the 2D grid
            rope = self.rope[positions.to(self.rope.device)]
        mask = self.attention_mask(T, start, cache, attend)
        h = self.tok_dropout(h)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, i, cache, mask)
        if cache is not None:
            cache.length = start + T
        return self.norm(h)

    def forward_rows(
        self,
        h: torch.Tensor,
        cache: KVCache,
        slots: torch.Tensor,
        rope_rows: torch.Tensor,
        mask: Optional[torch.Tensor],
        span: Optional[int] = None,
    ) -> torch.Tensor:
        """Batched decoding: every row appends T tokens at its own cache positions, in place.

        h: (R, T, dim) input embeddings; slots: (R, T) int64 cache positions written (prefix
        included); rope_rows: (R, T) int64 rows of the rotary table (the tokens' positions);
        mask: (R, 1, T, span) bool, the cache positions ``0..span-1`` each token sees (the
        caller hides other rows' unused and stale slots), or None with T = 1 and ``span``: every
        row's token sees the cache positions ``0..span-1`` (rows at one position: no mask to build
        or apply). ``cache.length`` is not used: each row's length lives in the caller. Returns
        hidden states after the final norm (R, T, dim).
        """
        rope = self.rope[rope_rows]
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, i, cache, mask, slots, span)
        return self.norm(h)

    def teacher_forced_logits(self, cond: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (R, N, vocab) where position t predicts tokens[:, t] from cond and tokens[:, :t].

        One causal forward over prefix + tokens[:, :-1], no cache (the training-time view).
        """
        h = torch.cat([self.embed_condition(cond), self.embed_tokens(tokens[:, :-1])], dim=1)
        hidden = self.forward(h)
        return self.head(hidden[:, self.config.cls_token_num - 1 :])
