"""Figure: sample quality of LANTERN over δ at one k, next to AR, EAGLE-2 and the paper's grid.

    python scripts/figure_quality_grid.py runs/paper/embedded16-grid128 --model embedded-16
    # -> figures/embedded16_quality_grid.{png,pdf,csv}

Reads a ``python -m lantern.paper`` run with the ``fig5`` item (``fig5/fig5_ours.csv``: FID and
precision / recall with 95 % intervals per method) and, when present, the per-method proxies of
``scripts/session_scores.py`` (``sessions/<model>-T1/scores.csv``: target NLL, class consistency,
classifier accuracy, each paired with AR). Panels, each against δ with AR (band: its 95 % interval)
and EAGLE-2 (lossless, the same distribution as AR: the size of chance differences) at δ = 0:
precision and recall (with the paper's LlamaGen values at the same k, dashed;
:data:`lantern.paper.published.PRECISION_RECALL`), FID, the target NLL's paired difference from AR,
and class consistency / classifier accuracy. Errors (no fig5 table, no LANTERN rows at ``--k``):
one line, exit 2.

Two models on one figure (e.g. the first release next to the retrained model):

    python scripts/figure_quality_grid.py figures/embedded16_quality_grid.csv --label "retrained" \
        --compare runs/paper/e16-first-release-grid64 --compare-label "first release" \
        --out figures/embedded16_quality_grid_releases

Either source may be a run directory or a CSV this script wrote earlier (its rows, as saved). The
second model is drawn in orange, its AR as a dotted line (no band), its EAGLE-2 point beside δ = 0.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ambiguity.cli import ArgumentParser, add_out_arg, cli_main, path_arg, positive_int
from ambiguity.errors import UsageError
from ambiguity.plots import new_figure, save_figure, style
from lantern.paper.published import AR_PRECISION_RECALL, PRECISION_RECALL

ROOT = Path(__file__).resolve().parents[1]


def load(run: Path, model: str, k: int, extractor: str) -> pd.DataFrame:
    """AR, EAGLE-2 and the LANTERN (TVD bound, l2 codebook) rows at paper k ``k`` of the run, with
    the session proxies merged in; column ``delta`` is 0 for AR and EAGLE-2. ``run`` may also be a
    CSV written by this script (read as saved; ``k`` is then not checked)."""
    if run.suffix == ".csv":
        if not run.is_file():
            raise UsageError(f"{run} does not exist; pass a run directory or a CSV written by this script")
        rows = pd.read_csv(run)
        if not {"name", "delta", f"precision_{extractor}"} <= set(rows.columns) or "ar" not in set(rows["name"]):
            raise UsageError(f"{run} is not a CSV of figure_quality_grid.py with the {extractor} extractor")
        if "model" in rows.columns:
            raise UsageError(f"{run} holds two models (written with --compare); pass a single model's CSV or run")
        return rows
    table = run / "fig5" / "fig5_ours.csv"
    if not table.is_file():
        raise UsageError(f"{table} does not exist; run python -m lantern.paper --only fig5 --out {run} first")
    df = pd.read_csv(table)
    lantern = df[
        (df["k_paper"] == k) & (df["bound"] == "lantern") & (df["metric"] == "l2") & (df["matrix"] == "codebook")
    ]
    if lantern.empty:
        raise UsageError(f"{table} has no LANTERN rows at k = {k}; pass a --k of its grid")
    rows = pd.concat([df[df["name"].isin(["ar", "eagle2"])].assign(delta=0.0), lantern], ignore_index=True)
    scores = run / "sessions" / f"{model}-T1" / "scores.csv"
    if scores.is_file():
        rows = rows.merge(pd.read_csv(scores).drop(columns="images"), left_on="name", right_on="method", how="left")
        rows = rows.drop(columns="method_y").rename(columns={"method_x": "method"})
    keep = ["method", "name", "images", "delta"] + [
        c for c in rows.columns if c.startswith((f"fid_{extractor}", f"precision_{extractor}", f"recall_{extractor}"))
    ]
    keep += [c for c in rows.columns if c.startswith(("target_nll", "class_consistency", "classifier_accuracy"))]
    return rows[keep].sort_values("delta", kind="stable").reset_index(drop=True)


def _series(ax, rows: pd.DataFrame, col: str, diff: bool, label: str = "", second: bool = False) -> None:
    """One model's AR line (a band for the first model), EAGLE-2 point and LANTERN curve on ``ax``."""
    lo, hi = (f"{col}_lo", f"{col}_hi")
    ar = rows[rows["name"] == "ar"].iloc[0]
    lan = rows[~rows["name"].isin(["ar", "eagle2"])]
    tag = f", {label}" if label else ""
    if diff:
        if not second:
            ax.axhline(0.0, color="0.4", lw=0.8, label="AR")
    elif second:
        ax.axhline(ar[col], color="C1", lw=0.8, ls=":", label=f"AR{tag}")
    else:
        ax.axhspan(ar[lo], ar[hi], color="0.85", lw=0)
        ax.axhline(ar[col], color="0.4", lw=0.8, label=f"AR (95 % band){tag}")
    e = rows[rows["name"] == "eagle2"]
    if len(e):
        e = e.iloc[0]
        ax.errorbar(
            [0.012 if second else 0.0],
            [e[col]],
            yerr=[[e[col] - e[lo]], [e[hi] - e[col]]],
            fmt="s",
            ms=3,
            mfc="white" if second else None,
            color="C2",
            capsize=2,
            label=f"EAGLE-2{tag}",
        )
    ax.errorbar(
        lan["delta"] + (0.006 if second else 0.0),
        lan[col],
        yerr=[lan[col] - lan[lo], lan[hi] - lan[col]],
        fmt="s--" if second else "o-",
        ms=3,
        color="C1" if second else "C0",
        capsize=2,
        label=f"LANTERN{tag}",
    )


