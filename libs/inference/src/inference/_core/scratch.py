"""The private directories written for :class:`~inference.AdapterWeights`: named for the process that owns them.

A provider removes such a directory when its adapter is unloaded or replaced, when it closes, and at exit at the
latest; a process killed with SIGKILL (or by the out-of-memory killer) removes nothing. So each directory's name
says whose it is, ``inference-adapter-<host>-<pid>-<random>``, and the first write of each provider removes the
directories whose process is gone: same host (a digest of its name and pid namespace, since a shared directory
may be seen by other machines and containers), a pid that no process has. A pid that is alive again (reused) keeps
its directory: a leftover is better than removing another process's adapter.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import stat
import tempfile

__all__ = ["owned_prefix", "sweep_abandoned"]

_PREFIX = "inference-adapter-"
_OWNED = re.compile(rf"^{_PREFIX}(?P<host>[0-9a-f]{{8}})-(?P<pid>[0-9]+)-")


def owned_prefix() -> str:
    """The name prefix of a new directory of this process: ``inference-adapter-<host>-<pid>-``."""
    return f"{_PREFIX}{_host_tag()}-{os.getpid()}-"


def sweep_abandoned(parent: str | None) -> list[str]:
    """Remove the directories in ``parent`` (``None``: the system's temporary directory) that a process of this
    host left behind when it died; returns their paths. Never raises: what cannot be read or removed stays."""
    if os.name != "posix":  # os.kill(pid, 0) is no liveness check elsewhere (on Windows it terminates)
        return []
    parent = parent if parent is not None else tempfile.gettempdir()
    host, removed = _host_tag(), []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    for entry in entries:
        match = _OWNED.match(entry.name)
        if match is None or match["host"] != host or int(match["pid"]) == os.getpid():
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or _alive(int(match["pid"])):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # another user's process, or a pid this system cannot name: leave its directory alone
    return True


def _host_tag() -> str:
    """A digest of the host name and, on Linux, the pid namespace: a pid means something only within both
    (containers that share a host name and a volume do not share their pids)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()}\0{namespace}".encode("utf-8", "replace")).hexdigest()[:8]
