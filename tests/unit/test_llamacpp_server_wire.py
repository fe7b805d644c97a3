"""The llama-server provider on the wire, for what a real server cannot be made to do on cue (a restart that
reorders or drops its adapters). Bodies are llama-server's own (b11434, captured from the real server)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import respx

import inference.llamacpp_server_provider as module
from inference.exceptions import AdapterNotFoundError, InvalidAdapterError
from inference.llamacpp_server_provider import LlamaCppServerProvider

URL = "http://llama.test:8080"
TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def adapters(*paths: str) -> httpx.Response:
    listed = [{"id": i, "path": p, "scale": 1.0, "task_name": "", "prompt_prefix": ""} for i, p in enumerate(paths)]
    return httpx.Response(200, json=listed)


def chat(text: str = "Hello") -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "choices": [{"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": text}}],
            "created": 1795486000, "model": "tiny-qwen2.gguf", "system_fingerprint": "b0-unknown",
            "object": "chat.completion", "usage": {"completion_tokens": 4, "prompt_tokens": 12, "total_tokens": 16},
            "id": "chatcmpl-x",
        },
    )


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        router.get(f"{URL}/props").mock(
            return_value=httpx.Response(200, json={"chat_template": TEMPLATE, "model_path": "/models/tiny-qwen2.gguf"})
        )
        yield router


@pytest.fixture
async def provider(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LlamaCppServerProvider]:
    monkeypatch.setattr(module, "SERVED_TTL_SECONDS", 0.0)  # every request reads the server's list again
    async with LlamaCppServerProvider(base_url=URL, max_retries=0) as llama:
        yield llama


def sent(route: respx.Route) -> dict[str, object]:
    body: dict[str, object] = json.loads(route.calls.last.request.content)
    return body


async def test_each_request_applies_exactly_its_adapter_with_the_prompt_cache_off(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    mock.get(f"{URL}/lora-adapters").mock(return_value=adapters("/srv/a0.gguf", "/srv/a1.gguf"))
    route = mock.post(f"{URL}/v1/chat/completions").mock(return_value=chat())
    await provider.load_adapter("style", "/srv/a1.gguf")
    await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)
    assert sent(route)["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}]
    assert sent(route)["cache_prompt"] is False  # llama.cpp#26207: the cache is not keyed by adapter
    await provider.generate("Hi", model="tiny", max_tokens=4)
    assert sent(route)["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]


async def test_a_server_without_adapters_keeps_its_prompt_cache(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    mock.get(f"{URL}/lora-adapters").mock(return_value=adapters())
    route = mock.post(f"{URL}/v1/chat/completions").mock(return_value=chat())
    assert (await provider.generate("Hi", model="tiny", max_tokens=4)).text == "Hello"
    assert "lora" not in sent(route) and "cache_prompt" not in sent(route)


async def test_a_restart_that_reorders_the_adapters_still_applies_the_right_one(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    listing = mock.get(f"{URL}/lora-adapters").mock(return_value=adapters("/srv/a0.gguf", "/srv/a1.gguf"))
    route = mock.post(f"{URL}/v1/chat/completions").mock(return_value=chat())
    await provider.load_adapter("style", "/srv/a1.gguf")
    listing.mock(return_value=adapters("/srv/a1.gguf", "/srv/a0.gguf"))  # restarted with the flags swapped
    await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)
    assert sent(route)["lora"] == [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]


async def test_a_restart_without_the_adapter_fails_its_requests_naming_the_flag(
    provider: LlamaCppServerProvider, mock: respx.MockRouter
) -> None:
    listing = mock.get(f"{URL}/lora-adapters").mock(return_value=adapters("/srv/a0.gguf", "/srv/a1.gguf"))
    route = mock.post(f"{URL}/v1/chat/completions").mock(return_value=chat())
    await provider.load_adapter("style", "/srv/a1.gguf")
    listing.mock(return_value=adapters("/srv/a0.gguf"))
    with pytest.raises(AdapterNotFoundError, match=re.escape("start it with --lora /srv/a1.gguf")):
        await provider.generate("Hi", model="tiny", adapter_id="style", max_tokens=4)
    assert route.call_count == 0  # nothing was generated with the wrong weights
    assert (await provider.generate("Hi", model="tiny", adapter_id="a0", max_tokens=4)).text == "Hello"


async def test_a_path_the_server_does_not_have_is_refused_before_anything_is_generated(
    provider: LlamaCppServerProvider, mock: respx.MockRouter, tmp_path: Path
) -> None:
    mock.get(f"{URL}/lora-adapters").mock(return_value=adapters("/srv/a0.gguf"))
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF not the same bytes")
    with pytest.raises(InvalidAdapterError, match=re.escape(f"restart it with --lora {other}")):
        await provider.load_adapter("other", other)
    assert await provider.list_adapters() == ["a0"]
