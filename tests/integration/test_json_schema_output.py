"""``json_schema`` keeps its promise on every provider: the text parses and validates unless ``"length"``.

On each in-process provider (llama.cpp with ``n_parallel=1``, its own ``Llama.generate`` loop, and with
``n_parallel=4``, the batched decode loop; Transformers; the fake) and on a real ``llama_cpp.server`` through the
vLLM and OpenAI providers:

- a stop string that occurs in the JSON does not cut it (it used to: ``'{"name"'`` with ``"stop"``);
- a schema without a finite value (``{"$ref": "#"}``, a -> b -> a, a required property that contains itself) is an
  ``InvalidRequestError`` naming the cycle (it used to answer ``''`` with ``"stop"``), and the provider goes on;
- a server whose grammar does not enforce the schema (``llama_cpp.server`` ignores ``minimum``/``maximum``) gives a
  ``ProviderError``, never an invalid text reported as finished; nor is free text from a route that ignores the
  schema (``llama_cpp.server``'s ``/v1/completions``) returned as a JSON cut by ``max_tokens``.

llama.cpp's own ``llama-server`` is checked in test_llamacpp_server_provider.py, the rules themselves in
tests/unit/test_json_schema_rules.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import pytest_asyncio

from inference.exceptions import InvalidRequestError, ProviderError
from inference.fake_provider import FakeProvider
from inference.openai_provider import OpenAIProvider
from inference.provider import GenerationResult, InferenceProvider
from inference.vllm_provider import VLLMProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
SERVED_PERSON = {  # llama_cpp.server's grammar lets raw control characters into free strings: an enum here
    **PERSON,
    "properties": {"name": {"type": "string", "enum": ["Ann", "Bob"]}, "age": {"type": "integer"}},
}
STOPS = [":", '"', ","]
"""Stop strings every object's JSON holds."""

WITHOUT_A_FINITE_VALUE = {
    "itself": ({"$ref": "#"}, "# -> #"),
    "a-b-a": (
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        "#/$defs/a -> #/$defs/b -> #/$defs/a",
    ),
    "required-itself": ({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}, "# -> #"),
}
IN_PROCESS = ["llamacpp-n_parallel-1", "llamacpp-n_parallel-4", "transformers", "fake"]


