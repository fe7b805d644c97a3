"""The pinned contract, the factory and its cache, the error tree, input validation and the fake provider."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import threading

import httpx
import pytest

import inference
from inference import exceptions
from inference.config import SETTINGS
from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    ConfigurationError,
    InferenceError,
    InvalidRequestError,
    MissingDependencyError,
    ServerResponseError,
    UnknownProviderError,
    UnsupportedOperationError,
)
from inference.factory import get_provider, get_provider_for_step
from inference.fake_provider import FakeProvider
from inference.provider import GenerationResult, InferenceProvider
from inference.registry import PROVIDER_REGISTRY

HEAVY_MODULES = ("torch", "transformers", "llama_cpp", "openai", "peft")


def test_import_inference_loads_no_backend() -> None:
    code = (
        "import sys, inference, inference.factory, inference.provider, inference.exceptions;"
        "inference.get_provider('fake');"
        f"print([m for m in {HEAVY_MODULES!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_seed_import_paths_and_lazy_top_level_names() -> None:
    from inference.exceptions import UnsupportedOperationError as FromModule
    from inference.factory import get_provider as factory_get_provider
    from inference.llamacpp_provider import LlamaCppProvider
    from inference.ollama_provider import OllamaProvider
    from inference.transformers_provider import TransformersProvider
    from inference.vllm_provider import VLLMProvider

    assert inference.UnsupportedOperationError is FromModule
    assert inference.get_provider is factory_get_provider
    assert inference.VLLMProvider is VLLMProvider
    assert inference.OllamaProvider is OllamaProvider
    assert inference.LlamaCppProvider is LlamaCppProvider
    assert inference.TransformersProvider is TransformersProvider
    for cls in (VLLMProvider, OllamaProvider, LlamaCppProvider, TransformersProvider, FakeProvider):
        assert issubclass(cls, InferenceProvider)
    with pytest.raises(AttributeError, match="NoSuchProvider"):
        _ = inference.NoSuchProvider


def test_generation_result_fields_are_pinned_in_order() -> None:
    names = [field.name for field in dataclasses.fields(GenerationResult)]
    assert names[:5] == ["text", "model", "adapter_id", "token_count", "finish_reason"]
    result = GenerationResult("t", "m", None, 3, "stop")
    assert (result.prompt_tokens, result.completion_tokens) == (0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.text = "changed"  # type: ignore[misc]


def test_generate_signature_is_pinned() -> None:
    parameters = inspect.signature(InferenceProvider.generate).parameters
    positional = [name for name, p in parameters.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == [
        "self", "prompt", "model", "adapter_id", "max_tokens", "system_prompt",
        "temperature", "top_p", "repetition_penalty",
    ]
    keyword_only = [name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert keyword_only == ["stop", "seed", "top_k"]
    assert parameters["max_tokens"].default == 4096
    for method in ("generate", "load_adapter", "unload_adapter", "list_adapters", "aclose"):
        assert inspect.iscoroutinefunction(getattr(InferenceProvider, method))


def test_every_error_descends_from_one_base() -> None:
    for name in exceptions.__all__:
        assert issubclass(getattr(exceptions, name), InferenceError), name
    assert issubclass(ServerResponseError, httpx.HTTPStatusError)
    assert issubclass(UnknownProviderError, ValueError)
    assert issubclass(MissingDependencyError, ImportError)
    assert exceptions.__doc__ is not None and "ServerResponseError" in exceptions.__doc__


# Factory -----------------------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("INFERENCE_PROVIDER", raising=False)
    for settings in SETTINGS.values():
        for setting in settings:
            monkeypatch.delenv(setting.env_var, raising=False)
    return monkeypatch


def test_default_provider_is_vllm_on_the_default_url(clean_env: pytest.MonkeyPatch) -> None:
    provider = get_provider()
    assert provider.name == "vllm"
    assert provider is get_provider("vllm", "http://localhost:8100/v1")


def test_provider_type_from_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("INFERENCE_PROVIDER", "fake")
    assert isinstance(get_provider(), FakeProvider)


def test_unknown_provider_lists_valid_names(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="valid names are fake, llamacpp, ollama, transformers, vllm"):
        get_provider("tgi")
    clean_env.setenv("INFERENCE_PROVIDER", "nope")
    with pytest.raises(UnknownProviderError, match="INFERENCE_PROVIDER"):
        get_provider()


def test_cache_identity_follows_resolved_settings(clean_env: pytest.MonkeyPatch) -> None:
    first = get_provider("ollama")
    assert get_provider("ollama") is first
    assert get_provider_for_step({"provider": "ollama"}) is first
    assert get_provider("ollama", "http://localhost:11434/v1") is first
    other = get_provider("ollama", "http://127.0.0.1:9999/v1")
    assert other is not first
    clean_env.setenv("OLLAMA_BASE_URL", "http://127.0.0.1:9999/v1")
    assert get_provider("ollama") is other


def test_step_config_reads_provider_specific_keys(clean_env: pytest.MonkeyPatch) -> None:
    a = get_provider_for_step({"provider": "llamacpp", "model_path": "/models/a.gguf", "prompt": "ignored"})
    b = get_provider_for_step({"provider": "llamacpp", "model_path": "/models/b.gguf"})
    assert a is not b
    assert a is get_provider_for_step({"provider": "llamacpp", "model_path": "/models/a.gguf"})
    clean_env.setenv("LLAMACPP_MODEL_PATH", "/models/a.gguf")
    assert get_provider("llamacpp") is a


def test_concurrent_first_calls_build_one_instance(clean_env: pytest.MonkeyPatch) -> None:
    results: list[InferenceProvider] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        results.append(get_provider("fake"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 8 and all(p is results[0] for p in results)


async def test_aclose_all_providers_empties_the_cache(clean_env: pytest.MonkeyPatch) -> None:
    first = get_provider("fake")
    await inference.aclose_all_providers()
    assert get_provider("fake") is not first
    inference.clear_provider_cache()
    assert get_provider("fake") is not first


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: get_provider("vllm", "localhost:8100/v1"), "scheme"),
        (lambda: get_provider("ollama", "ftp://host/v1"), "scheme"),
        (lambda: get_provider("llamacpp", "http://localhost:1/v1"), "takes no base_url"),
        (lambda: get_provider_for_step(["vllm"]), "must be a mapping"),  # type: ignore[arg-type]
    ],
)
def test_bad_configuration_is_a_typed_error(clean_env: pytest.MonkeyPatch, call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError, match=message):
        call()


def test_unparsable_environment_variable_names_the_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LLAMACPP_N_CTX", "four thousand")
    with pytest.raises(ConfigurationError, match="LLAMACPP_N_CTX='four thousand'"):
        get_provider("llamacpp")


def test_missing_backend_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PROVIDER_REGISTRY, "vllm", "inference._no_such_module:VLLMProvider")
    with pytest.raises(MissingDependencyError, match=r"pip install 'inference-adapters\[vllm\]'"):
        get_provider("vllm", "http://127.0.0.1:1/v1")


# Fake provider and validation -----------------------------------------------------------------------------


async def test_fake_output_depends_on_prompt_and_adapter() -> None:
    async with FakeProvider() as fake:
        await fake.load_adapter("style", "/adapters/style")
        base = await fake.generate("Hello there", model="m")
        again = await fake.generate("Hello there", model="m")
        other_prompt = await fake.generate("Goodbye", model="m")
        adapted = await fake.generate("Hello there", model="m", adapter_id="style")
    assert base == again
    assert base.text != other_prompt.text
    assert adapted.text != base.text and adapted.adapter_id == "style"
    assert base.token_count == base.prompt_tokens + base.completion_tokens


async def test_fake_honours_max_tokens_and_stop() -> None:
    fake = FakeProvider()
    full = await fake.generate("p", model="m")
    short = await fake.generate("p", model="m", max_tokens=2)
    assert short.finish_reason == "length" and short.completion_tokens == 2
    assert full.text.startswith(short.text)
    stop_word = full.text.split()[2]
    stopped = await fake.generate("p", model="m", stop=[stop_word])
    assert stopped.finish_reason == "stop" and stop_word not in stopped.text


async def test_fake_adapter_lifecycle_and_errors() -> None:
    fake = FakeProvider()
    await fake.load_adapter("b", "/x/b")
    await fake.load_adapter("a", "/x/a")
    assert await fake.list_adapters() == ["a", "b"]
    with pytest.raises(AdapterAlreadyLoadedError, match="already loaded"):
        await fake.load_adapter("a", "/x/other")
    await fake.unload_adapter("a")
    with pytest.raises(AdapterNotFoundError, match="not loaded"):
        await fake.unload_adapter("a")
    with pytest.raises(AdapterNotFoundError, match="load_adapter first"):
        await fake.generate("p", model="m", adapter_id="a")
    assert (await fake.generate("p", model="m", adapter_id="b")).adapter_id == "b"


BAD_GENERATE_ARGUMENTS = [
    ({"prompt": 42}, "prompt must be a string"),
    ({"prompt": None}, "prompt must be a string"),
    ({"model": 3}, "model must be a string"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"max_tokens": -5}, "max_tokens must be a positive integer"),
    ({"max_tokens": 2.5}, "max_tokens must be a positive integer"),
    ({"max_tokens": True}, "max_tokens must be a positive integer"),
    ({"temperature": -0.1}, "temperature must be a number"),
    ({"temperature": float("nan")}, "temperature must be a number"),
    ({"temperature": "hot"}, "temperature must be a number"),
    ({"top_p": 0}, "top_p must be a number"),
    ({"top_p": 1.5}, "top_p must be a number"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a number"),
    ({"top_k": -1}, "top_k must be a non-negative integer"),
    ({"seed": "abc"}, "seed must be an integer"),
    ({"stop": [""]}, "stop must be"),
    ({"stop": 5}, "stop must be"),
    ({"system_prompt": 7}, "system_prompt must be a string"),
    ({"adapter_id": "../etc/passwd"}, "adapter id"),
    ({"adapter_id": "a;rm -rf /"}, "adapter id"),
    ({"adapter_id": "with space"}, "adapter id"),
    ({"adapter_id": ""}, "adapter id"),
]


@pytest.mark.parametrize(("override", "message"), BAD_GENERATE_ARGUMENTS)
async def test_bad_generate_arguments_are_refused_and_provider_stays_usable(
    override: dict[str, object], message: str
) -> None:
    fake = FakeProvider()
    arguments: dict[str, object] = {"prompt": "hi", "model": "m", **override}
    with pytest.raises(InvalidRequestError, match=message):
        await fake.generate(**arguments)  # type: ignore[arg-type]
    assert (await fake.generate("hi", model="m")).text


@pytest.mark.parametrize("adapter_id", ["a/b", "a\\b", "$(x)", "`x`", "a|b", "-leading-dash", 5])
async def test_unsafe_adapter_ids_are_refused_at_load(adapter_id: object) -> None:
    fake = FakeProvider()
    with pytest.raises(InvalidRequestError, match="adapter id"):
        await fake.load_adapter(adapter_id, "/x")  # type: ignore[arg-type]
    assert await fake.list_adapters() == []


async def test_empty_adapter_path_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="adapter_path"):
        await FakeProvider().load_adapter("a", "")


async def test_unsupported_operation_names_the_provider_class() -> None:
    class NoAdapters(InferenceProvider):
        name = "none"

        async def _generate(self, request):  # type: ignore[no-untyped-def]
            return GenerationResult(request.prompt, "m", None, 1, "stop")

    provider = NoAdapters()
    with pytest.raises(UnsupportedOperationError, match="NoAdapters does not support load_adapter"):
        await provider.load_adapter("a", "/x")
    assert await provider.list_adapters() == []
    assert (await provider.generate("echo", model="m")).text == "echo"


def test_env_example_and_docs_list_every_setting(repo_root) -> None:  # type: ignore[no-untyped-def]
    from inference.config import render_configuration_table, render_env_example

    hint = "run: python scripts/write_env_example.py"
    assert (repo_root / ".env.example").read_text(encoding="utf-8") == render_env_example(), hint
    docs = (repo_root / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert render_configuration_table() in docs, hint
    for settings in SETTINGS.values():
        for setting in settings:
            assert f"`{setting.env_var}`" in docs

def test_server_errors_are_httpx_status_errors_with_the_sdk_attributes() -> None:
    request = httpx.Request("POST", "http://127.0.0.1:8100/v1/load_lora_adapter")
    response = httpx.Response(404, request=request, json={"detail": "Not Found"})
    error = exceptions.RuntimeLoRADisabledError(
        "start vLLM with --enable-lora", request=request, response=response, provider="vllm", url="http://x/v1"
    )
    with pytest.raises(httpx.HTTPStatusError) as caught:
        raise error
    assert caught.value.response.status_code == 404 and caught.value.request is request
    assert (error.status_code, error.provider, error.url, str(error)) == (
        404, "vllm", "http://x/v1", "start vLLM with --enable-lora"
    )
    assert isinstance(exceptions.ServerAdapterNotFoundError("gone", request=request, response=response),
                      AdapterNotFoundError)


class ClosingFake(FakeProvider):
    """A fake that, like the in-process providers, is unusable after aclose()."""

    _closed = False

    async def aclose(self) -> None:
        self._closed = True


async def test_a_provider_closed_by_async_with_is_replaced_in_the_cache(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setitem(PROVIDER_REGISTRY, "fake", f"{__name__}:ClosingFake")
    async with get_provider("fake") as first:
        assert not first.closed
    assert first.closed
    second = get_provider("fake")
    assert second is not first and not second.closed
    assert get_provider("fake") is second


def test_errors_survive_pickling_with_their_attributes() -> None:
    import pickle

    request = httpx.Request("POST", "http://127.0.0.1:8100/v1/chat/completions")
    response = httpx.Response(404, request=request, json={"error": {"message": "gone"}})
    errors = [
        AdapterNotFoundError("adapter 'a' is not loaded", provider="fake", path="/x"),
        exceptions.ServerModelNotFoundError("model gone", request=request, response=response, provider="vllm"),
    ]
    for error in errors:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        assert (copy.provider, copy.path) == (error.provider, error.path)
    assert copy.status_code == 404


def test_unhashable_step_settings_are_a_configuration_error(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="plain values"):
        get_provider_for_step({"provider": "llamacpp", "model_path": "/m.gguf", "n_ctx": [4096]})
