"""The pinned contract: light import, public import paths, GenerationResult and the generate signature."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest

import inference
from inference.fake_provider import FakeProvider
from inference.provider import GenerationResult, InferenceProvider

HEAVY_MODULES = ("torch", "transformers", "llama_cpp", "openai", "peft", "vllm", "httpx", "jsonschema", "numpy")
"""Not imported by ``import inference`` nor by the fake provider: httpx comes with an HTTP provider (or a
``Server*`` error), jsonschema with the first ``json_schema`` option, numpy with the first next-token
distribution."""


def test_import_inference_loads_no_backend() -> None:
    code = (
        "import sys, inference, inference.factory, inference.provider, inference.exceptions;"
        "inference.get_provider('fake');"
        f"print([m for m in {HEAVY_MODULES!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_import_inference_alone_imports_only_the_error_tree() -> None:
    code = "import sys, inference; print(sorted(m for m in ('asyncio', 'httpx', 'jsonschema') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # the rest comes on first use: inference.get_provider imports asyncio


def test_server_errors_are_still_httpx_errors_and_pickle() -> None:
    import pickle

    import httpx

    from inference.exceptions import ServerAdapterNotFoundError, ServerResponseError

    assert issubclass(ServerAdapterNotFoundError, httpx.HTTPStatusError)
    assert inference.ServerResponseError is ServerResponseError
    error = ServerAdapterNotFoundError("gone", request=None, response=None, provider="vllm")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ServerAdapterNotFoundError and str(copy) == "gone"


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
        "self",
        "prompt",
        "model",
        "adapter_id",
        "max_tokens",
        "system_prompt",
        "temperature",
        "top_p",
        "repetition_penalty",
    ]
    keyword_only = [name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert keyword_only[:5] == ["stop", "seed", "top_k", "logprobs", "json_schema"]  # new options come after
    assert keyword_only[5:8] == ["tools", "tool_choice", "return_token_ids"]
    assert keyword_only[8:] == [
        "n", "presence_penalty", "frequency_penalty", "min_p", "logit_bias", "raw_prompt", "chat_template",
        "chat_template_kwargs", "thinking", "response_format", "extra_body", "timeout",
    ]
    assert parameters["max_tokens"].default == 4096
    for method in ("generate", "load_adapter", "unload_adapter", "list_adapters", "aclose"):
        assert inspect.iscoroutinefunction(getattr(InferenceProvider, method))
