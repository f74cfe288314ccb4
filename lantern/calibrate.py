"""Fit the acceptance predictor of a model's drafter (the input of ``gamma="auto"``, :mod:`lantern.engine.policy`).

Decodes images with LANTERN at the paper's sampling (CFG 3, temperature 1, top-k 2000 and
k = 1000 of LlamaGen's 16384 codes mapped to the model's codebook, δ 0.1) and a long fixed chain,
fits P(accepted | p_top1, p_entropy, q_top1) to the draft records and writes it next to the
shipped drafter (``lantern/weights/<model>_drafter_acceptance.json``):

    python -m lantern.calibrate --model embedded-16
"""

from __future__ import annotations

from ambiguity.cli import ArgumentParser, add_threads_arg, cli_main, positive_int, set_threads
from ambiguity.models.registry import load_model
from ambiguity.sampling import SamplingConfig
from lantern.drafter.model import load_drafter
from lantern.engine.decode import DecodeConfig, decode, neighbour_table
from lantern.engine.policy import AcceptancePredictor, fit_predictor, predictor_path, save_predictor
from lantern.paper.config import map_to_codebook

__all__ = ["calibrate", "build_parser", "main"]


def calibrate(model, drafter, images: int, gamma: int, k: int, delta: float, seed: int = 0) -> AcceptancePredictor:
    """Fit the acceptance predictor of ``drafter`` (:func:`lantern.engine.policy.fit_predictor`)
    on ``images`` LANTERN decodes (γ ``gamma``, k ``k``, δ ``delta``) at the paper's sampling,
    labels ``i % 10``, seed ``seed``; its ``info`` records these settings."""
    V = model.vocab_size
    sampling = SamplingConfig(guidance=3.0, temperature=1.0, top_k=map_to_codebook(2000, V))
    config = DecodeConfig.of("lantern", gamma, k=k, delta=delta)
    table = neighbour_table(model, config)
    out = decode(model, [i % 10 for i in range(images)], config, sampling, drafter, table, seed=seed)
    info = dict(model=model.name, images=images, gamma=gamma, k=k, delta=delta, seed=seed, **sampling.as_dict())
    return fit_predictor(out.drafts, info)


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m lantern.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model registry name (its shipped drafter)")
    ap.add_argument("--images", type=positive_int, default=32, help="images decoded (default: %(default)s)")
    ap.add_argument("--gamma", type=positive_int, default=8, help="draft length of the decodes (default: %(default)s)")
    ap.add_argument("--k", type=positive_int, default=None, help="neighbours (default: 1000 of 16384 mapped)")
    ap.add_argument("--delta", type=float, default=0.1, help="LANTERN δ (default: %(default)s)")
    ap.add_argument("--out", default=None, help="JSON file (default: next to the shipped drafter)")
    add_threads_arg(ap)
    return ap


@cli_main
def main(argv=None) -> int:
    """Decode, fit, write the predictor JSON and print its weights."""
    args = build_parser().parse_args(argv)
    set_threads(args.threads or 1)
    model = load_model(args.model)
    k = args.k or map_to_codebook(1000, model.vocab_size)
    pred = calibrate(model, load_drafter(model), args.images, args.gamma, k, args.delta)
    path = save_predictor(pred, args.out or predictor_path(model.name))
    print(f"wrote {path}: weights {[round(w, 4) for w in pred.weights]}, q_mean {pred.q_mean:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
