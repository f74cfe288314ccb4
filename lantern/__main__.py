"""``python -m lantern``: the package's commands (each also runs as ``python -m <module>``)."""

from __future__ import annotations

from ambiguity.cli import run_subcommand

COMMANDS = {
    "generate": (
        "lantern.generate",
        "images by AR, speculative (sd, LANTERN) or Jacobi (sjd, gsd, scd) decoding, with per-draft records",
    ),
    "replay": ("lantern.replay", "acceptance vs ambiguity, and image quality against a reference run"),
    "evaluate": ("lantern.evaluate", "FID, KID, precision/recall, density/coverage, CLIP score, HPS v2.1 of runs"),
    "train_drafter": ("lantern.drafter.train", "train an EAGLE drafter and measure its test accuracy per epoch"),
    "compare": ("lantern.drafter.comparison", "ambiguity across models with their drafters' accuracy (LANTERN Fig. 2)"),
    "paper": ("lantern.paper.__main__", "regenerate the paper's figures and tables next to its published values"),
}

if __name__ == "__main__":
    raise SystemExit(run_subcommand("python -m lantern", COMMANDS))
