"""Reference pages generated from the code, so that they cannot drift from it.

- :func:`cli_markdown` walks the ``juggler`` argparse parser and its
  subparsers, recursively: usage, description, every argument with its help
  (defaults expanded), the subcommands, and the epilog's examples.
- :func:`config_markdown` renders the configuration dataclasses: every field
  with its type, its default and its description. A field's description is,
  in order of preference, ``field(metadata={"doc": ...})``, the ``#:``
  comment lines right above the field, or a ``#`` comment at the end of the
  field's line. ``metadata={"default": ...}`` replaces a default that is
  computed at start-up (e.g. the number of CPUs).

Pure functions over live objects (no mkdocs import): ``reference.py`` (the
mkdocs hook) turns their output into pages, and ``tests/docs`` checks that
every subcommand and every field is covered.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib
import inspect
import io
import re
import textwrap
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

USAGE_WIDTH = 88  # columns of the usage blocks: fixed, so the page does not depend on the terminal


# --- CLI -----------------------------------------------------------------------


def walk_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subparser under it, depth first, in declaration order."""
    yield parser
    seen: set[int] = set()
    for sub in subcommands(parser):
        if id(sub) not in seen:  # aliases map to the same parser
            seen.add(id(sub))
            yield from walk_parsers(sub)


def subcommands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [p for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for p in action.choices.values()]


def anchor(prog: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", prog.lower()).strip("-")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _arguments(parser: argparse.ArgumentParser) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(positional, optional) arguments as (invocation, expanded help) pairs."""
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH)
    positional, optional = [], []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        invocation = formatter._format_action_invocation(action)
        text = formatter._expand_help(action) if action.help else ""
        if action.choices is not None and not action.option_strings and "{" in invocation:
            text = f"{text} (one of {', '.join(map(str, action.choices))})".strip()
        (optional if action.option_strings else positional).append((invocation, text))
    return positional, optional


def _subcommand_help(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                if name in helps:
                    out.append((sub.prog, helps[name]))
    return out


def cli_markdown(parser: argparse.ArgumentParser, *, level: int = 2) -> str:
    """Markdown for ``parser`` and all its subcommands, one section each."""
    parts = []
    for p in walk_parsers(parser):
        depth = p.prog.count(" ") - parser.prog.count(" ")
        hashes = "#" * min(level + depth, 6)
        parts.append(f"{hashes} `{p.prog}` {{#{anchor(p.prog)}}}\n")
        if p.description:
            parts.append(_prose(p.description) + "\n")
        parts.append(f"```text\n{_usage(p)}\n```\n")
        subs = _subcommand_help(p)
        if subs:
            rows = "\n".join(f"| [`{prog}`](#{anchor(prog)}) | {_cell(text)} |" for prog, text in subs)
            parts.append(f"| command | what it does |\n| --- | --- |\n{rows}\n")
        positional, optional = _arguments(p)
        for title, items in (("argument", positional), ("option", optional)):
            if items:
                rows = "\n".join(f"| `{inv}` | {_cell(text)} |" for inv, text in items)
                parts.append(f"| {title} | description |\n| --- | --- |\n{rows}\n")
        if p.epilog:
            parts.append(f"```text\n{textwrap.dedent(p.epilog).strip()}\n```\n")
    return "\n".join(parts)


def _prose(text: str) -> str:
    """A description or docstring as Markdown: reST ``literals`` become `code`."""
    return re.sub(r"``(.+?)``", r"`\1`", inspect.cleandoc(text))


# --- configuration -------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    """One dataclass of a configuration, as it appears to the user."""

    #: where users import the class from, and so the name the page gives it (``balancer.config.Tls``);
    #: that module may re-export it from the one defining it
    path: str
    #: the TOML table (``[server]``, ``[[backends]]``) or the class name users write
    name: str
    #: one line on where this section goes (shown under the heading)
    note: str = ""
    #: False: the note refers to another section with the same fields (no table of its own)
    table: bool = True

    @property
    def cls(self) -> type:
        return _cls(self.path)


@dataclass(frozen=True)
class ConfigGroup:
    """The configuration of one component: a title, an introduction, its sections."""

    title: str
    intro: str
    #: how defaults are written: as in a TOML file or as in Python code
    style: Literal["toml", "python"]
    sections: tuple[Section, ...]


def _cls(path: str) -> type:
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type)
    return cls


