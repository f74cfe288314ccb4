"""Train the embedded Fashion-MNIST model from scratch: VQ tokenizer, then class-conditional GPT.

    python scripts/train_embedded.py                      # both stages -> ambiguity/weights/
    python scripts/train_embedded.py --stage gpt          # GPT only (uses the shipped VQ file)
    python scripts/train_embedded.py --quick --out /tmp/w # seconds-long smoke run, tiny models
    python scripts/train_embedded.py --recipe embedded-16 # LlamaGen's token geometry (16384 codes, 16x16)
    python scripts/train_embedded.py --recipe embedded-16-long --epochs 6  # towards convergence

``embedded-16-long`` (issue 23): the embedded-16 GPT again, on the shipped VQ, for up to
``--epochs`` passes (cosine schedule over all of them), its test NLL measured on a fixed subset
of ``--eval-images`` test images after every epoch (curve in ``<run-dir>/gpt_curve.json``),
stopping once it gains less than ``--min-gain`` bits/token per epoch after ``--min-epochs``.
Its weights go to a staging directory (default ``<run-dir>/weights``, with a copy of the VQ),
never over the shipped files; ship by copying ``fashion16_gpt.safetensors`` from there.
It trains only the GPT (its ``--stage`` is ``gpt``; ``vq``/``all`` are refused); with ``--quick``
it first trains a quick VQ into the staging directory (the shipped VQ has 16384 codes, the quick
GPT 64), unless one is there. ``--snapshot`` refuses ``--fresh`` (which would delete the checkpoint).

Writes ``fashion_vq.safetensors``, ``fashion_gpt.safetensors`` (fp16, config in the metadata)
and ``embedded_metrics.json`` to ``--out`` (``--recipe embedded-16``: ``fashion16_*`` and
``embedded16_metrics.json``, images upsampled to 64 x 64, run dir ``runs/embedded-16``).
Checkpoints, token caches and per-stage results go to ``--run-dir``; rerunning the same command
resumes where an interrupted run stopped.
Test metrics are computed with the fp16 files as shipped (reloaded), on the Fashion-MNIST
test split: VQ reconstruction MSE/L1/PSNR and codebook usage, GPT teacher-forced NLL.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import NamedTuple

import torch

from ambiguity.cli import (
    ArgumentParser,
    add_data_arg,
    add_device_args,
    add_out_arg,
    add_progress_arg,
    cli_main,
    finite_float,
    positive_int,
    seed_int,
)
from ambiguity.data.fashion_mnist import find_dir, load_split
from ambiguity.errors import UsageError
from ambiguity.io import ensure_writable_dir, write_json
from ambiguity.models.base import resolve_device
from ambiguity.models.checkpoints import load_module, save_module
from ambiguity.models.embedded import VARIANTS, VQ_SKIP, WEIGHTS_DIR, load_gpt, load_vq
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.train import (
    CURVE_FILE,
    EpochStopConfig,
    embedded16_long_recipe,
    embedded16_recipe,
    embedded_recipe,
    gpt_nll,
    train_gpt,
)
from ambiguity.train_loop import count_params, load_checkpoint, save_checkpoint, steps_for_epochs
from ambiguity.train_vq import tokenize, train_vq, vq_metrics

ROOT = Path(__file__).resolve().parents[1]
# recipe name -> (VQConfig, VQTrainConfig, GPTConfig, GPTTrainConfig) of it; its files: VARIANTS[name]
RECIPES = {"embedded": embedded_recipe, "embedded-16": embedded16_recipe, "embedded-16-long": embedded16_long_recipe}
LONG = "embedded-16-long"  # trained by epochs with early stop, into a staging directory
VARIANT_OF = {LONG: "embedded-16"}  # recipe -> the VARIANTS entry whose files it writes


def variant_of(args) -> str:
    """The model (:data:`ambiguity.models.embedded.VARIANTS` entry) whose files ``--recipe`` writes:
    recorded as the files' ``variant`` (the recipe goes into ``recipe``), so the loader of that
    model takes them once shipped."""
    return VARIANT_OF.get(args.recipe, args.recipe)


EVAL_SUBSET_SEED = 0  # the per-epoch test subset is the same for every run and --seed


class StagePlaces(NamedTuple):
    """Where and how a training stage runs: the Fashion-MNIST folder, the weights folder, the run
    folder (checkpoints, token caches, stage records), the device and whether bars are shown.
    (A NamedTuple, not a dataclass: the tests load this script from its file, outside sys.modules.)"""

    data: Path
    out: Path
    run: Path
    device: torch.device
    progress: bool


def add_long_args(e) -> None:
    """The options of the embedded-16-long recipe (epochs, stop rule, evaluation, warm restart, snapshot)."""
    e.add_argument(
        "--epochs",
        type=finite_float,
        default=None,
        help="most passes over the training set in this run (default 6); with --init-from they come on top "
        "of the epochs the init has seen",
    )
    e.add_argument(
        "--min-gain",
        type=finite_float,
        default=None,
        help="stop once the test NLL gains less than this many bits/token per epoch (default 0.02)",
    )
    e.add_argument(
        "--min-epochs", type=finite_float, default=None, help="never stop before this many epochs (default 1.9)"
    )
    e.add_argument(
        "--eval-images",
        type=positive_int,
        default=None,
        help="test images (a fixed seeded subset) for the per-epoch NLL (default 1000)",
    )
    e.add_argument(
        "--evals-per-epoch",
        type=positive_int,
        default=None,
        help="test evaluations per pass over the training set (default 4; one more before the first step); "
        "the stop rule compares the last with the one an epoch earlier",
    )
    e.add_argument(
        "--init-from",
        default=None,
        help="continue from these GPT weights (a warm restart, e.g. ambiguity/weights/fashion16_gpt.safetensors "
        "or a --snapshot of an earlier run) instead of a random init",
    )
    e.add_argument(
        "--init-epochs",
        type=finite_float,
        default=None,
        help="epochs the --init-from weights have seen, when their file does not record it "
        "(0.48 for the shipped fashion16_gpt.safetensors)",
    )
    e.add_argument(
        "--lr",
        type=finite_float,
        default=None,
        help="peak learning rate of this run (warmup, then cosine decay; default the recipe's 1e-3). A warm "
        "restart from a run that decayed to its end (1e-4) re-warms to this: 1e-3 raised the test NLL "
        "3.42 -> 3.87 bits/token in the first quarter epoch (measured), so use a lower one, e.g. 3e-4",
    )
    e.add_argument(
        "--snapshot",
        default=None,
        metavar="PATH",
        help="write the model of the run's latest checkpoint to PATH (fp16, its epochs recorded; parent "
        "directories are created) and exit; a later run continues from it with --init-from PATH",
    )


def parse_args(argv=None):
    p = ArgumentParser(prog="train_embedded.py", description=__doc__.split("\n")[0])
    add_data_arg(p)
    add_out_arg(p, "where the weight files go (default ambiguity/weights; with --quick <run-dir>/weights)")
    p.add_argument(
        "--run-dir", default=None, help="checkpoints and caches (default runs/<recipe>, runs/<recipe>-quick)"
    )
    p.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="embedded",
        help="embedded (1024 codes, 8x8 tokens), embedded-16 (16384 codes, 16x16 tokens) or "
        "embedded-16-long (embedded-16 by epochs with early stop, into a staging directory)",
    )
    add_long_args(p.add_argument_group("embedded-16-long only"))
    p.add_argument(
        "--stage",
        choices=["vq", "gpt", "all"],
        default=None,
        help=f"which models to train (default all; gpt, the only one, with --recipe {LONG})",
    )
    p.add_argument("--seed", type=seed_int, default=0)
    add_device_args(p, dtype=False, threads=0)
    p.add_argument("--quick", action="store_true", help="tiny models, a few steps, a data subset (smoke test)")
    p.add_argument("--fresh", action="store_true", help="discard checkpoints in --run-dir and start over")
    add_progress_arg(p)
    return p.parse_args(argv)


def file_sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def stage_done(done: dict, weights: Path, model_cfg, train_cfg, seed: int) -> bool:
    """Whether ``done`` (a run dir's ``*_done.json``) records this recipe and the file as it is now."""
    m = done.get("metrics", {})
    return (
        weights.is_file()
        and done.get("sha") == file_sha(weights)
        and done.get("seed", seed) == seed
        and _with_defaults(m.get("config"), model_cfg) == asdict(model_cfg)
        and _with_defaults(m.get("train"), train_cfg) == asdict(train_cfg)
    )


def _with_defaults(recorded, cfg) -> dict:
    """``recorded`` (a config dict from an older run) completed with the defaults of fields
    ``cfg``'s dataclass gained since (e.g. ``bf16``), so old records still match."""
    if not isinstance(recorded, dict):
        return {}
    return {**asdict(type(cfg)()), **recorded}


def cached_tokens(
    vq, images, path: Path, vq_sha: str, progress: bool, desc: str, chunk: int = 5000
) -> tuple[torch.Tensor, float]:
    """Codes (N, h*w) int64 of ``images`` under the VQ whose file hash is ``vq_sha``, cached in
    ``path``, and the seconds the tokenization took (when it was computed, also on a cache hit).

    Tokenizes ``chunk`` images at a time and saves the codes so far after each chunk (key
    ``done``), so an interrupted tokenization resumes at its last chunk.
    """
    try:
        ck = load_checkpoint(path, keys=("vq_sha", "codes"))
    except UsageError:
        print(f"note: the token cache {path} is damaged; recomputing it", file=sys.stderr)
        ck = None
    n = images.shape[0]
    parts, seconds = [], 0.0
    if ck is not None and ck["vq_sha"] == vq_sha and ck.get("n", ck["codes"].shape[0]) == n:
        if ck["codes"].shape[0] == n:
            return ck["codes"].long(), float(ck.get("time_s", float("nan")))
        parts, seconds = [ck["codes"]], float(ck["time_s"])
        print(f"{desc}: resuming at image {ck['codes'].shape[0]}/{n}", flush=True)
    done = sum(p.shape[0] for p in parts)
    while done < n:
        t0 = time.perf_counter()
        parts.append(tokenize(vq, images[done : done + chunk], progress=progress, desc=desc).short())
        seconds += time.perf_counter() - t0
        done += parts[-1].shape[0]
        save_checkpoint(path, vq_sha=vq_sha, codes=torch.cat(parts), n=n, time_s=seconds)
        if not progress:
            print(f"{desc}: {done}/{n} images, {seconds:.0f} s", flush=True)
    return torch.cat(parts).long(), seconds


def run_vq(args, recipe, places: StagePlaces) -> dict:
    """The VQ stage: train (or resume) the tokenizer, ship it, measure it on the test split."""
    vq_cfg, vq_train = recipe[:2]
    data, out, run, device, progress = places.data, places.out, places.run, places.device, places.progress
    VQ_FILE, _, _, size = VARIANTS[VARIANT_OF.get(args.recipe, args.recipe)]
    done = read_json(run / "vq_done.json")
    if stage_done(done, out / VQ_FILE, vq_cfg, vq_train, args.seed):
        print(f"VQ stage already done ({out / VQ_FILE}); pass --fresh to retrain")
        return done["metrics"]
    images, _ = load_split("train", data, limit=64 if args.quick else None, size=size)
    test, _ = load_split("test", data, limit=32 if args.quick else None, size=size)
    vq, stats = train_vq(vq_cfg, vq_train, images, run, args.seed, device, progress)
    meta = dict(seed=args.seed, stage="vq", variant=variant_of(args), recipe=args.recipe)
    save_module(vq, vq_cfg, out / VQ_FILE, skip=VQ_SKIP, **meta)
    shipped, _ = load_vq(out / VQ_FILE, device)
    t0 = time.perf_counter()
    test_metrics, _ = vq_metrics(shipped, test, progress=progress)
    metrics = {
        "config": asdict(vq_cfg),
        "train": asdict(vq_train),
        "parameters": count_params(vq),
        **stats,
        "eval_time_s": time.perf_counter() - t0,
        "train_images": int(images.shape[0]),
        "test": {**test_metrics, "images": int(test.shape[0])},
    }
    write_json({"sha": file_sha(out / VQ_FILE), "seed": args.seed, "metrics": metrics}, run / "vq_done.json")
    return metrics


def eval_subset(n: int, k: int) -> torch.Tensor:
    """Indices (min(k, n),) int64, sorted, of the test images the per-epoch NLL is measured on
    (drawn with the fixed seed ``EVAL_SUBSET_SEED``)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(EVAL_SUBSET_SEED))[:k].sort().values


def long_settings(args) -> tuple[float, EpochStopConfig, int]:
    """(most epochs, stop rule, test images per evaluation) of the embedded-16-long recipe from
    the flags. Raises UsageError for these flags with another recipe or out-of-range values."""
    given = [
        f
        for f, v in (
            ("--epochs", args.epochs),
            ("--min-gain", args.min_gain),
            ("--min-epochs", args.min_epochs),
            ("--eval-images", args.eval_images),
            ("--evals-per-epoch", args.evals_per_epoch),
            ("--init-from", args.init_from),
            ("--init-epochs", args.init_epochs),
            ("--lr", args.lr),
            ("--snapshot", args.snapshot),
        )
        if v is not None
    ]
    if args.recipe != LONG:
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise UsageError(f"{', '.join(given)} only {verb} to --recipe {LONG}")
        return 0.0, None, 0
    if args.stage in ("vq", "all"):
        raise UsageError(
            f"--recipe {LONG} trains only the GPT on the shipped VQ; drop --stage {args.stage} "
            "(--recipe embedded-16 retrains the VQ)"
        )
    if args.snapshot is not None and args.fresh:
        raise UsageError("--fresh would delete the checkpoint --snapshot writes out; drop --fresh")
    if args.lr is not None and not 0 < args.lr < 1:
        raise UsageError(f"--lr must be in (0, 1), got {args.lr:g}")
    epochs = 6.0 if args.epochs is None else args.epochs
    if epochs <= 0:
        raise UsageError(f"--epochs must be > 0, got {epochs}")
    stop = EpochStopConfig(
        **{k: v for k, v in (("min_gain_bits", args.min_gain), ("min_epochs", args.min_epochs)) if v is not None},
        evals_per_epoch=args.evals_per_epoch or 4,
        eval_at_start=True,
    )
    if stop.min_epochs < 0:
        raise UsageError(f"--min-epochs must be >= 0, got {stop.min_epochs}")
    if args.init_epochs is not None and (args.init_from is None or args.init_epochs < 0):
        raise UsageError("--init-epochs needs --init-from and a value >= 0")
    if args.snapshot is not None and args.init_from is not None:
        raise UsageError("--snapshot only writes the run's latest model; drop --init-from (pass it to the next run)")
    return epochs, stop, args.eval_images or 1000


def warm_start(args, gpt_cfg) -> tuple[str, dict, float] | None:
    """(file hash, state dict, epochs seen) of ``--init-from``, or None without it. Raises
    UsageError for a missing or unreadable file, a file of another architecture or one whose
    epochs are unknown (called before any tokenizing, so a typo costs seconds)."""
    if args.init_from is None:
        return None
    path = Path(args.init_from).expanduser()
    if not path.is_file():
        raise UsageError(f"--init-from {args.init_from} does not exist; pass a GPT weights file")
    model, meta = load_module(path, GPT, GPTConfig, fix="pass a GPT weights file to --init-from")
    if asdict(model.config) != asdict(gpt_cfg):
        raise UsageError(f"--init-from {args.init_from} is not an {LONG} GPT (its config differs); pass its weights")
    epochs = args.init_epochs if args.init_epochs is not None else meta.get("epochs")
    if epochs is None:
        raise UsageError(f"--init-from {args.init_from} does not record its epochs; pass --init-epochs")
    return file_sha(path), model.state_dict(), float(epochs)


def snapshot(args, recipe, run: Path) -> int:
    """``--snapshot PATH``: the model of ``run``'s latest GPT checkpoint -> PATH (fp16, with
    ``epochs`` in its metadata; PATH's directory is created). Raises UsageError when the run has
    no checkpoint, its checkpoint holds another GPT config (e.g. a ``--quick`` run without
    ``--quick``) or PATH's directory cannot be written."""
    ck = load_checkpoint(run / "gpt_ckpt.pt")
    if ck is None:
        raise UsageError(f"{run / 'gpt_ckpt.pt'} not found; train first (same --run-dir)")
    gpt_cfg, rec = recipe[2], ck["recipe"]
    if _with_defaults(rec.get("gpt_config"), gpt_cfg) != asdict(gpt_cfg):
        other = RECIPES[args.recipe](not args.quick)[2]
        if _with_defaults(rec.get("gpt_config"), other) == asdict(other):
            fix = "drop --quick" if args.quick else "add --quick"
            kind = "full-size" if args.quick else "--quick"
            raise UsageError(f"{run} holds a {kind} run (its GPT config differs); {fix}")
        raise UsageError(f"{run} holds no {args.recipe} run (its GPT config differs); pass the --run-dir of one")
    path = Path(args.snapshot).expanduser()
    if path.is_dir():
        raise UsageError(f"--snapshot {path} is a directory; pass a file path (e.g. {path / 'gpt.safetensors'})")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the directory of --snapshot {path} ({exc.strerror or exc}); pass another PATH"
        ) from None
    model = GPT(gpt_cfg)
    model.load_state_dict(ck["model"])
    step = ck["state"]["step"]
    epochs = rec.get("init_epochs", 0.0) + step * rec["train"]["batch_size"] / rec["n_sequences"]
    save_module(
        model, gpt_cfg, path, seed=args.seed, stage="gpt", variant=variant_of(args), recipe=args.recipe, epochs=epochs
    )
    print(f"wrote {path}: step {step}, {epochs:.3f} epochs")
    return 0


