"""Distribution metrics on feature vectors: FID / FD, KID, precision, recall, density, coverage, bootstrap.

All functions take features as (N, D) arrays (numpy or torch, any float dtype; computed in
float64) — one row per image, from one extractor (:mod:`lantern.quality.features`). A score is
only comparable with scores from the same extractor, reference set and protocol.

* **Fréchet distance** (Heusel et al. 2017, "GANs trained by a two time-scale update rule",
  Eq. 6): ``||mu_x - mu_r||^2 + tr(S_x + S_r - 2 (S_r^1/2 S_x S_r^1/2)^1/2)`` between Gaussians
  fitted to the two sets (unbiased covariances). With Inception pool3 features it is the FID;
  with DINOv2 it is FD-DINOv2 (Stein et al. 2023). It is biased upward at small n (Chong &
  Forsyth 2020): only compare scores at the same n (sizes used in papers:
  :data:`lantern.quality.scoring.PAPER_SAMPLE_SIZES`, ``docs/evaluate.md``).
* **KID** (Bińkowski et al. 2018, "Demystifying MMD GANs", Sec. 3): the unbiased MMD^2 with the
  cubic polynomial kernel ``k(x, y) = (x.y / D + 1)^3``, here on the full sets (torchmetrics'
  ``KernelInceptionDistance`` with one subset of the full size gives the same number).
* **Improved precision and recall** (Kynkäänniemi et al. 2019, Sec. 3, k = 3) and **density and
  coverage** (Naeem et al. 2020, Eqs. 3-4): each set's manifold is the union of balls around its
  samples with radius the distance to the sample's k-th nearest neighbour (itself excluded),
  found with FAISS and recomputed exactly in float64. Ties follow the ``prdc`` package (strict
  ``<``); the numbers equal ``prdc.compute_prdc`` on the same features.
* **Intervals** (:func:`jackknife_counts`, :func:`jackknife_interval`, :func:`wilson_interval`):
  the estimand is the metric's expected value at the same n with the reference held fixed
  (the reference statistics are cached; the k-NN radii come from the full sets), i.e. how much
  the score moves between generated sets of the same n, and so whether two runs evaluated at
  equal n differ; it is not an interval for the infinite-sample FID, which lies below every
  small-n estimate. The generated set is split into G random groups (seeded) and every metric
  recomputed with one group left out (the delete-a-group jackknife; G = n: the classic
  jackknife); the interval is ``estimate ± t_{G-1} · se_jack`` clipped to the metric's range
  (FID and density >= 0, precision / recall / coverage in [0, 1]; KID is not clipped: it is an
  unbiased estimate of MMD² that is negative when the sets are alike at this n). Precision, a
  mean of independent 0/1 indicators once the reference radii are fixed, gets the Wilson score
  interval, which stays honest at 0 or 1 (``1 [1, 1]`` at tiny n otherwise).
  Why not the bootstrap: resampling with replacement duplicates images, which shrinks k-NN
  radii and sets (recall and coverage then covered their true value 76.5 % of the time in a
  simulation with known distributions) and inflates Fréchet distances; the shifted percentile
  interval also reached below zero for FID. The jackknife never duplicates an image and, by the
  Efron–Stein inequality (Efron & Stein 1981), its variance estimate is conservative for any
  symmetric statistic — the k-NN set metrics (recall, coverage) included; the simulation in
  ``tests/test_evaluate_metrics.py`` checks every metric's coverage against a known answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import faiss
import numpy as np

from ambiguity.errors import UsageError
from ambiguity.memory import check_count

__all__ = [
    "as_f64",
    "gaussian_stats",
    "frechet_distance",
    "psd_sqrt",
    "FidReference",
    "fid_reference",
    "fid_values",
    "poly_kernel",
    "KidReference",
    "kid_reference",
    "kid_values",
    "knn_radii",
    "pairwise_distances",
    "PrdcTerms",
    "prdc_terms",
    "prdc_values",
    "bootstrap_indices",
    "percentile_interval",
    "jackknife_counts",
    "jackknife_interval",
    "wilson_interval",
    "RANGES",
    "COVERAGE_NOTE",
    "mean_values",
]

# What the jackknife intervals of the distribution metrics cover, measured (docs/evaluate.md cites it)
COVERAGE_NOTE = (
    "measured coverage of the FID and KID jackknife intervals: 0.915-0.935 at nominal 0.95 (an independent "
    "simulation, 1,000 replications at n = 100 and 500), every miss with the true value above the interval "
    "(the statistic's right skew makes the symmetric t interval short on the high side)"
)


def as_f64(x) -> np.ndarray:
    """Features -> a C-contiguous float64 numpy array (N, D); UsageError for another rank or non-finite values."""
    a = np.ascontiguousarray(x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x), dtype=np.float64)
    if a.ndim != 2:
        raise UsageError(f"features must be a (N, D) matrix, got shape {a.shape}")
    if not np.isfinite(a).all():
        raise UsageError("features hold NaN or inf values; check the images (pixels must be finite, in [0, 1])")
    return a


# --------------------------------------------------------------------------- Fréchet distance
def gaussian_stats(x) -> tuple[np.ndarray, np.ndarray]:
    """(N, D) features -> (mean (D,), unbiased covariance (D, D)), float64. Needs N >= 2."""
    a = as_f64(x)
    if len(a) < 2:
        raise UsageError(f"a Fréchet distance needs at least 2 images per set, got {len(a)}")
    return a.mean(0), np.cov(a, rowvar=False).reshape(a.shape[1], a.shape[1])


def psd_sqrt(s: np.ndarray) -> np.ndarray:
    """Symmetric square root of a symmetric positive semi-definite matrix (eigenvalues clipped at 0)."""
    w, v = np.linalg.eigh((s + s.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def frechet_distance(mu1, sigma1, mu2, sigma2) -> float:
    """Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2) (Heusel et al. 2017, Eq. 6).

    mu: (D,), sigma: (D, D) symmetric PSD. The trace term is computed as the sum of square roots
    of the eigenvalues of the symmetric matrix sigma2^1/2 sigma1 sigma2^1/2 (same spectrum as
    sigma1 sigma2, numerically stabler than a general sqrtm). Returns a float >= 0 (squared units
    of the features).
    """
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    s1, s2 = np.asarray(sigma1, np.float64), np.asarray(sigma2, np.float64)
    r = psd_sqrt(s2)
    w = np.linalg.eigvalsh(r @ s1 @ r)
    tr = float(np.sqrt(np.clip(w, 0, None)).sum())
    return max(0.0, float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * tr))


@dataclass
class FidReference:
    """Cached reference statistics: mean (D,), covariance (D, D) and its symmetric square root."""

    mu: np.ndarray
    sigma: np.ndarray
    sqrt_sigma: np.ndarray
    n: int


def fid_reference(features) -> FidReference:
    """Statistics of reference features (N, D) for :func:`fid_values`."""
    mu, sigma = gaussian_stats(features)
    return FidReference(mu, sigma, psd_sqrt(sigma), len(as_f64(features)))


def _weighted_fd(x: np.ndarray, w: np.ndarray, ref: FidReference, gram: Optional[np.ndarray]) -> float:
    """Fréchet distance of the multiset with counts ``w`` over rows of ``x`` to ``ref``."""
    n = w.sum()
    mu = (w @ x) / n
    tr_ref = float(np.trace(ref.sigma))
    if gram is not None:  # N < D: the spectrum of the N x N Gram matrix (counts folded in)
        # W^1/2 Xc S_r Xc^T W^1/2 with Xc = X - 1 mu^T, from the Gram matrix G = X S_r X^T
        g = gram
        gm = g @ w / n  # X S_r mu
        c = g - gm[:, None] - gm[None, :] + (w @ gm) / n
        sw = np.sqrt(w)
        m = (sw[:, None] * c * sw[None, :]) / (n - 1)
        lam = np.linalg.eigvalsh(m)
        xc = x - mu
        tr_x = float((w * (xc**2).sum(1)).sum() / (n - 1))
    else:
        xc = x - mu
        sx = (xc * w[:, None]).T @ xc / (n - 1)
        lam = np.linalg.eigvalsh(ref.sqrt_sigma @ sx @ ref.sqrt_sigma)
        tr_x = float(np.trace(sx))
    tr = float(np.sqrt(np.clip(lam, 0, None)).sum())
    return max(0.0, float(((mu - ref.mu) ** 2).sum() + tr_x + tr_ref - 2 * tr))


def fid_values(x, ref: FidReference, counts: Optional[np.ndarray] = None) -> np.ndarray:
    """Fréchet distances of the generated features ``x`` (N, D) to ``ref``, one per row of
    ``counts`` ((B, N) int: how often each image is drawn in a resample; None: the full set once).

    For N < D the trace term uses the N x N matrix W^1/2 Xc S_r Xc^T W^1/2 (same non-zero
    spectrum as S_r^1/2 S_x S_r^1/2), so a resample costs one N x N eigendecomposition.
    Returns (B,) float64 (or (1,) without ``counts``).
    """
    x = as_f64(x)
    if x.shape[1] != ref.mu.shape[0]:
        raise UsageError(
            f"features have {x.shape[1]} dimensions but the reference statistics {ref.mu.shape[0]}; "
            f"use the same extractor for both"
        )
    counts = np.ones((1, len(x))) if counts is None else np.asarray(counts, np.float64)
    gram = None
    if len(x) < x.shape[1]:
        gram = x @ ref.sigma @ x.T
    return np.array([_weighted_fd(x, w, ref, gram) for w in counts])


# --------------------------------------------------------------------------- KID
def poly_kernel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Cubic polynomial kernel ``(x.y / D + 1)^3`` (Bińkowski et al. 2018), (N, D) x (M, D) -> (N, M)."""
    return (x @ y.T / x.shape[1] + 1.0) ** 3


