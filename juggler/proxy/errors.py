"""What can go wrong asking the application's backend, as typed errors.

Each carries the juggler.0 code it becomes (a NACK's code, or the status
of a refused handshake) and ``label``, its name in the metrics.
"""

from __future__ import annotations

from juggler.errors import JugglerError

__all__ = ["ProxyBadAnswer", "ProxyError", "ProxyTimeout", "ProxyUnavailable"]


class ProxyError(JugglerError):
    """The backend gave no usable answer (not a refusal: a refusal is an answer)."""

    #: the handshake's HTTP status, and the code of a CALL's error RES
    code = 502
    #: the ``error`` label of ``juggler_proxy_errors_total``
    label = "error"
    #: what the client is told (the details, with the backend's address, are logged)
    public = "the application gave no answer"


class ProxyUnavailable(ProxyError, ConnectionError):
    """The backend cannot be reached (refused, reset, gRPC UNAVAILABLE)."""

    code = 503
    label = "unavailable"
    public = "the application is unavailable"


class ProxyTimeout(ProxyError, TimeoutError):
    """The backend did not answer within the proxy's (or the call's) timeout."""

    code = 504
    label = "timeout"
    public = "the application did not answer in time"


class ProxyBadAnswer(ProxyError, ValueError):
    """The backend answered something else than an answer: an HTTP error
    status, invalid JSON, wrong types, a failed gRPC status."""

    code = 502
    label = "bad_answer"
    public = "the application gave an invalid answer"
