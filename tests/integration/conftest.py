"""Fixtures for integration tests: a real OpenAI-compatible server (``python -m llama_cpp.server``) on loopback.

The server serves the tiny Qwen2 GGUF built by the ``tiny_models`` fixture, so the HTTP providers talk to
a real server process without any download.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest

STARTUP_TIMEOUT_SECONDS = 300.0


def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens now."""
    return _free_port()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(log: IO[bytes], limit: int = 4000) -> str:
    log.flush()
    log.seek(0)
    return log.read().decode(errors="replace")[-limit:]


class LlamaServer:
    """One ``python -m llama_cpp.server`` process on 127.0.0.1.

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``.
        process: The server process.
    """

    def __init__(self, model: Path, *, n_ctx: int = 512, port: int | None = None) -> None:
        self.port = port if port is not None else _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop(), after the process ends
        command = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(n_ctx),
            "--n_threads",
            "2",
        ]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(
                    f"llama_cpp.server exited with status {self.process.returncode} before answering; "
                    f"its output:\n{_tail(self._log)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/models", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        pytest.fail(
            f"llama_cpp.server did not answer GET {self.base_url}/models within {STARTUP_TIMEOUT_SECONDS:g} s; "
            f"its output:\n{_tail(self._log)}"
        )

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would: open connections are reset."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        """Terminate the server (kill it if it does not stop within 10 s) and close its log."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()


@pytest.fixture(scope="session")
def tiny_qwen2_gguf(tiny_models: dict[str, object]) -> Path:
    """The tiny Qwen2 GGUF (it has a ChatML chat template, which llama_cpp.server uses for chat)."""
    pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server]")
    path: Path = tiny_models["qwen2"].gguf_path  # type: ignore[attr-defined]
    return path


@pytest.fixture(scope="session")
def llama_server(tiny_qwen2_gguf: Path) -> Iterator[str]:
    """A ``llama_cpp.server`` serving the tiny Qwen2 GGUF for the whole session; yields its /v1 base URL."""
    server = LlamaServer(tiny_qwen2_gguf)
    try:
        yield server.base_url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llama_server_without_template(tiny_models: dict[str, object]) -> Iterator[str]:
    """A ``llama_cpp.server`` serving the tiny Llama GGUF, which has no chat template; yields its /v1 base URL."""
    pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server]")
    server = LlamaServer(tiny_models["llama"].gguf_path)  # type: ignore[attr-defined]
    try:
        yield server.base_url
    finally:
        server.stop()


@pytest.fixture
def start_llama_server(tiny_qwen2_gguf: Path) -> Iterator[Callable[..., LlamaServer]]:
    """Start extra short-lived servers (e.g. to kill one); every server started is stopped at teardown.

    Call it as ``start(n_ctx=512, port=None, model=None)``: ``port`` reuses a port (a server restarted in place);
    ``model`` serves another GGUF than the tiny Qwen2.
    """
    servers: list[LlamaServer] = []

    def start(*, n_ctx: int = 512, port: int | None = None, model: Path | None = None) -> LlamaServer:
        server = LlamaServer(model or tiny_qwen2_gguf, n_ctx=n_ctx, port=port)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
"""vLLM's CPU build, in its own venv (``make vllm-venv``; it pins a transformers older than ``.venv``'s)."""

VLLM_STARTUP_TIMEOUT_SECONDS = 600.0


class VLLMServer:
    """One real vLLM OpenAI-compatible server (CPU build) on 127.0.0.1, with runtime LoRA loading.

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``.
        model: The served model name.
        log_path: Where its output goes (kept after the tests, for a failure's post-mortem).
    """

    def __init__(self, model_dir: Path, log_path: Path, *, model: str = "tiny") -> None:
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.model = model
        self.model_dir = model_dir
        self.log_path = log_path
        self._log = open(log_path, "w+b")  # noqa: SIM115 - closed in stop(), after the process ends
        self.start()

    def start(self) -> None:
        """Start the server on its port (again, after :meth:`stop` or :meth:`kill`) and wait until it answers."""
        from inference.testing.vllm_model import SERVER_ENVIRONMENT, server_command, vllm_environment

        command = server_command(VLLM_PYTHON, self.model_dir, self.port, served_name=self.model)
        environment = vllm_environment(SERVER_ENVIRONMENT)
        self.process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise

    def kill(self) -> None:
        """Kill the server and its engine process at once (SIGKILL), as a crash or an OOM kill would."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + VLLM_STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"vLLM exited with status {self.process.returncode}; its output:\n{_tail(self._log)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/models", timeout=2.0).status_code == 200:
                    return
            time.sleep(1.0)
        pytest.fail(f"vLLM did not answer within {VLLM_STARTUP_TIMEOUT_SECONDS:g} s; its output:\n{_tail(self._log)}")

    def stop(self, *, close_log: bool = True) -> None:
        """Terminate the server (kill it if it does not stop within 30 s); close its log unless it will restart."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if close_log:
            self._log.close()


@pytest.fixture(scope="session")
def start_vllm_server() -> Iterator[Callable[..., VLLMServer]]:
    """Starts more real vLLM servers (``start(model_dir, log_path, model=...)``), stopped at the end of the session.

    Skipped when ``.venv-vllm`` is missing, unless ``INFERENCE_REQUIRE_VLLM=1``.
    """
    _require_vllm()
    started: list[VLLMServer] = []

    def start(model_dir: Path, log_path: Path, *, model: str = "tiny") -> VLLMServer:
        server = VLLMServer(model_dir, log_path, model=model)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _require_vllm() -> None:
    if not VLLM_PYTHON.is_file():
        message = f"vLLM's venv {VLLM_PYTHON.parent.parent} is missing: run `make vllm-venv`"
        if os.environ.get("INFERENCE_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A real vLLM server serving :func:`inference.testing.vllm_model.build_vllm_model`'s model, started once.

    Skipped when ``.venv-vllm`` is missing (``make test`` creates it), unless ``INFERENCE_REQUIRE_VLLM=1``.
    """
    _require_vllm()
    from inference.testing.vllm_model import build_vllm_model

    model = build_vllm_model()
    server = VLLMServer(model.hf_dir, tmp_path_factory.mktemp("vllm") / "server.log")
    yield server
    server.stop()
