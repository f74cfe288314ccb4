"""A draft vocabulary for the drafter's head: the V_d codes that hold most of the target's mass.

EAGLE-3 (Li et al., 2025, arXiv 2503.01840, Sec. 3) lets the drafter predict over the most
frequent tokens of the training data only, so its output layer is V_d x H instead of V x H. Here
the codes are ranked by the target's own probability mass: the target samples images with the
user's sampling (:func:`lantern.drafter.data.self_generate`), is teacher-forced on them, and every
position's sampling distribution p (guidance, temperature, top-k / top-p) is summed per code
(:func:`code_mass`). The V_d codes of largest mass (:func:`select_draft_vocab`) become the
drafter's ``draft_vocab``: a row slice of the target's frozen head, no retraining
(:meth:`lantern.drafter.model.Drafter.draft_logits`). The drafter's q stays a distribution on the
full vocabulary, exactly zero outside the draft vocabulary (:func:`lantern.drafter.model.draft_q`),
so every acceptance rule stays correct; a draft outside it is never proposed.

    python -m lantern.drafter.vocab --model embedded-16 --size 4096 --images 256 --cfg 3 --top-k 2000 \\
        --out lantern/weights/embedded-16_drafter.safetensors

reads the shipped drafter (or ``--drafter FILE``), sets its draft vocabulary and writes it to
``--out`` with the vocabulary's mass coverage in its training information. ``--size V`` (the whole
vocabulary) writes the drafter without a draft vocabulary: the full head, as trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from ambiguity.cli import (
    ArgumentParser,
    add_model_args,
    add_out_arg,
    add_progress_arg,
    add_sampling_args,
    check_out_file,
    cli_main,
    device_from_args,
    path_arg,
    positive_int,
    print_written,
    sampling_from_args,
)
from ambiguity.errors import UsageError
from ambiguity.models.base import TokenModel
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig, distribution
from lantern.drafter.data import self_generate
from lantern.drafter.model import load_drafter

__all__ = ["code_mass", "select_draft_vocab", "coverage", "restrict_logits", "check_size", "build_parser", "main"]

COMMAND = "python -m lantern.drafter.vocab"


@torch.no_grad()
def code_mass(
    model: TokenModel, tokens: torch.Tensor, conditions: Sequence, sampling: SamplingConfig, batch_size: int = 8
) -> torch.Tensor:
    """The target's probability mass per code over known sequences: (V,) float64, sums to N * L.

    Args:
        tokens: (N, L) int64 code indices (e.g. the target's own samples); conditions: N labels
            or captions.
        sampling: the sampling whose distribution p is summed (guidance runs the guided prompt).
        batch_size: sequences per teacher-forced forward (memory: batch_size * L * V floats).
    Position ``t`` of sequence ``i`` adds p(. | condition_i, tokens[i, :t]) after guidance,
    temperature and top-k / top-p (:func:`ambiguity.sampling.distribution`). Raises UsageError for
    codes outside ``0..V-1`` (``model.teacher_force``).
    """
    mass = torch.zeros(model.vocab_size, dtype=torch.float64)
    for i in range(0, tokens.shape[0], batch_size):
        toks = tokens[i : i + batch_size].to(model.device)
        prompt = model.make_prompt(list(conditions[i : i + batch_size]), guided=sampling.guided)
        rows = torch.cat([toks, toks]) if sampling.guided else toks
        logits = model.teacher_force(prompt, rows).logits  # (rows, L, V)
        p = distribution(logits, sampling, sampling.guided)  # (B, L, V)
        mass += p.double().sum((0, 1)).cpu()
    return mass


def check_size(size: int, vocab_size: int, flag: str = "--size") -> int:
    """``size`` when ``1 <= size <= vocab_size``; else UsageError naming ``flag`` and the range."""
    if not 1 <= int(size) <= vocab_size:
        raise UsageError(f"{flag} must be between 1 and the vocabulary size {vocab_size}, got {size}")
    return int(size)


def select_draft_vocab(mass: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` codes of largest ``mass`` ((V,) any float dtype, e.g. :func:`code_mass`),
    ties to the lower code index, returned ascending as (size,) int64 (the ``draft_vocab`` format
    of :class:`lantern.drafter.model.Drafter`). Raises UsageError for a size outside 1..V."""
    size = check_size(size, mass.numel())
    order = torch.sort(-mass.double(), stable=True).indices  # descending mass, ties by index
    return order[:size].sort().values.long()


def coverage(mass: torch.Tensor, vocab: torch.Tensor) -> float:
    """The fraction of ``mass`` ((V,)) on the codes ``vocab`` ((V_d,) int64): the target's expected
    probability of the draft vocabulary when ``mass`` is :func:`code_mass` (1 for a full vocabulary)."""
    total = float(mass.double().sum())
    return float(mass.double()[vocab.cpu()].sum()) / total if total > 0 else float("nan")


def restrict_logits(logits: torch.Tensor, vocab: Optional[torch.Tensor]) -> torch.Tensor:
    """Logits (..., V) with -inf outside ``vocab`` ((V_d,) int64; None: unchanged): the drafter's full
    logits as the draft vocabulary sees them (top-k accuracy with :func:`lantern.drafter.objective.topk_hits`)."""
    if vocab is None:
        return logits
    keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    keep[vocab.to(logits.device)] = True
    return logits.masked_fill(~keep, float("-inf"))


# --------------------------------------------------------------------------- CLI
def build_parser() -> ArgumentParser:
    """The CLI's argument parser (one-line errors, exit status 2)."""
    p = ArgumentParser(
        prog=COMMAND,
        description="Give a drafter a draft vocabulary: the codes holding most of the target's probability "
        "mass over self-generated images (EAGLE-3's draft vocabulary head).",
    )
    add_model_args(p)
    p.add_argument("--size", type=positive_int, required=True, metavar="V_D", help="draft vocabulary size, 1..V")
    p.add_argument("--drafter", type=path_arg, default=None, metavar="FILE", help="drafter (default: the shipped one)")
    p.add_argument("--images", type=positive_int, default=256, help="self-generated images counted (default 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the self-generated images (default 0)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="images per batch (default 16)")
    add_sampling_args(p, guidance=3.0, guidance_help="guidance scale of the counted images (default 3)")
    p.add_argument(
        "--save-dtype", default="fp16", choices=["fp16", "bf16", "fp32"], help="dtype of the written drafter"
    )
    add_out_arg(p, "drafter file to write (required)", metavar="FILE")
    add_progress_arg(p)
    return p


@cli_main
def main(argv: Optional[list[str]] = None) -> int:
    """Command-line entry point (see the module docstring); returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.out is None:
        raise UsageError(
            "--out FILE is required: the drafter file to write (e.g. lantern/weights/<model>_drafter.safetensors)"
        )
    out = check_out_file(args.out)
    device, dtype = device_from_args(args)
    model = load_model(args.model, weights=args.weights, device=device, dtype=dtype)
    size = check_size(args.size, model.vocab_size)
    sampling = sampling_from_args(args, model.kind)
    drafter = load_drafter(model, args.drafter)
    save_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.save_dtype]
    if size == model.vocab_size:  # the full head: today's q, nothing to count
        drafter.set_draft_vocab(None)
        drafter.info.pop("draft_vocab", None)
        drafter.save(out, dtype=save_dtype)
        print(f"draft vocabulary: none (all {size} codes, the full head)")
        print_written([out])
        return 0
    ts = self_generate(
        model, args.images, sampling, batch_size=args.batch_size, seed=args.seed, progress=not args.no_progress
    )
    mass = code_mass(model, ts.tokens, ts.conditions, sampling, batch_size=max(1, args.batch_size // 2))
    vocab = select_draft_vocab(mass, size)
    covered = coverage(mass, vocab)
    drafter.set_draft_vocab(vocab)
    facts = dict(size=size, coverage=round(covered, 6), images=args.images, seed=args.seed, sampling=sampling.as_dict())
    drafter.save(out, dtype=save_dtype, draft_vocab=facts)
    print(f"draft vocabulary: {size} of {model.vocab_size} codes hold {100 * covered:.2f} % of the target's mass")
    print_written([out])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
