"""The shared HTTP plumbing: pooled client per event loop, bounded retries, error translation."""

from __future__ import annotations

import asyncio
import email.utils
import json
import re
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx

from inference._servers.http import (
    RetryPolicy,
    ServerAnswer,
    ServerClient,
    check_base_url,
    is_connect_failure,
    is_route_missing,
    server_root,
)
from inference._servers.transport import POOL_SHARDS
from inference.exceptions import (
    ConfigurationError,
    InferenceError,
    InvalidRequestError,
    ProtocolError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    ServerModelNotFoundError,
    ServerResponseError,
)

BASE = "http://server.test:9000/v1"
FAST = RetryPolicy(backoff_base=0.001, backoff_max=0.002, retry_after_max=0.01)


def make_client(max_retries: int = 2, **kwargs: object) -> ServerClient:
    return ServerClient(
        provider="demo",
        server="Demo",
        base_url=BASE,
        timeout=5.0,
        max_retries=max_retries,
        env_prefix="DEMO",
        retry_policy=FAST,
        **kwargs,  # type: ignore[arg-type]
    )


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("base_url", "root"),
    [
        ("http://h:8100/v1", "http://h:8100"),
        ("http://h:8100/v1/", "http://h:8100"),
        ("http://h:8100", "http://h:8100"),
        ("https://proxy.example/vllm/v1", "https://proxy.example/vllm"),
    ],
)
def test_server_root_strips_the_v1_suffix_only(base_url: str, root: str) -> None:
    assert server_root(base_url) == root


def test_backoff_doubles_and_is_capped() -> None:
    policy = RetryPolicy(backoff_base=0.1, backoff_max=0.3)
    first, second, late = policy.delay(0), policy.delay(1), policy.delay(10)
    assert 0.075 <= first <= 0.1
    assert 0.15 <= second <= 0.2
    assert 0.225 <= late <= 0.3


def test_retry_after_is_honoured_and_capped() -> None:
    policy = RetryPolicy(retry_after_max=5.0)
    assert policy.delay(0, "2") == 2.0
    assert policy.delay(0, "3600") == 5.0
    assert policy.delay(0, "-4") == 0.0
    in_two_seconds = email.utils.formatdate(time.time() + 2, usegmt=True)
    assert 0.0 <= policy.delay(0, in_two_seconds) <= 2.0
    assert policy.delay(0, "soon") <= policy.backoff_base  # unparseable: plain backoff
    assert policy.delay(0, "nan") <= policy.backoff_base


async def test_503_then_200_succeeds_after_one_retry() -> None:
    client = make_client()
    with respx.mock:
        route = respx.post(f"{BASE}/thing").mock(
            side_effect=[httpx.Response(503), httpx.Response(200, json={"ok": True})]
        )
        response = await client.request("POST", f"{BASE}/thing", operation="do the thing", json_body={"a": 1})
    assert response.json() == {"ok": True}
    assert route.call_count == 2
    assert [json.loads(call.request.content) for call in route.calls] == [{"a": 1}, {"a": 1}]
    await client.aclose()


@pytest.mark.parametrize("status", [429, 502, 503, 504])
async def test_transient_status_forever_gives_up_after_max_retries_plus_one(status: int) -> None:
    client = make_client(max_retries=2)
    with respx.mock:
        route = respx.post(f"{BASE}/thing").mock(return_value=httpx.Response(status, text="busy"))
        with pytest.raises(ServerResponseError) as caught:
            await client.request("POST", f"{BASE}/thing", operation="do the thing")
    assert route.call_count == 3
    error = caught.value
    assert isinstance(error, httpx.HTTPStatusError)
    assert error.response.status_code == status and error.status_code == status
    assert error.request.url == f"{BASE}/thing"
    assert "tried 3 times" in str(error) and BASE in str(error)
    await client.aclose()


@pytest.mark.parametrize("status", [400, 401, 404, 422, 500])
async def test_other_statuses_are_not_retried(status: int) -> None:
    client = make_client(max_retries=3)
    with respx.mock:
        route = respx.post(f"{BASE}/thing").mock(return_value=httpx.Response(status, json={"error": "nope"}))
        with pytest.raises(ServerResponseError) as caught:
            await client.request("POST", f"{BASE}/thing", operation="do the thing")
    assert route.call_count == 1
    assert caught.value.status_code == status
    assert "nope" in str(caught.value)
    await client.aclose()


