"""The pinned contract: light import, public import paths, GenerationResult, the generate signature, and capability
flags that agree with the hooks each provider implements."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest

import inference
from inference._core.validation import GenerationRequest
from inference.fake_provider import FakeProvider
from inference.provider import GenerationResult, InferenceProvider
from inference.registry import PROVIDER_REGISTRY, load_provider_class

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


CAPABILITY_HOOKS = {
    "supports_adapters": ("_load_adapter", "_unload_adapter"),
    "supports_scoring": ("_score",),
    "supports_tokenize": ("_tokenize_text", "_detokenize_ids", "_token_vocabulary"),
    "supports_next_token_logprobs": ("_next_token_logprobs", "_token_vocabulary"),
    "supports_token_prompts": ("_token_vocabulary",),
}
"""The hooks a provider implements for each capability flag (the base class's hooks refuse)."""

FLAG_FOLLOWS_ITS_FIRST_HOOK = ("supports_adapters", "supports_scoring", "supports_tokenize",
                               "supports_next_token_logprobs")
"""Flags that are true exactly where their first hook is implemented (an implemented hook behind a false flag is
never reached: the base class refuses first)."""


def _flag_disagreements(cls: type[InferenceProvider]) -> list[str]:
    """What a provider class's capability flags say that its hooks do not, or the other way round."""
    found = []
    for flag, hooks in CAPABILITY_HOOKS.items():
        missing = [hook for hook in hooks if getattr(cls, hook) is getattr(InferenceProvider, hook)]
        if getattr(cls, flag) and missing:
            found.append(f"{flag} is true but {', '.join(missing)} not implemented")
        elif not getattr(cls, flag) and flag in FLAG_FOLLOWS_ITS_FIRST_HOOK and hooks[0] not in missing:
            found.append(f"{hooks[0]} is implemented but {flag} is false")
    return found


@pytest.mark.parametrize("name", sorted(PROVIDER_REGISTRY))
def test_every_providers_capability_flags_agree_with_the_hooks_it_implements(name: str) -> None:
    assert _flag_disagreements(load_provider_class(name)) == []


def test_a_flag_without_its_hooks_or_a_hook_without_its_flag_is_found() -> None:
    class Claims(FakeProvider):  # a tokenizing provider whose vocabulary hook went missing
        _token_vocabulary = InferenceProvider._token_vocabulary

    class Forgets(InferenceProvider):
        name = "forgets"

        async def _generate(self, request: GenerationRequest) -> GenerationResult:
            raise AssertionError("never called")

        async def _tokenize_text(self, text: str, model: str) -> list[int]:
            return []

    assert _flag_disagreements(Claims) == [
        "supports_tokenize is true but _token_vocabulary not implemented",
        "supports_next_token_logprobs is true but _token_vocabulary not implemented",
        "supports_token_prompts is true but _token_vocabulary not implemented",
    ]
    assert _flag_disagreements(Forgets) == ["_tokenize_text is implemented but supports_tokenize is false"]