def config_groups() -> list[ConfigGroup]:
    """Every user-facing configuration dataclass, grouped by component."""
    return [
        ConfigGroup(
            "juggler server",
            "The file given to `juggler server --config FILE` (and `juggler up`). Each TOML table maps "
            "onto one dataclass of `juggler.config.AppConfig`; unknown keys are errors. Flags override "
            "the file, and `--set SECTION.KEY=VALUE` sets any option from the command line "
            "(`VALUE` in TOML syntax).",
            "toml",
            (
                Section("juggler.config.ServerConfig", "[server]",
                        "`listen = \"HOST:PORT\"` may stand for `host` and `port`."),
                Section("juggler.broker.redis.config.RedisBrokerConfig", "[redis]",
                        "Present: calls and results (and pub-sub, unless `[pubsub]`) go through Redis; "
                        "absent: the in-memory broker."),
                Section("juggler.broker.redis.config.RedisBrokerConfig", "[pubsub]",
                        "Optional: a separate Redis (or cluster) for SUB/UNSB/PUB, with the same keys as "
                        "[`[redis]`](#juggler-server-redis).", table=False),
                Section("juggler.broker.memory.MemoryBrokerConfig", "[memory]",
                        "The in-memory broker, used when there is no `[redis]`."),
                Section("juggler.auth.AuthConfig", "[auth]",
                        "Authentication at the handshake and authorization per message."),
                Section("juggler.auth.Rule", "[[auth.rules]]",
                        "Grants: an identity may use what any rule matching its claims allows."),
                Section("juggler.config.MetricsConfig", "[metrics]",
                        "The Prometheus endpoint (`--metrics-port`)."),
                Section("juggler.config.ApiConfig", "[api]",
                        "Present: the [server API](../juggler/api.md) (`--api`, `--api-key`, `--api-insecure`). "
                        "`listen = \"HOST:PORT\"` may stand for `host` and `port`."),
                Section("juggler.channels.ChannelOptions", "[[channels]]",
                        "Per-channel options, chosen by `match` (a Redis glob; the first table that matches "
                        "wins): [history and recovery](../juggler/pubsub.md), presence, join/leave."),
                Section("juggler.proxy.config.ProxyConfig", "[[proxy]]",
                        "An endpoint of your application that decides connects, subscribes or publishes, or "
                        "answers RPCs, over HTTP or gRPC: see [Connecting your application](../juggler/proxies.md)."),
            ),
        ),
        ConfigGroup(
            "balancer",
            "The file given to `juggler balancer --config FILE` (reloaded on SIGHUP or `POST /reload`). "
            "Top-level keys configure `balancer.BalancerConfig`; the tables configure the dataclasses it "
            "nests. Durations are seconds.",
            "toml",
            (
                Section("balancer.config.BalancerConfig", "top level"),
                Section("balancer.config.BackendConfig", "[[backends]]",
                        "One table per backend (or a list of `\"host:port\"` strings)."),
                Section("balancer.config.Timeouts", "[timeouts]"),
                Section("balancer.config.Passive", "[passive]"),
                Section("balancer.config.Limits", "[limits]"),
                Section("balancer.config.HealthCheck", "[health]",
                        "Active health checks; absent or `enabled = false`: none."),
                Section("balancer.config.Tls", "[tls]",
                        "HTTPS on `listen`, the HTTP-to-HTTPS redirect and TLS to backends (see the TLS page)."),
                Section("balancer.config.Certificate", "[[tls.certificates]]",
                        "One table per certificate of the listener; the first is the default, others are "
                        "picked by SNI."),
                Section("balancer.config_sections.ClientCertHeaders", "[tls.client_cert_headers]",
                        "Request headers passing the verified client certificate to backends; see "
                        "[client certificates](../balancer.md#client-certificates)."),
                Section("balancer.acme.settings.Acme", "[acme]",
                        "The listener's certificate from an ACME CA (Let's Encrypt), obtained and renewed by "
                        "the balancer; see [certificates (ACME)](../balancer-acme.md)."),
                Section("balancer.accesslog.AccessLog", "[access_log]",
                        "One line per request; see [access logs](../balancer.md#access-logs)."),
                Section("balancer.auth.AdminAuth", "[admin_auth]",
                        "Credentials asked of admin requests; see "
                        "[admin authentication](../balancer.md#admin-authentication)."),
                Section("balancer.discovery.DnsConfig", "[dns]",
                        "Backends given by name, resolved again every `interval` (A/AAAA, SRV); see "
                        "[DNS service discovery](../balancer.md#dns-service-discovery)."),
                Section("balancer.ratelimit.RateLimit", "[rate_limit]",
                        "Requests per client address or header value, over every listener; see "
                        "[rate limiting](../balancer.md#rate-limiting)."),
                Section("balancer.compression.Compression", "[compress]",
                        "Response compression (gzip, brotli, zstd) on `listen`, a listener "
                        "(`[listeners.compress]`) or a route (`compress = ...`); see "
                        "[compression](../balancer.md#compression)."),
                Section("balancer.policies.Sticky", "[sticky]",
                        "Cookie persistence (every pool; `[backends.NAME.sticky]` for one); see "
                        "[sticky sessions](../balancer.md#sticky-sessions)."),
                Section("balancer.routing.NamedBackend", "[backends.NAME]",
                        "A named backend pool, instead of the `[[backends]]` list (which makes one pool named "
                        "`default`); see [routing](../balancer.md#routing)."),
                Section("balancer.routing.Listener", "[[listeners]]",
                        "Several listeners, instead of `listen` and its top-level routing keys."),
                Section("balancer.routing.Route", "[[routes]]",
                        "A route of `listen` (or `[[listeners.routes]]` of a listener)."),
                Section("balancer.routing.HeaderMatch", "header",
                        "A route's header condition, `{ name = \"X-Canary\", equals = \"1\" }`."),
                Section("balancer.routing.ClientCertMatch", "client_cert",
                        "A route's condition on the client certificate, `{ subject_prefix = \"CN=admin,\" }`."),
                Section("balancer.routing.Redirect", "redirect",
                        "A route's redirect, `{ code = 301, location = \"...\" }` or `{ scheme = \"https\" }`."),
                Section("balancer.routing.Respond", "respond",
                        "A route's own answer; see [routing](../balancer.md#routing)."),
                Section("balancer.rewrite.Rewrite", "rewrite",
                        "A route's rewrite of the forwarded target; see "
                        "[rewrites](../balancer.md#rewrites)."),
                Section("balancer.rewrite.ReplacePath", "rewrite.replace_path",
                        "`{ regex = '^/old/(.*)$', replacement = '/new/$1' }`."),
                Section("balancer.routing.HeaderRules", "[request_headers], [response_headers]",
                        "Header rules of a listener, a backend pool or a route."),
                Section("balancer.routing.RequestId", "request_id",
                        "`request_id = { header = \"X-Request-ID\" }`."),
                Section("balancer.routing.Hsts", "hsts",
                        "`hsts = { max_age = 31536000, include_subdomains = true }` on an HTTPS listener."),
            ),
        ),
        ConfigGroup(
            "rpc",
            "Keyword-only dataclasses passed to the RPC framework's classes in Python: the transport's "
            "connections, servers and pools (`rpc.transport`), and the governed client (`rpc.xclient`).",
            "python",
            (
                Section("rpc.transport.config.ConnectionConfig", "ConnectionConfig",
                        "Both sides of every transport connection."),
                Section("rpc.transport.config.ServerConfig", "ServerConfig",
                        "`TransportServer(..., config=)` and `RpcxServer(..., config=)`."),
                Section("rpc.transport.config.PoolConfig", "PoolConfig",
                        "`TransportPool(..., config=)` (and so `RpcxCaller`)."),
                Section("rpc.transport.kcpchannel.KcpOptions", "KcpOptions",
                        "`RpcxServer(..., kcp=)` and `RpcxCaller(..., kcp=)`: what `kcp@` addresses need."),
                Section("rpc.transport.kcpwire.KcpCrypt", "KcpCrypt",
                        "`KcpOptions(crypt=)`; `KcpCrypt.from_passphrase(passphrase, salt)` derives the key as "
                        "rpcx's examples do."),
                Section("rpc.transport.kcp.KcpSettings", "KcpSettings",
                        "`KcpOptions(settings=)`: how our side of a KCP session behaves."),
                Section("rpc.xclient.XClientOptions", "XClientOptions",
                        "`XClient(..., options=)`."),
                Section("rpc.breaker.BreakerConfig", "BreakerConfig",
                        "`XClientOptions(breaker=)`: one circuit breaker per server."),
            ),
        ),
        ConfigGroup(
            "seq server",
            "One member of a sequence cluster: the file given to `juggler seq server --config FILE` holds "
            "these keys at its top level (no tables; `peers` is a list of strings, `mode` is chosen by "
            "`--bootstrap`, `--rejoin` or `--join` only), and also `metrics_port` and `log_level`. The "
            "flags map onto the same fields and override the file; unknown keys are errors, named with "
            "their line. In Python: `seq.server.ServerConfig`, for `seq.runner.start_member`.",
            "toml",
            (Section("seq.server.ServerConfig", "ServerConfig"),),
        ),
        ConfigGroup(
            "seq snowflake",
            "A snowflake worker: the file given to `juggler seq snowflake --config FILE` holds these keys "
            "at its top level (`cluster` a list of strings, `bits` a list of three integers such as "
            "`[41, 10, 12]`), and also `log_level`. The flags override the file. In Python: "
            "`seq.worker.WorkerConfig`, for `seq.runner.start_worker`.",
            "toml",
            (Section("seq.worker.WorkerConfig", "WorkerConfig"),),
        ),
    ]


