"""Replay decode records: why were drafts accepted, and what did relaxed acceptance cost?

Reads runs written by ``python -m lantern.generate`` (or :class:`lantern.records.Decoded`
frames) and relates

* **ambiguity to acceptance** — the acceptance rate of draft tokens (committed / reached, see
  :mod:`lantern.records`) binned by the ambiguity of the target distribution ``p`` at the drafted
  position: its top-1 probability and its entropy (nats), per method
  (:func:`acceptance_by_ambiguity`). LANTERN's premise (Jang et al., ICLR 2025, Sec. 3) is that
  flat ``p`` (low top-1, high entropy) is where exact speculative decoding rejects and where
  the latent neighbourhood recovers acceptance;
* **acceptance to image quality**, with proxies available offline (:func:`image_quality`):
  pixel MSE / PSNR (dB, data range 1) of an image against the reference run's image of the
  same index (same seed and condition; typically ``--method ar``), the fraction of tokens equal
  to the reference's and the first position where they differ; optionally
  (:func:`target_scores`) the target's own negative log-likelihood of the tokens under the
  conditional model (nats per token, temperature 1, no guidance) and, for class-conditional
  models, whether the target used as a Bayes classifier (argmax over classes of the
  conditional likelihood) recovers the image's class ("class consistency").

CLI::

    python -m lantern.replay runs/sd runs/lantern --reference runs/ar --out runs/replay

writes ``acceptance_by_ambiguity.parquet``, ``image_quality.parquet``, ``replay.png`` / ``.pdf``
and prints the tables.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from PIL import Image

from ambiguity import plots
from ambiguity.cli import ArgumentParser, check_out_dir, cli_main, positive_int
from ambiguity.errors import UsageError
from ambiguity.io import ensure_writable_dir, read_table, write_table
from ambiguity.models.registry import load_model

__all__ = ["load_run", "run_label", "ambiguity_bins", "acceptance_by_ambiguity", "read_images", "image_quality",
           "reference_notes", "target_scores", "plot_replay", "main", "AMBIGUITY_COLUMNS"]

AMBIGUITY_COLUMNS = {"p_top1": "top-1 probability of p", "p_entropy": "entropy of p (nats)"}


def load_run(path: str | Path) -> dict:
    """A generate run directory -> dict(path, summary, steps, drafts, images) (DataFrames).

    Raises UsageError when the directory does not hold a finished, readable run (no or a broken
    summary.json, a missing or damaged table): rerunning its generate command repairs it.
    """
    path = Path(path).expanduser()
    fix = f"rerun python -m lantern.generate with --out {path} (finished images are reused)"
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
    missing = [c for c in ("image", "condition", "seed", "codes", "tokens", "target_forwards")
               if c not in tables["images"].columns]
    if missing:
        raise UsageError(f"{path}/images.parquet lacks the column {missing[0]!r}; {fix}")
    return {"path": path, "summary": summary, **tables}


def run_label(summary: Mapping) -> str:
    """Short legend text of a run: ``"ar"``, ``"sd"``, ``"lantern k=64 δ=0.2"``, ``"lantern++ k=64 λ=2"``."""
    m = summary.get("method", "?")
    rule = summary.get("rule", {}) or {}
    if m == "lantern++":
        return f"{m} k={rule.get('k')} λ={rule.get('lam'):g}"
    if m in ("lantern", "lantern-jsd"):
        return f"{m} k={rule.get('k')} δ={rule.get('delta'):g}"
    return m


def ambiguity_bins(drafts, by: str = "p_top1", edges: Optional[Sequence[float]] = None, bins: int = 10):
    """Acceptance of reached draft tokens per bin of an ambiguity column.

    drafts: a drafts DataFrame (columns of :data:`lantern.records.DRAFT_COLUMNS`); by:
    ``"p_top1"`` (probability) or ``"p_entropy"`` (nats); edges: bin edges (default ``bins``
    equal bins on [0, 1] for top-1, on [0, max entropy] for entropy). Returns a DataFrame with
    lo, hi, mid, drafts (reached draft tokens in the bin), committed, acceptance_rate
    (committed / drafts; NaN for an empty bin), mean_j_star and mean_p_gain (``p̃ - p``, the
    mass LANTERN moved onto accepted and rejected drafts alike). Raises UsageError for an
    unknown column.
    """
    if by not in AMBIGUITY_COLUMNS:
        raise UsageError(f"--by must be one of {', '.join(AMBIGUITY_COLUMNS)}, got {by!r}")
    d = drafts[drafts["reached"].astype(bool)]
    x = d[by].to_numpy(dtype=float)
    if edges is None:
        hi = 1.0 if by == "p_top1" else (math.ceil(2 * float(np.nanmax(x))) / 2 if len(x) else 1.0)
        edges = np.linspace(0.0, hi, bins + 1)
    edges = np.asarray(edges, dtype=float)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    rows = []
    for b in range(len(edges) - 1):
        sel = d[which == b]
        n = len(sel)
        rows.append({"by": by, "lo": edges[b], "hi": edges[b + 1], "mid": 0.5 * (edges[b] + edges[b + 1]),
                     "drafts": n, "committed": int(sel["committed"].sum()),
                     "acceptance_rate": float(sel["committed"].mean()) if n else float("nan"),
                     "mean_j_star": float(sel["j_star"].mean()) if n else float("nan"),
                     "mean_p_gain": float((sel["p_tilde"] - sel["p_draft"]).mean()) if n else float("nan")})
    return pd.DataFrame(rows)


def acceptance_by_ambiguity(runs: Mapping[str, object], by: Sequence[str] = ("p_top1", "p_entropy"),
                            bins: int = 10):
    """:func:`ambiguity_bins` for several runs on shared edges: ``runs`` maps a label to a drafts
    DataFrame. Returns one long DataFrame with a ``method`` column (the label)."""
    frames = []
    for col in by:
        if col == "p_entropy":
            top = max((float(np.nanmax(d["p_entropy"])) for d in runs.values() if len(d)), default=1.0)
            edges = np.linspace(0.0, math.ceil(2 * top) / 2, bins + 1)
        else:
            edges = np.linspace(0.0, 1.0, bins + 1)
        for label, drafts in runs.items():
            frames.append(ambiguity_bins(drafts, col, edges).assign(method=label))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def read_images(run_dir: str | Path, images) -> np.ndarray:
    """The per-image PNGs of a run, (B, C, H, W) float64 in [0, 1], in the order of ``images``.

    Raises UsageError when a PNG is missing (the model could not decode pixels)."""
    out = []
    for i in images["image"]:
        path = Path(run_dir) / "images" / f"{int(i):05d}.png"
        if not path.is_file():
            raise UsageError(f"{path} is missing; image quality needs runs of a model with a VQ decoder")
        a = np.asarray(Image.open(path), dtype=np.float64) / 255.0
        out.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
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
            raise UsageError(f"image {bad[0]} has {col} {a.loc[bad[0], col]} in {run['path']} but "
                             f"{r.loc[bad[0], col]} in the reference; generate both with the same --seed and --classes")
    sub = pd.DataFrame({"image": common})
    x, y = read_images(run["path"], sub), read_images(reference["path"], sub)
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
        rows.append({"image": i, "condition": a.loc[i, "condition"],
                     "acceptance_rate": float(d["committed"].sum() / reached) if reached else float("nan"),
                     "tau": float((s["accepted"] + 1).mean()) if len(s) else float("nan"),
                     "tokens_per_forward": float(a.loc[i, "tokens"] / a.loc[i, "target_forwards"]),
                     "mse": float(mse[j]), "psnr": float(psnr[j]), "token_match": float((ca == cr).mean()),
                     "first_mismatch": int(diff[0]) if diff.size else -1})
    return pd.DataFrame(rows)


def target_scores(model, images, batch_size: int = 64):
    """The target's view of generated tokens: NLL and, for c2i models, a Bayes class decision.

    model: the target (a :class:`~ambiguity.models.base.TokenModel`); images: an images
    DataFrame with ``codes`` (lists of N code indices) and ``condition``. Returns a DataFrame
    with image, nll (mean negative log-likelihood per token, nats, under the *conditional*
    model at temperature 1, no guidance, no top-k/top-p) and, for c2i: predicted (argmax over
    all classes of the conditional log-likelihood, equal priors) and consistent (predicted ==
    condition). Costs ``num_classes`` teacher-forced passes per image.
    """
    codes = torch.tensor(np.stack(images["codes"].to_numpy()), dtype=torch.long, device=model.device)
    conds = list(images["condition"])
    c2i = model.kind == "c2i" and model.num_classes
    labels = [int(c) for c in conds] if c2i else conds

    def loglik(cond_list, toks):
        out = []
        for s in range(0, len(cond_list), batch_size):
            prompt = model.make_prompt(cond_list[s:s + batch_size], guided=False)
            with torch.no_grad():
                logits = model.teacher_force(prompt, toks[s:s + batch_size]).logits.float()
            lp = torch.log_softmax(logits, -1).gather(-1, toks[s:s + batch_size, :, None])[..., 0]
            out.append(lp.sum(-1).cpu())
        return torch.cat(out)

    ll = loglik(labels, codes)
    df = pd.DataFrame({"image": images["image"].to_numpy(), "nll": (-ll / codes.shape[1]).numpy()})
    if c2i:
        C = int(model.num_classes)
        every = torch.stack([loglik([c] * len(labels), codes) for c in range(C)], 1)  # (B, C)
        pred = every.argmax(1).numpy()
        df["predicted"] = pred
        df["consistent"] = pred == np.asarray(labels)
    return df


def plot_replay(bins, quality=None, path: str | Path = "figures/lantern_replay", min_drafts: int = 20) -> list[Path]:
    """Acceptance rate vs top-1 probability and vs entropy of p per method (bins with at least
    ``min_drafts`` reached drafts), and, when ``quality`` (image_quality rows with a ``method``
    column) is given, PSNR against the reference vs per-image acceptance rate. PNG + PDF."""
    cols = [c for c in AMBIGUITY_COLUMNS if c in set(bins["by"])]
    n = len(cols) + (quality is not None and len(quality) > 0)
    with plots.style():
        fig, axes = plots.new_figure(1, n, width=2.5 * n, height=2.3)
        axes = np.atleast_1d(axes)
        methods = list(dict.fromkeys(bins["method"]))
        for ax, col in zip(axes, cols):
            for j, m in enumerate(methods):
                b = bins[(bins["by"] == col) & (bins["method"] == m) & (bins["drafts"] >= min_drafts)]
                ax.plot(b["mid"], b["acceptance_rate"], marker="o", ms=2.5, label=m, color=plots.color_for(m, j))
            ax.set_xlabel(AMBIGUITY_COLUMNS[col])
            ax.set_ylabel("acceptance rate")
            if col == "p_top1":
                ax.set_xlim(0, 1)
            ax.set_ylim(0, 1.02)
        axes[0].legend(loc="best")
        if n > len(cols):
            ax = axes[-1]
            for j, m in enumerate(dict.fromkeys(quality["method"])):
                q = quality[(quality["method"] == m) & np.isfinite(quality["psnr"])]
                ax.scatter(q["acceptance_rate"], q["psnr"], s=6, label=m, color=plots.color_for(m, j), alpha=0.7)
            ax.set_xlabel("acceptance rate of the image")
            ax.set_ylabel("PSNR vs reference (dB)")
        return plots.save_figure(fig, path)


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
        notes.append(f"image quality covers {len(mine & theirs)} of its {len(mine)} images: the reference has "
                     f"{len(theirs)}; generate the reference with at least as many --num-images")
    return notes


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    """``python -m lantern.replay RUN [RUN ...] [--reference RUN]``: tables + figure (module docstring)."""
    ap = ArgumentParser(prog="python -m lantern.replay",
                        description="Relate acceptance of draft tokens to the ambiguity of p and to image quality.")
    ap.add_argument("runs", nargs="+", help="run directories written by python -m lantern.generate")
    ap.add_argument("--reference", default=None, help="run to compare images with (same --seed, usually --method ar)")
    ap.add_argument("--bins", type=positive_int, default=10, help="bins per ambiguity axis (default: 10)")
    ap.add_argument("--scores", action="store_true",
                    help="also load the target to score tokens (NLL, class consistency for c2i)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N, for --scores (default: auto)")
    ap.add_argument("--out", default="runs/replay", help="output directory (default: runs/replay)")
    ap.add_argument("--figure", default=None, help="figure path without suffix (default: <out>/replay)")
    args = ap.parse_args(argv)
    if args.bins > 1000:
        raise UsageError(f"--bins must be at most 1000 (bins of the ambiguity axes), got {args.bins}")
    out = check_out_dir(args.out)
    if args.figure is not None:
        check_out_dir(Path(args.figure).parent, "--figure")
    runs = [load_run(r) for r in args.runs]
    ref = load_run(args.reference) if args.reference else None
    out = ensure_writable_dir(out)
    labels = [run_label(r["summary"]) for r in runs]
    labels = [f"{lab} ({r['path'].name})" if labels.count(lab) > 1 else lab for lab, r in zip(labels, runs)]
    bins = acceptance_by_ambiguity({lab: r["drafts"] for lab, r in zip(labels, runs)}, bins=args.bins)
    write_table(bins, out / "acceptance_by_ambiguity.parquet")
    quality = None
    if ref is not None:
        for lab, r in zip(labels, runs):
            for note in reference_notes(r, ref):
                print(f"note: {lab}: {note}")
        quality = pd.concat([image_quality(r, ref).assign(method=lab) for lab, r in zip(labels, runs)],
                            ignore_index=True)
    if args.scores:
        s = (ref or runs[0])["summary"].get("settings", {})
        model = load_model(s.get("model", "embedded"), weights=s.get("weights"), device=args.device)
        scores = pd.concat([target_scores(model, r["images"]).assign(method=lab) for lab, r in zip(labels, runs)]
                           + ([target_scores(model, ref["images"]).assign(method="reference")] if ref else []),
                           ignore_index=True)
        write_table(scores, out / "target_scores.parquet")
        cols = ["nll"] + (["consistent"] if "consistent" in scores else [])
        print(scores.groupby("method")[cols].mean().to_string(float_format="%.4g"))
    if quality is not None:
        write_table(quality, out / "image_quality.parquet")
        table = quality.assign(identical=quality["mse"] == 0, psnr=quality["psnr"].replace([np.inf], np.nan))
        print("per method, means over images (psnr over the non-identical images, dB):")
        print(table.groupby("method")[["acceptance_rate", "tau", "tokens_per_forward", "mse", "psnr",
                                       "token_match", "identical"]].mean().to_string(float_format="%.4g"))
    wide = bins.pivot_table(index=["by", "mid"], columns="method", values="acceptance_rate")
    print(wide.to_string(float_format="%.3f"))
    files = plot_replay(bins, quality, args.figure or out / "replay")
    print(f"wrote {out}/acceptance_by_ambiguity.parquet"
          + (", image_quality.parquet" if quality is not None else "") + f", {', '.join(str(f) for f in files)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
