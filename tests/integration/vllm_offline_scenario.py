"""What ``test_vllm_offline.py`` checks, run in vLLM's own venv: ``.venv-vllm/bin/python vllm_offline_scenario.py OUT``.

vLLM pins its own transformers, so the ``vllm-offline`` provider runs in ``.venv-vllm``; this script drives it through
one scenario on the head-64 tiny Qwen2 and writes what it saw as JSON to ``OUT``, and the tests (in the main venv)
compare it with Transformers + PEFT on the same model and adapters. Nothing is judged here.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy
from safetensors.numpy import load_file, save_file

from inference.exceptions import InferenceError
from inference.results import GenerationResult
from inference.testing.tiny_models import TOOLS_CHATML_TEMPLATE
from inference.testing.vllm_model import build_vllm_model
from inference.vllm_offline_provider import VLLMOfflineProvider

PROMPTS = ["the quick brown fox", "Once upon a time there was", "numbers 1 2 3 and"]
ADAPTERS: list[str | None] = [None, "a0", "a1"]
OPTION_PROMPT = "numbers 1 2 3 and"
OPTION_CASES: dict[str, dict[str, Any]] = {  # each run on Transformers too, by test_vllm_offline.py
    "greedy": {},  # and "banned", "forced": the first greedy token's logit_bias -100 and 100
    "presence": {"presence_penalty": 2.0},
    "frequency": {"frequency_penalty": 2.0},
    "min_p": {"temperature": 1.0, "seed": 3, "min_p": 1.0},
    "n": {"n": 3},
    "raw": {"raw_prompt": True},
    "template": {"chat_template": "{{ lead }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
                 "chat_template_kwargs": {"lead": ""}},
    "thinking": {"chat_template": "{% if not enable_thinking %}No thinking. {% endif %}"
                                  "{% for m in messages %}{{ m['content'] }}{% endfor %}", "thinking": False},
}

TOOL_REQUEST: dict[str, Any] = {  # a forced tool call, run on Transformers too (the tools rendered by the template)
    "tools": [{"type": "function", "function": {"name": "time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}}, "required": ["zone"],
        "additionalProperties": False}}}],
    "tool_choice": "required",
    "chat_template": TOOLS_CHATML_TEMPLATE,
}

HUB_REVISION = "0123456789abcdef0123456789abcdef01234567"
MODEL_SAMPLING = {"do_sample": True, "temperature": 0.7, "top_k": 1, "top_p": 0.8}
"""The Hub copy's generation config: sampling, but among the one best token (greedy tokens, whatever the seed)."""
HUB_END_TOKENS = [2, 0]
"""The Hub copy's generation config's end tokens: ``<|im_end|>`` (the tokenizer's EOS) and ``<|endoftext|>``, as
Qwen2.5 Instruct's lists both (the tiny model never generates ``<|endoftext|>`` unforced)."""
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
SCORE_PAIRS = [
    ("the quick brown fox", " jumps over the dog"),
    ("", "Hello, world"),
    ("Answer: yes", "<|im_end|>"),  # special-token text is that token (one), as on Transformers
    ("The cafe\u0301 by the sea", " re\u0301sume\u0301"),  # "e" + U+0301: Qwen's tokenizer composes to NFC
]


def generation(result: GenerationResult) -> dict[str, Any]:
    return {
        "text": result.text,
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "tokens": [entry.token_id for entry in result.logprobs or ()],
        "logprobs": [entry.logprob for entry in result.logprobs or ()],
        "top": [[value for _, value in entry.top_logprobs] for entry in result.logprobs or ()],
    }


async def error_of(work: Any) -> dict[str, str]:
    try:
        await work
    except InferenceError as error:
        return {"type": type(error).__name__, "message": str(error)}
    except Exception as error:  # not the SDK's: the test says so
        return {"type": f"untyped {type(error).__module__}.{type(error).__name__}", "message": str(error)}
    return {"type": "none", "message": ""}


async def drained(stream: Any) -> None:
    async for _ in stream:
        pass


