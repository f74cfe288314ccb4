"""Latent neighbourhoods: the k nearest other codes of every code, exact, with FAISS, cached.

LANTERN (Jang et al., ICLR 2025, Sec. 4.1) relaxes speculative decoding by accepting a drafted
token x̂ according to the target probability mass on its latent neighbourhood
A_{k,δ}(x̂) ⊂ B_k(x̂), where B_k(x̂) is the set of the k codes nearest to x̂ in the latent space
(x̂ itself excluded). This module builds B_k for every row of an embedding matrix: the VQ
codebook (``model.codebook()``), the AR model's input embeddings or its output-head rows.

Metrics (``metric=``)
---------------------
``l2``              Euclidean distance between the raw rows; what the official LANTERN code uses
                    (``torch.cdist`` on ``quantize.embedding.weight``).
``l2-normalized``   Euclidean distance between l2-normalised rows; the geometry LlamaGen's
                    quantiser uses to pick codes (same order as ``cosine``, other distances).
``cosine``          1 - cosine similarity of the rows (in [0, 2]).
``random``          the control: for every row a seeded uniformly random permutation of the
                    other rows. Its ``distances`` are the ``l2`` distances of those rows, in
                    permutation order (the only metric whose distances are not ascending).
Rows of zero norm are left at zero by the normalisation (cosine similarity 0 to every row).

Order and ties
--------------
Row ``i`` of the result lists the k nearest rows ``j != i`` in ascending float32 distance; equal
distances are ordered by ascending index, and when several rows tie at the k-th distance the
lower indices are kept. Self is excluded by index, so a duplicate of row ``i`` is its first
neighbour at distance 0. Squared distances are computed as |x|^2 + |y|^2 - 2 x.y in float32
(FAISS and torch alike), so two rows whose true distances differ by less than ~1e-6 relative
may come in either order.

Search
------
Exact (brute force). ``backend="auto"`` uses FAISS (a GPU index when the installed faiss has GPU
support and the matrix lives on a CUDA device, else the CPU index) while k + 1 <= 2048 (FAISS's
GPU limit, and where its heaps win), and a blocked torch sort on the matrix's device above
(k close to N, where a full sort beats heaps). Queries run in row blocks whose working memory is
bounded by ``block_bytes``; no N x N matrix is ever formed (the output itself is N x k).
The search itself is :func:`ambiguity.knn.exact_knn`.

Cache
-----
Results are stored as safetensors under :func:`default_cache_dir` (``$AMBIGUITY_NEIGHBOURHOOD_CACHE``,
else ``$LANTERN_AMBIGUITY_CACHE/neighbourhoods``, else ``~/.cache/lantern-ambiguity/neighbourhoods``)
keyed by a BLAKE2 hash of the matrix bytes, its shape, the metric (and the seed for ``random``).
A cached table for a larger k is reused by taking its first k columns.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import torch

from ambiguity.cli import (
    ArgumentParser,
    add_model_args,
    add_out_arg,
    check_out_dir,
    check_out_file,
    cli_main,
    safe_name,
    seed_int,
)
from ambiguity.errors import UsageError
from ambiguity.io import ensure_writable_dir, load_tensors, save_tensors, write_table
from ambiguity.knn import DEFAULT_BLOCK_BYTES, METRICS, check_k, check_matrix, check_metric, exact_knn
from ambiguity.models.registry import check_spec_options, load_model

__all__ = [
    "MATRICES",
    "Neighbourhoods",
    "build_neighbourhoods",
    "model_neighbourhoods",
    "model_matrix",
    "matrix_key",
    "default_cache_dir",
    "load_neighbourhoods",
    "main",
]

MATRICES = ("codebook", "codebook-raw", "input", "output")
_FORMAT = 1  # bump when the cached layout or the tie rule changes


# --------------------------------------------------------------------------- result
@dataclass
class Neighbourhoods:
    """B_k of every row of an embedding matrix (see the module docstring for order and ties).

    Attributes:
        indices: (N, k) int64 code indices (rows of the matrix = code order), nearest first.
        distances: (N, k) float32, in the metric's units (Euclidean distance for ``l2`` and
            ``l2-normalized``, 1 - cos for ``cosine``, ``l2`` distance for ``random``).
        metric: one of :data:`METRICS`.
        key: cache key of the matrix and metric (hex string).
        image_token_ids: (N,) int64 vocabulary id of each code, or None (ids = code indices).
        source: what the rows are, e.g. ``"embedded:codebook"``.
        seed: seed of the ``random`` control (0 otherwise).
        seconds: wall time of the build (0 when loaded from the cache); from_cache: loaded.
    """

    indices: torch.Tensor
    distances: torch.Tensor
    metric: str
    key: str = ""
    image_token_ids: Optional[torch.Tensor] = None
    source: str = "matrix"
    seed: int = 0
    seconds: float = 0.0
    from_cache: bool = False

    @property
    def n(self) -> int:
        """Number of codes N."""
        return int(self.indices.shape[0])

    @property
    def k(self) -> int:
        """Neighbours per code."""
        return int(self.indices.shape[1])

    @property
    def device(self) -> torch.device:
        return self.indices.device

    def truncate(self, k: int) -> Neighbourhoods:
        """The first ``k`` neighbours of every code (B_k is a prefix of B_K for k <= K).

        Raises UsageError unless 1 <= k <= self.k.
        """
        if not 1 <= int(k) <= self.k:
            raise UsageError(f"k must be in 1..{self.k} to truncate these neighbourhoods; build them with a larger k")
        k = int(k)
        return replace(self, indices=self.indices[:, :k], distances=self.distances[:, :k])

    def to(self, device) -> Neighbourhoods:
        """Same tables on ``device``."""
        ids = None if self.image_token_ids is None else self.image_token_ids.to(device)
        return replace(self, indices=self.indices.to(device), distances=self.distances.to(device), image_token_ids=ids)

    def _ids(self) -> torch.Tensor:
        if self.image_token_ids is None:
            return torch.arange(self.n, device=self.device)
        return self.image_token_ids.to(self.device)

    def vocab_ids(self) -> torch.Tensor:
        """The table in vocabulary ids: (N, k) int64, ``image_token_ids[indices]``.

        Row ``c`` is still code ``c`` (vocabulary id ``image_token_ids[c]``); see
        :meth:`of_vocab` to look up neighbours by vocabulary id.
        """
        return self._ids()[self.indices]

    def of_vocab(self, vocab_ids: torch.Tensor) -> torch.Tensor:
        """Neighbours of tokens given by vocabulary id, in vocabulary ids: (...) int64 -> (..., k) int64.

        What a decoder working in the full vocabulary (e.g. Chameleon, whose image ids start
        at 4) needs. Raises UsageError for ids that are not image tokens of this table.
        """
        ids = self._ids()
        v = torch.as_tensor(vocab_ids, device=self.device, dtype=torch.long)
        lookup = torch.full((int(ids.max()) + 1,), -1, dtype=torch.long, device=self.device)
        lookup[ids] = torch.arange(self.n, device=self.device)
        bad = (v < 0) | (v > int(ids.max()))
        codes = lookup[v.clamp(0, int(ids.max()))]
        if bool((bad | (codes < 0)).any()):
            raise UsageError(
                "some vocabulary ids are not image tokens of this table; pass image-token ids "
                "(model.image_token_ids) or use code indices with .indices"
            )
        return ids[self.indices[codes]]

    def to_frame(self):
        """Long pandas table, one row per (code, rank): code, vocab_id, rank (1 = nearest),
        neighbour, neighbour_vocab_id, distance."""
        idx = self.indices.cpu()
        n, k = idx.shape
        ids = self._ids().cpu()
        return pd.DataFrame(
            {
                "code": np.repeat(np.arange(n, dtype=np.int64), k),
                "vocab_id": np.repeat(ids.numpy(), k),
                "rank": np.tile(np.arange(1, k + 1, dtype=np.int64), n),
                "neighbour": idx.reshape(-1).numpy(),
                "neighbour_vocab_id": ids[idx].reshape(-1).numpy(),
                "distance": self.distances.cpu().reshape(-1).numpy(),
            }
        )

    def metadata(self) -> dict:
        return {
            "metric": self.metric,
            "key": self.key,
            "source": self.source,
            "seed": self.seed,
            "n": self.n,
            "k": self.k,
            "format": _FORMAT,
        }

    def save(self, path: str | Path) -> Path:
        """Write the table atomically: ``.parquet`` (see :meth:`to_frame`) or ``.safetensors``
        (indices, distances, vocab_ids (N, k) and image_token_ids (N,), metadata as JSON).

        Raises UsageError for another suffix.
        """
        path = Path(path)
        if path.suffix == ".parquet":
            return write_table(self.to_frame(), path)
        if path.suffix == ".safetensors":
            return save_tensors(
                {
                    "indices": self.indices,
                    "distances": self.distances,
                    "vocab_ids": self.vocab_ids(),
                    "image_token_ids": self._ids(),
                },
                path,
                self.metadata(),
            )
        raise UsageError(f"--out must end in .parquet or .safetensors, got {path.name}")

    def summary(self) -> dict:
        """Scalar facts for tables: n, k, metric, mean/median distance to the 1st and k-th
        neighbour, rows with an exact duplicate (a neighbour at distance 0), build seconds."""
        d = self.distances.float()
        first, last = d[:, 0], d[:, -1]
        return {
            "source": self.source,
            "metric": self.metric,
            "n": self.n,
            "k": self.k,
            "mean_d1": float(first.mean()),
            "median_d1": float(first.median()),
            "mean_dk": float(last.mean()),
            "median_dk": float(last.median()),
            "duplicates": int((d == 0).any(1).sum()) if self.metric != "random" else 0,
            "seconds": round(self.seconds, 3),
            "from_cache": self.from_cache,
        }


def load_neighbourhoods(path: str | Path, device="cpu") -> Neighbourhoods:
    """Read a ``.safetensors`` file written by :meth:`Neighbourhoods.save` or by the cache.

    Raises UsageError when the file is missing or not a neighbourhood table.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"neighbourhood file {path} does not exist; build it with python -m ambiguity.neighbourhood")
    try:
        t, meta = load_tensors(path, device)
        return Neighbourhoods(
            t["indices"],
            t["distances"],
            meta["metric"],
            meta.get("key", ""),
            t.get("image_token_ids"),
            meta.get("source", "matrix"),
            int(meta.get("seed", 0)),
            from_cache=True,
        )
    except (KeyError, OSError, ValueError) as exc:
        raise UsageError(f"{path} is not a neighbourhood table ({exc}); rebuild it") from None


