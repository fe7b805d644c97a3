"""In-process providers (llama.cpp, Transformers, fake) on the tiny models: defects of issue 9.

- item 6: ``aclose()`` with requests queued: every one of them finishes, with or without an adapter, and
  everything after (or not yet queued) gets a typed "closed" ``ProviderError``;
- item 4: adapter ids PEFT refuses as names (``lr0.001``, ``train``, the longest id) work on both backends;
- item 5c: a lone surrogate in a prompt is an ``InvalidRequestError``, and file names with undecodable bytes
  give typed errors (or work), never a raw ``UnicodeError``;
- item 12b: llama.cpp prints nothing on stderr with ``verbose=False``;
- item 13: a seed outside what the backend takes is an ``InvalidRequestError`` naming the range.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lora_files import write_misfit_lora

from inference._core.validation import validate_adapter_id
from inference.exceptions import ConfigurationError, InvalidAdapterError, InvalidRequestError, ProviderError
from inference.fake_provider import FakeProvider
from inference.provider import GenerationResult, InferenceProvider

pytestmark = [
    pytest.mark.integration,
    # PEFT 0.21 calls a property that transformers 5 deprecated; not ours to fix.
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = "Once upon a time"
SHORT = 8
BACKENDS = ("llamacpp", "transformers")

LONGEST_ID = "9" + "._-" * 42 + "x"  # 128 characters, every character the id rule allows but letters
ODD_IDS = {"lr0.001": "a0", "a.b": "a1", "train": "a2", "v1.": "a0", LONGEST_ID: "a1"}
"""Adapter ids PEFT refuses as adapter names, and the test adapter each one is loaded from."""


def make_provider(backend: str, tiny_models: dict[str, Any], cache_dir: Path, **kwargs: Any) -> InferenceProvider:
    model = tiny_models["qwen2"]
    if backend == "llamacpp":
        pytest.importorskip("llama_cpp")
        from inference.llamacpp_provider import LlamaCppProvider

        options: dict[str, Any] = {"n_ctx": 512, "adapter_cache_dir": cache_dir, "kv_cache_type": "f32", **kwargs}
        return LlamaCppProvider(model.gguf_path, **options)
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from inference.transformers_provider import TransformersProvider

    return TransformersProvider(model_name=str(model.hf_dir), device="cpu", batch_window_ms=20, **kwargs)


async def text(provider: InferenceProvider, adapter_id: str | None, **kwargs: Any) -> str:
    options: dict[str, Any] = {"max_tokens": SHORT, "temperature": 0, **kwargs}
    return (await provider.generate(PROMPT, model="", adapter_id=adapter_id, **options)).text


@pytest.fixture(params=BACKENDS)
async def provider(request: pytest.FixtureRequest, tiny_models: dict[str, Any], tmp_path: Path) -> AsyncIterator[Any]:
    """A provider of each in-process backend with adapters a0, a1, a2 loaded."""
    opened = make_provider(request.param, tiny_models, tmp_path)
    for adapter_id in ("a0", "a1", "a2"):
        await opened.load_adapter(adapter_id, tiny_models["qwen2"].adapter_dirs[adapter_id])
    yield opened
    await opened.aclose()


# Item 6: aclose with requests in flight -------------------------------------------------------------------


async def test_aclose_lets_every_queued_request_finish_with_or_without_an_adapter(provider: Any) -> None:
    expected = {adapter_id: await text(provider, adapter_id) for adapter_id in (None, "a0", "a1", "a2")}
    order = [None, "a0", None, "a1", "a2", None, "a0"]
    long_first = asyncio.create_task(provider.generate(PROMPT, model="", max_tokens=100, temperature=0))
    tasks = [asyncio.create_task(text(provider, adapter_id)) for adapter_id in order]
    await asyncio.sleep(0)  # every task reaches the model's queue in its first step

    await provider.aclose()

    results = await asyncio.gather(long_first, *tasks, return_exceptions=True)
    assert isinstance(results[0], GenerationResult) and results[0].completion_tokens == 100
    assert results[1:] == [expected[adapter_id] for adapter_id in order]  # before the fix: AdapterNotFoundError
    assert provider.closed


async def test_after_aclose_every_call_says_the_provider_is_closed(provider: Any, tiny_models: Any) -> None:
    await provider.aclose()
    for adapter_id in (None, "a0"):
        with pytest.raises(ProviderError, match="closed"):
            await text(provider, adapter_id)
        with pytest.raises(ProviderError, match="closed"):
            async for _ in provider.stream(PROMPT, model="", adapter_id=adapter_id, max_tokens=2):
                pass
    with pytest.raises(ProviderError, match="closed"):
        await provider.load_adapter("a3", tiny_models["qwen2"].adapter_dirs["a0"])
    with pytest.raises(ProviderError, match="closed"):
        await provider.unload_adapter("a0")
    with pytest.raises(ProviderError, match="closed"):  # it listed [] before, as if nothing had been loaded
        await provider.list_adapters()


async def test_a_request_waiting_for_its_adapter_at_aclose_gets_the_closed_error(
    provider: Any, tiny_models: Any
) -> None:
    load = asyncio.create_task(provider.load_adapter("late", tiny_models["qwen2"].adapter_dirs["a2"]))
    await asyncio.sleep(0)  # the load has started
    waiting = asyncio.create_task(text(provider, "late"))  # waits for the load to finish
    await asyncio.sleep(0)

    await provider.aclose()

    with pytest.raises(ProviderError, match="closed"):
        await waiting
    await asyncio.gather(load, return_exceptions=True)  # queued before the close (finished) or not (closed)


# Item 4: adapter ids that PEFT refuses as names -----------------------------------------------------------


def test_the_odd_ids_are_valid_adapter_ids() -> None:
    assert len(LONGEST_ID) == 128
    for adapter_id in ODD_IDS:
        assert validate_adapter_id(adapter_id, provider="test") == adapter_id


async def test_every_valid_adapter_id_works(provider: Any, tiny_models: Any) -> None:
    expected = {adapter_id: await text(provider, adapter_id) for adapter_id in ("a0", "a1", "a2")}
    for adapter_id, source in ODD_IDS.items():
        # Before the fix the transformers provider raised InvalidAdapterError for each of these.
        await provider.load_adapter(adapter_id, tiny_models["qwen2"].adapter_dirs[source])
    assert await provider.list_adapters() == sorted({"a0", "a1", "a2", *ODD_IDS})

    one_by_one = [await text(provider, adapter_id) for adapter_id in ODD_IDS]
    together = await asyncio.gather(*(text(provider, adapter_id) for adapter_id in ODD_IDS))  # one batch
    assert one_by_one == together == [expected[source] for source in ODD_IDS.values()]

    for adapter_id in ODD_IDS:
        await provider.unload_adapter(adapter_id)
    assert await provider.list_adapters() == ["a0", "a1", "a2"]
    assert await text(provider, "a1") == expected["a1"]


async def test_transformers_names_peft_adapters_itself(tiny_models: Any, tmp_path: Path) -> None:
    async with make_provider("transformers", tiny_models, tmp_path) as fresh:
        fresh._slots.stacking = False  # type: ignore[attr-defined]  # PEFT's names (stacked adapters need none)
        await fresh.load_adapter("lr0.001", tiny_models["qwen2"].adapter_dirs["a0"])
        await fresh.load_adapter("train", tiny_models["qwen2"].adapter_dirs["a1"])
        names = fresh.peft_adapter_names  # type: ignore[attr-defined]
        assert sorted(names) == ["lr0.001", "train"] and len(set(names.values())) == 2
        assert set(fresh.model.peft_config) == set(names.values())  # type: ignore[attr-defined]
        await fresh.unload_adapter("lr0.001")
        await fresh.load_adapter("lr0.001", tiny_models["qwen2"].adapter_dirs["a0"])
        again = fresh.peft_adapter_names  # type: ignore[attr-defined]
        assert again["lr0.001"] != again["train"]  # (it may refill the slot it left: spare_adapter_slots)
        assert set(fresh.model.peft_config) == set(again.values())  # type: ignore[attr-defined]


# Item 5c: text and paths that are not valid UTF-8 ---------------------------------------------------------


@pytest.fixture(params=[*BACKENDS, "fake"])
async def any_in_process(request: pytest.FixtureRequest, tiny_models: Any, tmp_path: Path) -> AsyncIterator[Any]:
    opened = FakeProvider() if request.param == "fake" else make_provider(request.param, tiny_models, tmp_path)
    yield opened
    await opened.aclose()


@pytest.mark.parametrize(
    "arguments",
    [{"prompt": "a\ud800b"}, {"system_prompt": "be \udc80 brief"}, {"stop": ["\ud800"]}],
    ids=["prompt", "system_prompt", "stop"],
)
async def test_a_lone_surrogate_is_an_invalid_request_and_the_provider_goes_on(
    any_in_process: Any, arguments: dict[str, Any]
) -> None:
    options: dict[str, Any] = {"prompt": PROMPT, "model": "", "max_tokens": SHORT, "temperature": 0, **arguments}
    with pytest.raises(InvalidRequestError):
        await any_in_process.generate(**options)
    with pytest.raises(InvalidRequestError):
        async for _ in any_in_process.stream(**options):
            pass
    result = await any_in_process.generate(PROMPT, model="", max_tokens=SHORT, temperature=0)
    assert result.text


def undecodable(directory: Path, stem: str) -> Path:
    """A path in ``directory`` whose name holds the byte 0xFF (``os.fsdecode`` makes it a surrogate)."""
    return directory / os.fsdecode(stem.encode() + b"-\xff")


async def test_llamacpp_takes_a_gguf_lora_whose_file_name_is_not_utf8(
    tiny_models: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from inference.adapters.gguf import convert_peft_to_gguf

    caplog.set_level(logging.INFO, logger="inference")

    model = tiny_models["qwen2"]
    lora = Path(convert_peft_to_gguf(model.adapter_dirs["a0"], model.gguf_path, tmp_path / "a0.gguf"))
    odd = undecodable(tmp_path, "lora")
    shutil.copy(lora, odd)
    async with make_provider("llamacpp", tiny_models, tmp_path) as provider:
        await provider.load_adapter("a0", lora)
        await provider.load_adapter("odd", odd)  # before the fix: UnicodeEncodeError
        assert await text(provider, "odd") == await text(provider, "a0")
    async with make_provider("llamacpp", tiny_models, tmp_path, hot_swap=False) as reload:
        with pytest.raises(InvalidAdapterError, match="UTF-8"):  # llama-cpp-python's lora_path must be UTF-8
            await reload.load_adapter("odd", odd)
        assert await text(reload, None)
    # the adapter events name the file with its odd byte as \xNN: a UTF-8 log stream can write them (it failed)
    loads = [record for record in caplog.records if getattr(record, "adapter_id", None) == "odd"]
    assert loads and all(record.getMessage().encode("utf-8") for record in loads)
    assert "\\x" in str(loads[0].adapter_path)  # type: ignore[attr-defined]


async def test_a_peft_directory_whose_name_is_not_utf8_converts_on_llamacpp(tiny_models: Any, tmp_path: Path) -> None:
    """The converted GGUF is named by content hash, so llama.cpp loads it; the odd name only reaches its metadata."""
    odd = undecodable(tmp_path, "adapter")
    shutil.copytree(tiny_models["qwen2"].adapter_dirs["a0"], odd)
    async with make_provider("llamacpp", tiny_models, tmp_path / "cache") as provider:
        await provider.load_adapter("odd", odd)
        await provider.load_adapter("a0", tiny_models["qwen2"].adapter_dirs["a0"])
        assert await text(provider, "odd") == await text(provider, "a0")


async def test_a_peft_directory_whose_name_is_not_utf8_gives_a_typed_error_on_transformers(
    tiny_models: Any, tmp_path: Path
) -> None:
    odd = undecodable(tmp_path, "adapter")
    shutil.copytree(tiny_models["qwen2"].adapter_dirs["a0"], odd)
    async with make_provider("transformers", tiny_models, tmp_path / "cache") as provider:
        with pytest.raises(InvalidAdapterError, match="UTF-8"):
            await provider.load_adapter("odd", odd)
        assert await provider.list_adapters() == []
        assert await text(provider, None)


MISFIT_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from inference.exceptions import InvalidAdapterError
    from inference.llamacpp_provider import LlamaCppProvider

    async def main(model, lora, directory):
        async with LlamaCppProvider(model, n_ctx=256, adapter_cache_dir=directory, hot_swap=False) as provider:
            try:
                await provider.load_adapter("misfit", lora)
                await provider.generate("Hello", model="", adapter_id="misfit", max_tokens=2, temperature=0)
                print("loaded")
            except InvalidAdapterError as error:
                print("refused" if "refused" in str(error) else error)
            await provider.generate("Hello", model="", max_tokens=2, temperature=0)
            print("still serving")

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    """
)


