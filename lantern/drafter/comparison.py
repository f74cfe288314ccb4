"""``python -m lantern.drafter.comparison``: LANTERN's Fig. 2.

Ambiguity across models and their drafters' accuracy.

The same command as ``python -m ambiguity.compare`` (all its options), with the test-accuracy
table of each model's shipped drafter (``lantern/weights/<model>_drafter_accuracy.parquet``)
found automatically; ``--drafter-accuracy MODEL=FILE`` still overrides it.
"""

from __future__ import annotations

from typing import Optional

from ambiguity.compare import main as compare_main
from lantern.drafter.model import shipped_accuracy_path

__all__ = ["main"]


def main(argv: Optional[list[str]] = None, prog: str = "python -m lantern.drafter.comparison") -> int:
    """Run :func:`ambiguity.compare.main` with the shipped drafters' accuracy tables."""
    return compare_main(argv, accuracy_lookup=shipped_accuracy_path, prog=prog)


if __name__ == "__main__":
    raise SystemExit(main())