def _comment_docs(cls: type) -> dict[str, str]:
    """Field name → its ``#:`` comment (lines above) or end-of-line ``#`` comment."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments = {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    tree = ast.parse(source)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above = []
        k = node.lineno - 1  # the line above, 1-based
        while k >= 1 and lines[k - 1].strip().startswith("#:"):
            above.insert(0, lines[k - 1].strip()[2:].strip())
            k -= 1
        trailing = comments.get(node.lineno, "")
        if above:
            docs[node.target.id] = " ".join(above)
        elif trailing and not trailing.startswith("#:"):
            docs[node.target.id] = trailing[1:].strip()
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """Every field of dataclass ``cls`` → its description ("" where there is none)."""
    comments = _comment_docs(cls)
    return {f.name: str(f.metadata.get("doc") or comments.get(f.name, "")) for f in dataclasses.fields(cls)
            if not f.metadata.get("internal")}


def _literal(value: Any, style: str) -> str:
    """``value`` as a user writes it: in Python, or in TOML."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}" if style == "python" else _literal(value.value, style)
    if dataclasses.is_dataclass(value):
        return f"{type(value).__name__}()"
    if style == "python":
        return repr(value)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_literal(v, style) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_literal(v, style)}" for k, v in value.items()) + "}"
    return repr(value)


