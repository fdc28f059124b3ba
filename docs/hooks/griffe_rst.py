"""A griffe extension (``extensions:`` of mkdocstrings' Python handler) that
lets the docstrings' reST habits render in Markdown.

The code's docstrings are prose with a little reST: cross-reference roles
(``:class:`~juggler.errors.CallExpired```) and literal blocks introduced by
``::``. Without this, the API reference shows them raw. Roles become code
spans (``~`` keeps the last component, as Sphinx does); ``::`` ends the
paragraph with ``:`` (or disappears when alone on its line), and the indented
block after it is already a Markdown code block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|attr|exc|mod|obj|data|const):`(~?)([^`]+)`")


def rst_to_markdown(text: str) -> str:
    """Docstring text with reST roles and ``::`` turned into Markdown."""
    text = ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)
    lines = []
    for line in text.splitlines():
        stripped = line.rstrip()
        if stripped.strip() == "::":
            continue
        if stripped.endswith("::"):
            line = stripped[:-1]
        lines.append(line)
    return "\n".join(lines)


class RstToMarkdown(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
