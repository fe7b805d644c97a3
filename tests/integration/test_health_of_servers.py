"""``inference health`` on real servers: two ``llama_cpp.server`` replicas behind the vLLM provider, one killed,
then both; and the in-process llama.cpp provider before and after its model loads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inference import LlamaCppProvider
from inference.exceptions import ModelLoadError

pytestmark = pytest.mark.integration


def health(*argv: str) -> tuple[int, dict[str, Any], str]:
    """``inference health ARGV --json`` in a process of its own, as a container probe runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "inference.cli", "health", *argv, "--json"], capture_output=True, text=True, timeout=120
    )
    return done.returncode, json.loads(done.stdout), done.stderr


def test_two_replicas_up_then_one_killed_then_both(start_llama_server: Callable[..., Any]) -> None:
    first, second = start_llama_server(), start_llama_server()
    urls = f"{first.base_url},{second.base_url}"

    status, report, err = health("--provider", "vllm", "--base-url", urls)
    assert status == 0, err
    assert report["status"] == "up"
    assert [backend["name"] for backend in report["backends"]] == [first.base_url, second.base_url]
    for backend in report["backends"]:
        assert backend["up"] and backend["latency_s"] > 0 and len(backend["models"]) == 1

    second.kill()
    status, report, _ = health("--provider", "vllm", "--base-url", urls)
    assert status == 1 and report["status"] == "degraded"
    assert [backend["up"] for backend in report["backends"]] == [True, False]
    assert "ConnectError" in report["backends"][1]["error"]

    first.kill()
    status, report, _ = health("--provider", "openai", "--base-url", urls)
    assert status == 2 and report["status"] == "down"


async def test_in_process_health_says_whether_the_model_is_loaded(tiny_models: dict[str, Any], tmp_path: Path) -> None:
    model = tiny_models["qwen2"]
    async with LlamaCppProvider(model.gguf_path, n_ctx=256) as provider:
        before = await provider.health()
        assert before.status == "up"
        assert (before.backends[0].model_loaded, before.backends[0].adapters) == (False, ())
        await provider.load_adapter("a1", model.adapter_dirs["a1"])
        await provider.generate("Hi", model="", adapter_id="a1", max_tokens=1)
        after = await provider.health()
        assert (after.status, after.backends[0].model_loaded, after.backends[0].adapters) == ("up", True, ("a1",))
        assert after.backends[0].models == (str(model.gguf_path),)
    assert (await provider.health()).status == "down"  # closed

    status, report, _ = health("--provider", "llamacpp", "--model-path", str(tmp_path / "missing.gguf"))
    assert status == 2 and "does not exist" in report["backends"][0]["error"]


async def test_a_llamacpp_model_that_failed_to_load_is_down_until_a_load_succeeds(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "base.gguf"
    path.write_bytes(b"GGUF" + bytes(64))  # a GGUF header and nothing else: llama.cpp cannot load it
    async with LlamaCppProvider(path, n_ctx=256) as provider:
        assert (await provider.health()).status == "up"  # not loaded yet: loads on the first request
        for _ in range(2):
            with pytest.raises(ModelLoadError):
                await provider.generate("Hi", model="", max_tokens=1)
            health = await provider.health()
            assert (health.status, health.exit_code, health.backends[0].model_loaded) == ("down", 2, False)
            said = health.backends[0].error or ""
            assert said.startswith(f"the model failed to load: llama.cpp could not load {path}")
        shutil.copyfile(tiny_models["qwen2"].gguf_path, path)  # the file fixed: the next request loads it
        await provider.generate("Hi", model="", max_tokens=1)
        health = await provider.health()
        assert (health.status, health.backends[0].model_loaded, health.backends[0].error) == ("up", True, None)


async def test_a_transformers_model_that_failed_to_load_is_down_until_a_load_succeeds(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    from inference import TransformersProvider

    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text("{}")  # a directory that looks saved, but names no model type
    async with TransformersProvider(str(directory)) as provider:
        assert (await provider.health()).status == "up"
        with pytest.raises(ModelLoadError):
            await provider.generate("Hi", model="", max_tokens=1)
        health = await provider.health()
        assert (health.status, health.backends[0].model_loaded) == ("down", False)
        assert (health.backends[0].error or "").startswith("the model failed to load: transformers could not load")
        shutil.rmtree(directory)
        shutil.copytree(tiny_models["qwen2"].hf_dir, directory)
        await provider.generate("Hi", model="", max_tokens=1)
        health = await provider.health()
        assert (health.status, health.backends[0].model_loaded, health.backends[0].error) == ("up", True, None)



async def test_a_transformers_provider_given_a_loaded_model_is_up(tiny_models: dict[str, Any]) -> None:
    """A model handed over as an object needs no model_name: health names it and says it is in memory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inference import TransformersProvider

    hf_dir = tiny_models["qwen2"].hf_dir
    model, tokenizer = AutoModelForCausalLM.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(hf_dir)
    async with TransformersProvider(model=model, tokenizer=tokenizer) as provider:
        health = await provider.health()
        assert (health.status, health.exit_code, health.backends[0].model_loaded) == ("up", 0, True)
        assert health.backends[0].error is None and health.backends[0].name == hf_dir.name
        await provider.generate("Hi", model="", max_tokens=1)
        assert (await provider.health()).status == "up"

async def test_a_killed_and_restarted_replica_logs_its_down_and_back_events_with_fields(
    start_llama_server: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    from inference import OpenAIProvider

    first, second = start_llama_server(), start_llama_server()
    urls = f"{first.base_url},{second.base_url}"
    # replica_down_s=0: a down replica is tried again at once, not after 5 s (the setting's default)
    async with OpenAIProvider(base_url=urls, api_key="unused", max_retries=0, replica_down_s=0) as provider:

        async def ask_both() -> None:  # round-robin: two calls reach both replicas
            for _ in range(2):
                result = await provider.generate("Hi", model="tiny", max_tokens=1, temperature=0.0)
                assert result.finish_reason in ("stop", "length")

        caplog.set_level("INFO", logger="inference.replicas")
        await ask_both()
        assert not [record for record in caplog.records if hasattr(record, "replica_event")]

        second.kill()
        await ask_both()  # every call still answers, from the first replica
        downs = [record for record in caplog.records if getattr(record, "replica_event", None) == "down"]
        assert len(downs) == 1  # once, not at every try
        assert (downs[0].url, downs[0].error, downs[0].levelname) == (second.base_url, "ConnectError",
                                                                       "WARNING")

        start_llama_server(port=second.port)
        await ask_both()
        backs = [record for record in caplog.records if getattr(record, "replica_event", None) == "back"]
        assert len(backs) == 1 and backs[0].url == second.base_url and backs[0].downtime_s > 0
