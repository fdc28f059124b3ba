"""Client plugins: hooks around each call and each connection of a client.

The client-side counterpart of ``rpc.plugins.container`` (rpcx's client
``PluginContainer``). A plugin is any object; it takes part in a step by
defining the method of that step's name, a plain method or an ``async def``
one (resolved once, when the plugin is added). Per step, plugins run in the
order they were added. With no plugin implementing a step, that step costs
one empty-tuple check.

| hook | when | raising / result |
| --- | --- | --- |
| ``pre_call(call, args)`` | before the request of a try is sent | the call fails with that exception; nothing is sent |
| ``post_call(call, args, reply, error)`` | after the try: ``reply`` the response ``Message`` (None for oneway or on error), ``error`` the exception (else None) | the call fails with that exception instead |
| ``on_conn_open(address, conn)`` | a connection was opened, before its first use | ``False`` or raising closes it; connecting fails |
| ``on_conn_close(address, conn)`` | a connection let through closed | logged |

``call`` is a ``CallInfo``: ``service``, ``method``, ``address`` (the server
of this try), ``metadata`` (the request's, which ``pre_call`` may change),
``oneway`` and ``values`` (a dict for the plugins' own state, from
``pre_call`` to ``post_call``). ``Client`` and ``XClient`` run the call hooks;
the connection hooks run in the ``ServerCaller`` that owns connections
(``RpcxCaller``). An exception a hook raises gets a note naming the hook.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

from rpc.message import Message

CLIENT_HOOKS = ("pre_call", "post_call", "on_conn_open", "on_conn_close")
CALL_HOOKS = ("pre_call", "post_call")
CONN_HOOKS = ("on_conn_open", "on_conn_close")

log = logging.getLogger("rpc.client_plugins")


@dataclass(slots=True, kw_only=True)
class CallInfo:
    """One try of a call, as the call hooks see it."""

    service: str
    method: str
    address: str
    #: the request's metadata; ``pre_call`` may add or change entries (sent as they are then)
    metadata: dict[str, str]
    oneway: bool = False
    #: the plugins' own per-call state, from ``pre_call`` to ``post_call``
    values: dict[str, Any] = field(default_factory=dict)


def _name(hook: Any) -> str:
    return getattr(hook, "__qualname__", repr(hook))


class ClientPluginContainer:
    """An ordered set of client plugins and, per hook, the tuple of their bound methods."""

    def __init__(self, plugins: Any = ()) -> None:
        self._plugins: list[object] = []
        #: some plugin implements ``pre_call`` or ``post_call`` (checked once per call)
        self.call_hooks = False
        self._pre_call: tuple[tuple[Any, bool], ...] = ()
        self._post_call: tuple[tuple[Any, bool], ...] = ()
        self._on_conn_open: tuple[tuple[Any, bool], ...] = ()
        self._on_conn_close: tuple[tuple[Any, bool], ...] = ()
        for plugin in plugins or ():
            self.add(plugin)

    @property
    def plugins(self) -> tuple[object, ...]:
        return tuple(self._plugins)

    def __bool__(self) -> bool:
        return bool(self._plugins)

    def add(self, plugin: object) -> None:
        if not any(callable(getattr(plugin, name, None)) for name in CLIENT_HOOKS):
            raise TypeError(f"{type(plugin).__name__} implements no client plugin hook ({', '.join(CLIENT_HOOKS)})")
        self._plugins.append(plugin)
        self._rebuild()

    def remove(self, plugin: object) -> None:
        self._plugins.remove(plugin)
        self._rebuild()

    def has(self, name: str) -> bool:
        return bool(getattr(self, "_" + name))

    def _rebuild(self) -> None:
        for name in CLIENT_HOOKS:
            bound = tuple(
                (getattr(p, name), inspect.iscoroutinefunction(getattr(p, name)))
                for p in self._plugins
                if callable(getattr(p, name, None))
            )
            setattr(self, "_" + name, bound)
        self.call_hooks = bool(self._pre_call or self._post_call)

    # -- running hooks -------------------------------------------------------

    @staticmethod
    async def _run(hooks: tuple[tuple[Any, bool], ...], *args: Any) -> None:
        for hook, is_async in hooks:
            try:
                if is_async:
                    await hook(*args)
                else:
                    hook(*args)
            except Exception as exc:
                exc.add_note(f"raised by client plugin hook {_name(hook)}")
                raise

    async def pre_call(self, call: CallInfo, args: Any) -> None:
        """Run the ``pre_call`` hooks; the first exception propagates (the call is refused)."""
        await self._run(self._pre_call, call, args)

    async def post_call(self, call: CallInfo, args: Any, reply: Message | None, error: BaseException | None) -> None:
        """Run the ``post_call`` hooks; the first exception propagates (the call fails with it)."""
        await self._run(self._post_call, call, args, reply, error)

    async def conn_open(self, address: str, conn: Any) -> None:
        """Run the ``on_conn_open`` hooks; raises ``ConnectionRefusedError``
        when one returns ``False``, or what a hook raised (with a note)."""
        for hook, is_async in self._on_conn_open:
            try:
                result = (await hook(address, conn)) if is_async else hook(address, conn)
            except Exception as exc:
                exc.add_note(f"raised by client plugin hook {_name(hook)}")
                raise
            if result is False:
                raise ConnectionRefusedError(f"connection to {address} refused by client plugin hook {_name(hook)}")

    def conn_close_now(self, address: str, conn: Any) -> Any:
        """Run the ``on_conn_close`` hooks from a plain callback: at once when
        all are plain methods (returns None), else returns the coroutine that
        runs them (for the caller to schedule)."""
        if any(is_async for _, is_async in self._on_conn_close):
            return self.conn_close(address, conn)
        for hook, _ in self._on_conn_close:
            try:
                hook(address, conn)
            except Exception:
                log.exception("client plugin hook %s failed", _name(hook))
        return None

    async def conn_close(self, address: str, conn: Any) -> None:
        """Run the ``on_conn_close`` hooks; an exception is logged and the next hook runs."""
        for hook, is_async in self._on_conn_close:
            try:
                if is_async:
                    await hook(address, conn)
                else:
                    hook(address, conn)
            except Exception:
                log.exception("client plugin hook %s failed", _name(hook))


def share_conn_hooks(plugins: ClientPluginContainer, caller: Any) -> tuple[object, ...]:
    """Add the plugins of a ``Client``/``XClient`` that have connection hooks to
    its ``caller`` (which owns the connections); returns them, for
    ``unshare_conn_hooks``. ``TypeError`` when the caller cannot run them:
    a connection hook that silently never ran could not refuse anything."""
    shared = tuple(p for p in plugins.plugins if any(callable(getattr(p, n, None)) for n in CONN_HOOKS))
    if not shared:
        return ()
    add = getattr(caller, "add_plugin", None)
    if add is None:
        raise TypeError(
            f"{type(caller).__name__} opens no connections of its own, so connection hooks "
            f"({', '.join(CONN_HOOKS)}) cannot run; use call hooks only, or an RpcxCaller"
        )
    for p in shared:
        add(p)
    return shared


def unshare_conn_hooks(shared: tuple[object, ...], caller: Any) -> None:
    """Undo ``share_conn_hooks`` (the client is closing; the caller may live on)."""
    for p in shared:
        try:
            caller.remove_plugin(p)
        except ValueError:
            pass


def as_container(plugins: Any) -> ClientPluginContainer:
    """``plugins`` (a container, an iterable of plugins or None) as a container."""
    if isinstance(plugins, ClientPluginContainer):
        return plugins
    return ClientPluginContainer(plugins or ())


__all__ = [
    "CALL_HOOKS",
    "CLIENT_HOOKS",
    "CONN_HOOKS",
    "CallInfo",
    "ClientPluginContainer",
    "as_container",
    "share_conn_hooks",
    "unshare_conn_hooks",
]