async def test_retry_after_header_is_used_between_attempts() -> None:
    client = make_client(max_retries=1)
    with respx.mock:
        route = respx.get(f"{BASE}/thing").mock(
            side_effect=[httpx.Response(429, headers={"Retry-After": "0"}), httpx.Response(200, text="ok")]
        )
        response = await client.request("GET", f"{BASE}/thing", operation="read")
    assert response.text == "ok" and route.call_count == 2
    await client.aclose()


async def test_max_retries_zero_sends_once() -> None:
    client = make_client(max_retries=0)
    with respx.mock:
        route = respx.post(f"{BASE}/thing").mock(return_value=httpx.Response(503))
        with pytest.raises(ServerResponseError):
            await client.request("POST", f"{BASE}/thing", operation="do the thing")
    assert route.call_count == 1
    await client.aclose()


async def test_connect_errors_are_retried_then_reported_as_unavailable() -> None:
    client = make_client(max_retries=2)
    with respx.mock:
        route = respx.post(f"{BASE}/thing").mock(side_effect=httpx.ConnectError("Connection refused"))
        with pytest.raises(ProviderUnavailableError) as caught:
            await client.request("POST", f"{BASE}/thing", operation="do the thing")
    assert route.call_count == 3
    assert BASE in str(caught.value) and "DEMO_BASE_URL" in str(caught.value)
    assert caught.value.url == BASE and caught.value.provider == "demo"
    assert isinstance(caught.value, ConnectionError)
    await client.aclose()


async def test_connect_error_then_success_recovers() -> None:
    client = make_client(max_retries=1)
    with respx.mock:
        route = respx.get(f"{BASE}/thing").mock(
            side_effect=[httpx.ConnectError("refused"), httpx.Response(200, text="up")]
        )
        response = await client.request("GET", f"{BASE}/thing", operation="read")
    assert response.text == "up" and route.call_count == 2
    await client.aclose()


async def test_connection_refused_by_a_real_closed_port_names_the_url() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    client = ServerClient(provider="demo", server="Demo", base_url=url, timeout=5.0, max_retries=2, env_prefix="DEMO")
    with pytest.raises(ProviderUnavailableError) as caught:
        await client.request("GET", f"{url}/models", operation="list models")
    assert url in str(caught.value)
    assert "start the Demo server" in str(caught.value)
    await client.aclose()


async def test_read_timeout_is_a_provider_timeout_and_not_retried() -> None:
    client = make_client(max_retries=2)
    with respx.mock:
        route = respx.post(f"{BASE}/thing").mock(side_effect=httpx.ReadTimeout("slow"))
        with pytest.raises(ProviderTimeoutError) as caught:
            await client.request("POST", f"{BASE}/thing", operation="do the thing")
    assert route.call_count == 1
    assert "within 5 s" in str(caught.value) and "DEMO_TIMEOUT" in str(caught.value)
    assert isinstance(caught.value, TimeoutError)
    await client.aclose()


async def test_connect_timeout_says_it_could_not_connect() -> None:
    client = make_client(max_retries=0)
    with respx.mock:
        respx.post(f"{BASE}/thing").mock(side_effect=httpx.ConnectTimeout("no route"))
        with pytest.raises(ProviderTimeoutError, match="accept a connection"):
            await client.request("POST", f"{BASE}/thing", operation="do the thing")
    await client.aclose()


async def test_malformed_json_is_a_protocol_error() -> None:
    client = make_client()
    with respx.mock:
        respx.get(f"{BASE}/thing").mock(
            return_value=httpx.Response(200, content=b"{oops", headers={"content-type": "application/json"})
        )
        response = await client.request("GET", f"{BASE}/thing", operation="read the thing")
    with pytest.raises(ProtocolError, match="malformed JSON") as caught:
        client.parse_json(response, operation="read the thing")
    assert "DEMO_BASE_URL" in str(caught.value)
    await client.aclose()


async def test_json_nested_too_deeply_is_malformed_not_a_recursion_error() -> None:
    """A hostile or broken server's JSON nested 100,000 deep: json raises RecursionError, which escaped raw."""
    client = make_client(max_retries=0)
    deep = b"[" * 100_000 + b"]" * 100_000
    with respx.mock:
        respx.get(f"{BASE}/thing").mock(return_value=httpx.Response(200, content=deep))
        respx.get(f"{BASE}/error").mock(return_value=httpx.Response(404, content=deep))
        respx.post(f"{BASE}/lines").mock(return_value=httpx.Response(200, stream=LineStream([deep + b"\n"])))
        response = await client.request("GET", f"{BASE}/thing", operation="read the thing")
        with pytest.raises(ProtocolError, match="malformed JSON"):
            client.parse_json(response, operation="read the thing")
        with pytest.raises(ServerResponseError, match="404"):
            await client.request("GET", f"{BASE}/error", operation="read the error")
        with pytest.raises(ProtocolError, match="a line that is not JSON"):
            await read_all(client, f"{BASE}/lines")
    await client.aclose()


