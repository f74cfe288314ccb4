"""Exact k nearest neighbours of every row of an embedding matrix, the search behind the latent
neighbourhoods B_k of :mod:`ambiguity.neighbourhood` (LANTERN, Jang et al., ICLR 2025, Sec. 4.1).

Brute force: FAISS (a GPU index when the installed faiss has GPU support and the matrix lives on
a CUDA device, else the CPU index) while k + 1 <= 2048, a blocked torch sort on the matrix's
device above; queries run in row blocks whose working memory is bounded by ``block_bytes``, so no
N x N matrix is ever formed. Rows are ordered by (float32 distance, index), the query row itself
is excluded by index, and the ``random`` metric is a seeded random permutation per row (the
control). :mod:`ambiguity.neighbourhood` documents the metrics and the tie rule, and caches the
tables.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from ambiguity.errors import UsageError
from ambiguity.seeding import random_control_seed

__all__ = [
    "METRICS",
    "DEFAULT_METRIC",
    "FAISS_MAX_K",
    "DEFAULT_BLOCK_BYTES",
    "RANDOM_CHUNK",
    "check_k",
    "check_matrix",
    "check_metric",
    "exact_knn",
    "faiss_search",
    "to_distance",
    "drop_self",
]

METRICS = ("l2", "l2-normalized", "cosine", "random")
DEFAULT_METRIC = "l2"  # the official LANTERN code: Euclidean distance between codebook vectors (torch.cdist)
FAISS_MAX_K = 2048  # faiss GPU selects at most 2048 results per query
DEFAULT_BLOCK_BYTES = 256 * 2**20
RANDOM_CHUNK = 256  # rows per seeded chunk of the random control (fixed: results do not depend on memory)


# --------------------------------------------------------------------------- checks
def check_k(k, n: int, name: str = "k") -> int:
    """k as an int in 1..n-1, else UsageError naming ``name`` (e.g. the flag ``--k``) and the valid range."""
    try:
        ok = int(k) == k
    except (TypeError, ValueError):
        ok = False
    if not ok or not 1 <= int(k) <= n - 1:
        raise UsageError(
            f"{name} must be an integer in 1..{n - 1} (N - 1 for {n} codes; B_k excludes the code itself), got {k}"
        )
    return int(k)


def check_matrix(x) -> torch.Tensor:
    """An embedding matrix (N >= 2, d >= 1) of finite numbers as contiguous float32; UsageError otherwise."""
    if not torch.is_tensor(x):
        x = torch.as_tensor(np.asarray(x))
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        raise UsageError(f"embedding matrix must be 2-D (N >= 2 rows, d >= 1 columns), got shape {tuple(x.shape)}")
    if not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
        raise UsageError(f"embedding matrix must hold numbers, got dtype {x.dtype}")
    x = x.detach().float()
    bad = ~torch.isfinite(x).all(1)
    if bool(bad.any()):
        rows = bad.nonzero().view(-1)[:5].tolist()
        raise UsageError(
            f"embedding matrix has NaN or Inf in {int(bad.sum())} rows (e.g. {rows}); "
            f"check the checkpoint or pass a finite matrix"
        )
    return x.contiguous()


def check_metric(metric: str) -> str:
    """``metric`` when it is one of :data:`METRICS`, else UsageError listing them."""
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    return metric


# --------------------------------------------------------------------------- search
def _prepare(x: torch.Tensor, metric: str) -> torch.Tensor:
    if metric in ("l2-normalized", "cosine"):
        return torch.nn.functional.normalize(x, dim=1)
    return x


def _faiss_importable() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def _faiss_gpu_ok(device: torch.device) -> bool:
    if device.type != "cuda" or not _faiss_importable():
        return False
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


_GPU_RES = None


def faiss_search(q: torch.Tensor, x, kk: int, metric: str, gpu: bool):
    """FAISS brute force: queries (b, d), database (N, d) (a CUDA tensor when ``gpu``, else a
    float32 numpy array) -> scores (b, kk) float32, ids (b, kk) int64 on q's device."""
    import faiss

    fm = faiss.METRIC_INNER_PRODUCT if metric == "cosine" else faiss.METRIC_L2
    if gpu:
        global _GPU_RES
        import faiss.contrib.torch_utils  # lets faiss.knn_gpu take torch CUDA tensors

        if _GPU_RES is None:
            _GPU_RES = faiss.StandardGpuResources()
        D, I = faiss.knn_gpu(_GPU_RES, q, x, kk, metric=fm)
        return D.float(), I.long()
    D, I = faiss.knn(q.cpu().numpy(), x, kk, metric=fm)
    return torch.from_numpy(D).to(q.device), torch.from_numpy(I).to(q.device)


