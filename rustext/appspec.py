"""``MODULE:OBJECT`` specs (``--app myapp:Arith``, ``verifier =
"auth:check"``): one resolver for every part of the suite, with errors that
say what was not found. The CLI puts the current directory first on
``sys.path`` (as uvicorn and gunicorn do), so a module beside the user is
found."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["AppImportError", "cwd_on_path", "import_object"]


class AppImportError(ImportError):
    """A ``MODULE:OBJECT`` spec that cannot be resolved; the message says which part."""


def import_object(spec: str, *, what: str = "app") -> Any:
    """The object named by ``module.sub:attr.path``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppImportError(f"{what} must be MODULE:OBJECT (e.g. myapp:Arith), got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise AppImportError(
                f"cannot import {module_name!r} for {what} {spec!r}: no module named {exc.name!r} "
                f"(looked in the current directory {os.getcwd()} and the installed packages)"
            ) from None
        raise AppImportError(f"importing {module_name!r} failed: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppImportError(f"{what} {spec!r}: {module_name!r} has no attribute {attr!r}") from None
    return obj


def cwd_on_path() -> None:
    """Put the current directory first on ``sys.path`` (idempotent)."""
    cwd = os.getcwd()
    if not sys.path or sys.path[0] not in ("", cwd):
        sys.path.insert(0, cwd)
