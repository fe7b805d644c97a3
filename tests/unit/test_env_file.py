"""Settings from a ``.env`` file: argument > step config > process environment > ``.env`` > default, for the SDK and
the ``inference`` command line."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

import inference.config
from inference import ConfigurationError, FakeProvider, UnknownProviderError, get_provider, get_provider_for_step
from inference.cli import main
from inference.config import SDK_SETTINGS, SETTINGS, render_env_example, resolve_provider_type, resolve_settings

DEAD_FROM_FILE = "http://127.0.0.1:9/v1"  # the discard port: nothing answers


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory, and a process environment without any variable the SDK reads."""
    monkeypatch.chdir(tmp_path)
    for setting in (*SDK_SETTINGS, *(setting for settings in SETTINGS.values() for setting in settings)):
        monkeypatch.delenv(setting.env_var, raising=False)
    monkeypatch.delenv("INFERENCE_PROVIDER", raising=False)
    return tmp_path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_dotenv_file_in_the_current_directory_configures_providers(workdir: Path) -> None:
    (workdir / ".env").write_text("# settings\nINFERENCE_PROVIDER=fake\nexport FAKE_MAX_ADAPTERS='3'\n")
    provider = get_provider()
    assert isinstance(provider, FakeProvider)
    assert provider.max_adapters == 3


def test_the_process_environment_beats_the_file_and_arguments_beat_both(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workdir / ".env").write_text("FAKE_MAX_ADAPTERS=3\nFAKE_CONTEXT_LENGTH=64\n")
    monkeypatch.setenv("FAKE_MAX_ADAPTERS", "5")
    assert resolve_settings("fake", {})["max_adapters"] == 5  # process environment over .env
    assert resolve_settings("fake", {})["context_length"] == 64  # .env over the default
    assert get_provider_for_step({"provider": "fake", "max_adapters": 7}).max_adapters == 7  # step config
    assert FakeProvider(max_adapters=9).max_adapters == 9  # argument
    monkeypatch.setenv("FAKE_MAX_ADAPTERS", "")  # empty counts as not set: the file's value applies
    assert resolve_settings("fake", {})["max_adapters"] == 3


