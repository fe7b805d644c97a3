"""A new server with runtime LoRA routes is assembled from the server parts, not written again.

The provider below is SGLang's, as a user of the SDK (or its next provider) would write it: its runtime LoRA routes
described as a :class:`LoRARoutes`, and the parts vLLM is assembled from. Fan-out over replicas, roll-back,
listing and the error mapping come from the parts. The wire shapes are SGLang's, read from its sources
(``python/sglang/srt/entrypoints/http_server.py``, ``managers/io_struct.py``, ``managers/tokenizer_manager.py``,
``lora/lora_registry.py``, ``lora/lora_manager.py``): ``POST /load_lora_adapter`` and ``POST /unload_lora_adapter`` at
the server root take ``{"lora_name", "lora_path"}`` (``{"lora_name"}``) and answer ``LoRAUpdateOutput`` as JSON
``{"success", "error_message", "loaded_adapters"}``, with status 200, or 400 when ``success`` is false; a generation
names an adapter as ``"model": "<base>:<adapter>"``; ``GET /v1/models`` lists the served model only. Not checked
against a running SGLang (none runs here), nor what SGLang answers to a generation for an adapter it lacks, so
healing is not exercised for it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx

from inference._core.lifecycle import Discovered
from inference._servers.http import ErrorHandlers, ServerAnswer
from inference._servers.openai_compatible import OpenAICompatibleProvider
from inference._servers.runtime_lora import LoRARoutes, RuntimeLoRA, absolute_if_local, already_loaded
from inference._servers.served_adapters import ServedAdapters
from inference.adapters.source import AdapterSource
from inference.config import SETTINGS
from inference.exceptions import (
    AdapterAlreadyLoadedError,
    RuntimeLoRADisabledError,
    ServerInvalidAdapterError,
    ServerResponseError,
)
from inference.registry import PROVIDERS, ProviderSpec

# --- The SGLang provider, from the parts -------------------------------------------------------------------------


def _lora_disabled(answer: ServerAnswer) -> ServerResponseError | None:
    """SGLang started without ``--enable-lora`` answers its LoRA routes 400 (they exist; LoRA does not)."""
    if "LoRA is not enabled" not in answer.message:
        return None
    return answer.error(
        RuntimeLoRADisabledError,
        f"{answer.where} refused runtime LoRA loading ({answer.message}): start SGLang with --enable-lora",
    )


def _load_refusals(adapter_id: str, adapter_path: str) -> ErrorHandlers:
    def bad_request(answer: ServerAnswer) -> ServerResponseError:
        return (
            _lora_disabled(answer)
            or already_loaded(answer, adapter_id, adapter_path)
            or answer.error(
                ServerInvalidAdapterError,
                f"{answer.where} could not load adapter {adapter_id!r} from {adapter_path!r} ({answer.message}): "
                "the path must hold a PEFT LoRA within SGLang's --max-lora-rank and --lora-target-modules",
                path=adapter_path,
            )
        )

    return {400: bad_request}


SGLANG_LORA_ROUTES = LoRARoutes(
    server="SGLang",
    enable_hint="start SGLang with --enable-lora",
    preload_hint="start SGLang with --lora-paths {adapter_id}=<path>",
    load_path="/load_lora_adapter",
    unload_path="/unload_lora_adapter",
    load_refusals=_load_refusals,
    unload_refusals=lambda adapter_id: {400: _lora_disabled},
    gone_on_unload=lambda error: error.status_code == 400 and "does not exist" in str(error),
    adapter_model=lambda model, adapter_id: f"{model}:{adapter_id}",
)


class SGLangProvider(OpenAICompatibleProvider):
    """Generates through SGLang's OpenAI-compatible API; loads LoRA adapters with its runtime routes."""

    name = "sglang"
    server_label = "SGLang"
    env_prefix = "SGLANG"
    model_hint = "use the model the server was started with (--model-path, or --served-model-name)"
    supports_adapters = True
    hot_swaps_adapters = True
    batches_mixed_adapters = True
    _lora: ServedAdapters

    def __init__(
        self,
        base_url: str | list[str] | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
    ) -> None:
        super().__init__(locals())
        lora = RuntimeLoRA(SGLANG_LORA_ROUTES)
        self._lora = ServedAdapters(self._replicas, lora, self._adapter_registry, None)

    def _adapter_path_argument(self, adapter_path: object) -> str:
        return absolute_if_local(super()._adapter_path_argument(adapter_path))

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        await self._lora.load(adapter_id, source.path)

    async def _unload_adapter(self, adapter_id: str) -> None:
        await self._lora.unload(adapter_id)

    async def _list_adapters(self) -> list[str]:
        return await self._lora.list_adapters()

    async def _discover_adapter(self, adapter_id: str) -> str | Discovered | None:
        return await self._lora.discover(adapter_id)


# --- SGLang on the wire ------------------------------------------------------------------------------------------

REPLICA_A = "http://sglang-a.test:30000/v1"
REPLICA_B = "http://sglang-b.test:30000/v1"
BASE_MODEL = "qwen-base"


def lora_update(success: bool = True, error_message: str | None = None) -> httpx.Response:
    """SGLang's answer of its LoRA routes: ``LoRAUpdateOutput`` as JSON, 200 or (not ``success``) 400."""
    loaded = {"a1": {"lora_name": "a1", "lora_path": "/adapters/a1", "pinned": False}} if success else None
    body = {"success": success, "error_message": error_message, "loaded_adapters": loaded}
    return httpx.Response(200 if success else 400, json=body)


def chat_answer(text: str, model: str) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "c1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        },
    )


