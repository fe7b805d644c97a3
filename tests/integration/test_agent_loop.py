"""examples/agent_loop.py against real backends: a llama_cpp.server planner and an in-process llama.cpp writer."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from inference import get_provider_for_step
from inference.llamacpp_provider import LlamaCppProvider
from inference.vllm_provider import VLLMProvider

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_loop.py"


@pytest.fixture(scope="module")
def agent_loop() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agent_loop_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def tiny_steps(agent_loop: ModuleType, tiny_models: dict[str, Any], base_url: str) -> list[dict[str, Any]]:
    qwen2 = tiny_models["qwen2"]
    steps: list[dict[str, Any]] = agent_loop.default_steps(
        base_url=base_url,
        server_model="tiny-qwen2",
        model_path=str(qwen2.gguf_path),
        adapter_path=str(qwen2.adapter_dirs["a0"]),
        max_tokens=12,
    )
    return steps


async def test_steps_run_on_their_configured_providers_and_outputs_flow(
    agent_loop: ModuleType, tiny_models: dict[str, Any], llama_server: str
) -> None:
    steps = tiny_steps(agent_loop, tiny_models, llama_server)
    async with agent_loop.AgentLoop(steps, max_rounds=2) as agent:
        planner, writer = get_provider_for_step(steps[0]), get_provider_for_step(steps[1])
        assert isinstance(planner, VLLMProvider) and planner.base_url == llama_server
        assert isinstance(writer, LlamaCppProvider)
        assert await writer.list_adapters() == ["writer"]  # loaded (converted from PEFT) on entry
        records = await agent.run("Plan a hike.")
        base = await writer.generate(records[2].prompt, model="tiny", max_tokens=12, temperature=0.0)

    # a random tiny model never stops within 12 tokens, so the check rejects each draft: two full rounds; these
    # backends do not call tools yet, so the loop runs the planner's tool on its answer
    assert [(record.round, record.name, record.provider) for record in records] == [
        (1, "plan", "vllm"), (1, "key_words", "tool"), (1, "write", "llamacpp"),
        (2, "plan", "vllm"), (2, "key_words", "tool"), (2, "write", "llamacpp"),
    ]
    plan, notes, write = records[:3]
    assert plan.result is not None and plan.result.model == "tiny-qwen2" and plan.result.completion_tokens > 0
    assert notes.prompt == plan.output and notes.output == agent_loop.key_words(plan.output)
    assert write.prompt == f"Plan a hike. Key points: {notes.output}."
    assert write.adapter_id == "writer" and write.result is not None and write.result.adapter_id == "writer"
    assert write.output != base.text  # the adapter changed the writer's answer
    assert "Feedback: The last draft was cut off after 12 tokens" in records[3].prompt


def test_the_script_prints_each_steps_provider_adapter_and_output(
    tiny_models: dict[str, Any], llama_server: str
) -> None:
    qwen2 = tiny_models["qwen2"]
    completed = subprocess.run(
        [
            sys.executable, str(EXAMPLE),
            "--model-path", str(qwen2.gguf_path),
            "--adapter", str(qwen2.adapter_dirs["a1"]),
            "--base-url", llama_server,
            "--max-rounds", "1",
            "--max-tokens", "8",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("task: ")
    assert lines[1].startswith("round 1  plan      provider=vllm     adapter=-")
    assert lines[2].startswith("round 1  key_words provider=tool     adapter=-")
    assert lines[3].startswith("round 1  write     provider=llamacpp adapter=writer")
    assert lines[4].startswith("done after 1 round(s); answer: ")


def test_an_unreachable_server_fails_with_a_sentence(tiny_models: dict[str, Any]) -> None:
    qwen2 = tiny_models["qwen2"]
    completed = subprocess.run(
        [sys.executable, str(EXAMPLE), "--model-path", str(qwen2.gguf_path), "--base-url", "http://127.0.0.1:9/v1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "VLLM_MAX_RETRIES": "0"},
    )
    assert completed.returncode == 1
    assert completed.stderr.startswith("error: ") and "127.0.0.1:9" in completed.stderr