def _panel(
    ax,
    rows: pd.DataFrame,
    col: str,
    label: str,
    paper: dict | None = None,
    diff: bool = False,
    other: pd.DataFrame | None = None,
    labels: tuple[str, str] = ("", ""),
) -> None:
    """One metric against δ: LANTERN's points and intervals, AR's band, EAGLE-2's point, the paper's
    curve; ``other``: a second model's rows beside them (:func:`_series`)."""
    ar = rows[rows["name"] == "ar"].iloc[0]
    _series(ax, rows, col, diff, labels[0])
    if other is not None and col in other.columns:
        _series(ax, other, col, diff, labels[1], second=True)
    if paper:  # on a right axis of the same span, centred on the paper's AR value: equal slopes look equal
        xs = sorted(paper)
        twin = ax.twinx()
        twin.plot(xs, [paper[x] for x in xs], "--", marker="^", ms=3, color="C3", label="paper, LlamaGen (right axis)")
        low, high = ax.get_ylim()
        twin.set_ylim(paper[0.0] - (ar[col] - low), paper[0.0] + (high - ar[col]))
        twin.tick_params(axis="y", colors="C3", labelsize=6)
        twin.spines["right"].set_visible(True)
        twin.spines["right"].set_color("C3")
    ax.set_xlabel("δ")
    ax.set_title(label, fontsize=8)


