"""A Griffe extension for the API reference: the docstrings' reStructuredText bits shown as Markdown can.

The docstrings cross-reference with Sphinx roles (``:class:`~workbench.launch.session.Run```, ``:func:`verify```,
``:mod:`.bitflip```). Markdown has no such roles, so they would show as ``:class:`` followed by the code. This turns
each into inline code, shortened as Sphinx would (``~`` keeps the last component, a leading ``.`` is dropped).
Not a link: some targets (the supervisor, errors) are not in the reference yet, and a dangling link fails the
strict build. A reST simple table (a paragraph that opens with a ``=== ===`` rule) is shown as preformatted text,
as it reads in the source, and so is the indented body of a reST definition-list item (a line, then lines
indented by four spaces), under its term. Loaded by mkdocs.yml (mkdocstrings' ``extensions`` option); nothing
is imported from the project.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|const):`(~?)\.?([^`]+)`")


TABLE_RULE = re.compile(r"^=+( +=+)+$")


def _tables_as_text(text: str) -> str:
    out: list[str] = []
    fence = None  # "table" or "definition" while a fenced block is open
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if fence == "table" and not line.strip() or fence == "definition" and not line.startswith("    "):
            out.extend(["```", ""] if line.strip() else ["```"])
            fence = None
        if fence is None and TABLE_RULE.match(line.strip()):
            out.append("```text")
            fence = "table"
        elif fence is None and line.strip() and not line[0].isspace() and i + 1 < len(lines) \
                and lines[i + 1].startswith("    ") and lines[i + 1].strip():
            out.extend([line, "", "```text"])
            fence = "definition"
            continue
        out.append(line[4:] if fence == "definition" else line)
    if fence is not None:
        out.append("```")
    return "\n".join(out)


def _plain(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRolesAsCode(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _tables_as_text(ROLE.sub(_plain, obj.docstring.value))
