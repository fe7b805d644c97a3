"""The names a backend holds an adapter's weights under: its id, then ``id@n`` for its ``n``-th replacement.

A replacement loads the new weights beside the old ones, so they need a name of their own; ``@`` is not allowed in
an adapter id, so no id the user loads can take one of these names. A backend that holds an adapter under such a
name (replaced by another process) is reported to the registry as :class:`Discovered`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Discovered", "VersionedName", "default_versioned_name", "parse_versioned_name"]

VersionedName = Callable[[str, int], str]
"""The backend name of an id's ``n``-th replacement: ``(id, n) -> name``."""


def default_versioned_name(adapter_id: str, version: int) -> str:
    """``id@version``: ``@`` is not allowed in an adapter id, so no id the user loads can take this name."""
    return f"{adapter_id}@{version}"


def parse_versioned_name(name: str) -> tuple[str, int] | None:
    """``(id, version)`` of a :func:`default_versioned_name`, else ``None`` (a plain id)."""
    adapter_id, at, version = name.rpartition("@")
    if not at or not adapter_id or not version.isdigit() or not version.isascii():
        return None
    return adapter_id, int(version)


@dataclass(frozen=True)
class Discovered:
    """An adapter the backend holds under a name other than its id: an id another process replaced.

    Attributes:
        path: Where its weights came from (what a reload reads).
        backend: The name the backend holds it under (``versioned(id, version)``).
        version: Its replacement number; this registry's later replacements are numbered after it, so that
            they never take a name the backend already has.
    """

    path: str
    backend: str
    version: int
