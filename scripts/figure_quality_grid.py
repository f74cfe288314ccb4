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
    the session proxies merged in; column ``delta`` is 0 for AR and EAGLE-2."""
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


def _panel(ax, rows: pd.DataFrame, col: str, label: str, paper: dict | None = None, diff: bool = False) -> None:
    """One metric against δ: LANTERN's points and intervals, AR's band, EAGLE-2's point, the paper's curve."""
    lo, hi = (f"{col}_lo", f"{col}_hi")
    ar = rows[rows["name"] == "ar"].iloc[0]
    lan = rows[~rows["name"].isin(["ar", "eagle2"])]
    if not diff:
        ax.axhspan(ar[lo], ar[hi], color="0.85", lw=0)
        ax.axhline(ar[col], color="0.4", lw=0.8, label="AR (95 % band)")
    else:
        ax.axhline(0.0, color="0.4", lw=0.8, label="AR")
    e = rows[rows["name"] == "eagle2"]
    if len(e):
        e = e.iloc[0]
        ax.errorbar(
            [0.0],
            [e[col]],
            yerr=[[e[col] - e[lo]], [e[hi] - e[col]]],
            fmt="s",
            ms=3,
            color="C2",
            capsize=2,
            label="EAGLE-2",
        )
    ax.errorbar(
        lan["delta"],
        lan[col],
        yerr=[lan[col] - lan[lo], lan[hi] - lan[col]],
        fmt="o-",
        ms=3,
        color="C0",
        capsize=2,
        label="LANTERN",
    )
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


def figure(rows: pd.DataFrame, k: int, model: str, extractor: str):
    """The panels of the module docstring for ``rows`` (:func:`load`)."""
    have_scores = "target_nll" in rows.columns and rows["target_nll"].notna().any()
    n = 5 if have_scores else 3
    fig, axes = new_figure(1, n, width=2.3 * n, height=2.3)
    pr = {d: v for (kk, d), v in PRECISION_RECALL.items() if kk == k}
    _panel(
        axes[0],
        rows,
        f"precision_{extractor}",
        f"precision ({extractor})",
        {0.0: AR_PRECISION_RECALL[0], **{d: v[0] for d, v in pr.items()}},
    )
    _panel(
        axes[1],
        rows,
        f"recall_{extractor}",
        f"recall ({extractor})",
        {0.0: AR_PRECISION_RECALL[1], **{d: v[1] for d, v in pr.items()}},
    )
    _panel(axes[2], rows, f"fid_{extractor}", f"FID ({extractor}; biased at small n)")
    if have_scores:
        _panel(axes[3], rows, "target_nll_diff", "target NLL − AR's (nats/token, paired)", diff=True)
        _panel(axes[4], rows, "classifier_accuracy", "class accuracy (Fashion-MNIST classifier)")
    unique = {}  # label -> handle, first seen, from the panels that draw every series
    for ax in fig.axes[:2] + [fig.axes[-1]]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            unique.setdefault(lab, h)
    fig.legend(unique.values(), unique.keys(), loc="outside lower center", ncols=len(unique), fontsize=7, frameon=False)
    images = int(rows["images"].min())
    fig.suptitle(f"{model}: LANTERN at k = {k} over δ, {images} images per method, 95 % intervals", fontsize=9)
    return fig


def parse_args(argv=None):
    p = ArgumentParser(prog="figure_quality_grid.py", description=__doc__.split("\n")[0])
    p.add_argument("run", type=path_arg, help="a lantern.paper run directory with the fig5 item")
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
    out = Path(args.out) if args.out else ROOT / "figures" / f"{args.model.replace('-', '')}_quality_grid"
    with style():
        written = save_figure(figure(rows, args.k, args.model, args.extractor), out)
    rows.to_csv(out.with_suffix(".csv"), index=False)
    print(rows.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print("wrote " + ", ".join(str(p) for p in written + [out.with_suffix(".csv")]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
