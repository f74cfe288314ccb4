"""The target's scores of generated tokens (:func:`lantern.run_reader.target_scores`): CPU time at
each batch size, user and system seconds apart.

    python benchmarks/bench_target_scores.py --model embedded-16 --images 32 --batch-sizes 1,4,32 --repeats 3

``target_scores`` runs ``num_classes`` teacher-forced passes per image (c2i; the Bayes class
decision) and keeps each pass's (batch, N, vocab) float32 logits: for ``embedded-16`` 16.8 MB per
image, so a batch of 64 allocates 1.07 GB per pass. Large fresh allocations are served by
``mmap`` and first touched page by page, which shows as *system* time; this benchmark measures
how much, and compares the former implementation (``--former B``, default 64: a separate pass for
the true labels, then a full log-softmax copy of the logits, at its batch of 64 images; kept here
only as the baseline). Rounds interleave the cells (one call each, in a rotated order) after one
warm-up call each; reported per cell: the median and range over rounds of wall, user and system
seconds (``resource.getrusage`` of this process, so the numbers include only the call), and
milliseconds per teacher-forced pass of one image (wall / (images x passes)). The scores are
checked equal across cells (NLL to 1e-4 nats/token, the class decisions exactly).

Writes ``--out``/target_scores.json (the medians and every round). ``--out`` defaults to the
untracked ``runs/benchmarks/bench_target_scores``.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for benchmarks.common

from ambiguity.cli import ArgumentParser, add_device_args, cli_main, int_list, positive_int
from ambiguity.errors import UsageError
from ambiguity.models.registry import load_model
from benchmarks.common import add_results_arg, threads_and_device
from lantern.run_reader import target_scores


def former_target_scores(model, images: pd.DataFrame, batch_size: int = 64) -> pd.DataFrame:
    """The baseline: ``target_scores`` as it was before 2026-12-03 (one pass with the true labels and
    one per class, 11 passes per image; log-probabilities through a (batch, N, vocab) log-softmax
    copy). Same columns and values."""
    codes = torch.tensor(np.stack(images["codes"].to_numpy()), dtype=torch.long, device=model.device)
    labels = [int(c) for c in images["condition"]]

    def loglik(conds, toks):
        out = []
        for s in range(0, len(conds), batch_size):
            prompt = model.make_prompt(conds[s : s + batch_size], guided=False)
            with torch.no_grad():
                logits = model.teacher_force(prompt, toks[s : s + batch_size]).logits.float()
            lp = torch.log_softmax(logits, -1).gather(-1, toks[s : s + batch_size, :, None])[..., 0]
            out.append(lp.sum(-1).cpu())
        return torch.cat(out)

    ll = loglik(labels, codes)
    every = torch.stack([loglik([c] * len(labels), codes) for c in range(int(model.num_classes))], 1)
    pred = every.argmax(1).numpy()
    return pd.DataFrame({"image": images["image"].to_numpy(), "nll": (-ll / codes.shape[1]).numpy(), "predicted": pred})


def timed_call(model, frame: pd.DataFrame, cell: tuple[str, int]) -> tuple[dict, pd.DataFrame]:
    """One call of ``cell`` = (implementation, batch size): ({wall_s, user_s, sys_s}, its scores)."""
    impl, batch_size = cell
    fn = target_scores if impl == "target_scores" else former_target_scores
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    scores = fn(model, frame, batch_size=batch_size)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": wall, "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime}, scores


def parse_args(argv=None):
    p = ArgumentParser(prog="python benchmarks/bench_target_scores.py", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="embedded-16", help="a c2i target (default: %(default)s)")
    p.add_argument("--weights", default=None, help="the target's checkpoint (default: the registry's)")
    p.add_argument("--images", type=positive_int, default=16, help="random token images scored (default: 16)")
    p.add_argument("--batch-sizes", default="1,4,16,64", help="comma-separated images per pass (default: %(default)s)")
    p.add_argument(
        "--former", type=int, default=64, help="batch size of the former implementation's cell, 0 = none (default: 64)"
    )
    p.add_argument("--repeats", type=positive_int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random tokens (default: 0)")
    add_device_args(p, dtype=False, threads=0)
    add_results_arg(p, "bench_target_scores", what="output directory")
    return p.parse_args(argv)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    model = load_model(args.model, args.weights, device=threads_and_device(args)[0])
    if model.kind != "c2i" or not model.num_classes:
        raise UsageError(f"--model {args.model} is {model.kind}; target_scores' class passes need a c2i model")
    g = torch.Generator().manual_seed(args.seed)
    codes = torch.randint(0, model.vocab_size, (args.images, model.num_tokens), generator=g)
    frame = pd.DataFrame(
        {
            "image": range(args.images),
            "condition": [i % model.num_classes for i in range(args.images)],
            "codes": list(codes.numpy()),
        }
    )
    sizes = list(dict.fromkeys(int_list(args.batch_sizes, "--batch-sizes", 1)))
    cells = [("target_scores", b) for b in sizes] + ([("former", args.former)] if args.former > 0 else [])
    reference = None
    for cell in cells:  # warm-up, and the scores every cell must reproduce
        _, scores = timed_call(model, frame, cell)
        if reference is None:
            reference = scores
        elif not (
            np.allclose(scores["nll"], reference["nll"], atol=1e-4)
            and (scores["predicted"].to_numpy() == reference["predicted"].to_numpy()).all()
        ):
            raise SystemExit(f"error: {cell} scores differ from {cells[0]}'s")
    rounds = []
    for r in range(args.repeats):
        for impl, b in cells[r % len(cells) :] + cells[: r % len(cells)]:
            t, _ = timed_call(model, frame, (impl, b))
            rounds.append({"round": r, "implementation": impl, "batch_size": b, **t})
    df = pd.DataFrame(rounds)
    classes = int(model.num_classes)
    summary = []
    for impl, b in cells:
        sub = df[(df["implementation"] == impl) & (df["batch_size"] == b)]
        row = {"implementation": impl, "batch_size": b}
        for col in ("wall_s", "user_s", "sys_s"):
            v = sub[col].tolist()
            row[col] = statistics.median(v)
            row[f"{col}_min"], row[f"{col}_max"] = min(v), max(v)
        row["passes_per_image"] = classes if impl == "target_scores" else classes + 1
        row["ms_per_image_pass"] = 1000 * row["wall_s"] / (args.images * row["passes_per_image"])
        summary.append(row)
    table = pd.DataFrame(summary)
    print(
        f"target_scores on {args.model}: {args.images} images, {model.num_classes} class passes each, "
        f"{args.repeats} interleaved rounds, threads {torch.get_num_threads()}; median [min, max] seconds"
    )
    for r in summary:
        times = "  ".join(
            f"{c[:-2]} {r[c]:.1f} [{r[c + '_min']:.1f}, {r[c + '_max']:.1f}]" for c in ("wall_s", "user_s", "sys_s")
        )
        name = f"{r['implementation']} batch {r['batch_size']}"
        print(f"  {name:<22} {times}  ({r['ms_per_image_pass']:.0f} ms per image pass)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "model": args.model,
        "images": args.images,
        "classes": int(model.num_classes),
        "threads": torch.get_num_threads(),
        "device": str(model.device),
        "summary": table.to_dict(orient="records"),
        "rounds": rounds,
    }
    (out / "target_scores.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {out / 'target_scores.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