# --------------------------------------------------------------------------- keys
def matrix_key(matrix: torch.Tensor, metric: str, seed: int = 0) -> str:
    """Cache key: ``<metric>[-s<seed>]-<20 hex of BLAKE2b(float32 bytes, shape, metric, seed)>``."""
    x = matrix.detach().to("cpu", torch.float32).contiguous().numpy()
    h = hashlib.blake2b(digest_size=10)
    h.update(f"v{_FORMAT}|{x.shape}|{metric}|{seed if metric == 'random' else 0}|".encode())
    h.update(memoryview(x).cast("B"))
    return f"{metric}{f'-s{seed}' if metric == 'random' else ''}-{h.hexdigest()}"


def default_cache_dir() -> Path:
    """Where tables are cached (see the module docstring for the environment variables)."""
    if os.environ.get("AMBIGUITY_NEIGHBOURHOOD_CACHE"):
        return Path(os.environ["AMBIGUITY_NEIGHBOURHOOD_CACHE"]).expanduser()
    if os.environ.get("LANTERN_AMBIGUITY_CACHE"):
        return Path(os.environ["LANTERN_AMBIGUITY_CACHE"]).expanduser() / "neighbourhoods"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "lantern-ambiguity" / "neighbourhoods"


# --------------------------------------------------------------------------- cached builder
def _cached(cache_dir: Path, key: str, k: int) -> Optional[Path]:
    best = None
    for p in cache_dir.glob(f"{key}-k*.safetensors"):
        try:
            kk = int(p.name[len(key) + 2 : -len(".safetensors")])
        except ValueError:
            continue
        if kk >= k and (best is None or kk < best[0]):
            best = (kk, p)
    return None if best is None else best[1]