def test_a_dotenv_file_replaced_by_one_of_the_same_size_and_time_is_read_again(workdir: Path) -> None:
    """A deploy that puts a new ``.env`` in place (``os.replace`` of a file copied with ``cp -p`` or ``rsync -t``, or
    written in the same clock tick) keeps the size and the modification time: the old values were kept."""
    env = workdir / ".env"
    env.write_text("FAKE_MAX_ADAPTERS=3\n")
    assert resolve_settings("fake", {})["max_adapters"] == 3
    before = env.stat()
    new = workdir / "new.env"
    new.write_text("FAKE_MAX_ADAPTERS=4\n")
    os.utime(new, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(new, env)
    after = env.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert resolve_settings("fake", {})["max_adapters"] == 4


@pytest.mark.parametrize("blank", [" ", "\t", "  \n"])
def test_a_blank_variable_counts_as_not_set_as_an_empty_one_does(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    """``VLLM_API_KEY=" "`` in the process environment silently dropped the key of ``.env`` (it was read as a value,
    which a setting that may be empty takes for none), and a blank variable with no value in the file was refused
    for a setting that may not be empty, where an empty one gives the default."""
    (workdir / ".env").write_text("VLLM_API_KEY=sk-from-the-file\nVLLM_MAX_LORAS=3\nVLLM_HOST=gpu\n"
                                  "VLLM_BASE_URL=http://${VLLM_HOST}:8100/v1\n")
    for variable in ("VLLM_API_KEY", "VLLM_MAX_LORAS"):
        monkeypatch.setenv(variable, blank)
    settings = resolve_settings("vllm", {})
    assert (settings["api_key"], settings["max_loras"]) == ("sk-from-the-file", 3)  # the file's, as for ""
    for variable in ("VLLM_HOST", "VLLM_TIMEOUT", "INFERENCE_PROVIDER"):  # in an expansion; no value in the file
        monkeypatch.setenv(variable, blank)
    settings = resolve_settings("vllm", {})
    assert settings["base_url"] == "http://gpu:8100/v1" and settings["timeout"] == 120.0
    assert resolve_provider_type(None) == "vllm"


def test_the_process_environment_wins_inside_an_expansion_too(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``${OTHER}`` reads OTHER by the same precedence as a setting: the process environment over the file (an
    empty variable counts as not set), and a file's variable above the line."""
    (workdir / ".env").write_text(
        "OLLAMA_HOST_NAME=dev-box\nOLLAMA_BASE_URL=http://${OLLAMA_HOST_NAME}:11434/v1\n"
        "OLLAMA_BASE_MODEL=${MODEL_FAMILY:-llama3.2}\n"
    )
    assert resolve_settings("ollama", {})["base_url"] == "http://dev-box:11434/v1"
    monkeypatch.setenv("OLLAMA_HOST_NAME", "prod-box")
    monkeypatch.setenv("MODEL_FAMILY", "qwen2.5")
    assert resolve_settings("ollama", {})["base_url"] == "http://prod-box:11434/v1"  # without the file changing
    assert resolve_settings("ollama", {})["base_model"] == "qwen2.5"
    monkeypatch.setenv("OLLAMA_HOST_NAME", "")
    monkeypatch.setenv("MODEL_FAMILY", "")
    assert resolve_settings("ollama", {})["base_url"] == "http://dev-box:11434/v1"
    assert resolve_settings("ollama", {})["base_model"] == "llama3.2"


def test_inference_env_file_names_the_file_and_a_missing_one_is_an_error(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workdir / ".env").write_text("FAKE_MAX_ADAPTERS=3\n")
    other = workdir / "prod.env"
    other.write_text("FAKE_MAX_ADAPTERS=4\n")
    monkeypatch.setenv("INFERENCE_ENV_FILE", str(other))
    assert resolve_settings("fake", {})["max_adapters"] == 4
    monkeypatch.setenv("INFERENCE_ENV_FILE", "/dev/null")
    assert resolve_settings("fake", {})["max_adapters"] is None
    monkeypatch.setenv("INFERENCE_ENV_FILE", str(workdir / "missing.env"))
    with pytest.raises(ConfigurationError, match=r"INFERENCE_ENV_FILE=.*missing\.env.* names no file"):
        resolve_settings("fake", {})


def test_bad_values_and_lines_name_the_file_and_never_show_a_line(workdir: Path) -> None:
    env = workdir / ".env"
    env.write_text("FAKE_CONTEXT_LENGTH=0\n")
    with pytest.raises(ConfigurationError, match=r"FAKE_CONTEXT_LENGTH='0' in the \.env file .*\.env is not valid"):
        FakeProvider()
    env.write_text("INFERENCE_PROVIDER=fak\n")
    with pytest.raises(UnknownProviderError, match=r"INFERENCE_PROVIDER value in the \.env file"):
        resolve_provider_type(None)
    env.write_text("VLLM_TIMEOUT=5\nVLLM_API_KEY sk-secret-value\n")
    with pytest.raises(ConfigurationError, match=r"line 2") as caught:
        resolve_settings("vllm", {})
    assert "sk-secret" not in str(caught.value)
    env.write_bytes(b"VLLM_TIMEOUT=5\nX=\xff\n")
    with pytest.raises(ConfigurationError, match=r"not UTF-8 text .*line 2"):
        resolve_settings("vllm", {})


def test_env_example_copied_to_dotenv_and_uncommented_gives_the_defaults(workdir: Path, repo_root: Path) -> None:
    example = (repo_root / ".env.example").read_text(encoding="utf-8")
    assert example == render_env_example()
    uncommented = "\n".join(
        line[2:] if line.startswith("# ") and "=" in line and line[2:].split("=")[0].isupper() else line
        for line in example.splitlines()
    )
    (workdir / ".env").write_text(uncommented.replace("INFERENCE_ENV_FILE=", "#"), encoding="utf-8")
    assert resolve_provider_type(None) == "vllm"
    for provider_type, settings in SETTINGS.items():
        defaults = {setting.key: setting.check(setting.default, origin="default") for setting in settings}
        assert resolve_settings(provider_type, {}) == defaults, provider_type


def test_the_command_line_reads_the_dotenv_file_and_the_process_environment_wins(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / ".env").write_text(f"INFERENCE_PROVIDER=fake\nVLLM_BASE_URL={DEAD_FROM_FILE}\nVLLM_MAX_RETRIES=0\n")
    status, out, err = run(["generate", "Hello", "--max-tokens", "3", "--json"], capsys)
    assert status == 0, err
    assert json.loads(out)["text"].startswith("[base] ")  # the fake answered: INFERENCE_PROVIDER came from .env

    status, out, err = run(["providers", "--json"], capsys)
    assert status == 0, err
    vllm = next(report for report in json.loads(out)["providers"] if report["name"] == "vllm")
    assert vllm["base_url"] == DEAD_FROM_FILE and vllm["reachable"] is False

    monkeypatch.setenv("INFERENCE_PROVIDER", "vllm")  # the process environment beats the file
    status, out, err = run(["generate", "Hello", "--max-tokens", "3", "--model", "m"], capsys)
    assert status == 1 and out == ""
    assert "127.0.0.1:9" in err and len(err.strip().splitlines()) == 1

    status, out, err = run(["generate", "Hello", "--provider", "fake", "--max-tokens", "3"], capsys)  # the flag wins
    assert status == 0, err


def test_a_bad_dotenv_value_is_one_error_line_naming_the_file(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / ".env").write_text("FAKE_CONTEXT_LENGTH=zero\n")
    status, out, err = run(["generate", "Hello", "--provider", "fake"], capsys)
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and f"in the .env file {workdir / '.env'}" in err
    status, _, err = run(["generate", "Hello", "--provider", "fake", "--set", "context_length=8"], capsys)
    assert status == 0, err  # the flag beats the file


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a new process: no variable looked at yet, so none warned about."""
    monkeypatch.setattr(inference.config, "_looked_at", set(), raising=False)
    monkeypatch.setattr(inference.config, "_warned", set(), raising=False)


LLAMA_SERVER_VARIABLES = ("LLAMA_ARG_MODEL", "LLAMA_ARG_N_PARALLEL", "LLAMA_ARG_FLASH_ATTN", "LLAMA_ARG_N_GPU_LAYERS",
                          "LLAMA_ARG_THREADS", "LLAMA_API_KEY", "LLAMA_CPP_LIB_PATH")
"""Variables llama.cpp's own programs read (llama-server, llama-cpp-python), which look like misspelt LLAMACPP_..."""


def test_a_misspelt_variable_is_one_warning_naming_the_variable_it_meant(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fresh_warnings: None
) -> None:
    (workdir / ".env").write_text(
        "INFERENCE_PROVDER=fake\nFAKE_MAX_ADAPTER=1\nLLAMCPP_MODEL_PATH=m.gguf\nOLLAMA_HOST_NAME=box\n"
        + "".join(f"{name}=1\n" for name in LLAMA_SERVER_VARIABLES)  # a .env beside llama-server's docker service
    )
    monkeypatch.setenv("INFERENCE_LOG_LEVL", "debug")
    others = {"VLLM_RPC_TIMEOUT": "10000", "OLLAMA_MODELS": "/srv/models", "OPENAI_API_BASE": "http://x/v1",
              "TRANSFORMERS_OFFLINE": "1", "INFERENCE_HOME": "/opt/other"}  # other programs' variables
    for name, value in others.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="inference"):
        provider = get_provider()
        get_provider()  # once per name, not once per call
    assert not isinstance(provider, FakeProvider)  # the misspelt line still changes nothing: vllm, the default
    said = {record.variable: record.getMessage() for record in caplog.records if hasattr(record, "variable")}
    assert [getattr(record, "variable", None) for record in caplog.records].count("FAKE_MAX_ADAPTER") == 1
    env_file = workdir / ".env"
    assert said["INFERENCE_PROVDER"] == (
        f"INFERENCE_PROVDER in the .env file {env_file} is not a variable the inference SDK reads, so it changes "
        "nothing: did you mean INFERENCE_PROVIDER?"
    )
    assert said["FAKE_MAX_ADAPTER"].endswith("did you mean FAKE_MAX_ADAPTERS?")
    assert said["LLAMCPP_MODEL_PATH"].endswith("did you mean LLAMACPP_MODEL_PATH?")
    assert said["INFERENCE_LOG_LEVL"].startswith("environment variable INFERENCE_LOG_LEVL is not a variable")
    assert said["INFERENCE_LOG_LEVL"].endswith("did you mean INFERENCE_LOG_LEVEL?")
    assert not set(said) & {*others, *LLAMA_SERVER_VARIABLES, "OLLAMA_HOST_NAME"}  # none about what is no misspelling


def test_a_dotenv_line_that_does_not_parse_is_a_refusal_of_the_commands_that_read_settings(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / ".env").write_text("GOOD=1\nthis is not a pair\n")
    status, out, err = run(["generate", "Hello", "--provider", "fake"], capsys)
    assert (status, out) == (1, "")  # a file the SDK reads: a refusal, as for a bad value in it
    assert err.startswith("inference: error: the .env file") and "line 2" in err and err.count("\n") == 1
    status, out, err = run(["convert-adapter", str(workdir / "no-adapter"), "--base", str(workdir / "no.gguf"),
                            "-o", str(workdir / "out.gguf")], capsys)  # reads no setting: the .env is not its concern
    assert status == 1 and ".env" not in err and "no.gguf does not exist" in err  # its own error, not the file's
    status, out, err = run(["--log-level", "loud", "generate", "Hello", "--provider", "fake"], capsys)
    assert status == 2  # a bad option is still a usage error


def test_a_bad_log_variable_in_the_dotenv_file_is_still_a_usage_error(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workdir / ".env").write_text("INFERENCE_LOG_FORMAT=yaml\n")
    status, out, err = run(["generate", "Hello", "--provider", "fake"], capsys)
    assert (status, out) == (2, "") and f"in the .env file {workdir / '.env'}" in err
