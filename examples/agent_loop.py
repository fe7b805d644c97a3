"""A small agent loop whose steps pick their providers from step configs.

Each round of the loop runs two model steps, and each step's output feeds the next:

1. ``plan``  (a model step on an HTTP server that speaks vLLM's OpenAI protocol, here ``llama_cpp.server``):
   writes a short plan for the task, seeing the feedback of the previous round if there was one. It has a tool,
   ``key_words`` (a Python function): where the step's backend calls tools, the model calls it, the loop runs it
   and sends the result back as a tool message until the model answers in text; where the model did not call it
   (a backend without tool calling yet, or a model that answered in text), the loop runs the tool itself on the
   step's answer. Either way the tool's output is recorded and fills ``{key_words}`` in later prompts.
2. ``write`` (a model step on llama.cpp in process, with a LoRA adapter): writes the answer from the task
   and the key words.

After each round a pure-Python check reads the draft; if it rejects it (empty, or cut off by ``max_tokens``),
its feedback goes into the next round's plan, up to ``--max-rounds``. A model step whose output a later step
needs (the plan) must not answer with empty text: the loop stops and says why (:class:`EmptyAnswerError`), and a
run whose last draft is still empty ends with an error, not "done". Which backend a step uses is only
configuration: :func:`inference.get_provider_for_step` turns each step's config into a (cached) provider, so
moving a step to Ollama, Transformers or another server is a change of its dict, not of the loop.

Run it against the tiny test models and a local ``llama_cpp.server``::

    python -m llama_cpp.server --model tiny.gguf --port 8000 &
    python examples/agent_loop.py --model-path tiny.gguf --base-url http://127.0.0.1:8000/v1 \\
        --adapter path/to/peft-adapter

A model without a chat template in its GGUF (the demo's Gemma 3 270M) cannot chat: ``llama_cpp.server`` answers
chat requests for it with empty text. Give such a planner ``--api completions``, which sends the plain text to
``/v1/completions``.

Every option has an environment variable (``--help`` lists them). In your own tests, set every step's
``provider`` to ``"fake"`` (see ``tests/unit/test_agent_loop_logic.py``): the fake provider calls tools, so the
whole tool loop runs there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from inference import GenerationResult, InferenceProvider, aclose_all_providers, get_provider_for_step
from inference.exceptions import InferenceError
from inference.messages import Message

DEFAULT_TASK = "Explain to a new hiker how to prepare for a day in the mountains."

StepConfig = dict[str, Any]
Tool = Callable[..., str]
Check = Callable[[GenerationResult], "str | None"]


def key_words(text: str, limit: int = 6) -> str:
    """The key words of a text: its first distinct words of three letters or more, comma-separated.

    Args:
        text: The text to read.
        limit: The most words to return (1 or more).
    """
    limit = max(limit, 1)
    seen: list[str] = []
    for word in re.findall(r"[^\W\d_]{3,}", text):
        if word.lower() not in seen:
            seen.append(word.lower())
        if len(seen) == limit:
            break
    return ", ".join(seen) if seen else "(no key words)"


class EmptyAnswerError(Exception):
    """A model step answered with empty text where a later step needs its output; the message says why."""


def why_empty(step_name: str, provider: Any, result: GenerationResult) -> str:
    """What to say about a model step that answered with empty text: what came back, and what to change."""
    said = (
        f"step {step_name!r} got an empty answer from the {provider.name} provider ({result.completion_tokens} "
        f"tokens, finish_reason {result.finish_reason!r})"
    )
    route = getattr(provider, "api", None)  # the server providers' route setting (vllm, openai)
    if route is not None and route != "completions":
        return (
            f"{said}: a model without a chat template (such as the demo's Gemma GGUF on llama_cpp.server) answers "
            "nothing on the chat route; run with --api completions (the step's 'api' setting, VLLM_API or "
            "OPENAI_API), which sends the plain text to /v1/completions, or serve the model with a chat template"
        )
    return f"{said}: the model ended its answer at once; check the model, the prompt and max_tokens"


def check_draft(draft: GenerationResult) -> str | None:
    """Accept a draft that has text and ended on its own; otherwise return feedback for the next round."""
    if not draft.text.strip():
        return "The last draft was empty: plan something concrete."
    if draft.finish_reason == "length":
        return f"The last draft was cut off after {draft.completion_tokens} tokens: plan a shorter answer."
    return None


TOOLS: dict[str, Tool] = {"key_words": key_words}


def default_steps(
    *,
    base_url: str | None,
    server_model: str,
    model_path: str | None,
    adapter_path: str | None,
    max_tokens: int = 48,
    api: str | None = None,
) -> list[StepConfig]:
    """The two step configs of the example (planner with a tool on the server, writer in process with an adapter).

    Each model step is a config as :func:`get_provider_for_step` takes it (``provider`` plus that provider's
    settings) with the step's own keys beside it: ``name``, ``model``, ``prompt`` (a template filled with
    ``{task}``, ``{feedback}`` and the outputs of earlier steps and tools by name), ``max_tokens``, and optionally
    ``adapter_id`` + ``adapter_path`` and ``tools`` (names of :attr:`AgentLoop.tools` the model may call). ``api`` is
    the planner's route (``"completions"`` for a model without a chat template; by default the provider's own
    setting).
    """
    plan: StepConfig = {
        "name": "plan",
        "provider": "vllm",
        "base_url": base_url,
        "model": server_model,
        "prompt": "Task: {task}\n{feedback}Write a three-point plan for the answer.",
        "max_tokens": max_tokens,
        "tools": ["key_words"],
    }
    if api is not None:
        plan["api"] = api
    return [
        plan,
        {
            "name": "write",
            "provider": "llamacpp",
            "model_path": model_path,
            "model": os.path.basename(model_path or "model"),
            "adapter_id": "writer" if adapter_path else None,
            "adapter_path": adapter_path,
            "prompt": "{task} Key points: {key_words}.",
            "max_tokens": max_tokens,
        },
    ]


@dataclass(frozen=True)
class StepRecord:
    """What one step did: where it ran, what it was given, what it produced.

    Attributes:
        round: The loop round (from 1).
        name: The step's name.
        provider: The provider type that ran it (``"tool"`` for a tool).
        adapter_id: The adapter used, or ``None``.
        prompt: The filled prompt (for a tool, its arguments as JSON).
        output: The text it produced.
        seconds: Wall time of the step.
        result: The model's full result (``None`` for a tool step).
        empty: Why the model answered with empty text (:func:`why_empty`), ``None`` when it gave text.
    """

    round: int
    name: str
    provider: str
    adapter_id: str | None
    prompt: str
    output: str
    seconds: float
    result: GenerationResult | None = None
    empty: str | None = None


@dataclass
class AgentLoop:
    """Runs step configs in rounds until the check accepts the last model step's result.

    Use it as an async context manager: entering loads each step's adapter into its provider; leaving
    closes every provider the steps used (:func:`inference.aclose_all_providers`).

    Args:
        steps: Step configs (see :func:`default_steps`).
        tools: Tool functions by name, for steps with a ``tools`` (model calls) or ``tool`` (a plain step) key.
        check: Reads the last model step's result; returns ``None`` to stop, or feedback for the next round.
        max_rounds: Most rounds to run.
        max_tool_calls: Most tool calls one model step may make before it must answer in text.
        on_step: Called with each :class:`StepRecord` as soon as the step ends (the CLI prints them).
    """

    steps: Sequence[Mapping[str, Any]]
    tools: Mapping[str, Tool] = field(default_factory=lambda: dict(TOOLS))
    check: Check = check_draft
    max_rounds: int = 2
    max_tool_calls: int = 4
    on_step: Callable[[StepRecord], object] | None = None

    async def __aenter__(self) -> AgentLoop:
        try:
            for step in self.steps:
                if step.get("adapter_id"):
                    provider = get_provider_for_step(step)
                    await provider.load_adapter(step["adapter_id"], step["adapter_path"])
        except BaseException:
            await aclose_all_providers()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await aclose_all_providers()

    async def run(self, task: str) -> list[StepRecord]:
        """Run rounds of the steps for ``task``; return every step's record, in order."""
        records: list[StepRecord] = []
        feedback = ""
        for round_number in range(1, self.max_rounds + 1):
            outputs: dict[str, str] = {"task": task, "feedback": feedback}
            last_result: GenerationResult | None = None
            for step in self.steps:
                async for record in self._run_step(step, round_number, outputs):
                    outputs[record.name] = record.output
                    records.append(record)
                    if record.result is not None:
                        last_result = record.result
                    if self.on_step is not None:
                        self.on_step(record)
            verdict = self.check(last_result) if last_result is not None else None
            if verdict is None:
                break
            feedback = f"Feedback: {verdict}\n"
        return records

    async def _run_step(
        self, step: Mapping[str, Any], round_number: int, outputs: Mapping[str, str]
    ) -> AsyncIterator[StepRecord]:
        """The records of one step: a plain tool step's, or a model step's tool calls and then its answer."""
        started = time.perf_counter()
        if "tool" in step:
            given = outputs[step["input"]]
            text = self.tools[step["tool"]](given)
            yield StepRecord(round_number, step["name"], "tool", None, given, text, time.perf_counter() - started)
            return
        provider = get_provider_for_step(step)
        prompt = str(step["prompt"]).format_map(outputs)
        tools = {name: self.tools[name] for name in step.get("tools", ())}
        conversation: list[Message] = [{"role": "user", "content": prompt}]
        calls, called = 0, set()
        while True:
            offered = tools if self._offers_tools(provider, step) and calls < self.max_tool_calls else {}
            result = await self._generate(provider, step, conversation, offered)
            if not result.tool_calls:
                break
            conversation.append(result.as_message())
            for call in result.tool_calls:  # the model asked for tools: run each, answer with its output
                calls += 1
                called.add(call.name)
                output = self._call_tool(tools, call.name, call.arguments, call.error)
                conversation.append(call.answer(output))
                yield StepRecord(round_number, call.name, "tool", None, call.raw_arguments, output, 0.0)
        empty = why_empty(step["name"], provider, result) if not result.text.strip() else None
        if empty is not None and self._needed_later(step):
            raise EmptyAnswerError(empty)
        yield StepRecord(
            round_number,
            step["name"],
            provider.name,
            result.adapter_id,
            prompt,
            result.text,
            time.perf_counter() - started,
            result,
            empty,
        )
        for name, tool in tools.items():  # a tool the model did not call (a backend without tool calling, or a
            if name in called or (self._offers_tools(provider, step) and calls >= self.max_tool_calls):
                continue  # model that answered in text) runs on the step's answer, unless calls ran out
            tool_started = time.perf_counter()
            output = tool(result.text)
            seconds = time.perf_counter() - tool_started
            yield StepRecord(round_number, name, "tool", None, result.text, output, seconds)

    @staticmethod
    def _offers_tools(provider: InferenceProvider, step: Mapping[str, Any]) -> bool:
        """Whether the step's model is offered its tools: the backend calls tools, on the chat route (a step on
        ``/v1/completions`` sends plain text, where tools have no place)."""
        return provider.supports_tools and step.get("api") != "completions"

    async def _generate(
        self,
        provider: InferenceProvider,
        step: Mapping[str, Any],
        conversation: list[Message],
        tools: Mapping[str, Tool],
    ) -> GenerationResult:
        return await provider.generate(
            conversation if len(conversation) > 1 else conversation[0]["content"],
            model=step.get("model", step["name"]),
            adapter_id=step.get("adapter_id"),
            max_tokens=step.get("max_tokens", 64),
            temperature=step.get("temperature", 0.0),
            tools=list(tools.values()) or None,
        )

    @staticmethod
    def _call_tool(tools: Mapping[str, Tool], name: str, arguments: Mapping[str, Any], error: str | None) -> str:
        """A tool's output, or a sentence the model can act on (an unknown tool, arguments that did not parse)."""
        if error is not None:
            return f"error: {error}"
        if name not in tools:
            return f"error: there is no tool {name!r}; the tools are {', '.join(tools) or 'none'}"
        try:
            return tools[name](**arguments)
        except (TypeError, ValueError) as failure:
            return f"error: {name} failed: {failure}"

    def _needed_later(self, step: Mapping[str, Any]) -> bool:
        """Whether a later step reads ``step``'s output or its tools' outputs (as its ``input``, or as ``{name}`` in
        its prompt): a tool given the step's answer reads it too."""
        names = {step["name"], *step.get("tools", ())}
        steps = list(self.steps)
        later = steps[next(index for index, other in enumerate(steps) if other is step) + 1 :]
        return any(
            other.get("input") in names or any(f"{{{name}}}" in str(other.get("prompt", "")) for name in names)
            for other in later
        )


