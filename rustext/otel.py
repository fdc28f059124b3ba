"""What the OpenTelemetry plugins of juggler and rpc share: the guarded
import of the API (an error that names the extra to install when it is
missing) and the tracer/propagator every plugin holds.

Imported only by ``juggler.tracing`` and ``rpc.tracing``, themselves
imported only when tracing is asked for: a process without tracing never
loads OpenTelemetry.
"""

from __future__ import annotations

from typing import ClassVar

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "tracing needs the OpenTelemetry packages: pip install 'juggler-suite[otel]'"
    ) from exc

__all__ = ["SpanKind", "Status", "StatusCode", "TextMapPropagator", "Traced", "otel_context", "propagate", "trace"]


class Traced:
    """A plugin holding a tracer of its :attr:`SCOPE` and a propagator;
    ``tracer_provider`` and ``propagator`` default to the process's global
    ones (the global propagator is looked up at each use, so that one set
    after the plugin was made still applies)."""

    #: the instrumentation scope of the spans (what a tracing backend shows as the library)
    SCOPE: ClassVar[str]

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        self._tracer = trace.get_tracer(self.SCOPE, tracer_provider=tracer_provider)
        self._propagator = propagator

    @property
    def propagator(self) -> TextMapPropagator:
        return self._propagator or propagate.get_global_textmap()
