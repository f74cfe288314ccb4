"""The metric rows of one image set in an evaluation (:mod:`lantern.evaluate`), each (set,
extractor) pair and the per-image values saved as a part of the run directory when done, so
that an interrupted evaluation resumes and a sharded one splits its feature extraction."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd
import torch

from ambiguity.cli import safe_name
from ambiguity.distributed import SINGLE, Shard
from ambiguity.runs import RunDir, assemble_units, shard_units
from lantern.quality.features import Extractor, extract, locate_weights
from lantern.quality.scoring import QualityProtocol, feature_metrics, reference_stats, value_metrics
from lantern.quality.sources import ImageSet
from lantern.quality.text import clip_scores, hps_scores, prompts_for
from lantern.run_reader import image_quality, load_run, target_scores

__all__ = [
    "score_set",
    "set_features",
    "text_values",
    "conditions_are_labels",
    "caption_rule",
    "proxy_values",
    "ROW_COLUMNS",
    "PART_FORMAT",
]

ROW_COLUMNS = ["metric", "extractor", "value", "ci_low", "ci_high", "n", "bootstrap"]
PART_FORMAT = 3  # parts hold the metric rows, the leave-one-group-out (jackknife) values and the features


def conditions_are_labels(s: ImageSet) -> Optional[bool]:
    """Whether the set's conditions are class labels (a data set, a class-conditional run: True),
    captions (a text-to-image or text run: False), or unknown (None: told by their form,
    :func:`lantern.quality.text.prompts_for`)."""
    if s.info.get("kind") == "dataset":
        return True
    kind = s.info.get("model_kind")
    return True if kind == "c2i" else False if kind in ("t2i", "text") else None


def caption_rule(s: ImageSet, p: QualityProtocol, class_names=None) -> str:
    """The rule that gave the set's images their CLIP / HPS prompts, as recorded in ``evaluation.json``."""
    if not (p.clip_score or p.hps):
        return "none: no text metric was asked for (--clip-score, --hps)"
    names = class_names or s.info.get("class_names")
    if prompts_for(s.conditions, names, p.prompt_template, conditions_are_labels(s)) is None:
        return "none: no captions or class names for its images (CLIP score / HPS skipped)"
    if conditions_are_labels(s) or (conditions_are_labels(s) is None and all(str(c).isdigit() for c in s.conditions)):
        source = "--class-names" if class_names else "the set's own"
        return f"class labels through the template {p.prompt_template!r} with {source} class names"
    captions = s.info.get("captions")
    if not captions:
        return "each image's condition as generated (the model's default prompts)"
    digest = s.info.get("captions_sha256")
    form = "MS-COCO JSON: longest caption per image" if str(captions).endswith(".json") else "one caption per line"
    return (
        f"each image's caption as generated: a seeded subset (lantern.generate --seed {s.info.get('seed')}) of "
        f"{captions} ({form}; sha256 {digest[:16] if digest else 'not recorded by that run'})"
    )


def text_values(s: ImageSet, p: QualityProtocol, weights: dict, device, class_names) -> tuple[dict, list[str]]:
    """Per-image text-alignment values of a set ({"clip_score" / "hps_v2.1": (N,) array}, as
    ``p`` asks) and notes (a set without captions or class names is skipped with a note)."""
    values, notes = {}, []
    if not (p.clip_score or p.hps):
        return values, notes
    names = class_names or s.info.get("class_names")
    prompts = prompts_for(s.conditions, names, p.prompt_template, conditions_are_labels(s))
    if prompts is None:
        return values, [
            f"{s.label}: CLIP score / HPS skipped: no captions or class names for its images "
            f"(pass --class-names FILE for class-conditional runs)"
        ]
    if p.clip_score:
        d = locate_weights("clip", weights.get("clip") or p.clip_model)
        values["clip_score"] = clip_scores(s.images, prompts, d, device, p.clip_scale)
    if p.hps:
        v, note = hps_scores(s.images, prompts, weights.get("hps"), device)
        notes.append(note)
        if v is not None:
            values["hps_v2.1"] = v
    return values, notes


def proxy_values(s: ImageSet, proxy_reference, target, device) -> dict:
    """Per-image offline proxies of a generation run (other sets get none): PSNR and token match
    against ``proxy_reference`` (a loaded run) and, with ``target`` (a TokenModel), the target's
    NLL (nats/token) and class consistency (:func:`lantern.run_reader.target_scores`)."""
    values = {}
    if s.info.get("kind") != "run":
        return values
    run = load_run(s.info["path"])
    keep = set(s.info.get("image_indices") or run["images"]["image"])  # the subset of SPEC@N / SPEC@:N
    run = {**run, "images": run["images"][run["images"]["image"].isin(keep)].reset_index(drop=True)}
    if proxy_reference is not None:
        q = image_quality(run, proxy_reference)
        values["psnr_vs_reference"] = q["psnr"].replace([np.inf], np.nan).to_numpy()
        values["token_match_vs_reference"] = q["token_match"].to_numpy()
    if target is not None:
        sc = target_scores(target, run["images"])
        values["target_nll"] = sc["nll"].to_numpy()
        if "consistent" in sc:
            values["class_consistency"] = sc["consistent"].to_numpy(dtype=float)
    return values