def build_neighbourhoods(
    matrix: torch.Tensor,
    k: int,
    metric: str = "l2",
    *,
    seed: int = 0,
    image_token_ids: Optional[torch.Tensor] = None,
    source: str = "matrix",
    cache: bool = True,
    cache_dir: Optional[str | Path] = None,
    backend: str = "auto",
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Optional[bool] = None,
) -> Neighbourhoods:
    """B_k for every row of ``matrix``, loaded from the disk cache when present (LANTERN Sec. 4.1).

    Args:
        matrix: (N, d) float tensor; rows in code-index order. The result lives on its device.
        k: 1 <= k <= N - 1. metric: see :data:`METRICS`. seed: of the ``random`` control.
        image_token_ids: (N,) int64 vocabulary id of each row (for :meth:`Neighbourhoods.vocab_ids`).
        source: label stored with the table. cache: read/write the cache; cache_dir: its folder
            (default :func:`default_cache_dir`). backend / block_bytes / progress: see :func:`exact_knn`.
    Returns :class:`Neighbourhoods`. A changed matrix (any byte) gets a new cache key; a cached
    table with a larger k is truncated. Raises UsageError for bad inputs (see :func:`exact_knn`);
    an unwritable cache only warns.
    """
    x = check_matrix(matrix)
    k = check_k(k, x.shape[0])
    metric = check_metric(metric)
    ids = None if image_token_ids is None else torch.as_tensor(image_token_ids, dtype=torch.long).view(-1)
    if ids is not None and ids.numel() != x.shape[0]:
        raise UsageError(f"image_token_ids has {ids.numel()} entries for {x.shape[0]} rows; pass one id per row")
    key = matrix_key(x, metric, seed)
    cdir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if cache and cdir.is_dir():
        hit = _cached(cdir, key, k)
        if hit is not None:
            try:
                t, meta = load_tensors(hit, x.device)
                if t["indices"].shape[0] == x.shape[0] and meta.get("key") == key:
                    return Neighbourhoods(
                        t["indices"][:, :k].contiguous(),
                        t["distances"][:, :k].contiguous(),
                        metric,
                        key,
                        None if ids is None else ids.to(x.device),
                        source,
                        seed,
                        0.0,
                        True,
                    )
            except Exception as exc:  # a damaged cache file is rebuilt, never trusted
                warnings.warn(f"ignoring unreadable neighbourhood cache {hit} ({exc})", stacklevel=2)
    t0 = time.perf_counter()
    I, D = exact_knn(x, k, metric, seed=seed, backend=backend, block_bytes=block_bytes, progress=progress)
    if x.is_cuda:
        torch.cuda.synchronize()
    out = Neighbourhoods(
        I, D, metric, key, None if ids is None else ids.to(x.device), source, seed, time.perf_counter() - t0, False
    )
    if cache:
        try:
            cdir.mkdir(parents=True, exist_ok=True)
            save_tensors({"indices": I, "distances": D}, cdir / f"{key}-k{k}.safetensors", out.metadata())
        except OSError as exc:
            warnings.warn(
                f"could not cache neighbourhoods in {cdir} ({exc}); set AMBIGUITY_NEIGHBOURHOOD_CACHE", stacklevel=2
            )
    return out


