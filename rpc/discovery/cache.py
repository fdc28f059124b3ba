"""File cache of discovered servers: the fallback when the registry is unreachable.

One JSON file per service (``{"servers": {address: metadata}, "saved_at": unix}``),
replaced atomically (write a temporary file, fsync, rename), so a reader never
sees a half-written file.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time

log = logging.getLogger("rpc.discovery")


class FileCache:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def save(self, servers: dict[str, str]) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        data = json.dumps({"servers": servers, "saved_at": time.time()}, sort_keys=True).encode()
        fd, tmp = tempfile.mkstemp(prefix=".rpc-discovery-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def load(self) -> dict[str, str] | None:
        """The cached servers, or None when there is no usable cache."""
        try:
            with open(self.path, "rb") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable discovery cache %s: %s", self.path, exc)
            return None
        servers = data.get("servers") if isinstance(data, dict) else None
        if not isinstance(servers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in servers.items()
        ):
            log.warning("ignoring malformed discovery cache %s", self.path)
            return None
        return servers