@dataclass
class KidReference:
    """The reference features (M, D) and the mean of k(y_i, y_j) over i != j."""

    features: np.ndarray
    mean_kyy: float


def kid_reference(features, block: int = 2048) -> KidReference:
    """Reference term of KID, summed in row blocks (never an M x M matrix in memory)."""
    y = as_f64(features)
    m = len(y)
    if m < 2:
        raise UsageError(f"KID needs at least 2 reference images, got {m}")
    total = 0.0
    for s in range(0, m, block):
        k = poly_kernel(y[s : s + block], y)
        total += k.sum() - np.einsum("ii->", k[:, s : s + block])
    return KidReference(y, total / (m * (m - 1)))


def kid_values(x, ref: KidReference, counts: Optional[np.ndarray] = None) -> np.ndarray:
    """Unbiased MMD^2 (KID) of generated features ``x`` (N, D) against ``ref``, per resample.

    counts: (B, N) draws per image (None: the full set). Pairs of the same image (i == j, and
    the duplicates of a resample) are left out of the within-set term, as the diagonal is in the
    unbiased estimator. Returns (B,) float64.
    """
    x = as_f64(x)
    if x.shape[1] != ref.features.shape[1]:
        raise UsageError(
            f"features have {x.shape[1]} dimensions but the reference {ref.features.shape[1]}; "
            f"use the same extractor for both"
        )
    if len(x) < 2:
        raise UsageError(f"KID needs at least 2 generated images, got {len(x)}")
    kxx = poly_kernel(x, x)
    kxy = np.concatenate(
        [poly_kernel(x, ref.features[s : s + 4096]).sum(1, keepdims=True) for s in range(0, len(ref.features), 4096)], 1
    ).sum(1) / len(ref.features)
    diag = np.diag(kxx)
    counts = np.ones((1, len(x))) if counts is None else np.asarray(counts, np.float64)
    out = []
    for c in counts:
        n = c.sum()
        pairs = n * n - (c**2).sum()  # 0 when a resample drew one image only: no within-set pair
        xx = (c @ kxx @ c - (c**2 * diag).sum()) / pairs if pairs > 0 else np.nan
        out.append(xx + ref.mean_kyy - 2 * (c @ kxy) / n)
    return np.array(out)


