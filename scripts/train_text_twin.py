"""Train the embedded text twin: the embedded image GPT's architecture on KJV English prose.

    python scripts/train_text_twin.py                 # the shipped twin (needs the image model's files)
    python scripts/train_text_twin.py --quick --out /tmp/twin   # seconds, tiny synthetic corpus

What is matched to the embedded image model (read from ``ambiguity/weights/fashion_gpt.safetensors``
metadata and ``embedded_metrics.json``): width, depth, heads, feed-forward size, vocabulary
size (= codebook size), tokens per sequence (64), the token budget (training tokens the image
GPT saw) and the optimiser (AdamW, learning rate, betas, weight decay, warmup + cosine decay,
batch size, gradient clipping, seed): the twin is trained by the very loop that trained the
image GPT, :func:`ambiguity.train.train_gpt`, with the image run's ``GPTTrainConfig``. See
:mod:`ambiguity.models.text_twin` for what differs (1D rotary positions, a BOS class token
without class dropout).

Data: the KJV from Debian's ``bible`` program (``apt-get install bible-kjv``) or ``--corpus
FILE``; every 10th chapter is held out. A byte-level BPE with exactly the codebook's number of
tokens is trained on the training chapters; a training sample is the 64 tokens that start at a
verse (see :mod:`ambiguity.data.text_corpus`).

Writes to ``--out`` (default ``ambiguity/weights``): ``text_twin.safetensors`` (fp16, config in
metadata), ``text_twin_tokenizer.json``, ``text_twin_heldout.safetensors`` (held-out passages
for ``--source dataset``) and ``text_twin_metrics.json``. A run directory (``--run-dir``,
default ``runs/text_twin``) holds the tokenised corpus and periodic checkpoints: rerunning the
same command resumes where it stopped. ``--drafter-tokens RUN_DIR`` also writes the twin's
training and held-out passages as token files for ``python -m lantern.drafter.train``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ambiguity.cli import (
    ArgumentParser,
    add_device_args,
    add_out_arg,
    add_progress_arg,
    check_out_dir,
    cli_main,
    nonneg_int,
    positive_int,
    seed_int,
)
from ambiguity.data import text_corpus as tc
from ambiguity.errors import UsageError
from ambiguity.io import atomic_path, ensure_writable_dir, save_tensors, write_json
from ambiguity.models.base import resolve_device
from ambiguity.models.checkpoints import save_module
from ambiguity.models.embedded import GPT_FILE, WEIGHTS_DIR, load_gpt
from ambiguity.models.embedded import METRICS_FILE as IMAGE_METRICS
from ambiguity.models.text_twin import HELDOUT_FILE, METRICS_FILE, TOKENIZER_FILE, TWIN_FILE, twin_config
from ambiguity.seeding import holdout_seed
from ambiguity.train import GPTTrainConfig, embedded_recipe, gpt_nll, train_gpt
from ambiguity.train_loop import count_params

HELDOUT_SHIPPED = 512  # held-out passages shipped for --source dataset (64 KB as int16)


# --------------------------------------------------------------------------- the image model
def image_reference(weights: Path):
    """(image GPTConfig, image GPTTrainConfig, image metrics dict) of the shipped embedded model.

    The config comes from the image GPT's safetensors metadata (``save_module`` format), the
    optimiser settings and token budget from ``embedded_metrics.json`` (``gpt.train``,
    ``gpt.token_budget``), both written by ``scripts/train_embedded.py``. Raises UsageError when
    either file is absent (the image model must be trained first).
    """
    gpt_path, metrics_path = weights / GPT_FILE, weights / IMAGE_METRICS
    if not gpt_path.is_file() or not metrics_path.is_file():
        raise UsageError(
            f"the image model ({gpt_path.name} + {metrics_path.name}) is not in {weights} yet; "
            f"train it first (python scripts/train_embedded.py) or pass --image-weights DIR"
        )
    cfg = load_gpt(gpt_path)[0].config  # a damaged or foreign file is a one-line UsageError
    try:
        metrics = json.loads(metrics_path.read_text())
        return cfg, GPTTrainConfig(**metrics["gpt"]["train"]), metrics
    except (ValueError, KeyError, TypeError):
        raise UsageError(
            f"{metrics_path} has no readable GPT training record; rerun python scripts/train_embedded.py --stage gpt"
        ) from None


def quick_reference():
    """A tiny stand-in for the image model (``--quick``): vocabulary 300, the smallest size a
    byte-level BPE over a toy corpus supports comfortably; 8 steps of batch 8."""
    cfg = dataclasses.replace(embedded_recipe(quick=True)[2], vocab_size=300)  # the quick image GPT, a text vocabulary
    return cfg, GPTTrainConfig(steps=8, batch_size=8, warmup=1, ckpt_every=4), {}


# --------------------------------------------------------------------------- data
def build_data(chapters, vocab_size: int, length: int, test_every: int, run_dir: Path) -> dict:
    """Tokenizer and passages, cached in ``run_dir/data.pt`` (+ tokenizer JSON) for resumes.

    Returns {"tokenizer", "train" (one passage per training verse, overlapping), "train_disjoint",
    "heldout" (disjoint passages of the held-out chapters), "stats"}; passages (P, length) int64.
    """
    cache = run_dir / "data.pt"
    key = hashlib.sha256(json.dumps([[c.name, c.verses] for c in chapters]).encode()).hexdigest()[:16]
    key = f"{key}-{vocab_size}-{length}-{test_every}"
    tok_path = run_dir / TOKENIZER_FILE
    if cache.is_file() and tok_path.is_file():
        data = torch.load(cache, weights_only=True)
        if data.get("key") == key:
            return {**data, "tokenizer": tc.load_tokenizer(tok_path)}
    train_ch, test_ch = tc.split_chapters(chapters, test_every)
    tok = tc.train_tokenizer(train_ch, vocab_size)
    tr_ids, tr_starts = tc.encode_chapters(tok, train_ch)
    te_ids, te_starts = tc.encode_chapters(tok, test_ch)
    data = {
        "key": key,
        "train": tc.passages(tr_ids, tr_starts, length),
        "train_disjoint": tc.passages(tr_ids, tc.disjoint_starts(tr_starts, length), length),
        "heldout": tc.passages(te_ids, tc.disjoint_starts(te_starts, length), length),
        "stats": {
            "chapters_train": len(train_ch),
            "chapters_heldout": len(test_ch),
            "verses_train": int(tr_starts.numel()),
            "verses_heldout": int(te_starts.numel()),
            "tokens_train": int(tr_ids.numel()),
            "tokens_heldout": int(te_ids.numel()),
            "words_train": sum(len(v.split()) for c in train_ch for v in c.verses),
        },
    }
    if data["train"].shape[0] < 2 or data["heldout"].shape[0] < 1:
        raise UsageError(f"the corpus gives too few {length}-token passages; pass a larger --corpus")
    with atomic_path(tok_path) as tmp:
        tok.save(str(tmp))
    with atomic_path(cache) as tmp:
        torch.save(data, tmp)
    return {**data, "tokenizer": tok}


def bos_labels(n: int) -> torch.Tensor:
    """The twin's condition for n sequences: class 0, the BOS token. (n,) int64."""
    return torch.zeros(n, dtype=torch.long)