def model_matrix(model, matrix: str = "codebook") -> torch.Tensor:
    """The (V, d) float32 rows of ``model`` in code-index order: ``"codebook"`` (the VQ codebook
    as the quantiser compares it: l2-normalised for LlamaGen), ``"codebook-raw"`` (the stored
    codebook weights, what the official LANTERN code measures), ``"input"`` (AR input
    embeddings) or ``"output"`` (output-head rows).

    Raises UsageError for another name or a model that lacks the matrix.
    """
    getters = {
        "codebook": "codebook",
        "codebook-raw": "raw_codebook",
        "input": "input_embeddings",
        "output": "output_embeddings",
    }
    if matrix not in getters:
        raise UsageError(f"--matrix must be one of {', '.join(MATRICES)}, got {matrix!r}")
    try:
        rows = getattr(model, getters[matrix])()
    except NotImplementedError as exc:
        others = [m for m in MATRICES if m != matrix]
        raise UsageError(f"{exc}; choose --matrix {' or '.join(others)} or load the missing weights") from None
    return rows.detach().float()


def model_neighbourhoods(model, k: int, metric: str = "l2", matrix: str = "codebook", **kwargs) -> Neighbourhoods:
    """:func:`build_neighbourhoods` on a model's ``codebook``/``input``/``output`` rows, with
    its ``image_token_ids``; keyword arguments go to :func:`build_neighbourhoods`."""
    rows = model_matrix(model, matrix)
    return build_neighbourhoods(
        rows, k, metric, image_token_ids=model.image_token_ids, source=f"{model.name}:{matrix}", **kwargs
    )


