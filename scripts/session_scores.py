"""Per-image quality proxies of every method of a ``python -m lantern.paper`` session, paired with AR.

    python scripts/session_scores.py runs/paper/embedded16-grid64/sessions/embedded-16-T1 --model embedded-16
    # -> <session>/scores.csv (one row per method) and scores_images.parquet (one row per method and image)
    python scripts/session_scores.py runs/gpu-grid500 --model embedded-16 --reuse-target-scores
    # a directory of lantern.generate runs, one subdirectory per method (AR's named ``ar``), same seeds

The directory is either a ``lantern.paper`` session or a directory whose subdirectories are
``lantern.generate --out`` runs of the same images (same ``--seed``, ``--num-images``, classes),
each named by its method; their ``images.parquet`` gives the tokens. ``--reuse-target-scores``
takes each generate run's ``target_scores.csv`` (written by
:func:`lantern.run_reader.target_scores`, e.g. where the run was decoded on a GPU) instead of
recomputing the target's ten teacher-forced passes per image here.

A session decodes image i of every method from the same class and the same random stream, so
the methods' images are paired: AR's image i is the lossless reference of LANTERN's image i. For
each method's images this measures, per image:

* ``target_nll``: the target's mean negative log-likelihood of the tokens (nats/token), under the
  class-conditional model at temperature 1 without guidance or filters
  (:func:`lantern.run_reader.target_scores`); a lossless method matches AR's in distribution;
* ``class_consistency``: the target as a Bayes classifier (equal priors over classes) recovers
  the image's class (1) or not (0);
* ``classifier_accuracy``: the project's Fashion-MNIST classifier (the ``fmnist`` extractor's
  network, :mod:`lantern.quality.fmnist`, 8-bit pixels resized as its features are) predicts the
  image's class; an external judge, independent of the target.

and writes each method's mean with a 95 % percentile-bootstrap interval over images, and the mean
paired difference from AR with its own bootstrap interval (images resampled jointly;
:func:`ambiguity.stats.bootstrap_mean_ci`, 2000 resamples, seed 0). Only images decoded by both the
method and AR count. Errors: a directory that is not a session (no ``parts/round_*.json``), a model
that does not match the session's tokens, or a session without AR: one line, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file

from ambiguity.cli import ArgumentParser, add_device_args, cli_main, path_arg, positive_int
from ambiguity.errors import UsageError
from ambiguity.io import write_table
from ambiguity.models.registry import load_model
from ambiguity.stats import bootstrap_mean_ci
from lantern.quality.features import load_extractor, prepare
from lantern.quality.fmnist import load_fashion_net
from lantern.run_reader import target_scores

METRICS = ("target_nll", "class_consistency", "classifier_accuracy")


def read_session(path: Path) -> tuple[dict, pd.DataFrame]:
    """({method: (n, N) int64 tokens in image order}, images table: method, image, condition) of
    the complete rounds of a session directory. Raises UsageError when there are none."""
    manifests = sorted((path / "parts").glob("round_*.json"))
    if not manifests:
        raise UsageError(
            f"{path} holds no finished rounds (parts/round_*.json); pass a lantern.paper session directory"
        )
    tokens: dict = {}
    rows = []
    for m in manifests:
        name = m.stem
        images = pd.read_parquet(path / "parts" / f"{name}.images.parquet")
        toks = load_file(path / "parts" / f"{name}.tokens.safetensors")
        for method, t in toks.items():
            tokens.setdefault(method, []).append(t)
        rows.append(images[["method", "image", "condition"]])
    images = pd.concat(rows, ignore_index=True)
    order = {m: images[images["method"] == m]["image"].to_numpy() for m in tokens}
    return {m: torch.cat(ts)[np.argsort(order[m], kind="stable")] for m, ts in tokens.items()}, images


def read_generate_runs(path: Path) -> tuple[dict, pd.DataFrame]:
    """As :func:`read_session`, for a directory of ``lantern.generate`` runs (one subdirectory per
    method, named by it). Raises UsageError when no subdirectory holds an images.parquet."""
    tokens: dict = {}
    rows = []
    for run in sorted(d for d in path.iterdir() if (d / "images.parquet").is_file()):
        images = pd.read_parquet(run / "images.parquet").sort_values("image")
        tokens[run.name] = torch.tensor(np.stack(images["codes"].to_numpy()), dtype=torch.long)
        rows.append(images[["image", "condition"]].assign(method=run.name))
    if not tokens:
        raise UsageError(
            f"{path} holds neither finished session rounds (parts/round_*.json) nor lantern.generate runs "
            f"(<method>/images.parquet); pass a session directory or a directory of generate runs"
        )
    return tokens, pd.concat(rows, ignore_index=True)


def reused_target_scores(path: Path, images: pd.DataFrame) -> pd.DataFrame:
    """A generate run's ``target_scores.csv`` (image, nll, predicted, consistent) for ``images``' rows, in
    their order. Raises UsageError when it is missing or lacks an image."""
    f = path / "target_scores.csv"
    if not f.is_file():
        raise UsageError(f"{f} is missing; drop --reuse-target-scores to compute the target scores here")
    sc = pd.read_csv(f).set_index("image")
    missing = sorted(set(images["image"]) - set(sc.index))
    if missing:
        raise UsageError(f"{f} lacks image {missing[0]}; drop --reuse-target-scores to compute them here")
    return sc.loc[images["image"].to_numpy()].reset_index()


def score_method(
    model, classifier, extractor, tokens: torch.Tensor, images: pd.DataFrame, scores: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Per-image proxies (module docstring) of one method: classifier, the FashionNet (logits); extractor,
    the ``fmnist`` extractor whose input rule it gets; tokens (n, N) int64, images (n rows: image,
    condition, in the order of ``tokens``); scores: the target scores of these rows when already
    computed (:func:`reused_target_scores`), else None. Returns image, target_nll, class_consistency,
    classifier_accuracy."""
    frame = pd.DataFrame({"image": images["image"].to_numpy(), "condition": images["condition"].to_numpy()})
    frame["codes"] = list(tokens.numpy())
    sc = target_scores(model, frame) if scores is None else scores
    h, w = model.grid
    with torch.no_grad():
        pix = model.decode_codes(tokens.view(-1, h, w).to(model.device)).float()
        pred = classifier(prepare(pix, extractor)).argmax(-1).cpu().numpy()
    labels = frame["condition"].astype(int).to_numpy()
    return pd.DataFrame(
        {
            "image": frame["image"],
            "target_nll": sc["nll"].to_numpy(),
            "class_consistency": sc["consistent"].to_numpy(dtype=float),
            "classifier_accuracy": (pred == labels).astype(float),
        }
    )


