"""``python -m lantern.compare``: the former name of :mod:`lantern.drafter_comparison`, kept so that
old commands and imports work (``lantern.compare`` and ``ambiguity.compare`` were two modules of one name)."""

from __future__ import annotations

from typing import Optional

__all__ = ["main"]


def main(argv: Optional[list[str]] = None) -> int:
    """:func:`lantern.drafter_comparison.main` under its old program name."""
    from lantern.drafter_comparison import main as run

    return run(argv, prog="python -m lantern.compare")


if __name__ == "__main__":
    raise SystemExit(main())
