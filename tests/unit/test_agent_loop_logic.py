"""The agent loop of examples/agent_loop.py, on the fake provider: tool calls, data flow, rounds, adapters, cleanup.

The fake provider calls tools, so the planner's tool loop runs whole here: the model calls ``key_words``, the loop
runs it and sends its output back as a tool message, and the model answers in text that quotes it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import respx

from inference import FakeProvider, GenerationResult, get_provider_for_step
from inference.exceptions import AdapterNotFoundError, InvalidRequestError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_loop.py"


@pytest.fixture(scope="module")
def agent_loop() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agent_loop_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def fake_steps(agent_loop: ModuleType) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = agent_loop.default_steps(
        base_url=None, server_model="planner", model_path="writer.gguf", adapter_path="/adapters/writer"
    )
    for step in steps:
        if "provider" in step:
            step["provider"] = "fake"
    return steps


async def test_the_planner_calls_its_tool_and_the_output_flows_into_the_writer(agent_loop: ModuleType) -> None:
    async with agent_loop.AgentLoop(fake_steps(agent_loop), check=lambda result: None) as agent:
        records = await agent.run("Pack for a hike.")
    notes, plan, write = records
    assert [(record.name, record.provider) for record in records] == [
        ("key_words", "tool"), ("plan", "fake"), ("write", "fake")
    ]
    # the model called the tool with arguments made from its schema; the loop ran it with those arguments
    arguments = json.loads(notes.prompt)
    assert set(arguments) <= {"text", "limit"} and "text" in arguments
    assert notes.output == agent_loop.key_words(**arguments) and notes.output != "(no key words)"
    # the tool's output went back to the model, whose text answer quotes it
    assert plan.prompt.startswith("Task: Pack for a hike.\nWrite")
    assert plan.output.startswith("[base] ") and f"key_words returned {notes.output}" in plan.output
    assert plan.result is not None and plan.result.finish_reason == "stop"
    assert write.prompt == f"Pack for a hike. Key points: {notes.output}."
    assert write.adapter_id == "writer" and write.output.startswith("[writer] ")
    assert write.result is not None and write.result.text == write.output


async def test_each_model_step_runs_on_the_provider_its_config_names(agent_loop: ModuleType) -> None:
    seen: list[Any] = []
    steps = fake_steps(agent_loop)
    async with agent_loop.AgentLoop(steps, check=lambda result: None, on_step=seen.append) as agent:
        providers = [get_provider_for_step(step) for step in steps if "provider" in step]
        records = await agent.run("task")
        # the writer's adapter was loaded into the writer's provider on entry
        assert await providers[-1].list_adapters() == ["writer"]
    assert seen == records
    assert [record.provider for record in records] == ["tool", "fake", "fake"]


async def test_a_rejected_draft_feeds_back_into_the_next_round(agent_loop: ModuleType) -> None:
    verdicts = iter(["too long", None])
    async with agent_loop.AgentLoop(fake_steps(agent_loop), check=lambda result: next(verdicts)) as agent:
        records = await agent.run("task")
    assert [(record.round, record.name) for record in records] == [
        (1, "key_words"), (1, "plan"), (1, "write"), (2, "key_words"), (2, "plan"), (2, "write"),
    ]
    assert "Feedback: too long\n" not in records[1].prompt
    assert records[4].prompt == "Task: task\nFeedback: too long\nWrite a three-point plan for the answer."
    assert records[4].output != records[1].output  # the planner saw the feedback


async def test_the_loop_stops_after_max_rounds_when_every_draft_is_rejected(agent_loop: ModuleType) -> None:
    async with agent_loop.AgentLoop(fake_steps(agent_loop), check=lambda result: "no", max_rounds=3) as agent:
        records = await agent.run("task")
    assert [record.round for record in records] == [1, 1, 1, 2, 2, 2, 3, 3, 3]


async def test_a_backend_without_tool_calling_gets_its_tools_run_by_the_loop(
    agent_loop: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeProvider, "supports_tools", False)
    async with agent_loop.AgentLoop(fake_steps(agent_loop), check=lambda result: None) as agent:
        records = await agent.run("Pack for a hike.")
    plan, notes, write = records
    assert [(record.name, record.provider) for record in records] == [
        ("plan", "fake"), ("key_words", "tool"), ("write", "fake")
    ]
    assert plan.result is not None and plan.result.tool_calls is None
    assert notes.prompt == plan.output and notes.output == agent_loop.key_words(plan.output)
    assert write.prompt == f"Pack for a hike. Key points: {notes.output}."


async def test_a_step_offers_no_tools_past_max_tool_calls(agent_loop: ModuleType) -> None:
    steps = fake_steps(agent_loop)[:1]
    async with agent_loop.AgentLoop(steps, check=lambda result: None, max_tool_calls=0) as agent:
        records = await agent.run("task")
    assert [record.name for record in records] == ["plan"]
    assert records[0].result is not None and records[0].result.tool_calls is None


def test_a_tool_failure_is_sent_back_as_a_sentence(agent_loop: ModuleType) -> None:
    call = agent_loop.AgentLoop._call_tool
    tools = {"key_words": agent_loop.key_words}
    assert call(tools, "key_words", {"text": "Water and food"}, None) == "water, and, food"
    assert call(tools, "key_words", {"txt": "x"}, None).startswith("error: key_words failed: ")
    assert call(tools, "lookup", {}, None) == "error: there is no tool 'lookup'; the tools are key_words"
    assert call(tools, "key_words", {}, "the arguments are not JSON") == "error: the arguments are not JSON"


def test_the_default_check_rejects_cut_off_or_empty_drafts(agent_loop: ModuleType) -> None:
    def result(text: str, finish_reason: str) -> GenerationResult:
        return GenerationResult(text, "m", None, 10, finish_reason, prompt_tokens=5, completion_tokens=5)

    assert agent_loop.check_draft(result("A fine answer.", "stop")) is None
    assert "cut off after 5 tokens" in agent_loop.check_draft(result("A fine", "length"))
    assert "empty" in agent_loop.check_draft(result("  ", "stop"))


def test_key_words_takes_distinct_words_in_order(agent_loop: ModuleType) -> None:
    assert agent_loop.key_words("Water, water! Food; a map and 3 maps.") == "water, food, map, and, maps"
    assert agent_loop.key_words("?? 12 !!") == "(no key words)"


async def test_a_failing_adapter_load_closes_the_providers_and_raises(agent_loop: ModuleType) -> None:
    steps = fake_steps(agent_loop)
    steps[-1]["adapter_id"] = "bad id"  # not a valid adapter id
    with pytest.raises(InvalidRequestError, match="adapter id"):
        async with agent_loop.AgentLoop(steps):
            pytest.fail("the body must not run when an adapter cannot be loaded")
    # the cache was emptied: a new provider, without the adapter, comes back for the same config
    with pytest.raises(AdapterNotFoundError):
        await get_provider_for_step(steps[0]).generate("x", model="m", adapter_id="writer")


def test_help_names_every_option_and_its_environment_variable(
    agent_loop: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        agent_loop.parse_arguments(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for option in ("--model-path", "--adapter", "--base-url", "--server-model", "--task", "--max-rounds"):
        assert option in text
    for variable in ("AGENT_MODEL_PATH", "LLAMACPP_MODEL_PATH", "AGENT_BASE_URL", "VLLM_BASE_URL"):
        assert variable in text


def test_missing_model_path_is_a_usage_error(
    agent_loop: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("AGENT_MODEL_PATH", "LLAMACPP_MODEL_PATH"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(SystemExit) as exited:
        agent_loop.parse_arguments(["--base-url", "http://127.0.0.1:1/v1"])
    assert exited.value.code == 2
    assert "--model-path" in capsys.readouterr().err


# An empty answer where text is expected ------------------------------------------------------------------------

PLANNER = "http://planner.test:8000"


def llama_cpp_server_empty_chat() -> httpx.Response:
    """What llama_cpp.server 0.3 answers chat with for the demo's Gemma GGUF, which has no chat template."""
    return httpx.Response(200, json={
        "id": "chatcmpl-cb824732", "object": "chat.completion", "created": 1795608850, "model": "gemma",
        "choices": [{"index": 0, "message": {"content": "", "role": "assistant"}, "logprobs": None,
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 31, "completion_tokens": 0, "total_tokens": 31},
    })


async def test_an_empty_plan_stops_the_loop_and_says_which_route_a_model_without_a_chat_template_needs(
    agent_loop: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner (vllm provider, its route auto: llama_cpp.server has no /tokenize, so chat) answers ''. Before,
    the notes became '(no key words)', the writer wrote from nothing and the script printed 'done'."""
    monkeypatch.delenv("VLLM_API", raising=False)
    steps = fake_steps(agent_loop)
    steps[0].update(provider="vllm", base_url=f"{PLANNER}/v1", max_retries=0)
    with respx.mock(assert_all_called=True) as router:
        router.post(f"{PLANNER}/tokenize").mock(return_value=httpx.Response(404, json={"detail": "Not Found"}))
        router.post(f"{PLANNER}/v1/chat/completions").mock(return_value=llama_cpp_server_empty_chat())
        async with agent_loop.AgentLoop(steps) as agent:
            with pytest.raises(agent_loop.EmptyAnswerError) as caught:
                await agent.run("Plan a hike.")
    message = str(caught.value)
    assert "step 'plan' got an empty answer from the vllm provider (0 tokens, finish_reason 'stop')" in message
    assert "without a chat template" in message and "--api completions" in message


def test_a_last_draft_that_stays_empty_is_an_error_not_done(
    agent_loop: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = fake_steps(agent_loop)
    steps[1] = {  # the llama.cpp step's model_path would be another provider's setting: a refused step key
        **{key: value for key, value in steps[1].items() if key != "model_path"},
        "provider": "openai", "base_url": f"{PLANNER}/v1", "adapter_id": None, "max_retries": 0,
    }
    monkeypatch.setattr(agent_loop, "default_steps", lambda **arguments: steps)
    monkeypatch.delenv("OPENAI_API", raising=False)
    with respx.mock(assert_all_called=True) as router:
        route = router.post(f"{PLANNER}/v1/chat/completions").mock(return_value=llama_cpp_server_empty_chat())
        status = asyncio.run(agent_loop.main(["--model-path", "w.gguf", "--base-url", f"{PLANNER}/v1"]))
    out, err = capsys.readouterr()
    assert status == 1 and "done" not in out
    assert route.call_count == 2  # the check's feedback asked for a second round; it was empty too
    assert err.startswith("error: no answer after 2 round(s): step 'write' got an empty answer from the openai")
    assert "--api completions" in err


async def test_an_empty_answer_nobody_reads_is_left_to_the_check(agent_loop: ModuleType) -> None:
    """The writer's empty draft goes to the check (feedback for the next round), as before."""
    steps = fake_steps(agent_loop)
    steps[1] = {  # the llama.cpp step's model_path would be another provider's setting: a refused step key
        **{key: value for key, value in steps[1].items() if key != "model_path"},
        "provider": "openai", "base_url": f"{PLANNER}/v1", "adapter_id": None, "max_retries": 0,
    }
    with respx.mock(assert_all_called=True) as router:
        router.post(f"{PLANNER}/v1/chat/completions").mock(return_value=llama_cpp_server_empty_chat())
        async with agent_loop.AgentLoop(steps, max_rounds=2) as agent:
            records = await agent.run("task")
    assert [record.name for record in records] == ["key_words", "plan", "write"] * 2
    assert records[-1].empty is not None and "Feedback: The last draft was empty" in records[4].prompt
