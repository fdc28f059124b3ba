"""The plugin container: hooks at every step of serving a connection.

A plugin is any object; it takes part in a step by defining the method of
that step's name. A hook is a plain method or an ``async def`` method (the
kind is resolved once, when the plugin is added: a plain method must not
return an awaitable). Per step, plugins run in the order they were added. The container
resolves each step's bound methods once (on ``add``/``remove``), so a step no
plugin implements costs one empty-tuple check per request.

========================== ============================================ ============================
hook                        when                                         effect of raising / result
========================== ============================================ ============================
``on_conn_accept(peer)``    a connection was accepted                    return ``False`` → close it
``on_conn_close(peer)``     a connection closed                          (errors are logged)
``pre_read(peer)``          before reading the next frame                raise → close the connection
``post_read(peer, msg)``    a request was decoded                        raise → error reply
``on_heartbeat(peer, msg)`` a heartbeat arrived (before the echo)        (errors are logged)
``authenticate(ctx, tok)``  each non-heartbeat request (``__AUTH``)      falsy/raise → error + close
``pre_call(ctx, args)``     args decoded, before the handler              raise → error reply
``post_call(ctx, args,      after the handler (``reply`` None on error)  raise → error reply
reply, error)``
``pre_write(ctx, req,       before the response is written               raise → error reply
res)``
``post_write(peer, req,     after the response was written (or failed)   (errors are logged)
res, error)``
========================== ============================================ ============================

``ctx`` is the request's ``rpc.service.Context`` (with ``service``,
``method``, ``peer``, ``metadata``, ``started``); ``peer`` an
``rpc.service.Peer``. Exceptions raised to reject should be
``rpc.errors.ServiceError`` subclasses (their text goes to the client).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

HOOKS = (
    "on_conn_accept",
    "on_conn_close",
    "pre_read",
    "post_read",
    "on_heartbeat",
    "authenticate",
    "pre_call",
    "post_call",
    "pre_write",
    "post_write",
)

log = logging.getLogger("rpc.plugins")


class PluginContainer:
    """An ordered set of plugins and, per hook, the tuple of their bound methods."""

    def __init__(self, plugins: list[object] | None = None) -> None:
        self._plugins: list[object] = []
        #: every hook of a request's steps (post_read .. post_write) is a plain
        #: method: the transport may serve a request without a task
        self.request_path_sync = True
        for name in HOOKS:
            setattr(self, "_" + name, ())
        for plugin in plugins or ():
            self.add(plugin)

    @property
    def plugins(self) -> tuple[object, ...]:
        return tuple(self._plugins)

    def add(self, plugin: object) -> None:
        if not any(callable(getattr(plugin, name, None)) for name in HOOKS):
            raise TypeError(f"{type(plugin).__name__} implements no plugin hook ({', '.join(HOOKS)})")
        self._plugins.append(plugin)
        self._rebuild()

    def remove(self, plugin: object) -> None:
        self._plugins.remove(plugin)
        self._rebuild()

    def hooks(self, name: str) -> tuple[Any, ...]:
        """The bound methods of hook ``name``, in plugin order."""
        return tuple(hook for hook, _ in getattr(self, "_" + name))

    def has(self, name: str) -> bool:
        return bool(getattr(self, "_" + name))

    def _rebuild(self) -> None:
        for name in HOOKS:
            bound = tuple(
                (getattr(p, name), inspect.iscoroutinefunction(getattr(p, name)))
                for p in self._plugins
                if callable(getattr(p, name, None))
            )
            setattr(self, "_" + name, bound)
        self.request_path_sync = not any(
            is_async
            for name in ("post_read", "authenticate", "pre_call", "post_call", "pre_write", "post_write")
            for _, is_async in getattr(self, "_" + name)
        )

    def run_now(self, name: str, *args: Any) -> None:
        """Run every ``name`` hook, all plain methods (``request_path_sync``);
        exceptions propagate."""
        for hook, _ in getattr(self, "_" + name):
            hook(*args)

    def all_true_now(self, name: str, *args: Any) -> bool:
        """``all_true`` for plain-method hooks."""
        for hook, _ in getattr(self, "_" + name):
            try:
                result = hook(*args)
            except Exception as exc:
                log.info("plugin hook %s refused: %s", getattr(hook, "__qualname__", name), exc)
                return False
            if result is False or (name == "authenticate" and not result):
                return False
        return True

    def run_logged_now(self, name: str, *args: Any) -> None:
        for hook, _ in getattr(self, "_" + name):
            try:
                hook(*args)
            except Exception:
                log.exception("plugin hook %s failed", getattr(hook, "__qualname__", name))

    # -- running hooks -----------------------------------------------------

    async def run(self, name: str, *args: Any) -> None:
        """Run every ``name`` hook; exceptions propagate (the step rejects)."""
        for hook, is_async in getattr(self, "_" + name):
            if is_async:
                await hook(*args)
            else:
                hook(*args)

    async def run_logged(self, name: str, *args: Any) -> None:
        """Run every ``name`` hook; an exception is logged and the next hook runs."""
        for hook, is_async in getattr(self, "_" + name):
            try:
                if is_async:
                    await hook(*args)
                else:
                    hook(*args)
            except Exception:
                log.exception("plugin hook %s failed", getattr(hook, "__qualname__", name))

    async def all_true(self, name: str, *args: Any) -> bool:
        """Run ``name`` hooks until one returns falsy (``on_conn_accept``,
        ``authenticate``); a raising hook counts as a refusal."""
        for hook, is_async in getattr(self, "_" + name):
            try:
                result = (await hook(*args)) if is_async else hook(*args)
            except Exception as exc:
                log.info("plugin hook %s refused: %s", getattr(hook, "__qualname__", name), exc)
                return False
            if result is False or (name == "authenticate" and not result):
                return False
        return True
