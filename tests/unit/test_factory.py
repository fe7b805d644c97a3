"""get_provider and get_provider_for_step: resolution, the cache and its identity, configuration errors."""

from __future__ import annotations

import threading

import pytest

import inference
from inference.config import SETTINGS
from inference.exceptions import (
    ConfigurationError,
    MissingDependencyError,
    UnknownProviderError,
)
from inference.factory import get_provider, get_provider_for_step
from inference.fake_provider import FakeProvider
from inference.provider import InferenceProvider
from inference.registry import PROVIDER_REGISTRY


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
    valid = "fake, llamacpp, llamacpp-server, ollama, openai, transformers, vllm, vllm-offline"
    with pytest.raises(ValueError, match=f"valid names are {valid}"):
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


def test_the_fake_stand_in_takes_a_step_written_for_a_server_provider(clean_env: pytest.MonkeyPatch) -> None:
    step = {"provider": "fake", "base_url": "http://gpu:8100/v1", "api_key": "sk-x", "timeout": 30, "model": "m"}
    provider = get_provider_for_step(step)
    assert isinstance(provider, FakeProvider)
    assert provider is get_provider("fake")  # base_url ignored, as the other settings: the same cached provider
    assert get_provider("fake", base_url="http://gpu:8100/v1") is provider
    with pytest.raises(ConfigurationError, match="did you mean 'max_adapters'"):  # its own settings still checked
        get_provider_for_step({"provider": "fake", "base_url": "http://gpu:8100/v1", "max_adapter": 2})


def test_unparsable_environment_variable_names_the_variable(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("LLAMACPP_N_CTX", "four thousand")
    with pytest.raises(ConfigurationError, match="LLAMACPP_N_CTX='four thousand'"):
        get_provider("llamacpp")


def test_missing_backend_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PROVIDER_REGISTRY, "vllm", "inference._no_such_module:VLLMProvider")
    with pytest.raises(MissingDependencyError, match=r"pip install 'inference-adapters\[vllm\]'"):
        get_provider("vllm", "http://127.0.0.1:1/v1")


def test_env_example_and_docs_list_every_setting(repo_root) -> None:  # type: ignore[no-untyped-def]
    from inference.config import render_configuration_table, render_env_example

    hint = "run: python scripts/write_env_example.py"
    assert (repo_root / ".env.example").read_text(encoding="utf-8") == render_env_example(), hint
    docs = (repo_root / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert render_configuration_table() in docs, hint
    for settings in SETTINGS.values():
        for setting in settings:
            assert f"`{setting.env_var}`" in docs


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


def test_unhashable_step_settings_are_a_configuration_error(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="plain values"):
        get_provider_for_step({"provider": "llamacpp", "model_path": "/m.gguf", "n_ctx": [4096]})


def test_vllm_offline_engine_arguments_come_from_a_step_config_or_the_environment(
    clean_env: pytest.MonkeyPatch,
) -> None:
    """``engine_args`` is a JSON object: a mapping or its text, kept as canonical JSON (one cache key for both), and
    the keywords of the constructor go over it."""
    from inference.config import resolve_settings
    from inference.vllm_offline_provider import VLLMOfflineProvider

    step = {"model_name": "/models/m", "engine_args": {"seed": 0, "enforce_eager": True}}
    as_text = {**step, "engine_args": '{"enforce_eager": true, "seed": 0}'}
    assert resolve_settings("vllm-offline", step) == resolve_settings("vllm-offline", as_text)
    provider = VLLMOfflineProvider(**resolve_settings("vllm-offline", step), max_num_seqs=2, seed=1)
    assert provider._engine_arguments == {"enforce_eager": True, "seed": 1, "max_num_seqs": 2}
    clean_env.setenv("VLLM_OFFLINE_ENGINE_ARGS", '{"max_num_seqs": 3}')
    assert VLLMOfflineProvider(model_name="/models/m")._engine_arguments == {"max_num_seqs": 3}
    clean_env.setenv("VLLM_OFFLINE_ENGINE_ARGS", "max_num_seqs=3")
    with pytest.raises(ConfigurationError, match=r"VLLM_OFFLINE_ENGINE_ARGS.*must be a JSON object"):
        VLLMOfflineProvider(model_name="/models/m")
    with pytest.raises(ConfigurationError, match=r"engine_args.*must be a JSON object"):
        resolve_settings("vllm-offline", {"engine_args": ["enforce_eager"]})