def figure(
    rows: pd.DataFrame,
    k: int,
    model: str,
    extractor: str,
    other: pd.DataFrame | None = None,
    labels: tuple[str, str] = ("", ""),
):
    """The panels of the module docstring for ``rows`` (:func:`load`); ``other``: a second model's
    rows drawn beside them, ``labels`` the two models' legend names."""
    have_scores = "target_nll" in rows.columns and rows["target_nll"].notna().any()
    n = 5 if have_scores else 3
    fig, axes = new_figure(1, n, width=2.3 * n, height=2.3 if other is None else 2.6)
    pr = {d: v for (kk, d), v in PRECISION_RECALL.items() if kk == k}
    two = {"other": other, "labels": labels}
    _panel(
        axes[0],
        rows,
        f"precision_{extractor}",
        f"precision ({extractor})",
        {0.0: AR_PRECISION_RECALL[0], **{d: v[0] for d, v in pr.items()}},
        **two,
    )
    _panel(
        axes[1],
        rows,
        f"recall_{extractor}",
        f"recall ({extractor})",
        {0.0: AR_PRECISION_RECALL[1], **{d: v[1] for d, v in pr.items()}},
        **two,
    )
    _panel(axes[2], rows, f"fid_{extractor}", f"FID ({extractor}; biased at small n)", **two)
    if have_scores:
        _panel(axes[3], rows, "target_nll_diff", "target NLL − AR's (nats/token, paired)", diff=True, **two)
        _panel(axes[4], rows, "classifier_accuracy", "class accuracy (Fashion-MNIST classifier)", **two)
    unique = {}  # label -> handle, first seen, from the panels that draw every series
    for ax in fig.axes[:2] + [fig.axes[-1]]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            unique.setdefault(lab, h)
    ncols = len(unique) if other is None else (len(unique) + 1) // 2
    fig.legend(unique.values(), unique.keys(), loc="outside lower center", ncols=ncols, fontsize=7, frameon=False)
    images = int(rows["images"].min())
    if other is None:
        title = f"{model}: LANTERN at k = {k} over δ, {images} images per method, 95 % intervals"
    else:
        title = (
            f"{model}: LANTERN at k = {k} over δ, {labels[0]} ({images} images per method) "
            f"and {labels[1]} ({int(other['images'].min())}), 95 % intervals"
        )
    fig.suptitle(title, fontsize=9)
    return fig


def parse_args(argv=None):
    p = ArgumentParser(prog="figure_quality_grid.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "run", type=path_arg, help="a lantern.paper run directory with the fig5 item, or a CSV this script wrote"
    )
    p.add_argument("--label", default="", help="the run's name in the legend (with --compare)")
    p.add_argument(
        "--compare", type=path_arg, help="a second model's run directory or CSV, drawn beside the first (orange)"
    )
    p.add_argument("--compare-label", default="compared", help="its name in the legend (default: %(default)s)")
    p.add_argument("--model", default="embedded-16", help="the run's primary model (default: %(default)s)")
    p.add_argument(
        "--k", type=positive_int, default=1000, help="the paper's k of the LANTERN rows (default: %(default)s)"
    )
    p.add_argument("--extractor", default="fmnist", help="feature extractor of the metrics (default: %(default)s)")
    add_out_arg(p, "output path without suffix (default figures/<model>_quality_grid)", metavar="PATH")
    return p.parse_args(argv)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    rows = load(Path(args.run), args.model, args.k, args.extractor)
    other = load(Path(args.compare), args.model, args.k, args.extractor) if args.compare else None
    labels = (args.label or ("first" if other is not None else ""), args.compare_label)
    out = Path(args.out) if args.out else ROOT / "figures" / f"{args.model.replace('-', '')}_quality_grid"
    inputs = (Path(args.run).resolve(), Path(args.compare).resolve()) if other is not None else ()
    if out.with_suffix(".csv").resolve() in inputs:
        raise UsageError(f"--out {out} would overwrite an input CSV; pass another --out")
    with style():
        written = save_figure(figure(rows, args.k, args.model, args.extractor, other, labels), out)
    if other is not None:
        rows = pd.concat([rows.assign(model=labels[0]), other.assign(model=labels[1])], ignore_index=True)
    rows.to_csv(out.with_suffix(".csv"), index=False)
    print(rows.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("wrote " + ", ".join(str(p) for p in written + [out.with_suffix(".csv")]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