async def test_handlers_choose_the_error_by_status_and_fall_back_to_the_generic_one() -> None:
    client = make_client()

    def not_found(answer: ServerAnswer) -> ServerResponseError | None:
        if answer.route_missing:
            return None
        return answer.error(ServerModelNotFoundError, f"no model: {answer.message}")

    with respx.mock:
        respx.get(f"{BASE}/model").mock(
            return_value=httpx.Response(404, json={"error": {"message": "model `m` missing", "code": 404}})
        )
        respx.get(f"{BASE}/nowhere").mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
        with pytest.raises(ServerModelNotFoundError, match="no model: model `m` missing"):
            await client.request("GET", f"{BASE}/model", operation="read", handlers={404: not_found})
        with pytest.raises(ServerResponseError) as caught:
            await client.request("GET", f"{BASE}/nowhere", operation="read", handlers={404: not_found})
    assert type(caught.value) is ServerResponseError
    assert "has no route /v1/nowhere" in str(caught.value)
    await client.aclose()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"error": {"message": "vLLM style", "type": "BadRequestError", "param": None, "code": 400}}, "vLLM style"),
        ({"object": "error", "message": "old vLLM style", "code": 400}, "old vLLM style"),
        ({"error": "Ollama style"}, "Ollama style"),
        ({"detail": [{"loc": ["body", "x"], "msg": "field required"}]}, "field required"),
    ],
)
async def test_server_messages_are_quoted_in_errors(body: object, message: str) -> None:
    client = make_client()
    with respx.mock:
        respx.post(f"{BASE}/thing").mock(return_value=httpx.Response(400, json=body))
        with pytest.raises(ServerResponseError) as caught:
            await client.request("POST", f"{BASE}/thing", operation="do the thing")
    assert message in str(caught.value)
    assert "Demo at http://server.test:9000/v1 answered 400 Bad Request to do the thing" in str(caught.value)
    await client.aclose()


async def test_plain_text_error_bodies_are_quoted() -> None:
    client = make_client()
    with respx.mock:
        respx.post(f"{BASE}/thing").mock(return_value=httpx.Response(500, text="Internal Server Error"))
        with pytest.raises(ServerResponseError, match=r"Internal Server Error\. The server failed"):
            await client.request("POST", f"{BASE}/thing", operation="do the thing")
    await client.aclose()


async def test_the_client_is_pooled_on_one_loop_and_remade_after_aclose() -> None:
    client = make_client()
    first = client.client()
    assert client.client() is first
    await client.aclose()
    assert first.is_closed
    second = client.client()
    assert second is not first and not second.is_closed
    await client.aclose()


def test_a_new_event_loop_gets_a_new_client() -> None:
    """A cached provider reused across ``asyncio.run`` calls must not touch the old loop's connections."""
    client = make_client()

    async def use() -> tuple[httpx.AsyncClient, str]:
        response = await client.request("GET", f"{BASE}/thing", operation="read")
        return client.client(), response.text

    with respx.mock:
        respx.get(f"{BASE}/thing").mock(return_value=httpx.Response(200, text="ok"))
        first, text1 = asyncio.run(use())
        second, text2 = asyncio.run(use())
    assert (text1, text2) == ("ok", "ok")
    assert second is not first
    asyncio.run(client.aclose())


async def test_secret_headers_are_sent_but_never_shown() -> None:
    client = make_client(headers={"Authorization": "Bearer sk-very-secret"})
    with respx.mock:
        route = respx.post(f"{BASE}/thing").mock(return_value=httpx.Response(401, json={"error": "bad key"}))
        with pytest.raises(ServerResponseError) as caught:
            await client.request("POST", f"{BASE}/thing", operation="do the thing")
    assert route.calls.last.request.headers["authorization"] == "Bearer sk-very-secret"
    assert "sk-very-secret" not in str(caught.value) + repr(caught.value) + repr(client)
    assert "check the API key" in str(caught.value)
    await client.aclose()


