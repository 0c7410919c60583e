"""An operation's own error, and a call that failed as a call."""

from __future__ import annotations

from typing import Optional, Union

from .protocol import ErrorDetail


class Error(Exception):
    """Returned by an operation (`return Error("TOO_MANY_REQUESTS")`): the operation's own error,
    answered as `{"error": {"code", "message"}}`. Raised, it is a failure like any exception."""

    def __init__(self, code: str, message: Optional[str] = None) -> None:
        super().__init__(message or code)
        self.code = code
        self.message = message


class CallError(Exception):
    """A call that failed as a call. `code` tells them apart as the seeds do: 403 (Addressee: the
    process named is gone; safe to recover), 404 (Abandoned: the wait ended; the outcome is
    unknown), 202 (RequestContract: refused before anything was sent); `name` is the agent's
    code (`Addressee`, `Abandoned`, `RequestContract`, `UNKNOWN_COMPONENT`, `FAILED`, ...)."""

    def __init__(self, error: ErrorDetail) -> None:
        super().__init__(error.get("message") or error.get("code"))
        self.code: Union[int, str, None] = error.get("number") or error.get("code")
        self.name: Optional[str] = error.get("code")
