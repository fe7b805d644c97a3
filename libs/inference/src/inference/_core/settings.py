"""What a provider setting is: its key, environment variable, default, and the rule its values follow.

:class:`Setting` is the unit of the settings table; the providers' entries in :mod:`inference.registry`
list theirs, and :mod:`inference.config` resolves them. This module imports nothing of the SDK but the
error tree and the path and Hub-id helpers, so both can import it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from inference._core.hub import HUB_GGUF
from inference._core.paths import HUB_ID, directory_problem, expand_path, path_text_problem
from inference._core.redaction import redact_url, redact_written_url, secret_problem
from inference.exceptions import ConfigurationError

__all__ = ["Setting", "SettingKind", "refuse_two_credentials", "validate_base_url"]


def _url_count(url: object) -> int:
    """How many URLs ``url`` names: the non-blank items of a comma-separated string, or of a list."""
    if isinstance(url, str):
        return sum(1 for item in url.split(",") if item.strip())
    return len(url) if isinstance(url, (list, tuple)) else 1


def _replicas(items: list[Any] | tuple[Any, ...], *, source: str) -> str:
    """Several base URLs, each checked, joined by commas; one named twice is refused (a slip that would send it
    twice its share of the requests)."""
    urls = [validate_base_url(item, source=source) for item in items]
    keys = [_server_key(url) for url in urls]
    twice = next((url for index, url in enumerate(urls) if keys[index] in keys[:index]), None)
    if twice is not None:
        raise ConfigurationError(
            f"{source} names the replica {redact_url(twice)!r} twice: give each server's base URL once",
            url=redact_url(twice),
        )
    return ",".join(urls)


def _server_key(url: str) -> tuple[str, str, int | None, str]:
    """What names one server in a checked base URL: scheme and host in any case, the port (a scheme's default port
    written out or not) and the path without a trailing slash (``HTTP://A:80/v1/`` is ``http://a/v1``)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port, parts.path.rstrip("/")


def validate_base_url(url: str, *, source: str, several: bool = True) -> str:
    """Return ``url`` without surrounding blanks and trailing slash if it is an http(s) URL with a host, else raise.

    A comma-separated list of URLs (replicas) is checked item by item and returned joined by commas, where
    ``several`` (a provider that spreads requests over replicas). Messages show the value as it was written, with
    its credentials hidden (:func:`~inference._core.redaction.redact_written_url`), never one item of it: a comma
    in a password cuts the URL in two there.

    Raises:
        ConfigurationError: A URL has no ``http://``/``https://`` scheme or no host, a port that is not a
            number, whitespace, or text that cannot be encoded as UTF-8; or there are several and not ``several``.
    """
    if not several and _url_count(url) > 1:  # a stray comma ("http://a, ") is still one URL
        hidden = redact_written_url(url if isinstance(url, str) else ",".join(map(str, url)))
        raise ConfigurationError(
            f"{source} {hidden!r} holds several URLs, but this provider talks to one server "
            "(it has no replicas): give one base URL",
            url=hidden,
        )
    if not isinstance(url, str):
        if isinstance(url, (list, tuple)) and url:
            return _replicas(url, source=source)
        raise ConfigurationError(f"{source} must be a URL string or a list of URLs, got {redact_url(repr(url))}")
    hidden = redact_written_url(url.strip())  # the URL as messages show it: credentials hidden
    items = [item.strip() for item in url.split(",") if item.strip()] if "," in url else [url.strip()]
    if not items:
        raise ConfigurationError(
            f"{source} {hidden!r} holds no URL: give one base URL, or several separated by commas", url=hidden
        )
    for position, item in enumerate(items, start=1):
        problem = _base_url_problem(item)
        if problem is None:
            continue
        if len(items) > 1:
            problem = f"URL {position} of its {len(items)} (separated by commas): {problem}"
        if "@" in url and not _has_user_information(item):  # cut short where a password was meant to go on
            problem += " (a ',', '/', '?' or '#' in a user name or password is written %2C, %2F, %3F or %23)"
        raise ConfigurationError(
            f"{source} {hidden!r} is not a valid base URL: {problem}; write it like 'http://localhost:8100/v1'",
            url=hidden,
        )
    return _replicas(items, source=source) if len(items) > 1 else items[0].rstrip("/")


def _has_user_information(url: str) -> bool:
    try:
        return urlsplit(url).username is not None
    except ValueError:
        return False


def _base_url_problem(url: str) -> str | None:
    """Why ``url`` (one, stripped) is not an http(s) base URL any HTTP client can send to; ``None`` if it is one."""
    try:
        parts = urlsplit(url)
    except ValueError as error:  # e.g. "Invalid IPv6 URL" for 'http://[::1/v1'
        return f"it cannot be read as a URL ({error})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "it needs an http:// or https:// scheme and a host"
    problem = _url_problem(url)
    if problem is not None:
        return problem
    try:
        port = parts.port  # raises ValueError for a port that is not a number in [0, 65535]
    except ValueError:
        return "its port is not a number from 1 to 65535"
    if port == 0:
        return "port 0 is outside 1-65535"
    if not _host_is_valid(parts.hostname):
        return f"{parts.hostname!r} is not a host name or address"
    return None


def refuse_two_credentials(base_url: str, authorization: str | None, *, env_prefix: str) -> None:
    """Refuse a base URL with ``user:password@`` beside an API key: both are the ``Authorization`` header, and the
    URL's wins (sent as Basic auth), so the key would silently not be sent.

    Raises:
        ConfigurationError: ``authorization`` is set and a URL of ``base_url`` (comma-separated) has user information.
    """
    if authorization and any(urlsplit(url.strip()).username is not None for url in base_url.split(",")):
        raise ConfigurationError(
            f"the base URL {redact_url(base_url)!r} (base_url or {env_prefix}_BASE_URL) holds user:password@ and "
            f"an API key is set too (api_key or {env_prefix}_API_KEY): both would be the Authorization header, and "
            "the URL's would replace the key. Give the credentials one way: the API key, or the URL's user:password@",
            url=redact_url(base_url),
        )


_HOST = re.compile(r"[A-Za-z0-9._~\-:]+")
"""A host as sent (IDNA-encoded): a name, an IPv4 address or an IPv6 one (without its brackets)."""


def _host_is_valid(host: str | None) -> bool:
    if not host:
        return False
    try:
        ascii_host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        return False
    return _HOST.fullmatch(ascii_host) is not None


def _url_problem(url: str) -> str | None:
    """Why no HTTP client can send to ``url`` (whitespace, control characters, text that is not UTF-8)."""
    blank = next((index for index, char in enumerate(url) if char.isspace()), None)
    if blank is not None:
        return f"it holds whitespace at position {blank}"
    control = next((index for index, char in enumerate(url) if ord(char) < 32 or ord(char) == 127), None)
    if control is not None:
        return f"it holds the control character {url[control]!r} at position {control}"
    try:
        url.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"it holds {url[error.start]!r} at position {error.start}, which cannot be encoded as UTF-8"
    return None


SettingKind = Literal[
    "str", "secret", "int", "float", "bool", "url", "urls", "path", "directory", "shared-directory", "json"
]
"""What a setting's values are: text, a secret (an API key: checked to be sendable in a header, never shown), an
integer, a finite number, a switch (``true``/``false``), a base URL, base URLs (one, or several: replicas), a file
path, a directory that files are written into (checked to be creatable and writable, nothing created), a directory
shared with a server at the same path (checked to exist and be writable: this process cannot create it where the
server would see it), or a JSON object (a mapping, or its JSON text; kept as canonical JSON text, sorted keys, so
that equal settings make one cached provider)."""

_ENV_FILE = "env-file:"
"""How an origin names a ``.env`` file: ``env-file:/srv/app/.env`` (see :mod:`inference._core.env_file`)."""

_BOOLEANS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
"""How the text of a ``bool`` setting reads (stripped, lower-cased)."""

_KIND_RULES: dict[SettingKind, str] = {
    "bool": "true or false",
    "url": "an http(s) base URL",
    "urls": "an http(s) base URL, or several separated by commas",
    "path": "a file path",
    "directory": "a directory this process can create or write into",
    "shared-directory": "an existing directory this process can write into",
    "secret": "printable ASCII without whitespace at its ends",
    "json": "a JSON object, such as {\"enforce_eager\": true}",
}
"""The values a setting of each kind takes, as words, for the kinds whose rule has no bounds or choices."""


def _absolute(path: Path, *, hub_id: bool) -> Path:
    """``path`` made absolute from the current directory, so that a provider keeps naming the same file after a
    ``chdir`` and its cache key tells two directories' ``model.gguf`` apart; with ``hub_id``, a Hugging Face Hub id
    (``ORG/NAME``, ``ORG/NAME:FILE.gguf``) that names no local path is kept as it is."""
    if path.is_absolute():
        return path
    try:
        if hub_id and (HUB_ID.fullmatch(str(path)) or HUB_GGUF.fullmatch(str(path))) and not path.exists():
            return path
        return Path(os.path.abspath(path))
    except OSError:  # the current directory was removed: the path stays as written, and is found missing on use
        return path


@dataclass(frozen=True)
class Setting:
    """One configurable value of a provider, and the rule its values follow.

    The rule is checked wherever the value comes from (constructor argument, step-config key, environment
    variable), when the provider is built, so a bad value fails at once with a sentence naming the argument
    or the variable instead of failing each request later.

    Attributes:
        key: The constructor argument and step-config key.
        env_var: The environment variable that sets it.
        default: The value when neither an argument nor the variable gives one.
        kind: What the values are (:data:`SettingKind`). Numbers are never booleans; ``float`` values are
            finite; ``path`` and directory values have ``~`` expanded and are made absolute from the current
            directory (a ``path`` that is a Hugging Face Hub id naming no local path stays as it is).
        description: What it means, for ``.env.example`` and the docs.
        minimum: The smallest number allowed, if any.
        maximum: The largest number allowed, if any.
        exclusive_minimum: ``minimum`` itself is not allowed (a timeout must be above 0).
        none_means: When set, ``None`` (or an empty or blank string) is a valid value meaning this ("no limit").
        choices: The allowed texts, compared stripped and lower-cased (the value is returned that way).
        pattern: A regular expression the whole text must match, stripped and lower-cased.
        hint: How the allowed texts read in messages, where ``pattern`` alone would not say it.
    """

    key: str
    env_var: str
    default: Any
    kind: SettingKind
    description: str
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    none_means: str | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    hint: str = ""

    @property
    def rule(self) -> str:
        """The values allowed, as words: ``"a finite number above 0"``, ``"an integer of at least 1"``..."""
        if self.kind in ("int", "float"):
            noun = "an integer" if self.kind == "int" else "a finite number"
            if self.kind == "int" and self.maximum is None and self.minimum in (0, 1) and not self.exclusive_minimum:
                noun = "a positive integer" if self.minimum == 1 else "a non-negative integer"
            elif self.minimum is not None and self.maximum is not None:
                bound = "(" if self.exclusive_minimum else "["
                noun += f" in {bound}{self.minimum:g}, {self.maximum:g}]"
            elif self.minimum is not None:
                noun += f" above {self.minimum:g}" if self.exclusive_minimum else f" of at least {self.minimum:g}"
            elif self.maximum is not None:
                noun += f" of at most {self.maximum:g}"
        elif self.kind in _KIND_RULES:
            noun = _KIND_RULES[self.kind]
        elif self.choices:
            noun = "one of " + ", ".join(repr(choice) for choice in self.choices)
        else:
            noun = self.hint or "a string"
        if self.none_means is not None:
            noun += f", or empty for {self.none_means}"
        return noun

    def parse(self, text: str) -> Any:
        """Turn an environment variable's text into a checked value of this setting.

        Raises:
            ConfigurationError: The text is not a valid value; the message names the variable.
        """
        return self.check(text, origin="environment")

    def check(self, value: Any, *, origin: str = "argument", provider: str | None = None) -> Any:
        """Return ``value`` in its canonical form if it follows the rule, else raise.

        A string given for a number or a switch is parsed as the environment variable's text would be
        (``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off`` for a switch), so step configs read from
        text files work. Numbers of ``float`` settings are returned as ``float``; texts with
        ``choices`` or a ``pattern`` stripped and lower-cased; paths with ``~`` expanded, absolute; ``""`` as ``None``
        where ``None`` is allowed.

        Args:
            value: The value to check.
            origin: Where it came from, for the message: ``"argument"`` (constructor argument or step-config
                key), ``"environment"`` (the variable's text), ``"env-file:PATH"`` (the variable's line in a
                ``.env`` file) or ``"default"``.
            provider: The provider type, carried by the error.

        Raises:
            ConfigurationError: The value breaks the rule; the sentence names the argument or the variable,
                the rule, and what to do.
        """
        if self.none_means is not None and (value is None or (isinstance(value, str) and not value.strip())):
            return None
        if self.kind in ("url", "urls"):
            return validate_base_url(value, source=self._source(origin), several=self.kind == "urls")
        if self.kind == "secret":
            return self._secret(value, origin, provider)
        if self.kind in ("int", "float"):
            return self._number(value, origin, provider)
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in _BOOLEANS:
                return _BOOLEANS[value.strip().lower()]
            raise self._invalid(value, origin, provider)
        if self.kind in ("path", "directory", "shared-directory"):
            return self._path(value, origin, provider)
        if self.kind == "json":
            return self._json(value, origin, provider)
        if not isinstance(value, str):
            raise self._invalid(value, origin, provider)
        if not self.choices and self.pattern is None:
            return value
        text = value.strip().lower()
        allowed = text in self.choices if self.choices else re.fullmatch(self.pattern or "", text) is not None
        if not allowed:
            raise self._invalid(value, origin, provider)
        return text

    def _source(self, origin: str) -> str:
        """Where a value came from, as messages name it."""
        if origin.startswith(_ENV_FILE):
            return f"{self.env_var} in the .env file {origin[len(_ENV_FILE):]}"
        return f"environment variable {self.env_var}" if origin == "environment" else f"argument {self.key}"

    def _number(self, value: Any, origin: str, provider: str | None) -> int | float:
        number: Any = value
        if isinstance(value, str):
            try:
                number = int(value.strip()) if self.kind == "int" else float(value.strip())
            except ValueError:
                raise self._invalid(value, origin, provider) from None
        wanted = (int,) if self.kind == "int" else (int, float)
        if isinstance(number, bool) or not isinstance(number, wanted):
            raise self._invalid(value, origin, provider)
        if self.kind == "float" and not math.isfinite(number):
            raise self._invalid(value, origin, provider)
        too_low = self.minimum is not None and (
            number <= self.minimum if self.exclusive_minimum else number < self.minimum
        )
        if too_low or (self.maximum is not None and number > self.maximum):
            raise self._invalid(value, origin, provider)
        return float(number) if self.kind == "float" else int(number)

    def _secret(self, value: Any, origin: str, provider: str | None) -> str:
        """A key that can be sent in a header as it is; the message about a bad one never quotes it."""
        problem = secret_problem(value) if isinstance(value, str) else f"it is a {type(value).__name__}, not text"
        if problem is None:
            return str(value)
        where = self._source(origin)
        owner = f"the {provider} " if provider else "the "
        raise ConfigurationError(
            f"{where} cannot be sent as {owner}API key: {problem}. Fix the key where it is set (its value is not "
            "shown here)",
            provider=provider,
        )

    def _json(self, value: Any, origin: str, provider: str | None) -> str:
        """A mapping, or the JSON text of an object, as canonical JSON text."""
        try:
            loaded = json.loads(value) if isinstance(value, str) else value
            if isinstance(loaded, Mapping) and all(isinstance(key, str) for key in loaded):
                return json.dumps(dict(loaded), sort_keys=True, allow_nan=False)
        except (ValueError, TypeError):  # not JSON, or a value JSON cannot hold
            pass
        raise self._invalid(value, origin, provider)

    def _path(self, value: Any, origin: str, provider: str | None) -> str:
        text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
        if not isinstance(text, str):
            raise self._invalid(value, origin, provider)
        if not text:  # allowed only where the default is "" ("not set"); an optional path became None above
            if self.default != "":
                raise self._invalid(value, origin, provider)
            return text
        problem = path_text_problem(text)
        if problem is not None:
            raise self._invalid(value, origin, provider, reason=f"the path {problem}")
        expanded = _absolute(expand_path(text), hub_id=self.kind == "path")
        if self.kind in ("directory", "shared-directory"):
            problem = directory_problem(expanded)
            if problem is None and self.kind == "shared-directory" and not expanded.is_dir():
                problem = "does not exist (it is shared with the servers: mount or create it there first)"
            if problem is not None:
                raise self._invalid(value, origin, provider, reason=f"directory {expanded} {problem}", path=expanded)
        return str(expanded)

    def _invalid(
        self,
        value: Any,
        origin: str,
        provider: str | None,
        *,
        reason: str | None = None,
        path: Path | None = None,
    ) -> ConfigurationError:
        why = reason or f"{self.key} must be {self.rule}"
        if not isinstance(value, (str, int, float, os.PathLike)) and self.kind != "json":  # a list, a dict...
            why = f"settings take plain values (strings, numbers), not a {type(value).__name__}: {why}"
        if isinstance(self.default, bool):
            default = str(self.default).lower()
        else:
            default = repr(self.default) if self.default not in (None, "") else self.none_means or "none"
        owner = f"{provider} " if provider else ""
        if origin.startswith(_ENV_FILE):
            message = (
                f"{self.env_var}={value!r} in the .env file {origin[len(_ENV_FILE):]} is not valid for the "
                f"{owner}setting {self.key}: {why}; correct it there, or remove the line to use the default ({default})"
            )
        elif origin == "environment":
            message = (
                f"environment variable {self.env_var}={value!r} is not valid for the {owner}setting {self.key}: "
                f"{why}; set it to a valid value, or unset it to use the default ({default})"
            )
        else:
            message = (
                f"{owner}setting {self.key}={value!r} (argument or step-config key) is not valid: {why}; pass a "
                f"valid value, or leave it out to use {self.env_var} or the default ({default})"
            )
        return ConfigurationError(message, provider=provider, path=None if path is None else str(path))