def served_model() -> httpx.Response:
    """SGLang's ``GET /v1/models``: the served model only (runtime-loaded adapters are not listed)."""
    card = {"id": BASE_MODEL, "object": "model", "created": 1700000000, "owned_by": "sglang", "root": BASE_MODEL}
    return httpx.Response(200, json={"object": "list", "data": [{**card, "max_model_len": 4096}]})


def body(call: Any) -> Any:
    return json.loads(call.request.content)


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider's registry entry, as ``docs/architecture.md``'s recipe adds one (for the test's duration)."""
    settings = tuple(  # the OpenAI provider's base_url, api_key, timeout and max_retries, read from SGLANG_*
        dataclasses.replace(setting, env_var=setting.env_var.replace("OPENAI_", "SGLANG_"))
        for setting in PROVIDERS["openai"].settings
        if setting.key != "api"
    )
    spec = ProviderSpec(
        name="sglang", target=f"{__name__}:SGLangProvider", summary="an SGLang server", server=True, settings=settings
    )
    monkeypatch.setitem(PROVIDERS, "sglang", spec)
    monkeypatch.setitem(SETTINGS, "sglang", spec.settings)


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        for url in (REPLICA_A, REPLICA_B):
            router.get(f"{url}/models").mock(return_value=served_model())
        yield router


@pytest.fixture
async def sglang(mock: respx.MockRouter) -> AsyncIterator[SGLangProvider]:
    async with SGLangProvider(base_url=[REPLICA_A, REPLICA_B], max_retries=0) as provider:
        yield provider


async def test_an_adapter_is_loaded_on_every_replica_used_by_name_and_unloaded(
    sglang: SGLangProvider, mock: respx.MockRouter
) -> None:
    replicas = (REPLICA_A, REPLICA_B)
    roots = [url.removesuffix("/v1") for url in replicas]
    loads = [mock.post(f"{root}/load_lora_adapter").mock(return_value=lora_update()) for root in roots]
    unloads = [mock.post(f"{root}/unload_lora_adapter").mock(return_value=lora_update()) for root in roots]
    answer = chat_answer("math!", f"{BASE_MODEL}:a1")
    chats = [mock.post(f"{url}/chat/completions").mock(return_value=answer) for url in replicas]

    await sglang.load_adapter("a1", "/adapters/a1")
    result = await sglang.generate("2+2=", model=BASE_MODEL, adapter_id="a1")
    assert await sglang.list_adapters() == ["a1"]
    await sglang.unload_adapter("a1")

    assert [body(route.calls.last) for route in loads] == [{"lora_name": "a1", "lora_path": "/adapters/a1"}] * 2
    sent = [body(call) for route in chats for call in route.calls]
    assert [request["model"] for request in sent] == [f"{BASE_MODEL}:a1"]  # SGLang's model:adapter syntax
    assert (result.text, result.adapter_id) == ("math!", "a1")
    assert [body(route.calls.last) for route in unloads] == [{"lora_name": "a1"}] * 2
    assert await sglang.list_adapters() == []


async def test_a_load_one_replica_refuses_is_rolled_back_and_says_how_to_start_sglang(
    sglang: SGLangProvider, mock: respx.MockRouter
) -> None:
    mock.post("http://sglang-a.test:30000/load_lora_adapter").mock(return_value=lora_update())
    refused = lora_update(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
    mock.post("http://sglang-b.test:30000/load_lora_adapter").mock(return_value=refused)
    roll_back = mock.post("http://sglang-a.test:30000/unload_lora_adapter").mock(return_value=lora_update())

    with pytest.raises(RuntimeLoRADisabledError, match="start SGLang with --enable-lora") as raised:
        await sglang.load_adapter("a1", "/adapters/a1")

    assert "sglang-b.test" in str(raised.value) and raised.value.status_code == 400
    assert body(roll_back.calls.last) == {"lora_name": "a1"}  # undone where it had loaded
    assert await sglang.list_adapters() == []
    mock.post(f"{REPLICA_A}/chat/completions").mock(return_value=chat_answer("still fine", BASE_MODEL))
    mock.post(f"{REPLICA_B}/chat/completions").mock(return_value=chat_answer("still fine", BASE_MODEL))
    assert (await sglang.generate("hi", model=BASE_MODEL)).text == "still fine"


async def test_sglang_refusals_are_typed_errors_and_a_lost_adapter_unloads(
    sglang: SGLangProvider, mock: respx.MockRouter
) -> None:
    already = lora_update(False, "Failed to load LoRA adapter a1 because it is already loaded")
    mock.post("http://sglang-a.test:30000/load_lora_adapter").mock(return_value=already)
    mock.post("http://sglang-b.test:30000/load_lora_adapter").mock(return_value=lora_update())
    mock.post("http://sglang-b.test:30000/unload_lora_adapter").mock(return_value=lora_update())
    with pytest.raises(AdapterAlreadyLoadedError, match=r"already has an adapter named 'a1'.*unload it first"):
        await sglang.load_adapter("a1", "/adapters/a1")

    mock.post("http://sglang-a.test:30000/load_lora_adapter").mock(return_value=lora_update())
    await sglang.load_adapter("a1", "/adapters/a1")
    lost = lora_update(False, "LoRA with name a1 does not exist. Loaded LoRAs: dict_keys([])")  # restarted
    mock.post("http://sglang-a.test:30000/unload_lora_adapter").mock(return_value=lost)
    await sglang.unload_adapter("a1")  # the goal is met on the replica that had lost it
    assert await sglang.list_adapters() == []
