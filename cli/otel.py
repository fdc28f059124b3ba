"""OpenTelemetry for the commands that serve or call (``rpc serve``, ``rpc
call``, ``rpc bench``, ``server``, ``up``, ``callee``): when tracing is on, and the SDK set up the
standard way, from the ``OTEL_*`` environment variables.

Tracing is on with ``--otel``, or when the environment asks for an exporter
(``OTEL_TRACES_EXPORTER`` other than ``none``, ``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), unless ``OTEL_SDK_DISABLED=true``.
Then the process's global tracer provider gets the exporters of
``OTEL_TRACES_EXPORTER`` (default ``otlp``: gRPC to ``localhost:4317``, or
HTTP with ``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf``; ``console`` prints
spans) behind a batch processor, the resource of ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES``, and the sampler of ``OTEL_TRACES_SAMPLER``; the
propagator is the API's (``OTEL_PROPAGATORS``, default W3C trace context and
baggage). Nothing here imports OpenTelemetry until tracing is on.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

OTEL_HELP = (
    "trace with OpenTelemetry, configured by the OTEL_* environment variables (exporter, endpoint, "
    "service name, sampler); on by default when OTEL_TRACES_EXPORTER or OTEL_EXPORTER_OTLP_ENDPOINT is set, "
    "off with OTEL_SDK_DISABLED=true"
)
INSTALL_HINT = "pip install 'juggler-suite[otel]'"


class OtelSetupError(ValueError):
    """Tracing was asked for but cannot start (the extra is missing, an unknown exporter)."""


def add_otel_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--otel", action="store_true", help=OTEL_HELP)


def otel_wanted(flag: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Whether tracing is on: ``--otel`` or an exporter named by the environment,
    and not ``OTEL_SDK_DISABLED=true``."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if flag:
        return True
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter and exporter != "none":
        return True
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    if any(n.lower() == "none" for n in names):
        return []
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "").strip()
    out = []
    for name in names:
        if name == "otlp":
            by_protocol = {"": "otlp_proto_grpc", "grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
            if protocol not in by_protocol:
                raise OtelSetupError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: expected grpc or http/protobuf")
            name = by_protocol[protocol]
        out.append(name)
    return out


class Tracing:
    """The tracer provider a command set up; ``shutdown()`` exports what is
    left (call it once the command is done; idempotent)."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self._done = False

    def shutdown(self) -> None:
        if not self._done:
            self._done = True
            self.provider.shutdown()


def _exporter_classes(env: Mapping[str, str]) -> list[Any]:
    """The exporter classes ``OTEL_TRACES_EXPORTER`` names; ``OtelSetupError``
    when the SDK or one of them is missing."""
    try:
        from importlib.metadata import entry_points

        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise OtelSetupError(f"tracing needs the OpenTelemetry SDK: {INSTALL_HINT}") from exc
    classes = []
    for name in _exporter_names(env):
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            known = sorted(e.name for e in entry_points(group="opentelemetry_traces_exporter"))
            hint = f" ({INSTALL_HINT} brings otlp)" if name.startswith("otlp") else ""
            raise OtelSetupError(
                f"OTEL_TRACES_EXPORTER: no exporter {name!r} installed; known: {', '.join(known) or 'none'}{hint}")
        try:
            classes.append(found[0].load())
        except ImportError as exc:
            raise OtelSetupError(f"the {name} trace exporter cannot load ({exc}): {INSTALL_HINT}") from exc
    return classes


def check_tracing(environ: Mapping[str, str] | None = None) -> None:
    """What ``start_tracing`` would refuse, refused now (``OtelSetupError``),
    setting nothing up: for a command whose tracing starts in other processes."""
    _exporter_classes(os.environ if environ is None else environ)


def start_tracing(service_name: str, environ: Mapping[str, str] | None = None) -> Tracing:
    """Set the process's global tracer provider from the ``OTEL_*`` variables;
    ``service_name`` is the default of ``OTEL_SERVICE_NAME``. Raises
    ``OtelSetupError`` with the fix when the SDK is missing or the exporter
    named is unknown."""
    env = os.environ if environ is None else environ
    exporters = [cls() for cls in _exporter_classes(env)]
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return Tracing(provider)


def tracing_from_args(args: argparse.Namespace, service_name: str) -> Tracing | None:
    """``start_tracing`` when ``--otel`` or the environment turns tracing on, else None."""
    if not otel_wanted(bool(getattr(args, "otel", False))):
        return None
    return start_tracing(service_name)


__all__ = [
    "OTEL_HELP",
    "OtelSetupError",
    "Tracing",
    "add_otel_argument",
    "check_tracing",
    "otel_wanted",
    "start_tracing",
    "tracing_from_args",
]
