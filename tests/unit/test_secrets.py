"""API keys never appear in reprs, logs or error messages, whatever goes wrong."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest
import respx

from inference.exceptions import InferenceError
from inference.factory import get_provider

SECRET = "sk-do-not-leak-7f3a9c"
BASE = "http://127.0.0.1:8100/v1"


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
        texts += [str(error), repr(error), repr(error.__dict__)]
        cause = error.__cause__
        while cause is not None:
            texts.append(str(cause))
            cause = cause.__cause__
    texts += [record.getMessage() for record in caplog.records]
    leaks = [text for text in texts if SECRET in text]
    assert not leaks  # ... and never shown
