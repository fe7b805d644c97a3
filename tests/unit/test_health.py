"""``provider.health()`` and ``inference health``: status up, degraded or down, and the exit status of each."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import respx

import inference
from inference import FakeProvider, FallbackProvider, InvalidRequestError, VLLMProvider
from inference.cli import main
from inference.health import BackendHealth, ProviderHealth

DEAD = "http://127.0.0.1:9/v1"  # the discard port: nothing answers
A = "http://replica-a.test:8100/v1"
B = "http://replica-b.test:8100/v1"
MODELS = {"object": "list", "data": [
    {"id": "tiny", "object": "model", "root": "/models/tiny", "parent": None},
    {"id": "support", "object": "model", "root": "/adapters/support", "parent": "tiny"},
]}  # vLLM's answer: an adapter is listed with its base model as parent


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


async def test_the_fake_is_up_and_lists_its_adapters() -> None:
    provider = FakeProvider()
    await provider.load_adapter("style", "/adapters/style")
    health = await provider.health()
    assert isinstance(health, inference.ProviderHealth) and health.status == "up" and health.exit_code == 0
    assert health.backends == (BackendHealth("fake", True, adapters=("style",)),)
    with pytest.raises(InvalidRequestError, match="timeout"):
        await provider.health(timeout=0)


def test_the_status_follows_from_the_backends() -> None:
    up, down = BackendHealth("a", True), BackendHealth("b", False, error="refused")
    assert ProviderHealth.of("vllm", [up, up]).status == "up"
    assert ProviderHealth.of("vllm", [up, down]).status == "degraded"
    assert ProviderHealth.of("vllm", [down, down]).status == "down"
    assert ProviderHealth.of("vllm", []).status == "down"
    assert ProviderHealth.of("vllm", [up], error="closed").status == "down"
    assert [ProviderHealth.of("x", backends).exit_code for backends in ([up], [up, down], [down])] == [0, 1, 2]


@respx.mock
async def test_a_server_provider_reports_each_replica_with_its_models_and_adapters() -> None:
    respx.get(f"{A}/models").respond(200, json=MODELS)
    respx.get(f"{B}/models").respond(503, json={"error": "loading"})
    health = await VLLMProvider(base_url=f"{A},{B}", api="chat").health()
    assert health.status == "degraded"
    first, second = health.backends
    assert (first.name, first.up, first.models, first.adapters) == (A, True, ("tiny",), ("support",))
    assert first.latency_s is not None and first.latency_s >= 0
    assert (second.name, second.up, second.error) == (B, False, "HTTP 503: the server failed")


@respx.mock
async def test_a_refused_key_is_down_and_the_key_is_sent() -> None:
    route = respx.get(f"{A}/models").respond(401, json={"error": "Unauthorized"})
    health = await VLLMProvider(base_url=A, api_key="k-123", api="chat").health()
    assert health.status == "down" and "refused the API key" in (health.backends[0].error or "")
    assert route.calls.last.request.headers["Authorization"] == "Bearer k-123"


async def test_a_fallback_is_degraded_while_one_of_its_providers_answers() -> None:
    fallback = FallbackProvider([VLLMProvider(base_url=DEAD, api="chat"), FakeProvider()], labels=["gpu", "fake"])
    health = await fallback.health(timeout=2)
    assert health.status == "degraded"
    names = [(backend.name, backend.up) for backend in health.backends]
    assert names == [(f"gpu: {DEAD}", False), ("fake: fake", True)]


GRAFANA = httpx.Response(200, text="<html><head><title>Grafana</title></head></html>",
                         headers={"content-type": "text/html; charset=utf-8"})


@pytest.mark.parametrize(
    ("url", "answer", "said"),
    [  # what answers at a base URL where no OpenAI API is served; generating there fails
        ("http://replica-a.test:8100/wrong/v1", httpx.Response(404, json={"detail": "Not Found"}),
         "HTTP 404 for GET /wrong/v1/models: the server has no such route"),  # vLLM (FastAPI), wrong path
        (A, GRAFANA, "HTTP 200 for GET /v1/models with an HTML page, not a list of models"),  # another server
        (A, httpx.Response(200, json={"status": "ok"}), 'with JSON without a "data" list'),
        (A, httpx.Response(302, headers={"location": "https://sso.test/login"}), "HTTP 302 for GET /v1/models"),
    ],
)
@respx.mock
async def test_a_base_url_where_no_api_is_served_is_down(url: str, answer: httpx.Response, said: str) -> None:
    respx.get(f"{url}/models").mock(return_value=answer)
    health = await VLLMProvider(base_url=url, api="chat").health()
    assert (health.status, health.exit_code) == ("down", 2)
    assert said in (health.backends[0].error or "") and "check its host, port and path" in (
        health.backends[0].error or ""
    )


@respx.mock
async def test_an_ollama_without_models_is_up_and_lists_none() -> None:
    """Ollama's ``/v1/models`` answers ``"data": null`` (a Go nil slice) until a model is pulled."""
    respx.get(f"{A}/models").respond(200, json={"object": "list", "data": None})
    health = await VLLMProvider(base_url=A, api="chat").health()
    assert (health.status, health.backends[0].models, health.backends[0].error) == ("up", (), None)


