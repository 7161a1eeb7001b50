"""Griffe extension for the API reference: the docstrings' Sphinx roles as Markdown.

The docstrings are written for readers of the source (``:func:`fit```, ``:class:`~varbnn.likelihoods.Gaussian```);
Markdown has no roles, so each one becomes an inline code span of the name as the reader would write it
(a leading ``~`` keeps only the last component, as Sphinx does). Plain ``text`` in double backticks is already a
Markdown code span.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")


def _replace(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    target = target.strip()
    if tilde:
        target = target.rsplit(".", 1)[-1]
    if target.endswith(")"):
        return f"`{target}`"
    return f"`{target}`"


def convert_roles(text: str) -> str:
    """``:role:`~a.b``` -> `` `b` ``; ``:role:`a.b``` -> `` `a.b` ``."""
    return _ROLE.sub(_replace, text)


class RstRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring griffe loads."""

    def _fix(self, obj: griffe.Object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert_roles(obj.docstring.value)

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        self._fix(obj)