def test_llamacpp_reload_mode_refuses_a_lora_llama_cpp_refuses_instead_of_crashing(
    tiny_models: Any, tmp_path: Path
) -> None:
    """Before the fix the load passed and the next request crashed the process (SIGSEGV): run it apart."""
    pytest.importorskip("llama_cpp")
    lora = write_misfit_lora(tmp_path / "misfit.gguf", "qwen2")  # a qwen2 LoRA whose tensors no tiny model has
    completed = subprocess.run(
        [sys.executable, "-c", MISFIT_SCRIPT, str(tiny_models["qwen2"].gguf_path), str(lora), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, f"exit status {completed.returncode}: {completed.stderr[-2000:]}"
    assert completed.stdout.split() == ["refused", "still", "serving"]


# Item 12b: llama.cpp's own log lines ----------------------------------------------------------------------

LOG_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from inference.llamacpp_provider import LlamaCppProvider

    async def main(model, adapter, cache, verbose):
        # n_ctx above the model's 512 training tokens: llama.cpp warns when it creates the context.
        async with LlamaCppProvider(model, n_ctx=1024, adapter_cache_dir=cache, verbose=verbose) as provider:
            await provider.load_adapter("a0", adapter)
            await provider.generate("Hello", model="", adapter_id="a0", max_tokens=4, temperature=0)
            async for _ in provider.stream("Hello", model="", max_tokens=4, temperature=0):
                pass
        print("done")

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "verbose"))
    """
)


@pytest.mark.parametrize("verbose", [False, True])
def test_llamacpp_prints_its_logs_only_when_verbose(verbose: bool, tiny_models: Any, tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    model = tiny_models["qwen2"]
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            LOG_SCRIPT,
            str(model.gguf_path),
            str(model.adapter_dirs["a0"]),
            str(tmp_path),
            "verbose" if verbose else "quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "done"
    if verbose:
        assert "n_ctx_train" in completed.stderr and "llama_adapter_lora_init" in completed.stderr
    else:
        assert completed.stderr == ""  # before the fix: "llama_context: n_ctx_seq (1024) > n_ctx_train (512) ..."


# Item 13: seeds out of a backend's range ------------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, 2**32 - 1, 2**32, 2**70])
async def test_llamacpp_refuses_a_seed_it_cannot_take(seed: int, tiny_models: Any, tmp_path: Path) -> None:
    async with make_provider("llamacpp", tiny_models, tmp_path) as provider:
        with pytest.raises(InvalidRequestError, match=r"\[0, 4294967294\]"):
            await text(provider, None, seed=seed, temperature=1.0)
        with pytest.raises(InvalidRequestError, match=r"\[0, 4294967294\]"):
            async for _ in provider.stream(PROMPT, model="", seed=seed, max_tokens=2):
                pass
        largest = [await text(provider, None, seed=2**32 - 2, temperature=1.0) for _ in range(2)]
        assert largest[0] == largest[1]  # the largest seed is a real seed, not "random"
    with pytest.raises(ConfigurationError, match=r"\[0, 4294967294\]"):
        make_provider("llamacpp", tiny_models, tmp_path, seed=seed)


@pytest.mark.parametrize("seed", [2**64, 2**70, -(2**63) - 1])
async def test_transformers_refuses_a_seed_torch_cannot_take(seed: int, tiny_models: Any, tmp_path: Path) -> None:
    async with make_provider("transformers", tiny_models, tmp_path) as provider:
        with pytest.raises(InvalidRequestError, match="seed") as refused:  # before the fix: ProviderError
            await text(provider, None, seed=seed, temperature=1.0)
        assert str(2**64 - 1) in str(refused.value)
        with pytest.raises(InvalidRequestError, match="seed"):
            async for _ in provider.stream(PROMPT, model="", seed=seed, max_tokens=2, temperature=1.0):
                pass
        sampled = [await text(provider, None, seed=2**32 - 2, temperature=1.0) for _ in range(2)]
        assert sampled[0] == sampled[1]


async def test_a_failure_inside_llama_cpp_is_a_provider_error_and_the_provider_keeps_serving(
    tiny_models: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-cpp-python raises plain exceptions (``RuntimeError: llama_decode returned -3``): they arrive typed."""
    from inference.exceptions import ProviderError

    async with make_provider("llamacpp", tiny_models, tmp_path, n_parallel=1) as provider:  # Llama.eval's path
        expected = await text(provider, None)
        llama = provider._llama
        real_eval = llama.eval
        failures = iter([RuntimeError("llama_decode returned -3")])

        def failing_eval(tokens: Any) -> Any:
            failure = next(failures, None)
            if failure is not None:
                raise failure
            return real_eval(tokens)

        monkeypatch.setattr(llama, "eval", failing_eval)
        with pytest.raises(ProviderError, match=r"llama.cpp failed to generate \(RuntimeError: llama_decode"):
            await text(provider, None)
        assert await text(provider, None) == expected