# --------------------------------------------------------------------------- k-NN metrics
def pairwise_distances(a: np.ndarray, b: np.ndarray, block: int = 4096) -> np.ndarray:
    """Euclidean distances (N, M) float64, in row blocks of ``a``."""
    bb = (b**2).sum(1)
    out = np.empty((len(a), len(b)))
    for s in range(0, len(a), block):
        blk = a[s : s + block]
        d2 = (blk**2).sum(1)[:, None] + bb[None, :] - 2 * blk @ b.T
        out[s : s + block] = np.sqrt(np.clip(d2, 0, None))
    return out


def knn_radii(x, k: int = 3) -> np.ndarray:
    """Distance of each row to its k-th nearest other row, (N,) float64.

    Neighbours are found with an exact FAISS index (float32 L2) and the distance to the k-th is
    recomputed in float64. Raises UsageError when there are not more than k rows.
    """
    x = as_f64(x)
    if len(x) <= k:
        raise UsageError(
            f"--nearest-k {k} (k-NN radii) needs more than {k} images per set, got {len(x)}; lower --nearest-k"
        )
    index = faiss.IndexFlatL2(x.shape[1])
    xf = np.ascontiguousarray(x, dtype=np.float32)
    index.add(xf)
    _, nn = index.search(xf, k + 1)
    # the row itself is among the k + 1 (distance 0) unless exact duplicates tie with it
    out = np.empty(len(x))
    for s in range(0, len(x), 1024):
        d = np.sqrt(((x[s : s + 1024, None, :] - x[nn[s : s + 1024]]) ** 2).sum(-1))  # (block, k + 1) float64
        out[s : s + 1024] = np.sort(d, axis=1)[:, k]
    return out