def staged_vq(args, out: Path, vq_file: str) -> Path:
    """The VQ file the GPT stage tokenizes with: ``out/vq_file`` (for a full-size
    embedded-16-long run the shipped VQ is copied there first, so the staging directory holds a
    loadable model). Raises UsageError when there is none."""
    if args.recipe == LONG and not args.quick and not (out / vq_file).is_file() and (WEIGHTS_DIR / vq_file).is_file():
        shutil.copyfile(WEIGHTS_DIR / vq_file, out / vq_file)  # the staging directory holds a loadable model
        print(f"copied the shipped VQ {WEIGHTS_DIR / vq_file} to {out}")
    if not (out / vq_file).is_file():
        raise UsageError(f"{out / vq_file} not found; run with --stage vq (or all) first")
    return out / vq_file


def matching_vq(args, path: Path, gpt_cfg, device):
    """The VQ at ``path`` on ``device``. Raises UsageError when its codebook does not fit the GPT's vocabulary."""
    vq, _ = load_vq(path, device)
    if vq.config.codebook_size != gpt_cfg.vocab_size:
        fix = "delete it or pass another --out" if args.recipe == LONG else "retrain the VQ with --stage all --fresh"
        raise UsageError(f"{path} has {vq.config.codebook_size} codes but the GPT expects {gpt_cfg.vocab_size}; {fix}")
    return vq


