"""API keys never appear in reprs, logs or error messages, whatever goes wrong."""

from __future__ import annotations

import asyncio
import base64
import logging
import pickle
import socket
from typing import Any

import httpx
import pytest
import respx

from inference.exceptions import ConfigurationError, InferenceError, ServerResponseError
from inference.factory import get_provider
from inference.provider import InferenceProvider
from inference.registry import load_provider_class

SECRET = "sk-do-not-leak-7f3a9c"
BASE = "http://127.0.0.1:8100/v1"


def build(provider_type: str, **settings: Any) -> InferenceProvider:
    """A new provider of ``provider_type`` (not the factory's cached one)."""
    provider: InferenceProvider = load_provider_class(provider_type)(**settings)
    return provider


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    monkeypatch.setenv("VLLM_MAX_RETRIES", "0")


async def test_api_key_never_leaks_into_repr_errors_or_logs(
    secret_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    provider = get_provider("vllm", BASE)
    texts = [repr(provider), str(provider)]
    errors: list[BaseException] = []
    with respx.mock(assert_all_called=False) as router:
        router.post(f"{BASE}/chat/completions").mock(
            side_effect=[
                httpx.Response(401, json={"error": {"message": "Invalid API key", "type": "Unauthorized",
                                                    "param": None, "code": 401}}),
                httpx.Response(404, json={"error": {"message": "The model `x` does not exist. Valid aliases: base.",
                                                    "type": "NotFoundError", "param": None, "code": 404}}),
                httpx.Response(500, text="internal error"),
                httpx.Response(200, text="{not json"),
            ]
        )
        router.post(f"{BASE}/load_lora_adapter").mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
        router.get(f"{BASE}/models").mock(return_value=httpx.Response(200, json={"object": "list", "data": [
            {"id": "x", "object": "model", "created": 1700000000, "owned_by": "vllm", "root": "/models/x",
             "parent": None, "max_model_len": 2048, "permission": []},
        ]}))  # no LoRA adapter: a first load asks before it loads
        for _ in range(4):
            with pytest.raises(InferenceError) as caught:
                await provider.generate("hello", model="x")
            errors.append(caught.value)
        with pytest.raises(InferenceError) as caught:
            await provider.load_adapter("a", "/nonexistent/adapter")
        errors.append(caught.value)
        sent = router.calls[0].request.headers["authorization"]
    assert sent == f"Bearer {SECRET}"  # the key is really used ...
    down = get_provider("vllm", f"http://127.0.0.1:{_closed_port()}/v1")
    with pytest.raises(InferenceError) as caught:
        await down.generate("hello", model="x")
    errors.append(caught.value)
    for error in errors:
        texts += [str(error), repr(error), repr(error.__dict__), pickle.dumps(error).decode("latin-1")]
        request = getattr(error, "request", None)  # a ServerResponseError is an httpx error: err.request works
        texts.append(repr(dict(request.headers)) if isinstance(request, httpx.Request) else "")
        cause = error.__cause__
        while cause is not None:
            texts.append(str(cause))
            cause = cause.__cause__
    texts += [record.getMessage() for record in caplog.records]
    leaks = [text for text in texts if SECRET in text]
    assert not leaks  # ... and never shown


# Keys are checked when the provider is built -----------------------------------------------------------------

KEYED = {"vllm": "VLLM_API_KEY", "openai": "OPENAI_API_KEY", "llamacpp-server": "LLAMACPP_SERVER_API_KEY"}
"""The server providers that send an API key, and the variable each reads it from."""

BAD_KEYS = {
    "a trailing newline (a key read from a file)": (SECRET + "\n", "ends with a newline"),
    "a Windows line end": (SECRET + "\r\n", "ends with a newline"),
    "a leading blank": (" " + SECRET, "starts with whitespace"),
    "a control character inside": (SECRET[:5] + "\x1b" + SECRET[5:], "control character (U+001B) at position 5"),
    "a character outside ASCII": (SECRET + "é", "outside ASCII"),
}


@pytest.mark.parametrize("problem", list(BAD_KEYS))
@pytest.mark.parametrize("provider_type", list(KEYED))
@pytest.mark.parametrize("origin", ["argument", "environment"])
def test_a_key_no_header_can_carry_is_refused_when_the_provider_is_built_without_showing_it(
    provider_type: str, problem: str, origin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx would copy the whole header ("Illegal header value b'Bearer sk-...\\n'") into the error of the first
    request, which blamed a server crash; the key is refused at once instead, and never quoted."""
    key, reason = BAD_KEYS[problem]
    if origin == "environment":
        monkeypatch.setenv(KEYED[provider_type], key)
        settings: dict[str, object] = {}
    else:
        settings = {"api_key": key}
    with pytest.raises(ConfigurationError) as caught:
        build(provider_type, base_url=BASE, **settings)
    message = str(caught.value)
    assert reason in message
    assert (KEYED[provider_type] if origin == "environment" else "argument api_key") in message
    assert SECRET not in message and SECRET not in repr(caught.value) and SECRET not in repr(caught.value.__dict__)
    assert caught.value.__cause__ is None and caught.value.__context__ is None  # nothing chained quotes it either


@pytest.mark.parametrize("provider_type", list(KEYED))
def test_a_good_key_is_sent_as_it_is(provider_type: str) -> None:
    provider = build(provider_type, base_url=BASE, api_key=SECRET)
    assert provider._api_key == SECRET  # type: ignore[attr-defined]
    assert SECRET not in repr(provider)


# Credentials written into a base URL -------------------------------------------------------------------------

SERVER_TYPES = ["vllm", "openai", "ollama", "llamacpp-server"]


def _url_with_credentials(port: int) -> str:
    return f"http://admin:{SECRET}@127.0.0.1:{port}/v1?api_key={SECRET}-2&key={SECRET}-3&model=m&token={SECRET}-4"


def _texts_of(error: BaseException) -> list[str]:
    texts = [str(error), repr(error), str(getattr(error, "url", ""))]
    cause = error.__cause__
    while cause is not None:
        texts += [str(cause), repr(cause)]
        cause = cause.__cause__
    return texts


@pytest.mark.parametrize("provider_type", SERVER_TYPES)
async def test_credentials_in_a_base_url_are_used_but_never_shown(
    provider_type: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused connection on loopback (with one retry, which is logged): the repr, the error and its causes,
    and every log record name the host and port, with the user information and key parameters as ``***``."""
    caplog.set_level(logging.DEBUG)
    port = _closed_port()
    provider = build(provider_type, base_url=_url_with_credentials(port), max_retries=1)
    with pytest.raises(InferenceError) as caught:
        await provider.generate("hello", model="m")
    await provider.aclose()
    texts = [repr(provider), *_texts_of(caught.value), *(record.getMessage() for record in caplog.records)]
    assert any("retrying" in record.getMessage() for record in caplog.records)  # the retry log was written
    assert not [text for text in texts if SECRET in text]
    shown = f"http://***@127.0.0.1:{port}/v1?api_key=***&key=***&model=m&token=***"
    assert shown in str(caught.value) and caught.value.url == shown


@pytest.mark.parametrize("provider_type", SERVER_TYPES)
def test_an_unusable_base_url_with_credentials_is_refused_without_them(provider_type: str) -> None:
    for url in (f"http://admin:{SECRET}\n@127.0.0.1:8100/v1", f"http://admin:{SECRET} x@127.0.0.1:8100/v1",
                f"http://admin:{SECRET}@127.0.0.1:99999/v1?api_key={SECRET}"):
        with pytest.raises(ConfigurationError) as caught:
            build(provider_type, base_url=url)
        assert not [text for text in _texts_of(caught.value) if SECRET in text], url
        assert "***@127.0.0.1" in str(caught.value)


@pytest.mark.parametrize("provider_type", ["vllm", "openai", "llamacpp-server"])
def test_a_key_beside_user_information_in_the_url_is_refused_without_showing_either(provider_type: str) -> None:
    """httpx sends a URL's user:password@ as the Authorization header (Basic), in place of the key's bearer: the key
    was silently not sent, and the server's 401 did not say why."""
    url = f"http://127.0.0.1:8100/v1,http://admin:{SECRET}@127.0.0.1:8101/v1" if provider_type != "openai" else (
        f"http://admin:{SECRET}@127.0.0.1:8100/v1")
    with pytest.raises(ConfigurationError, match="Give the credentials one way") as caught:
        build(provider_type, base_url=url, api_key=f"{SECRET}-key")
    assert not [text for text in _texts_of(caught.value) if SECRET in text]
    assert "(base_url or " in str(caught.value) and "(api_key or " in str(caught.value)  # given as arguments here
    assert build(provider_type, base_url=url)._replicas  # type: ignore[attr-defined]  # either alone is used


@pytest.mark.parametrize(
    "settings",
    [{"base_url": f"http://admin:{SECRET}@gateway.test/v1?api_key={SECRET}-2&model=m"},
     {"base_url": "http://gateway.test/v1", "api_key": SECRET}],
    ids=["url", "key"],
)
async def test_a_server_quoting_the_request_back_shows_none_of_its_credentials(settings: dict[str, str]) -> None:
    """A server or a proxy whose error quotes the request (its path and query, its Authorization header): the SDK's
    error quoted it as it was, the key or the Basic pair with it."""

    def echo(request: httpx.Request) -> httpx.Response:
        message = f"bad request at {request.url.raw_path.decode()} with {request.headers['authorization']}"
        return httpx.Response(400, json={"error": {"message": message, "type": "invalid_request_error"}})

    basic = base64.b64encode(f"admin:{SECRET}".encode()).decode()
    with respx.mock() as router:
        router.post(host="gateway.test", path="/v1/chat/completions").mock(side_effect=echo)
        provider = build("openai", max_retries=0, **settings)
        with pytest.raises(ServerResponseError) as caught:
            await provider.generate("hello", model="m")
        await provider.aclose()
    assert not [text for text in _texts_of(caught.value) if SECRET in text or basic in text]
    assert "bad request at /v1/chat/completions" in str(caught.value) and "with " in str(caught.value)


def test_inference_providers_shows_urls_without_their_credentials(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from inference.cli import main

    port = _closed_port()
    monkeypatch.setenv("OPENAI_BASE_URL", _url_with_credentials(port))
    arguments = ["providers", "--vllm-url", _url_with_credentials(port), "--timeout", "1"]
    for output in (["--json"], []):
        assert main([*arguments, *output]) == 0
        captured = capsys.readouterr()
        assert SECRET not in captured.out + captured.err
        assert f"http://***@127.0.0.1:{port}/v1?api_key=***" in captured.out
    monkeypatch.setenv("VLLM_API_KEY", SECRET + "\n")  # a bad key: the report says so, without the key
    assert main(["providers", "--json"]) == 0
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err and "VLLM_API_KEY cannot be sent" in captured.out


async def test_a_request_httpx_cannot_send_is_not_blamed_on_the_server_nor_quoted() -> None:
    """A header HTTP forbids (built past the settings' check): h11 refuses to write it, and its message quotes the
    header. The error says the request was not sent, names the settings, and quotes nothing."""
    from inference._servers.http import ServerClient

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = ServerClient(provider="openai", server="OpenAI-compatible server", base_url=f"http://127.0.0.1:{port}/v1",
                          timeout=5, max_retries=0, env_prefix="OPENAI",
                          headers={"Authorization": f"Bearer {SECRET}\n"})
    try:
        with pytest.raises(ConfigurationError) as caught:
            await client.request("GET", f"http://127.0.0.1:{port}/v1/models", operation="list models")
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert "could not be sent" in str(caught.value) and "crashed" not in str(caught.value)
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)


async def test_the_query_of_a_base_url_is_sent_with_every_request() -> None:
    """``?api-version=...`` (or a gateway's ``?key=``) stays on the request; routes go under the path."""
    base = "http://gateway.test/v1?api-version=2024-06-01&key=" + SECRET
    provider = build("openai", base_url=base)
    with respx.mock(assert_all_called=True) as router:
        route = router.post("http://gateway.test/v1/chat/completions").mock(
            return_value=httpx.Response(200, json={
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "model": "m", "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}))
        result = await provider.generate("hello", model="m")
    assert result.text == "hi"
    assert dict(route.calls.last.request.url.params) == {"api-version": "2024-06-01", "key": SECRET}


def test_a_bad_key_given_with_set_is_a_usage_error_that_does_not_show_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from inference.cli import main

    assert main(["generate", "hi", "--provider", "openai", "--base-url", BASE, "--set", f"api_key={SECRET}\n"]) == 2
    captured = capsys.readouterr()
    assert "ends with a newline" in captured.err and SECRET not in captured.out + captured.err


async def test_httpx_s_own_request_records_hide_the_credentials_of_the_url(caplog: pytest.LogCaptureFixture) -> None:
    """httpx logs every request at INFO (``HTTP Request: POST http://user:KEY@...``): with the logging most services
    set up (``basicConfig(level=INFO)``), that record wrote the URL's credentials in clear."""
    caplog.set_level(logging.INFO)
    url = _url_with_credentials(8000).replace("127.0.0.1", "gateway.test")
    with respx.mock() as mock:
        mock.route(method="POST", host="gateway.test", path="/v1/chat/completions").mock(
            return_value=httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": "Hi"},
                                                                "finish_reason": "stop"}]})
        )
        provider = build("openai", base_url=url, max_retries=0)
        assert (await provider.generate("hello", model="m")).text == "Hi"
        await provider.aclose()
    requests = [record.getMessage() for record in caplog.records if record.name == "httpx"]
    shown = "HTTP Request: POST http://***@gateway.test:8000/v1/chat/completions?api_key=***&key=***&model=m&token=***"
    assert requests and all(shown in message for message in requests)
    assert not [message for message in caplog.messages if SECRET in message]


def test_a_password_holding_a_quote_is_hidden_whole(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """An apostrophe is allowed unencoded in a password (RFC 3986 sub-delims): the repr, httpx's INFO record of the
    request and ``inference providers`` showed ``http://admin:PW'***@``, the password's part before it in clear."""
    from inference.cli import main

    caplog.set_level(logging.INFO)
    first, last = "sk-do-not", "leak-7f3a9c"
    url = f"http://admin:{first}'{last}@gateway.test:8000/v1"
    with respx.mock() as mock:
        mock.route(method="POST", host="gateway.test", path="/v1/chat/completions").mock(
            return_value=httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": "Hi"},
                                                                "finish_reason": "stop"}]})
        )
        provider = build("openai", base_url=url, max_retries=0)

        async def generate() -> str:
            async with provider:
                return (await provider.generate("hello", model="m")).text

        assert asyncio.run(generate()) == "Hi"
        assert mock.calls.last.request.headers["authorization"].startswith("Basic ")  # the password is still sent
    assert repr(provider) == "OpenAIProvider(base_url='http://***@gateway.test:8000/v1', api_key=None)"
    requests = [record.getMessage() for record in caplog.records if record.name == "httpx"]
    assert requests and all("POST http://***@gateway.test:8000/v1/chat/completions" in line for line in requests)
    assert main(["providers", "--vllm-url", url.replace("gateway.test:8000", f"127.0.0.1:{_closed_port()}"),
                 "--timeout", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert '"base_url": "http://***@127.0.0.1:' in captured.out
    shown = [repr(provider), *caplog.messages, captured.out, captured.err]
    assert not [text for text in shown if first in text or last in text]


@pytest.mark.parametrize("cut", ["#", "/", "?", ","])
def test_a_password_a_parser_cuts_short_is_refused_without_showing_any_of_it(
    cut: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unencoded ``#``, ``/`` or ``?`` ends the URL's host part where the password goes on, and a ``,`` splits
    it into two replicas: the URL is refused, and the error (``str`` and ``error.url``) quoted the password whole
    (or its part before the comma). As given by argument, by variable and with ``--set``, it shows ``http://***@``."""
    from inference.cli import main

    first, last = "sk-do-not", "leak-7f3a9c"
    url = f"http://admin:{first}{cut}{last}@gpu.test:8100/v1"
    errors = []
    with pytest.raises(ConfigurationError) as caught:
        build("vllm", base_url=url)
    errors.append(caught.value)
    monkeypatch.setenv("VLLM_BASE_URL", url)
    with pytest.raises(ConfigurationError) as caught:
        get_provider("vllm")
    errors.append(caught.value)
    for error in errors:
        assert "'http://***@gpu.test:8100/v1' is not a valid base URL" in str(error)
        assert "is written %2C, %2F, %3F or %23" in str(error)  # why a password ends a URL too soon
        assert error.url == "http://***@gpu.test:8100/v1"
    assert main(["generate", "hi", "--provider", "openai", "--set", f"base_url={url}"]) == 2
    captured = capsys.readouterr()
    assert "--set base_url='http://***@gpu.test:8100/v1'" in captured.err
    texts = [*(text for error in errors for text in _texts_of(error)), captured.out, captured.err]
    assert not [text for text in texts if first in text or last in text]
