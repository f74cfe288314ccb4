"""User-facing errors: what the user can fix, with a message that names the fix.

Library code raises :class:`UsageError` (or a subclass) for anything the user can fix: an
unknown model name, absent weights, a bad setting, an unreadable file. Command-line entry
points run through :func:`ambiguity.cli.cli_main`, which prints ``error: <message>`` on one line
to stderr and exits with status 2, without a traceback. Programming errors still raise normally.
"""
from __future__ import annotations

__all__ = ["UsageError", "WeightsNotFoundError", "check"]


class UsageError(ValueError):
    """A mistake the user can fix; the message names the fix."""


class WeightsNotFoundError(UsageError):
    """Checkpoint files are absent; the message says what to download and where to put it."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`UsageError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise UsageError(message)