def to_distance(scores: torch.Tensor, metric: str) -> torch.Tensor:
    """FAISS scores -> distances: 1 - inner product for ``cosine``, sqrt of the squared l2 otherwise."""
    if metric == "cosine":
        return 1.0 - scores
    return scores.clamp_min(0).sqrt()


def _order_by_distance_then_index(D: torch.Tensor, I: torch.Tensor):
    """Rows of (b, m) candidates reordered by (distance, index): two stable sorts (index, then distance)."""
    o = torch.argsort(I, dim=1, stable=True)
    D, I = D.gather(1, o), I.gather(1, o)
    o = torch.argsort(D, dim=1, stable=True)
    return D.gather(1, o), I.gather(1, o)


def _out_of_order_rows(D: torch.Tensor, I: torch.Tensor) -> torch.Tensor:
    """(b,) bool: rows not already ascending in (distance, index) (lexicographic, indices distinct)."""
    d0, d1, i0, i1 = D[:, :-1], D[:, 1:], I[:, :-1], I[:, 1:]
    return ((d1 < d0) | ((d1 == d0) & (i1 < i0))).any(1)


def drop_self(D: torch.Tensor, I: torch.Tensor, rows: torch.Tensor, k: int):
    """(b, k+1) candidates -> (b, k) without the query's own index, ordered by (distance, index).

    FAISS already returns most rows in this order (its heaps break score ties by id), so only the
    rows that are not (a distance tie created by the sqrt of squared l2 scores, or by duplicate codes
    whose scores differ in rounding but clamp to 0) are re-sorted; the self code is then removed by
    shifting the later entries left one place. Same table as re-sorting every row, at a fraction of
    the cost (``benchmarks/bench_neighbourhood.py``: ``drop_resort_s`` vs ``drop_s``).
    """
    bad = _out_of_order_rows(D, I)
    if bool(bad.any()):
        D, I = D.clone(), I.clone()
        D[bad], I[bad] = _order_by_distance_then_index(D[bad], I[bad])
    is_self = I == rows[:, None]
    # position of the self code in each row; k (the last candidate) where it is not among the k + 1
    pos = torch.where(is_self.any(1), is_self.to(torch.int8).argmax(1), torch.full_like(rows, k))
    j = torch.arange(k, device=I.device)
    take = j + (j[None, :] >= pos[:, None])
    return D.gather(1, take), I.gather(1, take)


def _torch_block(q: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, k: int, metric: str):
    """Blocked exact search by a stable full sort of (b, N) distances (ties -> lower index)."""
    if metric == "cosine":
        d = 1.0 - q @ x.T
    else:
        d = torch.cdist(q, x).float()
    d[torch.arange(len(rows), device=d.device), rows] = float("inf")
    vals, idx = torch.sort(d, dim=1, stable=True)
    return vals[:, :k].contiguous(), idx[:, :k].contiguous()


