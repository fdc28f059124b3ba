"""The juggler exception tree: one root, and subclasses that also inherit the builtin they mean."""

from __future__ import annotations


class JugglerError(Exception):
    """Root of every error raised by the juggler package."""


class ProtocolError(JugglerError, ValueError):
    """A peer sent something juggler.0 does not allow."""


class CallError(JugglerError):
    """A call did not produce a result."""


class CallNacked(CallError):
    """The server refused a message (NACK): `code` and `message` say why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"NACK {code}: {message}")
        self.code = code
        self.message = message


class CallExpired(CallError, TimeoutError):
    """No result arrived before the call's timeout (the client's local expiry)."""


class ConnectionClosed(JugglerError, ConnectionError):
    """The websocket connection is closed."""
