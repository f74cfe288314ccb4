"""OpenMP's wait policy for the commands: passive, so that a CPU shared with other work stays fast.

Decoding runs thousands of tiny ops; with OpenMP's default busy-waiting, two threads on cores
shared with other work ran 10x to 30x slower than one (a new user measured 4.3 s against 0.15 s
per ``embedded`` image). Passive waiting keeps the speed of an idle machine. The policy must be
set before torch starts OpenMP, so the package faces call :func:`passive_wait_for_commands` when
they are imported: it acts only while Python locates a ``python -m ambiguity.<command>`` or
``python -m lantern.<command>`` module (``sys.argv[0] == "-m"``) and torch is not loaded yet. A
plain ``import ambiguity`` / ``import lantern`` (a notebook, a script) changes no environment
variable. An ``OMP_WAIT_POLICY`` already set wins.
"""

from __future__ import annotations

import os
import sys

__all__ = ["passive_wait_for_commands"]


def passive_wait_for_commands() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` (unless set) while a ``python -m`` command is being launched
    and torch is not imported yet; otherwise do nothing (module docstring)."""
    if sys.argv[:1] == ["-m"] and "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
