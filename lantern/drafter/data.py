"""Training data for EAGLE drafters: token sequences and the target's teacher-forced features.

Sequences come from one of three places, all stored in one file format (a *token file*):

* the real Fashion-MNIST images encoded by the embedded model's VQ tokenizer
  (:func:`fashion_mnist_tokens`);
* a file the user provides (:func:`load_token_file`);
* the target itself (:func:`self_generate`, plain AR sampling with the user's guidance scale,
  temperature and top-k/top-p; image ``i`` from its own stream, :mod:`ambiguity.seeding`, so
  the sequences equal what ``python -m ambiguity.profile`` generates; resumable in parts).

Token file format
-----------------
``.safetensors`` (what this module writes): tensor ``tokens`` (N, L) integer code indices
(code-index order of the model, L = h * w image tokens in raster order), and either tensor
``labels`` (N,) int64 class labels (c2i models) or metadata ``conditions``, a JSON list of N
captions / prompts. ``.pt``: a dict with ``tokens`` and ``labels`` or ``conditions`` (list or
tensor). ``.npz``: arrays ``tokens`` and optionally ``labels``. ``.npy`` / a bare tensor: tokens
only, with the conditions from a text file (``--conditions FILE``, one label or caption a line).

Teacher-forced features
-----------------------
:func:`build_feature_cache` runs ``model.teacher_force`` once per sequence (no grad) and
stores the last hidden states (rows, N, H) as checked parts of the training run directory
(:class:`ambiguity.runs.RunDir`). ``teacher_force`` returns at
position ``t`` the hidden state that *predicts* ``x_t`` (t = 0: the last prefix position), so
with ``h_j`` = the hidden state at the position of ``x_j``: ``hidden[:, t] = h_{t-1}``.
:func:`training_inputs` turns that into the drafter's inputs (``x_i``, ``h_{i-1}``) and targets
(``h_i``, the target distribution of ``x_{i+1}``) for ``i = 0 .. N-2`` (EAGLE, arXiv 2401.15077,
Sec. 4.2). A fraction of the sequences also runs through the unconditional (CFG) stream, so the
drafter learns the null-condition features it meets on the unconditional rows under guidance.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from ambiguity.conditions import model_conditions
from ambiguity.data.fashion_mnist import load_split, model_image_size
from ambiguity.distributed import SINGLE, Shard
from ambiguity.errors import UsageError
from ambiguity.generation import sample_tokens
from ambiguity.io import load_tensors, save_tensors
from ambiguity.memory import check_run_size
from ambiguity.models.base import TokenModel, check_ids
from ambiguity.runs import RunDir, assemble_units, shard_units
from ambiguity.seeding import holdout_seed, image_generators, uncond_rows_seed

__all__ = [
    "TokenSet",
    "save_token_file",
    "load_token_file",
    "read_conditions",
    "check_tokens",
    "fashion_mnist_tokens",
    "self_generate",
    "split_holdout",
    "teacher_forced_rows",
    "training_inputs",
    "build_feature_cache",
    "shard_rows",
    "iterate_batches",
    "feature_dtype",
    "token_digest",
    "save_token_part",
    "load_token_part",
    "mix_token_sets",
]


@dataclass
class TokenSet:
    """Sequences for drafter training.

    ``tokens``: (N, L) int64 code indices on CPU; ``conditions``: N class labels (int) or
    strings (captions, prompts); ``source``: where they came from (for tables and metadata).
    """

    tokens: torch.Tensor
    conditions: list
    source: str = ""
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.tokens = torch.as_tensor(self.tokens).long().cpu()
        if self.tokens.dim() != 2:
            raise UsageError(f"token sequences must be a 2-D (N, h*w) array, got shape {tuple(self.tokens.shape)}")
        if len(self.conditions) != self.tokens.shape[0]:
            raise UsageError(
                f"{self.tokens.shape[0]} token sequences but {len(self.conditions)} conditions; "
                f"give one condition per sequence"
            )

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def subset(self, index: torch.Tensor | Sequence[int]) -> TokenSet:
        """The sequences at ``index`` (int positions), in that order."""
        idx = torch.as_tensor(index, dtype=torch.long)
        return TokenSet(self.tokens[idx], [self.conditions[i] for i in idx.tolist()], self.source, dict(self.info))


def token_digest(ts: TokenSet) -> str:
    """A short hash of the sequences and their conditions (what a run record stores)."""
    h = hashlib.sha256(ts.tokens.numpy().astype(np.int64).tobytes())
    h.update(repr([str(c) for c in ts.conditions]).encode())
    return h.hexdigest()[:16]


def save_token_part(run: RunDir, name: str, ts: TokenSet, holds: dict) -> None:
    """``ts`` as a checked part of ``run``: tokens (and int labels) as tensors, string
    conditions, source and info in the manifest."""
    tensors = {"tokens": ts.tokens}
    meta = {"source": ts.source, "info": ts.info}
    if all(isinstance(c, int) for c in ts.conditions):
        tensors["labels"] = torch.tensor(ts.conditions, dtype=torch.long)
    else:
        meta["conditions"] = [str(c) for c in ts.conditions]
    run.write_part(name, holds, tensors={"tokens": tensors}, meta=meta)


def load_token_part(run: RunDir, name: str, holds: Optional[dict] = None) -> Optional[TokenSet]:
    """The :class:`TokenSet` saved by :func:`save_token_part`, or None when the part is absent,
    damaged or foreign (see :meth:`ambiguity.runs.RunDir.read_part`)."""
    part = run.read_part(name, holds)
    if part is None:
        return None
    t = part.tensors["tokens"]
    conds = _as_conditions(t["labels"]) if "labels" in t else list(part.meta.get("conditions") or [])
    return TokenSet(t["tokens"], conds, part.meta.get("source", ""), dict(part.meta.get("info") or {}))


# --------------------------------------------------------------------------- token files
def save_token_file(ts: TokenSet, path: str | Path, **metadata) -> Path:
    """Write ``ts`` as a token file (safetensors, atomically): ``tokens`` (int32 when the codes
    fit, else int64), ``labels`` when all conditions are ints, else metadata ``conditions``."""
    top = int(ts.tokens.max()) if ts.tokens.numel() else 0
    tokens = ts.tokens.to(torch.int32) if top < 2**31 - 1 else ts.tokens
    tensors = {"tokens": tokens}
    meta = {"source": ts.source, **ts.info, **metadata}
    if all(isinstance(c, int) for c in ts.conditions):
        tensors["labels"] = torch.tensor(ts.conditions, dtype=torch.long)
    else:
        meta["conditions"] = [str(c) for c in ts.conditions]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_tensors(tensors, path, meta)


def read_conditions(path: str | Path) -> list:
    """A text file with one condition a line -> list of ints (all lines integers) or strings.

    Raises UsageError when the file is absent or empty.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"conditions file {path} does not exist; give one class label or caption a line")
    lines = [ln.rstrip("\n") for ln in path.read_text().splitlines() if ln.strip()]
    if not lines:
        raise UsageError(f"conditions file {path} is empty; give one class label or caption a line")
    try:
        return [int(ln) for ln in lines]
    except ValueError:
        return lines


