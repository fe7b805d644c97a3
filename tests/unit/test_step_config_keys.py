"""A step config's keys: every constructor option is a setting, and a key that would be dropped is refused.

Issue 28, item 11: ``kv_cache_type`` could not be set from the command line or a step config (it was a
constructor-only option, so ``get_provider_for_step`` dropped it), and a misspelt setting (``n_ctxx``) or another
provider's setting (``kv_cache_type`` for ``transformers``) was dropped silently, so a run used other settings than
the user wrote.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

import pytest

from inference.config import SETTINGS, STEP_KEYS, resolve_settings
from inference.exceptions import ConfigurationError
from inference.factory import clear_provider_cache, get_provider_for_step
from inference.fake_provider import FakeProvider
from inference.registry import PROVIDERS, load_provider_class

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_loop.py"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for settings in SETTINGS.values():
        for setting in settings:
            monkeypatch.delenv(setting.env_var, raising=False)
    clear_provider_cache()
    return monkeypatch


@pytest.fixture
def gguf_path(tmp_path: Path) -> str:
    return str(tmp_path / "m.gguf")  # never read: llama.cpp loads on the first call


def test_llamacpp_constructor_options_are_step_config_keys(clean_env: pytest.MonkeyPatch, gguf_path: str) -> None:
    pytest.importorskip("llama_cpp")
    step = {"provider": "llamacpp", "model_path": gguf_path, "kv_cache_type": "F32", "n_threads": "2",
            "n_batch": 64, "flash_attn": "true", "hot_swap": False, "verbose": "no"}
    provider: Any = get_provider_for_step(step)
    assert provider.kv_cache_type == "f32"
    assert (provider._n_threads, provider._n_batch, provider._flash_attn) == (2, 64, True)
    assert (provider._hot_swap_requested, provider._verbose) == (False, False)
    assert get_provider_for_step({**step, "kv_cache_type": "f16"}) is not provider  # another setting, another provider


def test_llamacpp_options_come_from_the_environment_below_the_argument(
    clean_env: pytest.MonkeyPatch, gguf_path: str
) -> None:
    pytest.importorskip("llama_cpp")
    from inference.llamacpp_provider import LlamaCppProvider

    clean_env.setenv("LLAMACPP_KV_CACHE_TYPE", "f32")
    clean_env.setenv("LLAMACPP_FLASH_ATTN", "1")
    from_env = LlamaCppProvider(gguf_path)
    assert (from_env.kv_cache_type, from_env._flash_attn) == ("f32", True)
    given = LlamaCppProvider(gguf_path, kv_cache_type="bf16", flash_attn=False)
    assert (given.kv_cache_type, given._flash_attn) == ("bf16", False)  # (q8_0 needs flash_attn: see its test)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("kv_cache_type", "f8", "kv_cache_type must be one of 'f32', 'f16', 'q4_0', 'q8_0', 'bf16'"),
        ("flash_attn", "maybe", "flash_attn must be true or false"),
        ("n_threads", 0, "n_threads must be a positive integer"),
    ],
)
def test_bad_llamacpp_option_values_name_the_setting(
    clean_env: pytest.MonkeyPatch, gguf_path: str, key: str, value: object, needle: str
) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        get_provider_for_step({"provider": "llamacpp", "model_path": gguf_path, key: value})


def test_kv_cache_type_choices_are_the_providers_own() -> None:
    pytest.importorskip("llama_cpp")
    from inference.llamacpp_provider import KV_CACHE_TYPES

    setting = next(setting for setting in SETTINGS["llamacpp"] if setting.key == "kv_cache_type")
    assert setting.choices == tuple(KV_CACHE_TYPES)


def test_every_constructor_argument_is_a_setting_but_the_documented_ones() -> None:
    """What a step config, ``--set`` and the variables can set is what the constructors take."""
    constructor_only = {
        "llamacpp": {"seed"},
        "vllm-offline": {"engine_arguments"},
        "transformers": {"model_kwargs", "model", "tokenizer"},  # Python objects: no variable can hold them
    }
    for name, spec in PROVIDERS.items():
        if importlib.util.find_spec(spec.module) is None:
            continue
        try:
            cls = load_provider_class(name)
        except ImportError:
            continue
        parameters = set(inspect.signature(cls).parameters)
        assert parameters - {setting.key for setting in spec.settings} == constructor_only.get(name, set()), name


def test_a_misspelt_setting_is_refused_with_the_setting_it_resembles(
    clean_env: pytest.MonkeyPatch, gguf_path: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        get_provider_for_step({"provider": "llamacpp", "model_path": gguf_path, "n_ctxx": 2048})
    message = str(caught.value)
    assert "'n_ctxx' is not a setting of the llamacpp provider; did you mean 'n_ctx'?" in message
    assert "model_path, n_ctx, n_gpu_layers" in message and caught.value.provider == "llamacpp"
    with pytest.raises(ConfigurationError, match="did you mean 'max_retries'"):
        get_provider_for_step({"provider": "vllm", "max_retry": 0})


def test_another_providers_setting_is_refused_naming_its_provider(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError) as caught:
        get_provider_for_step({"provider": "transformers", "model_name": "models/tiny", "kv_cache_type": "f32"})
    message = str(caught.value)
    assert "'kv_cache_type' is a setting of the llamacpp provider, not of transformers" in message
    assert "use provider 'llamacpp'" in message and "model_name, device, torch_dtype" in message
    with pytest.raises(ConfigurationError, match="'max_retries' is a setting of the vllm, openai, ollama"):
        resolve_settings("transformers", {"max_retries": 5})
    assert resolve_settings("transformers", {"timeout": 5})  # the option of every call, not a server's setting


def test_the_steps_own_keys_and_absent_values_are_left_alone(clean_env: pytest.MonkeyPatch) -> None:
    step = {"provider": "vllm", "name": "plan", "model": "m", "prompt": "{task}", "max_tokens": 8,
            "temperature": 0.0, "adapter_id": "a", "adapter_path": "/a", "kv_cache_type": None, "tool": "t"}
    assert get_provider_for_step(step) is get_provider_for_step({"provider": "vllm"})


def test_the_example_agent_steps_are_accepted(clean_env: pytest.MonkeyPatch, gguf_path: str) -> None:
    spec = importlib.util.spec_from_file_location("agent_loop_example_keys", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    clean_env.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    steps = module.default_steps(base_url=None, server_model="m", model_path=gguf_path, adapter_path="/a")
    for step in steps:
        if "provider" in step:
            get_provider_for_step(step)


def test_the_fake_stands_in_for_any_provider_but_catches_misspellings(clean_env: pytest.MonkeyPatch) -> None:
    fake = get_provider_for_step({"provider": "fake", "model_path": "m.gguf", "n_ctx": 512, "max_adapters": 2})
    assert isinstance(fake, FakeProvider) and fake.max_adapters == 2
    with pytest.raises(ConfigurationError, match="did you mean 'max_adapters'"):
        get_provider_for_step({"provider": "fake", "max_adapter": 2})


def test_no_step_key_is_mistaken_for_a_setting() -> None:
    """The step's own keys are never settings of a provider, besides base_url (the servers' own) and the two
    options that are also a setting of the same meaning where a provider has it: ``timeout`` (a server's seconds per
    answer; the option bounds each call) and ``raw_prompt`` (the provider's default; the option, each request)."""
    keys = {setting.key for settings in SETTINGS.values() for setting in settings}
    assert STEP_KEYS & keys == {"base_url", "timeout", "raw_prompt"}


SWITCHES = [(name, setting) for name, settings in SETTINGS.items() for setting in settings if setting.kind == "bool"]


@pytest.mark.parametrize(("provider", "setting"), SWITCHES, ids=[setting.env_var for _, setting in SWITCHES])
def test_every_switch_reads_the_usual_words_and_refuses_the_rest(provider: str, setting: Any) -> None:
    for text, value in [(" TRUE ", True), ("1", True), ("yes", True), ("on", True), ("False", False), ("0", False),
                        ("no", False), ("off", False)]:
        assert resolve_settings(provider, {}, {setting.env_var: text})[setting.key] is value
        assert resolve_settings(provider, {setting.key: text}, {})[setting.key] is value
    for bad in ("maybe", "2", 1, [True]):
        with pytest.raises(ConfigurationError, match=rf"{setting.key} must be true or false"):
            resolve_settings(provider, {setting.key: bad}, {})
    with pytest.raises(ConfigurationError, match=rf"environment variable {setting.env_var}='maybe'"):
        resolve_settings(provider, {}, {setting.env_var: "maybe"})