def default_text(f: dataclasses.Field[Any], style: str) -> str:
    """How the default of ``f`` is shown: ``required`` when there is none."""
    if "default" in f.metadata:
        return str(f.metadata["default"])
    if f.default is not dataclasses.MISSING:
        return f"`{_literal(f.default, style)}`"
    if f.default_factory is not dataclasses.MISSING:
        return f"`{_literal(f.default_factory(), style)}`"
    return "required"


def _type_text(f: dataclasses.Field[Any]) -> str:
    if "type" in f.metadata:  # the key's type in the file, where the field holds what it becomes
        return str(f.metadata["type"])
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))
    return t.replace("typing.", "")


def section_markdown(section: Section, style: str, group: str = "") -> str:
    cls = section.cls
    docs = field_docs(cls)
    head = f"### `{section.name}` {{#{anchor(group + ' ' + section.name)}}}\n\n"
    where = f"`{section.path}`"
    body = [head + (f"{where}. {section.note}" if section.note else f"{where}.") + "\n"]
    if not section.table:
        return "\n".join(body)
    if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}("):  # dataclass's generated signature
        body.append(_prose(cls.__doc__) + "\n")
    key = "key" if style == "toml" else "field"
    rows = [f"| `{f.name}` | `{_cell(_type_text(f))}` | {_cell(default_text(f, style))} | {_cell(_prose(docs[f.name]))} |"
            for f in dataclasses.fields(cls) if not f.metadata.get("internal")]  # internal: not a key of the file
    body.append(f"| {key} | type | default | description |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n")
    return "\n".join(body)


def config_markdown(groups: list[ConfigGroup], *, level: int = 2) -> str:
    parts = []
    for g in groups:
        parts.append(f"{'#' * level} {g.title} {{#{anchor(g.title)}}}\n\n{g.intro}\n")
        parts.extend(section_markdown(s, g.style, g.title) for s in g.sections)
    return "\n".join(parts)
