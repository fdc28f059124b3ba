"""mkdocs hook (``hooks:`` in mkdocs.yml): adds the pages generated from the
code, ``reference/cli.md`` from the argparse parsers and
``reference/config.md`` from the configuration dataclasses (see refgen.py).
They exist only in the built site, never in ``docs/``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import refgen  # a sibling module: mkdocs puts this directory on sys.path while it loads the hook
from mkdocs.structure.files import File, Files

CLI_INTRO = """# Command line

One console script, `juggler`, with a subcommand per component. Every
command prints this help with `--help`; long-running ones log one line when
they start (where they listen) and stop cleanly on SIGINT or SIGTERM (see
[Operations](../operations.md)). Exit status: 0 success, 1 failure, 2 a usage
error (a bad flag or value, named on one line).

This page is generated from the parsers themselves, so it lists exactly the
options of the installed version.

"""

CONFIG_INTRO = """# Configuration

Every option of the suite is a field of a typed, keyword-only dataclass,
validated when it is built: a wrong value fails at start (or at reload) with a
message naming the field, never later. Files are TOML and map onto the same
dataclasses; command-line flags override the file.

This page is generated from the dataclasses themselves: name, type, default
and description of every field.

"""


def cli_page() -> str:
    from cli.main import build_parser

    return CLI_INTRO + refgen.cli_markdown(build_parser())


def config_page() -> str:
    return CONFIG_INTRO + refgen.config_markdown(refgen.config_groups())


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
}


def on_files(files: Files, config: Any) -> Files:
    for uri, render in PAGES.items():
        files.append(File.generated(config, uri, content=render()))
    return files
