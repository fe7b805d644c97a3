"""Paths as users write them: ``~`` expanded, compared by what they name, checked before anything is written.

Every place that takes a path (settings, ``load_adapter``, the conversion functions) goes through here, so
``~/adapters/x``, ``./adapters/x/`` and a symlink to the same directory mean the same thing everywhere.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "HUB_ID",
    "directory_problem",
    "expand_path",
    "normalise_path",
    "path_identity",
    "path_text_problem",
    "shown_path",
]

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
"""A Hugging Face Hub model id, ``ORG/NAME``. A relative path that does not exist reads the same: a model setting is
taken as a Hub id only when no such path exists."""


def expand_path(path: str | os.PathLike[str]) -> Path:
    """Return ``path`` as a :class:`~pathlib.Path` with a leading ``~`` or ``~user`` expanded."""
    return Path(os.path.expanduser(os.fspath(path)))


def normalise_path(path: str | os.PathLike[str]) -> str:
    """Return ``path`` with ``~`` expanded and written canonically, without touching the filesystem.

    ``a/./b/``, ``a//b`` and ``a/b`` all become ``a/b``. Nothing is made absolute and no symlink is followed,
    so a path that exists only on a server (or a Hugging Face Hub repo id) keeps its meaning. A URL-like
    reference (``hf://org/repo``, ``s3://bucket/key``) is returned unchanged: collapsing its ``//`` would
    change what a server reads.
    """
    text = os.fspath(path)
    if "://" in text:
        return text
    return os.path.normpath(os.path.expanduser(text))


def path_identity(path: str | os.PathLike[str]) -> str:
    """Return what two spellings of one path have in common: the real path when it exists on this machine.

    A path that does not exist here (a server-side path, a Hub repo id) is compared as
    :func:`normalise_path` writes it.
    """
    normalised = normalise_path(path)
    try:
        if os.path.exists(normalised):
            return os.path.realpath(normalised)
    except (OSError, ValueError):  # unreadable, or a name the OS cannot represent: compare the text
        pass
    return normalised


def shown_path(path: str) -> str:
    r"""``path`` as text any UTF-8 stream can write (a log line, a span attribute): a byte of the file name that is
    not UTF-8 (kept by ``surrogateescape``) as ``\xNN``.

    Example:
        >>> shown_path("/adapters/caf\udce9")
        '/adapters/caf\\xe9'
    """
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def path_text_problem(path: str) -> str | None:
    """Why the operating system cannot take ``path`` as a file name, or ``None`` when it can.

    Refused: an embedded NUL character, and text that cannot be encoded as a file name (a lone surrogate
    that is not an undecodable byte kept by ``surrogateescape``).
    """
    position = path.find("\0")
    if position >= 0:
        return f"holds a NUL character at position {position}"
    try:
        os.fsencode(path)
    except UnicodeEncodeError as error:
        return f"holds {path[error.start]!r} at position {error.start}, which cannot be encoded as a file name"
    return None


def directory_problem(directory: Path) -> str | None:
    """Why files cannot be written into ``directory`` (creating it where missing), or ``None`` when they can.

    Nothing is created: the directory, or its nearest existing ancestor, is checked for being a directory
    that this process may write into.

    Args:
        directory: The directory, with ``~`` already expanded.

    Returns:
        A clause that completes "directory X ..." (``"is a file"``...), or ``None``.
    """
    problem = path_text_problem(str(directory))
    if problem is not None:
        return problem
    try:
        if directory.exists():
            if not directory.is_dir():
                return "exists but is not a directory"
            if not os.access(directory, os.W_OK | os.X_OK):
                return "is not writable by this process"
            return None
        ancestor = directory.absolute().parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
    except OSError as error:  # e.g. a parent this process may not search
        return f"cannot be checked ({error.strerror or error})"
    if not ancestor.is_dir():
        return f"cannot be created: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be created: {ancestor} is not writable by this process"
    return None