def test_connect_failures_are_told_apart_from_failures_after_sending() -> None:
    request = httpx.Request("POST", f"{BASE}/thing")
    assert is_connect_failure(httpx.ConnectError("refused", request=request))
    assert is_connect_failure(httpx.ConnectTimeout("no route", request=request))
    wrapped = RuntimeError("openai's APIConnectionError")
    wrapped.__cause__ = httpx.ConnectError("refused", request=request)
    assert is_connect_failure(wrapped)
    assert not is_connect_failure(httpx.ReadError("reset", request=request))
    assert not is_connect_failure(httpx.RemoteProtocolError("Server disconnected", request=request))
    assert not is_connect_failure(httpx.ReadTimeout("slow", request=request))


async def test_a_connection_dropped_after_sending_says_so_and_is_not_retried() -> None:
    client = make_client(max_retries=2)
    with respx.mock:
        route = respx.post(f"{BASE}/thing").mock(
            side_effect=httpx.RemoteProtocolError("Server disconnected without sending a response.")
        )
        with pytest.raises(ProviderUnavailableError) as caught:
            await client.request("POST", f"{BASE}/thing", operation="do the thing")
    assert route.call_count == 1  # the server may have acted on it: never resent
    assert "Demo at http://server.test:9000/v1 dropped the connection during do the thing" in str(caught.value)
    assert "Server disconnected" in str(caught.value)
    await client.aclose()


@pytest.mark.parametrize(
    "dropped",
    [httpx.RemoteProtocolError("Server disconnected without sending a response."),
     httpx.ReadError("[Errno 104] Connection reset by peer")],
)
async def test_a_get_whose_connection_dropped_is_asked_again(dropped: Exception) -> None:
    """A kept-alive connection the server closed or reset as it was reused (llama-server under load): a GET changes
    nothing on the server, so it is sent again, as a connect error is."""
    client = make_client(max_retries=2)
    with respx.mock:
        route = respx.get(f"{BASE}/lora-adapters").mock(side_effect=[dropped, httpx.Response(200, json=[])])
        response = await client.request("GET", f"{BASE}/lora-adapters", operation="list the server's LoRA adapters")
    assert response.json() == [] and route.call_count == 2
    await client.aclose()


class LineStream(httpx.AsyncByteStream):
    def __init__(self, lines: list[bytes], *, then_fail: Exception | None = None) -> None:
        self.lines = lines
        self.then_fail = then_fail
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for line in self.lines:
            yield line
        if self.then_fail is not None:
            raise self.then_fail

    async def aclose(self) -> None:
        self.closed = True


async def test_stream_json_lines_yields_each_ndjson_line() -> None:
    client = make_client()
    body = LineStream([b'{"status": "pulling"}\n{"status": ', b'"verifying"}\n\n', b'{"status": "success"}\n'])
    with respx.mock:
        route = respx.post(f"{BASE}/create").mock(return_value=httpx.Response(200, stream=body))
        async with client.stream_json_lines(
            "POST", f"{BASE}/create", operation="create", json_body={"model": "m"}
        ) as lines:
            items = [item async for item in lines]
    assert items == [{"status": "pulling"}, {"status": "verifying"}, {"status": "success"}]
    assert json.loads(route.calls.last.request.content) == {"model": "m"}
    assert body.closed
    await client.aclose()


async def test_stream_json_lines_leaving_early_closes_the_response() -> None:
    client = make_client()
    body = LineStream([b'{"n": 1}\n', b'{"n": 2}\n', b'{"n": 3}\n'])
    with respx.mock:
        respx.post(f"{BASE}/chat").mock(return_value=httpx.Response(200, stream=body))
        async with client.stream_json_lines("POST", f"{BASE}/chat", operation="chat") as lines:
            async for item in lines:
                assert item == {"n": 1}
                break
        assert body.closed
    await client.aclose()


async def read_all(client: ServerClient, url: str, **options: Any) -> list[Any]:
    async with client.stream_json_lines("POST", url, operation="chat", **options) as lines:
        return [item async for item in lines]


