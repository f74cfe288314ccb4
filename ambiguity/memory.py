"""Up-front memory estimates: refuse a size that cannot fit before any work starts.

A command given ``--num-images 1000000000000`` or a batch whose key/value cache needs a terabyte
should say so at once, naming the option and the largest value that fits, instead of running
out of memory minutes later (or being killed by the kernel without a word). The estimates are
deliberately rough (within a factor of about two) and only refuse sizes that clearly do not fit
in the memory available now.

* :func:`available_bytes` — free memory of the CPU (``MemAvailable``) or a CUDA device;
* :func:`check_count` — ``count`` units of ``unit_bytes`` each must fit: else a UsageError naming
  the flag, the need, what is available and the largest count that fits;
* :func:`kv_bytes_per_token` — key/value cache bytes per row and token of a model (None when the
  model does not say), for the batch checks of :func:`check_batch`;
* :func:`check_run_size` — a run's per-token records and one batch (``--num-images``, ``--batch-size``);
* :func:`checkpoint_bytes` / :func:`check_weights_fit` — a model's weights at the dtype they will
  be loaded in (safetensors headers read without the data), refused before loading.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import torch

from ambiguity.errors import UsageError

__all__ = [
    "available_bytes",
    "format_bytes",
    "check_count",
    "kv_bytes_per_token",
    "check_batch",
    "check_run_size",
    "checkpoint_bytes",
    "check_weights_fit",
    "SHARE",
    "RECORD_BYTES",
    "PREFIX_ROOM",
]

SHARE = 0.8  # the share of the available memory a run may plan to fill
RECORD_BYTES = 128  # one row of a per-token table in memory (numbers and a condition string)
PREFIX_ROOM = 128  # condition positions before the image tokens (LlamaGen t2i: 120)


def available_bytes(device: torch.device | str | None = None) -> int:
    """Memory available for new allocations on ``device`` (bytes): a CUDA device's free memory, or
    the operating system's ``MemAvailable`` (physical pages when that is unknown)."""
    device = torch.device(device or "cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 2**62  # unknown: never refuse


def format_bytes(n: float) -> str:
    """``1.5 GiB``-style text for a byte count."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover


def check_count(
    count: int, unit_bytes: float, flag: str, what: str, fix: str = "", device: torch.device | str | None = None
) -> None:
    """Raise UsageError unless ``count`` units of about ``unit_bytes`` each fit in the memory of ``device``.

    flag: the option that sets ``count`` (e.g. ``--num-images``); what: what the memory holds
    (e.g. ``"the token table (64 rows an image)"``); fix: an extra remedy appended to the message.
    """
    need = float(count) * float(unit_bytes)
    have = available_bytes(device)
    if need <= SHARE * have:
        return
    most = int(SHARE * have // max(unit_bytes, 1))
    where = "" if torch.device(device or "cpu").type == "cpu" else f" on {device}"
    raise UsageError(
        f"{flag} {count} needs about {format_bytes(need)} for {what}, more than the "
        f"{format_bytes(have)} of memory available{where}; use {flag} {max(most, 1)} or less"
        + (f", {fix}" if fix else "")
    )


def kv_bytes_per_token(model) -> Optional[int]:
    """Key/value cache bytes per row and token of ``model`` (2 x layers x kv heads x head dim x
    element size), from its GPT or Hugging Face config; None when it has neither."""
    size = torch.finfo(model.dtype).bits // 8 if getattr(model, "dtype", None) is not None else 4
    gpt = getattr(model, "gpt", None)
    cfg = getattr(gpt, "config", None)
    if cfg is not None and hasattr(cfg, "n_layer"):
        return 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * size
    hf = getattr(getattr(model, "model", None), "config", None)
    hf = getattr(hf, "text_config", None) or hf
    if hf is not None and getattr(hf, "num_hidden_layers", None) and getattr(hf, "hidden_size", None):
        heads = getattr(hf, "num_attention_heads", 1) or 1
        kv = getattr(hf, "num_key_value_heads", None) or heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        return 2 * hf.num_hidden_layers * kv * head_dim * size
    return None


def check_batch(
    model, batch: int, tokens: int, flag: str, rows_per_item: int = 1, device: torch.device | str | None = None
) -> None:
    """Raise UsageError unless a batch of ``batch`` sequences of ``tokens`` positions fits: its
    key/value cache and a few (V,) float32 buffers of distributions per row. ``rows_per_item``: 2
    when guidance doubles the rows; ``flag`` names the option that sets the batch (e.g. ``--batch-size``)."""
    kv = kv_bytes_per_token(model)
    per_row = (kv or 0) * tokens + 8 * 4 * int(getattr(model, "vocab_size", 0) or 0)
    if per_row:
        check_count(
            batch,
            per_row * rows_per_item,
            flag,
            f"the key/value cache and distributions of a batch ({format_bytes(per_row * rows_per_item)} a sequence)",
            device=device if device is not None else getattr(model, "device", None),
        )


def check_run_size(
    model,
    num_images: int,
    batch_size: Optional[int] = None,
    guided: bool = False,
    flag: str = "--num-images",
    batch_flag: str = "--batch-size",
) -> None:
    """Refuse (UsageError) a run of ``num_images`` images whose per-token records, or a batch of
    ``batch_size`` of them (with guidance rows when ``guided``), cannot fit in memory."""
    n = int(model.num_tokens)
    check_count(num_images, n * RECORD_BYTES, flag, f"the per-token records of the run ({n} tokens an image)")
    if batch_size:
        check_batch(model, min(batch_size, num_images), n + PREFIX_ROOM, batch_flag, 1 + bool(guided))


# --------------------------------------------------------------------------- weights
_ST_FLOAT = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
_ST_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}


def checkpoint_bytes(files: Sequence[str | Path], dtype: torch.dtype) -> tuple[int, int]:
    """(bytes, parameters) the tensors of checkpoint ``files`` take once loaded with floating
    tensors in ``dtype`` (e.g. bf16 on disk loaded as fp32 on a CPU: twice the file).

    Safetensors files: from their headers (the tensors are not read); other files (``.bin``,
    ``.pt``): their size on disk, one parameter per 4 bytes. Unreadable headers count as their
    file size (the loader reports the damage)."""
    size = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4
    total = params = 0
    for f in files:
        f = Path(f)
        if f.suffix == ".safetensors":
            try:
                with open(f, "rb") as fh:
                    n = struct.unpack("<Q", fh.read(8))[0]
                    header = json.loads(fh.read(n)) if n < 100_000_000 else None
                if not isinstance(header, dict):
                    raise ValueError
                for name, t in header.items():
                    if name == "__metadata__" or not isinstance(t, dict):
                        continue
                    count = 1
                    for d in t.get("shape", []):
                        count *= int(d)
                    params += count
                    total += count * (size if t.get("dtype") in _ST_FLOAT else _ST_BYTES.get(t.get("dtype"), 4))
                continue
            except (OSError, ValueError, struct.error):
                pass
        try:
            nbytes = f.stat().st_size
        except OSError:
            continue
        total, params = total + nbytes, params + nbytes // 4
    return total, params


def check_weights_fit(
    files: Sequence[str | Path], dtype: torch.dtype, device: torch.device | str | None, what: str
) -> None:
    """Raise UsageError before loading when the weights in ``files`` at ``dtype``
    (:func:`checkpoint_bytes`) cannot fit in the memory available on ``device``, naming the
    need, what is free and the setting that would fit (a 16-bit ``--dtype`` when it does)."""
    need, params = checkpoint_bytes(files, dtype)
    have = available_bytes(device)
    if need <= SHARE * have:
        return
    where = "" if torch.device(device or "cpu").type == "cpu" else f" on {device}"
    name = str(dtype).replace("torch.", "")
    half = need * 2 // max(torch.finfo(dtype).bits // 8, 1) if dtype.is_floating_point else need
    fix = (
        "use --dtype bfloat16 (about " + format_bytes(half) + ")"
        if dtype == torch.float32 and half <= SHARE * have
        else "use a machine or device with more memory"
    )
    raise UsageError(
        f"{what}: its weights need about {format_bytes(need)} at {name} ({params / 1e9:.2f} B "
        f"parameters), more than the {format_bytes(have)} of memory available{where}; {fix}"
    )