async def test_a_prompt_too_long_for_the_local_context_falls_back_to_the_next_provider(
    tiny_models: dict[str, Any],
) -> None:
    """A local model beside a hosted one (here a fake) with a longer context: the prompt that does not fit the local
    context (a ``TokenLimitError`` of kind ``"context"``) goes to the next provider; one that fits stays local."""
    from inference import FallbackProvider, LlamaCppProvider, TokenLimitError

    local = LlamaCppProvider(str(tiny_models["qwen2"].gguf_path), n_ctx=64)
    async with FallbackProvider([local, FakeProvider()], labels=["local", "hosted"]) as fallback:
        long_prompt = "word " * 200
        with pytest.raises(TokenLimitError, match="does not fit the context of 64 tokens") as refused:
            await local.generate(long_prompt, model="m", max_tokens=2)
        assert refused.value.kind == "context" and refused.value.value > 64
        assert (await fallback.generate(long_prompt, model="m", max_tokens=2)).provider == "hosted"
        assert (await fallback.generate("Hi", model="m", max_tokens=2)).provider == "local"
        streamed = [event async for event in fallback.stream(long_prompt, model="m", max_tokens=2)]
        assert isinstance(streamed[-1], GenerationResult) and streamed[-1].provider == "hosted"
        batch = await fallback.generate_batch([long_prompt, "Hi"], model="m", max_tokens=2)
        assert [result.provider for result in batch if isinstance(result, GenerationResult)] == ["hosted", "local"]
        answered = fallback.stats()["hosted"].answered
        await fallback.score(long_prompt, " end", model="m")  # a score too long for the local context moves on too
        assert fallback.stats()["hosted"].answered == answered + 1