async def test_stream_json_lines_maps_errors() -> None:
    client = make_client(max_retries=0)

    def not_found(answer: ServerAnswer) -> ServerResponseError | None:
        return answer.error(ServerModelNotFoundError, f"pull it: {answer.message}")

    def refused(message: str, response: httpx.Response) -> InferenceError:
        return InvalidRequestError(f"refused: {message} ({response.status_code})")

    with respx.mock:
        respx.post(f"{BASE}/missing").mock(return_value=httpx.Response(404, json={"error": "model 'x' not found"}))
        respx.post(f"{BASE}/bad").mock(return_value=httpx.Response(200, stream=LineStream([b'{"ok": 1}\n', b"oops\n"])))
        respx.post(f"{BASE}/cut").mock(
            return_value=httpx.Response(
                200, stream=LineStream([b'{"ok": 1}\n'], then_fail=httpx.RemoteProtocolError("peer closed"))
            )
        )
        respx.post(f"{BASE}/failed").mock(
            return_value=httpx.Response(200, stream=LineStream([b'{"ok": 1}\n', b'{"error": "runner died"}\n']))
        )
        with pytest.raises(ServerModelNotFoundError, match="pull it: model 'x' not found"):
            await read_all(client, f"{BASE}/missing", handlers={404: not_found})
        with pytest.raises(ProtocolError, match="a line that is not JSON"):
            await read_all(client, f"{BASE}/bad")
        with pytest.raises(ProviderUnavailableError, match="dropped the connection during chat"):
            await read_all(client, f"{BASE}/cut")
        with pytest.raises(ServerResponseError, match=r"failed during chat: runner died\. The server failed") as caught:
            await read_all(client, f"{BASE}/failed")
        assert caught.value.response.status_code == 200
        with pytest.raises(InvalidRequestError, match=r"refused: runner died \(200\)"):
            await read_all(client, f"{BASE}/failed", error_line=refused)
    await client.aclose()


@pytest.mark.parametrize(
    ("response", "missing"),
    [
        (httpx.Response(404, json={"detail": "Not Found"}), True),  # FastAPI (vLLM, llama_cpp.server)
        (httpx.Response(405, json={"detail": "Method Not Allowed"}), True),
        (httpx.Response(404, text="404 page not found"), True),  # Go's net/http and gin (Ollama)
        (httpx.Response(404, text="Not Found"), True),  # Starlette without FastAPI
        (httpx.Response(404, html="<html><head><title>404 Not Found</title></head><body>nginx</body></html>"), True),
        (httpx.Response(404, json={"error": "model 'x' not found"}), False),  # Ollama's own answer
        (
            httpx.Response(
                404, json={"error": {"message": "The model `x` does not exist. Valid aliases: b.", "code": 404}}
            ),
            False,
        ),
        (httpx.Response(404, json={"detail": "Adapter x not found"}), False),  # an application's own detail
        (httpx.Response(404), False),  # HEAD /api/blobs/<digest>: the blob is not there
        (httpx.Response(404, text="no such adapter"), False),
        (httpx.Response(400, text="404 page not found"), False),
    ],
    ids=[
        "fastapi",
        "fastapi-405",
        "gin",
        "starlette",
        "nginx",
        "ollama-model",
        "vllm-model",
        "app-detail",
        "empty",
        "other-text",
        "not-404",
    ],
)
def test_a_missing_route_is_told_apart_from_a_missing_resource(response: httpx.Response, missing: bool) -> None:
    assert is_route_missing(response) is missing


async def test_a_plain_text_404_gets_the_base_url_hint() -> None:
    client = make_client()
    with respx.mock() as router:
        router.get(f"{BASE}/things").mock(return_value=httpx.Response(404, text="404 page not found"))
        with pytest.raises(ServerResponseError) as caught:
            await client.request("GET", f"{BASE}/things", operation="list things")
    message = str(caught.value)
    assert "the server has no route /v1/things" in message.lower() and "DEMO_BASE_URL" in message


@pytest.mark.parametrize(
    "url",
    [
        "http://server.test:port/v1",
        "http://:9000/v1",
        "http://server.test:0/v1",
        "http://server.test:70000/v1",
        "http://server\x00.test/v1",
        "http://ser ver.test/v1",
        "ftp://server.test/v1",
    ],
)
def test_a_base_url_no_request_can_use_is_refused_naming_the_setting(url: str) -> None:
    with pytest.raises(ConfigurationError, match="DEMO_BASE_URL") as caught:
        check_base_url(url, provider="demo", env_prefix="DEMO")
    assert caught.value.url == url and caught.value.provider == "demo"
    with pytest.raises(ConfigurationError):
        ServerClient(provider="demo", server="Demo", base_url=url, timeout=1, max_retries=0, env_prefix="DEMO")


@pytest.mark.parametrize(
    "url", ["http://server.test:9000/v1", "https://[::1]:8443/v1", "http://127.0.0.1/v1", "http://bücher.example/v1"]
)
def test_usable_base_urls_pass(url: str) -> None:
    check_base_url(url, provider="demo", env_prefix="DEMO")


