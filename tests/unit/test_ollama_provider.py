"""OllamaProvider on the wire: native /api/chat (plain and streamed), adapters as derived models, Ollama's answers.

Answers are Ollama's (v0.33, read from its source):

- ``/api/chat`` with ``"stream": false`` returns one JSON object with ``message.content``, ``done_reason``,
  ``prompt_eval_count`` and ``eval_count``; with ``"stream": true`` NDJSON chunks, the last with ``done: true``;
  a missing model is ``404 {"error": "model 'x' not found"}``; other errors are ``{"error": "..."}``.
- ``HEAD /api/blobs/<digest>``: 200 or 404; ``POST`` raw bytes: 201 (400 on a digest mismatch).
- ``POST /api/create``: NDJSON ``{"status": ...}`` lines ending with ``{"status": "success"}``; a failure
  before any line is an error status with ``{"error": ...}``, after one an ``{"error": ...}`` line.
- ``DELETE /api/delete``: 200 with an empty body, 404 ``{"error": "model 'x' not found"}``.
- ``GET /api/tags``: ``{"models": [{"name": "ns/model:tag", ...}]}`` (names in their shortest display form).
- ``POST /api/show``: ``model_info`` (GGUF metadata, arrays of more than 5 items emptied) and ``tensors``
  (``name``, ``type``, ``shape`` in GGUF order); built here from the tiny test models' real GGUF headers.

The stateful :class:`FakeOllama` below keeps blobs and models, so the lifecycle is tested end to end.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from inference import get_provider, get_provider_for_step
from inference._servers.ollama_models import (
    DERIVED_NAMESPACE,
    base_model_digest,
    derived_model_name,
    parse_derived_model_name,
)
from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    ConfigurationError,
    InvalidAdapterError,
    InvalidRequestError,
    ModelNotFoundError,
    ProtocolError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    ServerInvalidAdapterError,
    ServerModelNotFoundError,
    ServerResponseError,
)
from inference.ollama_provider import OllamaProvider
from inference.provider import GenerationResult
from replacing import after_rounds, bad_adapter_paths, replace_alternately

pytestmark = [
    # PEFT 0.21 calls a transformers 5 property that is deprecated (the tiny models are built with PEFT).
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

ROOT = "http://ollama.test:11434"
BASE = f"{ROOT}/v1"
CHAT = f"{ROOT}/api/chat"
BASE_MODEL = "tiny-qwen2"
LLAMA_BASE = "tiny-llama"
USER_MODELS = ["llama3.2:latest", "qwen2.5:0.5b", "myteam/assistant:v1"]


def chat_reply(
    text: str = "Hi! How can I help?",
    *,
    model: str = "llama3.2",
    done_reason: str = "stop",
    prompt_eval_count: int = 26,
    eval_count: int = 8,
) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "model": model,
            "created_at": "2026-01-01T00:00:00.000000Z",
            "message": {"role": "assistant", "content": text},
            "done": True,
            "done_reason": done_reason,
            "total_duration": 5191566416,
            "load_duration": 2154458,
            "prompt_eval_count": prompt_eval_count,
            "prompt_eval_duration": 383809000,
            "eval_count": eval_count,
            "eval_duration": 4799921000,
        },
    )


def chat_chunks(model: str, pieces: list[str], *, done_reason: str = "stop") -> list[bytes]:
    lines = [
        {
            "model": model,
            "created_at": "2026-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": p},
            "done": False,
        }
        for p in pieces
    ]
    lines.append(
        {
            "model": model,
            "created_at": "2026-01-01T00:00:01Z",
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": done_reason,
            "total_duration": 1000,
            "prompt_eval_count": 11,
            "eval_count": len(pieces),
        }
    )
    return [json.dumps(line).encode() + b"\n" for line in lines]


def ndjson(*lines: dict[str, Any]) -> httpx.Response:
    content = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    return httpx.Response(200, content=content, headers={"content-type": "application/x-ndjson"})


def sent(route: respx.Route) -> Any:
    return json.loads(route.calls.last.request.content)


def show_answer(gguf_path: Path) -> dict[str, Any]:
    """What Ollama's ``/api/show`` answers for a model made from this GGUF file (non-verbose)."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(gguf_path)
    model_info: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.name", "tokenizer.chat_template"):
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            model_info[key] = field.contents() if len(field.data) <= 5 else []
        else:
            model_info[key] = field.contents()
    tensors = [
        {"name": tensor.name, "type": tensor.tensor_type.name, "shape": [int(d) for d in tensor.shape]}
        for tensor in reader.tensors
    ]
    architecture = model_info["general.architecture"]
    return {
        "license": "",
        "modelfile": f'# Modelfile generated by "ollama show"\nFROM {gguf_path.name}\n',
        "template": "{{ .Prompt }}",
        "details": {"parent_model": "", "format": "gguf", "family": architecture, "families": [architecture]},
        "model_info": model_info,
        "tensors": tensors,
        "capabilities": ["completion"],
        "modified_at": "2026-01-01T00:00:00Z",
    }