def write_drafter_tokens(run_dir: Path, data: dict, test_size: int, train_size: int = 0, seed: int = 0) -> None:
    """Token files for the twin's EAGLE drafter (lantern.drafter.data format, BOS-only conditions).

    ``tokens_train``: the twin's training passages (one per verse start, as the twin saw them),
    or a seeded random subset of ``train_size`` of them (in corpus order); ``tokens_test``: up
    to ``test_size`` disjoint passages from the held-out chapters, so the drafter's test
    accuracy is measured on text neither model trained on (like the image drafter's
    Fashion-MNIST test split).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    train = data["train"]
    if 0 < train_size < train.shape[0]:
        keep = torch.randperm(train.shape[0], generator=torch.Generator().manual_seed(holdout_seed(seed)))[:train_size]
        train = train[keep.sort().values]
    for name, x, source in (
        ("tokens_train", train, "text twin training passages"),
        ("tokens_test", data["heldout"][:test_size], "text twin held-out passages"),
    ):
        save_tensors(
            {"tokens": x.to(torch.int32)},
            run_dir / f"{name}.safetensors",
            {"source": source, "conditions": [""] * x.shape[0]},
        )


def parse_args(argv):
    p = ArgumentParser(prog="train_text_twin.py", description=__doc__.split("\n")[0])
    add_out_arg(p, "where the shipped files go (default ambiguity/weights; with --quick <run-dir>/weights)")
    p.add_argument("--run-dir", default=None, help="checkpoints and the tokenised corpus (default runs/text_twin)")
    p.add_argument(
        "--image-weights",
        default=None,
        help="folder with the image model's fashion_gpt.safetensors "
        "and embedded_metrics.json (default ambiguity/weights)",
    )
    p.add_argument("--corpus", default=None, help="a UTF-8 text file instead of the KJV")
    p.add_argument("--test-every", type=positive_int, default=10, help="hold out every N-th chapter (default 10)")
    p.add_argument("--token-budget", type=positive_int, default=None, help="training tokens (default: the image GPT's)")
    p.add_argument("--seed", type=seed_int, default=0)
    add_device_args(p, dtype=False, threads=0)
    p.add_argument(
        "--drafter-tokens",
        default=None,
        metavar="RUN_DIR",
        help="also write tokens_train/tokens_test.safetensors for python -m lantern.drafter.train "
        "--model text-twin --run-dir RUN_DIR",
    )
    p.add_argument(
        "--drafter-train-size",
        type=nonneg_int,
        default=0,
        help="seeded subset of training passages in tokens_train (default 0: all)",
    )
    p.add_argument(
        "--drafter-test-size", type=positive_int, default=1000, help="held-out passages in tokens_test (default 1000)"
    )
    p.add_argument("--fresh", action="store_true", help="discard the checkpoint in --run-dir and start again")
    p.add_argument("--quick", action="store_true", help="tiny synthetic corpus and model, a few steps (smoke test)")
    add_progress_arg(p)
    return p.parse_args(argv)


def reference_and_corpus(args):
    """(image GPTConfig, GPTTrainConfig, image metrics, corpus chapters) of the options: the
    ``--quick`` stand-ins and synthetic corpus, or the shipped image model and the KJV (or ``--corpus``)."""
    if args.quick:
        return (*quick_reference(), tc.read_text_file(args.corpus) if args.corpus else tc.synthetic_corpus())
    return (*image_reference(Path(args.image_weights or WEIGHTS_DIR)), tc.load_corpus(args.corpus))


def ship_twin(gpt, cfg, data: dict, out: Path, corpus: str, seed: int, token_budget: int) -> None:
    """Write the shipped files: the twin (fp16, tokenizer hash and budget in its metadata), its
    tokenizer and the first held-out passages for ``--source dataset``."""
    tok_json = data["tokenizer"].to_str()
    meta = {
        "tokenizer_sha256": hashlib.sha256(tok_json.encode()).hexdigest(),
        "seed": seed,
        "stage": "text-twin",
        "corpus": corpus,
        "token_budget": token_budget,
    }
    save_module(gpt, cfg, out / TWIN_FILE, **meta)
    with atomic_path(out / TOKENIZER_FILE) as tmp:
        tmp.write_text(tok_json)
    save_tensors(
        {"tokens": data["heldout"][:HELDOUT_SHIPPED].to(torch.int16 if cfg.vocab_size < 2**15 else torch.int32)},
        out / HELDOUT_FILE,
        {
            "description": "held-out passages (chapters never trained on) for --source dataset",
            "corpus": corpus,
            "tokenizer_sha256": meta["tokenizer_sha256"],
        },
    )


def shipped_nll(out: Path, data: dict, device, progress: bool) -> tuple[dict, dict, float]:
    """Test metrics with the fp16 file as shipped, the same measure as the image model's:
    (held-out NLL, NLL of as many training passages, seconds)."""
    shipped, _ = load_gpt(out / TWIN_FILE, device)
    t0 = time.perf_counter()
    held = data["heldout"]
    heldout = gpt_nll(shipped, held, bos_labels(held.shape[0]), progress=progress)
    seen = data["train_disjoint"][: held.shape[0]]
    train_nll = gpt_nll(shipped, seen, bos_labels(seen.shape[0]), progress=progress)
    return heldout, train_nll, time.perf_counter() - t0


@cli_main
def main(argv=None) -> int:
    """Entry point; see the module docstring. Returns 0; UsageErrors exit 2 with one line."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    run_dir = ensure_writable_dir(
        args.run_dir or ROOT / ("runs/text_twin-quick" if args.quick else "runs/text_twin"), "--run-dir"
    )
    out = ensure_writable_dir(args.out or (run_dir / "weights" if args.quick else WEIGHTS_DIR))
    if args.drafter_tokens:
        check_out_dir(args.drafter_tokens, "--drafter-tokens")
    image_cfg, train_cfg, image_metrics, chapters = reference_and_corpus(args)
    cfg = twin_config(image_cfg)
    length = cfg.block_size
    if args.token_budget:  # same batch and schedule shape, as many steps as the budget needs
        train_cfg = dataclasses.replace(train_cfg, steps=math.ceil(args.token_budget / (train_cfg.batch_size * length)))
    if args.fresh:
        (run_dir / "gpt_ckpt.pt").unlink(missing_ok=True)

    t0 = time.perf_counter()
    data = build_data(chapters, cfg.vocab_size, length, args.test_every, run_dir)
    t_data = time.perf_counter() - t0
    train_x = data["train"]
    gpt, stats = train_gpt(
        cfg, train_cfg, train_x, bos_labels(train_x.shape[0]), run_dir, args.seed, device, progress=not args.no_progress
    )
    corpus = str(args.corpus or ("synthetic" if args.quick else "kjv"))
    ship_twin(gpt, cfg, data, out, corpus, args.seed, stats["token_budget"])
    if args.drafter_tokens:
        write_drafter_tokens(
            Path(args.drafter_tokens), data, args.drafter_test_size, args.drafter_train_size, args.seed
        )
    heldout, train_nll, eval_s = shipped_nll(out, data, device, not args.no_progress)
    held = data["heldout"]
    image_gpt = image_metrics.get("gpt", {})
    metrics = {
        "config": dataclasses.asdict(cfg),
        "train": dataclasses.asdict(train_cfg),
        "seed": args.seed,
        "image_config": dataclasses.asdict(image_cfg),
        "parameters": count_params(gpt),
        "image_parameters": image_gpt.get("parameters"),
        **stats,
        "corpus": corpus,
        **data["stats"],
        "passages_train": int(train_x.shape[0]),
        "passages_heldout": int(held.shape[0]),
        "corpus_passes": stats["token_budget"] / data["stats"]["tokens_train"],
        "test": {**heldout, "passages": int(held.shape[0])},
        "train_nll": train_nll,
        "image_test_nll_bits_per_token": image_gpt.get("test", {}).get("nll_bits_per_token"),
        "image_token_budget": image_metrics.get("token_budget"),
        "data_time_s": t_data,
        "eval_time_s": eval_s,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "files": {f: (out / f).stat().st_size for f in (TWIN_FILE, TOKENIZER_FILE, HELDOUT_FILE)},
    }
    write_json(metrics, out / METRICS_FILE)
    print(summary(metrics, out))
    return 0


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def summary(m: dict, out: Path) -> str:
    """The table printed at the end of a run."""
    c, bits = m["config"], 1 / math.log(2)
    rows = [
        (
            "architecture",
            f"GPT dim {c['dim']}, {c['n_layer']} layers, {c['n_head']} heads, vocab {c['vocab_size']}, "
            f"{c['block_size']} tokens, rope 1d, BOS class token",
        ),
        ("parameters", f"{m['parameters']:,} (image GPT {m['image_parameters'] or 'n/a'})"),
        (
            "corpus",
            f"{m['corpus']}: {m['tokens_train']:,} train / {m['tokens_heldout']:,} held-out tokens, "
            f"{m['passages_train']:,} training passages",
        ),
        (
            "token budget",
            f"{m['token_budget']:,} = {m['steps']} steps x {m['batch_size']} x {c['block_size']} "
            f"(image GPT: {m['image_token_budget'] or 'n/a'}); {m['corpus_passes']:.2f} corpus passes",
        ),
        ("train time", f"{m['train_time_s'] / 60:.1f} min"),
        ("final train loss", f"{m['final_train_loss_nats'] * bits:.3f} bits/token"),
        (
            "held-out NLL",
            f"{m['test']['nll_bits_per_token']:.3f} bits/token "
            f"(train passages {m['train_nll']['nll_bits_per_token']:.3f}; image GPT test "
            f"{_fmt(m['image_test_nll_bits_per_token'])})",
        ),
        ("written", f"{out}/: {TWIN_FILE}, {TOKENIZER_FILE}, {HELDOUT_FILE}, {METRICS_FILE}"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


if __name__ == "__main__":
    raise SystemExit(main())
