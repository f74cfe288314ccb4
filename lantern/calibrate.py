"""Fit the acceptance predictor of a model's drafter (the input of ``gamma="auto"``, :mod:`lantern.engine.policy`).

Decodes images with LANTERN at the paper's sampling (CFG 3, temperature 1, top-k 2000 and
k = 1000 of LlamaGen's 16384 codes mapped to the model's codebook, δ 0.1) and a long fixed chain,
fits P(accepted | p_top1, p_entropy, q_top1, depth) to the draft records and writes it next to the
shipped drafter (``lantern/weights/<model>_drafter_acceptance.json``). The target's features are
those the policy has when it decides (:func:`lagged`): the distribution the image's last committed
token came from, not the one at the draft's own position (known only after the verify forward).

    python -m lantern.calibrate --model embedded-16
    python -m lantern.calibrate --model embedded-16 --method sd    # exact speculative sampling's own predictor
"""

from __future__ import annotations

import numpy as np

from ambiguity.cli import ArgumentParser, add_out_arg, add_threads_arg, cli_main, positive_int, set_threads
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig
from lantern.drafter.model import load_drafter
from lantern.engine.decode import DecodeConfig, decode, neighbour_table
from lantern.engine.policy import CALIBRATED, AcceptancePredictor, fit_predictor, predictor_path, save_predictor
from lantern.paper.config import map_to_codebook

__all__ = ["lagged", "calibrate", "build_parser", "main"]


def lagged(drafts: dict) -> dict:
    """The reached draft rows with ``p_top1`` / ``p_entropy`` replaced by those of the token before
    the draft's round (position ``n - 1`` of the round at ``n``: the distribution the image's last
    committed token was drawn from, recorded as a reached draft of an earlier round; ``n - 2`` when
    that token was a bonus or plain target token, which have no draft row). Rows without either
    (an image's first rounds) are left out. drafts: a decode's drafts table (numpy columns)."""
    d = {c: np.asarray(v) for c, v in drafts.items()}
    reached = d["reached"].astype(bool)
    known = {
        (int(i), int(t)): (a, b)
        for i, t, a, b in zip(*(d[c][reached] for c in ("image", "position", "p_top1", "p_entropy")))
    }
    names = ("p_top1", "p_entropy", "q_top1", "depth", "accepted", "reached")
    out = {c: [] for c in names}
    for i, pos, j, q, ok in zip(*(d[c][reached] for c in ("image", "position", "draft_index", "q_top1", "accepted"))):
        n = int(pos) - int(j)
        stats = known.get((int(i), n - 1)) or known.get((int(i), n - 2))
        if stats is None:
            continue
        for c, v in zip(names, (*stats, q, int(j) + 1, bool(ok), True)):
            out[c].append(v)
    return {c: np.asarray(v) for c, v in out.items()}


def calibrate(
    model, drafter, images: int, gamma: int, k: int, delta: float, seed: int = 0, method: str = "lantern"
) -> AcceptancePredictor:
    """Fit the acceptance predictor of ``drafter`` (:func:`lantern.engine.policy.fit_predictor`)
    on ``images`` decodes with the rule ``method`` (``"lantern"``: k ``k``, δ ``delta``; ``"sd"``:
    exact speculative sampling), γ ``gamma``, at the paper's sampling, labels ``i % 10``, seed
    ``seed``; its ``info`` records these settings."""
    V = model.vocab_size
    sampling = SamplingConfig(guidance=3.0, temperature=1.0, top_k=map_to_codebook(2000, V))
    relaxed = dict(k=k, delta=delta) if method == "lantern" else {}
    config = DecodeConfig.of(method, gamma, **relaxed)
    table = neighbour_table(model, config)
    out = decode(model, [i % 10 for i in range(images)], config, sampling, drafter, table, seed=seed)
    info = dict(model=model.name, method=method, images=images, gamma=gamma, **relaxed, seed=seed, **sampling.as_dict())
    return fit_predictor(lagged(out.drafts), info)


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(
        prog="python -m lantern.calibrate",
        description="Fit the acceptance predictor that --gamma auto reads (lantern.engine.policy), "
        "written next to the shipped drafter.",
    )
    ap.add_argument("--model", required=True, help="model registry name (its shipped drafter)")
    ap.add_argument(
        "--method",
        choices=CALIBRATED,
        default="lantern",
        help="the acceptance rule the predictor is for (other rules under --gamma auto read LANTERN's) "
        "(default: %(default)s)",
    )
    ap.add_argument("--images", type=positive_int, default=32, help="images decoded (default: %(default)s)")
    ap.add_argument("--gamma", type=positive_int, default=8, help="draft length of the decodes (default: %(default)s)")
    ap.add_argument("--k", type=positive_int, default=None, help="neighbours (default: 1000 of 16384 mapped)")
    ap.add_argument("--delta", type=float, default=0.1, help="LANTERN δ (default: %(default)s)")
    add_out_arg(ap, "JSON file (default: next to the shipped drafter)", metavar="FILE")
    add_threads_arg(ap)
    return ap


@cli_main
def main(argv=None) -> int:
    """Decode, fit, write the predictor JSON and print its weights."""
    args = build_parser().parse_args(argv)
    set_threads(args.threads or 1)
    model = load_model(args.model)
    k = args.k or map_to_codebook(1000, model.vocab_size)
    pred = calibrate(model, load_drafter(model), args.images, args.gamma, k, args.delta, method=args.method)
    path = save_predictor(pred, args.out or predictor_path(model.name, args.method))
    print(f"wrote {path}: weights {[round(w, 4) for w in pred.weights]}, q_mean {pred.q_mean:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