def gpt_sequences(args, vq, vq_sha: str, places: StagePlaces, size: int):
    """Token sequences of the training and test images under ``vq`` (cached in the run directory)
    -> (train tokens, train labels, test tokens, test labels, tokenizing seconds)."""
    images, labels = load_split("train", places.data, limit=64 if args.quick else None, size=size)
    test, test_labels = load_split("test", places.data, limit=32 if args.quick else None, size=size)
    run, progress = places.run, places.progress
    tokens, t_train = cached_tokens(vq, images, run / "tokens_train.pt", vq_sha, progress, "tokenize train")
    test_tokens, t_test = cached_tokens(vq, test, run / "tokens_test.pt", vq_sha, progress, "tokenize test")
    print(f"tokens: train {tuple(tokens.shape)}, test {tuple(test_tokens.shape)}", flush=True)
    return tokens, labels, test_tokens, test_labels, t_train + t_test


def long_run(args, gpt_train, n_train: int, test_tokens, test_labels, init):
    """What the embedded-16-long recipe adds to GPT training: (the training config with its step
    budget and learning rate, the per-evaluation test NLL, the stop rule, the curve's facts)."""
    epochs, stop, k = long_settings(args)
    steps = steps_for_epochs(epochs, n_train, gpt_train.batch_size)
    gpt_train = replace(gpt_train, steps=steps, lr=args.lr if args.lr is not None else gpt_train.lr)
    sub = eval_subset(test_tokens.shape[0], k)
    sub_tokens, sub_labels = test_tokens[sub], test_labels[sub]

    def evaluate(model):
        return gpt_nll(model, sub_tokens, sub_labels, progress=False)["nll_bits_per_token"]

    info = {
        "init_from": None if init is None else {"file": str(args.init_from), "sha": init[0], "epochs": init[2]},
        "recipe": args.recipe,
        "max_epochs": epochs,  # this run's; with --init-from they come on top of its epochs
        "max_total_epochs": epochs + (0.0 if init is None else init[2]),
        "eval_images": int(sub.numel()),
        "eval_subset_seed": EVAL_SUBSET_SEED,
        "seed": args.seed,
        "test_nll": "teacher-forced, true labels, no CFG, bits/token, on the fixed test subset",
    }
    return gpt_train, evaluate, stop, info


