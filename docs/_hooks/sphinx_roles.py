"""MkDocs hook: render the Sphinx roles used in docstrings (:class:`X`) as plain code.

The docstrings are read by IDEs and ``help()`` too, where ``:class:`~a.B``` is the common
spelling; mkdocstrings would print the role literally, so the rendered page drops it (and,
as Sphinx does for ``~``, shows only the last component of the dotted name).
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj|const):<code>(~?)([^<]*)</code>")


def _plain(match: re.Match[str]) -> str:
    tilde, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if tilde else name}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    """Rewrites every ``:role:<code>name</code>`` left in the page's HTML."""
    return _ROLE.sub(_plain, html)
