"""User-facing errors and the command-line wrapper that turns them into one line and exit 2.

Library code raises :class:`UsageError` (or a subclass) for anything the user can fix: an
unknown model name, absent weights, a bad setting, an unreadable file. Command-line entry
points run through :func:`cli_main`, which prints ``error: <message>`` on one line to stderr
and exits with status 2, without a traceback. Programming errors still raise normally.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable

__all__ = ["UsageError", "WeightsNotFoundError", "cli_main", "check"]


class UsageError(ValueError):
    """A mistake the user can fix; the message names the fix."""


class WeightsNotFoundError(UsageError):
    """Checkpoint files are absent; the message says what to download and where to put it."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`UsageError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise UsageError(message)


def cli_main(fn: Callable[..., int | None]) -> Callable[..., int]:
    """Decorate a ``main(argv=None)``: UsageError -> one line on stderr and exit code 2.

    KeyboardInterrupt exits 130 with a one-line note (results already written stay on disk).
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs) -> int:
        try:
            return int(fn(*args, **kwargs) or 0)
        except UsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted: finished results are on disk; rerun the same command to resume", file=sys.stderr)
            return 130

    return wrapper


class ArgumentParser(__import__("argparse").ArgumentParser):
    """argparse with a one-line error (``error: ... (see --help)``) and exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)
