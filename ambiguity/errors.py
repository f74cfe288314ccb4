"""User-facing errors: what the user can fix, with a message that names the fix.

Library code raises :class:`UsageError` (or a subclass) for anything the user can fix: an
unknown model name, absent weights, a bad setting, an unreadable file. Command-line entry
points run through :func:`ambiguity.cli.cli_main`, which prints ``error: <message>`` on one line
to stderr and exits with status 2, without a traceback. Programming errors still raise normally.
"""

from __future__ import annotations

__all__ = ["UsageError", "WeightsNotFoundError", "FieldError", "check"]


class UsageError(ValueError):
    """A mistake the user can fix; the message names the fix."""


class WeightsNotFoundError(UsageError):
    """Checkpoint files are absent; the message says what to download and where to put it."""


class FieldError(UsageError):
    """A bad value of one field of a settings dataclass (``SamplingConfig(guidance=200)``).

    The library's message names the field: ``SamplingConfig.guidance must be at most 100 ...``;
    a command shows the same problem under its flag (``--cfg must be at most 100 ...``):
    :func:`ambiguity.cli.cli_main` maps ``(owner, field)`` to the flag (:data:`ambiguity.cli.FIELD_FLAGS`,
    else ``--`` and the field with dashes).

    Args: owner: the dataclass's name; field: the field's name; problem: the rest of the message
    (``"must be ..., got 200"``).
    """

    def __init__(self, owner: str, field: str, problem: str):
        self.owner, self.field, self.problem = owner, field, problem
        super().__init__(f"{owner}.{field} {problem}")

    def as_flag(self, flag: str) -> str:
        """The message with ``flag`` in place of the field."""
        return f"{flag} {self.problem}"


def check(condition: bool, message: str) -> None:
    """Raise :class:`UsageError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise UsageError(message)
