"""The cache of PEFT adapters converted to GGUF: bounded in bytes, least recently used entries removed first.

An entry is one converted file, ``<adapter directory name>-<24 hex>.gguf``, directly in the cache directory; beside it
``<entry>.used``, an empty file whose modification time is the entry's last use. The entry's own times are never
touched: reload mode (``LlamaCppProvider(hot_swap=False)``) reads a loaded adapter's file again at each switch and
refuses one whose times changed.

After each conversion the cache is pruned to :data:`ADAPTER_CACHE_MAX_BYTES` (``INFERENCE_ADAPTER_CACHE_MAX_BYTES``),
oldest use first. Kept, even past the bound: the entry just converted, and every entry in use, that is pinned
(:func:`pin_entry`) by a loaded adapter. A pin holds a shared ``flock`` on the file, so a prune in another process
sharing the cache keeps it too; a prune takes the exclusive lock before it removes a file. Entries are renamed into
place whole (see :mod:`inference.adapters.gguf`), so a reader never sees half a file, and a file another process
removed meanwhile is skipped, never an error.

llama.cpp reads a LoRA file whole when it loads it (``llama_adapter_lora_init``: the header, then each tensor into
its own buffer, the file closed after), so a loaded adapter does not need its file in hot-swap mode; the pin keeps
the file for reload mode, which reads it again, and for a reload after eviction, which would convert it again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference._core.paths import expand_path
from inference._core.settings import Setting

try:
    import fcntl
except ImportError:  # Windows: pins hold within this process only
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "ADAPTER_CACHE_MAX_BYTES",
    "CachePin",
    "ClearedCache",
    "clear_adapter_cache",
    "pin_entry",
    "prune",
    "touch",
]

logger = logging.getLogger("inference")

ADAPTER_CACHE_MAX_BYTES = Setting(
    "adapter_cache_max_bytes",
    "INFERENCE_ADAPTER_CACHE_MAX_BYTES",
    5 * 2**30,
    "int",
    "Bytes the cache of PEFT adapters converted to GGUF may hold (each adapter_cache_dir); least recently used "
    "entries are removed after a conversion, never one a loaded adapter uses",
    minimum=0,
)
"""The bound of each cache directory, in bytes. 5 GiB by default (ccache's default): about 30 adapters of rank 16
on every linear layer of an 8B Llama (160 MiB each in float32), 100 on its attention only (52 MiB), 150 of a 0.5B
Qwen2 (34 MiB); a tiny test adapter is 66 KiB."""

_ENTRY = re.compile(r"^[A-Za-z0-9_.-]*-[0-9a-f]{24}\.gguf$")
STAMP_SUFFIX = ".used"
_TEMPORARY = re.compile(r"^\.[A-Za-z0-9_.-]*-[0-9a-f]{24}\.gguf\.[A-Za-z0-9_]+\.tmp$")
"""An entry's temporary file while it is written (``tempfile.mkstemp`` beside it, renamed into place when whole)."""
TEMPORARY_LEFT_AFTER = 3600.0
"""Seconds after its last write that a temporary file counts as left by a conversion killed half-way (a conversion
writes its file within seconds to minutes; one still running elsewhere is never removed)."""

_last_use = 0  # the stamp time last written by this process, in nanoseconds
_pins_lock = threading.Lock()
_pins: dict[str, weakref.WeakSet[CachePin]] = {}  # entry path -> the live pins of this process


@dataclass(frozen=True)
class ClearedCache:
    """What :func:`clear_adapter_cache` did: entries removed (and their bytes), and entries kept because in use."""

    removed: int
    removed_bytes: int
    kept_in_use: int


class CachePin:
    """Keeps one cache entry from being pruned, in this process and (with ``flock``) in any other sharing the cache,
    until :meth:`release`, or until the pin is garbage collected (its owner gone)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key = os.path.abspath(path)
        self._fd: int | None = None
        self._closer: weakref.finalize[Any, Any] | None = None
        if fcntl is not None:
            self._fd = _locked_fd(path)
            if self._fd is not None:
                self._closer = weakref.finalize(self, os.close, self._fd)
        elif not path.is_file():
            raise FileNotFoundError(path)
        with _pins_lock:
            _pins.setdefault(self._key, weakref.WeakSet()).add(self)

    def release(self) -> None:
        """Let prunes remove the entry again (idempotent)."""
        with _pins_lock:
            live = _pins.get(self._key)
            if live is not None:
                live.discard(self)
                if not live:
                    del _pins[self._key]
        if self._closer is not None:
            self._closer()


def _locked_fd(path: Path) -> int | None:
    """A descriptor of ``path`` holding a shared lock on the file it names now; ``None`` when no descriptor is free
    (the pin then holds in this process only). Raises ``FileNotFoundError`` when the entry is gone (removed by a
    prune before the lock was granted)."""
    assert fcntl is not None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as error:
        if isinstance(error, FileNotFoundError):
            raise
        logger.debug("pinning %s in this process only: %s", path, error)
        if not path.is_file():
            raise FileNotFoundError(path) from error
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_ino != os.stat(path).st_ino:  # removed (and converted again) before the lock
            raise FileNotFoundError(path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def pin_entry(path: str | os.PathLike[str]) -> CachePin:
    """Pin the cache entry (or any file) at ``path``: see :class:`CachePin`.

    Raises:
        FileNotFoundError: No file is there (a prune removed it): convert again.
    """
    return CachePin(Path(path))


def touch(entry: Path) -> bool:
    """Record a use of ``entry`` (its ``.used`` stamp); ``False`` when the entry is gone.

    The stamp's time is set to the nanosecond, later than any this process set before: a file system's own clock
    ticks in milliseconds, and uses within one tick would tie.
    """
    global _last_use
    stamp = entry.with_name(entry.name + STAMP_SUFFIX)
    with _pins_lock:
        _last_use = now = max(time.time_ns(), _last_use + 1)
    try:
        if not stamp.exists():
            stamp.touch()
        os.utime(stamp, ns=(now, now))
    except OSError as error:  # a read-only cache: it is used without a record of its uses
        logger.debug("could not record the use of %s: %s", entry, error)
    return entry.is_file()


def _pinned_here(entry: Path) -> bool:
    with _pins_lock:
        return bool(_pins.get(os.path.abspath(entry)))


def _entries(directory: Path) -> list[tuple[int, int, Path]]:
    """``(last use, size, path)`` of each entry of ``directory``; entries another process removes meanwhile left
    out."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if not _ENTRY.match(name):
            continue
        entry = directory / name
        try:
            size = entry.stat().st_size
        except OSError:
            continue
        try:
            used = entry.with_name(name + STAMP_SUFFIX).stat().st_mtime_ns
        except OSError:
            try:
                used = entry.stat().st_mtime_ns
            except OSError:
                continue
        found.append((used, size, entry))
    return sorted(found, key=lambda item: (item[0], item[2].name))


def _remove(entry: Path, used: int) -> bool:
    """Remove ``entry`` and its stamp unless it is pinned (here or, with ``flock``, elsewhere) or was used since
    ``used``; whether it is gone."""
    if _pinned_here(entry):
        return False
    stamp = entry.with_name(entry.name + STAMP_SUFFIX)
    fd: int | None = None
    try:
        if fcntl is not None:
            fd = os.open(entry, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # pinned by another process (or another pin of this one)
            if os.fstat(fd).st_ino != os.stat(entry).st_ino:
                return False  # removed and written again meanwhile: a new entry, used now
        with contextlib.suppress(FileNotFoundError):
            if stamp.stat().st_mtime_ns != used:
                return False  # used meanwhile
        entry.unlink()
    except FileNotFoundError:
        return True  # another process removed it
    except OSError as error:
        logger.warning("could not remove the cached adapter %s: %s", entry, error)
        return False
    finally:
        if fd is not None:
            os.close(fd)
    with contextlib.suppress(OSError):
        stamp.unlink()
    return True


def prune(directory: str | os.PathLike[str], max_bytes: int, *, keep: Path | None = None) -> int:
    """Remove least recently used entries of ``directory`` until its entries hold at most ``max_bytes``; entries in
    use and ``keep`` stay, whatever the total. Returns how many bytes were freed."""
    entries = _entries(expand_path(directory))
    total = sum(size for _, size, _ in entries)
    freed = 0
    for used, size, entry in entries:
        if total <= max_bytes:
            break
        if keep is not None and entry.name == keep.name:
            continue
        if _remove(entry, used):
            total -= size
            freed += size
            logger.info("removed the cached adapter %s (%d bytes; the cache is bounded to %d bytes)", entry, size,
                        max_bytes)
    _remove_leftovers(expand_path(directory))
    return freed


def _remove_leftovers(directory: Path) -> None:
    """Remove the stamps whose entry is gone (removed by hand, or a stamp written as a prune removed its entry), and
    the temporary files of conversions killed half-way (not written for :data:`TEMPORARY_LEFT_AFTER` seconds)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            entry = name[: -len(STAMP_SUFFIX)]
            if name.endswith(STAMP_SUFFIX) and _ENTRY.match(entry) and not (directory / entry).exists():
                with contextlib.suppress(OSError):
                    (directory / name).unlink()
            elif _TEMPORARY.match(name):
                with contextlib.suppress(OSError):
                    if time.time() - (directory / name).stat().st_mtime > TEMPORARY_LEFT_AFTER:
                        (directory / name).unlink()


def clear_adapter_cache(directory: str | os.PathLike[str] | None = None) -> ClearedCache:
    """Remove every converted adapter of ``directory`` (default ``~/.cache/inference-adapters``) that no loaded
    adapter uses, in this process or another; other files there (the test models, the style adapter) stay.

    Example:
        >>> from inference.adapters.gguf import clear_adapter_cache
        >>> clear_adapter_cache()  # doctest: +SKIP
        ClearedCache(removed=12, removed_bytes=812160, kept_in_use=0)
    """
    folder = expand_path(directory if directory is not None else Path.home() / ".cache" / "inference-adapters")
    removed = removed_bytes = kept = 0
    for used, size, entry in _entries(folder):
        if _remove(entry, used):
            removed += 1
            removed_bytes += size
        else:
            kept += 1
    _remove_leftovers(folder)
    return ClearedCache(removed, removed_bytes, kept)