def _random_block(q: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, k: int, seed: int):
    """The random control for rows that lie in one fixed RANDOM_CHUNK (keys from a per-chunk seed)."""
    chunk = int(rows[0]) // RANDOM_CHUNK
    g = torch.Generator().manual_seed(random_control_seed(seed, chunk))
    keys = torch.rand(RANDOM_CHUNK, x.shape[0], generator=g)[int(rows[0]) - chunk * RANDOM_CHUNK :][: len(rows)]
    keys = keys.to(q.device)
    keys[torch.arange(len(rows), device=q.device), rows] = 2.0  # self last
    idx = torch.sort(keys, dim=1, stable=True).indices[:, :k]
    dist = torch.cdist(q, x).float().gather(1, idx)
    return dist, idx


def exact_knn(
    matrix: torch.Tensor,
    k: int,
    metric: str = "l2",
    *,
    seed: int = 0,
    backend: str = "auto",
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Optional[bool] = None,
):
    """The k nearest other rows of every row of ``matrix`` (no cache; see :func:`build_neighbourhoods`).

    Args:
        matrix: (N, d) float tensor (any float dtype; searched in float32) on any device.
        k: neighbours per row, 1 <= k <= N - 1.
        metric: one of :data:`METRICS`; seed: for ``random`` only.
        backend: ``"auto"``, ``"faiss"`` (k + 1 <= 2048 on GPU) or ``"torch"``. ``"auto"`` takes
            faiss for k + 1 <= 2048 on the CPU and on a GPU faiss can use; the torch sort on a CUDA
            matrix that only faiss-cpu could search (no copy to the host) and wherever faiss does
            not import.
        block_bytes: bound on the working memory of one block of query rows.
        progress: tqdm bar over blocks (None: when N >= 8192).
    Returns (indices (N, k) int64, distances (N, k) float32) on ``matrix``'s device.
    Raises UsageError for a bad k, metric, backend, shape, or NaN/Inf entries.
    """
    x = check_matrix(matrix)
    n = x.shape[0]
    k = check_k(k, n)
    metric = check_metric(metric)
    if backend not in ("auto", "faiss", "torch"):
        raise UsageError(f"backend must be auto, faiss or torch, got {backend!r}")
    device = x.device
    gpu = _faiss_gpu_ok(device)
    if backend == "auto":
        faiss_here = gpu if device.type == "cuda" else _faiss_importable()
        backend = "faiss" if k + 1 <= FAISS_MAX_K and faiss_here else "torch"
    if backend == "faiss" and gpu and k + 1 > FAISS_MAX_K:
        raise UsageError(f"faiss on GPU returns at most {FAISS_MAX_K - 1} neighbours; use backend='auto' or 'torch'")
    xs = _prepare(x, metric)
    use_faiss = backend == "faiss" and metric != "random"
    database = (xs if gpu else xs.cpu().numpy()) if use_faiss else None  # copied off the GPU once, not per block
    # bytes per query row: (b, N) distances + sort outputs, or faiss's (b, k+1) results and their reorderings
    per_row = 64 * (k + 1) + 4 * min(n, 4096) if use_faiss else 16 * n
    block = RANDOM_CHUNK if metric == "random" else int(max(1, min(n, block_bytes // per_row)))
    indices = torch.empty(n, k, dtype=torch.long, device=device)
    distances = torch.empty(n, k, dtype=torch.float32, device=device)
    show = (n >= 8192) if progress is None else progress
    starts = range(0, n, block)
    for s in tqdm(starts, desc=f"neighbourhoods ({metric}, k={k})", unit="block", disable=not show, leave=False):
        rows = torch.arange(s, min(n, s + block), device=device)
        q = xs[s : s + len(rows)]
        if metric == "random":
            D, I = _random_block(q, xs, rows, k, seed)
        elif backend == "torch":
            D, I = _torch_block(q, xs, rows, k, metric)
        else:
            scores, cand = faiss_search(q, database, k + 1, metric, gpu)
            D, I = drop_self(to_distance(scores, metric), cand, rows, k)
        indices[s : s + len(rows)] = I
        distances[s : s + len(rows)] = D
    return indices, distances