def summarise(per_image: pd.DataFrame, baseline: str = "ar") -> pd.DataFrame:
    """One row per method: images, and per metric its mean, 95 % interval and the paired difference
    from ``baseline`` with its interval (module docstring)."""
    base = per_image[per_image["method"] == baseline].set_index("image")
    out = []
    for method, g in per_image.groupby("method", sort=False):
        g = g.set_index("image").loc[lambda d: d.index.isin(base.index)]
        row = {"method": method, "images": len(g)}
        for m in METRICS:
            v = g[m].to_numpy()
            d = v - base.loc[g.index, m].to_numpy()
            row[m] = float(v.mean())
            row[f"{m}_lo"], row[f"{m}_hi"] = bootstrap_mean_ci(v)
            row[f"{m}_diff"] = float(d.mean())
            row[f"{m}_diff_lo"], row[f"{m}_diff_hi"] = bootstrap_mean_ci(d)
        out.append(row)
    return pd.DataFrame(out)


def markdown(summary: pd.DataFrame) -> str:
    """The summary as a Markdown table: mean [interval] and Δ vs AR [interval] per metric."""
    cells = lambda r, m, f: (
        f"{r[m]:{f}} [{r[m + '_lo']:{f}}, {r[m + '_hi']:{f}}] | "
        f"{r[m + '_diff']:+{f}} [{r[m + '_diff_lo']:+{f}}, {r[m + '_diff_hi']:+{f}}]"
    )
    metrics = ("target NLL (nats/token)", "class consistency", "classifier accuracy")
    head = "| method | images | " + " | ".join(f"{m} | Δ vs AR" for m in metrics) + " |"
    lines = [head, "|" + "---|" * 8]
    for _, r in summary.iterrows():
        lines.append(
            f"| {r['method']} | {r['images']} | {cells(r, 'target_nll', '.3f')} | "
            f"{cells(r, 'class_consistency', '.2f')} | {cells(r, 'classifier_accuracy', '.2f')} |"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    p = ArgumentParser(prog="session_scores.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "session",
        type=path_arg,
        help="a lantern.paper session directory (runs/paper/<name>/sessions/<s>), or a directory of "
        "lantern.generate runs, one per method (AR's named ar)",
    )
    p.add_argument("--model", default="embedded-16", help="the session's target model (default: %(default)s)")
    p.add_argument("--weights", default=None, help="the target's checkpoint (default: the registry's)")
    p.add_argument("--limit", type=positive_int, default=None, help="only the first N images of each method")
    p.add_argument(
        "--methods", default=None, help="comma-separated session method names to score (default: all; ar always)"
    )
    p.add_argument(
        "--reuse-target-scores",
        action="store_true",
        help="generate runs: read each run's target_scores.csv instead of recomputing it",
    )
    add_device_args(p, dtype=False)
    return p.parse_args(argv)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    path = Path(args.session)
    generated = not (path / "parts").is_dir()
    if args.reuse_target_scores and not generated:
        raise UsageError("--reuse-target-scores applies to a directory of lantern.generate runs; drop it")
    tokens, images = read_generate_runs(path) if generated else read_session(path)
    if "ar" not in tokens:
        raise UsageError(f"{args.session} has no AR decodes to pair with; pass a session with the method 'ar'")
    model = load_model(args.model, args.weights, device=args.device)
    N = model.grid[0] * model.grid[1]
    if next(iter(tokens.values())).shape[1] != N:
        raise UsageError(f"{args.session} holds {next(iter(tokens.values())).shape[1]}-token images, {args.model} {N}")
    extractor = load_extractor("fmnist", device=model.device)
    classifier = load_fashion_net(device=model.device)[0].eval()
    if args.methods:
        wanted = ["ar"] + [m for m in args.methods.split(",") if m and m != "ar"]
        unknown = [m for m in wanted if m not in tokens]
        if unknown:
            raise UsageError(f"{args.session} has no method {unknown[0]!r}; choose from {', '.join(sorted(tokens))}")
        tokens = {m: tokens[m] for m in wanted}
    frames = []
    for method, toks in tokens.items():
        rows = images[images["method"] == method].sort_values("image")
        if args.limit:
            toks, rows = toks[: args.limit], rows.head(args.limit)
        reused = reused_target_scores(path / method, rows) if args.reuse_target_scores else None
        frames.append(score_method(model, classifier, extractor, toks, rows, reused).assign(method=method))
        print(f"{method}: {len(rows)} images scored", flush=True)
    per_image = pd.concat(frames, ignore_index=True)
    summary = summarise(per_image)
    out = Path(args.session)
    write_table(per_image, out / "scores_images.parquet")
    summary.to_csv(out / "scores.csv", index=False)
    print(markdown(summary))
    print(f"wrote {out / 'scores.csv'} and {out / 'scores_images.parquet'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