def run_gpt(args, recipe, places: StagePlaces, init=None) -> dict:
    """The GPT stage; ``init``: :func:`warm_start`'s result (checked before any work by ``main``)."""
    _, _, gpt_cfg, gpt_train = recipe[:4]
    VQ_FILE, GPT_FILE, _, size = VARIANTS[VARIANT_OF.get(args.recipe, args.recipe)]
    out, run, device = places.out, places.run, places.device
    vq_sha = file_sha(staged_vq(args, out, VQ_FILE))
    done = read_json(run / "gpt_done.json")
    if stage_done(done, out / GPT_FILE, gpt_cfg, gpt_train, args.seed) and done.get("vq_sha") == vq_sha:
        print(f"GPT stage already done ({out / GPT_FILE}); pass --fresh to retrain")
        return done["metrics"]
    vq = matching_vq(args, out / VQ_FILE, gpt_cfg, device)
    tokens, labels, test_tokens, test_labels, t_tokens = gpt_sequences(args, vq, vq_sha, places, size)
    evaluate, stop, long_info = None, None, {}
    if args.recipe == LONG:
        gpt_train, evaluate, stop, long_info = long_run(
            args, gpt_train, tokens.shape[0], test_tokens, test_labels, init
        )
    gpt, stats = train_gpt(
        gpt_cfg,
        gpt_train,
        tokens,
        labels,
        run,
        args.seed,
        device,
        places.progress,
        evaluate=evaluate,
        stop=stop,
        curve_info=long_info,
        init=init if args.recipe == LONG else None,
    )
    meta = dict(seed=args.seed, stage="gpt", vq_sha=vq_sha, variant=variant_of(args), recipe=args.recipe)
    save_module(gpt, gpt_cfg, out / GPT_FILE, **meta, epochs=stats["epochs"])
    shipped, _ = load_gpt(out / GPT_FILE, device)
    t0 = time.perf_counter()
    nll = gpt_nll(shipped, test_tokens, test_labels, progress=places.progress)
    metrics = {
        "config": asdict(gpt_cfg),
        "train": asdict(gpt_train),
        "parameters": count_params(gpt),
        **stats,
        "tokenize_time_s": t_tokens,
        "eval_time_s": time.perf_counter() - t0,
        "train_sequences": int(tokens.shape[0]),
        "test": nll,
    }
    if stop is not None:
        metrics.update(
            stop=asdict(stop),
            curve_file=str(run / CURVE_FILE),
            **{k: v for k, v in long_info.items() if k not in ("recipe", "seed")},
        )
    write_json(
        {"sha": file_sha(out / GPT_FILE), "vq_sha": vq_sha, "seed": args.seed, "metrics": metrics},
        run / "gpt_done.json",
    )
    return metrics


