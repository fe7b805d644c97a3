"""Every setting is checked against its rule in config.SETTINGS when a provider is built, whatever the source."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from inference.config import SETTINGS, Setting, render_configuration_table, resolve_settings, validate_setting
from inference.exceptions import ConfigurationError, UnknownProviderError
from inference.factory import get_provider, get_provider_for_step, provider_recipe
from inference.ollama_provider import OllamaProvider
from inference.vllm_provider import VLLMProvider

ALL_SETTINGS = [(provider, setting) for provider, settings in SETTINGS.items() for setting in settings]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("INFERENCE_PROVIDER", raising=False)
    for _, setting in ALL_SETTINGS:
        monkeypatch.delenv(setting.env_var, raising=False)
    return monkeypatch


# The reported defects ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["-5", "0", "nan", "inf", "-inf", "soon"])
def test_a_vllm_timeout_that_is_not_a_positive_finite_number_fails_when_the_provider_is_built(
    clean_env: pytest.MonkeyPatch, text: str
) -> None:
    clean_env.setenv("VLLM_TIMEOUT", text)
    with pytest.raises(ConfigurationError) as caught:
        get_provider("vllm")
    message = str(caught.value)
    assert f"VLLM_TIMEOUT={text!r}" in message and "finite number above 0" in message
    assert "unset it" in message and caught.value.provider == "vllm"


@pytest.mark.parametrize("timeout", [-3, 0, 0.0, math.nan, math.inf, True, "-3"])
def test_a_timeout_argument_is_checked_by_the_constructor_too(clean_env: pytest.MonkeyPatch, timeout: Any) -> None:
    for build in (lambda: VLLMProvider(timeout=timeout), lambda: OllamaProvider(timeout=timeout)):
        with pytest.raises(ConfigurationError, match=r"setting timeout=.* is not valid: timeout must be a finite"):
            build()


def test_negative_max_retries_are_refused_instead_of_becoming_zero(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("VLLM_MAX_RETRIES", "-3")
    with pytest.raises(ConfigurationError, match=r"VLLM_MAX_RETRIES='-3'.*integer in \[0, 100\]"):
        get_provider("vllm")
    with pytest.raises(ConfigurationError, match="max_retries"):
        OllamaProvider(max_retries=-1)


def test_a_step_config_value_of_the_wrong_type_names_the_setting(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError) as caught:
        get_provider_for_step({"provider": "vllm", "max_retries": "lots"})
    assert "max_retries='lots'" in str(caught.value) and "VLLM_MAX_RETRIES" in str(caught.value)
    with pytest.raises(ConfigurationError, match="not a dict: n_ctx must be a positive integer"):
        get_provider_for_step({"provider": "llamacpp", "model_path": "m.gguf", "n_ctx": {"size": 4}})


def test_step_config_numbers_written_as_text_are_parsed_like_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    provider = get_provider_for_step({"provider": "vllm", "max_retries": "3", "timeout": " 7.5 "})
    assert isinstance(provider, VLLMProvider)
    assert (provider.max_retries, provider.timeout) == (3, 7.5)
    assert get_provider_for_step({"provider": "vllm", "max_retries": 3, "timeout": 7.5}) is provider


def test_a_provider_type_that_is_not_a_string_is_an_unknown_provider(clean_env: pytest.MonkeyPatch) -> None:
    for provider_type in (["vllm"], {"vllm": 1}, 3):
        with pytest.raises(UnknownProviderError, match="valid names are"):
            get_provider_for_step({"provider": provider_type})


# The table itself ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("provider", "setting"), ALL_SETTINGS, ids=[s.env_var for _, s in ALL_SETTINGS])
def test_every_default_follows_its_own_rule(provider: str, setting: Setting) -> None:
    assert setting.check(setting.default, origin="default", provider=provider) == setting.default


@pytest.mark.parametrize(
    ("provider", "setting"),
    [(p, s) for p, s in ALL_SETTINGS if s.kind in ("int", "float")],
    ids=[s.env_var for _, s in ALL_SETTINGS if s.kind in ("int", "float")],
)
def test_every_number_setting_has_bounds_and_refuses_nonsense_from_every_source(
    clean_env: pytest.MonkeyPatch, provider: str, setting: Setting
) -> None:
    assert setting.minimum is not None, f"{setting.env_var} accepts any number"
    for bad in (True, "lots", math.nan, setting.minimum - 1, [1]):
        with pytest.raises(ConfigurationError, match=rf"setting {setting.key}="):
            resolve_settings(provider, {setting.key: bad})
    for text in ("lots", "nan", str(setting.minimum - 1)):
        with pytest.raises(ConfigurationError, match=rf"environment variable {setting.env_var}="):
            resolve_settings(provider, {}, {setting.env_var: text})


def test_optional_settings_take_empty_as_none_and_numbers_as_text() -> None:
    assert resolve_settings("llamacpp", {"max_adapters": ""}, {"LLAMACPP_MAX_ADAPTERS": "5"})["max_adapters"] is None
    assert resolve_settings("llamacpp", {}, {"LLAMACPP_MAX_ADAPTERS": "5"})["max_adapters"] == 5
    assert resolve_settings("vllm", {"api_key": ""})["api_key"] is None


def test_choices_and_patterns_are_declared_once_and_normalise_the_text() -> None:
    settings = resolve_settings("transformers", {"device": " CUDA:1 ", "torch_dtype": "BFloat16"})
    assert (settings["device"], settings["torch_dtype"]) == ("cuda:1", "bfloat16")
    with pytest.raises(ConfigurationError, match="'cpu', 'cuda', 'cuda:N' or 'mps'"):
        resolve_settings("transformers", {}, {"TRANSFORMERS_DEVICE": "gpu"})
    with pytest.raises(ConfigurationError, match="one of 'auto', 'float32'"):
        resolve_settings("transformers", {"torch_dtype": "float8"})


def test_validate_setting_checks_one_value_for_constructors_and_the_cli() -> None:
    assert validate_setting("vllm", "timeout", "30") == 30.0
    assert validate_setting("llamacpp", "max_adapters", None) is None
    with pytest.raises(ConfigurationError, match="VLLM_TIMEOUT"):
        validate_setting("vllm", "timeout", -1)
    with pytest.raises(ConfigurationError, match="'timeout' is not a setting of the llamacpp provider"):
        validate_setting("llamacpp", "timeout", 3)


def test_the_docs_table_shows_each_rule() -> None:
    table = render_configuration_table()
    assert "| `VLLM_TIMEOUT` | `120.0` | Seconds to wait for one answer | a finite number above 0 |" in table
    assert "| `LLAMACPP_MAX_ADAPTERS` |  |" in table and "a positive integer, or empty for no limit" in table


# Paths in settings ----------------------------------------------------------------------------------------


def test_a_tilde_in_a_path_setting_is_expanded(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("HOME", str(tmp_path))
    clean_env.setenv("LLAMACPP_MODEL_PATH", "~/models/base.gguf")
    settings = resolve_settings("llamacpp", {"adapter_cache_dir": "~/cache"})
    assert settings["model_path"] == str(tmp_path / "models" / "base.gguf")
    assert settings["adapter_cache_dir"] == str(tmp_path / "cache")
    assert resolve_settings("transformers", {"model_name": "~/tiny"})["model_name"] == str(tmp_path / "tiny")
    assert not (Path.cwd() / "~").exists()


def test_a_relative_path_setting_names_the_file_of_the_directory_it_was_resolved_in(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for directory in (first, second):
        directory.mkdir()
        (directory / "model.gguf").write_bytes(b"GGUF")
    clean_env.setenv("LLAMACPP_MODEL_PATH", "model.gguf")
    clean_env.setenv("LLAMACPP_SERVER_ADAPTER_CACHE_DIR", "cache")
    clean_env.chdir(first)
    in_first = get_provider("llamacpp-server")
    assert resolve_settings("llamacpp", {})["model_path"] == str(first / "model.gguf")
    first_key = provider_recipe("llamacpp").key
    clean_env.chdir(second)
    in_second = get_provider("llamacpp-server")
    assert in_second is not in_first  # two directories' "cache": two providers, each with its own
    assert in_first.adapter_cache_dir == first / "cache"  # still the first one, whatever the current directory
    assert in_second.adapter_cache_dir == second / "cache"
    assert resolve_settings("llamacpp", {})["model_path"] == str(second / "model.gguf")
    assert provider_recipe("llamacpp").key != first_key  # two model files: two cached providers


def test_a_hub_id_in_a_model_setting_stays_an_id_unless_it_names_a_local_path(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_env.chdir(tmp_path)
    assert resolve_settings("llamacpp", {"model_path": "Org/Name:model-q4.gguf"})["model_path"] == (
        "Org/Name:model-q4.gguf"
    )
    assert resolve_settings("transformers", {"model_name": "Qwen/Qwen2.5-0.5B"})["model_name"] == "Qwen/Qwen2.5-0.5B"
    (tmp_path / "Qwen" / "Qwen2.5-0.5B").mkdir(parents=True)  # a local directory of that name wins, as on load
    assert resolve_settings("transformers", {"model_name": "Qwen/Qwen2.5-0.5B"})["model_name"] == str(
        tmp_path / "Qwen" / "Qwen2.5-0.5B"
    )
    assert resolve_settings("llamacpp", {"adapter_cache_dir": "org/cache"})["adapter_cache_dir"] == str(
        tmp_path / "org" / "cache"
    )  # a directory setting is never a Hub id


def test_an_adapter_cache_dir_that_cannot_be_a_directory_fails_at_construction(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("llama_cpp")
    from inference.llamacpp_provider import LlamaCppProvider

    a_file = tmp_path / "cache"
    a_file.write_text("not a directory")
    with pytest.raises(ConfigurationError) as caught:
        LlamaCppProvider(tmp_path / "m.gguf", adapter_cache_dir=a_file)
    assert f"directory {a_file} exists but is not a directory" in str(caught.value)
    assert caught.value.path == str(a_file)
    clean_env.setenv("LLAMACPP_ADAPTER_CACHE_DIR", str(a_file / "below"))
    with pytest.raises(ConfigurationError, match=rf"LLAMACPP_ADAPTER_CACHE_DIR=.*{a_file} is not a directory"):
        get_provider_for_step({"provider": "llamacpp", "model_path": str(tmp_path / "m.gguf")})
    clean_env.setenv("LLAMACPP_ADAPTER_CACHE_DIR", str(tmp_path / "new" / "cache"))
    provider = LlamaCppProvider(tmp_path / "m.gguf")
    assert provider.adapter_cache_dir == tmp_path / "new" / "cache"
    assert not (tmp_path / "new").exists()  # checked, not created


def test_a_path_setting_with_a_nul_character_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="NUL character at position 1"):
        resolve_settings("llamacpp", {"model_path": "m\0.gguf"})


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://localhost:abc/v1", "its port is not a number"),
        ("http://localhost:99999/v1", "its port is not a number"),
        ("http://local host/v1", "whitespace at position 12"),
        ("http://h\ud800/v1", "cannot be encoded as UTF-8"),
    ],
)
def test_a_base_url_no_http_client_can_use_fails_when_the_provider_is_built(url: str, reason: str) -> None:
    with pytest.raises(ConfigurationError, match=reason):
        VLLMProvider(base_url=url)
    with pytest.raises(ConfigurationError, match=rf"environment variable OLLAMA_BASE_URL .*{reason}"):
        resolve_settings("ollama", {}, {"OLLAMA_BASE_URL": url})


def test_blanks_around_a_base_url_are_dropped() -> None:
    assert resolve_settings("vllm", {}, {"VLLM_BASE_URL": " http://gpu:8100/v1/\n"})["base_url"] == "http://gpu:8100/v1"