@respx.mock
def test_the_command_exits_2_for_a_base_url_with_a_wrong_path(capsys: pytest.CaptureFixture[str]) -> None:
    respx.get("http://replica-a.test:8100/wrong/v1/models").respond(404, json={"detail": "Not Found"})
    status, out, _ = run(["health", "--provider", "vllm", "--base-url", "http://replica-a.test:8100/wrong/v1"],
                         capsys)
    assert status == 2 and out.splitlines()[0] == "vllm: down (0 of 1 backends up)"


@pytest.mark.parametrize(
    ("provider", "given", "said"),
    [  # paths that exist, but that the backend cannot load: generating would fail
        ("llamacpp", ".", "is a directory, not a GGUF file"),  # llama.cpp loads a GGUF file
        ("transformers", ".", "holds no config.json"),  # transformers a saved model directory, a .gguf file, a Hub id
        ("transformers", "weights.bin", "is a file but not a .gguf file"),
    ],
)
def test_an_in_process_model_path_the_backend_cannot_load_is_down(
    provider: str, given: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64)
    model = tmp_path / given
    status, out, _ = run(["health", "--provider", provider, "--model-path", str(model), "--json"], capsys)
    report = json.loads(out)
    assert (status, report["status"], report["backends"][0]["model_loaded"]) == (2, "down", False)
    assert said in report["backends"][0]["error"]


def test_the_command_exits_0_when_up(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["health", "--provider", "fake"], capsys)
    assert (status, err) == (0, "")
    assert out.splitlines()[0] == "fake: up (1 of 1 backends up)"
    status, out, _ = run(["health", "--provider", "fake", "--json"], capsys)
    assert status == 0 and json.loads(out)["status"] == "up"


@respx.mock
def test_the_command_exits_1_when_degraded_and_2_when_nothing_answers(capsys: pytest.CaptureFixture[str]) -> None:
    respx.get(f"{A}/models").respond(200, json=MODELS)
    respx.get(f"{B}/models").mock(side_effect=httpx.ConnectError("All connection attempts failed"))
    status, out, _ = run(["health", "--provider", "vllm", "--base-url", f"{A},{B}"], capsys)
    assert status == 1
    assert out.splitlines()[0] == "vllm: degraded (1 of 2 backends up)"
    assert "down  " + B in out and "ConnectError" in out
    status, out, _ = run(["health", "--provider", "vllm", "--base-url", B, "--json"], capsys)
    assert status == 2 and json.loads(out)["status"] == "down"


@pytest.mark.parametrize(
    ("argv", "variables", "needle"),
    [
        (["--provider", "vllm"], {"VLLM_TIMEOUT": "abc"}, "VLLM_TIMEOUT='abc'"),
        (["--provider", "nope"], {}, "unknown provider type 'nope'"),
        (["--provider", "vllm", "--base-url", "localhost:8100"], {}, "not a valid base URL"),
    ],
)
def test_an_invalid_configuration_exits_2_with_one_error_line(
    argv: list[str], variables: dict[str, str], needle: str,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    status, out, err = run(["health", *argv, "--json"], capsys)
    assert status == 2
    assert json.loads(out)["status"] == "down" and needle in json.loads(out)["error"]
    assert err.count("\n") == 1 and needle in err


def test_providers_calls_a_fleet_with_one_replica_down_degraded_not_unreachable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with respx.mock(assert_all_mocked=False) as router:  # the other providers' local default URLs go unanswered
        router.route(host__in=("localhost", "127.0.0.1")).mock(side_effect=httpx.ConnectError("refused"))
        router.get(f"{A}/models").respond(200, json=MODELS)
        router.get(f"{B}/models").mock(side_effect=httpx.ConnectError("All connection attempts failed"))
        status, out, _ = run(["providers", "--vllm-url", f"{A},{B}", "--json"], capsys)
    vllm = next(report for report in json.loads(out)["providers"] if report["name"] == "vllm")
    assert status == 0 and vllm["reachable"] is True
    assert vllm["detail"] == f"degraded: 1 of 2 replicas answer; {B}: ConnectError"


class Dripping(httpx.AsyncByteStream):
    """A ``/models`` answer sent a byte every 0.2 s: each read comes in time, the answer never does."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for byte in json.dumps(MODELS).encode():
            await asyncio.sleep(0.2)
            yield bytes([byte])


@respx.mock
async def test_a_server_dripping_its_answer_is_down_within_the_timeout() -> None:
    """httpx's timeout is per read; the probe's bounds the whole answer (a container probe must not hang)."""
    respx.get(f"{A}/models").mock(return_value=httpx.Response(200, stream=Dripping()))
    started = time.perf_counter()
    health = await VLLMProvider(base_url=A, api="chat").health(timeout=0.5)
    assert time.perf_counter() - started < 3
    assert health.status == "down" and health.backends[0].error == "no answer within 0.5 s"
