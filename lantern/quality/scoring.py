"""Scoring one image set against a reference: the protocol, cached reference statistics, metric rows.

:class:`QualityProtocol` holds every choice that changes a number (reference and its subset, k of the
k-NN metrics, bootstrap count, interval level, seeds, the size of the precision/recall
reference, CLIP settings); :func:`protocol_record` is what every result carries.

Reference statistics (features, mean and covariance with its square root, the KID reference
term) are cached on disk per (reference, extractor, protocol) under ``--cache``
(default ``$LANTERN_EVAL_CACHE`` or ``~/.cache/lantern-ambiguity/reference-stats``), as a run
directory (:class:`ambiguity.runs.RunDir`) whose settings are the reference's fingerprint and
the extractor's record, including the SHA-256 of its weights; a changed file is recomputed.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ambiguity.run_records import settings_digest
from ambiguity.runs import RunDir
from ambiguity.seeding import SEED_TAGS, derived_seed
from lantern.quality import metrics as M
from lantern.quality.features import DEFAULT_REPOS, Extractor, extract
from lantern.quality.sources import ImageSet

__all__ = [
    "QualityProtocol",
    "protocol_record",
    "RefStats",
    "cache_dir",
    "reference_stats",
    "feature_metrics",
    "value_metrics",
    "metric_name",
    "paired_differences",
    "BOOTSTRAP_TAG",
    "PRDC_TAG",
    "PAPER_SAMPLE_SIZES",
]

BOOTSTRAP_TAG, PRDC_TAG = SEED_TAGS["quality-bootstrap"], SEED_TAGS["quality-prdc-reference"]
BOUNDED = ("precision", "recall", "coverage", "token_match_vs_reference", "class_consistency")
# Sample sizes to compare FIDs with. LANTERN's Table 2 (Jang et al. 2025) does not state n next to
# the table; its official evaluation prompts are the MS-COCO 2017 validation captions, 5k images
# (one caption per image; jadohu/LANTERN#9 reproduces with all 5,000). LlamaGen's text-to-image
# FID uses 30k MS-COCO 2014 validation captions; ImageNet c2i FIDs use 50k samples against the
# training-set statistics (ADM suite).
PAPER_SAMPLE_SIZES = {
    "LANTERN t2i, MS-COCO 2017 val": 5000,
    "LlamaGen t2i, MS-COCO 2014 val": 30000,
    "ImageNet c2i": 50000,
}


@dataclass
class QualityProtocol:
    """Everything that changes a score besides the images and the extractor.

    reference: source spec (see :mod:`lantern.quality.sources`); k: neighbours of the k-NN
    metrics (3, Kynkäänniemi et al. 2019); bootstrap: groups of the delete-a-group jackknife
    behind the intervals, at most n (0: no intervals; the name is the CLI's ``--bootstrap``); level:
    interval coverage; seed: subsets and resamples; prdc_reference: ``"matched"`` (a seeded
    reference subset of the generated set's size, as Kynkäänniemi et al. and Naeem et al.
    compare equal sizes) or ``"full"``; clip_*: CLIP score settings; hps: try HPS v2.1.
    """

    reference: str = "fashion-mnist:test"
    k: int = 3
    bootstrap: int = 100
    level: float = 0.95
    seed: int = 0
    prdc_reference: str = "matched"
    clip_score: bool = False
    clip_model: str = DEFAULT_REPOS["clip"]
    clip_scale: str = "cosine"
    prompt_template: str = "a photo of a {}"
    hps: bool = False


def protocol_record(
    p: QualityProtocol, reference: Optional[ImageSet] = None, caption_rule: Optional[str] = None
) -> dict:
    """The protocol as recorded in results: settings, seeds, the interval scheme with its measured
    coverage, the caption rule that was applied (``caption_rule``; without one: none, unless a text
    metric is asked for) and the reference's facts."""
    rec = asdict(p)
    rec["seeds"] = {
        "subsets": f"derived_seed({p.seed}, {SEED_TAGS['quality-subset']})",
        "bootstrap": f"derived_seed({p.seed}, {BOOTSTRAP_TAG})",
        "prdc_reference_subset": f"derived_seed({p.seed}, {PRDC_TAG})",
    }
    rec["bootstrap_scheme"] = (
        "delete-a-group jackknife over the generated images (min(bootstrap, n) seeded groups, "
        "one left out at a time; reference fixed; k-NN radii from the full sets): estimate "
        "± t_(G-1) jackknife SE, clipped to the metric's range; precision (and 0/1 per-image "
        "values): Wilson score interval; for the metric's expected value at this n, not a "
        f"small-n bias correction; {M.COVERAGE_NOTE}"
    )
    rec["caption_rule"] = caption_rule or (
        "none: no text metric was asked for (--clip-score, --hps)"
        if not (p.clip_score or p.hps)
        else "captions as each set's images were generated; class labels through the prompt template"
    )
    if reference is not None:
        rec["reference_set"] = {
            "spec": reference.spec,
            "images": reference.n,
            "fingerprint": reference.fingerprint,
            "size": list(reference.images.shape[1:]),
            **{k: v for k, v in reference.info.items() if k != "class_names"},
        }
    return rec


def cache_dir(cache: Optional[str | Path] = None) -> Path:
    """The reference-statistics cache directory (module docstring)."""
    return Path(
        cache or os.environ.get("LANTERN_EVAL_CACHE") or "~/.cache/lantern-ambiguity/reference-stats"
    ).expanduser()


@dataclass
class RefStats:
    """Reference features (M, D) float32 and the statistics derived from them."""

    features: np.ndarray
    fid: M.FidReference
    kid: M.KidReference


_MEMORY: dict[str, RefStats] = {}


def _stats(features: np.ndarray) -> RefStats:
    return RefStats(features, M.fid_reference(features), M.kid_reference(features))


def reference_stats(
    ref: ImageSet, ex: Extractor, cache: Optional[str | Path] = None, batch_size: int = 64, use_cache: bool = True
) -> RefStats:
    """Features and statistics of the reference under extractor ``ex``, cached in memory and on
    disk (module docstring; ``use_cache=False`` computes without touching the disk)."""
    settings = {
        "reference": ref.spec,
        "fingerprint": ref.fingerprint,
        "shape": list(ref.images.shape),
        "extractor": ex.describe(),
    }
    key = settings_digest(settings)
    if key in _MEMORY:
        return _MEMORY[key]
    run = None
    if use_cache:
        run = RunDir(cache_dir(cache) / f"{ex.name}-{key}", settings, command="lantern.evaluate reference statistics")
        run.open(overwrite=run.stored() is not None and run.stored().get("settings") != run.settings)
        part = run.read_part("stats", {"images": ref.n})
        if part is not None:
            t = part.tensors["stats"]
            fid = M.FidReference(t["mu"].numpy(), t["sigma"].numpy(), t["sqrt_sigma"].numpy(), ref.n)
            out = RefStats(t["features"].numpy(), fid, M.KidReference(M.as_f64(t["features"]), float(t["mean_kyy"])))
            _MEMORY[key] = out
            return out
    feats = extract(ref.images, ex, batch_size)
    out = _stats(feats)
    if run is not None:
        run.write_part(
            "stats",
            {"images": ref.n},
            tensors={
                "stats": {
                    "features": torch.from_numpy(feats),
                    "mu": torch.from_numpy(out.fid.mu),
                    "sigma": torch.from_numpy(out.fid.sigma),
                    "sqrt_sigma": torch.from_numpy(out.fid.sqrt_sigma),
                    "mean_kyy": torch.tensor(out.kid.mean_kyy, dtype=torch.float64),
                }
            },
        )
    _MEMORY[key] = out
    return out


def metric_name(metric: str, extractor: Optional[str]) -> str:
    """``fid`` + ``mobilenet`` -> ``fid_mobilenet``; metrics without an extractor keep their name."""
    return f"{metric}_{extractor}" if extractor else metric


def _row(
    metric: str,
    extractor: Optional[str],
    full: float,
    resampled: np.ndarray,
    n: int,
    p: QualityProtocol,
    proportion: bool = False,
) -> dict:
    """One metric row; ``resampled``: the leave-one-group-out values; ``proportion``: ``full`` is a
    mean of n independent 0/1 outcomes (Wilson score interval)."""
    if not len(resampled):
        lo, hi = float("nan"), float("nan")
    elif proportion:
        lo, hi = M.wilson_interval(float(full), n, p.level)
    else:
        bounds = (0.0, 1.0) if metric in BOUNDED else M.RANGES.get(metric, (-np.inf, np.inf))
        lo, hi = M.jackknife_interval(resampled, float(full), p.level, bounds)
    return {
        "metric": metric_name(metric, extractor),
        "extractor": extractor or "",
        "value": float(full),
        "ci_low": lo,
        "ci_high": hi,
        "n": int(n),
        "bootstrap": int(len(resampled)),
        "resamples": np.asarray(resampled, np.float64),
    }


def resample_counts(n: int, p: QualityProtocol) -> Optional[np.ndarray]:
    """The jackknife weights (G, n) shared by every metric of a set (None without intervals or
    with fewer than 2 images): :func:`lantern.quality.metrics.jackknife_counts`."""
    if not p.bootstrap or n < 2:
        return None
    return M.jackknife_counts(n, max(int(p.bootstrap), 2), derived_seed(p.seed, BOOTSTRAP_TAG))


def feature_metrics(feats: np.ndarray, stats: RefStats, p: QualityProtocol, extractor: str) -> list[dict]:
    """FID (Fréchet distance), KID, precision, recall, density and coverage of generated
    features (N, D) against ``stats``, each with its interval (module :mod:`lantern.quality.metrics`)
    -> metric rows (dicts with metric, extractor, value, ci_low, ci_high, n, bootstrap (the
    jackknife groups), reference_images and ``resamples``: the (G,) leave-one-group-out values;
    group g holds the same image indices in every set of the same n and seed, so two runs are
    paired image by image)."""
    x = M.as_f64(feats)
    n = len(x)
    counts = resample_counts(n, p)
    rows = []
    fid = M.fid_values(x, stats.fid)[0]
    rows.append(_row("fid", extractor, fid, M.fid_values(x, stats.fid, counts) if counts is not None else [], n, p))
    kid = M.kid_values(x, stats.kid)[0]
    rows.append(_row("kid", extractor, kid, M.kid_values(x, stats.kid, counts) if counts is not None else [], n, p))
    real = stats.features
    if p.prdc_reference == "matched" and len(real) > n:
        g = np.random.default_rng(derived_seed(p.seed, PRDC_TAG))
        real = real[np.sort(g.choice(len(real), n, replace=False))]
    terms = M.prdc_terms(real, x, p.k)
    full = M.prdc_values(terms)
    boot = M.prdc_values(terms, counts) if counts is not None else {}
    for name in ("precision", "recall", "density", "coverage"):
        rows.append(_row(name, extractor, full[name][0], boot.get(name, []), n, p, proportion=name == "precision"))
    for r in rows[2:]:
        r["reference_images"] = int(len(real))
    for r in rows[:2]:
        r["reference_images"] = int(stats.fid.n)
    return rows


def value_metrics(values: dict[str, np.ndarray], p: QualityProtocol) -> list[dict]:
    """Means of per-image values (CLIP score, HPS, proxies) with intervals -> metric rows (0/1
    values: Wilson score interval; others: jackknife, :func:`_row`)."""
    rows = []
    for name, v in values.items():
        v = np.asarray(v, np.float64)
        ok = np.isfinite(v)
        v = v[ok]
        if not len(v):
            continue
        counts = resample_counts(len(v), p)
        rows.append(
            _row(
                name,
                None,
                v.mean(),
                M.mean_values(v, counts) if counts is not None else [],
                len(v),
                p,
                proportion=bool(np.isin(v, (0.0, 1.0)).all()),
            )
        )
    return rows


def paired_differences(base: dict, other: dict, level: float = 0.95) -> dict:
    """Difference ``other - base`` of one metric for two sets of the same n and seed.

    base, other: {"value": float, "resamples": (G,)} (rows of :func:`feature_metrics`). The
    leave-one-group-out values are paired (same image indices, hence same seeds and conditions),
    so the jackknife interval of the per-group differences
    (:func:`lantern.quality.metrics.jackknife_interval`, unclipped) is far narrower than the two
    separate intervals. Returns {diff, ci_low, ci_high, p_greater} (p_greater: the t
    approximation of P(difference > 0), ``t_{G-1}`` cdf of diff / se); NaN without resamples.
    """
    from scipy import stats  # here, not at the top: its import takes a second that a resumed run need not pay

    d = float(other["value"]) - float(base["value"])
    a, b = np.asarray(base["resamples"], np.float64), np.asarray(other["resamples"], np.float64)
    if len(a) < 2 or len(a) != len(b):
        return {"diff": d, "ci_low": float("nan"), "ci_high": float("nan"), "p_greater": float("nan")}
    lo, hi = M.jackknife_interval(b - a, d, level)
    g = len(a)
    se = float(np.sqrt((g - 1) / g * (((b - a) - (b - a).mean()) ** 2).sum()))
    p_greater = float(stats.t.cdf(d / se, g - 1)) if se > 0 else float(np.sign(d) / 2 + 0.5)
    return {"diff": d, "ci_low": lo, "ci_high": hi, "p_greater": p_greater}
