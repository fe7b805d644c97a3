"""Griffe extension for the docs build: turn Sphinx roles in docstrings into mkdocstrings cross-references.

The package's docstrings use Sphinx roles (``:class:`InferenceError```, ``:meth:`~InferenceProvider.stream```),
which mkdocstrings would print literally. This extension rewrites each role, once the package is loaded, into
an *optional* autorefs link: a link when the target is rendered in the API reference, plain code otherwise
(private helpers, the standard library), never a build warning. A reST literal-block marker (``text::``)
becomes a plain colon; the indented block after it is already a Markdown code block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_LITERAL_BLOCK = re.compile(r"(?<=\S)::\n(?=\s*\n)")  # reST "text::" before an indented block
_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|data|attr|mod|exc|obj|const):`(?P<tilde>~?)(?P<target>[^`<>]+)`")


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path of ``target`` as written in ``obj``'s docstring (best effort; unresolved stays as is)."""
    target = target.strip().rstrip("()")
    head, _, rest = target.partition(".")
    scopes: list[Any] = [obj]
    parent = obj.parent
    while parent is not None:
        scopes.append(parent)
        parent = parent.parent
    for scope in scopes:
        try:
            resolved = scope.resolve(head)
        except (griffe.NameResolutionError, AttributeError, KeyError):
            continue
        return f"{resolved}.{rest}" if rest else resolved
    return target


def _rewrite(obj: griffe.Object, text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        written = match["target"].strip()
        title = written.rsplit(".", 1)[-1] if match["tilde"] else written
        identifier = _resolve(obj, written)
        return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'

    return _LITERAL_BLOCK.sub(":\n", _ROLE.sub(replace, text))


def _walk(obj: griffe.Object, seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if obj.docstring is not None and ":" in obj.docstring.value:  # every role and marker has one
        obj.docstring.value = _rewrite(obj, obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            _walk(member, seen)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _walk(pkg, set())
