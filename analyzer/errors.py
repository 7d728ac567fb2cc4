"""One error family: every user-facing failure is one sentence plus a remedy, never a traceback."""

from __future__ import annotations


class DiagnoseError(Exception):
    """A failure the user can act on. ``exit_code`` 2 means nothing could be diagnosed."""

    def __init__(self, message: str, remedy: str = "", exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy
        self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message} {self.remedy}".strip()


class AttachError(DiagnoseError):
    """Attaching to the target failed (no such pid, not Python, not permitted, …)."""


class InputError(DiagnoseError):
    """An input could not be used (no such file, not a session, bad manifest, …)."""
