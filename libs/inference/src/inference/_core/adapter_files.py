"""What an adapter's files looked like when it was loaded, to tell files changed in place since.

An adapter keeps the weights it was loaded with until it is replaced: the registry notes the state of its files at
load, and refuses to load files that differ under the same id (see :mod:`inference._core.lifecycle`).

The state of a file is its size, modification time, inode (and device) and status change time. Size and
modification time alone miss a copy that keeps the time (``cp -p``, ``rsync -t``, a filesystem with 1 s times) or a
symbolic link moved to another directory whose files have the same sizes and times; a write in place changes the
status change time, which no call can set back, and a file renamed into place is another inode. A ``chmod`` or a
new hard link changes the status change time too: such files count as changed (refused, never served wrongly).
"""

from __future__ import annotations

import os

from inference.adapters.peft import CONFIG_NAME, WEIGHT_NAMES
from inference.adapters.source import AdapterSource

__all__ = ["FilesState", "files_changed", "files_state", "source_files_state"]

FilesState = tuple[tuple[str, int, int, int, int, int], ...] | None
"""The adapter files at a path: (name, size, modification time in ns, status change time in ns, device, inode) each;
``None`` where none can be read here."""


def files_state(path: str) -> FilesState:
    """What the adapter files at ``path`` look like now: a PEFT directory's config and weights, or a file.

    ``None`` for a path this machine cannot read (one on a server, a Hub id, weights kept in memory). Other files
    in the directory (a GGUF converted beside them) do not count.
    """
    try:
        if os.path.isdir(path):
            candidates = [os.path.join(path, name) for name in (CONFIG_NAME, *WEIGHT_NAMES)]
        elif os.path.isfile(path):
            candidates = [path]
        else:
            return None
        state = []
        for candidate in candidates:
            try:
                info = os.stat(candidate)
            except FileNotFoundError:
                continue
            state.append(
                (
                    os.path.basename(candidate),
                    info.st_size,
                    info.st_mtime_ns,
                    info.st_ctime_ns,
                    info.st_dev,
                    info.st_ino,
                )
            )
    except (OSError, ValueError):
        return None
    return tuple(state)


def source_files_state(source: AdapterSource) -> FilesState:
    """The state of a source's files (``None`` for weights kept in memory, which have none)."""
    return None if source.weights is not None else files_state(source.path)


def files_changed(path: str, noted: FilesState) -> bool:
    """True when the files at ``path`` were ``noted`` at load and are not what they were then."""
    return noted is not None and files_state(path) != noted
