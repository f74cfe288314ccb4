"""Generation runs on disk: reading them, and comparing them image by image (offline quality proxies).

A run is a directory written by ``python -m lantern.generate`` (``summary.json``,
``steps.parquet``, ``drafts.parquet``, ``images.parquet``, ``images/NNNNN.png``).

* :func:`load_run`, :func:`read_images`, :func:`run_label`, :func:`drafting_shape` read a run;
* :func:`image_quality` compares each image with the reference run's image of the same index
  (same seed and condition; typically ``--method ar``): pixel MSE / PSNR (dB, data range 1),
  the fraction of equal tokens and the first differing position;
* :func:`target_scores` is the target's view of the tokens: its negative log-likelihood under the
  conditional model (nats per token, temperature 1, no guidance) and, for class-conditional
  models, class consistency (the target as a Bayes classifier recovers the image's class);
* :func:`reference_notes` says what makes a run and its reference less comparable.

These are proxies; the distribution metrics (FID, KID, precision / recall, ...) are in
:mod:`lantern.evaluate`; :mod:`lantern.replay` relates them to acceptance.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import torch
from PIL import Image

from ambiguity.errors import UsageError
from ambiguity.io import read_table
from ambiguity.runs import check_sealed
from lantern.methods.jacobi.config import JACOBI_METHODS
from lantern.methods.spatial.config import SPATIAL_METHODS

__all__ = [
    "load_run",
    "run_label",
    "drafting_shape",
    "read_images",
    "image_quality",
    "check_comparable",
    "target_scores",
    "reference_notes",
    "CPU_LOGITS_BYTES",
]

# target_scores on the CPU: the most bytes of float32 logits one pass may hold. glibc serves larger
# blocks by mmap, fresh pages faulted in on every pass; smaller ones are reused from its heap
CPU_LOGITS_BYTES = 2**24


# the columns the readers of a run use (a table without them is damaged or another table)
REQUIRED = {
    "steps": ("image", "accepted"),
    "drafts": ("image", "reached", "committed", "p_draft", "p_tilde", "j_star", "p_top1", "p_entropy"),
    "images": ("image", "condition", "seed", "codes", "tokens", "target_forwards"),
}


def load_run(path: str | Path) -> dict:
    """A generate run directory -> dict(path, summary, steps, drafts, images) (DataFrames).

    Raises UsageError when the directory does not hold a finished, readable run (no or a broken
    summary.json, a missing or damaged table): rerunning its generate command repairs it.
    """
    path = Path(path).expanduser()
    fix = f"rerun python -m lantern.generate with --out {path} (finished images are reused)"
    if not path.exists():
        raise UsageError(f"{path} does not exist; check the path (a lantern.generate --out directory)")
    if not (path / "summary.json").is_file():
        raise UsageError(f"{path} is not a finished lantern.generate run (no summary.json); {fix}")
    try:
        summary = json.loads((path / "summary.json").read_text())
        if not isinstance(summary, dict):
            raise ValueError
    except (OSError, ValueError):
        raise UsageError(f"{path}/summary.json is damaged; {fix}") from None
    tables = {}
    for name in ("steps", "drafts", "images"):
        f = path / f"{name}.parquet"
        if not f.is_file():
            raise UsageError(f"{f} is missing; {fix}")
        try:
            tables[name] = read_table(f)
        except Exception:  # pyarrow raises several types for truncated or foreign files
            raise UsageError(f"{f} is damaged (not a readable Parquet table); {fix}") from None
    for name, columns in REQUIRED.items():
        missing = [c for c in columns if c not in tables[name].columns]
        if missing:
            raise UsageError(
                f"{path}/{name}.parquet lacks the column {missing[0]!r}, so it is not the {name} table of a run; {fix}"
            )
    check_sealed(path, fix)  # the tables, summary and PNGs are the bytes the run wrote
    return {"path": path, "summary": summary, **tables}


def run_label(summary: Mapping) -> str:
    """Short legend text of a run: ``"ar"``, ``"sd"``, ``"lantern k=64 δ=0.2"``, ``"lantern++ k=64 λ=2"``."""
    m = summary.get("method", "?")
    rule = summary.get("rule") if isinstance(summary.get("rule"), dict) else {}
    g = lambda x: f"{x:g}" if isinstance(x, (int, float)) else str(x)  # a damaged summary shows "None"
    if m == "lantern++":
        return f"{m} k={rule.get('k')} λ={g(rule.get('lam'))}"
    if m in ("lantern", "lantern-jsd"):
        return f"{m} k={rule.get('k')} δ={g(rule.get('delta'))}"
    return str(m)


def drafting_shape(rule: Mapping) -> str:
    """How a speculative run drafts, from its summary's ``rule`` (:meth:`lantern.engine.decode.DecodeConfig.as_dict`):
    ``"chain γ=4"``, ``"static tree eagle-default"`` or ``"dynamic tree (59,4,10)"`` (total tokens,
    depth, children per node); ``""`` when the rule does not say (AR, Jacobi, ZipAR / PJD and older summaries)."""
    if not isinstance(rule, Mapping) or rule.get("method") in ("ar", *JACOBI_METHODS, *SPATIAL_METHODS, "sjd-pac"):
        return ""  # no drafter: nothing is drafted in a chain or tree
    tree = rule.get("tree")
    if tree == "chain" or (isinstance(tree, Mapping) and tree.get("kind") == "chain"):
        return f"chain γ={rule.get('gamma')}" if rule.get("gamma") is not None else "chain"
    if not isinstance(tree, Mapping):
        return ""
    if tree.get("kind") == "dynamic":
        return f"dynamic tree ({tree.get('total_tokens')},{tree.get('depth')},{tree.get('top_k')})"
    paths = tree.get("paths") or []
    return f"static tree {tree.get('name') or f'({len(paths)} paths)'}"


def read_images(run_dir: str | Path, images) -> np.ndarray:
    """The per-image PNGs of a run, (B, C, H, W) float64 in [0, 1], in the order of ``images``.

    Raises UsageError when a PNG is missing (the model could not decode pixels) or damaged."""
    out = []
    for i in images["image"]:
        path = Path(run_dir) / "images" / f"{int(i):05d}.png"
        if not path.is_file():
            raise UsageError(f"{path} is missing; image quality needs runs of a model with a VQ decoder")
        try:
            with Image.open(path) as im:
                a = np.asarray(im, dtype=np.float64) / 255.0
        except OSError as exc:  # truncated or not a PNG
            raise UsageError(
                f"{path} is damaged ({exc}); rerun python -m lantern.generate with --out {Path(run_dir)} "
                f"to recompute that image"
            ) from None
        out.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
    if len({a.shape for a in out}) > 1:
        raise UsageError(f"the PNGs of {run_dir} differ in size; rerun its lantern.generate command")
    return np.stack(out)


def image_quality(run: Mapping, reference: Mapping):
    """Per-image comparison of a run with a reference run (same image index = same seed and condition).

    run, reference: dicts from :func:`load_run`. Returns a DataFrame with image, condition,
    acceptance_rate (committed / reached drafts of the image), tau (mean accepted length, bonus
    counted), tokens_per_forward (tokens / target forwards), mse (pixels in [0, 1]), psnr (dB;
    inf for identical images), token_match (fraction of equal tokens) and first_mismatch (the
    first differing position, -1 when equal). Images present in both runs only; raises
    UsageError when their seeds or conditions differ.
    """
    a, r = run["images"].set_index("image"), reference["images"].set_index("image")
    common = [i for i in a.index if i in r.index]
    if not common:
        raise UsageError(f"{run['path']} and the reference {reference['path']} share no image index")
    for col in ("seed", "condition"):
        bad = [i for i in common if a.loc[i, col] != r.loc[i, col]]
        if bad:
            raise UsageError(
                f"image {bad[0]} has {col} {a.loc[bad[0], col]} in {run['path']} but "
                f"{r.loc[bad[0], col]} in the reference; generate both with the same --seed and --classes"
            )
    sub = pd.DataFrame({"image": common})
    first = common[0]
    check_comparable(
        run, reference, len(np.asarray(a.loc[first, "codes"])), len(np.asarray(r.loc[first, "codes"])), "tokens"
    )
    x, y = read_images(run["path"], sub), read_images(reference["path"], sub)
    check_comparable(run, reference, "x".join(map(str, x.shape[1:])), "x".join(map(str, y.shape[1:])), "pixels (CxHxW)")
    mse = ((x - y) ** 2).reshape(len(common), -1).mean(1)
    with np.errstate(divide="ignore"):
        psnr = np.where(mse > 0, 10 * np.log10(1.0 / np.where(mse > 0, mse, 1.0)), np.inf)
    st, dr = run["steps"], run["drafts"]
    rows = []
    for j, i in enumerate(common):
        ca, cr = np.asarray(a.loc[i, "codes"]), np.asarray(r.loc[i, "codes"])
        diff = np.flatnonzero(ca != cr)
        d = dr[dr["image"] == i]
        s = st[st["image"] == i]
        reached = int(d["reached"].sum())
        rows.append(
            {
                "image": i,
                "condition": a.loc[i, "condition"],
                "acceptance_rate": float(d["committed"].sum() / reached) if reached else float("nan"),
                "tau": float((s["accepted"] + 1).mean()) if len(s) else float("nan"),
                "tokens_per_forward": float(a.loc[i, "tokens"] / a.loc[i, "target_forwards"]),
                "mse": float(mse[j]),
                "psnr": float(psnr[j]),
                "token_match": float((ca == cr).mean()),
                "first_mismatch": int(diff[0]) if diff.size else -1,
            }
        )
    return pd.DataFrame(rows)


def target_scores(model, images, batch_size: Optional[int] = None):
    """The target's view of generated tokens: NLL and, for c2i models, a Bayes class decision.

    model: the target (a :class:`~ambiguity.models.base.TokenModel`); images: an images
    DataFrame with ``codes`` (lists of N code indices) and ``condition``. Returns a DataFrame
    with image, nll (mean negative log-likelihood per token, nats, under the *conditional*
    model at temperature 1, no guidance, no top-k/top-p) and, for c2i: predicted (argmax over
    all classes of the conditional log-likelihood, equal priors) and consistent (predicted ==
    condition). Costs ``num_classes`` teacher-forced passes per image (the true class's pass is
    one of them). ``batch_size``: images per pass; None: on CUDA 16, on the CPU the most whose
    (batch, N, vocab) float32 logits fit in :data:`CPU_LOGITS_BYTES` (16 MiB: one image of
    embedded-16, 64 of embedded). Larger CPU batches are slower, not faster: their logits are
    fresh ``mmap`` pages each pass, faulted in as system time (embedded-16, 32 images, 1 thread
    beside a training run: 35 s at batch 1, 43 s at 4, 63 s at 32, of which 0 / 8 / 18 s system;
    ``benchmarks/bench_target_scores.py``).
    """
    codes = torch.tensor(np.stack(images["codes"].to_numpy()), dtype=torch.long, device=model.device)
    if batch_size is None:
        per_image = 4 * codes.shape[1] * int(model.vocab_size)
        batch_size = 16 if codes.device.type == "cuda" else max(1, min(64, CPU_LOGITS_BYTES // per_image))
    conds = list(images["condition"])
    c2i = model.kind == "c2i" and model.num_classes
    labels = [int(c) for c in conds] if c2i else conds

    def loglik(cond_list, toks):
        out = []
        for s in range(0, len(cond_list), batch_size):
            prompt = model.make_prompt(cond_list[s : s + batch_size], guided=False)
            t = toks[s : s + batch_size]
            with torch.no_grad():
                logits = model.teacher_force(prompt, t).logits.float()
                # log p(token) = logit - logsumexp: no (batch, N, vocab) log-softmax copy
                lp = logits.gather(-1, t[..., None])[..., 0] - torch.logsumexp(logits, -1)
            del logits
            out.append(lp.sum(-1).cpu())
        return torch.cat(out)

    if c2i:
        C = int(model.num_classes)
        every = torch.stack([loglik([c] * len(labels), codes) for c in range(C)], 1)  # (B, C)
        ll = every[torch.arange(len(labels)), torch.as_tensor(labels)]
    else:
        ll = loglik(labels, codes)
    df = pd.DataFrame({"image": images["image"].to_numpy(), "nll": (-ll / codes.shape[1]).numpy()})
    if c2i:
        pred = every.argmax(1).numpy()
        df["predicted"] = pred
        df["consistent"] = pred == np.asarray(labels)
    return df


def check_comparable(run: Mapping, reference: Mapping, mine, theirs, what: str) -> None:
    """Raise UsageError naming both models when a run's images and its reference's differ in
    ``what`` (token count or pixel shape), e.g. an ``embedded-16`` run (16 x 16 tokens, 64 px)
    against an ``embedded`` reference (8 x 8, 32 px): per-image comparison needs one geometry."""
    if mine == theirs:
        return
    model = (run["summary"].get("settings") or {}).get("model", "?")
    ref_model = (reference["summary"].get("settings") or {}).get("model", "?")
    raise UsageError(
        f"{run['path']} ({model}) has {mine} {what} per image but the reference {reference['path']} "
        f"({ref_model}) {theirs}; compare runs of one model: generate the reference with --model {model}"
    )


def reference_notes(run: Mapping, reference: Mapping) -> list[str]:
    """What makes a run and its reference less comparable: sampling settings that differ, and images
    of the run that the reference lacks (image quality covers the shared images only)."""
    notes = []
    s, r = run["summary"].get("settings", {}), reference["summary"].get("settings", {})
    for key in ("model", "guidance", "temperature", "top_k", "top_p", "seed"):
        if key in s and key in r and s[key] != r[key]:
            notes.append(f"{key} is {s[key]} here but {r[key]} in the reference {reference['path']}")
    mine, theirs = set(run["images"]["image"]), set(reference["images"]["image"])
    if mine - theirs:
        notes.append(
            f"image quality covers {len(mine & theirs)} of its {len(mine)} images: the reference has "
            f"{len(theirs)}; generate the reference with at least as many --num-images"
        )
    return notes