class FakeOllama:
    """An Ollama server in respx: blobs, models, and the routes the adapter lifecycle uses."""

    def __init__(self, router: respx.MockRouter, bases: dict[str, dict[str, Any]]) -> None:
        self.bases = dict(bases)  # a copy: tests change it, and the module-scoped answers must stay as built
        self.blobs: dict[str, bytes] = {}
        self.models: dict[str, dict[str, Any]] = {name: {} for name in USER_MODELS}
        self.uploads: list[str] = []
        self.creates: list[dict[str, Any]] = []
        self.create_answer: httpx.Response | None = None
        blob = re.escape(ROOT) + r"/api/blobs/(?P<digest>sha256:[0-9a-f]{64})$"
        self.head = router.head(url__regex=blob).mock(side_effect=self._head_blob)
        self.upload = router.post(url__regex=blob).mock(side_effect=self._post_blob)
        self.create = router.post(f"{ROOT}/api/create").mock(side_effect=self._create)
        self.delete = router.delete(f"{ROOT}/api/delete").mock(side_effect=self._delete)
        self.tags = router.get(f"{ROOT}/api/tags").mock(side_effect=self._tags)
        self.show = router.post(f"{ROOT}/api/show").mock(side_effect=self._show)
        self.chat = router.post(CHAT).mock(side_effect=self._chat)

    @staticmethod
    def _not_found(name: str) -> httpx.Response:
        return httpx.Response(404, json={"error": f"model '{name}' not found"})

    def _head_blob(self, request: httpx.Request, digest: str) -> httpx.Response:
        if digest in self.blobs:
            return httpx.Response(200)
        return httpx.Response(404, json={"error": f'blob "{digest}" not found'})

    def _post_blob(self, request: httpx.Request, digest: str) -> httpx.Response:
        data = request.read()
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if actual != digest:
            return httpx.Response(400, json={"error": f'digest mismatch, expected "{digest}", got "{actual}"'})
        self.uploads.append(digest)
        self.blobs[digest] = data
        return httpx.Response(201)

    def _create(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.creates.append(body)
        if self.create_answer is not None:
            return self.create_answer
        if body["from"] not in self.bases:
            return self._not_found(body["from"])
        missing = [digest for digest in body["adapters"].values() if digest not in self.blobs]
        if missing:
            return httpx.Response(400, json={"error": f"blob {missing[0]} not found"})
        self.models[body["model"]] = body
        return ndjson(
            {"status": "parsing GGUF"},
            {"status": f"using existing layer sha256:{'0' * 64}"},
            {"status": "writing manifest"},
            {"status": "success"},
        )

    def _delete(self, request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["model"]
        if self.models.pop(name, None) is None:
            return self._not_found(name)
        return httpx.Response(200)

    def _tags(self, request: httpx.Request) -> httpx.Response:
        models = [
            {"name": name, "model": name, "modified_at": "2026-01-01T00:00:00Z", "size": 1, "digest": "0" * 64}
            for name in [*self.bases, *self.models]
        ]
        return httpx.Response(200, json={"models": models})

    def _show(self, request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["model"]
        if name not in self.bases:
            return self._not_found(name)
        return httpx.Response(200, json=self.bases[name])

    def _chat(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        name = body["model"]
        if name not in self.bases and name not in self.models:
            return self._not_found(name)
        if body["stream"]:
            return httpx.Response(200, content=b"".join(chat_chunks(name, ["from ", name])))
        return chat_reply(f"from {name}", model=name)

    def uploaded_for(self, create: dict[str, Any]) -> dict[str, bytes]:
        return {file_name: self.blobs[digest] for file_name, digest in create["adapters"].items()}


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as router:
        yield router


@pytest.fixture
async def provider() -> AsyncIterator[OllamaProvider]:
    async with OllamaProvider(base_url=BASE, max_retries=1) as ollama:
        yield ollama


@pytest.fixture(scope="module")
def shows(tiny_models: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        BASE_MODEL: show_answer(tiny_models["qwen2"].gguf_path),
        LLAMA_BASE: show_answer(tiny_models["llama"].gguf_path),
    }


@pytest.fixture
def server(mock: respx.MockRouter, shows: dict[str, dict[str, Any]]) -> FakeOllama:
    return FakeOllama(mock, shows)


@pytest.fixture
async def adapters(tmp_path: Path) -> AsyncIterator[OllamaProvider]:
    async with OllamaProvider(
        base_url=BASE, max_retries=1, base_model=BASE_MODEL, adapter_cache_dir=tmp_path / "cache"
    ) as ollama:
        yield ollama


@pytest.fixture(scope="module")
def qwen_lora(tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GGUF LoRA for the tiny Qwen2 (adapter a0, converted with the SDK's converter)."""
    from inference.adapters.gguf import convert_peft_to_gguf

    model = tiny_models["qwen2"]
    return convert_peft_to_gguf(model.adapter_dirs["a0"], model.gguf_path, tmp_path_factory.mktemp("lora") / "a0.gguf")


async def generates(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=chat_reply("still fine"))
    assert (await provider.generate("Hi", model="llama3.2", max_tokens=8)).text == "still fine"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# Generation ------------------------------------------------------------------------------------------------


async def test_native_chat_body_carries_only_what_the_caller_set(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply())
    await provider.generate("Hi", model="llama3.2")
    assert sent(route) == {
        "model": "llama3.2",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": False,
        "options": {"num_predict": 4096},
    }


async def test_every_parameter_reaches_the_options(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply())
    await provider.generate(
        "Hi",
        model="llama3.2",
        max_tokens=64,
        system_prompt="Be brief.",
        temperature=0.2,
        top_p=0.8,
        repetition_penalty=1.3,
        stop=["\n", "END"],
        seed=11,
        top_k=20,
    )
    assert sent(route) == {
        "model": "llama3.2",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "stream": False,
        "options": {
            "num_predict": 64,
            "temperature": 0.2,
            "top_p": 0.8,
            "top_k": 20,
            "repeat_penalty": 1.3,
            "seed": 11,
            "stop": ["\n", "END"],
        },
    }


async def test_greedy_and_zero_values_are_sent(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply())
    await provider.generate("Hi", model="llama3.2", temperature=0.0, seed=0, top_k=0, stop="END")
    options = sent(route)["options"]
    assert options == {"num_predict": 4096, "temperature": 0.0, "seed": 0, "top_k": 0, "stop": ["END"]}


async def test_reply_is_parsed(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=chat_reply("one two three", done_reason="length", eval_count=3))
    result = await provider.generate("Hi", model="llama3.2", max_tokens=3)
    assert (result.text, result.model, result.adapter_id, result.finish_reason) == (
        "one two three",
        "llama3.2",
        None,
        "length",
    )
    assert (result.prompt_tokens, result.completion_tokens, result.token_count) == (26, 3, 29)


async def test_reply_without_counts_gives_zero_counts(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(
        return_value=httpx.Response(200, json={"model": "llama3.2", "message": {"content": "x"}, "done": True})
    )
    result = await provider.generate("Hi", model="llama3.2")
    assert (result.text, result.token_count, result.finish_reason) == ("x", 0, "stop")


async def test_missing_model_says_how_to_pull_it(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(404, json={"error": "model 'qwen9' not found"}))
    with pytest.raises(ServerModelNotFoundError) as caught:
        await provider.generate("Hi", model="qwen9")
    error = caught.value
    assert "ollama pull qwen9" in str(error) and BASE in str(error)
    assert isinstance(error, ModelNotFoundError) and isinstance(error, httpx.HTTPStatusError)
    assert error.response.status_code == 404 and error.request.url == CHAT
    await generates(provider, mock)


async def test_a_server_that_is_not_ollama_is_named_as_such(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
    with pytest.raises(ServerResponseError) as caught:
        await provider.generate("Hi", model="llama3.2")
    assert not isinstance(caught.value, ModelNotFoundError)
    assert "has no Ollama native API" in str(caught.value)
    assert "http://ollama.test:11434" in str(caught.value)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "invalid options: num_ctx must be positive"),
        (500, "llama runner process has terminated: signal: killed"),
    ],
)
async def test_other_errors_quote_ollama(
    provider: OllamaProvider, mock: respx.MockRouter, status: int, message: str
) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(status, json={"error": message}))
    with pytest.raises(ServerResponseError) as caught:
        await provider.generate("Hi", model="llama3.2")
    assert message in str(caught.value) and caught.value.status_code == status
    assert route.call_count == 1
    await generates(provider, mock)


async def test_a_model_name_is_required(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply())
    with pytest.raises(InvalidRequestError, match="Ollama needs a model name"):
        await provider.generate("Hi", model="")
    assert route.call_count == 0


async def test_503_then_success(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(side_effect=[httpx.Response(503), chat_reply("ok")])
    assert (await provider.generate("Hi", model="llama3.2")).text == "ok"
    assert route.call_count == 2


async def test_503_forever_gives_up(mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(return_value=httpx.Response(503))
    async with OllamaProvider(base_url=BASE, max_retries=2) as ollama:
        with pytest.raises(ServerResponseError):
            await ollama.generate("Hi", model="llama3.2")
    assert route.call_count == 3


async def test_timeout(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(side_effect=httpx.ReadTimeout("timed out"))
    with pytest.raises(ProviderTimeoutError, match="OLLAMA_TIMEOUT"):
        await provider.generate("Hi", model="llama3.2")
    assert route.call_count == 1
    await generates(provider, mock)


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, content=b'{"message": {"content": "x"', headers={"content-type": "application/json"}),
        httpx.Response(200, json={"done": True}),
        httpx.Response(200, json={"message": {"content": None}}),
        httpx.Response(200, json=["not", "an", "object"]),
        httpx.Response(200, json={"message": {"content": "x"}, "done": True, "prompt_eval_count": "26"}),
        httpx.Response(200, json={"message": {"content": "x"}, "done": True, "eval_count": 7.5}),
        httpx.Response(200, json={"message": {"content": "x"}, "done": True, "eval_count": -1}),
    ],
    ids=["truncated", "no-message", "null-content", "list", "count-text", "count-fraction", "count-negative"],
)
async def test_malformed_replies_are_protocol_errors(
    provider: OllamaProvider, mock: respx.MockRouter, answer: httpx.Response
) -> None:
    mock.post(CHAT).mock(return_value=answer)
    with pytest.raises(ProtocolError, match="OLLAMA_BASE_URL"):
        await provider.generate("Hi", model="llama3.2")
    await generates(provider, mock)


async def test_server_down_is_unavailable_naming_the_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    async with OllamaProvider(base_url=url) as ollama:
        with pytest.raises(ProviderUnavailableError) as caught:
            await ollama.generate("Hi", model="llama3.2")
    assert url in str(caught.value) and "OLLAMA_BASE_URL" in str(caught.value)


async def test_factory_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLLAMA_BASE_URL", "http://ollama-box:11434/v1")
    monkeypatch.setenv("OLLAMA_TIMEOUT", "30")
    monkeypatch.setenv("OLLAMA_BASE_MODEL", "llama3.2")
    ollama = get_provider("ollama")
    assert isinstance(ollama, OllamaProvider)
    assert (ollama.base_url, ollama.native_url, ollama.timeout, ollama.base_model) == (
        "http://ollama-box:11434/v1",
        "http://ollama-box:11434",
        30.0,
        "llama3.2",
    )
    assert get_provider_for_step({"provider": "ollama"}) is ollama
    other = get_provider_for_step(
        {"provider": "ollama", "base_url": "http://127.0.0.1:11434/v1", "base_model": "qwen2.5:0.5b"}
    )
    assert isinstance(other, OllamaProvider) and other is not ollama and other.base_model == "qwen2.5:0.5b"
    assert repr(other) == "OllamaProvider(base_url='http://127.0.0.1:11434/v1', base_model='qwen2.5:0.5b')"


async def test_default_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLLAMA_BASE_URL", raising=False)
    monkeypatch.delenv("OLLAMA_BASE_MODEL", raising=False)
    ollama = OllamaProvider()
    assert (ollama.base_url, ollama.native_url, ollama.base_model) == (
        "http://localhost:11434/v1",
        "http://localhost:11434",
        None,
    )
    assert repr(ollama) == "OllamaProvider(base_url='http://localhost:11434/v1')"
    assert OllamaProvider.supports_adapters and not OllamaProvider.hot_swaps_adapters


# Streaming -------------------------------------------------------------------------------------------------


async def collect(events: AsyncIterator[str | GenerationResult]) -> tuple[list[str], GenerationResult]:
    pieces: list[str] = []
    async for event in events:
        if isinstance(event, str):
            pieces.append(event)
        else:
            return pieces, event
    raise AssertionError("the stream ended without a result")


async def test_stream_yields_pieces_then_the_result(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    route = mock.post(CHAT).mock(
        return_value=httpx.Response(200, content=b"".join(chat_chunks("llama3.2", ["Hel", "lo", " there"])))
    )
    pieces, result = await collect(provider.stream("Hi", model="llama3.2", max_tokens=3, temperature=0))
    assert pieces == ["Hel", "lo", " there"]
    assert (result.text, result.model, result.finish_reason, result.adapter_id) == (
        "Hello there",
        "llama3.2",
        "stop",
        None,
    )
    assert (result.prompt_tokens, result.completion_tokens, result.token_count) == (11, 3, 14)
    assert sent(route) == {
        "model": "llama3.2",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "options": {"num_predict": 3, "temperature": 0},
    }


async def test_stream_length_finish(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(
        return_value=httpx.Response(200, content=b"".join(chat_chunks("llama3.2", ["a", "b"], done_reason="length")))
    )
    _, result = await collect(provider.stream("Hi", model="llama3.2", max_tokens=2))
    assert result.finish_reason == "length"


class EndlessStream(httpx.AsyncByteStream):
    """A streamed chat answer that sends a few chunks, then waits forever; records that it was closed."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in chat_chunks("llama3.2", ["one ", "two ", "three "])[:-1]:
            self.sent += 1
            yield chunk
        await asyncio.Event().wait()  # the model keeps "thinking" until the client goes away
        yield b""  # pragma: no cover

    async def aclose(self) -> None:
        self.closed.set()


async def test_breaking_out_of_a_stream_closes_the_response(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    stream = EndlessStream()
    mock.post(CHAT).mock(return_value=httpx.Response(200, stream=stream))
    events = provider.stream("Hi", model="llama3.2")
    pieces = []
    async for event in events:
        pieces.append(event)
        if len(pieces) == 2:
            break
    await events.aclose()  # type: ignore[attr-defined]
    assert pieces == ["one ", "two "]
    assert stream.closed.is_set()
    await generates(provider, mock)


async def test_cancelling_the_consumer_closes_the_response(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    stream = EndlessStream()
    mock.post(CHAT).mock(return_value=httpx.Response(200, stream=stream))
    received: list[str | GenerationResult] = []

    async def consume() -> None:
        async for event in provider.stream("Hi", model="llama3.2"):
            received.append(event)

    task = asyncio.create_task(consume())
    while len(received) < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert received == ["one ", "two ", "three "]
    assert stream.closed.is_set()
    await generates(provider, mock)


async def test_an_error_line_mid_stream_is_a_server_error(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    lines = [*chat_chunks("llama3.2", ["partial"])[:-1], b'{"error":"llama runner process has terminated"}\n']
    mock.post(CHAT).mock(return_value=httpx.Response(200, content=b"".join(lines)))
    received: list[str | GenerationResult] = []
    with pytest.raises(ServerResponseError, match="llama runner process has terminated"):
        async for event in provider.stream("Hi", model="llama3.2"):
            received.append(event)
    assert received == ["partial"]
    await generates(provider, mock)


@pytest.mark.parametrize(
    ("done", "problem"),
    [(False, "an answer whose done is false, not true"), ("true", 'an answer whose done is "true", not true'),
     (None, "an answer whose done is missing, not true")],
    ids=["false", "text", "missing"],
)
async def test_a_whole_answer_that_is_not_done_is_a_protocol_error(
    provider: OllamaProvider, mock: respx.MockRouter, done: Any, problem: str
) -> None:
    """Ollama's whole answer is its last line, done: one with done false (the first line of an answer, cut short)
    was returned as the finished answer."""
    body = chat_reply("Hi! How").json()
    if done is None:
        del body["done"]
    else:
        body["done"] = done
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=body))
    with pytest.raises(ProtocolError, match=problem):
        await provider.generate("Hi", model="llama3.2")
    await generates(provider, mock)


@pytest.mark.parametrize("field", ["prompt_eval_count", "eval_count"])
async def test_a_token_count_no_context_holds_is_a_protocol_error(
    provider: OllamaProvider, mock: respx.MockRouter, field: str
) -> None:
    """10**30 was returned as the answer's token count (and added to every metric of token usage)."""
    mock.post(CHAT).mock(return_value=chat_reply(**{field: 10**30}))
    with pytest.raises(ProtocolError, match=rf"{field} is 1000000000000000000000000000000, not a token count"):
        await provider.generate("Hi", model="llama3.2")
    await generates(provider, mock)


@pytest.mark.parametrize("done", ["false", 0, None], ids=["text", "number", "missing"])
async def test_a_stream_line_whose_done_is_not_a_boolean_is_a_protocol_error(
    provider: OllamaProvider, mock: respx.MockRouter, done: Any
) -> None:
    """A first line with done "false" (text) was taken as the last: the stream ended after its first piece with
    that piece for the whole answer. A number or no done at all is no Ollama line either (Ollama writes true or
    false in every line)."""
    lines = [json.loads(line) for line in chat_chunks("llama3.2", ["Hi", "! How", " can I help?"])]
    if done is None:
        del lines[0]["done"]
    else:
        lines[0]["done"] = done
    mock.post(CHAT).mock(return_value=ndjson(*lines))
    shown = "missing" if done is None else json.dumps(done)
    with pytest.raises(ProtocolError, match=f"a stream line whose done is {shown}, not true or false"):
        await collect(provider.stream("Hi", model="llama3.2"))
    await generates(provider, mock)


async def test_a_stream_without_its_done_line_is_a_protocol_error(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(200, content=b"".join(chat_chunks("m", ["x"])[:-1])))
    with pytest.raises(ProtocolError, match="ended before its done line"):
        await collect(provider.stream("Hi", model="llama3.2"))


async def test_stream_of_a_missing_model_says_pull(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    mock.post(CHAT).mock(return_value=httpx.Response(404, json={"error": "model 'qwen9' not found"}))
    with pytest.raises(ServerModelNotFoundError, match="ollama pull qwen9"):
        await collect(provider.stream("Hi", model="qwen9"))
    await generates(provider, mock)


# Derived model names ---------------------------------------------------------------------------------------

# Ollama's rules (types/model/name.go): parts of 1-80 characters; first an ASCII letter, digit or '_';
# then also '-' and '.', except that a namespace takes no '.'. Names compare case-insensitively.
_OLLAMA_PART = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"
_OLLAMA_NAMESPACE = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}"


@pytest.mark.parametrize("adapter_id", ["a0", "Support_v2", "support_v2", "SUPPORT-V2", "x.y-z", "9lives", "A" * 40])
def test_derived_names_are_valid_ollama_names_that_decode_back(adapter_id: str) -> None:
    name = derived_model_name(adapter_id, "llama3.2")
    namespace, rest = name.split("/")
    model, tag = rest.split(":")
    assert namespace == DERIVED_NAMESPACE
    assert re.fullmatch(_OLLAMA_NAMESPACE, namespace) and re.fullmatch(_OLLAMA_PART, model)
    assert re.fullmatch(_OLLAMA_PART, tag) and tag == base_model_digest("llama3.2")
    assert parse_derived_model_name(name) == (adapter_id, tag, 1)


@pytest.mark.parametrize("adapter_id", ["x", "x_", "X", "x.replaced", "x.replaced-2", "a0.9"])
def test_a_replacements_model_is_a_valid_name_no_id_can_take_and_decodes_to_its_id(adapter_id: str) -> None:
    """The backend name of an id's 2nd weights (``id@2``) gets a model of its own; an id ending like a replacement
    (``x.replaced-2`` was the name of x's) must not share it."""
    name = derived_model_name(f"{adapter_id}@2", "llama3.2")
    namespace, rest = name.split("/")
    model, tag = rest.split(":")
    assert namespace == DERIVED_NAMESPACE and re.fullmatch(_OLLAMA_PART, model) and ".." not in model
    assert parse_derived_model_name(name) == (adapter_id, tag, 2)
    lookalikes = [f"{adapter_id}{end}" for end in (".replaced-2", "_.replaced-2", "_replaced-2", "-2", "_2")]
    assert name not in {derived_model_name(lookalike, "llama3.2") for lookalike in lookalikes}


def test_ids_that_differ_in_case_get_different_models() -> None:
    names = {derived_model_name(adapter_id, "m").lower() for adapter_id in ("Style", "style", "STYLE", "s_tyle")}
    assert len(names) == 4


def test_the_base_is_part_of_the_name_and_its_default_tag_does_not_matter() -> None:
    assert derived_model_name("a", "llama3.2") == derived_model_name("a", "llama3.2:latest")
    assert derived_model_name("a", "llama3.2") == derived_model_name("a", "registry.ollama.ai/library/llama3.2")
    assert derived_model_name("a", "llama3.2") != derived_model_name("a", "llama3.2:1b")


@pytest.mark.parametrize(
    "name", [*USER_MODELS, "inference-lora", "other/a0:abc", "inference-lora/Bad:1", "x/inference-lora/a"]
)
def test_user_models_are_never_taken_for_adapters(name: str) -> None:
    assert parse_derived_model_name(name) is None


def test_an_id_too_long_for_ollama_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="too long for an Ollama model name"):
        derived_model_name("A" * 41, "llama3.2")


# Adapters ---------------------------------------------------------------------------------------------------


async def test_a_gguf_lora_is_uploaded_by_digest_and_the_model_created(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    data = qwen_lora.read_bytes()
    digest = digest_of(data)
    await adapters.load_adapter("a0", qwen_lora)
    assert server.head.calls.last.request.url == f"{ROOT}/api/blobs/{digest}"
    assert server.upload.call_count == 1
    upload = server.upload.calls.last.request
    assert upload.url == f"{ROOT}/api/blobs/{digest}" and upload.read() == data
    assert upload.headers["content-length"] == str(len(data))
    name = f"inference-lora/a0:{base_model_digest(BASE_MODEL)}"
    assert server.creates == [{"model": name, "from": BASE_MODEL, "adapters": {"a0.gguf": digest}}]
    assert await adapters.list_adapters() == ["a0"]
    assert adapters.derived_model("a0") == name


async def test_a_blob_the_server_has_is_not_uploaded_again(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    server.blobs[digest_of(qwen_lora.read_bytes())] = qwen_lora.read_bytes()
    await adapters.load_adapter("a0", qwen_lora)
    assert server.head.call_count == 1 and server.head.calls.last.response.status_code == 200
    assert server.upload.call_count == 0
    assert len(server.creates) == 1


async def test_generate_and_stream_with_an_adapter_use_the_derived_model(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    await adapters.load_adapter("a0", qwen_lora)
    name = adapters.derived_model("a0")
    result = await adapters.generate("Hi", model="ignored", adapter_id="a0", max_tokens=4)
    assert sent(server.chat)["model"] == name
    assert (result.text, result.model, result.adapter_id) == (f"from {name}", name, "a0")
    pieces, streamed = await collect(adapters.stream("Hi", model="ignored", adapter_id="a0"))
    assert sent(server.chat)["model"] == name and sent(server.chat)["stream"] is True
    assert "".join(pieces) == streamed.text == f"from {name}" and streamed.adapter_id == "a0"
    base = await adapters.generate("Hi", model=BASE_MODEL)
    assert (base.model, base.adapter_id) == (BASE_MODEL, None)


async def test_a_peft_directory_on_a_llama_base_is_sent_as_safetensors(
    adapters: OllamaProvider, server: FakeOllama, tiny_models: dict[str, Any]
) -> None:
    adapter_dir = tiny_models["llama"].adapter_dirs["a1"]
    await adapters.load_adapter("a1", adapter_dir, base_model=LLAMA_BASE)
    config = (adapter_dir / "adapter_config.json").read_bytes()
    weights = (adapter_dir / "adapter_model.safetensors").read_bytes()
    name = f"inference-lora/a1:{base_model_digest(LLAMA_BASE)}"
    assert server.creates == [
        {
            "model": name,
            "from": LLAMA_BASE,
            "adapters": {"adapter_config.json": digest_of(config), "adapter_model.safetensors": digest_of(weights)},
        }
    ]
    assert server.uploaded_for(server.creates[0]) == {
        "adapter_config.json": config,
        "adapter_model.safetensors": weights,
    }
    assert sent(server.show) == {"model": LLAMA_BASE}
    assert adapters.derived_model("a1") == name


async def test_a_peft_directory_on_a_qwen2_base_is_converted_to_a_working_gguf_lora(
    adapters: OllamaProvider, server: FakeOllama, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    from inference.adapters.gguf import convert_peft_to_gguf

    model = tiny_models["qwen2"]
    await adapters.load_adapter("a2", model.adapter_dirs["a2"])
    [create] = server.creates
    [(file_name, data)] = server.uploaded_for(create).items()
    assert file_name.endswith(".gguf") and create["from"] == BASE_MODEL
    # The same bytes as converting against the base's GGUF file: /api/show's layout is the file's layout.
    direct = convert_peft_to_gguf(model.adapter_dirs["a2"], model.gguf_path, tmp_path / "direct.gguf")
    assert data == direct.read_bytes()
    # And llama.cpp applies it to the tiny Qwen2: the greedy output changes.
    llama_cpp = pytest.importorskip("llama_cpp")
    uploaded = tmp_path / "uploaded.gguf"
    uploaded.write_bytes(data)

    def greedy(lora: Path | None) -> str:
        llm = llama_cpp.Llama(
            model_path=str(model.gguf_path), lora_path=str(lora) if lora else None, n_ctx=64, verbose=False
        )
        try:
            return str(llm("The quick brown fox", max_tokens=8, temperature=0.0)["choices"][0]["text"])
        finally:
            llm.close()

    assert greedy(uploaded) != greedy(None)


async def test_a_converted_adapter_is_cached(
    adapters: OllamaProvider, server: FakeOllama, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    adapter_dir = tiny_models["qwen2"].adapter_dirs["a0"]
    await adapters.load_adapter("a0", adapter_dir)
    cached = list((tmp_path / "cache").glob("*.gguf"))
    assert len(cached) == 1
    await adapters.unload_adapter("a0")
    before = cached[0].stat().st_mtime_ns
    await adapters.load_adapter("a0", adapter_dir)
    assert list((tmp_path / "cache").glob("*.gguf")) == cached and cached[0].stat().st_mtime_ns == before
    assert server.upload.call_count == 1  # the second load found the blob on the server


async def test_loading_the_same_id_and_path_twice_creates_once(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    await asyncio.gather(adapters.load_adapter("a0", qwen_lora), adapters.load_adapter("a0", qwen_lora))
    await adapters.load_adapter("a0", qwen_lora)
    assert len(server.creates) == 1
    with pytest.raises(AdapterAlreadyLoadedError, match="replace=True"):
        await adapters.load_adapter("a0", qwen_lora.parent)


async def test_a_create_error_line_is_a_typed_error_and_the_provider_stays_usable(
    adapters: OllamaProvider, server: FakeOllama, tiny_models: dict[str, Any]
) -> None:
    server.create_answer = ndjson({"status": "converting adapter"}, {"error": "unsupported architecture"})
    adapter_dir = tiny_models["llama"].adapter_dirs["a0"]
    with pytest.raises(ServerInvalidAdapterError) as caught:
        await adapters.load_adapter("a0", adapter_dir, base_model=LLAMA_BASE)
    assert isinstance(caught.value, InvalidAdapterError)
    assert "unsupported architecture" in str(caught.value) and "'a0'" in str(caught.value)
    assert await adapters.list_adapters() == []
    with pytest.raises(AdapterNotFoundError):
        await adapters.generate("Hi", model=LLAMA_BASE, adapter_id="a0")
    server.create_answer = None
    await adapters.load_adapter("a0", adapter_dir, base_model=LLAMA_BASE)
    assert (await adapters.generate("Hi", model=LLAMA_BASE, adapter_id="a0")).adapter_id == "a0"


async def test_a_create_refused_before_any_line_is_a_typed_error(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    server.create_answer = httpx.Response(400, json={"error": "only one adapter is currently supported"})
    with pytest.raises(ServerInvalidAdapterError, match="only one adapter is currently supported") as caught:
        await adapters.load_adapter("a0", qwen_lora)
    assert caught.value.status_code == 400
    server.create_answer = None
    await adapters.load_adapter("a0", qwen_lora)
    assert await adapters.list_adapters() == ["a0"]


async def test_a_create_stream_without_success_is_a_protocol_error(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    server.create_answer = ndjson({"status": "parsing GGUF"})
    with pytest.raises(ProtocolError, match="success"):
        await adapters.load_adapter("a0", qwen_lora)
    assert await adapters.list_adapters() == []


async def test_a_base_model_that_is_not_pulled_says_pull_it(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    with pytest.raises(ServerModelNotFoundError, match="ollama pull qwen9:7b"):
        await adapters.load_adapter("a0", qwen_lora, base_model="qwen9:7b")
    assert server.creates == [] and server.upload.call_count == 0
    await adapters.load_adapter("a0", qwen_lora)
    assert await adapters.list_adapters() == ["a0"]


async def test_without_a_base_model_load_names_the_keyword_and_variable(
    server: FakeOllama, qwen_lora: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OLLAMA_BASE_MODEL", raising=False)
    async with OllamaProvider(base_url=BASE) as ollama:
        with pytest.raises(ConfigurationError) as caught:
            await ollama.load_adapter("a0", qwen_lora)
        assert "base_model=" in str(caught.value) and "OLLAMA_BASE_MODEL" in str(caught.value)
        assert server.show.call_count == 0 and server.creates == []
        await ollama.load_adapter("a0", qwen_lora, base_model=BASE_MODEL)
        assert server.creates[0]["from"] == BASE_MODEL


async def test_the_base_model_comes_from_the_environment(
    server: FakeOllama, qwen_lora: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLLAMA_BASE_MODEL", BASE_MODEL)
    async with OllamaProvider(base_url=BASE) as ollama:
        await ollama.load_adapter("a0", qwen_lora)
    assert server.creates[0]["from"] == BASE_MODEL


async def test_a_gguf_lora_for_another_architecture_is_refused_before_upload(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    with pytest.raises(InvalidAdapterError, match="qwen2 architecture but base model 'tiny-llama' is llama"):
        await adapters.load_adapter("a0", qwen_lora, base_model=LLAMA_BASE)
    assert server.upload.call_count == 0 and server.creates == []
    await adapters.load_adapter("a0", qwen_lora)


@pytest.mark.parametrize("kind", ["missing", "not-gguf", "gguf-model", "empty-dir"])
async def test_bad_adapter_paths_are_refused(
    adapters: OllamaProvider,
    server: FakeOllama,
    tiny_models: dict[str, Any],
    tmp_path: Path,
    kind: str,
    qwen_lora: Path,
) -> None:
    path = tmp_path / kind
    if kind == "not-gguf":
        path.write_text("not a model")
    elif kind == "gguf-model":
        path = tiny_models["qwen2"].gguf_path
    elif kind == "empty-dir":
        path.mkdir()
    with pytest.raises(InvalidAdapterError) as caught:
        await adapters.load_adapter("bad", path)
    assert str(path) in str(caught.value) and caught.value.provider == "ollama"
    assert server.upload.call_count == 0 and server.creates == []
    await adapters.load_adapter("good", qwen_lora)
    assert await adapters.list_adapters() == ["good"]


async def test_unload_deletes_the_derived_model(adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path) -> None:
    await adapters.load_adapter("a0", qwen_lora)
    name = adapters.derived_model("a0")
    await adapters.unload_adapter("a0")
    assert sent(server.delete) == {"model": name}
    assert name not in server.models
    assert await adapters.list_adapters() == []
    with pytest.raises(AdapterNotFoundError):
        await adapters.generate("Hi", model=BASE_MODEL, adapter_id="a0")
    with pytest.raises(AdapterNotFoundError):
        await adapters.unload_adapter("a0")
    assert server.delete.call_count == 1
    assert all(model in server.models for model in USER_MODELS)


async def test_replace_swaps_the_model(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path, tiny_models: dict[str, Any]
) -> None:
    await adapters.load_adapter("a0", qwen_lora)
    await adapters.load_adapter("a0", tiny_models["qwen2"].adapter_dirs["a1"], replace=True)
    assert server.delete.call_count == 1 and len(server.creates) == 2
    assert server.creates[0]["adapters"] != server.creates[1]["adapters"]
    assert await adapters.list_adapters() == ["a0"]


async def test_derived_model_and_the_base_check_follow_a_replaced_id(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path, tiny_models: dict[str, Any]
) -> None:
    """derived_model('x') of a replaced id used to name its first model, which the replacement deleted; and loading
    it again on another base did nothing instead of asking for replace=True."""
    server.bases["tiny-qwen2-copy"] = server.bases[BASE_MODEL]
    await adapters.load_adapter("x", qwen_lora)
    replacement = tiny_models["qwen2"].adapter_dirs["a1"]
    await adapters.load_adapter("x", replacement, replace=True)
    result = await adapters.generate("Hi", model=BASE_MODEL, adapter_id="x")
    assert adapters.derived_model("x") == result.model and result.model in server.models
    with pytest.raises(AdapterAlreadyLoadedError, match="already applied to base model 'tiny-qwen2'"):
        await adapters.load_adapter("x", replacement, base_model="tiny-qwen2-copy")
    assert [create["from"] for create in server.creates] == [BASE_MODEL, BASE_MODEL]


async def test_a_replacement_never_takes_the_model_of_an_id_named_like_it(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path, tiny_models: dict[str, Any]
) -> None:
    """Replacing 'x' used to create its new model under the name of the user's adapter 'x.replaced-2' (its weights
    were overwritten), and unloading 'x' deleted it: that adapter stayed listed and every request for it failed."""
    await adapters.load_adapter("x.replaced-2", tiny_models["qwen2"].adapter_dirs["a2"])
    theirs = server.creates[-1]["adapters"]
    await adapters.load_adapter("x", qwen_lora)
    await adapters.load_adapter("x", tiny_models["qwen2"].adapter_dirs["a1"], replace=True)
    result = await adapters.generate("Hi", model=BASE_MODEL, adapter_id="x.replaced-2")
    assert server.models[result.model]["adapters"] == theirs  # still its own weights
    await adapters.unload_adapter("x")
    assert await adapters.list_adapters() == ["x.replaced-2"]
    result = await adapters.generate("Hi", model=BASE_MODEL, adapter_id="x.replaced-2")
    assert result.adapter_id == "x.replaced-2" and server.models[result.model]["adapters"] == theirs


async def test_200_generations_through_20_replacements_half_of_them_bad_never_fail_or_mix(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """Every generation runs on the derived model of the weights current when it started; none fails.

    A replace creates the new derived model beside the old one, switches, then deletes the old one once its requests
    finish; a bad path (missing, or no adapter) raises before anything is uploaded and keeps the old model serving.
    """
    good = [str(qwen_lora), *(str(tiny_models["qwen2"].adapter_dirs[name]) for name in ("a1", "a2"))]
    bad = bad_adapter_paths(tmp_path)
    files_of: dict[str, dict[str, str]] = {}  # path -> the blobs its derived model is created from
    for path in good:
        await adapters.load_adapter("reference", path, replace=True)
        files_of[path] = server.creates[-1]["adapters"]
    await adapters.unload_adapter("reference")
    assert len({json.dumps(files) for files in files_of.values()}) == 3  # three different adapters

    await adapters.load_adapter("a0", good[0])
    started_on: list[tuple[str, str]] = []  # (derived model, adapter path) current as each request starts

    async def one(index: int) -> GenerationResult:
        current = adapters.derived_model(adapters._adapter_registry.backend_name("a0"))
        started_on.append((current, adapters._adapter_path("a0") or ""))
        return await adapters.generate(f"prompt {index}", model=BASE_MODEL, adapter_id="a0", max_tokens=4)

    async def generations() -> list[GenerationResult]:
        results: list[GenerationResult] = []
        for start in range(0, 200, 20):
            await after_rounds(rounds, start // 10)  # batch k starts after k good replacements
            results += await asyncio.gather(*(one(index) for index in range(start, start + 20)))
        return results

    rounds: list[str] = []
    replacing = replace_alternately(adapters, "a0", good[1:], bad, outcomes=rounds)
    results, outcomes = await asyncio.gather(generations(), replacing)
    assert outcomes == ["replaced", "refused"] * 10 and len(results) == 200
    created = {create["model"]: create["adapters"] for create in server.creates}
    for (model, path), result in zip(started_on, results, strict=True):
        assert (result.text, result.model, result.adapter_id) == (f"from {model}", model, "a0")
        assert created[model] == files_of[path]  # that model holds the weights that were current
    assert len({model for model, _ in started_on}) > 2  # the generations did run across several replacements
    current = adapters.derived_model(adapters._adapter_registry.backend_name("a0"))
    assert [name for name in server.models if name not in USER_MODELS] == [current]  # the replaced ones are deleted
    assert await adapters.list_adapters() == ["a0"]


def gguf_tensors(data: bytes, directory: Path) -> dict[str, bytes]:
    """A GGUF file's tensors by name, as raw bytes."""
    import gguf

    path = directory / "read.gguf"
    path.write_bytes(data)
    return {tensor.name: bytes(tensor.data.tobytes()) for tensor in gguf.GGUFReader(path).tensors}


async def test_weights_from_memory_upload_what_their_directory_uploads(
    adapters: OllamaProvider, server: FakeOllama, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """``AdapterWeights`` on Ollama: the same GGUF blob as the directory, and the temporary directory is removed."""
    from safetensors.numpy import load_file

    from inference import AdapterWeights

    adapter_dir = tiny_models["qwen2"].adapter_dirs["a1"]
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    weights = AdapterWeights(load_file(adapter_dir / "adapter_model.safetensors"), config)
    await adapters.load_adapter("from-dir", adapter_dir)
    await adapters.load_adapter("from-memory", weights)
    by_id = {create["model"]: server.uploaded_for(create) for create in server.creates}
    from_dir, from_memory = by_id[adapters.derived_model("from-dir")], by_id[adapters.derived_model("from-memory")]
    assert len(from_memory) == len(from_dir) == 1
    tensors = gguf_tensors(*from_memory.values(), tmp_path)
    assert len(tensors) > 0 and tensors == gguf_tensors(*from_dir.values(), tmp_path)  # the same LoRA tensors
    written = Path(adapters._adapter_path("from-memory") or "")
    assert written.is_dir()
    # its conversion lives in its private directory, not in the cache that a training loop would fill
    assert len(list(adapters.adapter_cache_dir.glob("*.gguf"))) == 1 and len(list(written.glob("*.gguf"))) == 1
    result = await adapters.generate("Hi", model=BASE_MODEL, adapter_id="from-memory")
    assert result.model == adapters.derived_model("from-memory")
    await adapters.unload_adapter("from-memory")
    assert not written.exists()


async def test_a_new_provider_finds_adapters_an_earlier_one_created(
    server: FakeOllama, qwen_lora: Path, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    async with OllamaProvider(base_url=BASE, base_model=BASE_MODEL, adapter_cache_dir=tmp_path) as first:
        await first.load_adapter("a0", qwen_lora)
        await first.load_adapter("Style_B", tiny_models["qwen2"].adapter_dirs["a1"])
    async with OllamaProvider(base_url=BASE, base_model=BASE_MODEL) as second:
        assert await second.list_adapters() == ["Style_B", "a0"]  # from /api/tags; user models are not adapters
        result = await second.generate("Hi", model=BASE_MODEL, adapter_id="Style_B")
        assert result.adapter_id == "Style_B" and sent(server.chat)["model"] == first.derived_model("Style_B")
        await second.unload_adapter("a0")
        assert sent(server.delete) == {"model": first.derived_model("a0")}
        assert await second.list_adapters() == ["Style_B"]
        with pytest.raises(AdapterNotFoundError):
            await second.generate("Hi", model=BASE_MODEL, adapter_id="nope")
        # Loading a found adapter from local files creates it again from them.
        await second.load_adapter("Style_B", qwen_lora)
        assert server.creates[-1]["adapters"] == {"a0.gguf": digest_of(qwen_lora.read_bytes())}
    assert all(model in server.models for model in USER_MODELS)


async def test_a_new_provider_sees_a_replaced_adapter_under_its_id(
    server: FakeOllama, qwen_lora: Path, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """A replaced id's model, found on the server by a new process, is that id (it was listed as the id
    'x.replaced-2'): requests for the id use it, a replacement made there is numbered after it, and an unload
    deletes it."""
    async with OllamaProvider(base_url=BASE, base_model=BASE_MODEL, adapter_cache_dir=tmp_path) as first:
        await first.load_adapter("x", qwen_lora)
        await first.load_adapter("x", tiny_models["qwen2"].adapter_dirs["a1"], replace=True)
        replaced = server.creates[-1]["model"]
    assert [name for name in server.models if name not in USER_MODELS] == [replaced]
    async with OllamaProvider(base_url=BASE, base_model=BASE_MODEL, adapter_cache_dir=tmp_path) as second:
        assert await second.list_adapters() == ["x"]
        result = await second.generate("Hi", model=BASE_MODEL, adapter_id="x")
        assert (result.adapter_id, result.model) == ("x", replaced)
        await second.load_adapter("x", tiny_models["qwen2"].adapter_dirs["a2"], replace=True)
        newest = server.creates[-1]["model"]
        assert newest not in (replaced, derived_model_name("x", BASE_MODEL))
        assert [name for name in server.models if name not in USER_MODELS] == [newest]
        assert (await second.generate("Hi", model=BASE_MODEL, adapter_id="x")).model == newest
    async with OllamaProvider(base_url=BASE, base_model=BASE_MODEL, adapter_cache_dir=tmp_path) as third:
        assert (await third.generate("Hi", model=BASE_MODEL, adapter_id="x")).model == newest  # found
        await third.load_adapter("x", qwen_lora)  # created again from these files, in place of the one found
        assert await third.list_adapters() == ["x"]
        await third.unload_adapter("x")
        assert await third.list_adapters() == [] and set(server.models) == set(USER_MODELS)


@pytest.mark.parametrize("replace", [True, False])
async def test_a_first_load_of_an_id_another_process_replaced_replaces_its_model(
    server: FakeOllama, qwen_lora: Path, tiny_models: dict[str, Any], tmp_path: Path, replace: bool
) -> None:
    """A new provider's first ``load_adapter`` of an id whose model on the server is a replaced one
    (``x_.replaced-2``) used to create the id's own model beside it and leave it: other processes then found
    ``x_.replaced-2`` (the newest by number) and answered with the old weights. Now it replaces it, as loading a
    found adapter from local files does (``replace`` or not)."""
    async with OllamaProvider(base_url=BASE, base_model=BASE_MODEL, adapter_cache_dir=tmp_path) as first:
        await first.load_adapter("x", qwen_lora)
        await first.load_adapter("x", tiny_models["qwen2"].adapter_dirs["a1"], replace=True)
    async with OllamaProvider(base_url=BASE, base_model=BASE_MODEL, adapter_cache_dir=tmp_path) as second:
        await second.load_adapter("x", tiny_models["qwen2"].adapter_dirs["a2"], replace=replace)  # nothing before
        newest = server.creates[-1]
    async with OllamaProvider(base_url=BASE, base_model=BASE_MODEL, adapter_cache_dir=tmp_path) as third:
        result = await third.generate("Hi", model=BASE_MODEL, adapter_id="x")
        assert server.uploaded_for(server.models[result.model]) == server.uploaded_for(newest)  # a2's weights
        assert [name for name in server.models if name not in USER_MODELS] == [newest["model"]]
        await third.unload_adapter("x")
    assert set(server.models) == set(USER_MODELS)


async def test_a_new_provider_prefers_the_derived_model_on_its_own_base(
    server: FakeOllama, qwen_lora: Path, tiny_models: dict[str, Any]
) -> None:
    async with OllamaProvider(base_url=BASE, base_model=BASE_MODEL) as first:
        await first.load_adapter("a0", qwen_lora)
        await first.load_adapter("b0", tiny_models["llama"].adapter_dirs["a0"], base_model=LLAMA_BASE)
    server.models[f"inference-lora/a0:{base_model_digest(LLAMA_BASE)}"] = {}
    async with OllamaProvider(base_url=BASE, base_model=BASE_MODEL) as second:
        await second.generate("Hi", model=BASE_MODEL, adapter_id="a0")
        assert sent(server.chat)["model"] == f"inference-lora/a0:{base_model_digest(BASE_MODEL)}"
        await second.generate("Hi", model=BASE_MODEL, adapter_id="b0")
        assert sent(server.chat)["model"] == f"inference-lora/b0:{base_model_digest(LLAMA_BASE)}"


async def test_a_derived_model_deleted_behind_our_back_is_created_again(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    await adapters.load_adapter("a0", qwen_lora)
    name = adapters.derived_model("a0")
    del server.models[name]  # `ollama rm` by someone else
    result = await adapters.generate("Hi", model=BASE_MODEL, adapter_id="a0")
    assert result.text == f"from {name}" and len(server.creates) == 2 and name in server.models
    del server.models[name]
    _, streamed = await collect(adapters.stream("Hi", model=BASE_MODEL, adapter_id="a0"))
    assert streamed.text == f"from {name}" and len(server.creates) == 3


async def test_a_lost_derived_model_whose_files_changed_since_is_not_created_again(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path, tmp_path: Path
) -> None:
    lora = tmp_path / "step.gguf"
    shutil.copyfile(qwen_lora, lora)
    await adapters.load_adapter("a0", lora)
    del server.models[adapters.derived_model("a0")]  # `ollama rm` by someone else
    with lora.open("ab") as file:
        file.write(b"\0")  # and the file was rewritten in place since (here: one byte longer)
    with pytest.raises(InvalidAdapterError, match=r"changed since it was loaded.*replace=True"):
        await adapters.generate("Hi", model=BASE_MODEL, adapter_id="a0")
    assert len(server.creates) == 1  # never created again from other weights under the id


async def test_adapter_ops_report_a_server_that_is_down(qwen_lora: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with OllamaProvider(base_url=f"http://127.0.0.1:{port}/v1", base_model=BASE_MODEL, max_retries=0) as ollama:
        with pytest.raises(ProviderUnavailableError):
            await ollama.load_adapter("a0", qwen_lora)
        with pytest.raises(ProviderUnavailableError):
            await ollama.list_adapters()


async def test_an_upload_answered_503_is_sent_again_whole(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    real_upload = server._post_blob
    answers = iter([httpx.Response(503)])

    def flaky(request: httpx.Request, digest: str) -> httpx.Response:
        return next(answers, None) or real_upload(request, digest)

    server.upload.mock(side_effect=flaky)
    await adapters.load_adapter("a0", qwen_lora)
    assert server.upload.call_count == 2
    assert server.blobs[digest_of(qwen_lora.read_bytes())] == qwen_lora.read_bytes()


async def test_the_same_adapter_on_another_base_needs_replace(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    server.bases["tiny-qwen2-copy"] = server.bases[BASE_MODEL]
    await adapters.load_adapter("a0", qwen_lora, base_model=BASE_MODEL)
    await adapters.load_adapter("a0", qwen_lora, base_model=f"{BASE_MODEL}:latest")  # the same model: no-op
    assert len(server.creates) == 1
    with pytest.raises(AdapterAlreadyLoadedError, match="already applied to base model 'tiny-qwen2'"):
        await adapters.load_adapter("a0", qwen_lora, base_model="tiny-qwen2-copy")
    await adapters.load_adapter("a0", qwen_lora, base_model="tiny-qwen2-copy", replace=True)
    assert [create["from"] for create in server.creates] == [BASE_MODEL, "tiny-qwen2-copy"]
    assert adapters.derived_model("a0") == derived_model_name("a0", "tiny-qwen2-copy")
    assert await adapters.list_adapters() == ["a0"]


async def test_a_replacement_is_created_on_the_base_its_load_names(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path, tiny_models: dict[str, Any]
) -> None:
    """The base travels with the load (the adapter's source), also to the replacement's versioned backend name: the
    new weights are not created on the provider's default base."""
    server.bases["tiny-qwen2-copy"] = server.bases[BASE_MODEL]
    await adapters.load_adapter("a0", qwen_lora, base_model="tiny-qwen2-copy")
    replacement = tiny_models["qwen2"].adapter_dirs["a1"]
    await adapters.load_adapter("a0", replacement, base_model="tiny-qwen2-copy", replace=True)
    assert [create["from"] for create in server.creates] == ["tiny-qwen2-copy", "tiny-qwen2-copy"]
    assert await adapters.list_adapters() == ["a0"]


async def test_concurrent_loads_each_create_on_the_base_they_asked_for(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    server.bases["tiny-qwen2-copy"] = server.bases[BASE_MODEL]
    await asyncio.gather(
        adapters.load_adapter("a0", qwen_lora, base_model=BASE_MODEL),
        adapters.load_adapter("a1", qwen_lora, base_model="tiny-qwen2-copy"),
    )
    assert sorted((create["model"], create["from"]) for create in server.creates) == sorted(
        [
            (derived_model_name("a0", BASE_MODEL), BASE_MODEL),
            (derived_model_name("a1", "tiny-qwen2-copy"), "tiny-qwen2-copy"),
        ]
    )


async def test_concurrent_loads_of_one_id_on_two_bases_do_not_mix_them(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    server.bases["tiny-qwen2-copy"] = server.bases[BASE_MODEL]
    first, second = await asyncio.gather(
        adapters.load_adapter("a0", qwen_lora, base_model=BASE_MODEL),
        adapters.load_adapter("a0", qwen_lora, base_model="tiny-qwen2-copy"),
        return_exceptions=True,
    )
    assert first is None and isinstance(second, AdapterAlreadyLoadedError)
    assert [create["from"] for create in server.creates] == [BASE_MODEL]
    await asyncio.gather(
        adapters.load_adapter("a0", qwen_lora, base_model=BASE_MODEL),
        adapters.load_adapter("a0", qwen_lora, base_model="tiny-qwen2-copy", replace=True),
    )
    assert [create["from"] for create in server.creates] == [BASE_MODEL, "tiny-qwen2-copy"]
    assert adapters.derived_model("a0") == derived_model_name("a0", "tiny-qwen2-copy")
    assert derived_model_name("a0", BASE_MODEL) not in server.models


# Listing from a new process, missing routes, URLs, malformed answers, cancellation -----------------------------


def ollama_tags(*names: str) -> httpx.Response:
    """``GET /api/tags`` exactly as Ollama 0.33 answers it (``ListResponse``): one entry per model."""
    models = [
        {
            "name": name,
            "model": name,
            "modified_at": "2026-01-01T00:00:00.000000000Z",
            "size": 2019393189,
            "digest": hashlib.sha256(name.encode()).hexdigest(),
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": "qwen2",
                "families": ["qwen2"],
                "parameter_size": "494.03M",
                "quantization_level": "Q4_K_M",
            },
        }
        for name in names
    ]
    return httpx.Response(200, json={"models": models})


async def test_a_new_provider_lists_the_adapters_an_earlier_process_created(mock: respx.MockRouter) -> None:
    """``inference adapters list`` in a new process, with no base model configured: derived models only."""
    derived = [derived_model_name("Style_B", "llama3.2"), derived_model_name("support", "qwen2.5:0.5b")]
    mock.get(f"{ROOT}/api/tags").mock(return_value=ollama_tags("llama3.2:latest", *derived, "myteam/assistant:v1"))
    async with OllamaProvider(base_url=BASE) as fresh:
        assert await fresh.list_adapters() == ["Style_B", "support"]


GIN_404 = httpx.Response(404, text="404 page not found", headers={"content-type": "text/plain"})
"""What Ollama (gin) answers for a route it does not have: plain text, not its JSON ``{"error": ...}``."""


async def test_a_route_ollama_lacks_is_not_taken_for_a_missing_model(
    adapters: OllamaProvider, mock: respx.MockRouter, qwen_lora: Path
) -> None:
    """Gin's ``404 page not found`` (an old Ollama, or another server) says the route is missing."""
    routes = {
        route: mock.route(method=method, url=f"{ROOT}{route}").mock(return_value=GIN_404)
        for method, route in (("POST", "/api/chat"), ("POST", "/api/show"), ("DELETE", "/api/delete"),
                              ("GET", "/api/tags"))
    }
    with pytest.raises(ServerResponseError, match="has no Ollama native API") as chat:
        await adapters.generate("Hi", model="llama3.2")
    assert not isinstance(chat.value, ModelNotFoundError)
    with pytest.raises(ServerResponseError, match="has no route /api/tags") as tags:  # a first load asks it first
        await adapters.load_adapter("a0", qwen_lora)
    assert not isinstance(tags.value, ModelNotFoundError) and "ollama pull" not in str(tags.value)
    routes["/api/tags"].mock(return_value=ollama_tags())
    with pytest.raises(ServerResponseError, match="has no route /api/show") as show:
        await adapters.load_adapter("a0", qwen_lora)
    assert not isinstance(show.value, ModelNotFoundError) and "ollama pull" not in str(show.value)
    routes["/api/tags"].mock(return_value=GIN_404)
    with pytest.raises(ServerResponseError, match="has no route /api/tags"):
        await adapters.list_adapters()
    with pytest.raises(ServerResponseError, match="has no route /api/delete"):  # not "already gone"
        await adapters._models.delete(derived_model_name("a0", BASE_MODEL))


async def test_a_create_route_ollama_lacks_is_not_an_invalid_adapter(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    server.create_answer = GIN_404
    with pytest.raises(ServerResponseError, match="has no route /api/create") as caught:
        await adapters.load_adapter("a0", qwen_lora)
    assert not isinstance(caught.value, InvalidAdapterError)
    assert await adapters.list_adapters() == []


async def test_a_model_ollama_does_not_have_is_still_a_missing_model(
    adapters: OllamaProvider, server: FakeOllama
) -> None:
    with pytest.raises(ServerModelNotFoundError, match="ollama pull nope"):
        await adapters.generate("Hi", model="nope")
    assert await adapters._models.delete("nope") is False  # its JSON 404: already gone


@pytest.mark.parametrize("url", ["http://ollama.test:port/v1", "http://:11434/v1", "http://ollama\x07.test/v1"])
def test_a_base_url_no_request_can_use_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="base_url") as caught:
        OllamaProvider(base_url=url)
    assert caught.value.url == url


async def test_a_show_answer_with_malformed_tensors_is_a_protocol_error(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path
) -> None:
    server.bases[BASE_MODEL] = {**server.bases[BASE_MODEL], "tensors": 12}
    with pytest.raises(ProtocolError, match="tensors are not a list"):
        await adapters.load_adapter("a0", qwen_lora)


async def test_cancelling_generate_closes_the_response(provider: OllamaProvider, mock: respx.MockRouter) -> None:
    """The model is still thinking when the caller gives up: the response is closed, so Ollama stops."""
    body = EndlessStream()
    route = mock.post(CHAT).mock(return_value=httpx.Response(200, stream=body))
    task = asyncio.create_task(provider.generate("Hi", model="llama3.2"))
    while not route.called or body.sent < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert body.closed.is_set()
    await generates(provider, mock)


def test_a_cached_provider_serves_concurrent_loads_from_a_second_event_loop(
    server: FakeOllama, qwen_lora: Path, tmp_path: Path
) -> None:
    """A provider kept by get_provider outlives one asyncio.run; its locks must not stay bound to the first loop."""
    provider = OllamaProvider(base_url=BASE, max_retries=1, base_model=BASE_MODEL, adapter_cache_dir=tmp_path / "c")

    async def load_twice_at_once(unload_first: bool) -> list[str]:
        if unload_first:
            await provider.unload_adapter("a0")
        await asyncio.gather(provider.load_adapter("a0", qwen_lora), provider.load_adapter("a0", qwen_lora))
        return await provider.list_adapters()

    assert asyncio.run(load_twice_at_once(False)) == ["a0"]
    assert asyncio.run(load_twice_at_once(True)) == ["a0"]  # before: RuntimeError, bound to a different loop
    assert [create["from"] for create in server.creates] == [BASE_MODEL, BASE_MODEL]


# Thinking models (message.thinking, the think field) --------------------------------------------------------


def thinking_line(thinking: str, content: str = "", *, done: bool = False) -> dict[str, Any]:
    """A line of Ollama's /api/chat answer for a thinking model: api.Message has Thinking beside Content."""
    line: dict[str, Any] = {
        "model": "qwen3:0.6b",
        "created_at": "2026-01-01T00:00:00Z",
        "message": {"role": "assistant", "content": content, **({"thinking": thinking} if thinking else {})},
        "done": done,
    }
    if done:
        line |= {"done_reason": "stop", "prompt_eval_count": 12, "eval_count": 9}
    return line


async def test_a_thinking_model_s_reasoning_is_kept_apart_from_the_text(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    reply = thinking_line("The user says hi. I should greet back.", "Hello!", done=True)
    mock.post(CHAT).mock(return_value=httpx.Response(200, json=reply))
    result = await provider.generate("Hi", model="qwen3:0.6b")
    assert (result.text, result.reasoning) == ("Hello!", "The user says hi. I should greet back.")


async def test_a_stream_gathers_the_reasoning_and_yields_only_the_answer(
    provider: OllamaProvider, mock: respx.MockRouter
) -> None:
    lines = [thinking_line("The user"), thinking_line(" greets."), thinking_line("", "Hel"), thinking_line("", "lo")]
    mock.post(CHAT).mock(return_value=ndjson(*lines, thinking_line("", "", done=True)))
    pieces, result = await collect(provider.stream("Hi", model="qwen3:0.6b"))
    assert pieces == ["Hel", "lo"]
    assert (result.text, result.reasoning) == ("Hello", "The user greets.")


@pytest.mark.parametrize(("think", "sent_value"), [("auto", None), ("false", False), ("true", True), ("high", "high")])
async def test_thinking_can_be_turned_off(mock: respx.MockRouter, think: str, sent_value: Any) -> None:
    route = mock.post(CHAT).mock(return_value=chat_reply("Hello!"))
    async with OllamaProvider(base_url=BASE, think=think) as ollama:
        assert (await ollama.generate("Hi", model="qwen3:0.6b")).reasoning is None
    assert sent(route).get("think") == sent_value
    assert ("think" in sent(route)) == (think != "auto")


async def test_credentials_in_the_base_url_never_reach_an_error_message(mock: respx.MockRouter) -> None:
    """Configuration promises ``***`` wherever the URL appears, the native API's messages included."""
    secret_base = "http://alice:s3cr3tPW@ollama.test:11434/v1"
    chat = mock.post(CHAT)
    async with OllamaProvider(base_url=secret_base, max_retries=0) as provider:
        chat.mock(return_value=GIN_404)
        with pytest.raises(ServerResponseError, match="has no Ollama native API") as missing:
            await provider.generate("Hi", model="llama3.2")
        with pytest.raises(ServerResponseError, match="has no Ollama native API") as streamed:
            async for _ in provider.stream("Hi", model="llama3.2"):
                pass
        chat.mock(return_value=httpx.Response(400, json={"error": "invalid JSON schema in format"}))
        with pytest.raises(InvalidRequestError, match="could not use the json_schema") as schema:
            await provider.generate("Hi", model="llama3.2", json_schema={"type": "object"})
    for error in (missing.value, streamed.value, schema.value):
        assert "s3cr3tPW" not in str(error) and "http://***@ollama.test:11434" in str(error), str(error)


@pytest.mark.parametrize("several", [f"{BASE},http://ollama-2.test:11434/v1", [BASE, "http://ollama-2.test:11434/v1"]])
async def test_several_base_urls_are_refused_as_ollama_has_no_replicas(
    several: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request would go to one wrong path (``/v1,http://...``): refused when the provider is built."""
    with pytest.raises(ConfigurationError, match="holds several URLs, but this provider talks to one server"):
        OllamaProvider(base_url=several)
    monkeypatch.setenv("OLLAMA_BASE_URL", f"{BASE},http://ollama-2.test:11434/v1")
    with pytest.raises(ConfigurationError, match=r"environment variable OLLAMA_BASE_URL .* holds several URLs"):
        OllamaProvider()


@pytest.mark.parametrize(
    "spelling", ["TINY-QWEN2", "library/tiny-qwen2", "registry.ollama.ai/library/tiny-qwen2:latest"]
)
async def test_the_same_base_spelled_another_way_is_the_same_base(
    adapters: OllamaProvider, server: FakeOllama, qwen_lora: Path, spelling: str
) -> None:
    """They make the same derived model: loading again on it is a no-op, not a clash (nor, with replace, a
    re-creation)."""
    await adapters.load_adapter("a0", qwen_lora, base_model=BASE_MODEL)
    await adapters.load_adapter("a0", qwen_lora, base_model=spelling)
    assert len(server.creates) == 1 and adapters.derived_model("a0") == derived_model_name("a0", BASE_MODEL)


async def test_health_asks_the_native_api_this_provider_talks_to(mock: respx.MockRouter) -> None:
    """An OpenAI-compatible server at Ollama's URL answers ``/v1/models`` but cannot serve: it is down."""
    mock.get(f"{BASE}/models").respond(200, json={"object": "list", "data": [{"id": "llama3.2:latest"}]})
    tags = mock.get(f"{ROOT}/api/tags")
    async with OllamaProvider(base_url=BASE, max_retries=0) as provider:
        tags.mock(return_value=ollama_tags("llama3.2:latest"))
        health = await provider.health(timeout=2)
        assert (health.status, health.backends[0].models) == ("up", ("llama3.2:latest",))
        tags.mock(return_value=GIN_404)
        health = await provider.health(timeout=2)
        assert health.status == "down" and "no Ollama native API" in (health.backends[0].error or "")


@pytest.mark.parametrize("spelled", [f"{BASE},", f" {BASE} , ", f",{BASE}", [BASE]])
async def test_one_base_url_with_a_stray_comma_is_one_url(spelled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trailing comma (as a templated ``.env`` leaves) names one server: taken, not refused as several."""
    assert OllamaProvider(base_url=spelled).base_url == BASE
    if isinstance(spelled, str):
        monkeypatch.setenv("OLLAMA_BASE_URL", spelled)
        assert OllamaProvider().base_url == BASE