@dataclass
class PrdcTerms:
    """Per-sample pieces of precision/recall/density/coverage for one (reference, generated) pair.

    real_radii (M,), fake_radii (N,), dist (M, N) float64 real-to-fake distances, k.
    """

    real_radii: np.ndarray
    fake_radii: np.ndarray
    dist: np.ndarray
    k: int


def prdc_terms(real, fake, k: int = 3, real_radii: Optional[np.ndarray] = None) -> PrdcTerms:
    """Radii of both sets and the real-to-fake distance matrix (``real_radii`` may come from a cache)."""
    r, f = as_f64(real), as_f64(fake)
    if r.shape[1] != f.shape[1]:
        raise UsageError(f"features have {f.shape[1]} dimensions but the reference {r.shape[1]}; use one extractor")
    rr = knn_radii(r, k) if real_radii is None else np.asarray(real_radii, np.float64)
    return PrdcTerms(rr, knn_radii(f, k), pairwise_distances(r, f), k)


def prdc_values(t: PrdcTerms, counts: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
    """precision, recall, density, coverage (Kynkäänniemi et al. 2019; Naeem et al. 2020), per resample.

    counts: (B, N) draws per generated image (None: the full set). Returns {name: (B,) float64}.
    """
    inside_real = t.dist < t.real_radii[:, None]  # (M, N): fake j inside real ball i
    per_fake_any = inside_real.any(0).astype(np.float64)  # precision indicator per fake
    per_fake_count = inside_real.sum(0).astype(np.float64)  # density count per fake
    inside_fake = t.dist < t.fake_radii[None, :]  # (M, N): real i inside fake ball j
    covered = t.dist < t.real_radii[:, None]  # nearest-fake test uses the real radius
    counts = np.ones((1, t.dist.shape[1])) if counts is None else np.asarray(counts, np.float64)
    out = {"precision": [], "recall": [], "density": [], "coverage": []}
    for c in counts:
        n = c.sum()
        sel = c > 0
        out["precision"].append(c @ per_fake_any / n)
        out["density"].append(c @ per_fake_count / (t.k * n))
        out["recall"].append(inside_fake[:, sel].any(1).mean())
        out["coverage"].append(covered[:, sel].any(1).mean())
    return {k: np.asarray(v) for k, v in out.items()}


# --------------------------------------------------------------------------- bootstrap
def bootstrap_indices(n: int, b: int, seed: int) -> np.ndarray:
    """(b, n) float64 counts: how often each of n items is drawn in each of b resamples with
    replacement (numpy's PCG64 seeded with ``seed``). Raises UsageError when they do not fit in memory."""
    check_count(b, 3 * 8 * n, "--bootstrap", f"the resample counts of {n} images")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(b, n))
    return np.stack([np.bincount(i, minlength=n) for i in idx]).astype(np.float64)


def percentile_interval(values: np.ndarray, level: float = 0.95, center: Optional[float] = None) -> tuple[float, float]:
    """Bootstrap interval (lo, hi) from resampled values (NaN when there are none).

    Without ``center``: the plain percentile interval. With ``center`` (the full-sample
    estimate): the percentile interval of the resampled values shifted by ``center - mean``,
    i.e. the sampling spread of the estimate at its n around the estimate itself. Resampling
    with replacement duplicates images, which inflates Fréchet distances (fewer distinct
    images); the shift removes that artefact. Neither corrects an estimator's own small-n bias.
    """
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return float("nan"), float("nan")
    a = (1 - level) / 2
    shift = 0.0 if center is None else float(center) - float(v.mean())
    return float(np.quantile(v, a)) + shift, float(np.quantile(v, 1 - a)) + shift