def _as_conditions(x) -> list:
    if x is None:
        return None
    if torch.is_tensor(x) or hasattr(x, "tolist"):
        return [int(v) for v in x.tolist()]
    return [c if isinstance(c, (int, str)) else str(c) for c in x]


def load_token_file(path: str | Path, conditions_file: str | Path | None = None) -> TokenSet:
    """Read a token file (see the module docstring) -> :class:`TokenSet`.

    ``conditions_file`` (one label or caption a line) supplies or overrides the conditions.
    Raises UsageError for a missing or unreadable file, an unknown suffix, or missing conditions.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"token file {path} does not exist; pass --tokens FILE (.safetensors, .pt, .npz or .npy)")
    suffix = path.suffix.lower()
    tokens, conds, info = None, None, {}
    try:
        if suffix == ".safetensors":
            tensors, meta = load_tensors(path)
            tokens, info = tensors.get("tokens"), {k: v for k, v in meta.items() if k != "conditions"}
            conds = _as_conditions(tensors["labels"]) if "labels" in tensors else _as_conditions(meta.get("conditions"))
        elif suffix == ".pt":
            obj = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(obj, dict):
                tokens = obj.get("tokens")
                conds = _as_conditions(obj.get("labels", obj.get("conditions")))
            else:
                tokens = obj
        elif suffix == ".npz":
            with np.load(path) as z:
                tokens = torch.from_numpy(z["tokens"]) if "tokens" in z else None
                conds = _as_conditions(z["labels"]) if "labels" in z else None
        elif suffix == ".npy":
            tokens = torch.from_numpy(np.load(path))
        else:
            raise UsageError(f"token file {path.name} has an unknown suffix; use .safetensors, .pt, .npz or .npy")
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(
            f"cannot read token file {path} ({type(exc).__name__}: {exc}); see lantern.drafter.data for the format"
        ) from None
    if tokens is None:
        raise UsageError(f"token file {path} has no 'tokens' array of shape (N, h*w)")
    tokens = torch.as_tensor(tokens)
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise UsageError(
            f"token file {path} holds {str(tokens.dtype).replace('torch.', '')} tokens; tokens must be "
            f"integer code indices"
        )
    if conditions_file is not None:
        conds = read_conditions(conditions_file)
    if conds is None:
        raise UsageError(
            f"token file {path} holds no conditions; pass --conditions FILE (one class label or caption a line)"
        )
    return TokenSet(tokens, conds, source=str(path), info=info)


def check_tokens(ts: TokenSet, model: TokenModel) -> None:
    """Raise UsageError unless the sequences fit ``model``: codes in 0..V-1, length 2..h*w, and
    class labels in range for c2i models."""
    V, L = model.vocab_size, ts.tokens.shape[1]
    if len(ts) == 0:
        raise UsageError("no training sequences; give at least a few hundred")
    if not 2 <= L <= model.num_tokens:
        raise UsageError(f"sequences have {L} tokens; {model.name} takes 2..{model.num_tokens} image tokens a sequence")
    check_ids(
        ts.tokens,
        V,
        f"the token sequences of {ts.source or 'the data'} (for {model.name})",
        fix=f"store code indices (not vocabulary ids) of the {V} image tokens, made by this model's tokenizer",
    )
    if model.kind == "c2i":
        if not all(isinstance(c, int) for c in ts.conditions):
            raise UsageError(f"{model.name} is class-conditional; conditions must be integer class labels")
        if model.num_classes and (min(ts.conditions) < 0 or max(ts.conditions) >= model.num_classes):
            raise UsageError(f"class labels must be in 0..{model.num_classes - 1} for {model.name}")


def split_holdout(ts: TokenSet, test_size: int, seed: int = 0) -> tuple[TokenSet, TokenSet]:
    """Random held-out split: (train, test) with ``test_size`` test sequences (seeded permutation).

    Raises UsageError when fewer than ``test_size + 1`` sequences exist.
    """
    if not 0 < test_size < len(ts):
        raise UsageError(f"cannot hold out {test_size} of {len(ts)} sequences; lower --test-size or add data")
    perm = torch.randperm(len(ts), generator=torch.Generator().manual_seed(holdout_seed(seed)))
    return ts.subset(perm[test_size:].sort().values), ts.subset(perm[:test_size].sort().values)


def mix_token_sets(sets: Sequence[TokenSet], seed: int = 0) -> TokenSet:
    """The sequences of all ``sets`` in one seeded random order (so that feature shards, whose
    batches never cross a shard, hold a mix of the sources); source names joined with ``+``,
    info kept per source under ``info["mixed"]``. Raises UsageError for sequences of other lengths."""
    lengths = {int(ts.tokens.shape[1]) for ts in sets}
    if len(lengths) != 1:
        raise UsageError(f"cannot mix token sequences of lengths {sorted(lengths)}; give sources of one model")
    tokens = torch.cat([ts.tokens for ts in sets])
    conds = [c for ts in sets for c in ts.conditions]
    perm = torch.randperm(len(conds), generator=torch.Generator().manual_seed(seed)).tolist()
    info = {"mixed": [{"source": ts.source, "sequences": len(ts), **ts.info} for ts in sets]}
    return TokenSet(tokens[perm], [conds[i] for i in perm], "+".join(ts.source for ts in sets), info)


# --------------------------------------------------------------------------- sources
def fashion_mnist_tokens(
    model: TokenModel,
    split: str = "train",
    limit: Optional[int] = None,
    root: Optional[str | Path] = None,
    batch_size: int = 500,
    progress: bool = True,
) -> TokenSet:
    """Encode real Fashion-MNIST images with the model's VQ tokenizer -> (N, h*w) token sequences
    with their class labels. ``limit`` keeps the first N images of the split.

    Images are padded to 32 x 32 and upsampled to the model's side when it is larger.
    Raises UsageError when the IDX files are absent or the model does not take 1 x S x S images.
    """
    try:
        shape = tuple(model.image_shape)
    except NotImplementedError:
        shape = None
    size = model_image_size(shape)
    if size is None:
        raise UsageError(
            f"{model.name} does not take 1xSxS Fashion-MNIST images; pass --tokens FILE or --self-generate N"
        )
    images, labels = load_split(split, root, limit=limit, size=size)
    chunks = []
    for i in tqdm(
        range(0, len(images), batch_size), desc=f"encode fashion-mnist {split}", disable=not progress, unit="batch"
    ):
        chunks.append(model.encode_images(images[i : i + batch_size]).flatten(1).cpu())
    return TokenSet(torch.cat(chunks), labels.tolist(), source=f"fashion-mnist:{split}")


def _selfgen_part(k: int, batch_size: int, n: int) -> tuple[str, dict]:
    """Name and content of self-generated batch ``k``."""
    return f"selfgen_{k:05d}", {"images": [k * batch_size, min(n, (k + 1) * batch_size)]}


def self_generate(
    model: TokenModel,
    n: int,
    sampling,
    conditions: Optional[list] = None,
    batch_size: int = 32,
    seed: int = 0,
    run: Optional[RunDir] = None,
    progress: bool = True,
    shard: Shard = SINGLE,
) -> Optional[TokenSet]:
    """Sample ``n`` images' token sequences from the target itself (``ambiguity.generation.sample_tokens``).

    ``sampling``: an :class:`ambiguity.sampling.SamplingConfig` (guidance scale, temperature,
    top-k/top-p). ``conditions``: cycled to ``n``; default ``model.default_conditions(n)``
    (class labels round-robin for c2i). Image ``i`` samples from its own stream seeded by
    ``(seed, i)`` (:mod:`ambiguity.seeding`), whatever the batch size. With ``run`` every batch
    is a checked part (``selfgen_NNNNN``), so an interrupted run resumes.

    shard: this process's share (:mod:`ambiguity.distributed`): it samples the batches
    ``k % shard.count == shard.index``; under torchrun every rank then reads all batches (the
    sequences equal a single process's), an independent shard returns None after its own.
    Returns the sequences; raises UsageError for ``n < 1``, ``batch_size < 1``, models that need
    explicit conditions, or a sharded call without ``run``.
    """
    if n <= 0:
        raise UsageError(f"--self-generate needs a positive number of sequences, got {n}")
    if batch_size < 1:
        raise UsageError(f"--gen-batch-size must be >= 1, got {batch_size}")
    if shard.count > 1 and run is None:
        raise UsageError("sharded self-generation needs a run directory: the shards meet in its parts")
    check_run_size(model, n, batch_size, sampling.guided, "--self-generate", "--gen-batch-size")
    if conditions is None:
        missing = (
            f"{model.name} needs conditions for --self-generate; pass --conditions FILE (one caption or prompt a line)"
        )
        conditions = model_conditions(model, n, seed, missing)
    conds = [conditions[i % len(conditions)] for i in range(n)]
    info = {"sampling": sampling.as_dict(), "seed": seed, "model": model.name}
    batches = math.ceil(n / batch_size)
    units = [_selfgen_part(k, batch_size, n) for k in range(batches)]
    out_tokens = []
    mine = sum(shard.owns(k) for k in range(batches))
    label = "self-generate" + (f" ({shard.label})" if shard.count > 1 else "")
    for k, got in tqdm(shard_units(run, units, shard), total=mine, desc=label, unit="batch", disable=not progress):
        if got is not None:
            out_tokens.append(got.tensors["tokens"]["tokens"])
            continue
        i, j = units[k][1]["images"]
        prompt = model.make_prompt(conds[i:j], guided=sampling.guided)
        toks = sample_tokens(model, prompt, sampling, image_generators(seed, range(i, j), model.device)).cpu()
        if run is not None:
            save_token_part(run, units[k][0], TokenSet(toks, conds[i:j], "self-generated"), units[k][1])
        out_tokens.append(toks)
    out_tokens = assemble_units(
        run, units, shard, out_tokens, lambda part: part.tensors["tokens"]["tokens"], every_rank=True
    )
    if out_tokens is None:
        return None
    return TokenSet(torch.cat(out_tokens), conds, source="self-generated", info=info)


# --------------------------------------------------------------------------- features
def feature_dtype(model: TokenModel) -> torch.dtype:
    """Storage dtype of cached features: float16 for float32 targets, else the target's dtype."""
    return torch.float16 if model.dtype == torch.float32 else model.dtype


@torch.no_grad()
def teacher_forced_rows(
    model: TokenModel, tokens: torch.Tensor, conditions: list, with_uncond: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced last hidden states of a batch of sequences, one forward (no grad).

    Args:
        tokens: (B, N) int64 code indices; conditions: B labels or captions.
        with_uncond: (B,) bool; these sequences run through a guided prompt and give two rows
            each: the conditional row and the unconditional (null-condition) row.
    Returns:
        tokens (R, N) int64, hidden (R, N, H) in the model's dtype with ``hidden[:, t]`` the state
        that predicts ``tokens[:, t]``, uncond (R,) bool; R = B + with_uncond.sum(). Rows: the
        plain sequences, then the guided sequences' conditional rows, then their unconditional rows.
    """
    tokens = tokens.to(model.device)
    out_t, out_h, out_u = [], [], []
    plain = (~with_uncond).nonzero().flatten().tolist()
    guided = with_uncond.nonzero().flatten().tolist()
    if plain:
        prompt = model.make_prompt([conditions[i] for i in plain], guided=False)
        step = model.teacher_force(prompt, tokens[plain])
        out_t.append(tokens[plain])
        out_h.append(step.hidden)
        out_u.append(torch.zeros(len(plain), dtype=torch.bool))
    if guided:
        prompt = model.make_prompt([conditions[i] for i in guided], guided=True)
        both = torch.cat([tokens[guided], tokens[guided]])
        step = model.teacher_force(prompt, both)
        out_t.append(both)
        out_h.append(step.hidden)
        out_u.append(torch.arange(2 * len(guided)) >= len(guided))
    return torch.cat(out_t), torch.cat(out_h), torch.cat(out_u)


def training_inputs(tokens: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Align teacher-forced hidden states with the drafter's inputs and targets (EAGLE Sec. 4.2).

    Args:
        tokens: (R, N) int64 ``x_0 .. x_{N-1}``.
        hidden: (R, N, H) from ``teacher_force``: ``hidden[:, t]`` predicts ``x_t``, i.e. it is
            ``h_{t-1}``, the hidden state at the position of ``x_{t-1}`` (``h_{-1}`` = last prefix
            position).
    Returns:
        ``tokens_in`` (R, N-1) = ``x_0 .. x_{N-2}``, ``features_in`` (R, N-1, H) =
        ``h_{-1} .. h_{N-3}`` and ``feature_targets`` (R, N-1, H) = ``h_0 .. h_{N-2}``: drafter
        position ``i`` takes (``x_i``, ``h_{i-1}``) and should output ``h_i``, whose head logits
        are the target's distribution of ``x_{i+1}``.
    """
    return tokens[:, :-1], hidden[:, :-1], hidden[:, 1:]


def _shard_size(n_tokens: int, hidden: int, dtype: torch.dtype, target_bytes: int = 64 * 2**20) -> int:
    per_row = n_tokens * hidden * torch.finfo(dtype).bits // 8
    return max(16, target_bytes // max(per_row, 1))


def build_feature_cache(
    model: TokenModel,
    ts: TokenSet,
    run: RunDir,
    prefix: str,
    batch_size: int = 32,
    uncond_fraction: float = 0.0,
    seed: int = 0,
    progress: bool = True,
    shard: Shard = SINGLE,
) -> list[Path]:
    """Teacher-force every sequence once and store (tokens, hidden, uncond) rows as parts of ``run``.

    Parts ``<prefix>_features_00000`` ... hold about 64 MB each: ``tokens`` (R, N) int64,
    ``hidden`` (R, N, H) in :func:`feature_dtype`, ``uncond`` (R,) bool. Intact parts are
    kept (resume); damaged ones are recomputed. A seeded random subset of the sequences also
    runs the unconditional stream, chosen so that about ``uncond_fraction`` of all rows are
    unconditional (each chosen sequence adds one conditional and one unconditional row).
    shard: under torchrun each rank computes the parts ``s % count == index`` and, after a
    barrier, every rank gets all paths (the parts equal a single process's).
    Returns the parts' safetensors paths in order (for :func:`iterate_batches`); raises
    UsageError when a part is missing after the barrier.
    """
    if not 0 <= uncond_fraction < 0.5:
        raise UsageError(f"--uncond-fraction must be in [0, 0.5), got {uncond_fraction}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    dtype = feature_dtype(model)
    size = _shard_size(ts.tokens.shape[1], model.hidden_size, dtype)
    p = uncond_fraction / (1 - uncond_fraction)
    chosen = torch.rand(len(ts), generator=torch.Generator().manual_seed(uncond_rows_seed(seed))) < p
    n_parts = math.ceil(len(ts) / size)
    parts = [
        (
            f"{prefix}_features_{s:05d}",
            {"sequences": [s * size, min(len(ts), (s + 1) * size)], "uncond_fraction": uncond_fraction},
        )
        for s in range(n_parts)
    ]
    mine = [s for s in range(n_parts) if shard.owns(s)]
    bar = tqdm(
        total=sum(parts[s][1]["sequences"][1] - parts[s][1]["sequences"][0] for s in mine),
        desc=f"target features ({prefix})",
        unit="seq",
        disable=not progress,
    )
    for s, part in shard_units(run, parts, shard, load=False):
        name, holds = parts[s]
        lo, hi = holds["sequences"]
        if part is None:
            toks, hid, unc = [], [], []
            for i in range(lo, hi, batch_size):
                j = min(hi, i + batch_size)
                t, h, u = teacher_forced_rows(model, ts.tokens[i:j], ts.conditions[i:j], chosen[i:j])
                toks.append(t.cpu())
                hid.append(h.to(dtype).cpu())
                unc.append(u)
                bar.update(j - i)
            run.write_part(
                name,
                holds,
                tensors={"rows": {"tokens": torch.cat(toks), "hidden": torch.cat(hid), "uncond": torch.cat(unc)}},
            )
        else:
            bar.update(hi - lo)
    bar.close()
    paths = [run.parts_dir / f"{name}.rows.safetensors" for name, _ in parts]
    # torchrun: every rank trains on every part (train_drafter refuses independent shards here)
    return assemble_units(
        run,
        parts,
        shard,
        paths,
        lambda part: run.parts_dir / f"{part.name}.rows.safetensors",
        every_rank=True,
        load=False,
    )


def shard_rows(paths: Sequence[Path]) -> list[int]:
    """Rows in each feature shard (read from the safetensors headers only)."""
    sizes = []
    for p in paths:
        with safe_open(str(p), framework="pt") as f:
            sizes.append(int(f.get_slice("uncond").get_shape()[0]))
    return sizes


def iterate_batches(
    paths: Sequence[Path],
    batch_size: int,
    generator: Optional[torch.Generator] = None,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Yield (tokens (b, N) int64, hidden (b, N, H), uncond (b,) bool) batches from feature shards.

    With a ``generator`` the shard order and the rows inside each shard are shuffled (one
    shard in memory at a time); without one the order is the stored order (evaluation).
    """
    order = torch.randperm(len(paths), generator=generator).tolist() if generator is not None else range(len(paths))
    for s in order:
        tensors, _ = load_tensors(paths[s])
        R = tensors["uncond"].shape[0]
        rows = torch.randperm(R, generator=generator) if generator is not None else torch.arange(R)
        for i in range(0, R, batch_size):
            idx = rows[i : i + batch_size]
            yield (
                tensors["tokens"][idx].long().to(device),
                tensors["hidden"][idx].to(device),
                tensors["uncond"][idx].to(device),
            )