def test_a_url_httpx_refuses_at_request_time_is_a_configuration_error() -> None:
    client = make_client()
    for error in (httpx.InvalidURL("Invalid port: 'x'"), httpx.UnsupportedProtocol("Request URL has no scheme")):
        mapped = client.error_from_exception(error, operation="list things")
        assert isinstance(mapped, ConfigurationError) and "DEMO_BASE_URL" in str(mapped)


_DOUBLED = re.compile(r"\b(\w+)\s+\1\b", re.IGNORECASE)


@pytest.mark.parametrize("provider_type", ["vllm", "openai", "ollama", "llamacpp-server"])
async def test_server_messages_name_the_server_without_doubled_words(provider_type: str) -> None:
    """"points at a OpenAI-compatible server server" was the openai provider's hint (its server is called
    "OpenAI-compatible server"): every server provider's messages for a refused connection, an answer that is not
    JSON and a missing route read as sentences."""
    from inference.registry import load_provider_class

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    messages: list[str] = []
    down = load_provider_class(provider_type)(base_url=f"http://127.0.0.1:{closed}/v1", max_retries=0)
    with pytest.raises(InferenceError) as caught:
        await down.generate("Hi", model="m", max_tokens=2)
    messages.append(str(caught.value))
    for answer in (httpx.Response(200, text="{not json"), httpx.Response(404, text="404 page not found")):
        provider = load_provider_class(provider_type)(base_url=BASE, max_retries=0)
        with respx.mock(assert_all_called=False) as router:
            router.route(host="server.test").mock(return_value=answer)
            with pytest.raises(InferenceError) as caught:
                await provider.generate("Hi", model="m", max_tokens=2)
        messages.append(str(caught.value))
    for message in messages:
        assert _DOUBLED.search(message) is None, message
        assert re.search(r"\ba [aeiouAEIOU]", message) is None, message  # "a Ollama", "a OpenAI-compatible"


async def test_a_post_after_an_idle_pause_goes_out_on_a_fresh_connection() -> None:
    """uvicorn (vLLM) and llama-server close a connection idle for 5 s; a request sent on it as it closes is lost,
    and a POST cannot be sent again. This server drops any request that arrives on a connection idle for 4.5 s or
    more, as that race does: the client keeps idle connections for less (it kept them 30 s, and such a POST failed
    once in a while in the suite, as ``ProviderUnavailableError``)."""
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        last = time.monotonic()
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).lower()
            length = re.search(rb"content-length: (\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            if time.monotonic() - last >= 4.5:  # the server's keep-alive ran out as the request came
                writer.close()
                return
            writer.write(answer)
            await writer.drain()
            last = time.monotonic()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = ServerClient(provider="demo", server="Demo", base_url=f"http://127.0.0.1:{port}/v1", timeout=5.0,
                          max_retries=0, env_prefix="DEMO")
    try:
        url = f"http://127.0.0.1:{port}/v1/completions"
        for _ in range(POOL_SHARDS):  # a kept-alive connection in each of the client's pools
            await client.request("POST", url, operation="generate", json_body={"prompt": "a"})
        await asyncio.sleep(4.6)
        response = await client.request("POST", url, operation="generate", json_body={"prompt": "b"})
        assert response.json() == {}
    finally:
        await client.aclose()
        server.close()


@pytest.mark.parametrize(
    "chunks",
    [
        # a UTF-8 byte order mark before the first event: that event used to be dropped without a word
        [b'\xef\xbb\xbfdata: {"t": "a"}\n\n', b'data: {"t": "b"}\n\ndata: [DONE]\n\n'],
        # one event over several data lines, joined with newlines (the SSE spec): used to be refused as not JSON
        [b'data: {"t":\ndata: "a"}\n\n', b'event: x\ndata: {"t": "b"}\n\n', b"data: [DONE]\n\n"],
        # the same with CR LF line ends, one split between two reads
        [b'data: {"t":\r', b'\ndata: "a"}\r\n\r\n', b'data:{"t": "b"}\r\n\r\ndata: [DONE]\r\n\r\n'],
    ],
    ids=["bom", "multiline", "multiline-crlf-split"],
)
async def test_server_sent_events_follow_the_spec(chunks: list[bytes]) -> None:
    client = make_client()
    with respx.mock:
        respx.post(f"{BASE}/chat").mock(return_value=httpx.Response(200, stream=LineStream(chunks)))
        assert await read_all(client, f"{BASE}/chat", sse=True) == [{"t": "a"}, {"t": "b"}]
    await client.aclose()