# --------------------------------------------------------------------------- jackknife intervals
# The range of each metric's value: intervals are clipped to it (KID, an unbiased MMD² estimate, has none).
RANGES = {
    "fid": (0.0, np.inf),
    "kid": (-np.inf, np.inf),
    "precision": (0.0, 1.0),
    "recall": (0.0, 1.0),
    "density": (0.0, np.inf),
    "coverage": (0.0, 1.0),
}


def jackknife_counts(n: int, groups: int, seed: int) -> np.ndarray:
    """(G, n) float64 weights of the delete-a-group jackknife: the n items are dealt into
    G = min(groups, n) random groups (numpy's PCG64 seeded with ``seed``; sizes differ by at most
    one) and row g keeps every item but group g's (weight 1) — no item is ever duplicated.
    Raises UsageError when ``groups < 2`` or ``n < 2`` or they do not fit in memory."""
    if groups < 2 or n < 2:
        raise UsageError(f"a jackknife interval needs at least 2 groups and 2 images, got {groups} groups, {n} images")
    g = min(int(groups), int(n))
    check_count(g, 8 * n, "--bootstrap", f"the jackknife weights of {n} images")
    group = np.random.default_rng(seed).permutation(n) % g
    return (group[None, :] != np.arange(g)[:, None]).astype(np.float64)


def jackknife_interval(
    values: np.ndarray, estimate: float, level: float = 0.95, bounds: tuple[float, float] = (-np.inf, np.inf)
) -> tuple[float, float]:
    """Interval (lo, hi) for the expected value of a statistic at its n from its G leave-one-group-out
    values (G,) float: ``estimate ± t_{G-1, (1+level)/2} · se`` with the delete-a-group jackknife
    standard error ``se = sqrt((G-1)/G · Σ_g (v_g - mean v)²)`` (Efron & Stein 1981: conservative
    for any symmetric statistic), clipped to ``bounds`` (the metric's range). NaN without values.

    Measured coverage (:data:`COVERAGE_NOTE`): for FID and KID an independent simulation (1,000
    replications, n = 100 and 500) covered the expected value 0.915-0.935 of the time at nominal
    0.95, every miss with the truth above the interval: read a 95 % interval of FID or KID as about
    a 92 % one, short on its upper side. Precision / recall / density / coverage are checked in
    ``tests/test_evaluate_metrics.py``."""
    from scipy import stats  # here, not at the top: its import takes a second that a resumed run need not pay

    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    g = len(v)
    if g < 2 or not np.isfinite(estimate):
        return float("nan"), float("nan")
    se = float(np.sqrt((g - 1) / g * ((v - v.mean()) ** 2).sum()))
    h = float(stats.t.ppf((1 + level) / 2, g - 1)) * se
    lo, hi = float(np.clip(estimate - h, *bounds)), float(np.clip(estimate + h, *bounds))
    return lo, hi


def wilson_interval(p_hat: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval (Wilson 1927) for a proportion ``p_hat`` of n independent 0/1
    outcomes: inside [0, 1], and not degenerate at p_hat = 0 or 1 (e.g. 4 of 4: [0.51, 1])."""
    from scipy import stats  # here, not at the top: its import takes a second that a resumed run need not pay

    if n < 1 or not np.isfinite(p_hat):
        return float("nan"), float("nan")
    z = float(stats.norm.ppf((1 + level) / 2))
    z2 = z * z
    centre = (p_hat + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * np.sqrt(max(p_hat * (1 - p_hat), 0.0) / n + z2 / (4 * n * n))
    # the interval holds p_hat; min / max keep it so against rounding at p_hat = 0 or 1
    return float(max(min(centre - half, p_hat), 0.0)), float(min(max(centre + half, p_hat), 1.0))


def mean_values(per_item, counts: Optional[np.ndarray] = None) -> np.ndarray:
    """Mean of per-image values (N,) per resample -> (B,) (proxies, CLIP score, HPS)."""
    v = np.asarray(per_item, np.float64)
    counts = np.ones((1, len(v))) if counts is None else np.asarray(counts, np.float64)
    return counts @ v / counts.sum(1)
