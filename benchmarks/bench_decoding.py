"""Decoding sweep: chain vs static tree vs dynamic tree for AR / SD / LANTERN / LANTERN++, measured properly.

Two passes over the same configurations (temperature 0 with the greedy rule and temperature 1;
the embedded model and its shipped drafter by default):

1. **Statistics** — every configuration decodes ``--num-images`` conditions with the same seeds
   (image i draws from its own stream): τ (mean accepted length, bonus token counted),
   tokens per target forward, acceptance rate α, out-of-support acceptances, the offline
   quality proxies of the tokens (the target's NLL, nats/token; class consistency) and image
   quality against the real images (FID / KID / precision / recall per ``--extractors``,
   :func:`lantern.evaluate.score_images`), so speed stands next to quality.
2. **Speed** — after a warm-up pass, ``--repeats`` rounds; each round decodes the first
   ``--timing-images`` conditions with every configuration, in a fresh random order per round
   (interleaved, so drift and background load hit all methods alike). Reported per
   configuration: median seconds per image and the 25-75 % spread over rounds; the speed-up over
   AR as the ratio of total latencies (the paper's), with the median and quartiles of per-round
   ratios against AR in the same round as its spread; AR's
   milliseconds per target forward; and a flag where the speed-up exceeds the tokens per target
   forward (more than step compression can explain: a sign of a slow baseline loop).

The SD control (a relaxed rule's gain must not be a tuning artefact): SD with every chain
length in ``--sd-gammas`` and every dynamic-tree size in ``--sd-tree-sizes``; the fastest is
reported as the tuned SD baseline next to LANTERN.

Every configuration's statistics and every timing round are parts of a run directory
(``--out``, default ``runs/benchmarks/bench_decoding``), so an interrupted sweep resumes.
Writes ``decoding.parquet`` (one row per configuration), ``timing.parquet`` (one row per
configuration and round), ``summary.json`` and the figure ``--figure`` (default
``<out>/lantern_sweep.{png,pdf}``; the committed figures are ``--figure figures/lantern_sweep``)::

    nohup python benchmarks/bench_decoding.py > benchmarks/results/decoding.log 2>&1 &

``--replot benchmarks/results/decoding.parquet --figure figures/lantern_sweep`` recomputes the
speed columns of a results file from its timing rounds and redraws the figure without decoding
anything (``--figure`` defaults to ``lantern_sweep`` next to the results file).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ambiguity import plots
from ambiguity.cli import (
    ArgumentParser,
    add_guidance_arg,
    add_model_args,
    add_out_arg,
    add_overwrite_arg,
    add_threads_arg,
    check_out_dir,
    check_out_file,
    cli_main,
    device_from_args,
    finite_float,
    float_list,
    int_list,
    nonneg_int,
    positive_int,
    set_threads,
)
from ambiguity.errors import UsageError
from ambiguity.io import write_json, write_table
from ambiguity.models.registry import load_model
from ambiguity.runs import RunDir
from ambiguity.sampling import SamplingConfig, default_guidance
from lantern.drafter.model import drafter_digest, load_drafter
from lantern.engine.decode import DecodeConfig, check_depth, decode, neighbour_table
from lantern.evaluate import score_images
from lantern.methods.tree.spec import STATIC_TREES, TreeSpec
from lantern.quality.features import EXTRACTORS
from lantern.run_reader import target_scores
from lantern.timing import interleaved_timing, speedup_table

ROOT = Path(__file__).resolve().parents[1]
QUALITY = ("fid", "kid", "precision", "recall")
COMMAND = "python benchmarks/bench_decoding.py"


def sweep(
    gamma: int, ks, deltas, lams, static: str, dynamic: TreeSpec, sd_gammas, sd_sizes
) -> list[tuple[str, DecodeConfig]]:
    """(name, config) of every configuration of one temperature: AR; the SD control (chain lengths,
    dynamic-tree sizes, the static tree); LANTERN (k x δ) and LANTERN++ (λ) on a chain of
    ``gamma``, the static tree and the dynamic tree."""
    shapes = {"chain": None, "static": TreeSpec("static", STATIC_TREES[static], name=static), "dynamic": dynamic}
    out = [("ar", DecodeConfig.of("ar"))]
    out += [(f"sd-chain{g}", DecodeConfig.of("sd", g)) for g in sd_gammas]
    out += [
        (
            f"sd-dynamic{n}",
            DecodeConfig.of("sd", tree=TreeSpec("dynamic", total_tokens=n, depth=dynamic.depth, top_k=dynamic.top_k)),
        )
        for n in sd_sizes
    ]
    out.append(("sd-static", DecodeConfig.of("sd", tree=shapes["static"])))
    for shape, tree in shapes.items():
        out += [
            (f"lantern-{shape}-k{k}-d{d:g}", DecodeConfig.of("lantern", gamma, tree=tree, k=k, delta=d))
            for k in ks
            for d in deltas
        ]
        out += [
            (
                f"lantern++-{shape}-k{max(ks)}-l{lam:g}",
                DecodeConfig.of("lantern++", gamma, tree=tree, k=max(ks), lam=lam),
            )
            for lam in lams
        ]
    return out


def _shape(config: DecodeConfig) -> str:
    return "ar" if config.rule is None else (config.tree.label if config.tree is not None else f"chain{config.gamma}")


def statistics(
    model,
    drafter,
    table,
    config: DecodeConfig,
    sampling: SamplingConfig,
    conditions,
    extractors=(),
    batch_size: int = 1,
) -> dict:
    """One configuration over all conditions: the decode's summary, the quality proxies and, with
    ``extractors``, image quality against the real images (:func:`lantern.evaluate.score_images`:
    FID / KID / precision / recall per extractor). ``batch_size``: images per forward for AR,
    chains and draft trees (:mod:`lantern.engine.loop`)."""
    d = decode(
        model,
        conditions,
        config,
        sampling,
        drafter if config.speculative else None,
        table if config.speculative and config.rule.relaxed else None,
        seed=0,
        pixels=bool(extractors) and model.can_decode,
        batch_size=batch_size,
    )
    s = d.summary()
    _, _, images = d.frames()
    images["codes"] = [t.tolist() for t in d.tokens]
    scores = target_scores(model, images)
    quality = {}
    if extractors and d.pixels is not None:
        q = score_images(d.pixels, extractors=extractors, conditions=conditions, class_names=model.class_names)
        quality = {m: v["value"] for m, v in q.items() if isinstance(v, dict) and m.split("_")[0] in QUALITY}
    rule = config.rule
    return {
        "method": config.method,
        "shape": _shape(config),
        "k": rule.k if rule and rule.relaxed else 0,
        "delta": rule.delta if rule and rule.method in ("lantern", "lantern-jsd") else 0.0,
        "lam": rule.lam if rule and rule.method == "lantern++" else 1.0,
        "images": s["images"],
        "tokens": s["tokens"],
        "target_forwards": s["target_forwards"],
        "steps": s["steps"],
        "acceptance_rate": s["acceptance_rate"],
        "tau": s["tau"],
        "accepted_per_step": s["mean_accepted_drafts"],
        "tokens_per_forward": s["tokens_per_forward"],
        "out_of_support": s["out_of_support"],
        "mean_j_star": s["mean_j_star"],
        "accept_histogram": json.dumps(s["accept_histogram"]),
        "nll": float(scores["nll"].mean()),
        "class_consistency": float(scores["consistent"].mean()) if "consistent" in scores else float("nan"),
        **quality,
    }


def plot_sweep(df: pd.DataFrame, path, title: str = "") -> list:
    """τ, speed-up and target NLL per LANTERN setting (rows: temperatures; x: the settings, which
    have no order, so points are not joined: one marker per drafting shape, side by side). The
    speed-up is the ratio of total latencies with the per-round quartiles as bars; the tuned SD
    and AR are horizontal lines; one legend below the panels. PNG + PDF."""
    temps = sorted(df["temperature"].unique())
    cols = (
        ("tau", "τ (bonus token counted)"),
        ("speedup", "speed-up vs AR\n(ratio of total latencies)"),
        ("nll", "target NLL (nats/token)"),
    )
    markers = "osD^v"
    with plots.style():
        fig, axes = plots.new_figure(len(temps), len(cols), width=8.0, height=2.3 * len(temps) + 0.5, squeeze=False)
        handles = {}
        for r, t in enumerate(temps):
            sub = df[(df["temperature"] == t) & df["method"].isin(["lantern", "lantern++"])]
            names = list(dict.fromkeys(sub["setting"]))
            shapes = list(dict.fromkeys(sub["shape_kind"]))
            for c, (col, label) in enumerate(cols):
                ax = axes[r, c]
                for j, shape in enumerate(shapes):
                    s = sub[sub["shape_kind"] == shape].set_index("setting").reindex(names)
                    x = np.arange(len(names)) + (j - (len(shapes) - 1) / 2) * 0.22
                    err = None
                    if col == "speedup" and {"speedup_q25", "speedup_q75"} <= set(s.columns):
                        err = np.vstack(
                            [(s[col] - s["speedup_q25"]).clip(lower=0), (s["speedup_q75"] - s[col]).clip(lower=0)]
                        )
                    h = ax.errorbar(
                        x,
                        s[col],
                        yerr=err,
                        fmt=markers[j % len(markers)],
                        ms=3.5,
                        capsize=1.5,
                        elinewidth=0.7,
                        color=plots.color_for(shape, j),
                    )
                    handles.setdefault(shape if shape in ("chain", "dynamic") else f"static tree {shape}", h)
                for m, ls in (("sd-best", "--"), ("ar", ":")):
                    row = df[(df["temperature"] == t) & (df["config"] == m)]
                    if len(row):
                        h = ax.axhline(float(row[col].iloc[0]), ls=ls, color="0.35", lw=0.9)
                        handles.setdefault({"sd-best": "SD, tuned", "ar": "AR"}[m], h)
                for xb in np.arange(len(names) - 1) + 0.5:  # separate the categories
                    ax.axvline(xb, color="0.9", lw=0.6, zorder=0)
                ax.set_xticks(
                    range(len(names)), [_setting_label(n) for n in names], rotation=45, ha="right", fontsize=5.5
                )
                ax.set_xlim(-0.6, len(names) - 0.4)
                ax.set_ylabel(label)
                ax.set_title(f"temperature {t:g}" + (" (greedy)" if t == 0 else ""), fontsize=7)
        fig.suptitle(
            title
            or "LANTERN (k neighbours, δ) and LANTERN++ (λ) by drafting shape; bars on the speed-up: "
            "quartiles of per-round ratios",
            fontsize=8,
        )
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="outside lower center",
            ncol=len(handles),
            fontsize=6,
            frameon=False,
        )
        return plots.save_figure(fig, path)


def _setting_label(setting: str) -> str:
    """``k32-d0.1`` -> ``k=32 δ=0.1``; ``k128-l2`` (LANTERN++) -> ``++ k=128 λ=2``."""
    k, _, rest = setting.partition("-")
    if rest.startswith("d"):
        return f"k={k[1:]} δ={rest[1:]}"
    if rest.startswith("l"):
        return f"++ k={k[1:]} λ={rest[1:]}"
    return setting


SPEED_COLUMNS = (
    "ms_per_image",
    "ms_per_image_q25",
    "ms_per_image_q75",
    "speedup_total",
    "speedup",
    "speedup_median",
    "speedup_q25",
    "speedup_q75",
    "baseline_ms_per_forward",
    "target_ms_per_forward",
    "rounds",
    "speedup_exceeds_tokens_per_forward",
)


def with_speed(stats: pd.DataFrame, timing: pd.DataFrame) -> pd.DataFrame:
    """Configuration rows (temperature, config, ...) joined with :func:`lantern.timing.speedup_table`
    of their temperature's timing rounds, plus the tuned SD control ``sd-best`` (the fastest SD
    configuration of each temperature)."""
    stats = stats[stats["config"] != "sd-best"].drop(columns=[c for c in SPEED_COLUMNS if c in stats.columns])
    speed = pd.concat(
        [
            speedup_table(timing[timing["temperature"] == t]).assign(temperature=t)
            for t in sorted(timing["temperature"].unique())
        ],
        ignore_index=True,
    )
    df = stats.merge(speed.drop(columns=["tokens_per_forward"]), on=["temperature", "config"])
    df["speedup_exceeds_tokens_per_forward"] = df["speedup"] > df["tokens_per_forward"]
    best = [
        df[(df["temperature"] == t) & (df["method"] == "sd")]
        .sort_values("speedup", ascending=False)
        .head(1)
        .assign(config="sd-best")
        for t in sorted(df["temperature"].unique())
    ]
    return pd.concat([df] + best, ignore_index=True)


def replot(path: Path, figure) -> list:
    """Recompute the speed columns of a results Parquet file (``decoding.parquet``) from its timing
    rounds (``<stem>_timing.parquet`` next to it, else ``timing.parquet``), rewrite it and redraw the figure."""
    timing_path = path.with_name(f"{path.stem}_timing.parquet")
    if not timing_path.is_file():
        timing_path = path.with_name("timing.parquet")
    if not path.is_file() or not timing_path.is_file():
        raise UsageError(f"--replot needs {path} and its timing rounds ({timing_path}); run the sweep first")
    df = with_speed(pd.read_parquet(path), pd.read_parquet(timing_path))
    write_table(df, path)
    return plot_sweep(df, figure)


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    add_model_args(ap, dtype=False)
    ap.add_argument("--drafter", default=None, help="default: the shipped drafter of --model")
    ap.add_argument("--num-images", type=positive_int, default=32, help="images per configuration for the statistics")
    ap.add_argument(
        "--batch-size",
        type=positive_int,
        default=1,
        help="images per forward for the statistics of AR, chain and tree rows (the timing stays at "
        "batch 1; default: 1)",
    )
    ap.add_argument("--timing-images", type=positive_int, default=8, help="images per configuration per timing round")
    ap.add_argument("--repeats", type=positive_int, default=5, help="interleaved timing rounds after a warm-up")
    ap.add_argument("--gamma", type=positive_int, default=4, help="chain length of LANTERN's chain rows")
    add_guidance_arg(ap, None, "guidance scale (default: 4.0 for c2i)")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument(
        "--top-k", type=nonneg_int, default=0, metavar="K", help="keep the k most likely tokens, 0 = all (default: 0)"
    )
    ap.add_argument(
        "--top-p", type=finite_float, default=1.0, metavar="P", help="nucleus mass in (0, 1], 1 = all (default: 1.0)"
    )
    ap.add_argument("--ks", default="32,128")
    ap.add_argument("--deltas", default="0.1,0.4")
    ap.add_argument("--lams", default="2")
    ap.add_argument("--static", default="mc_sim_7b_63", choices=sorted(STATIC_TREES))
    ap.add_argument("--total-tokens", type=positive_int, default=59)
    ap.add_argument("--depth", type=positive_int, default=4)
    ap.add_argument("--tree-top-k", type=positive_int, default=10)
    ap.add_argument("--sd-gammas", default="1,2,4,6", help="chain lengths of the SD control")
    ap.add_argument("--sd-tree-sizes", default="10,25,59", help="dynamic-tree sizes of the SD control")
    ap.add_argument(
        "--extractors",
        default="fmnist",
        help="image quality of every configuration's images (lantern.evaluate extractors; '' for none)",
    )
    add_threads_arg(ap, 2)
    add_out_arg(
        ap,
        "results directory (default: runs/benchmarks/bench_decoding)",
        default=str(ROOT / "runs" / "benchmarks" / "bench_decoding"),
    )
    ap.add_argument(
        "--figure",
        default=None,
        metavar="STEM",
        help="figure path without suffix (.png and .pdf are written; default: <out>/lantern_sweep, or "
        "lantern_sweep next to the --replot file; the committed one: figures/lantern_sweep)",
    )
    add_overwrite_arg(ap)
    ap.add_argument(
        "--replot",
        default=None,
        metavar="PARQUET",
        help="only recompute the speed-ups of a results file (e.g. benchmarks/results/decoding.parquet) "
        "from its timing rounds and redraw --figure; decodes nothing",
    )
    return ap


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.replot:
        args.figure = args.figure or str(Path(args.replot).with_name("lantern_sweep"))
        check_out_file(args.figure, "--figure")
        files = replot(Path(args.replot), args.figure)
        print(f"wrote {args.replot}, {', '.join(str(f) for f in files)}")
        return 0
    temps = float_list(args.temperatures, "--temperatures", 0.0, 10.0)
    ks, deltas = int_list(args.ks, "--ks", 1), float_list(args.deltas, "--deltas", 0.0, 1.0)
    lams = float_list(args.lams, "--lams", 1.0, 1e6)
    sd_gammas, sd_sizes = int_list(args.sd_gammas, "--sd-gammas", 1), int_list(args.sd_tree_sizes, "--sd-tree-sizes", 2)
    dynamic = TreeSpec("dynamic", total_tokens=args.total_tokens, depth=args.depth, top_k=args.tree_top_k)
    configs = sweep(args.gamma, ks, deltas, lams, args.static, dynamic, sd_gammas, sd_sizes)
    extractors = tuple(x.strip() for x in args.extractors.split(",") if x.strip())
    unknown = [x for x in extractors if x not in EXTRACTORS]
    if unknown:
        raise UsageError(f"unknown extractor {unknown[0]!r} in --extractors; choose from {', '.join(EXTRACTORS)}")
    out = check_out_dir(args.out)
    args.figure = args.figure or str(Path(out) / "lantern_sweep")
    check_out_file(args.figure, "--figure")
    SamplingConfig(top_k=args.top_k, top_p=args.top_p)  # bad filters fail here, before any work
    set_threads(args.threads)
    device, _ = device_from_args(args)
    model = load_model(args.model, weights=args.weights, device=device)
    int_list(ks, "--ks", 1, model.vocab_size - 1)
    for _, config in configs:
        check_depth(config, model)
    drafter = load_drafter(model, args.drafter)
    guidance = default_guidance(model.kind) if args.cfg is None else args.cfg
    conditions = model.default_conditions(args.num_images)
    table = neighbour_table(model, DecodeConfig.of("lantern", k=max(ks)))
    settings = {k: v for k, v in vars(args).items() if k not in ("overwrite", "figure", "out", "device")}
    settings.update(
        device=device.type, guidance=guidance, model_facts=model.describe(), drafter_digest=drafter_digest(drafter)
    )
    run = RunDir(out, settings, command=COMMAND, outputs=("decoding.parquet", "timing.parquet", "summary.json")).open(
        args.overwrite
    )

    stats = []
    for t in temps:
        sampling = SamplingConfig(guidance=guidance, temperature=t, top_k=args.top_k, top_p=args.top_p)
        for name, config in tqdm(configs, desc=f"statistics T={t:g}", unit="config"):
            part = run.read_part(f"stats-T{t:g}-{name}", {"config": name, "temperature": t})
            if part is None:
                row = {
                    "temperature": t,
                    "config": name,
                    **statistics(model, drafter, table, config, sampling, conditions, extractors, args.batch_size),
                }
                run.write_part(
                    f"stats-T{t:g}-{name}", {"config": name, "temperature": t}, tables={"row": pd.DataFrame([row])}
                )
                stats.append(row)
            else:
                stats.append(part.tables["row"].iloc[0].to_dict())

    rows_all = []
    named = dict(configs)
    tables = {name: table for name, c in configs if c.speculative and c.rule.relaxed}
    for t in temps:
        sampling = SamplingConfig(guidance=guidance, temperature=t, top_k=args.top_k, top_p=args.top_p)
        holds = lambda r: {"temperature": t, "round": r}
        done = [
            p.tables["rows"]
            for r in range(args.repeats)
            if (p := run.read_part(f"timing-T{t:g}-r{r}", holds(r))) is not None
        ]
        save = lambda r, rows, _: run.write_part(f"timing-T{t:g}-r{r}", holds(r), tables={"rows": rows})
        rows = interleaved_timing(
            model,
            named,
            sampling,
            conditions,
            [(0, args.timing_images)] * args.repeats,
            drafter,
            tables,
            seed=0,
            progress=True,
            done=pd.concat(done, ignore_index=True) if done else None,
            on_round=save,
        )
        rows_all.append(rows.assign(temperature=t))
    timing_df = pd.concat(rows_all, ignore_index=True)
    df = pd.DataFrame(stats)
    # "chain4" -> "chain", "dynamic(59,4,10)" -> "dynamic"; a static tree keeps its name ("mc_sim_7b_63")
    df["shape_kind"] = (
        df["shape"].str.replace(r"\(.*\)$", "", regex=True).str.replace(r"^chain\d+$", "chain", regex=True)
    )
    df["setting"] = df["config"].str.replace(r"^lantern(\+\+)?-(chain|static|dynamic)-", "", regex=True)
    df = with_speed(df, timing_df)  # with the tuned SD control: the fastest SD configuration of each temperature
    write_table(df, out / "decoding.parquet")
    write_table(timing_df, out / "timing.parquet")
    files = plot_sweep(df, args.figure)
    ar_ms = df[df["config"] == "ar"].set_index("temperature")["baseline_ms_per_forward"].to_dict()
    write_json(
        {"settings": settings, "ar_target_ms_per_forward": ar_ms, "results": df.to_dict(orient="records")},
        out / "summary.json",
    )
    shown = [
        "temperature",
        "config",
        "acceptance_rate",
        "tau",
        "tokens_per_forward",
        "ms_per_image",
        "speedup",
        "speedup_median",
        "speedup_q25",
        "speedup_q75",
        "nll",
        "class_consistency",
        "out_of_support",
    ]
    shown += [c for c in df.columns if c.split("_")[0] in QUALITY]
    print(
        f"{model.name}: statistics on {args.num_images} images, timing on {args.timing_images} images x "
        f"{args.repeats} interleaved rounds after a warm-up; cfg {guidance:g}, top-k {args.top_k or 'off'}, "
        f"top-p {args.top_p:g}, {args.threads} threads on {device}; "
        f"τ counts the bonus token"
    )
    print(f"AR: {', '.join(f'T={t:g} {ms:.2f} ms per target forward' for t, ms in ar_ms.items())}")
    print(df[shown].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    flagged = df[df["speedup_exceeds_tokens_per_forward"]]
    if len(flagged):
        print(
            f"note: {len(flagged)} configurations are faster than their tokens per forward explain: "
            f"{', '.join(flagged['config'])}"
        )
    print(f"wrote {out / 'decoding.parquet'}, {out / 'timing.parquet'}, {', '.join(str(f) for f in files)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
