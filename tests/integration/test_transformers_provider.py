"""TransformersProvider on the tiny Qwen2/Llama models: real transformers, real PEFT, real batching.

Every greedy output is compared with a reference computed without the provider (plain ``model.generate``
on token ids built by hand, or PEFT's own ``set_adapter``), so a wrong prompt, wrong padding or a wrong
adapter in a batch row shows up as different text. The tiny models never emit an end-of-sequence token,
so greedy generations run exactly to ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.exceptions import (
    AdapterAlreadyLoadedError,
    AdapterNotFoundError,
    ConfigurationError,
    InvalidAdapterError,
    InvalidRequestError,
    ModelLoadError,
)
from inference.provider import GenerationResult

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from inference.transformers_provider import TransformersProvider  # noqa: E402

pytestmark = [
    pytest.mark.integration,
    # PEFT 0.21 calls a property that transformers 5 deprecated; not ours to fix.
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

SYSTEM = "Answer briefly."
PROMPTS = (
    "Hello, world!",
    "The quick brown fox",
    "Once upon a time",
    "Where does the river begin?",
    "bread 2.50, fish 7.25",
    "The village had 3 bakeries",
    "Knowledge is power",
    "In the evening the lights",
)
ADAPTERS = ("a0", "a1", "a2")


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


@pytest.fixture(scope="module")
def qwen2(tiny_models: dict[str, Any]) -> Any:
    return tiny_models["qwen2"]


@pytest.fixture(scope="module")
def provider(qwen2: Any) -> Iterator[TransformersProvider]:
    """The tiny Qwen2 model with adapters a0, a1, a2, shared by the module (it is loop-agnostic)."""
    shared = TransformersProvider(model_name=str(qwen2.hf_dir), device="cpu", batch_window_ms=20)

    async def load() -> None:
        for adapter_id in ADAPTERS:
            await shared.load_adapter(adapter_id, qwen2.adapter_dirs[adapter_id])

    run(load())
    yield shared
    run(shared.aclose())


@pytest.fixture(scope="module")
def tokenizer(qwen2: Any) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(qwen2.hf_dir))


@pytest.fixture(scope="module")
def reference(qwen2: Any) -> Any:
    """An independent PEFT model (the seed's way: set_adapter per request) to compare with."""
    base = transformers.AutoModelForCausalLM.from_pretrained(str(qwen2.hf_dir), dtype=torch.float32).eval()
    model = peft.PeftModel.from_pretrained(base, str(qwen2.adapter_dirs["a0"]), adapter_name="a0")
    for adapter_id in ADAPTERS[1:]:
        model.load_adapter(str(qwen2.adapter_dirs[adapter_id]), adapter_name=adapter_id)
    return model.eval()


def chatml_ids(tokenizer: Any, prompt: str, system: str | None = None) -> list[int]:
    """The prompt rule written out by hand for the ChatML template of the tiny Qwen2 model."""
    text = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    text += f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def plain_generate(model: Any, tokenizer: Any, ids: list[int], max_tokens: int, adapter: str | None = None) -> str:
    """One request, no padding, through ``model.generate`` (``set_adapter``/``disable_adapter`` on PEFT)."""
    inputs = torch.tensor([ids])
    with torch.inference_mode():
        if adapter is None and isinstance(model, peft.PeftModel):
            with model.disable_adapter():
                output = model.generate(inputs, max_new_tokens=max_tokens, do_sample=False)
        else:
            if adapter is not None:
                model.set_adapter(adapter)
            output = model.generate(inputs, max_new_tokens=max_tokens, do_sample=False)
    new_tokens = output[0, len(ids) :].tolist()
    assert len(new_tokens) == max_tokens
    text: str = tokenizer.decode(new_tokens, skip_special_tokens=True)
    return text


def copy_adapter(source: Path, target: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    shutil.copytree(source, target)
    if edit is not None:
        config_path = target / "adapter_config.json"
        config = json.loads(config_path.read_text())
        edit(config)
        config_path.write_text(json.dumps(config))
    return target


# Generation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("system", [None, SYSTEM])
async def test_greedy_output_equals_plain_generate_on_chat_template_ids(
    provider: TransformersProvider, reference: Any, tokenizer: Any, system: str | None
) -> None:
    for prompt in PROMPTS[:3]:
        ids = chatml_ids(tokenizer, prompt, system)
        result = await provider.generate(prompt, model="", system_prompt=system, max_tokens=10, temperature=0)
        assert result.text == plain_generate(reference, tokenizer, ids, 10)
        assert (result.prompt_tokens, result.completion_tokens) == (len(ids), 10)
        assert result.token_count == len(ids) + 10
        assert result.finish_reason == "length"
        assert result.model == "tiny-qwen2"
        assert result.adapter_id is None


async def test_model_without_chat_template_prepends_the_system_prompt(tiny_models: dict[str, Any]) -> None:
    llama = tiny_models["llama"]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(llama.hf_dir), dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(llama.hf_dir))
    async with TransformersProvider(model_name=str(llama.hf_dir)) as provider:
        result = await provider.generate(
            "Once upon a time", model="", system_prompt=SYSTEM, max_tokens=8, temperature=0
        )
    ids = tokenizer(f"{SYSTEM}\n\nOnce upon a time")["input_ids"]
    assert result.text == plain_generate(model, tokenizer, ids, 8)
    assert result.prompt_tokens == len(ids)
    assert result.model == "tiny-llama"


async def test_each_adapter_gives_its_own_peft_output(
    provider: TransformersProvider, reference: Any, tokenizer: Any
) -> None:
    ids = chatml_ids(tokenizer, PROMPTS[0])
    texts = {}
    for adapter_id in (None, *ADAPTERS):
        result = await provider.generate(PROMPTS[0], model="", adapter_id=adapter_id, max_tokens=10, temperature=0)
        assert result.adapter_id == adapter_id
        assert result.text == plain_generate(reference, tokenizer, ids, 10, adapter_id)
        texts[adapter_id] = result.text
    assert len(set(texts.values())) == 4, texts


async def test_32_concurrent_mixed_adapter_requests_each_get_their_single_request_output(
    provider: TransformersProvider,
) -> None:
    requests = [(PROMPTS[i % len(PROMPTS)], (None, *ADAPTERS)[(i // 2) % 4], 3 + (5 * i) % 11) for i in range(32)]
    alone = []
    for prompt, adapter_id, max_tokens in requests:
        result = await provider.generate(prompt, model="", adapter_id=adapter_id, max_tokens=max_tokens, temperature=0)
        alone.append(result)
    before = len(provider.recent_batch_sizes)

    together = await asyncio.gather(
        *(
            provider.generate(prompt, model="", adapter_id=adapter_id, max_tokens=max_tokens, temperature=0)
            for prompt, adapter_id, max_tokens in requests
        )
    )

    assert [r.text for r in together] == [r.text for r in alone]
    assert [r.completion_tokens for r in together] == [max_tokens for _, _, max_tokens in requests]
    assert [r.adapter_id for r in together] == [adapter_id for _, adapter_id, _ in requests]
    batches = provider.recent_batch_sizes[before:]
    assert sum(batches) == 32
    assert len(batches) < 32 and max(batches) > 1, f"requests were not batched: {batches}"


async def test_requests_with_different_sampling_settings_never_share_a_batch(
    provider: TransformersProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, bool, float, float]] = []
    model = provider.model
    real_generate = model.generate

    def spy(*args: Any, **kwargs: Any) -> Any:
        config = kwargs["generation_config"]
        calls.append((kwargs["input_ids"].shape[0], config.do_sample, config.temperature, config.repetition_penalty))
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    settings: list[dict[str, Any]] = (
        [{"temperature": 0.0}] * 4 + [{"temperature": 0.7}] * 3 + [{"temperature": 0.7, "repetition_penalty": 1.3}] * 2
    )
    results = await asyncio.gather(
        *(
            provider.generate(PROMPTS[i % 8], model="", adapter_id="a1", max_tokens=4, **kw)
            for i, kw in enumerate(settings)
        )
    )
    assert all(r.completion_tokens == 4 for r in results)
    rows: dict[tuple[bool, float, float], int] = {}
    for size, do_sample, temperature, penalty in calls:
        key = (do_sample, temperature if do_sample else 0.0, penalty)
        rows[key] = rows.get(key, 0) + size
    assert rows == {(False, 0.0, 1.0): 4, (True, 0.7, 1.0): 3, (True, 0.7, 1.3): 2}


async def test_seeded_sampling_reproduces_alone_and_under_load(provider: TransformersProvider) -> None:
    def ask() -> Any:
        return provider.generate(PROMPTS[1], model="", adapter_id="a2", max_tokens=8, temperature=1.0, seed=7)

    alone = await ask()
    crowd = await asyncio.gather(
        ask(), ask(), *(provider.generate(p, model="", max_tokens=4, temperature=1.0) for p in PROMPTS)
    )
    assert crowd[0].text == crowd[1].text == alone.text


async def test_stop_strings_and_max_tokens_are_cut_per_row(provider: TransformersProvider) -> None:
    full = await provider.generate(PROMPTS[2], model="", adapter_id="a0", max_tokens=12, temperature=0)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 2]
    assert stop and stop not in full.text[: len(full.text) // 2]
    stopped, short, base = await asyncio.gather(
        provider.generate(PROMPTS[2], model="", adapter_id="a0", max_tokens=12, temperature=0, stop=[stop]),
        provider.generate(PROMPTS[2], model="", adapter_id="a0", max_tokens=2, temperature=0),
        provider.generate(PROMPTS[3], model="", max_tokens=12, temperature=0),
    )
    assert stopped.text == full.text[: full.text.index(stop)]
    assert stopped.finish_reason == "stop" and 0 < stopped.completion_tokens < 12
    assert full.text.startswith(short.text) and short.completion_tokens == 2 and short.finish_reason == "length"
    assert base.completion_tokens == 12


async def test_gguf_twin_loaded_through_transformers_gives_the_same_greedy_output(
    provider: TransformersProvider, qwen2: Any
) -> None:
    async with TransformersProvider(model_name=str(qwen2.gguf_path)) as from_gguf:
        for prompt in PROMPTS[:3]:
            expected = await provider.generate(prompt, model="", system_prompt=SYSTEM, max_tokens=10, temperature=0)
            got = await from_gguf.generate(prompt, model="", system_prompt=SYSTEM, max_tokens=10, temperature=0)
            assert (got.text, got.prompt_tokens) == (expected.text, expected.prompt_tokens)
        assert got.model == "tiny-qwen2"
        await from_gguf.load_adapter("a1", qwen2.adapter_dirs["a1"])
        expected = await provider.generate(PROMPTS[0], model="", adapter_id="a1", max_tokens=10, temperature=0)
        got = await from_gguf.generate(PROMPTS[0], model="", adapter_id="a1", max_tokens=10, temperature=0)
        assert got.text == expected.text


async def test_event_loop_keeps_running_during_generation(
    provider: TransformersProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside each of the first 10 token steps, the worker waits until the event loop has run a callback: a
    generation on the loop's thread would wait for ever (the wait gives up after a minute). No clock, no tick
    rate: a busy machine delays every thread alike."""
    from inference._inprocess.batching import RowsCancelled

    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    turns: list[tuple[int, int]] = []  # (the generating thread, the thread that ran the callback meanwhile)
    real = RowsCancelled.__call__

    def check(self: RowsCancelled, input_ids: Any, scores: Any, **kwargs: Any) -> Any:  # after every token
        if len(turns) < 10:
            ran, generating = threading.Event(), threading.get_ident()
            loop.call_soon_threadsafe(lambda: (turns.append((generating, threading.get_ident())), ran.set()))
            assert ran.wait(60), "the event loop did not run while the model generated"
        return real(self, input_ids, scores, **kwargs)

    monkeypatch.setattr(RowsCancelled, "__call__", check)
    await asyncio.gather(*(provider.generate(p, model="", max_tokens=48, temperature=0) for p in PROMPTS))
    assert len(turns) == 10
    assert all(generating != loop_thread and ran_on == loop_thread for generating, ran_on in turns)


async def test_concurrent_first_calls_load_the_model_once(qwen2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def counting(*args: Any, **kwargs: Any) -> Any:
        loads.append(str(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", counting)
    async with TransformersProvider(model_name=str(qwen2.hf_dir)) as fresh:
        assert fresh.model is None
        results = await asyncio.gather(*(fresh.generate("Hi", model="", max_tokens=3, temperature=0) for _ in range(4)))
    assert loads == [str(qwen2.hf_dir)]
    assert len({r.text for r in results}) == 1


# Adapter lifecycle and errors ---------------------------------------------------------------------------


async def test_unload_frees_the_adapter_and_the_last_unload_restores_the_plain_model(qwen2: Any) -> None:
    async with TransformersProvider(model_name=str(qwen2.hf_dir), spare_adapter_slots=0) as fresh:
        fresh._slots.stacking = False  # PEFT's slots (the adapters the stacks cannot hold); stacks: test_*_stacks.py
        base_text = (await fresh.generate(PROMPTS[0], model="", max_tokens=8, temperature=0)).text
        await fresh.load_adapter("x", qwen2.adapter_dirs["a0"])
        await fresh.load_adapter("y", qwen2.adapter_dirs["a1"])
        y_text = (await fresh.generate(PROMPTS[0], model="", adapter_id="y", max_tokens=8, temperature=0)).text
        assert await fresh.list_adapters() == ["x", "y"]
        x_name = fresh.peft_adapter_names["x"]
        await fresh.unload_adapter("x")
        assert set(fresh.model.peft_config) == {fresh.peft_adapter_names["y"]}
        assert not any(f".{x_name}." in name for name, _ in fresh.model.named_parameters())
        assert (await fresh.generate(PROMPTS[0], model="", adapter_id="y", max_tokens=8, temperature=0)).text == y_text
        await fresh.unload_adapter("y")
        assert await fresh.list_adapters() == []
        assert not isinstance(fresh.model, peft.PeftModel)
        assert not any("lora" in name for name, _ in fresh.model.named_modules())
        assert (await fresh.generate(PROMPTS[0], model="", max_tokens=8, temperature=0)).text == base_text
        await fresh.load_adapter("x", qwen2.adapter_dirs["a0"])  # the id is free again
        assert await fresh.list_adapters() == ["x"]


async def test_unload_while_requests_are_queued_serves_them_first(qwen2: Any) -> None:
    async with TransformersProvider(model_name=str(qwen2.hf_dir), batch_window_ms=20) as fresh:
        await fresh.load_adapter("x", qwen2.adapter_dirs["a2"])
        expected = (await fresh.generate(PROMPTS[4], model="", adapter_id="x", max_tokens=6, temperature=0)).text
        *results, _ = await asyncio.gather(
            *(fresh.generate(PROMPTS[4], model="", adapter_id="x", max_tokens=6, temperature=0) for _ in range(3)),
            fresh.unload_adapter("x"),
        )
        assert [r.text if r is not None else None for r in results] == [expected] * 3
        with pytest.raises(AdapterNotFoundError):
            await fresh.generate(PROMPTS[4], model="", adapter_id="x", max_tokens=6)


def backend_names(provider: TransformersProvider) -> set[str]:
    """The names of what the model holds: PEFT's adapters and the stacks' slots."""
    return set(getattr(provider.model, "peft_config", {})) | set(provider._slots.stacked.slots)


def wrong_base_adapter(path: Path) -> Path:
    """A LoRA trained on a Qwen2 with hidden size 48 (the tiny model has 64): shapes cannot fit."""
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft.get_peft_model(transformers.Qwen2ForCausalLM(config), lora).save_pretrained(str(path))
    return path


def broken_adapters(qwen2: Any, tmp_path: Path) -> dict[str, tuple[Path, str]]:
    a0 = qwen2.adapter_dirs["a0"]
    garbage = copy_adapter(a0, tmp_path / "garbage")
    (garbage / "adapter_model.safetensors").write_bytes(b"\x00\x01 this is not safetensors")
    wrong_rank = copy_adapter(a0, tmp_path / "wrong_rank", lambda config: config.update(r=4))

    def add_missing_target(config: dict[str, Any]) -> None:
        config["target_modules"] = [*config["target_modules"], "vision_proj"]

    return {
        "missing directory": (tmp_path / "nowhere", "does not exist"),
        "corrupt safetensors": (garbage, "corrupt"),
        # read from the safetensors header before PEFT builds layers of the stated rank (r=2**40 was 281 TB)
        "weights that disagree with the config": (wrong_rank, r"with rank 4 \(its r\)"),
        "PyTorch weights that disagree with the config": (pickled_wrong_rank(a0, tmp_path), "could not be loaded"),
        "wrong base model": (wrong_base_adapter(tmp_path / "wrong_base"), "trained for another base model"),
        "DoRA": (copy_adapter(a0, tmp_path / "dora", lambda config: config.update(use_dora=True)), "DoRA"),
        "missing target module": (copy_adapter(a0, tmp_path / "target", add_missing_target), "vision_proj"),
    }


async def test_bad_adapters_are_refused_with_typed_errors_and_the_provider_keeps_working(
    provider: TransformersProvider, qwen2: Any, tmp_path: Path
) -> None:
    expected = (await provider.generate(PROMPTS[0], model="", adapter_id="a0", max_tokens=6, temperature=0)).text
    for case, (path, words) in broken_adapters(qwen2, tmp_path).items():
        with pytest.raises(InvalidAdapterError, match=words) as caught:
            await provider.load_adapter("bad", path)
        assert caught.value.provider == "transformers", case
        assert await provider.list_adapters() == list(ADAPTERS), case
        assert "bad" not in provider.peft_adapter_names, case
        assert backend_names(provider) == set(provider.peft_adapter_names.values()), case  # no half-load
        got = await provider.generate(PROMPTS[0], model="", adapter_id="a0", max_tokens=6, temperature=0)
        assert got.text == expected, case


def pickled_wrong_rank(source: Path, tmp_path: Path) -> Path:
    """Weights of rank 8 in adapter_model.bin (no header to read first) under r=4: PEFT itself fails to load them."""
    from safetensors.torch import load_file

    target = copy_adapter(source, tmp_path / "pickled_wrong_rank", lambda config: config.update(r=4))
    torch.save(load_file(target / "adapter_model.safetensors"), target / "adapter_model.bin")
    (target / "adapter_model.safetensors").unlink()
    return target


async def test_a_failed_first_adapter_leaves_the_plain_model_intact(qwen2: Any, tmp_path: Path) -> None:
    wrong_rank = pickled_wrong_rank(qwen2.adapter_dirs["a0"], tmp_path)
    async with TransformersProvider(model_name=str(qwen2.hf_dir)) as fresh:
        expected = (await fresh.generate(PROMPTS[1], model="", max_tokens=8, temperature=0)).text
        with pytest.raises(InvalidAdapterError, match="could not be loaded"):
            await fresh.load_adapter("bad", wrong_rank)
        assert not isinstance(fresh.model, peft.PeftModel)
        assert not any("lora" in name for name, _ in fresh.model.named_modules())
        assert (await fresh.generate(PROMPTS[1], model="", max_tokens=8, temperature=0)).text == expected
        await fresh.load_adapter("good", qwen2.adapter_dirs["a0"])
        assert await fresh.list_adapters() == ["good"]


async def test_a_layer_replication_adapter_is_refused_and_the_base_model_keeps_its_layers(
    qwen2: Any, tmp_path: Path
) -> None:
    """PEFT's layer_replication copies the shared model's layers in place: requests naming no adapter answered
    differently after the load, and still after unload_adapter."""
    def replicate(config: dict[str, Any]) -> None:  # PEFT's model: layer 1, then layer 0 (so a0's weights fit)
        config["layer_replication"] = [[1, 2], [0, 1]]

    replicated = copy_adapter(qwen2.adapter_dirs["a0"], tmp_path / "replicated", replicate)
    async with TransformersProvider(model_name=str(qwen2.hf_dir)) as fresh:
        expected = (await fresh.generate(PROMPTS[2], model="", max_tokens=12, temperature=0)).text
        with pytest.raises(InvalidAdapterError, match=r"uses layer_replication \(PEFT builds a deeper model"):
            await fresh.load_adapter("replicated", replicated)
        assert await fresh.list_adapters() == []
        assert (await fresh.generate(PROMPTS[2], model="", max_tokens=12, temperature=0)).text == expected
        assert len(fresh.model.model.layers) == 2


async def test_lifecycle_errors_are_typed(provider: TransformersProvider, qwen2: Any) -> None:
    with pytest.raises(AdapterNotFoundError, match="not loaded"):
        await provider.generate(PROMPTS[0], model="", adapter_id="nope", max_tokens=4)
    with pytest.raises(AdapterNotFoundError):
        await provider.unload_adapter("nope")
    with pytest.raises(AdapterAlreadyLoadedError):
        await provider.load_adapter("a0", qwen2.adapter_dirs["a1"])
    assert await provider.list_adapters() == list(ADAPTERS)
    result = await provider.generate(PROMPTS[0], model="", adapter_id="a0", max_tokens=4, temperature=0)
    assert result.completion_tokens == 4


def test_capabilities() -> None:
    assert TransformersProvider.supports_adapters
    assert TransformersProvider.batches_mixed_adapters
    assert TransformersProvider.runs_in_process


# Configuration ------------------------------------------------------------------------------------------


def test_settings_come_from_arguments_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRANSFORMERS_MODEL_NAME", "/models/from-env")
    monkeypatch.setenv("TRANSFORMERS_MAX_BATCH_SIZE", "7")
    provider = TransformersProvider(batch_window_ms=2)
    assert (provider.model_name, provider.max_batch_size, provider.batch_window_ms) == ("/models/from-env", 7, 2.0)
    assert (provider.device, provider.torch_dtype) == ("cpu", "auto")
    with pytest.raises(ConfigurationError, match="device"):
        TransformersProvider(model_name="x", device="tpu")
    with pytest.raises(ConfigurationError, match="torch_dtype"):
        TransformersProvider(model_name="x", torch_dtype="float8")
    with pytest.raises(ConfigurationError, match="max_batch_size"):
        TransformersProvider(model_name="x", max_batch_size=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is missing")
async def test_cuda_without_cuda_is_a_configuration_error(qwen2: Any) -> None:
    async with TransformersProvider(model_name=str(qwen2.hf_dir), device="cuda") as on_cuda:
        with pytest.raises(ConfigurationError, match="CUDA"):
            await on_cuda.generate("Hi", model="", max_tokens=2)


async def test_model_names_that_are_neither_files_nor_cached_hub_ids_are_refused(tmp_path: Path) -> None:
    async with TransformersProvider(model_name="Qwen/Qwen2-0.5B-Instruct") as hub_name:  # offline, not cached
        with pytest.raises(ModelLoadError, match="is not in the local Hugging Face cache"):
            await hub_name.generate("Hi", model="", max_tokens=2)
    async with TransformersProvider(model_name=str(tmp_path / "no" / "such" / "dir")) as missing:
        with pytest.raises(ModelLoadError, match=r"not a local directory or \.gguf file, nor a Hugging Face Hub id"):
            await missing.generate("Hi", model="", max_tokens=2)
    (tmp_path / "weights.bin").write_bytes(b"")
    async with TransformersProvider(model_name=str(tmp_path / "weights.bin")) as not_gguf:
        with pytest.raises(ConfigurationError, match="gguf"):
            await not_gguf.generate("Hi", model="", max_tokens=2)
    async with TransformersProvider(model_name=str(tmp_path)) as empty_dir:
        with pytest.raises(ModelLoadError, match="could not load"):
            await empty_dir.generate("Hi", model="", max_tokens=2)
    unnamed = TransformersProvider(model_name="", device="cpu")
    with pytest.raises(ConfigurationError, match="TRANSFORMERS_MODEL_NAME"):
        await unnamed.load_adapter("a", tmp_path)
    await unnamed.aclose()


async def test_a_cancelled_request_does_not_disturb_its_batch(provider: TransformersProvider) -> None:
    expected = [
        (await provider.generate(p, model="", adapter_id="a2", max_tokens=5, temperature=0)).text for p in PROMPTS[:4]
    ]
    tasks = [
        asyncio.create_task(provider.generate(p, model="", adapter_id="a2", max_tokens=5, temperature=0))
        for p in PROMPTS[:4]
    ]
    await asyncio.sleep(0)
    tasks[1].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[1], asyncio.CancelledError)
    texts = [r.text for i, r in enumerate(results) if i != 1 and isinstance(r, GenerationResult)]
    assert texts == [t for i, t in enumerate(expected) if i != 1]
    again = await provider.generate(PROMPTS[1], model="", adapter_id="a2", max_tokens=5, temperature=0)
    assert again.text == expected[1]


# Streaming ----------------------------------------------------------------------------------------------


async def collect(provider: TransformersProvider, prompt: str, **kwargs: Any) -> tuple[list[str], GenerationResult]:
    """Pieces and final result of one stream (exactly one result, after every piece)."""
    pieces: list[str] = []
    results: list[GenerationResult] = []
    async for event in provider.stream(prompt, model="", **kwargs):
        if isinstance(event, GenerationResult):
            results.append(event)
        else:
            assert not results, "a piece came after the result"
            pieces.append(event)
    assert len(results) == 1
    return pieces, results[0]


@pytest.mark.parametrize("adapter_id", [None, "a1"])
@pytest.mark.parametrize("with_stop", [False, True])
async def test_stream_pieces_concatenate_to_what_generate_returns(
    provider: TransformersProvider, adapter_id: str | None, with_stop: bool
) -> None:
    options: dict[str, Any] = {"adapter_id": adapter_id, "max_tokens": 16, "temperature": 0}
    full = (await provider.generate(PROMPTS[2], model="", **options)).text
    if with_stop:
        options["stop"] = [full[len(full) // 2 : len(full) // 2 + 2]]
    expected = await provider.generate(PROMPTS[2], model="", **options)

    pieces, result = await collect(provider, PROMPTS[2], **options)

    assert result == expected
    assert "".join(pieces) == expected.text
    assert len(pieces) > 1
    if with_stop:
        assert expected.finish_reason == "stop" and expected.text == full[: full.index(options["stop"][0])]
        assert not any(options["stop"][0] in piece for piece in pieces)


async def test_stream_pieces_are_whole_utf8_characters(
    provider: TransformersProvider, reference: Any, tokenizer: Any
) -> None:
    """The tiny Qwen2's 512-token vocabulary writes most non-ASCII characters as several byte tokens."""
    multi_token_characters = set()
    for adapter_id in (None, *ADAPTERS):
        for prompt in (PROMPTS[0], "Grüße aus Köln — 東京", "café"):
            pieces, result = await collect(provider, prompt, adapter_id=adapter_id, max_tokens=32, temperature=0)
            # Decoded in one go from all tokens: a character split between pieces would show as U+FFFD.
            expected = plain_generate(reference, tokenizer, chatml_ids(tokenizer, prompt), 32, adapter_id)
            assert "".join(pieces) == result.text == expected
            multi_token_characters |= {c for c in expected if ord(c) > 0xFF and c != "\ufffd"}
    assert multi_token_characters


async def test_a_stream_runs_alone_while_generates_around_it_batch(provider: TransformersProvider) -> None:
    alone = [(await provider.generate(p, model="", adapter_id="a2", max_tokens=8, temperature=0)) for p in PROMPTS[:4]]
    before = len(provider.recent_batch_sizes)
    streamed, together = await asyncio.gather(
        collect(provider, PROMPTS[0], adapter_id="a2", max_tokens=8, temperature=0),
        asyncio.gather(
            *(provider.generate(p, model="", adapter_id="a2", max_tokens=8, temperature=0) for p in PROMPTS[:4])
        ),
    )
    assert streamed[1] == alone[0] and "".join(streamed[0]) == alone[0].text
    assert together == alone
    batches = provider.recent_batch_sizes[before:]
    assert sum(batches) == 5 and 1 in batches


async def test_breaking_out_of_a_stream_stops_the_generation_within_a_token(
    provider: TransformersProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = (await provider.generate(PROMPTS[3], model="", adapter_id="a1", max_tokens=8, temperature=0)).text
    jobs: list[GenerationResult] = []
    real = provider._stream_now

    def slow_model(request: Any, sink: Any, cancel: threading.Event) -> GenerationResult:
        """After the 2nd piece, the worker waits (as a slow model would) until the consumer is gone."""
        handed = 0

        def slow_sink(piece: str) -> None:
            nonlocal handed
            sink(piece)
            handed += 1
            if handed == 2:
                cancel.wait(120)

        result = real(request, slow_sink, cancel)
        jobs.append(result)
        return result

    monkeypatch.setattr(provider, "_stream_now", slow_model)
    pieces: list[str] = []
    async for event in provider.stream(PROMPTS[3], model="", adapter_id="a1", max_tokens=2000, temperature=0):
        assert isinstance(event, str)
        pieces.append(event)
        if len(pieces) == 2:
            break

    after = await asyncio.wait_for(
        provider.generate(PROMPTS[3], model="", adapter_id="a1", max_tokens=8, temperature=0), timeout=60
    )
    assert after.text == expected
    assert len(jobs) == 1
    assert jobs[0].text.startswith("".join(pieces))
    assert jobs[0].completion_tokens < len(pieces) + 8  # stopped within a token, not at max_tokens


async def test_cancelling_the_consuming_task_stops_the_stream(provider: TransformersProvider) -> None:
    expected = (await provider.generate(PROMPTS[1], model="", max_tokens=8, temperature=0)).text
    first_piece = asyncio.Event()

    async def consume() -> None:
        async for _ in provider.stream(PROMPTS[1], model="", max_tokens=400, temperature=0):
            first_piece.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_piece.wait(), timeout=60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    again = await asyncio.wait_for(provider.generate(PROMPTS[1], model="", max_tokens=8, temperature=0), timeout=60)
    assert again.text == expected


async def test_stream_errors_are_typed_and_the_provider_keeps_streaming(provider: TransformersProvider) -> None:
    with pytest.raises(AdapterNotFoundError):
        await collect(provider, PROMPTS[0], adapter_id="nope")
    with pytest.raises(InvalidRequestError, match="context"):
        await collect(provider, "word " * 2000, max_tokens=4)
    pieces, result = await collect(provider, PROMPTS[0], max_tokens=6, temperature=0)
    assert "".join(pieces) == result.text and result.completion_tokens == 6


# Capacity and lifecycle -----------------------------------------------------------------------------------


class BackendCalls:
    """Counts adapter loads into and deletions from the PEFT model, by id."""

    def __init__(self, provider: TransformersProvider) -> None:
        self.loads: list[str] = []
        self.unloads: list[str] = []
        load, unload = provider._load_adapter_now, provider._unload_adapter_now

        def counting_load(adapter_id: str, path: str) -> None:
            load(adapter_id, path)
            self.loads.append(adapter_id)

        def counting_unload(adapter_id: str) -> None:
            unload(adapter_id)
            self.unloads.append(adapter_id)

        provider._load_adapter_now = counting_load  # type: ignore[method-assign, assignment]
        provider._unload_adapter_now = counting_unload  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def adapter_texts(provider: TransformersProvider) -> dict[str | None, str]:
    """Greedy text of PROMPTS[0] per adapter, from the module's provider (no capacity)."""

    async def texts() -> dict[str | None, str]:
        return {
            adapter_id: (
                await provider.generate(PROMPTS[0], model="", adapter_id=adapter_id, max_tokens=8, temperature=0)
            ).text
            for adapter_id in (None, *ADAPTERS)
        }

    result: dict[str | None, str] = run(texts())
    return result


async def ask(provider: TransformersProvider, adapter_id: str | None) -> str:
    return (await provider.generate(PROMPTS[0], model="", adapter_id=adapter_id, max_tokens=8, temperature=0)).text


async def test_capacity_evicts_the_least_recently_used_adapter_and_reloads_it_on_use(
    qwen2: Any, adapter_texts: dict[str | None, str]
) -> None:
    async with TransformersProvider(model_name=str(qwen2.hf_dir), max_adapters=2) as fresh:
        calls = BackendCalls(fresh)
        for adapter_id in ADAPTERS:
            await fresh.load_adapter(adapter_id, qwen2.adapter_dirs[adapter_id])
        assert calls.unloads == ["a0"]
        assert fresh.resident_adapters == ["a1", "a2"] == sorted(fresh.peft_adapter_names)
        assert backend_names(fresh) == set(fresh.peft_adapter_names.values())
        assert await fresh.list_adapters() == list(ADAPTERS)

        assert await ask(fresh, "a0") == adapter_texts["a0"]  # transparently loaded again
        assert calls.unloads == ["a0", "a1"] and calls.loads == ["a0", "a1", "a2", "a0"]
        for wanted in ["a1", "a2", "a0", None, "a1"]:
            assert await ask(fresh, wanted) == adapter_texts[wanted], wanted
            assert len(fresh.resident_adapters) <= 2


async def test_concurrent_requests_for_more_adapters_than_the_capacity_each_get_their_own_output(
    qwen2: Any, adapter_texts: dict[str | None, str]
) -> None:
    async with TransformersProvider(model_name=str(qwen2.hf_dir), max_adapters=2, batch_window_ms=20) as fresh:
        for adapter_id in ADAPTERS:
            await fresh.load_adapter(adapter_id, qwen2.adapter_dirs[adapter_id])
        order: list[str | None] = ["a0", "a1", "a2", None, "a2", "a0", "a1", "a0"]
        texts = await asyncio.gather(*(ask(fresh, adapter_id) for adapter_id in order))
        assert texts == [adapter_texts[adapter_id] for adapter_id in order]
        assert await fresh.list_adapters() == list(ADAPTERS)


async def test_closing_right_after_a_burst_over_the_capacity_logs_no_error(
    qwen2: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The burst leaves more adapters resident than max_adapters, evicted one after another once its requests end;
    closing then used to log a traceback (the evictions after the close ran on the closed provider: "this
    TransformersProvider is closed")."""
    fresh = TransformersProvider(model_name=str(qwen2.hf_dir), max_adapters=1)
    ids = [f"{adapter_id}-{n}" for n in range(2) for adapter_id in ADAPTERS]
    for adapter_id in ids:
        await fresh.load_adapter(adapter_id, qwen2.adapter_dirs[adapter_id.partition("-")[0]])
    await asyncio.gather(*(ask(fresh, adapter_id) for adapter_id in ids))
    assert len(fresh.resident_adapters) >= 3  # over the capacity: at least two evictions to come
    caplog.clear()
    await fresh.aclose()
    for _ in range(20):  # whatever the close left scheduled has its turns
        await asyncio.sleep(0)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
    assert fresh.closed


async def test_a_pinned_adapter_is_never_evicted(qwen2: Any, adapter_texts: dict[str | None, str]) -> None:
    async with TransformersProvider(model_name=str(qwen2.hf_dir), max_adapters=2) as fresh:
        calls = BackendCalls(fresh)
        await fresh.load_adapter("a0", qwen2.adapter_dirs["a0"], pin=True)
        await fresh.load_adapter("a1", qwen2.adapter_dirs["a1"])
        await fresh.load_adapter("a2", qwen2.adapter_dirs["a2"])
        for adapter_id in ["a1", "a2", "a1", "a0"]:
            assert await ask(fresh, adapter_id) == adapter_texts[adapter_id]
            assert "a0" in fresh.resident_adapters
        assert "a0" not in calls.unloads and calls.unloads.count("a1") >= 2


async def test_replace_swaps_the_path_and_the_same_path_is_a_no_op(
    qwen2: Any, adapter_texts: dict[str | None, str]
) -> None:
    async with TransformersProvider(model_name=str(qwen2.hf_dir)) as fresh:
        calls = BackendCalls(fresh)
        await fresh.load_adapter("x", qwen2.adapter_dirs["a0"])
        await fresh.load_adapter("x", qwen2.adapter_dirs["a0"])
        assert calls.loads == ["x"]
        with pytest.raises(AdapterAlreadyLoadedError, match="replace=True"):
            await fresh.load_adapter("x", qwen2.adapter_dirs["a2"])
        assert await ask(fresh, "x") == adapter_texts["a0"]
        await fresh.load_adapter("x", qwen2.adapter_dirs["a2"], replace=True)
        assert (calls.loads, calls.unloads) == (["x", "x@2"], ["x"])  # the new weights beside the old, then a switch
        assert await ask(fresh, "x") == adapter_texts["a2"]


async def test_concurrent_loads_of_one_adapter_load_it_once(qwen2: Any, adapter_texts: dict[str | None, str]) -> None:
    async with TransformersProvider(model_name=str(qwen2.hf_dir)) as fresh:
        calls = BackendCalls(fresh)
        await asyncio.gather(*(fresh.load_adapter("a1", qwen2.adapter_dirs["a1"]) for _ in range(5)))
        assert calls.loads == ["a1"]
        assert await ask(fresh, "a1") == adapter_texts["a1"]


def test_max_adapters_comes_from_the_argument_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRANSFORMERS_MAX_ADAPTERS", raising=False)
    assert TransformersProvider(model_name="x").max_adapters is None
    monkeypatch.setenv("TRANSFORMERS_MAX_ADAPTERS", "4")
    assert TransformersProvider(model_name="x").max_adapters == 4
    assert TransformersProvider(model_name="x", max_adapters=2).max_adapters == 2
    with pytest.raises(ConfigurationError, match="max_adapters"):
        TransformersProvider(model_name="x", max_adapters=-1)


HUB_SCRIPT = """
import asyncio, sys
from inference.transformers_provider import TransformersProvider

async def main() -> None:
    async with TransformersProvider(model_name="tiny-org/tiny-qwen2") as hub, TransformersProvider(
        model_name=sys.argv[1]
    ) as local:
        a = await hub.generate("Hello", model="", max_tokens=6, temperature=0)
        b = await local.generate("Hello", model="", max_tokens=6, temperature=0)
        print(a.model, a.text == b.text, a.completion_tokens)

asyncio.run(main())
"""


def test_a_hub_id_loads_offline_from_the_hugging_face_cache(qwen2: Any, tmp_path: Path) -> None:
    """A model laid out in a Hugging Face cache (models--ORG--NAME/snapshots/REV, refs/main) loads by its Hub id with
    HF_HUB_OFFLINE=1, as on a user's machine after a download, and answers as the same directory does."""
    import shutil
    import subprocess
    import sys

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tiny-org--tiny-qwen2"
    shutil.copytree(qwen2.hf_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    environment = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    finished = subprocess.run([sys.executable, "-c", HUB_SCRIPT, str(qwen2.hf_dir)], capture_output=True, text=True,
                              env=environment, timeout=300, check=False)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert finished.stdout.split() == ["tiny-org/tiny-qwen2", "True", "6"]


async def test_a_model_loaded_by_the_caller_and_from_pretrained_keywords_answer_as_the_directory(qwen2: Any) -> None:
    """genlm and AXEtract wrap a model they loaded themselves; users pass from_pretrained keywords (device_map,
    attn_implementation...): each gives the greedy text the plain directory gives, adapters included."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    greedy: dict[str, Any] = {"model": "", "max_tokens": 8, "temperature": 0}
    async with TransformersProvider(model_name=str(qwen2.hf_dir)) as plain:
        await plain.load_adapter("a0", qwen2.adapter_dirs["a0"])
        expected = [(await plain.generate("Hello", adapter_id=a, **greedy)).text for a in (None, "a0")]

    preloaded = AutoModelForCausalLM.from_pretrained(qwen2.hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(qwen2.hf_dir)
    given = TransformersProvider(model=preloaded, tokenizer=tokenizer)
    passed = TransformersProvider(model_name=str(qwen2.hf_dir),
                                  model_kwargs={"attn_implementation": "eager", "device_map": "cpu"})
    for provider in (given, passed):
        async with provider:
            await provider.load_adapter("a0", qwen2.adapter_dirs["a0"])
            assert [(await provider.generate("Hello", adapter_id=a, **greedy)).text for a in (None, "a0")] == expected
    assert passed._loaded is None  # closed
    assert given.model_kwargs == {} and passed.model_kwargs["attn_implementation"] == "eager"
    with pytest.raises(ConfigurationError, match="model= and tokenizer= together"):
        TransformersProvider(model=preloaded)


async def test_from_pretrained_keywords_reach_transformers(qwen2: Any) -> None:
    async with TransformersProvider(model_name=str(qwen2.hf_dir), model_kwargs={"attn_implementation": "eager"}) as p:
        await p.generate("Hello", model="", max_tokens=1)
        assert p.model.config._attn_implementation == "eager"
    async with TransformersProvider(model_name=str(qwen2.hf_dir), model_kwargs={"no_such_keyword": 1}) as bad:
        with pytest.raises(ModelLoadError, match="no_such_keyword"):
            await bad.generate("Hello", model="", max_tokens=1)


# A LoRA on an embedding or output layer, saved as PEFT saves it by default (save_embedding_layers="auto"): with
# a full copy of that base layer (...embed_tokens.base_layer.weight) ------------------------------------------------
# PEFT's own load writes that copy into the model. In a model shared by every request and adapter, a copy that is not
# exactly the model's layer (saved in bfloat16, or from another checkpoint) changed the base model's answers and every
# other adapter's, for good (an unload did not undo it); the stacks, for an output-layer LoRA, ignored the copy. Now a
# copy equal to the layer (in its own dtype) is left out, and one that differs is refused, on both paths.

COPY_PAIRS = [("the quick brown fox", " jumps over the lazy dog"), ("Once upon a time", " there was a village")]


def trained(hf_dir: Path, target: str, directory: Path, dtype: str = "bfloat16") -> Path:
    """A LoRA on q_proj and ``target`` (``embed_tokens`` or ``lm_head``), its matrices random, trained and saved in
    ``dtype`` as PEFT saves it by default: with a copy of the ``target`` layer in that dtype."""
    base = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", target]))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model.to(getattr(torch, dtype)).save_pretrained(str(directory))
    tensors = load_file(directory / "adapter_model.safetensors")
    assert any(".base_layer.weight" in key for key in tensors), sorted(tensors)  # PEFT saved the copy
    return directory


def edited(source: Path, directory: Path, *, drop: bool = False, shift: float = 0.0) -> Path:
    """A copy of the adapter whose base-layer copy is left out (``drop``) or moved (``shift``: another checkpoint)."""
    shutil.copytree(source, directory)
    weights = directory / "adapter_model.safetensors"
    tensors = load_file(weights)
    for key in [key for key in tensors if ".base_layer." in key]:
        if drop:
            del tensors[key]
        else:
            tensors[key] = tensors[key] + shift
    save_file(tensors, weights)
    return directory


def peft_scores(hf_dir: Path, adapter: Path) -> list[float]:
    """Plain PEFT's log-likelihood of each pair, the adapter loaded from ``adapter`` on a fresh float32 model."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    base = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, str(adapter)).eval()
    scores = []
    for context, continuation in COPY_PAIRS:
        start = len(tokenizer(context)["input_ids"])
        ids = torch.tensor([tokenizer(context + continuation)["input_ids"]])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        scores.append(float(sum(logprobs[i - 1, ids[0, i]] for i in range(start, ids.shape[1]))))
    return scores


@pytest.mark.filterwarnings("ignore:Setting `save_embedding_layers` to `True`:UserWarning")  # what users get
@pytest.mark.parametrize("target", ["embed_tokens", "lm_head"])
@pytest.mark.parametrize(("saved_in", "served_in"), [("bfloat16", "float32"), ("float32", "bfloat16")])
def test_a_layer_copy_equal_to_the_model_s_is_left_out_and_one_that_differs_is_refused(
    tiny_models: dict[str, Any], tmp_path: Path, target: str, saved_in: str, served_in: str
) -> None:
    """Trained in bfloat16 and served in float32, or trained in float32 and served in bfloat16: the copy is the
    model's layer in another dtype, not another layer."""
    model = tiny_models["qwen2"]
    saved = trained(model.hf_dir, target, tmp_path / "saved", saved_in)
    lora_only = edited(saved, tmp_path / "lora-only", drop=True)
    other_checkpoint = edited(saved, tmp_path / "other", shift=0.25)
    expected = peft_scores(model.hf_dir, lora_only) if served_in == "float32" else None  # this model's own layer

    async def main() -> None:
        async with TransformersProvider(model_name=str(model.hf_dir), torch_dtype=served_in) as provider:

            async def scores(adapter_id: str | None) -> list[float]:
                return [(await provider.score(c, x, model="m", adapter_id=adapter_id)).logprob for c, x in COPY_PAIRS]

            await provider.load_adapter("a0", model.adapter_dirs["a0"])
            before = await scores(None), await scores("a0")
            await provider.load_adapter("x", saved)
            if expected is not None:
                assert await scores("x") == pytest.approx(expected, abs=1e-4)
            assert (await scores(None), await scores("a0")) == before  # the shared model is as it was, exactly
            with pytest.raises(InvalidAdapterError, match=r"copy of the base model's .* save_embedding_layers=False"):
                await provider.load_adapter("y", other_checkpoint)
            assert (await scores(None), await scores("a0")) == before
            assert await provider.list_adapters() == ["a0", "x"]

    asyncio.run(main())


@pytest.mark.filterwarnings("ignore:Setting `save_embedding_layers` to `True`:UserWarning")
def test_llama_cpp_refuses_a_layer_copy_naming_how_to_save_without_it(
    tiny_models: dict[str, Any], tmp_path: Path
) -> None:
    """The GGUF converter (llama.cpp, Ollama) refused the copy before, blaming it as "not a LoRA A/B matrix"; it now
    says what it is and how to save the adapter without it, and the adapter saved so converts."""
    from inference.adapters.gguf import convert_peft_to_gguf
    from inference.exceptions import AdapterConversionError

    model = tiny_models["qwen2"]
    saved = trained(model.hf_dir, "lm_head", tmp_path / "saved")
    with pytest.raises(AdapterConversionError, match=r"a copy of a base layer .* save_embedding_layers=False"):
        convert_peft_to_gguf(saved, model.gguf_path, tmp_path / "saved.gguf")
    lora_only = edited(saved, tmp_path / "lora-only", drop=True)
    assert convert_peft_to_gguf(lora_only, model.gguf_path, tmp_path / "ok.gguf").stat().st_size > 0


def load_file(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file as load

    return dict(load(str(path)))


def save_file(tensors: dict[str, Any], path: Path) -> None:
    from safetensors.torch import save_file as save

    save(tensors, str(path))


async def test_close_frees_the_weights_at_once_without_a_full_garbage_collection(
    qwen2: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model sits in reference cycles, so dropping it freed nothing until a full ``gc.collect()``, which close ran
    on the worker: a collection holds the GIL, and stalled every task on the event loop for 0.4 to 1.6 s. Now the
    weights are emptied at close and no collection runs; a model the user gave is left whole."""
    import gc

    collections: list[object] = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args) or 0)
    greedy: dict[str, Any] = {"model": "", "max_tokens": 8, "temperature": 0}
    owned = TransformersProvider(model_name=str(qwen2.hf_dir))
    await owned.load_adapter("a0", qwen2.adapter_dirs["a0"])
    await owned.generate("Hello", adapter_id="a0", **greedy)
    weights = [*owned.model.parameters(), *owned.model.buffers()]
    assert sum(tensor.numel() for tensor in weights) > 10_000
    await owned.aclose()
    assert sum(tensor.numel() for tensor in weights) == 0 and collections == []

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(qwen2.hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(qwen2.hf_dir)
    async with TransformersProvider(model=model, tokenizer=tokenizer) as given:
        expected = (await given.generate("Hello", **greedy)).text
    assert sum(parameter.numel() for parameter in model.parameters()) > 10_000
    async with TransformersProvider(model=model, tokenizer=tokenizer) as again:  # the user's model still serves
        assert (await again.generate("Hello", **greedy)).text == expected
