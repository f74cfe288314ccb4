"""Figure of a GPT training curve: test NLL (and mean train loss) in bits/token against epochs.

    python scripts/figure_training_curve.py --run-dir /root/lantern-runs/embedded-16-long
        # -> figures/embedded16_training_curve.{png,pdf}
    python scripts/figure_training_curve.py --run-dir runs/embedded-16-long --out /tmp/curve
    python scripts/figure_training_curve.py --run-dir runs/e16 --run-dir runs/e16c   # warm restarts, in order
    python scripts/figure_training_curve.py --earlier figures/embedded16_training_curve.csv --run-dir runs/e16e
        # an earlier joined curve (its run dirs gone) continued by a later warm restart

Reads ``<run-dir>/gpt_curve.json`` (written by ``scripts/train_embedded.py --recipe
embedded-16-long`` after every epoch), so it works on the partial curve of a run still going.
Several ``--run-dir`` (a run and its warm restarts, in training order) join into one curve: a
restart's evaluation before its first step repeats the previous run's last one and is dropped, and
each restart is marked. The joined rows also go to ``<out>.csv`` (one row per evaluation, with its
``run_dir``). ``--earlier CSV`` starts the curve from such a CSV (e.g. the committed
``figures/embedded16_training_curve.csv`` once the earlier run dirs are gone): its runs come first,
in file order, and its rows of a run dir also given as ``--run-dir`` are dropped (that run's own
curve replaces them, so rerunning the same command never doubles rows).
The shipped ``embedded-16`` GPT's (0.48 epochs) full-test-split NLL is marked for reference when its
metrics file is present (the ``embedded`` model's bits/token, over 1024 codes, are not comparable).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from ambiguity import plots
from ambiguity.cli import ArgumentParser, add_out_arg, check_out_file, cli_main
from ambiguity.errors import UsageError
from ambiguity.io import write_table
from ambiguity.models.embedded import METRICS16_FILE, WEIGHTS_DIR
from ambiguity.train import CURVE_FILE

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = ArgumentParser(prog="figure_training_curve.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--run-dir",
        required=True,
        action="append",
        help=f"run directory holding {CURVE_FILE}; repeat it for warm restarts, in training order",
    )
    add_out_arg(p, "output path without suffix (default figures/embedded16_training_curve)", metavar="PATH")
    p.add_argument(
        "--earlier",
        metavar="CSV",
        help="the joined rows of an earlier curve (a CSV this script wrote, with run_dir); its runs come first",
    )
    p.add_argument("--no-reference", action="store_true", help="leave out the shipped models' test NLL")
    return p.parse_args(argv)


def read_curve(run_dir: Path) -> dict:
    """The curve record of ``run_dir`` (rows of epoch, step, test_nll_bits, train_loss_bits, ...).
    Raises UsageError when it is missing, unreadable or has no rows yet."""
    path = Path(run_dir) / CURVE_FILE
    try:
        curve = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path} not found; the run has not finished an epoch yet (or --run-dir is wrong)") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not readable JSON ({type(exc).__name__}); wait for the next epoch") from None
    if not curve.get("rows"):
        raise UsageError(f"{path} has no rows yet; wait for the first epoch to end")
    return curve


def read_earlier(path: Path, skip: list[str]) -> tuple[list[dict], list[str]]:
    """The runs of an earlier joined curve CSV (columns epoch, step, test_nll_bits, run_dir, ...),
    as curve records in file order and their run dirs, leaving out the rows of the run dirs in
    ``skip``. Each later run's ``init_from`` epochs is the previous run's last epoch (the joined CSV
    has dropped its step-0 row). Raises UsageError for a missing or unreadable file or one without
    those columns."""
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise UsageError(f"--earlier {path} not found; pass the CSV this script wrote beside its figure") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--earlier {path} is not a readable CSV ({type(exc).__name__})") from None
    missing = {"epoch", "step", "test_nll_bits", "run_dir"} - set(df.columns)
    if missing:
        raise UsageError(f"--earlier {path} lacks columns {sorted(missing)}; pass a CSV this script wrote")
    df = df[~df["run_dir"].astype(str).isin([str(d) for d in skip])]
    df = df.astype(object).where(df.notna(), None)  # empty cells (the first row's train loss) -> None
    curves, names = [], []
    for _, rows in df.groupby((df["run_dir"] != df["run_dir"].shift()).cumsum(), sort=True):
        rows = rows.to_dict("records")
        start = {"init_from": {"epochs": curves[-1]["rows"][-1]["epoch"]}} if curves else {}
        curves.append({**start, "rows": rows})
        names.append(str(rows[0]["run_dir"]))
    return curves, names


def join_curves(curves: list[dict], names: list[str]) -> dict:
    """One curve from a run and its warm restarts (``curves`` in training order, ``names`` their run
    dirs): the last curve's record with every run's rows, each tagged ``run_dir``, and
    ``restarts`` (the epochs each later run started from). A restart's row at step 0 (its init's
    NLL, the previous run's last model) is dropped when the previous run has a row at that epoch.
    Raises UsageError when a run starts before the previous one ends (run dirs out of order)."""
    rows, restarts = [], []
    for i, (c, name) in enumerate(zip(curves, names)):
        mine = [{**r, "run_dir": name} for r in c["rows"]]
        if i:
            start = float((c.get("init_from") or {}).get("epochs", mine[0]["epoch"]))
            if start < rows[-1]["epoch"] - 1e-3:
                raise UsageError(
                    f"{name} starts at {start:.2f} epochs, before {names[i - 1]} ends ({rows[-1]['epoch']:.2f}); "
                    f"pass the --run-dir in training order"
                )
            restarts.append(start)
            if mine[0]["step"] == 0 and abs(mine[0]["epoch"] - rows[-1]["epoch"]) < 1e-3:
                mine = mine[1:]
        rows += mine
    return {**curves[-1], "rows": rows, "restarts": restarts}


def shipped_references(weights: Path = WEIGHTS_DIR) -> dict[str, tuple[float, float]]:
    """{model: (epochs, full-test NLL bits/token)} of the shipped embedded-16 GPT when its metrics exist."""
    out = {}
    for name, f in (("embedded-16 as shipped", METRICS16_FILE),):
        try:
            g = json.loads((weights / f).read_text())["gpt"]
            out[name] = (float(g["epochs"]), float(g["test"]["nll_bits_per_token"]))
        except (OSError, ValueError, KeyError):
            continue
    return out


def plot_curve(curve: dict, path: Path, references: dict[str, tuple[float, float]] | None = None) -> list[Path]:
    """Test NLL (fixed test subset) and mean train loss since the previous evaluation, bits/token,
    against epochs; ``references`` ({name: (epochs, bits/token)}) as single marked points.
    Writes PNG + PDF, returns the paths."""
    rows = curve["rows"]
    ep = [r["epoch"] for r in rows]
    with plots.style():
        fig, ax = plots.new_figure(width=4.2, height=2.8)
        ax.plot(
            ep,
            [r["test_nll_bits"] for r in rows],
            marker="o",
            markersize=3,
            color=plots.color_for("target"),
            label=f"test NLL ({curve.get('eval_images', '?')} test images)",
        )
        trained = [r for r in rows if r.get("train_loss_bits") is not None]  # not the row before step 1
        ax.plot(
            [r["epoch"] for r in trained],
            [r["train_loss_bits"] for r in trained],
            marker="s",
            markersize=3,
            linestyle="--",
            color=plots.color_for("", 1),
            label="train loss (mean since the previous evaluation)",
        )
        for j, e in enumerate(curve.get("restarts", [])):
            ax.axvline(e, color="0.6", ls=":", lw=0.8, label="warm restart" if j == 0 else None)
        for i, (name, (e, nll)) in enumerate((references or {}).items()):
            ax.scatter(
                [e],
                [nll],
                marker="x",
                s=30,
                zorder=3,
                color=plots.color_for("", 3 + i),
                label=f"{name}: full test split",
            )
        ax.set_xlabel("epochs")
        ax.set_ylabel("bits / token")
        ax.set_xlim(left=0)
        budget = curve.get("max_total_epochs", curve.get("max_epochs", "?"))  # warm start: init + this run
        budget = f"{budget:.2f}" if isinstance(budget, (int, float)) else budget
        status = curve.get("stop_reason") or f"running (to at most {budget} epochs)"
        if len(status) > 60:
            status = "stopped: gain < " + f"{curve['stop']['min_gain_bits']} bits/token per epoch"
        ax.set_title(f"embedded-16 GPT ({curve.get('recipe', '?')}): {status}", fontsize=7)
        ax.legend(fontsize=6, frameon=False)
    return plots.save_figure(fig, path)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    curves, names = read_earlier(Path(args.earlier), args.run_dir) if args.earlier else ([], [])
    curve = join_curves(curves + [read_curve(Path(d)) for d in args.run_dir], names + args.run_dir)
    out = Path(args.out) if args.out else ROOT / "figures" / "embedded16_training_curve"
    check_out_file(out.with_suffix(".png"), "--out")
    refs = None if args.no_reference else shipped_references()
    written = plot_curve(curve, out, refs)
    written.append(write_table(pd.DataFrame(curve["rows"]), out.with_suffix(".csv")))
    for p in written:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