def set_features(
    s: ImageSet, ex: Extractor, batch_size: int, run_dir: Optional[RunDir], key: str, shard: Shard
) -> Optional[np.ndarray]:
    """Features (N, D) of the set under ``ex``; across shards, chunks of ``16 * batch_size`` images
    (whole extractor batches, so each equals a single process's) are parts of ``run_dir`` owned by
    ``chunk % count``; None on a shard that does not merge."""
    if shard.count == 1:
        return extract(s.images, ex, batch_size)
    size = 16 * batch_size
    chunks = [
        (
            f"{key}.{ex.name}.chunk{c:05d}",
            {
                "set": s.spec,
                "fingerprint": s.fingerprint,
                "extractor": ex.describe(),
                "images": [lo, min(s.n, lo + size)],
            },
        )
        for c, lo in enumerate(range(0, s.n, size))
    ]
    for c, done in shard_units(run_dir, chunks, shard, load=False):
        if done is None:
            name, holds = chunks[c]
            lo, hi = holds["images"]
            run_dir.write_part(
                name,
                holds,
                tensors={"features": {"features": torch.from_numpy(extract(s.images[lo:hi], ex, batch_size))}},
            )
    parts = assemble_units(run_dir, chunks, shard, [], lambda p: p.tensors["features"]["features"].numpy())
    return None if parts is None else np.concatenate(parts)


class _Rows:
    """The metric rows of one set as they are gathered: each group of rows is reused from its part
    of ``run_dir`` or computed and saved as one (nothing is saved without a run directory)."""

    def __init__(self, run_dir: Optional[RunDir]):
        self.run_dir, self.frames, self.boot = run_dir, [], {}

    def read(self, name: str, holds: dict):
        """The part ``name`` when it holds ``holds`` (its rows and resamples then join), else None."""
        part = self.run_dir.read_part(name, holds) if self.run_dir is not None else None
        if part is not None:
            self.frames.append(part.tables["metrics"])
            self.boot.update({k: v.numpy() for k, v in part.tensors.get("bootstrap", {}).items()})
        return part

    def save(self, name: str, holds: dict, rows: list[dict], tensors: dict, meta=None) -> None:
        """Join computed rows (their ``resamples`` move to the resampled values) and save them as a part."""
        for r in rows:
            self.boot[r["metric"]] = r.pop("resamples")
        df = pd.DataFrame(rows, columns=ROW_COLUMNS) if not rows else pd.DataFrame(rows)
        if self.run_dir is not None:
            resampled = {
                m: torch.from_numpy(np.ascontiguousarray(self.boot[m])) for m in df["metric"] if len(self.boot[m])
            }
            self.run_dir.write_part(
                name,
                holds,
                tables={"metrics": df},
                meta=meta,
                tensors={**tensors, **({"bootstrap": resampled} if resampled else {})},
            )
        self.frames.append(df)


def _feature_rows(
    rows: _Rows, s: ImageSet, ref: ImageSet, extractors, p: QualityProtocol, cache, batch_size, key, shard
):
    """The distribution metrics (FID, KID, precision, recall, density, coverage) under every extractor."""
    for ex in extractors:
        holds = {"set": s.spec, "fingerprint": s.fingerprint, "extractor": ex.describe(), "format": PART_FORMAT}
        if rows.read(f"{key}.{ex.name}", holds) is not None:
            continue
        feats = set_features(s, ex, batch_size, rows.run_dir, key, shard)
        if feats is None:
            continue
        stats = reference_stats(ref, ex, cache, batch_size, use_cache=cache is not False)
        rows.save(
            f"{key}.{ex.name}",
            holds,
            feature_metrics(feats, stats, p, ex.name),
            {"features": {"features": torch.from_numpy(feats)}},
        )


def _value_rows(rows: _Rows, s: ImageSet, p: QualityProtocol, key: str, weights, device, class_names, proxy, target):
    """The means of per-image values (CLIP score, HPS, proxies) -> the notes they gave."""
    extra = {
        "clip": p.clip_score,
        "hps": p.hps,
        "proxy": proxy is not None and proxy["path"].name,
        "target": target is not None,
    }
    if not any(extra.values()):
        return []
    holds = {"set": s.spec, "fingerprint": s.fingerprint, "values": extra, "format": PART_FORMAT}
    part = rows.read(f"{key}.values", holds)
    if part is not None:
        return list(part.meta.get("notes", []))
    values, text_notes = text_values(s, p, weights, device, class_names)
    values.update(proxy_values(s, proxy, target, device))
    rows.save(f"{key}.values", holds, value_metrics(values, p), {}, {"notes": text_notes})
    return text_notes


def score_set(
    s: ImageSet,
    ref: ImageSet,
    extractors,
    p: QualityProtocol,
    *,
    cache,
    batch_size,
    run_dir: Optional[RunDir],
    weights: dict,
    device,
    class_names=None,
    proxy_reference=None,
    target=None,
    notes=None,
    shard: Shard = SINGLE,
) -> tuple[pd.DataFrame, dict]:
    """All metric rows of one image set (parts reused / written when ``run_dir`` is given) and
    the resampled values of each metric ({metric: (B,) array}); (None, None) on a shard that does
    not merge (it only extracts its chunks of features). ``notes`` (a list) receives the notes of
    the text metrics."""
    key = safe_name(f"{s.label}-{s.fingerprint[:8]}")
    rows = _Rows(run_dir)
    _feature_rows(rows, s, ref, extractors, p, cache, batch_size, key, shard)
    if not shard.merges:
        return None, None
    found = _value_rows(rows, s, p, key, weights, device, class_names, proxy_reference, target)
    if notes is not None:
        notes.extend(found)
    df = pd.concat(rows.frames, ignore_index=True) if rows.frames else pd.DataFrame()
    return df.assign(run=s.spec, label=s.label), rows.boot