async def scenario(out: dict[str, Any], scratch: Path) -> None:
    model = build_vllm_model()
    provider = VLLMOfflineProvider(model_name=str(model.hf_dir), dtype="float32", max_model_len=512, max_lora_rank=8)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticker = asyncio.create_task(tick())
    await provider.start()
    out["ticks_during_start"] = ticks
    ticker.cancel()

    for adapter_id in ("a0", "a1"):
        await provider.load_adapter(adapter_id, model.adapter_dirs[adapter_id])
    greedy: dict[str, Any] = {"model": "tiny", "temperature": 0, "logprobs": 2}

    out["greedy"] = {
        f"{a}|{prompt}": generation(await provider.generate(prompt, adapter_id=a, max_tokens=8, **greedy))
        for a in ADAPTERS
        for prompt in PROMPTS
    }

    unset = await provider.generate(PROMPTS[0], model="tiny", max_tokens=8, seed=5, return_token_ids=True)
    out["unset_temperature"] = list(unset.token_ids or ())  # the model's config has no do_sample: greedy

    work = [(PROMPTS[index % 3], ADAPTERS[(index // 3) % 3]) for index in range(64)]
    single = {
        f"{a}|{p}": generation(await provider.generate(p, adapter_id=a, max_tokens=6, **greedy)) for p, a in set(work)
    }
    started = time.monotonic()
    results = await asyncio.gather(*(provider.generate(p, adapter_id=a, max_tokens=6, **greedy) for p, a in work))
    seconds = time.monotonic() - started
    out["concurrent"] = {
        "work": [f"{a}|{p}" for p, a in work],
        "results": [generation(result) for result in results],
        "single": single,
        "seconds": seconds,
        "tokens": sum(result.completion_tokens for result in results),
    }

    events = [e async for e in provider.stream(PROMPTS[0], model="tiny", adapter_id="a1", max_tokens=12, temperature=0)]
    whole = await provider.generate(PROMPTS[0], model="tiny", adapter_id="a1", max_tokens=12, temperature=0)
    final = events[-1]
    assert isinstance(final, GenerationResult)
    out["stream"] = {"pieces": [e for e in events[:-1] if isinstance(e, str)], "final": generation(final),
                     "whole": generation(whole)}

    engine = await provider._engine()
    stream = provider.stream(PROMPTS[1], model="tiny", adapter_id="a0", max_tokens=400, temperature=1.0, seed=3)
    first = await anext(stream)
    running_mid_stream = engine.llm.get_num_unfinished_requests()  # read before anything else can run
    await stream.aclose()  # the caller stops reading
    running_after_stream = engine.llm.get_num_unfinished_requests()
    # The engine is paused with requests kept (vLLM's own switch): the generation cannot finish before it is
    # cancelled, however fast or slow this machine is.
    await engine.llm.pause_generation(mode="keep", clear_cache=False)
    task = asyncio.create_task(provider.generate(PROMPTS[2], model="tiny", max_tokens=400, temperature=1.0, seed=4))
    await until(lambda: engine.llm.get_num_unfinished_requests() == 1, "the generation in the engine")
    task.cancel()
    cancelled = False
    try:
        await task
    except asyncio.CancelledError:
        cancelled = True
    running_after = engine.llm.get_num_unfinished_requests()
    # An abort that does not come from the caller (here vLLM's own abort of the request, while it is held): the
    # request must fail, not come back as an answer with finish_reason "stop".
    task = asyncio.create_task(error_of(provider.generate(PROMPTS[2], model="tiny", max_tokens=400)))
    await until(lambda: engine.llm.get_num_unfinished_requests() == 1, "the request in the engine")
    await engine.llm.abort(list(engine.llm.output_processor.external_req_ids))
    aborted = await task
    await engine.llm.resume_generation()
    out["cancel"] = {
        "first_piece": first,
        "running_mid_stream": running_mid_stream,
        "running_after_stream": running_after_stream,
        "generate_cancelled": cancelled,
        "running_after": running_after,
        "aborted": aborted,
        "after": generation(await provider.generate(PROMPTS[0], adapter_id="a1", max_tokens=8, **greedy)),
    }

    listed_before = await provider.list_adapters()
    await provider.load_adapter("a2", model.adapter_dirs["a2"])
    a2 = await provider.generate(PROMPTS[0], adapter_id="a2", max_tokens=8, **greedy)
    await provider.unload_adapter("a2")
    out["lifecycle"] = {
        "listed_before": listed_before,
        "a2": generation(a2),
        "after_unload": await error_of(provider.generate(PROMPTS[0], model="tiny", adapter_id="a2", max_tokens=2)),
        "listed_after": await provider.list_adapters(),
    }

    scores: dict[str, Any] = {}
    for adapter_id in (None, "a1"):
        for context, continuation in SCORE_PAIRS:
            result = await provider.score(context, continuation, model="tiny", adapter_id=adapter_id)
            scores[f"{adapter_id}|{context}|{continuation}"] = [result.logprob, result.num_tokens, result.is_greedy]
        text = "the quick brown fox jumps over the lazy dog. " * 10
        rolling = await provider.score_rolling(text, model="tiny", adapter_id=adapter_id)
        scores[f"{adapter_id}|rolling"] = [rolling.logprob, rolling.num_tokens, rolling.is_greedy]
    out["scores"] = scores

    # A stop string the JSON holds must not cut it (vLLM would apply it to structured output too).
    structured = await provider.generate(  # sampled: greedy, the tiny model's JSON ran to max_tokens
        "Give me JSON", model="tiny", max_tokens=60, json_schema=SCHEMA, stop=":", temperature=1.0, seed=1
    )
    out["json"] = generation(structured)

    # The request options of issue 25, each as token ids (compared with Transformers by the test).
    options: dict[str, Any] = {}
    plain = await provider.generate(OPTION_PROMPT, model="tiny", adapter_id="a0", max_tokens=12, temperature=0,
                                    return_token_ids=True)
    first = (plain.token_ids or (0,))[0]
    cases = {**OPTION_CASES, "banned": {"logit_bias": {first: -100}}, "forced": {"logit_bias": {first: 100}}}
    for name, extra in cases.items():
        result = await provider.generate(OPTION_PROMPT, model="tiny", adapter_id="a0", max_tokens=12,
                                         return_token_ids=True, **{"temperature": 0, **extra})
        choices = result.choices or (result,)
        options[name] = {"extra": extra, "ids": list(result.token_ids or ()), "choices": len(choices),
                         "texts": sorted({choice.text for choice in choices})}
    from inference import TokenIds

    ids = await provider.tokenize(OPTION_PROMPT, "tiny")
    vocabulary = await provider.token_vocabulary("tiny")
    out["vocabulary"] = {"size": vocabulary.size, "bytes": [piece.hex() for piece in vocabulary.token_bytes],
                         "text": await provider.detokenize(ids, "tiny"), "ids": ids}
    rows = await asyncio.gather(
        provider.batch_next_token_logprobs([ids, ids[:3]], "tiny", "a0"), provider.next_token_logprobs(ids, "tiny")
    )
    out["next_token"] = {"a0": rows[0].tolist(), "base": rows[1].tolist()}
    from_ids = await provider.generate(TokenIds(ids), model="tiny", adapter_id="a0", max_tokens=12, temperature=0,
                                       return_token_ids=True)
    options["token_prompt"] = {"extra": None, "ids": list(from_ids.token_ids or ()), "choices": 1,
                               "texts": [from_ids.text]}
    out["options"] = options
    sampled: dict[str, Any] = {"model": "tiny", "adapter_id": "a0", "max_tokens": 8, "temperature": 1.0}
    several = await provider.generate(OPTION_PROMPT, n=3, seed=7, **sampled)
    again = await provider.generate(OPTION_PROMPT, n=3, seed=7, **sampled)
    singles = [await provider.generate(OPTION_PROMPT, seed=seed, **sampled) for seed in (7, 8, 9)]
    out["n_sampled"] = {
        "texts": [choice.text for choice in several.choices or ()],
        "again": [choice.text for choice in again.choices or ()],
        "singles": [single.text for single in singles],
        "counts": [several.prompt_tokens, several.completion_tokens, several.token_count],
        "choice_counts": [[choice.prompt_tokens, choice.completion_tokens] for choice in several.choices or ()],
        "single_counts": [[single.prompt_tokens, single.completion_tokens] for single in singles],
    }
    called = await provider.generate([{"role": "user", "content": OPTION_PROMPT}], model="tiny", adapter_id="a0",
                                     max_tokens=60, temperature=0, return_token_ids=True, **TOOL_REQUEST)
    out["tool_call"] = {"ids": list(called.token_ids or ()), "finish_reason": called.finish_reason, "text": called.text,
                        "calls": [[call.name, call.arguments, call.error] for call in called.tool_calls or ()]}

    rank16 = scratch / "rank16"  # a1 with its matrices padded to rank 16 (a config r alone is refused as a lie)
    shutil.copytree(model.adapter_dirs["a1"], rank16)
    config = json.loads((rank16 / "adapter_config.json").read_text())
    (rank16 / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    weights = load_file(str(rank16 / "adapter_model.safetensors"))
    for name, tensor in weights.items():
        rank = tensor.shape[0] if ".lora_A." in name else tensor.shape[1]
        padding = [(0, 16 - rank), (0, 0)] if ".lora_A." in name else [(0, 0), (0, 16 - rank)]
        weights[name] = numpy.pad(tensor, padding)
    save_file(weights, str(rank16 / "adapter_model.safetensors"), metadata={"format": "pt"})
    out["errors"] = {
        "missing_adapter": await error_of(provider.load_adapter("ghost", scratch / "missing")),
        "rank_too_large": await error_of(provider.load_adapter("big", rank16)),
        "prompt_too_long": await error_of(provider.generate("word " * 600, model="tiny", max_tokens=4)),
        "max_tokens_too_large": await error_of(provider.generate("Hi", model="tiny", max_tokens=1000)),
        "temperature_refused": await error_of(provider.generate("Hi", model="tiny", max_tokens=2, temperature=50.0)),
        "temperature_refused_streamed": await error_of(
            drained(provider.stream("Hi", model="tiny", max_tokens=2, temperature=50.0))
        ),
        "seed_too_large": await error_of(provider.generate("Hi", model="tiny", max_tokens=2, seed=2**64)),
        "whole_context_distribution": await error_of(provider.next_token_logprobs([42] * 512, "tiny")),
        "listed": await provider.list_adapters(),
        "after": generation(await provider.generate(PROMPTS[0], adapter_id="a0", max_tokens=8, **greedy)),
    }

    await engine.llm.pause_generation(mode="keep", clear_cache=False)  # a request that cannot finish by itself
    in_flight = asyncio.create_task(error_of(provider.generate(PROMPTS[1], model="tiny", max_tokens=400)))
    await until(lambda: engine.llm.get_num_unfinished_requests() == 1, "the request in the engine")
    await provider.aclose()
    out["closed_in_flight"] = await in_flight
    out["closed"] = await error_of(provider.generate("Hi", model="tiny", max_tokens=2))
    await hub_id_and_step_config(out, model.hf_dir)


async def hub_id_and_step_config(out: dict[str, Any], directory: Path) -> None:
    """The model by Hub id, offline from a Hugging Face cache (``HF_HUB_CACHE``, set by the test) laid out as a
    download leaves it, with engine arguments from a step config; and a Hub id that is not cached."""
    from inference.factory import get_provider_for_step

    cache = Path(os.environ["HF_HUB_CACHE"])
    repo = cache / "models--tiny-org--tiny-vllm"
    shutil.copytree(directory, repo / "snapshots" / HUB_REVISION)
    generation_config = repo / "snapshots" / HUB_REVISION / "generation_config.json"  # the model's own sampling
    generation_config.write_text(json.dumps({**json.loads(generation_config.read_text()), **MODEL_SAMPLING,
                                             "eos_token_id": HUB_END_TOKENS}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HUB_REVISION)
    step = {"provider": "vllm-offline", "model_name": "tiny-org/tiny-vllm", "dtype": "float32", "max_model_len": 512,
            "max_lora_rank": 8, "max_loras": 1, "engine_args": {"max_num_seqs": 4}}
    provider = get_provider_for_step(step)
    same = get_provider_for_step({**step, "engine_args": '{"max_num_seqs": 4}'})  # equal settings, one provider
    missing = get_provider_for_step({**step, "model_name": "tiny-org/not-cached"})
    async with provider, missing:
        engine = await provider._engine()
        out["hub"] = {
            "same_provider": same is provider,
            "max_num_seqs": engine.llm.vllm_config.scheduler_config.max_num_seqs,
            "greedy": generation(await provider.generate(PROMPTS[0], model="tiny", max_tokens=8, temperature=0,
                                                         logprobs=2)),
            "not_cached": await error_of(missing.start()),
            "model_sampling": list((await provider.generate(PROMPTS[0], model="tiny", max_tokens=8, seed=11,
                                                            return_token_ids=True)).token_ids or ()),
            "directory": str(generation_config.parent),
            "end": await generation_config_end(provider),
        }
        out["base_mixed"] = await base_among_adapters(provider, engine)
        out["adapter_checks"] = await adapter_checks(provider)


async def generation_config_end(provider: VLLMOfflineProvider) -> dict[str, Any]:
    """The end tokens the vocabulary lists, and a generation forced (``logit_bias``) onto the generation config's end
    token that is not the tokenizer's: the engine stops on it."""
    from inference import TokenIds

    forced = await provider.generate(TokenIds([15, 200, 31]), model="tiny", max_tokens=4, temperature=0, logprobs=0,
                                     logit_bias={HUB_END_TOKENS[1]: 100}, return_token_ids=True)
    return {"eos_ids": list((await provider.token_vocabulary("tiny")).eos_ids), "ids": list(forced.token_ids or ()),
            "logprobs": len(forced.logprobs or ()), "text": forced.text, "finish_reason": forced.finish_reason,
            "completion_tokens": forced.completion_tokens}


async def base_among_adapters(provider: VLLMOfflineProvider, engine: Any) -> dict[str, Any]:
    """Base-model requests (a generation, a score, a next-token distribution) alone, and again in one engine step
    with a request for an adapter that fills every one of the ``max_loras=1`` slots (vLLM's CPU kernels read a
    request without an adapter from the last slot)."""

    def base() -> list[Any]:
        return [provider.generate(PROMPTS[0], model="tiny", max_tokens=8, temperature=0, return_token_ids=True),
                provider.score(*SCORE_PAIRS[0], model="tiny"),
                provider.next_token_logprobs([9, 8, 7, 6], "tiny")]

    def seen(results: list[Any]) -> dict[str, Any]:
        return {"ids": list(results[0].token_ids or ()), "score": results[1].logprob, "next": results[2].tolist()}

    alone = seen([await work for work in base()])
    await provider.load_adapter("a0", build_vllm_model().adapter_dirs["a0"])
    a0 = await provider.generate(PROMPTS[0], model="tiny", adapter_id="a0", max_tokens=8, temperature=0,
                                 return_token_ids=True)
    await engine.llm.pause_generation(mode="keep", clear_cache=False)  # all four reach the engine's first step
    tasks = [asyncio.ensure_future(work) for work in [*base(), provider.generate(
        PROMPTS[0], model="tiny", adapter_id="a0", max_tokens=8, temperature=0, return_token_ids=True)]]
    await until(lambda: engine.llm.get_num_unfinished_requests() == 4, "the four requests in the engine")
    await engine.llm.resume_generation()
    mixed = await asyncio.gather(*tasks)
    return {"alone": alone, "mixed": seen(list(mixed[:3])), "a0": list(a0.token_ids or ()),
            "a0_mixed": list(mixed[3].token_ids or ()), "listed": await provider.list_adapters()}


async def adapter_checks(provider: VLLMOfflineProvider) -> dict[str, Any]:
    """Adapters vLLM's engine would register and serve as garbage: one trained for a smaller base model (its
    matrices cut to half the layers' sizes, the rank kept), loaded and as a replacement of ``a0``."""
    a0 = build_vllm_model().adapter_dirs["a0"]
    greedy: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    before = await provider.generate(PROMPTS[0], adapter_id="a0", **greedy)
    with tempfile.TemporaryDirectory() as scratch:
        other = Path(scratch) / "otherbase"
        shutil.copytree(a0, other)
        weights = load_file(str(other / "adapter_model.safetensors"))
        for name, tensor in weights.items():
            weights[name] = tensor[:, : tensor.shape[1] // 2] if ".lora_A." in name else tensor[: tensor.shape[0] // 2]
        save_file(weights, str(other / "adapter_model.safetensors"), metadata={"format": "pt"})
        result = {
            "other_base": await error_of(provider.load_adapter("other", other)),
            "replaced": await error_of(provider.load_adapter("a0", other, replace=True)),
        }
    after = await provider.generate(PROMPTS[0], adapter_id="a0", **greedy)
    return {**result, "listed": await provider.list_adapters(), "a0_kept": before.token_ids == after.token_ids}


async def until(condition: Any, what: str) -> None:
    """Wait for a state (polled every 10 ms, for at most 5 minutes)."""
    for _ in range(30_000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never saw {what}")


def main() -> None:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        asyncio.run(scenario(out, Path(scratch)))
    Path(sys.argv[1]).write_text(json.dumps(out), encoding="utf-8")


if __name__ == "__main__":  # vLLM starts its engine process by spawning: the main module must be guarded
    main()