def summary(m: dict) -> str:
    rows = [("seed", m.get("seed"))]
    if "vq" in m:
        v, t = m["vq"], m["vq"]["test"]
        rows += [
            ("VQ parameters", f"{v['parameters']:,}"),
            ("VQ train steps x batch", f"{v['steps']} x {v['batch_size']}"),
            ("VQ train time", f"{v['train_time_s'] / 60:.1f} min"),
            ("VQ test MSE / L1 ([0,1] px)", f"{t['mse']:.5f} / {t['l1']:.4f}"),
            ("VQ test PSNR (pooled / per image)", f"{t['psnr_db']:.2f} / {t['psnr_db_per_image']:.2f} dB"),
            (
                "codebook size / usage / perplexity",
                f"{t['codebook_size']} / {100 * t['codebook_usage']:.1f}% / {t['code_perplexity']:.1f}",
            ),
        ]
    if "gpt" in m:
        g = m["gpt"]
        rows += [
            ("GPT parameters", f"{g['parameters']:,}"),
            ("GPT steps x batch", f"{g['steps']} x {g['batch_size']}"),
            ("GPT token budget", f"{g['token_budget']:,} tokens ({g['epochs']:.2f} epochs)"),
            ("GPT train time", f"{g['train_time_s'] / 60:.1f} min"),
            ("GPT final train loss", f"{g['final_train_loss_nats'] / 0.6931471805599453:.3f} bits/token"),
            ("GPT test NLL", f"{g['test']['nll_bits_per_token']:.3f} bits/token"),
        ]
        if "stop_reason" in g:
            rows.append(("GPT stopped", g["stop_reason"]))
            rows += [
                (
                    f"  test NLL after epoch {r['epoch']:.2f}",
                    f"{r['test_nll_bits']:.4f} bits/token ({g['eval_images']} images)",
                )
                for r in g["curve"]
            ]
    for name, size in m.get("files", {}).items():
        rows.append((name, f"{size / 1e6:.2f} MB"))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)

    if args.threads < 0:
        raise UsageError(f"--threads must be >= 0 (0 keeps torch's default), got {args.threads}")
    if args.threads:
        torch.set_num_threads(args.threads)
    long_settings(args)  # flag errors before any work
    args.stage = args.stage or ("gpt" if args.recipe == LONG else "all")
    device = resolve_device(args.device)
    data = find_dir(args.data)
    VQ_FILE, GPT_FILE, METRICS_FILE, size = VARIANTS[VARIANT_OF.get(args.recipe, args.recipe)]
    run_name = "runs/" + args.recipe + ("-quick" if args.quick else "")
    run = ensure_writable_dir(args.run_dir or ROOT / run_name, "--run-dir")
    staged = args.quick or args.recipe == LONG
    out = ensure_writable_dir(args.out or (run / "weights" if staged else WEIGHTS_DIR))
    if args.recipe == LONG and out.resolve() == WEIGHTS_DIR.resolve():
        raise UsageError(
            f"--recipe {LONG} writes to a staging directory, not {WEIGHTS_DIR}; pass another --out "
            f"and copy {GPT_FILE} from it once training ends"
        )
    if args.fresh:
        for f in (
            "vq_ckpt.pt",
            "gpt_ckpt.pt",
            "tokens_train.pt",
            "tokens_test.pt",
            "vq_done.json",
            "gpt_done.json",
            CURVE_FILE,
        ):
            (run / f).unlink(missing_ok=True)
    recipe = RECIPES[args.recipe](args.quick)
    if args.snapshot:
        return snapshot(args, recipe, run)
    init = warm_start(args, recipe[2]) if args.recipe == LONG and args.stage != "vq" else None
    places = StagePlaces(data, out, run, device, not args.no_progress)
    metrics = read_json(out / METRICS_FILE)
    metrics.update(
        seed=args.seed,
        quick=args.quick,
        device=str(device),
        threads=torch.get_num_threads(),
        data="Fashion-MNIST (Xiao et al. 2017), 32x32 (28x28 padded 2 px)"
        + (f", bilinearly upsampled to {size}x{size}" if size != 32 else "")
        + ", 60k train / 10k test",
        torch=torch.__version__,
    )
    quick_vq = args.recipe == LONG and args.quick and not (out / VQ_FILE).is_file()
    if quick_vq:
        print(f"--quick: training a quick VQ into {out} (the shipped one has another codebook size)")
    if args.stage in ("vq", "all") or quick_vq:
        metrics["vq"] = run_vq(args, recipe, places)
        if args.stage == "vq":
            metrics.pop("gpt", None)  # a new VQ invalidates the old GPT's numbers
        write_json(metrics, out / METRICS_FILE)
    if args.stage in ("gpt", "all"):
        metrics["gpt"] = run_gpt(args, recipe, places, init)
        metrics["token_budget"] = metrics["gpt"]["token_budget"]
    metrics["files"] = {f: (out / f).stat().st_size for f in (VQ_FILE, GPT_FILE) if (out / f).is_file()}
    metrics["total_size_bytes"] = sum(metrics["files"].values())
    write_json(metrics, out / METRICS_FILE)
    print(summary(metrics))
    print(f"wrote {out / METRICS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