def print_step(record: StepRecord) -> None:
    """One line per step: round, name, provider, adapter, time, output."""
    output = " ".join(record.output.split())
    print(
        f"round {record.round}  {record.name:<9} provider={record.provider:<8} "
        f"adapter={record.adapter_id or '-':<7} {record.seconds:5.2f}s  {output[:100]!r}"
    )


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "A tool-using agent loop: plan on an OpenAI/vLLM-protocol server with a Python tool (key_words), "
            "write on llama.cpp in process with a LoRA adapter; repeated while a check rejects the draft."
        )
    )
    parser.add_argument(
        "--model-path",
        default=os.environ.get("AGENT_MODEL_PATH") or os.environ.get("LLAMACPP_MODEL_PATH"),
        help="GGUF model for the in-process writer step (env AGENT_MODEL_PATH, else LLAMACPP_MODEL_PATH)",
    )
    parser.add_argument(
        "--adapter",
        default=os.environ.get("AGENT_ADAPTER_PATH"),
        help="LoRA adapter for the writer: PEFT directory or GGUF file (env AGENT_ADAPTER_PATH; default none)",
    )
    parser.add_argument(
        "--base-url",
        default=os.environ.get("AGENT_BASE_URL") or os.environ.get("VLLM_BASE_URL"),
        help="OpenAI-compatible base URL of the planner's server, e.g. http://127.0.0.1:8000/v1 "
        "(env AGENT_BASE_URL, else VLLM_BASE_URL)",
    )
    parser.add_argument(
        "--server-model",
        default=os.environ.get("AGENT_SERVER_MODEL", "default"),
        help="model name sent to the server (env AGENT_SERVER_MODEL; llama_cpp.server accepts any)",
    )
    parser.add_argument(
        "--api",
        choices=("auto", "chat", "completions"),
        default=os.environ.get("AGENT_API"),
        help="the planner's route: completions for a model without a chat template (env AGENT_API; default: "
        "VLLM_API, else auto)",
    )
    parser.add_argument("--task", default=DEFAULT_TASK, help="what the agent is asked to do")
    parser.add_argument("--max-rounds", type=int, default=2, help="most rounds of plan/notes/write (default 2)")
    parser.add_argument("--max-tokens", type=int, default=48, help="most tokens per model step (default 48)")
    arguments = parser.parse_args(argv)
    if not arguments.model_path:
        parser.error("give --model-path (or AGENT_MODEL_PATH / LLAMACPP_MODEL_PATH): the writer's GGUF model")
    if not arguments.base_url:
        parser.error("give --base-url (or AGENT_BASE_URL / VLLM_BASE_URL): the planner's server")
    if arguments.max_rounds < 1:
        parser.error("--max-rounds must be at least 1")
    return arguments


async def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    steps = default_steps(
        base_url=arguments.base_url,
        server_model=arguments.server_model,
        model_path=arguments.model_path,
        adapter_path=arguments.adapter,
        max_tokens=arguments.max_tokens,
        api=arguments.api,
    )
    print(f"task: {arguments.task}")
    try:
        async with AgentLoop(steps, max_rounds=arguments.max_rounds, on_step=print_step) as agent:
            records = await agent.run(arguments.task)
    except (InferenceError, EmptyAnswerError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    rounds = records[-1].round
    final = next(record for record in reversed(records) if record.result is not None)
    if final.empty is not None:  # no answer: say so, never "done"
        print(f"error: no answer after {rounds} round(s): {final.empty}", file=sys.stderr)
        return 1
    print(f"done after {rounds} round(s); answer: {' '.join(final.output.split())!r}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
