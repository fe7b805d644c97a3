"""What a server refuses with a 400, refused before sending; its context size, learned from its answers.

vLLM refuses a temperature outside [0, 2], a seed beyond a signed 64-bit integer, and a ``max_tokens`` above its
``max_model_len`` (``max_tokens=4096 cannot be greater than max_model_len=512``). :class:`ServerLimits` checks the
first two before a request is sent, and keeps ``max_tokens`` within a replica's context once it is known: from
``/tokenize`` (scoring) or from the first refusal, after which a default ``max_tokens`` is sent again without it.
"""

from __future__ import annotations

import re
from typing import Any

from inference._core.validation import GenerationRequest
from inference._servers.replicas import Replica
from inference.exceptions import InvalidRequestError, ServerResponseError
from inference.options import GenerationOptions

__all__ = ["DEFAULT_MAX_TOKENS", "ServerLimits"]

DEFAULT_MAX_TOKENS: int = GenerationOptions().max_tokens
"""``generate``'s default ``max_tokens``; left at it, the server's context decides."""

_MAX_TOKENS_REFUSED = re.compile(r"cannot be greater than max_model_len=(\d+)")
"""vLLM's 400 for a ``max_tokens`` beyond its context: ``max_tokens=4096 cannot be greater than max_model_len=512``."""


class ServerLimits:
    """The limits of one kind of server, applied to each request before it is sent.

    Args:
        provider: The provider name, carried by errors.
        server: The server's name in messages (``"vLLM"``).
        max_temperature: The largest temperature the server takes.
    """

    def __init__(self, *, provider: str, server: str, max_temperature: float) -> None:
        self._provider = provider
        self._server = server
        self.max_temperature = max_temperature

    def check(self, request: GenerationRequest) -> None:
        """Refuse what the server refuses with a 400: a temperature above the largest, a seed beyond int64."""
        if request.temperature is not None and request.temperature > self.max_temperature:
            raise InvalidRequestError(
                f"temperature must be in [0, {self.max_temperature:g}] on {self._server}, got {request.temperature:g}",
                provider=self._provider,
            )
        if request.seed is not None and not -(2**63) <= request.seed < 2**63:
            raise InvalidRequestError(
                f"seed must fit in a signed 64-bit integer on {self._server}, got {request.seed}",
                provider=self._provider,
            )

    def fit(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> None:
        """Keep ``max_tokens`` within the replica's context, once it is known (``replica.max_model_len``).

        vLLM refuses a ``max_tokens`` above its ``max_model_len`` with a 400. Left at its default (4096; the same
        value given explicitly counts as the default), ``max_tokens`` is not sent, and vLLM generates up to the
        end of its context; asked for explicitly, it is an :class:`InvalidRequestError` naming the limit.
        """
        limit = replica.max_model_len
        if limit is None or request.max_tokens <= limit:
            return
        if request.max_tokens == DEFAULT_MAX_TOKENS:
            arguments.pop("max_tokens", None)
            return
        raise InvalidRequestError(
            f"max_tokens={request.max_tokens} is more than {replica.http.where}'s context of {limit} tokens "
            f"(its max_model_len): ask for at most {limit}",
            provider=self._provider,
        )

    def learned(self, replica: Replica, error: ServerResponseError) -> bool:
        """Whether ``error`` is the server refusing ``max_tokens`` for its context; if so, the replica now knows its
        ``max_model_len`` (send the request again after :meth:`fit`)."""
        refused = _MAX_TOKENS_REFUSED.search(str(error)) if error.status_code == 400 else None
        if refused is None:
            return False
        replica.max_model_len = int(refused.group(1))
        return True
