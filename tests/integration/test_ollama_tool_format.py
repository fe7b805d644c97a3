"""The ``format`` a forced ``tool_choice`` sends Ollama, on the component Ollama 0.33 hands it to: llama.cpp's own
``llama-server`` (``.venv-llama-server``; skipped without it unless ``INFERENCE_REQUIRE_LLAMA_SERVER=1``).

No Ollama binary can be had here, but Ollama 0.33 runs its models through llama-server (``llm/llama_server.go``), in
two ways, both driven here as Ollama drives them:

- a chat Ollama renders itself (a model with an Ollama template) goes to ``POST /completion`` with the format as
  ``json_schema`` (``llamaServerCompletionRequest``, l. 1394-1415, and ``Completion``, l. 1584-1596);
- a chat llama-server renders (Ollama 0.33's default for other GGUF models) goes to ``POST /v1/chat/completions``
  with the ``tools`` and the format as ``response_format`` ``json_schema`` (``llamaServerChatRequest``,
  l. 2136-2185), and Ollama returns the content and the parsed calls (arguments as objects).

The model is the tiny Qwen2 with random weights: only the grammar makes its output a call. Every answer, read by the
provider's own reader, must be one call that parses and validates against the chosen tool.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_llama_server_templates import llama_server

from inference._core.validation import GenerationRequest
from inference._servers.ollama_tools import OllamaToolCalls, tool_fields

pytestmark = pytest.mark.integration

CITY = {"type": "string", "enum": ["Oslo", "Paris", "Rome"]}
"""Strings the random model must end: a maxLength is no bound here (llama.cpp's grammar counts code points, and the
random model writes broken UTF-8 that decodes to more characters than it matched)."""
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]},
}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                         "parameters": {"type": "object", "properties": {}}}}
INVOICE = {"type": "function", "function": {  # a pydantic model's schema: a nested model in $defs
    "name": "Invoice", "description": "An invoice to file.",
    "parameters": {
        "type": "object",
        "properties": {"number": {"type": "integer"}, "paid": {"type": "boolean"}, "to": {"$ref": "#/$defs/Address"}},
        "required": ["number", "paid", "to"],
        "$defs": {"Address": {"type": "object", "properties": {"city": CITY},
                              "required": ["city"], "additionalProperties": False}},
    },
}}
TOOLS = [WEATHER, TIME, INVOICE]
CHOICES: list[Any] = [
    {"type": "function", "function": {"name": "get_weather"}},
    {"type": "function", "function": {"name": "Invoice"}},
    "required",
]
SEEDS = range(3)

TOOL_TEMPLATE = (  # a Qwen2.5-style ChatML template that names the tools and renders tool turns
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n<tools>\n"
    "{%- for tool in tools %} {{ tool.function.name }}{%- endfor %}\n</tools>\n"  # names: 512 tokens of context
    'Call one as <tool_call>\n{"name": <name>, "arguments": <arguments>}\n</tool_call><|im_end|>\n{% endif %}'
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
    "{%- for call in message.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def forced(choice: Any) -> GenerationRequest:
    return GenerationRequest.from_arguments(provider="ollama", prompt="File it.", model="tiny", tools=TOOLS,
                                            tool_choice=choice)


def check_one_valid_call(request: GenerationRequest, message: dict[str, Any], cut: bool) -> None:
    calls = OllamaToolCalls(request)
    calls.add(message)
    text, made = calls.result(message.get("content") or "", cut=cut)
    assert len(made) == 1 and made[0].error is None, (message, made)
    names = [tool["function"]["name"] for tool in TOOLS] if request.tool_choice == "required" else [
        request.tool_choice["function"]["name"]]  # type: ignore[index]
    assert made[0].name in names and not text.strip()


@pytest.mark.parametrize("choice", CHOICES, ids=["get_weather", "Invoice", "required"])
def test_a_chat_ollama_renders_gets_a_valid_call_from_completion(
    choice: Any, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    request = forced(choice)
    schema = tool_fields(request)["format"]
    with llama_server(tiny_models["qwen2"].gguf_path, tmp_path / "server.log") as url:
        for seed in SEEDS:
            reply = httpx.post(f"{url}/completion", timeout=120.0, json={
                "prompt": "<|im_start|>user\nFile it.<|im_end|>\n<|im_start|>assistant\n", "stream": False,
                "cache_prompt": True, "n_predict": 400, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": seed,
                "json_schema": schema,
            })
            assert reply.status_code == 200, reply.text
            body = reply.json()
            cut = body.get("stop_type") == "limit"
            assert not cut, body["content"]
            check_one_valid_call(request, {"role": "assistant", "content": body["content"]}, cut)


@pytest.mark.parametrize("choice", CHOICES, ids=["get_weather", "Invoice", "required"])
def test_a_chat_llama_server_renders_gets_a_valid_call_with_the_tools(
    choice: Any, tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    request = forced(choice)
    fields = tool_fields(request)
    template = tmp_path / "tools.jinja"
    template.write_text(TOOL_TEMPLATE, encoding="utf-8")
    with llama_server(tiny_models["qwen2"].gguf_path, tmp_path / "server.log", "--jinja", "--chat-template-file",
                      str(template)) as url:
        for seed in SEEDS:
            reply = httpx.post(f"{url}/v1/chat/completions", timeout=120.0, json={
                "messages": [{"role": "user", "content": "File it."}], "stream": False, "cache_prompt": True,
                "n_predict": 400, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": seed,
                "tools": fields["tools"],
                "response_format": {"type": "json_schema", "json_schema": {"name": "schema",
                                                                           "schema": fields["format"]}},
            })
            assert reply.status_code == 200, reply.text
            choice_made = reply.json()["choices"][0]
            assert choice_made["finish_reason"] != "length", choice_made
            message = choice_made["message"]
            calls = [  # as Ollama returns them (accumulatedToolCalls, l. 2094-2134: arguments parsed to an object)
                {"id": one.get("id", ""), "function": {"index": index, "name": one["function"]["name"],
                                                       "arguments": json.loads(one["function"]["arguments"] or "{}")}}
                for index, one in enumerate(message.get("tool_calls") or [])
            ]
            ollama_message = {"role": "assistant", "content": message.get("content") or ""}
            if calls:
                ollama_message["tool_calls"] = calls
            check_one_valid_call(request, ollama_message, cut=False)
