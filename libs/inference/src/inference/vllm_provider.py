"""The vLLM provider: generation over the OpenAI-compatible API, LoRA adapters over vLLM's runtime routes."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from inference._dependencies import import_optional
from inference._http import ServerAnswer, ServerClient, server_root
from inference._validation import GenerationRequest
from inference.config import resolve_settings
from inference.exceptions import (
    RuntimeLoRADisabledError,
    ServerAdapterAlreadyLoadedError,
    ServerAdapterNotFoundError,
    ServerInvalidAdapterError,
    ServerModelNotFoundError,
    ServerResponseError,
)
from inference.provider import GenerationResult, InferenceProvider

if TYPE_CHECKING:
    import httpx
    from openai import AsyncOpenAI

__all__ = ["VLLMProvider"]

# Imported with the module (never by ``import inference``), not at first request: importing openai takes
# about half a second, which must not stall a running event loop.
_openai = import_optional("openai", extra="vllm", provider="vllm")

_NO_API_KEY = "EMPTY"
"""What the openai client sends when no key is configured (vLLM without --api-key ignores it)."""

_RUNTIME_LORA_HINT = "start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"
_QUOTED_MODEL = re.compile(r"`([^`]*)`")


class VLLMProvider(InferenceProvider):
    """Generates through a vLLM server and loads LoRA adapters into it at run time.

    Generation uses the OpenAI-compatible ``/v1/chat/completions`` route through the ``openai`` client;
    an adapter is chosen by sending its id as the ``model``. ``load_adapter``/``unload_adapter`` call
    vLLM's runtime routes, which exist only when the server runs with ``--enable-lora`` and
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``. The provider keeps its own record of the adapters it loaded
    (the server's own list was unreliable in some vLLM versions); ``list_adapters`` returns it.

    Args:
        base_url: The server's OpenAI-compatible base URL, ending with ``/v1``; else ``VLLM_BASE_URL``;
            else ``http://localhost:8100/v1``.
        api_key: Key the server was started with (``--api-key``); else ``VLLM_API_KEY``. Never shown.
        timeout: Seconds to wait for one answer; else ``VLLM_TIMEOUT``; else 120.
        max_retries: Retries of connect errors and 429/502/503/504; else ``VLLM_MAX_RETRIES``; else 2.

    Example:
        >>> provider = VLLMProvider(base_url="http://127.0.0.1:8100/v1", api_key="secret")
        >>> provider
        VLLMProvider(base_url='http://127.0.0.1:8100/v1', api_key=***, adapters=[])
    """

    name = "vllm"
    supports_adapters = True
    hot_swaps_adapters = True
    batches_mixed_adapters = True

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
    ) -> None:
        settings = resolve_settings(
            "vllm", {"base_url": base_url, "api_key": api_key, "timeout": timeout, "max_retries": max_retries}
        )
        self.base_url: str = settings["base_url"]
        self._api_key: str | None = settings["api_key"]
        self._http = ServerClient(
            provider=self.name,
            server="vLLM",
            base_url=self.base_url,
            timeout=settings["timeout"],
            max_retries=settings["max_retries"],
            env_prefix="VLLM",
            headers={"Authorization": f"Bearer {self._api_key}"} if self._api_key else None,
        )
        root = server_root(self.base_url)
        self._load_url = f"{root}/v1/load_lora_adapter"
        self._unload_url = f"{root}/v1/unload_lora_adapter"
        self._openai: AsyncOpenAI | None = None
        self._openai_http: httpx.AsyncClient | None = None
        self._adapters: dict[str, str] = {}

    def __repr__(self) -> str:
        key = "***" if self._api_key else "None"
        return f"VLLMProvider(base_url={self.base_url!r}, api_key={key}, adapters={sorted(self._adapters)})"

    @property
    def timeout(self) -> float:
        """Seconds to wait for one answer."""
        return self._http.timeout

    @property
    def max_retries(self) -> int:
        """Retries of transient failures."""
        return self._http.max_retries

    def _client(self) -> AsyncOpenAI:
        """The openai client over the pooled HTTP client (made again when the pooled client changes)."""
        http_client = self._http.client()
        if self._openai is None or self._openai_http is not http_client:
            self._openai = _openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._api_key or _NO_API_KEY,
                http_client=http_client,
                timeout=self._http.httpx_timeout,
                max_retries=0,  # retries live in the pooled client's transport
            )
            self._openai_http = http_client
        return self._openai

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        model = request.adapter_id or request.model
        operation = f"generate with adapter {model!r}" if request.adapter_id else f"generate with model {model!r}"
        messages = []
        if request.system_prompt is not None:
            messages.append({"role": "system", "content": request.system_prompt})
        messages.append({"role": "user", "content": request.prompt})
        arguments: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": request.max_tokens}
        if request.temperature is not None:
            arguments["temperature"] = request.temperature
        if request.top_p is not None:
            arguments["top_p"] = request.top_p
        if request.stop:
            arguments["stop"] = list(request.stop)
        if request.seed is not None:
            arguments["seed"] = request.seed
        extra_body: dict[str, Any] = {}
        if request.repetition_penalty is not None:
            extra_body["repetition_penalty"] = request.repetition_penalty
        if request.top_k is not None:
            extra_body["top_k"] = request.top_k
        if extra_body:
            arguments["extra_body"] = extra_body
        client = self._client()
        try:
            completion = await client.chat.completions.create(**arguments)
        except Exception as error:
            handlers = {404: lambda answer: self._generation_not_found(answer, request)}
            raise self._http.error_from_exception(error, operation=operation, handlers=handlers) from error
        try:
            choice = completion.choices[0]
            text = choice.message.content or ""
            usage = completion.usage
            prompt_tokens = usage.prompt_tokens if usage is not None else 0
            completion_tokens = usage.completion_tokens if usage is not None else 0
            answered_model = completion.model or model
        except (AttributeError, IndexError, TypeError) as error:
            raise self._http.protocol_error(operation, "an answer that is not a chat completion") from error
        return GenerationResult(
            text=text,
            model=answered_model,
            adapter_id=request.adapter_id,
            token_count=prompt_tokens + completion_tokens,
            finish_reason="length" if choice.finish_reason == "length" else "stop",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )

    def _generation_not_found(self, answer: ServerAnswer, request: GenerationRequest) -> ServerResponseError | None:
        if answer.route_missing:
            return answer.error(
                ServerResponseError,
                f"{answer.where} has no route {answer.response.request.url.path}: set VLLM_BASE_URL "
                "(or base_url) to the server's OpenAI-compatible base URL, which ends with /v1",
            )
        quoted = _QUOTED_MODEL.search(answer.message)
        named = quoted.group(1) if quoted else None
        if request.adapter_id is not None and named in (None, request.adapter_id):
            return answer.error(
                ServerAdapterNotFoundError,
                f"{answer.where} has no adapter {request.adapter_id!r} ({answer.message}): load it with "
                f"load_adapter({request.adapter_id!r}, path) first, or start vLLM with "
                f"--lora-modules {request.adapter_id}=<path>",
            )
        return answer.error(
            ServerModelNotFoundError,
            f"{answer.where} does not serve model {named or request.model!r} ({answer.message}): use the name "
            "the server was started with (--served-model-name, or the --model path); GET /v1/models lists it",
        )

    async def _load_adapter(self, adapter_id: str, adapter_path: str) -> None:
        def not_found(answer: ServerAnswer) -> ServerResponseError:
            if answer.route_missing:
                return self._runtime_lora_disabled(answer)
            return answer.error(
                ServerInvalidAdapterError,
                f"{answer.where} found no adapter at {adapter_path!r} ({answer.message}): the path must exist "
                "on the vLLM server's machine and hold adapter_config.json and the adapter weights "
                "(a path that does not exist there is tried as a Hugging Face Hub repo id)",
                path=adapter_path,
            )

        def bad_request(answer: ServerAnswer) -> ServerResponseError | None:
            if "already" in answer.message.lower():
                return answer.error(
                    ServerAdapterAlreadyLoadedError,
                    f"{answer.where} already has an adapter named {adapter_id!r} ({answer.message}): "
                    "unload it first or choose another id",
                    path=adapter_path,
                )
            return None

        def server_error(answer: ServerAnswer) -> ServerResponseError:
            if "max_lora_rank" in answer.message:
                advice = (
                    "restart vLLM with a --max-lora-rank at least the adapter's rank "
                    "(one of 8, 16, 32, 64, 128, 256, 320, 512; the default is 16)"
                )
            else:
                advice = (
                    "vLLM refuses adapters whose rank exceeds --max-lora-rank, DoRA adapters, bias other than "
                    "'none' and unsupported modules_to_save; its log says which"
                )
            return answer.error(
                ServerInvalidAdapterError,
                f"{answer.where} could not load adapter {adapter_id!r} from {adapter_path!r} "
                f"({answer.message}): {advice}",
                path=adapter_path,
            )

        await self._http.request(
            "POST",
            self._load_url,
            operation=f"load adapter {adapter_id!r}",
            json_body={"lora_name": adapter_id, "lora_path": adapter_path},
            handlers={400: bad_request, 404: not_found, 500: server_error},
        )
        self._adapters[adapter_id] = adapter_path

    async def _unload_adapter(self, adapter_id: str) -> None:
        def not_found(answer: ServerAnswer) -> ServerResponseError:
            if answer.route_missing:
                return self._runtime_lora_disabled(answer)
            self._adapters.pop(adapter_id, None)  # the server does not have it: forget it here too
            return answer.error(
                ServerAdapterNotFoundError,
                f"{answer.where} has no adapter named {adapter_id!r} ({answer.message}): "
                f"adapters this provider loaded: {sorted(self._adapters) or 'none'}",
            )

        await self._http.request(
            "POST",
            self._unload_url,
            operation=f"unload adapter {adapter_id!r}",
            json_body={"lora_name": adapter_id},
            handlers={404: not_found},
        )
        self._adapters.pop(adapter_id, None)

    @staticmethod
    def _runtime_lora_disabled(answer: ServerAnswer) -> ServerResponseError:
        return answer.error(
            RuntimeLoRADisabledError,
            f"{answer.where} refused runtime LoRA loading (404 on {answer.response.request.url.path}): "
            f"{_RUNTIME_LORA_HINT}",
        )

    async def _list_adapters(self) -> list[str]:
        return list(self._adapters)

    async def aclose(self) -> None:
        """Close the pooled connections. The provider makes new ones if it is used again."""
        self._openai = None
        self._openai_http = None
        await self._http.aclose()
