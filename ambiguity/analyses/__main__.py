"""``python -m ambiguity.analyses <analysis> [options]``: dispatch to one analysis CLI."""

from __future__ import annotations

from typing import Optional

from ambiguity.cli import run_subcommand

ANALYSES = {
    "concentration": (
        "ambiguity.analyses.concentration",
        "target mass on the latent neighbours of the top-1 token vs random and top-k tokens",
    ),
    "interchangeability": (
        "ambiguity.analyses.interchangeability",
        "decode error after swapping tokens for latent neighbours vs random tokens",
    ),
}


def main(argv: Optional[list[str]] = None) -> int:
    """Run ``ANALYSES[argv[0]]``'s ``main(argv[1:])``; 2 with one line without or with an unknown analysis."""
    return run_subcommand("python -m ambiguity.analyses", ANALYSES, argv, required=True)


if __name__ == "__main__":
    raise SystemExit(main())
