"""Argument types the commands share. Light on purpose: every command's
parser imports it while ``juggler --help`` is built."""

from __future__ import annotations

__all__ = ["LOG_LEVELS", "log_level"]

#: what ``--log-level`` (and a file's ``log_level``) takes, in any case
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(value: object) -> str:
    """A logging level name, upper-cased; ValueError naming the choices (as
    an argparse ``type``: a typo shows the command's usage, not a traceback)."""
    if not isinstance(value, str) or value.upper() not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return value.upper()
