"""rustext: the native hot paths, behind a typed facade.

The compiled module is the private ``rustext._native``; this package
re-exports its public names (see ``_native.pyi`` for the typed API).

- framing   length-prefixed stream splitter (``FrameDecoder``)
- rpcx      rpcx message codec
- juggler   juggler.0 envelope codec (args stay raw JSON bytes)
- timer     min-heap of deadlines (``DeadlineHeap``)
- balancer  the HTTP load balancer's data plane
"""

from rustext._native import (
    BalancerConfigError,
    BalancerError,
    DecodeError,
    FrameTooLarge,
    JugglerDecodeError,
    RpcxDecodeError,
    RustextError,
)

__all__ = [
    "BalancerConfigError",
    "BalancerError",
    "DecodeError",
    "FrameTooLarge",
    "JugglerDecodeError",
    "RpcxDecodeError",
    "RustextError",
]

# Each area below adds its own import block and extends __all__, so that
# parallel work on different areas merges without conflicts.

# --- framing ---

# --- rpcx ---

# --- juggler ---

# --- timer ---

# --- balancer ---
from rustext._native import Balancer  # noqa: E402

__all__ += ["Balancer"]
