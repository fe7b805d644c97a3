"""Settings from a ``.env`` file, below the process environment: :func:`settings_environment`.

Where a setting's value comes from, first found wins: an explicit argument, the step config, the process
environment, the ``.env`` file, the default. The file is ``./.env`` in the current directory when it exists, or the
file ``INFERENCE_ENV_FILE`` names (read from the process environment only; ``/dev/null`` reads none). It is parsed
by python-dotenv (``KEY=value``, ``export KEY=value``, quotes, ``#`` comments, ``${OTHER}`` expansion) and never
copied into ``os.environ``: it configures this SDK, not the rest of the process. A variable set to the empty text,
in either place, counts as not set.

The file is read again only when its size or modification time changes, so resolving settings for every
``get_provider`` call costs one ``stat``.
"""

from __future__ import annotations

import io
import os
import threading
from collections import ChainMap
from collections.abc import Iterator, Mapping
from pathlib import Path

from inference._core.paths import expand_path
from inference.exceptions import ConfigurationError

__all__ = ["ENV_FILE_VAR", "SettingsEnvironment", "env_file_path", "is_set", "settings_environment"]

ENV_FILE_VAR = "INFERENCE_ENV_FILE"
"""The process environment variable that names the ``.env`` file to read instead of ``./.env``."""

_cache: dict[str, tuple[tuple[int, ...], dict[str, str]]] = {}
_cache_lock = threading.Lock()


def is_set(text: str | None) -> bool:
    """Whether a variable's text sets its setting: an empty or blank one (``VLLM_API_KEY=" "``) counts as not set,
    in the process environment as in the ``.env`` file, as :meth:`~inference._core.settings.Setting.check` reads a
    blank value of a setting that may be empty as none."""
    return text is not None and text.strip() != ""


class SettingsEnvironment(Mapping[str, str]):
    """The process environment over the ``.env`` file's variables, and where each value comes from.

    A mapping like ``os.environ`` (what :func:`inference.config.resolve_settings` reads); :meth:`origin` says which
    layer gave a value, for messages ("environment variable X" or "X in /srv/app/.env").
    """

    def __init__(self, process: Mapping[str, str], file_values: Mapping[str, str], path: Path | None) -> None:
        self._process = process
        self._file = file_values
        self.path = path

    def __getitem__(self, key: str) -> str:
        value = self._process.get(key, "")
        if is_set(value):
            return value
        if key in self._file:
            return self._file[key]
        if key in self._process:
            return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield from self._process
        yield from (key for key in self._file if key not in self._process)

    def __len__(self) -> int:
        return len(set(self._process) | set(self._file))

    def origin(self, key: str) -> str:
        """``"environment"`` for a value of the process environment, ``"env-file:PATH"`` for one of the file."""
        if not is_set(self._process.get(key)) and key in self._file and self.path is not None:
            return f"env-file:{self.path}"
        return "environment"


def settings_environment(process: Mapping[str, str] | None = None) -> SettingsEnvironment:
    """The variables settings are read from: ``process`` (``os.environ``) over the ``.env`` file's.

    Raises:
        ConfigurationError: ``INFERENCE_ENV_FILE`` names no readable file, or the file is not UTF-8 text or holds
            a line that is not ``KEY=value`` (the message names the file and the line).
    """
    process = os.environ if process is None else process
    path = env_file_path(process)
    return SettingsEnvironment(process, {} if path is None else _expanded(_values(path), process), path)


def _expanded(raw: Mapping[str, str], process: Mapping[str, str]) -> dict[str, str]:
    """The file's values with ``${OTHER}`` (and ``${OTHER:-default}``) expanded as the settings are read: a variable
    of the process environment wins over the file's (an empty or blank one counts as not set), and a file's
    variable is seen by the lines below it."""
    from dotenv.variables import parse_variables

    values: dict[str, str] = {}
    for key, value in raw.items():
        seen = ChainMap({name: text for name, text in process.items() if is_set(text)}, values)
        values[key] = "".join(atom.resolve(seen) for atom in parse_variables(value))
    return values


def env_file_path(process: Mapping[str, str] | None = None) -> Path | None:
    """The ``.env`` file to read: the one ``INFERENCE_ENV_FILE`` names, else ``./.env`` where it exists, else none.

    Raises:
        ConfigurationError: ``INFERENCE_ENV_FILE`` names nothing, or a directory.
    """
    process = os.environ if process is None else process
    named = process.get(ENV_FILE_VAR, "")
    if named:
        path = expand_path(named)
        if not path.exists() or path.is_dir():
            what = "a directory" if path.is_dir() else "no file"
            raise ConfigurationError(
                f"environment variable {ENV_FILE_VAR}={named!r} names {what}: give the path of a .env file, or "
                "unset it to read ./.env (set it to /dev/null to read none)",
                path=str(path),
            )
        return path
    try:
        candidate = Path.cwd() / ".env"
    except OSError:  # the current directory was removed: there is no ./.env
        return None
    return candidate if candidate.is_file() else None


def _values(path: Path) -> dict[str, str]:
    """The file's variables (those with a value) as written, ``${OTHER}`` not expanded yet, parsed once per version
    of the file."""
    try:
        info = path.stat()
    except OSError as error:
        raise _unreadable(path, error) from None
    # A file put in its place (os.replace, a deploy, `cp -p` or `rsync -t` keeping size and time) is another inode,
    # and any write or rename changes the inode's ctime, which no tool sets back.
    stamp = (info.st_mtime_ns, info.st_size, info.st_ctime_ns, info.st_dev, info.st_ino)
    key = str(path)
    with _cache_lock:
        cached = _cache.get(key)
    if cached is not None and cached[0] == stamp and path.is_file():
        return cached[1]
    values = _parse(path)
    with _cache_lock:
        _cache[key] = (stamp, values)
    return values


def _parse(path: Path) -> dict[str, str]:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise _unreadable(path, error) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ConfigurationError(
            f"the .env file {path} is not UTF-8 text (byte {error.start}, line {line}): save it as UTF-8",
            path=str(path),
        ) from None
    from dotenv import dotenv_values
    from dotenv.parser import parse_stream

    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            raise ConfigurationError(
                f"the .env file {path} has a line that is not KEY=value at line {binding.original.line} (its text "
                "is not shown: it may hold a key): correct it, or start it with '#'",
                path=str(path),
            )
    values = dotenv_values(stream=io.StringIO(text), interpolate=False)  # expanded when read: _expanded
    return {key: value for key, value in values.items() if value is not None}


def _unreadable(path: Path, error: OSError) -> ConfigurationError:
    return ConfigurationError(
        f"the .env file {path} cannot be read ({error.strerror or error}): check its permissions, or set "
        f"{ENV_FILE_VAR} to another file",
        path=str(path),
    )
