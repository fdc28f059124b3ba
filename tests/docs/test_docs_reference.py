"""The generated references (docs/hooks/): the CLI page covers every
subcommand and option of the real parser, the configuration page every field
of every configuration dataclass, each with a description."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

HOOKS = Path(__file__).resolve().parents[2] / "docs" / "hooks"
sys.path.insert(0, str(HOOKS))
import griffe_rst  # noqa: E402
import refgen  # noqa: E402

from cli.main import build_parser  # noqa: E402
from juggler.config import AppConfig, config_from_dict  # noqa: E402


def all_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser under ``parser``, found without refgen's own walker."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                out += all_parsers(sub)
    return out


# --- CLI -------------------------------------------------------------------------


def test_cli_reference_has_every_subcommand_with_its_usage_and_examples() -> None:
    parser = build_parser()
    md = refgen.cli_markdown(parser)
    progs = [p.prog for p in all_parsers(parser)]
    # the nested commands are reached, not only the top level
    for prog in ("juggler up", "juggler server", "juggler callee", "juggler client", "juggler load",
                 "juggler balancer", "juggler rpc serve", "juggler rpc call", "juggler seq server", "juggler seq client"):
        assert prog in progs
    for p in all_parsers(parser):
        assert f"`{p.prog}` {{#{refgen.anchor(p.prog)}}}" in md, p.prog
        assert f"usage: {p.prog}" in md
        if p.epilog:
            first_example = p.epilog.strip().splitlines()[-1].strip()
            assert first_example in md, (p.prog, first_example)


def test_cli_reference_has_every_option_with_its_help() -> None:
    parser = build_parser()
    md = refgen.cli_markdown(parser)
    for p in all_parsers(parser):
        section = md.split(f"`{p.prog}` {{#", 1)[1]
        for action in p._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            for option in action.option_strings:
                assert f"`{option}" in section or f", {option}" in section, (p.prog, option)
            if action.help and "%(" not in action.help:
                assert refgen._cell(action.help) in section, (p.prog, action.help)


def test_cli_reference_expands_defaults_in_help() -> None:
    parser = argparse.ArgumentParser(prog="tool", description="Does things.", epilog="examples:\n  tool --n 3")
    parser.add_argument("--n", type=int, default=7, help="how many [%(default)s]")
    sub = parser.add_subparsers(dest="cmd")
    go = sub.add_parser("go", help="go somewhere")
    go.add_argument("--far", action="store_true", help="far away")
    go.add_argument("where", choices=["up", "down"], help="which way")
    md = refgen.cli_markdown(parser)
    assert "| `--n N` | how many [7] |" in md
    assert "which way (one of up, down)" in md
    assert "| [`tool go`](#tool-go) | go somewhere |" in md
    assert "### `tool go` {#tool-go}" in md and "| `--far` | far away |" in md
    assert "```text\nexamples:\n  tool --n 3\n```" in md


# --- configuration ---------------------------------------------------------------


def documented_classes() -> set[type]:
    return {s.cls for g in refgen.config_groups() for s in g.sections}


def test_config_reference_has_every_field_with_a_description() -> None:
    md = refgen.config_markdown(refgen.config_groups())
    missing = []
    for group in refgen.config_groups():
        for section in group.sections:
            docs = refgen.field_docs(section.cls)
            missing += [f"{section.cls.__module__}.{section.cls.__qualname__}.{name}" for name, doc in docs.items()
                        if not doc]
            if section.table:
                for f in dataclasses.fields(section.cls):
                    if not f.metadata.get("internal"):
                        assert f"| `{f.name}` |" in md, (section.name, f.name)
    assert not missing, "fields without a description (add a #: comment above them): " + ", ".join(missing)


def test_every_juggler_config_section_is_documented() -> None:
    group = next(g for g in refgen.config_groups() if g.title == "juggler server")
    tables = {s.name.strip("[]") for s in group.sections}
    fields = {f.name for f in dataclasses.fields(AppConfig)}
    assert fields <= tables
    for name in fields:
        if name == "channels":  # an array of tables
            config_from_dict({"channels": [{}]})
            continue
        if name == "proxy":  # an array of tables, each naming its kind and endpoint
            config_from_dict({"proxy": []})
            continue
        config_from_dict({name: {}} if name not in ("redis", "pubsub") else {name: {}, "redis": {}})
    with pytest.raises(ValueError, match="unknown section"):
        config_from_dict({"nonsense": {}})


def _dataclasses_in(tp: Any) -> set[type]:
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return {tp}
    return {c for arg in typing.get_args(tp) for c in _dataclasses_in(arg)}


def test_dataclasses_nested_in_documented_ones_are_documented() -> None:
    documented = documented_classes()
    for cls in documented:
        hints = typing.get_type_hints(cls)
        # a field whose key in the file has a type of its own (metadata "type") holds what it becomes;
        # an internal one (derived from others) is no key at all
        stated = {f.name for f in dataclasses.fields(cls) if "type" in f.metadata or f.metadata.get("internal")}
        for name, tp in hints.items():
            if name in stated:
                continue
            for nested in _dataclasses_in(tp):
                assert nested in documented, f"{cls.__qualname__}.{name}: {nested.__qualname__} is not documented"


def test_field_docs_sources_in_order_of_preference() -> None:
    @dataclass(kw_only=True)
    class Example:
        #: from the comment above,
        #: on two lines
        above: int = 1
        trailing: str = "x"  # from the end of the line
        both: float = field(default=0.5, metadata={"doc": "from metadata"})  # not this
        #: a #: comment wins over the end of the line
        mixed: bool = True  # not this
        bare: int = 0

    docs = refgen.field_docs(Example)
    assert docs == {
        "above": "from the comment above, on two lines",
        "trailing": "from the end of the line",
        "both": "from metadata",
        "mixed": "a #: comment wins over the end of the line",
        "bare": "",
    }


class Mode(enum.Enum):
    FAST = "fast"


def test_defaults_as_users_write_them() -> None:
    @dataclass(kw_only=True)
    class Inner:
        x: int = 1

    @dataclass(kw_only=True)
    class Example:
        required: str
        text: str = 'say "hi"'
        flag: bool = False
        items: tuple[str, ...] = ("a",)
        none: int | None = None
        mode: Mode = Mode.FAST
        inner: Inner = field(default_factory=Inner)
        cpus: int = field(default_factory=lambda: 4, metadata={"default": "the number of CPUs"})
        kind: Literal["a", "b"] = "a"

    f = {x.name: x for x in dataclasses.fields(Example)}
    assert refgen.default_text(f["required"], "toml") == "required"
    assert refgen.default_text(f["text"], "toml") == '`"say \\"hi\\""`'
    assert refgen.default_text(f["flag"], "toml") == "`false`"
    assert refgen.default_text(f["flag"], "python") == "`False`"
    assert refgen.default_text(f["items"], "toml") == '`["a"]`'
    assert refgen.default_text(f["none"], "toml") == "`unset`"
    assert refgen.default_text(f["none"], "python") == "`None`"
    assert refgen.default_text(f["mode"], "python") == "`Mode.FAST`"
    assert refgen.default_text(f["mode"], "toml") == '`"fast"`'
    assert refgen.default_text(f["inner"], "toml") == "`Inner()`"
    assert refgen.default_text(f["cpus"], "toml") == "the number of CPUs"


def test_balancer_workers_default_does_not_depend_on_the_machine() -> None:
    md = refgen.config_markdown(refgen.config_groups())
    row = next(line for line in md.splitlines() if line.startswith("| `workers` |"))
    assert "the number of CPUs" in row


# --- docstrings --------------------------------------------------------------------


def test_rst_roles_and_literal_blocks_become_markdown() -> None:
    text = ("Raises :class:`~juggler.errors.CallExpired` or :exc:`rpc.errors.RpcError`; see\n"
            ":meth:`events`. Example::\n\n    x = 1\n\nAlone:\n\n::\n\n    y = 2\n")
    assert griffe_rst.rst_to_markdown(text) == (
        "Raises `CallExpired` or `rpc.errors.RpcError`; see\n`events`. Example:\n\n    x = 1\n\nAlone:\n\n\n    y = 2"
    )


# --- the mkdocs hook -----------------------------------------------------------------


def test_mkdocs_yml_hook_adds_the_generated_pages() -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    from mkdocs.config import load_config
    from mkdocs.structure.files import Files

    config = load_config(str(HOOKS.parents[1] / "mkdocs.yml"))
    files = config.plugins.on_files(Files([]), config=config)
    pages = {f.src_uri: f.content_string for f in files}
    assert set(pages) == {"reference/cli.md", "reference/config.md"}
    assert pages["reference/cli.md"].startswith("# Command line")
    assert "`juggler rpc serve`" in pages["reference/cli.md"]
    assert "| `max_inflight_calls` |" in pages["reference/config.md"]
