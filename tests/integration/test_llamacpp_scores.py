"""Scores, token logprobs, conversations and JSON-schema output on the llama.cpp provider (tiny f32 GGUF models).

The scores are checked against plain transformers + PEFT on each model's HF twin, computed here with the
shared tokenization rule; tests/integration/test_cross_backend.py checks the same against the Transformers
provider.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest
import pytest_asyncio

from inference import FakeProvider, FallbackProvider
from inference._core.scoring import ScoreTokens, Vocabulary, rolling_windows, score_tokens
from inference.exceptions import InvalidRequestError, UnsupportedOperationError
from inference.llamacpp_provider import LlamaCppProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

TEXT = "the quick brown fox jumps over the lazy dog, and then the fox sleeps. " * 12


@pytest_asyncio.fixture(params=["qwen2", "llama"], scope="module", loop_scope="module")
async def model_and_provider(
    request: pytest.FixtureRequest, tiny_models: dict[str, Any]
) -> AsyncIterator[tuple[Any, LlamaCppProvider]]:
    model = tiny_models[request.param]
    provider = LlamaCppProvider(model_path=model.gguf_path, n_ctx=160, kv_cache_type="f32")
    for adapter_id in ("a0", "a1"):
        await provider.load_adapter(adapter_id, model.adapter_dirs[adapter_id])
    yield model, provider
    await provider.aclose()


def reference_scores(model: Any, adapter_id: str | None, sequences: list[ScoreTokens]) -> list[tuple[float, bool]]:
    """Plain transformers (+ PEFT): log-softmax of the logits before each scored token."""
    import peft
    import torch
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(str(model.hf_dir), dtype=torch.float32)
    net = base if adapter_id is None else peft.PeftModel.from_pretrained(base, str(model.adapter_dirs[adapter_id]))
    answers = []
    with torch.no_grad():
        for sequence in sequences:
            logits = net(torch.tensor([sequence.tokens[:-1]])).logits[0].double()
            rows = torch.log_softmax(logits[sequence.start - 1 :], dim=-1)
            targets = torch.tensor(sequence.scored)
            total = float(rows.gather(1, targets[:, None]).sum())
            answers.append((total, bool((rows.argmax(dim=-1) == targets).all())))
    return answers


def hf_vocabulary(model: Any) -> Vocabulary:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model.hf_dir))
    return Vocabulary(
        lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
        adds_bos=False,  # neither tiny model adds BOS
        bos_id=tokenizer.bos_token_id,
        eos_id=tokenizer.eos_token_id,
    )


@pytest.mark.parametrize("adapter_id", [None, "a0", "a1"])
async def test_score_equals_plain_peft(
    model_and_provider: tuple[Any, LlamaCppProvider], adapter_id: str | None
) -> None:
    model, provider = model_and_provider
    pairs = [("the quick brown fox", " jumps over the dog"), ("", "Hello, world!"), ("Once upon a time ", "there")]
    sequences = [score_tokens(hf_vocabulary(model), context, more, provider="t") for context, more in pairs]
    expected = reference_scores(model, adapter_id, sequences)
    for (context, continuation), sequence, (logprob, greedy) in zip(pairs, sequences, expected, strict=True):
        result = await provider.score(context, continuation, model="tiny", adapter_id=adapter_id)
        assert result.num_tokens == len(sequence.scored)
        assert abs(result.logprob - logprob) / result.num_tokens < 1e-3
        assert result.is_greedy == greedy and result.adapter_id == adapter_id


async def test_the_model_s_own_greedy_token_is_greedy(model_and_provider: tuple[Any, LlamaCppProvider]) -> None:
    model, provider = model_and_provider
    if model.arch != "llama":
        pytest.skip("generation renders the chat template here, so its context is not the plain prompt")
    for prompt in ("the quick brown fox", "Once upon a time", "Hello, world"):
        generated = await provider.generate(prompt, model="tiny", max_tokens=1, temperature=0, logprobs=0)
        assert generated.logprobs is not None
        (first,) = generated.logprobs
        if "\ufffd" in first.token:
            continue  # part of a multi-byte character: its text is not the token
        score = await provider.score(prompt, first.token, model="tiny")
        assert score.num_tokens == 1 and score.is_greedy
        assert score.logprob == pytest.approx(first.logprob, abs=1e-3)
        return
    pytest.fail("no prompt gave a whole-character first token")


async def test_score_rolling_past_the_context_sums_the_windows(
    model_and_provider: tuple[Any, LlamaCppProvider],
) -> None:
    model, provider = model_and_provider
    windows = rolling_windows(hf_vocabulary(model), TEXT, 160, provider="t")
    assert len(windows) > 1  # the text is longer than n_ctx=160
    expected = reference_scores(model, "a1", windows)
    result = await provider.score_rolling(TEXT, model="tiny", adapter_id="a1")
    assert result.num_tokens == sum(len(window.scored) for window in windows)
    assert abs(result.logprob - sum(value for value, _ in expected)) / result.num_tokens < 1e-3


async def test_too_long_to_score_is_refused_and_the_provider_keeps_serving(
    model_and_provider: tuple[Any, LlamaCppProvider],
) -> None:
    _, provider = model_and_provider
    with pytest.raises(InvalidRequestError, match=r"more than the model's context of 160 tokens.*LLAMACPP_N_CTX"):
        await provider.score(TEXT, " and more", model="tiny")
    assert (await provider.score("the fox", " sleeps", model="tiny")).num_tokens > 0
    assert (await provider.generate("the fox", model="tiny", max_tokens=3)).completion_tokens == 3


async def test_a_system_and_user_message_list_equals_system_prompt(
    model_and_provider: tuple[Any, LlamaCppProvider],
) -> None:
    _, provider = model_and_provider
    options: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "temperature": 0, "adapter_id": "a0"}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the quick brown fox"}]
    assert await provider.generate(messages, **options) == await provider.generate(
        "the quick brown fox", system_prompt="Be brief.", **options
    )


SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "size": {"type": "integer", "minimum": 3, "maximum": 7},
            "colour": {"enum": ["red", "green", "blue"]},
        },
        "required": ["name", "size", "colour"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "maxItems": 4},
            "owner": {
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"}},
                "required": ["id", "ok"],
                "additionalProperties": False,
            },
        },
        "required": ["items", "owner"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3},
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["flat-bounded", "nested", "array"])
@pytest.mark.parametrize("adapter_id", [None, "a1"])
async def test_sampled_json_always_validates(
    model_and_provider: tuple[Any, LlamaCppProvider], schema: dict[str, Any], adapter_id: str | None
) -> None:
    # Strict json.loads: no raw control characters in strings (llama-cpp-python's own schema grammar allows them).
    _, provider = model_and_provider
    for seed in range(4):
        result = await provider.generate(
            "Describe it as JSON.", model="tiny", adapter_id=adapter_id, max_tokens=110, temperature=1.0, seed=seed,
            json_schema=schema,
        )
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), schema)


async def test_a_schema_the_grammar_compiler_refuses_is_unsupported_here_and_a_fallback_moves_on(
    model_and_provider: tuple[Any, LlamaCppProvider],
) -> None:
    """Reviewed defect: a schema llguidance cannot compile (uniqueItems, oneOf, look-around...) was an
    InvalidRequestError, so a FallbackProvider never tried the next provider, which may take it."""
    _, provider = model_and_provider
    with pytest.raises(UnsupportedOperationError, match="json_schema cannot be compiled"):
        await provider.generate("x", model="tiny", json_schema={"type": "string", "pattern": "(?<=a)b"})
    unique = {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                         "uniqueItems": True}}, "required": ["tags"]}
    tool = {"type": "function", "function": {"name": "tag", "parameters": unique}}
    with pytest.raises(UnsupportedOperationError, match="the parameters of tool 'tag' cannot be compiled"):
        await provider.generate("x", model="tiny", tools=[tool], tool_choice="required")
    fallback = FallbackProvider([provider, FakeProvider()], labels=["local", "fake"])
    answer = await fallback.generate("x", model="tiny", json_schema=unique)
    assert answer.provider == "fake" and jsonschema.validate(json.loads(answer.text), unique) is None
    assert fallback.stats()["local"].failed == 1
    assert (await provider.generate("x", model="tiny", max_tokens=2)).completion_tokens == 2