@pytest_asyncio.fixture(params=IN_PROCESS, scope="module", loop_scope="module")
async def provider(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[InferenceProvider]:
    model = tiny_models["qwen2"]
    opened: InferenceProvider
    if request.param.startswith("llamacpp"):
        pytest.importorskip("llama_cpp")
        from inference.llamacpp_provider import LlamaCppProvider

        n_parallel = int(request.param.rpartition("-")[2])
        cache: Path = tmp_path_factory.mktemp("adapters")
        opened = LlamaCppProvider(
            model.gguf_path, n_ctx=512, n_parallel=n_parallel, kv_cache_type="f32", adapter_cache_dir=cache
        )
    elif request.param == "transformers":
        pytest.importorskip("peft")
        from inference.transformers_provider import TransformersProvider

        opened = TransformersProvider(model_name=str(model.hf_dir), device="cpu", batch_window_ms=20)
    else:
        opened = FakeProvider()
    await opened.load_adapter("a1", model.adapter_dirs["a1"])
    yield opened
    await opened.aclose()


async def streamed(provider: InferenceProvider, **kwargs: Any) -> tuple[str, GenerationResult]:
    """The pieces of a stream, joined, and its result."""
    events = [event async for event in provider.stream(**kwargs)]
    final = events[-1]
    assert isinstance(final, GenerationResult)
    return "".join(event for event in events if isinstance(event, str)), final


@pytest.mark.parametrize("adapter_id", [None, "a1"])
async def test_a_stop_string_in_the_json_does_not_cut_it(provider: InferenceProvider, adapter_id: str | None) -> None:
    asked: dict[str, Any] = {
        "prompt": "Describe a person as JSON.", "model": "tiny", "adapter_id": adapter_id, "max_tokens": 60,
        "temperature": 0, "json_schema": PERSON,
    }
    whole = await provider.generate(**asked)
    assert whole.finish_reason == "stop", f"the JSON did not finish in 60 tokens: {whole.text!r}"
    stopped = await provider.generate(**asked, stop=STOPS)
    pieces, final = await streamed(provider, **asked, stop=STOPS)
    batch = await provider.generate_batch([asked["prompt"]] * 2, **{k: v for k, v in asked.items() if k != "prompt"},
                                          stop=STOPS)
    for result in (stopped, final, *batch):
        assert isinstance(result, GenerationResult), result
        assert (result.text, result.finish_reason) == (whole.text, "stop")
    assert pieces == whole.text
    jsonschema.validate(json.loads(whole.text), PERSON)


@pytest.mark.parametrize(("schema", "cycle"), WITHOUT_A_FINITE_VALUE.values(), ids=WITHOUT_A_FINITE_VALUE.keys())
async def test_a_schema_without_a_finite_value_is_refused_and_the_provider_goes_on(
    provider: InferenceProvider, schema: dict[str, Any], cycle: str
) -> None:
    with pytest.raises(InvalidRequestError, match="cycle") as refused:
        await provider.generate("x", model="tiny", max_tokens=20, temperature=0, json_schema=schema)
    assert cycle in str(refused.value)
    with pytest.raises(InvalidRequestError, match="cycle"):
        await streamed(provider, prompt="x", model="tiny", max_tokens=20, temperature=0, json_schema=schema)
    after = await provider.generate("x", model="tiny", max_tokens=60, temperature=0, json_schema=PERSON)
    jsonschema.validate(json.loads(after.text), PERSON)


# A real llama_cpp.server, through the vLLM and OpenAI providers ----------------------------------------


@pytest.mark.parametrize("provider_class", [VLLMProvider, OpenAIProvider])
async def test_a_stop_string_in_the_json_does_not_cut_it_on_a_server(llama_server: str, provider_class: type) -> None:
    asked: dict[str, Any] = {
        "prompt": "Describe a person as JSON", "model": "tiny-qwen2", "max_tokens": 64, "temperature": 0.0,
        "json_schema": SERVED_PERSON,
    }
    async with provider_class(base_url=llama_server) as server:
        whole = await server.generate(**asked)
        stopped = await server.generate(**asked, stop=STOPS)
        pieces, final = await streamed(server, **asked, stop=STOPS)
    assert whole.finish_reason == "stop", f"the JSON did not finish in 64 tokens: {whole.text!r}"
    assert (stopped.text, stopped.finish_reason) == (whole.text, "stop")
    assert (pieces, final.text, final.finish_reason) == (whole.text, whole.text, "stop")
    jsonschema.validate(json.loads(whole.text), SERVED_PERSON)


@pytest.mark.parametrize("provider_class", [VLLMProvider, OpenAIProvider])
async def test_a_server_answer_the_schema_does_not_allow_is_an_error(llama_server: str, provider_class: type) -> None:
    # llama_cpp.server's schema grammar ignores minimum/maximum: its greedy integer is 8048048048048048.
    bounded = {"type": "integer", "minimum": 1000, "maximum": 1001}
    asked: dict[str, Any] = {"model": "tiny-qwen2", "max_tokens": 24, "temperature": 0.0, "json_schema": bounded}
    async with provider_class(base_url=llama_server) as server:
        with pytest.raises(ProviderError, match="greater than the maximum of 1001") as refused:
            await server.generate("A number", **asked)
        assert "does not validate against the json_schema" in str(refused.value)
        with pytest.raises(ProviderError, match="greater than the maximum of 1001"):
            await streamed(server, prompt="A number", **asked)
        assert (await server.generate("A number", model="tiny-qwen2", max_tokens=4, temperature=0.0)).text


async def test_a_route_that_ignores_the_schema_is_an_error_not_free_text(llama_server: str) -> None:
    # llama_cpp.server's /v1/completions ignores response_format: the tiny model writes free text until max_tokens.
    async with VLLMProvider(base_url=llama_server, api="completions") as server:
        with pytest.raises(ProviderError, match="stops being JSON at character"):
            await server.generate("Describe a person", model="tiny-qwen2", max_tokens=40, temperature=0.0,
                                  json_schema=SERVED_PERSON)
        assert (await server.generate("Describe a person", model="tiny-qwen2", max_tokens=4, temperature=0.0)).text
