"""The one exception type that reaches users.

Everything a user can get wrong (an unknown decoder, a knob out of range, a model that
does not exist, a prompt that is too long) raises :class:`PlaygroundError` with a message
that fits on one line. The CLI prints it on stderr, the UI shows it in a toast; neither
ever shows a traceback for it.
"""

from __future__ import annotations


class PlaygroundError(ValueError):
    """A user-facing error: its message is one clear line naming the problem."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class Cancelled(Exception):
    """Raised inside a decoder when the user pressed Stop (the run keeps what it made)."""
