"""The training and test sequences of a ``python -m lantern.drafter.train`` run, from its flags:
a token file (``--tokens``), sequences the target generates (``--self-generate``, with
``--with-data`` mixed with data tokens as EAGLE trains), or Fashion-MNIST for the embedded
models; kept to ``--classes`` and cut to ``--train-size`` / ``--test-size``
(:mod:`lantern.drafter.data` holds the token sets and the feature cache)."""

from __future__ import annotations

import sys
from typing import Optional

from ambiguity.cli import sampling_from_args
from ambiguity.conditions import check_labels, parse_classes
from ambiguity.data.fashion_mnist import model_image_size
from ambiguity.distributed import SINGLE, Shard
from ambiguity.errors import UsageError
from ambiguity.io import abspath
from ambiguity.memory import check_count
from ambiguity.models.base import TokenModel
from ambiguity.runs import RunDir
from lantern.drafter.data import (
    TokenSet,
    check_tokens,
    fashion_mnist_tokens,
    load_token_file,
    load_token_part,
    mix_token_sets,
    read_conditions,
    save_token_part,
    self_generate,
    split_holdout,
)

__all__ = [
    "data_settings",
    "training_sequences",
    "data_tokens",
    "keep_classes",
    "check_sizes",
    "first_sequences",
    "takes_fashion_mnist",
]


def data_settings(args) -> dict:
    """What decides the training sequences (part of the run record)."""
    return {
        "tokens": abspath(args.tokens),
        "conditions": abspath(args.conditions),
        "self_generate": args.self_generate,
        "data": abspath(args.data),
        "train_size": args.train_size,
        **({"classes": parse_classes(args.classes)} if args.classes else {}),
        "test_size": args.test_size,
        "seed": args.seed,
        "with_data": args.with_data,
        "sampling": {k: getattr(args, k) for k in ("cfg", "temperature", "top_k", "top_p")}
        if args.self_generate
        else None,
    }


def training_sequences(
    args, model: TokenModel, run: RunDir, shard: Shard = SINGLE
) -> Optional[tuple[TokenSet, TokenSet]]:
    """Train/test sequences: reused from the run's parts, else from --tokens, --self-generate or
    Fashion-MNIST (then saved as parts ``tokens_train`` / ``tokens_test`` by shard 0). None on an
    independent shard, which only samples its share of ``--self-generate``."""
    train, test = (load_token_part(run, f"tokens_{split}", {"split": split}) for split in ("train", "test"))
    if train is None or test is None:
        if args.with_data and not args.self_generate:
            raise UsageError("--with-data mixes data tokens into --self-generate N; pass --self-generate too")
        if args.tokens and args.self_generate and not args.with_data:
            raise UsageError("give either --tokens FILE or --self-generate N, not both (or both with --with-data)")
        classes = parse_classes(args.classes)
        if classes is not None and args.conditions:
            raise UsageError("give either --classes LIST or --conditions FILE, not both")
        conds = read_conditions(args.conditions) if args.conditions else classes
        if args.self_generate:
            sampling = sampling_from_args(args, model.kind)
            ts = self_generate(
                model,
                args.self_generate,
                sampling,
                conds,
                args.gen_batch_size,
                args.seed,
                run,
                progress=not args.no_progress,
                shard=shard,
            )
            if ts is None:
                return None
            if args.with_data:  # EAGLE: target-generated and data sequences together; tested on held-out data
                train, test = data_tokens(args, model, classes)
                train = mix_token_sets([train, ts], args.seed)
            else:
                train, test = split_holdout(ts, args.test_size, args.seed)
                train = first_sequences(train, args.train_size)
        else:
            train, test = data_tokens(args, model, classes)
        if shard.index == 0:
            save_token_part(run, "tokens_train", train, {"split": "train"})
            save_token_part(run, "tokens_test", test, {"split": "test"})
        shard.barrier()
    check_tokens(train, model)
    check_tokens(test, model)
    return train, test


def keep_classes(ts: TokenSet, classes: list[int], what: str) -> TokenSet:
    """The sequences of ``ts`` whose class label is in ``classes`` (``--classes``); UsageError when
    none is left."""
    keep = [i for i, c in enumerate(ts.conditions) if c in set(classes)]
    if not keep:
        raise UsageError(
            f"no {what} sequence has a class in --classes {','.join(map(str, classes))}; pass classes the data holds"
        )
    return ts.subset(keep)


def check_sizes(args, model: TokenModel) -> None:
    """Refuse ``--train-size`` / ``--test-size`` / ``--classes`` that cannot work before any
    sequence is read or generated: sizes whose token table (int64, plus the 1 x S x S float32
    image of each sequence when real Fashion-MNIST images are encoded) cannot fit in memory, and
    classes outside the model's labels."""
    per = model.num_tokens * 8 + (4 * model.image_shape[-1] ** 2 if takes_fashion_mnist(model) else 0)
    for flag, n in (("--train-size", args.train_size), ("--test-size", args.test_size)):
        if n is not None:
            check_count(n, per, flag, f"its token sequences ({model.num_tokens} tokens each)")
    classes = parse_classes(args.classes)
    if classes is not None:
        if model.kind != "c2i":
            raise UsageError(f"--classes needs a class-conditional model; {model.name} is {model.kind}")
        check_labels(model, classes)


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


def first_sequences(ts: TokenSet, n: Optional[int]) -> TokenSet:
    """The first ``n`` sequences of ``ts`` (all when n is None or not smaller)."""
    return ts.subset(range(n)) if n is not None and len(ts) > n else ts


def data_tokens(args, model: TokenModel, classes: Optional[list[int]]) -> tuple[TokenSet, TokenSet]:
    """(train, test) data sequences: the --tokens file split by --test-size, else Fashion-MNIST's
    train / test splits for the embedded models; kept to ``classes`` (``--classes``), train cut to
    --train-size (a note when fewer exist)."""
    if args.tokens:
        train, test = split_holdout(load_token_file(args.tokens, args.conditions), args.test_size, args.seed)
    elif model.kind == "c2i" and model.num_classes == 10 and takes_fashion_mnist(model):
        train = fashion_mnist_tokens(model, "train", args.train_size, args.data, progress=not args.no_progress)
        test = fashion_mnist_tokens(model, "test", args.test_size, args.data, progress=not args.no_progress)
    else:
        raise UsageError(f"--model {model.name} needs training sequences: pass --tokens FILE or --self-generate N")
    if classes is not None:
        train, test = (keep_classes(ts, classes, what) for ts, what in ((train, "training"), (test, "test")))
    if args.train_size is not None and len(train) < args.train_size:
        _note(
            f"--train-size {args.train_size}: only {len(train)} training sequences exist ({train.source}); "
            f"training on all of them"
        )
    if args.test_size is not None and len(test) < args.test_size and not args.tokens:
        _note(
            f"--test-size {args.test_size}: only {len(test)} test sequences exist ({test.source}); "
            f"testing on all of them"
        )
    return first_sequences(train, args.train_size), test


def takes_fashion_mnist(model: TokenModel) -> bool:
    """Whether the model's images are Fashion-MNIST-sized (its data tokens come from the data set)."""
    try:
        return model_image_size(model.image_shape) is not None
    except NotImplementedError:
        return False