def _peft_adapter(model: Any, directory: Path, **config: Any) -> Path:
    """A PEFT LoRA of ``model`` made with ``config`` (on q_proj and v_proj), saved as PEFT saves it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model.hf_dir), torch_dtype=torch.float32)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **config))
    lora.save_pretrained(str(directory))
    return directory


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"init_lora_weights": "pissa"}, "rewrites the base model's weights"),
        ({"init_lora_weights": "olora"}, "rewrites the base model's weights"),
        ({"alora_invocation_tokens": [5, 6], "task_type": "CAUSAL_LM"}, "aLoRA"),
    ],
    ids=["pissa", "olora", "alora"],
)
async def test_a_lora_variant_no_backend_serves_is_refused_and_the_base_model_answers_as_before(
    tiny_models: dict[str, Any], tmp_path: Path, config: dict[str, Any], said: str
) -> None:
    """PEFT loads PiSSA and OLoRA adapters by rewriting the base layers' weights: on Transformers that changed the
    base model's answers (and every other adapter's) for good, unload or not; llama.cpp and Transformers applied
    aLoRA to every token. Both refuse them now, and the base answers as before."""
    adapter = _peft_adapter(tiny_models["qwen2"], tmp_path / "variant", **config)
    greedy: dict[str, Any] = {"model": "m", "max_tokens": 8, "temperature": 0}
    for backend in BACKENDS:
        async with make_provider(backend, tiny_models, tmp_path / "cache") as provider:
            before = (await provider.generate("the quick brown fox", **greedy)).text
            with pytest.raises(InvalidAdapterError, match=said):
                await provider.load_adapter("variant", adapter)
            assert (await provider.generate("the quick brown fox", **greedy)).text == before
            assert await provider.list_adapters() == []