# --------------------------------------------------------------------------- CLI
def _parse_k(text: str):
    if text == "all":
        return "all"
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"--k must be an integer or 'all' (N - 1), got {text!r}") from None


def _check_out(path: str | Path) -> Path:
    """``--out``: a writable .parquet or .safetensors file path."""
    out = Path(path)
    if out.suffix not in (".parquet", ".safetensors"):
        raise UsageError(f"--out must end in .parquet or .safetensors, got {out.name}")
    check_out_file(out)
    return out


@cli_main
def main(argv=None) -> int:
    """``python -m ambiguity.neighbourhood``: build (or load) B_k of a model's matrix and write it."""
    ap = ArgumentParser(
        prog="python -m ambiguity.neighbourhood",
        description="Exact k-nearest-neighbour table of a model's codebook or embeddings (LANTERN B_k).",
    )
    add_model_args(ap, dtype=False)
    ap.add_argument("--k", default="256", help="neighbours per code, 1..N-1, or 'all' (default: %(default)s)")
    ap.add_argument("--metric", default="l2", choices=METRICS)
    ap.add_argument("--matrix", default="codebook", choices=MATRICES)
    ap.add_argument("--seed", type=seed_int, default=0, help="seed of the random control")
    add_out_arg(
        ap,
        "output .parquet or .safetensors (default: runs/neighbourhoods/<model>-<matrix>-<metric>-k<k>.parquet)",
        metavar="FILE",
    )
    ap.add_argument("--cache-dir", default=None, help=f"cache folder (default: {default_cache_dir()})")
    ap.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    args = ap.parse_args(argv)
    k = _parse_k(args.k)
    if args.out is not None:
        _check_out(args.out)
    if args.cache_dir is not None and not args.no_cache:
        check_out_dir(args.cache_dir, "--cache-dir")

    if k != "all":
        check_spec_options(args.model, args.weights, k=k)  # before any weights
    model = load_model(args.model, weights=args.weights, device=args.device)
    rows = model_matrix(model, args.matrix)
    k = rows.shape[0] - 1 if k == "all" else check_k(k, rows.shape[0], "--k")
    name = f"{safe_name(model.name)}-{args.matrix}-{args.metric}-k{k}.parquet"
    out = _check_out(args.out or f"runs/neighbourhoods/{name}")
    ensure_writable_dir(out.parent)
    nb = build_neighbourhoods(
        rows,
        k,
        args.metric,
        seed=args.seed,
        image_token_ids=model.image_token_ids,
        source=f"{model.name}:{args.matrix}",
        cache=not args.no_cache,
        cache_dir=args.cache_dir,
        progress=True,
    )
    nb.save(out)
    s = nb.summary()
    how = "from cache" if nb.from_cache else f"built in {s['seconds']:.2f} s"
    print(
        f"wrote {out} ({s['n']} codes x {s['k']} neighbours, {args.metric} on the {args.matrix} rows of "
        f"{model.name}, {how})"
    )
    print(pd.DataFrame([{k_: v for k_, v in s.items() if k_ not in ("source", "from_cache")}]).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
