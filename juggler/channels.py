"""Per-channel options: history, presence, join/leave, chosen by channel pattern.

Channels have no options by default: no history, no presence, exactly the
original juggler's pub-sub. A ``[[channels]]`` table of the configuration
turns them on for the channels whose names match its ``match`` (a Redis glob
pattern, as in PSUBSCRIBE); the first table that matches wins::

    [[channels]]
    match = "chat.*"
    history_size = 100      # publications kept per channel (0 = no history)
    history_ttl = 600       # seconds history is kept after the last publication
    presence = true         # who is subscribed (the server API, presence in SUB ACKs)
    join_leave = true       # join/leave notices to subscribers that ask for them
    private = true          # a SUB needs a subscription token (juggler.refreshing)
    client_history = true   # clients may read the history (HISTORY requests, juggler.client_requests)
    client_presence = true  # clients may ask who is subscribed (PRESENCE requests)

Every server publishing to, or serving subscribers of, such a channel must
have the same rules: history is written by the publishing server, presence
by the subscribing one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rustext.fields import check_fields

from juggler.broker.glob import glob_match

__all__ = ["ChannelOptions", "ChannelRules", "NO_OPTIONS"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ChannelOptions:
    """The options of the channels one ``[[channels]]`` table matches."""

    #: Redis glob pattern of the channel names these options apply to
    match: str = "*"
    #: publications kept per channel for recovery and the history API; 0 = no history
    history_size: int = 0
    #: seconds a channel's history is kept after its last publication
    history_ttl: float = 300.0
    #: seconds a channel's offset and epoch are kept after its last publication
    #: (longer than history_ttl: a client that missed nothing still recovers)
    history_meta_ttl: float = 30 * 86400.0
    #: keep who is subscribed (presence API, presence counts)
    presence: bool = False
    #: seconds a presence entry lives unless its server refreshes it (a crashed server's entries expire)
    presence_ttl: float = 60.0
    #: send join/leave notices to the subscribers that ask for them
    join_leave: bool = False
    #: a SUB needs a subscription token naming the channel (juggler.refreshing)
    private: bool = False
    #: subscribers may read the channel's history themselves (HISTORY requests); needs history_size
    client_history: bool = False
    #: subscribers may ask who is subscribed (PRESENCE requests); needs presence
    client_presence: bool = False

    def __post_init__(self) -> None:
        if not self.match:
            raise ValueError("match must not be empty")
        if self.history_size < 0:
            raise ValueError("history_size must be >= 0")
        if self.history_size and self.history_ttl <= 0:
            raise ValueError("history_ttl must be > 0 when history_size is set")
        if self.history_meta_ttl < self.history_ttl:
            raise ValueError("history_meta_ttl must be >= history_ttl")
        if self.presence_ttl <= 0:
            raise ValueError("presence_ttl must be > 0")
        if self.join_leave and not self.presence:
            raise ValueError("join_leave needs presence = true")
        if self.client_history and not self.history:
            raise ValueError("client_history needs history_size > 0")
        if self.client_presence and not self.presence:
            raise ValueError("client_presence needs presence = true")

    @property
    def history(self) -> bool:
        """True when the channel keeps history (its EVNTs carry offset and epoch)."""
        return self.history_size > 0


NO_OPTIONS = ChannelOptions()


class ChannelRules:
    """The ``[[channels]]`` tables in order: :meth:`lookup` gives a channel's options."""

    __slots__ = ("_cache", "rules")

    def __init__(self, rules: tuple[ChannelOptions, ...] | list[ChannelOptions] = ()) -> None:
        self.rules = tuple(rules)
        self._cache: dict[str, ChannelOptions] = {}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChannelRules) and other.rules == self.rules

    def __hash__(self) -> int:
        return hash(self.rules)

    def __repr__(self) -> str:
        return f"ChannelRules({list(self.rules)!r})"

    def lookup(self, channel: str) -> ChannelOptions:
        """The options of `channel`: the first rule whose ``match`` matches, else none."""
        opts = self._cache.get(channel)
        if opts is None:
            opts = NO_OPTIONS
            for rule in self.rules:
                if glob_match(rule.match, channel):
                    opts = rule
                    break
            if len(self._cache) >= 100_000:
                self._cache.clear()
            self._cache[channel] = opts
        return opts

    @classmethod
    def from_toml(cls, data: Any) -> ChannelRules:
        """``[[channels]]`` tables (a list of dicts) → rules; ValueError naming the bad one."""
        if not isinstance(data, list):
            raise ValueError("channels must be an array of tables ([[channels]])")
        names = {f.name for f in dataclasses.fields(ChannelOptions)}
        rules = []
        for i, table in enumerate(data, 1):
            where = f"[[channels]] #{i}"
            if not isinstance(table, dict):
                raise ValueError(f"{where} must be a table")
            unknown = sorted(set(table) - names)
            if unknown:
                raise ValueError(f"unknown option(s) in {where}: {', '.join(unknown)}")
            table = check_fields(ChannelOptions, table, where)
            try:
                rules.append(ChannelOptions(**table))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: {exc}") from exc
        return cls(rules)
