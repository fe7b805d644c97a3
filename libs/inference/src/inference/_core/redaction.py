"""What may be shown of a URL or an API key: credentials are hidden wherever a URL is printed, logged or raised.

A base URL can carry credentials (``http://user:KEY@host/v1``, ``...?api_key=KEY``); :func:`redact_url` is the one
function every ``repr``, error message, log line and ``inference providers`` line passes a URL through, and
:func:`redact_written_url` the one a message about a URL that does not parse passes it through.
:func:`secret_problem` says why a key cannot be sent in a header, without quoting it. This module imports nothing
of the SDK, so the error tree can use it.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

__all__ = [
    "HIDDEN",
    "hide_credentials_in_logs",
    "redact_url",
    "redact_written_url",
    "secret_problem",
    "sensitive_parameter",
]

HIDDEN = "***"
"""What stands in for a hidden credential."""

_USERINFO = re.compile(
    r"(?P<lead>://)(?P<userinfo>(?:[^/?#'\"]|['\"](?![\s,]|$))*@)|(?P<start>^|(?<=[\s,'\"(]))[^/?#\s,'\"]*@"
)
"""The ``user:password@`` of a URL: after its scheme, as :func:`urllib.parse.urlsplit` reads it (up to the last
``@`` before the path, query or fragment; whatever it holds, whitespace and quotes too, but for a quote that closes
a quoted URL in a text: one followed by a blank, a comma or the end), or at the start of a URL written without one."""

_NEXT_URL = re.compile(r"(,\s*)(?=[A-Za-z][A-Za-z0-9+.\-]*://)")
"""Where the next URL of a comma-separated list written with schemes starts (the comma and blanks before it)."""

_PARAMETER = re.compile(r"(?P<lead>[?&;#])(?P<name>[^=&;#\s,'\"]+)=(?P<value>[^&;#\s,'\"]*)")
"""A ``name=value`` of a query (or of a fragment, where OAuth puts ``access_token``)."""

_SENSITIVE = re.compile(r"key|token|secret|passw|pwd|auth|sig|credential|session|cookie|jwt", re.IGNORECASE)
"""Parameter names whose values are credentials (``api_key``, ``key``, ``access_token``, ``X-Amz-Signature``...)."""


def redact_url(url: str) -> str:
    """``url`` (or several, comma-separated) with its user information and credential parameters hidden.

    Example:
        >>> redact_url("http://user:sk-1@127.0.0.1:8100/v1?api_key=sk-2&model=m")
        'http://***@127.0.0.1:8100/v1?api_key=***&model=m'
    """
    if not isinstance(url, str):
        return url
    hidden = _USERINFO.sub(lambda match: f"{match['lead'] or ''}{HIDDEN}@", url)
    return _PARAMETER.sub(_hide_parameter, hidden)


def redact_written_url(url: str) -> str:
    """``url`` as it was written, a URL that may not parse (the reason it is shown), with its credentials hidden.

    A password may hold an unencoded ``#``, ``/``, ``?`` or ``,`` (the reason the URL is refused), so what a parser
    would take for its path or for the next URL of a list cannot show where it ends: everything between ``://`` and
    the last ``@`` before the next ``scheme://`` is hidden (from the start, where there is no scheme), then the
    credential parameters. Error messages about a URL as given show it through this function.

    Example:
        >>> redact_written_url("http://admin:pa#ss,wo/rd@gpu:8100/v1")
        'http://***@gpu:8100/v1'
    """
    if not isinstance(url, str):
        return url
    pieces = _NEXT_URL.split(url)  # the URLs, with the separators between them at odd positions
    for index in range(0, len(pieces), 2):
        piece = pieces[index]
        at = piece.rfind("@")
        if at >= 0:
            scheme_end = piece.find("://")
            start = scheme_end + 3 if 0 <= scheme_end < at else 0
            pieces[index] = f"{piece[:start]}{HIDDEN}{piece[at:]}"
    return _PARAMETER.sub(_hide_parameter, "".join(pieces))


class _HiddenURLCredentials(logging.Filter):
    """Hides the credentials of the URLs in another library's log records (httpx's ``HTTP Request: POST
    http://user:KEY@...``), as the SDK's own records hide them: a service logging at ``INFO`` must not log a key."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(arg if isinstance(arg, (int, float)) else redact_url(str(arg)) for arg in record.args)
        return True


def hide_credentials_in_logs(logger: str) -> None:
    """Hide URL credentials in the records of the logger named ``logger`` (its arguments), from now on; once."""
    target = logging.getLogger(logger)
    if not any(isinstance(existing, _HiddenURLCredentials) for existing in target.filters):
        target.addFilter(_HiddenURLCredentials())


def sensitive_parameter(name: str) -> bool:
    """True when a URL parameter of this name holds a credential (``api_key``, ``access_token``...)."""
    return _SENSITIVE.search(unquote(name)) is not None


def _hide_parameter(match: re.Match[str]) -> str:
    name = match["name"]
    if not match["value"] or not sensitive_parameter(name):
        return match.group(0)
    return f"{match['lead']}{name}={HIDDEN}"


def secret_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as an API key in an HTTP header, in words that never quote it; else ``None``.

    A key must have no whitespace at its ends (a key read from a file keeps its newline), no control characters and
    no characters outside ASCII (HTTP header values are ASCII).

    Example:
        >>> secret_problem("sk-abc\\n")
        'it ends with a newline (a key read from a file keeps its trailing newline: strip it)'
    """
    if value != value.rstrip():
        if value.endswith(("\n", "\r")):
            return "it ends with a newline (a key read from a file keeps its trailing newline: strip it)"
        return "it ends with whitespace (strip it)"
    if value != value.lstrip():
        return "it starts with whitespace (strip it)"
    for position, char in enumerate(value):
        if ord(char) < 32 or ord(char) == 127:
            return f"it holds a control character (U+{ord(char):04X}) at position {position}"
        if ord(char) > 126:
            return f"it holds a character outside ASCII at position {position} (HTTP headers are ASCII)"
    return None
