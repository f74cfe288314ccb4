"""``python -m lantern``: the package's commands (each also runs as ``python -m <module>``)."""

from __future__ import annotations

from ambiguity.cli import run_subcommand

COMMANDS = {
    "generate": (
        "lantern.generate",
        "images by AR, speculative (sd, LANTERN, Cool-SD, FLy), Jacobi (sjd, gsd, scd, entropy-sd, sjd-pac) or "
        "row-parallel (zipar, pjd) decoding, with per-draft records",
    ),
    "replay": ("lantern.replay", "acceptance vs ambiguity, and image quality against a reference run"),
    "evaluate": ("lantern.evaluate", "FID, KID, precision/recall, density/coverage, CLIP score, HPS v2.1 of runs"),
    "train_drafter": ("lantern.drafter.train", "train an EAGLE drafter and measure its test accuracy per epoch"),
    "draft_vocab": ("lantern.drafter.vocab", "a drafter's draft vocabulary (EAGLE-3): the target's most likely codes"),
    "calibrate": ("lantern.calibrate", "fit the acceptance predictor --gamma auto reads (shipped with the drafter)"),
    "compare": ("lantern.drafter.comparison", "ambiguity across models with their drafters' accuracy (LANTERN Fig. 2)"),
    "paper": ("lantern.paper.__main__", "regenerate the paper's figures and tables next to its published values"),
}

if __name__ == "__main__":
    raise SystemExit(run_subcommand("python -m lantern", COMMANDS))
