"""The Ollama provider: generation through Ollama's native chat API, which honours every sampling option."""

from __future__ import annotations

import logging
from typing import Any

from inference._http import ServerAnswer, ServerClient, server_root
from inference._validation import GenerationRequest
from inference.config import resolve_settings
from inference.exceptions import InvalidRequestError, ServerModelNotFoundError, ServerResponseError
from inference.provider import GenerationResult, InferenceProvider

__all__ = ["OllamaProvider"]

logger = logging.getLogger("inference.ollama")


class OllamaProvider(InferenceProvider):
    """Generates through an Ollama server.

    Requests go to the native ``POST /api/chat`` route at the same host as ``base_url`` without ``/v1``:
    Ollama's OpenAI-compatible route drops ``repetition_penalty`` and ``top_k`` and forces
    ``temperature``/``top_p`` to 1.0 when they are omitted, while the native route honours every option.
    Only the options the caller sets are sent, so the model's own defaults apply to the rest.

    Ollama has no runtime adapter loading: ``load_adapter`` and ``unload_adapter`` raise
    :class:`~inference.exceptions.UnsupportedOperationError`, ``list_adapters`` returns ``[]``, and
    ``generate(adapter_id=...)`` logs a warning and uses the base model.

    Args:
        base_url: Ollama's base URL (the native API is at the same host without ``/v1``); else
            ``OLLAMA_BASE_URL``; else ``http://localhost:11434/v1``.
        timeout: Seconds to wait for one answer; else ``OLLAMA_TIMEOUT``; else 120.
        max_retries: Retries of connect errors and 429/502/503/504; else ``OLLAMA_MAX_RETRIES``; else 2.

    Example:
        >>> OllamaProvider(base_url="http://127.0.0.1:11434/v1")
        OllamaProvider(base_url='http://127.0.0.1:11434/v1')
    """

    name = "ollama"
    supports_adapters = False
    hot_swaps_adapters = False

    def __init__(
        self,
        base_url: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
    ) -> None:
        settings = resolve_settings("ollama", {"base_url": base_url, "timeout": timeout, "max_retries": max_retries})
        self.base_url: str = settings["base_url"]
        self._http = ServerClient(
            provider=self.name,
            server="Ollama",
            base_url=self.base_url,
            timeout=settings["timeout"],
            max_retries=settings["max_retries"],
            env_prefix="OLLAMA",
        )
        self.native_url = server_root(self.base_url)
        self._chat_url = f"{self.native_url}/api/chat"

    def __repr__(self) -> str:
        return f"OllamaProvider(base_url={self.base_url!r})"

    @property
    def timeout(self) -> float:
        """Seconds to wait for one answer."""
        return self._http.timeout

    @property
    def max_retries(self) -> int:
        """Retries of transient failures."""
        return self._http.max_retries

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        if not request.model:
            raise InvalidRequestError(
                "Ollama needs a model name: pass model= (e.g. 'llama3.2'; `ollama list` shows what is pulled)",
                provider=self.name,
            )
        if request.adapter_id is not None:
            logger.warning(
                "Ollama has no runtime adapters: ignoring adapter_id %r and generating with the base model %r",
                request.adapter_id,
                request.model,
            )
        operation = f"generate with model {request.model!r}"
        response = await self._http.request(
            "POST",
            self._chat_url,
            operation=operation,
            json_body=_chat_body(request),
            handlers={404: lambda answer: self._not_found(answer, request.model)},
        )
        body = self._http.parse_json(response, operation=operation)
        try:
            text = body["message"]["content"]
            if not isinstance(text, str):
                raise TypeError("message.content is not a string")
            prompt_tokens = int(body.get("prompt_eval_count") or 0)
            completion_tokens = int(body.get("eval_count") or 0)
            model = str(body.get("model") or request.model)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise self._http.protocol_error(
                operation, f"an answer that is not an Ollama chat reply ({error})"
            ) from error
        return GenerationResult(
            text=text,
            model=model,
            adapter_id=None,
            token_count=prompt_tokens + completion_tokens,
            finish_reason="length" if body.get("done_reason") == "length" else "stop",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    def _not_found(self, answer: ServerAnswer, model: str) -> ServerResponseError:
        if answer.route_missing:
            return answer.error(
                ServerResponseError,
                f"the server at {self.native_url} has no Ollama native API ({answer.response.request.url.path} "
                "answered 404 Not Found): it is another kind of server (an OpenAI-only server such as "
                "llama_cpp.server?); point OLLAMA_BASE_URL (or base_url) at Ollama, or use the vllm provider for "
                "OpenAI-compatible servers",
            )
        return answer.error(
            ServerModelNotFoundError,
            f"{answer.where} has no model {model!r} ({answer.message}): run `ollama pull {model}` on the server",
        )

    async def aclose(self) -> None:
        """Close the pooled connections. The provider makes new ones if it is used again."""
        await self._http.aclose()


def _chat_body(request: GenerationRequest) -> dict[str, Any]:
    """The native ``/api/chat`` body: only the options the caller set, so the model's defaults apply."""
    messages = []
    if request.system_prompt is not None:
        messages.append({"role": "system", "content": request.system_prompt})
    messages.append({"role": "user", "content": request.prompt})
    options: dict[str, Any] = {"num_predict": request.max_tokens}
    for key, value in (
        ("temperature", request.temperature),
        ("top_p", request.top_p),
        ("top_k", request.top_k),
        ("repeat_penalty", request.repetition_penalty),
        ("seed", request.seed),
    ):
        if value is not None:
            options[key] = value
    if request.stop:
        options["stop"] = list(request.stop)
    return {"model": request.model, "messages": messages, "stream": False, "options": options}
