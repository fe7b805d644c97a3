"""TransformersProvider's scores and structure on the tiny Qwen2/Llama models: real transformers, real PEFT.

Scores are compared with a reference computed here with plain transformers + PEFT (one forward pass, a
log-softmax, the continuation's tokens summed), token logprobs with the reference model's log-softmax, and
every JSON-schema output is parsed and validated with ``jsonschema``.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.exceptions import InvalidRequestError, UnsupportedOperationError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

from inference.transformers_provider import TransformersProvider  # noqa: E402

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

ARCHITECTURES = ("qwen2", "llama")
ADAPTERS = ("a0", "a1")
PAIRS = (
    ("The quick brown", " fox jumps over"),
    ("Once upon a time", " there was a king"),
    ("bread 2.50, fish", " 7.25"),
    ("Knowledge is", " power"),
)
LONG_TEXT = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman who went out every "
    "morning. The quick brown fox jumps over the lazy dog, and the bakers of the village sold bread."
)
SCHEMAS: tuple[dict[str, Any], ...] = (
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "size": {"enum": ["small", "large"]},
            "inner": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": -3, "maximum": 7}},
                "required": ["n"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "size", "inner"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 4},
    {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        },
        "required": ["ok", "tags"],
        "additionalProperties": False,
    },
    {"type": "integer", "minimum": 10, "maximum": 20},
)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


class Reference:
    """The tiny model with adapters a0, a1 in plain PEFT: scores and log-softmaxes computed without the provider."""

    def __init__(self, directory: Path, adapter_dirs: dict[str, Path]) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
        base = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
        self.model = peft.PeftModel.from_pretrained(base, str(adapter_dirs["a0"]), adapter_name="a0")
        self.model.load_adapter(str(adapter_dirs["a1"]), adapter_name="a1")
        self.model.eval()

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def log_softmax(self, tokens: list[int], adapter: str | None) -> Any:
        """Log-softmax at every position of one unpadded sequence."""
        with torch.inference_mode():
            if adapter is None:
                with self.model.disable_adapter():
                    logits = self.model(torch.tensor([tokens])).logits[0]
            else:
                self.model.set_adapter(adapter)
                logits = self.model(torch.tensor([tokens])).logits[0]
        return torch.log_softmax(logits.float(), dim=-1)

    def score_sequence(self, tokens: list[int], start: int, adapter: str | None) -> tuple[float, int, bool]:
        logprobs = self.log_softmax(tokens[:-1], adapter)
        total, greedy = 0.0, True
        for position in range(start, len(tokens)):
            row = logprobs[position - 1]
            total += float(row[tokens[position]])
            greedy = greedy and int(row.argmax()) == tokens[position]
        return total, len(tokens) - start, greedy

    def score(self, context: str, continuation: str, adapter: str | None) -> tuple[float, int, bool]:
        """lm-eval's rule for a non-empty context without trailing space (the tiny tokenizers add no BOS)."""
        head = self.encode(context)
        whole = self.encode(context + continuation)
        return self.score_sequence(whole, len(head), adapter)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def tiny(request: pytest.FixtureRequest, tiny_models: dict[str, Any]) -> Any:
    return tiny_models[request.param]


@pytest.fixture(scope="module")
def reference(tiny: Any) -> Reference:
    return Reference(tiny.hf_dir, tiny.adapter_dirs)


@pytest.fixture(scope="module")
def provider(tiny: Any) -> Iterator[TransformersProvider]:
    shared = TransformersProvider(model_name=str(tiny.hf_dir), device="cpu", batch_window_ms=20)

    async def load() -> None:
        for adapter_id in (*ADAPTERS, "a2"):
            await shared.load_adapter(adapter_id, tiny.adapter_dirs[adapter_id])

    run(load())
    yield shared
    run(shared.aclose())


def test_capabilities() -> None:
    assert TransformersProvider.supports_scoring
    assert TransformersProvider.supports_logprobs
    assert TransformersProvider.supports_json_schema


# Chat messages ------------------------------------------------------------------------------------------


async def test_a_system_user_message_list_is_the_same_as_system_prompt(provider: TransformersProvider) -> None:
    system, user = "Answer briefly.", "Where does the river begin?"
    listed = await provider.generate(
        [{"role": "system", "content": system}, {"role": "user", "content": user}],
        model="",
        max_tokens=8,
        temperature=0,
        logprobs=0,
    )
    plain = await provider.generate(user, model="", system_prompt=system, max_tokens=8, temperature=0, logprobs=0)
    assert listed.logprobs is not None and plain.logprobs is not None
    assert [entry.token_id for entry in listed.logprobs] == [entry.token_id for entry in plain.logprobs]
    assert (listed.text, listed.prompt_tokens) == (plain.text, plain.prompt_tokens)


async def test_a_conversation_with_assistant_turns_is_rendered_in_full(
    provider: TransformersProvider, reference: Reference
) -> None:
    messages = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "And the fox?"},
    ]
    result = await provider.generate(messages, model="", max_tokens=6, temperature=0)
    tokenizer = reference.tokenizer
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = reference.encode(text)
    else:
        ids = list(tokenizer("\n\n".join(message["content"] for message in messages))["input_ids"])
    assert result.prompt_tokens == len(ids)
    with torch.inference_mode(), reference.model.disable_adapter():
        output = reference.model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)
    assert result.text == tokenizer.decode(output[0, len(ids) :].tolist(), skip_special_tokens=True)


# Token logprobs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("adapter_id", [None, "a1"])
async def test_token_logprobs_are_the_models_log_softmax(
    provider: TransformersProvider, reference: Reference, adapter_id: str | None
) -> None:
    result = await provider.generate(
        "Once upon a time", model="", adapter_id=adapter_id, max_tokens=6, temperature=0, logprobs=3
    )
    assert result.logprobs is not None and len(result.logprobs) == result.completion_tokens == 6
    prompt_ids = await _prompt_ids(provider, reference, "Once upon a time")
    generated = [entry.token_id for entry in result.logprobs]
    assert all(isinstance(token, int) for token in generated)
    table = reference.log_softmax(prompt_ids + generated, adapter_id)  # type: ignore[operator]
    for step, entry in enumerate(result.logprobs):
        row = table[len(prompt_ids) + step - 1]
        assert entry.logprob == pytest.approx(float(row[entry.token_id]), abs=1e-4)
        assert entry.token == reference.tokenizer.decode([entry.token_id])
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0] == (entry.token, pytest.approx(entry.logprob))  # greedy: the best token
        values = [value for _, value in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        best = torch.topk(row, 3)
        assert values == pytest.approx(best.values.tolist(), abs=1e-4)
    assert "".join(entry.token for entry in result.logprobs) == result.text


async def test_logprobs_in_a_mixed_batch_equal_those_alone_and_streams_carry_them(
    provider: TransformersProvider,
) -> None:
    async def one(adapter_id: str | None, k: int | None) -> Any:
        return await provider.generate(
            "The quick brown fox", model="", adapter_id=adapter_id, max_tokens=5, temperature=0, logprobs=k
        )

    alone = [await one(adapter_id, 2) for adapter_id in (None, "a0", "a1")]
    together = await asyncio.gather(one(None, 2), one("a0", 2), one("a1", 2), one("a2", None))
    for batched, single in zip(together[:3], alone, strict=True):  # padding moves the floats a little
        assert batched.text == single.text
        assert [entry.token_id for entry in batched.logprobs] == [entry.token_id for entry in single.logprobs]
        assert [entry.logprob for entry in batched.logprobs] == pytest.approx(
            [entry.logprob for entry in single.logprobs], abs=1e-4
        )
        assert [entry.top_logprobs[1][0] for entry in batched.logprobs] == [
            entry.top_logprobs[1][0] for entry in single.logprobs
        ]
    assert together[3].logprobs is None
    final = None
    async for event in provider.stream(
        "The quick brown fox", model="", adapter_id="a0", max_tokens=5, temperature=0, logprobs=2
    ):
        final = event
    assert final == alone[1]


async def test_logprobs_stop_where_a_stop_string_cuts_and_sampling_reports_raw_logprobs(
    provider: TransformersProvider,
) -> None:
    full = await provider.generate("Hello, world!", model="", max_tokens=12, temperature=0, logprobs=1)
    assert full.logprobs is not None
    stop = full.logprobs[4].token.strip() or full.text[len(full.text) // 2 :]
    cut = await provider.generate("Hello, world!", model="", max_tokens=12, temperature=0, logprobs=1, stop=[stop])
    assert cut.logprobs is not None and cut.completion_tokens < 12
    assert cut.logprobs == full.logprobs[: len(cut.logprobs)]  # the tokens that make the text, no more
    ids = [entry.token_id for entry in cut.logprobs]
    assert (await provider.detokenize(ids, "m")).startswith(cut.text)
    assert not ids or not (await provider.detokenize(ids[:-1], "m")).startswith(cut.text)
    hot = await provider.generate("Hello", model="", max_tokens=8, temperature=1.7, top_k=5, seed=3, logprobs=5)
    assert hot.logprobs is not None
    for entry in hot.logprobs:  # before temperature and top-k: the full distribution's log-probabilities
        assert entry.top_logprobs[0][1] >= entry.logprob
        assert sum(math.exp(value) for _, value in entry.top_logprobs) <= 1.0 + 1e-5


# Scores -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("adapter_id", [None, *ADAPTERS])
async def test_score_equals_plain_peft_log_softmax(
    provider: TransformersProvider, reference: Reference, adapter_id: str | None
) -> None:
    for context, continuation in PAIRS:
        result = await provider.score(context, continuation, model="", adapter_id=adapter_id)
        logprob, count, greedy = reference.score(context, continuation, adapter_id)
        assert result.logprob == pytest.approx(logprob, abs=1e-4)
        assert (result.num_tokens, result.is_greedy) == (count, greedy)
        assert result.adapter_id == adapter_id
    # trailing whitespace of the context moves to the continuation
    moved = await provider.score("The quick brown ", "fox", model="", adapter_id=adapter_id)
    assert moved.logprob == pytest.approx(reference.score("The quick brown", " fox", adapter_id)[0], abs=1e-4)


async def test_is_greedy_is_true_for_the_models_own_continuation(
    provider: TransformersProvider, reference: Reference
) -> None:
    context = "Once upon a time"
    tokens = reference.encode(context)
    for _ in range(4):
        tokens.append(int(reference.log_softmax(tokens, "a0")[-1].argmax()))
    continuation = reference.tokenizer.decode(tokens[len(reference.encode(context)) :])
    expected = reference.score(context, continuation, "a0")
    result = await provider.score(context, continuation, model="", adapter_id="a0")
    assert result.is_greedy == expected[2]
    if reference.encode(context + continuation) == tokens:  # the text round-trips to the same tokens
        assert result.is_greedy


async def test_concurrent_score_batches_for_three_adapters_are_batched_and_equal_one_at_a_time(
    provider: TransformersProvider,
) -> None:
    pairs = list(PAIRS) * 2
    one_at_a_time = {
        adapter_id: [await provider.score(*pair, model="", adapter_id=adapter_id) for pair in pairs]
        for adapter_id in ("a0", "a1", None)
    }
    before = len(provider.recent_batch_sizes)
    batches = await asyncio.gather(
        *(provider.score_batch(pairs, model="", adapter_id=adapter_id) for adapter_id in one_at_a_time)
    )
    for adapter_id, batch in zip(one_at_a_time, batches, strict=True):
        for alone, together in zip(one_at_a_time[adapter_id], batch, strict=True):
            assert not isinstance(together, Exception)
            assert together.logprob == pytest.approx(alone.logprob, abs=1e-4)
            assert (together.num_tokens, together.is_greedy, together.adapter_id) == (
                alone.num_tokens,
                alone.is_greedy,
                alone.adapter_id,
            )
    sizes = provider.recent_batch_sizes[before:]
    assert max(sizes) > 1 and len(sizes) < 3 * len(pairs)  # several calls per forward pass


async def test_score_rolling_of_a_text_that_fits_is_the_score_after_the_start_token(
    provider: TransformersProvider, reference: Reference
) -> None:
    rolling = await provider.score_rolling(LONG_TEXT, model="", adapter_id="a1")
    single = await provider.score("", LONG_TEXT, model="", adapter_id="a1")
    tokens = reference.encode(LONG_TEXT)
    bos = reference.tokenizer.bos_token_id
    expected = reference.score_sequence([bos, *tokens], 1, "a1")
    assert rolling.num_tokens == single.num_tokens == len(tokens)
    assert rolling.logprob == pytest.approx(expected[0], abs=1e-3)
    assert single.logprob == pytest.approx(expected[0], abs=1e-3)


@pytest.fixture(scope="module")
def short_context(tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TransformersProvider]:
    """The tiny model with a 16-token context (max_position_embeddings edited in a copy of its directory)."""
    directory = tmp_path_factory.mktemp("short") / tiny.hf_dir.name
    shutil.copytree(tiny.hf_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    config["max_position_embeddings"] = 16
    (directory / "config.json").write_text(json.dumps(config))
    shared = TransformersProvider(model_name=str(directory), device="cpu", batch_window_ms=20)
    run(shared.load_adapter("a0", tiny.adapter_dirs["a0"]))
    yield shared
    run(shared.aclose())


@pytest.mark.parametrize("adapter_id", [None, "a0"])
async def test_score_rolling_longer_than_the_context_sums_its_windows(
    short_context: TransformersProvider, reference: Reference, adapter_id: str | None
) -> None:
    tokens = reference.encode(LONG_TEXT)
    assert len(tokens) > 3 * 16
    expected, greedy, done = 0.0, True, 0
    bos = reference.tokenizer.bos_token_id
    first = [bos, *tokens[:16]]  # lm-eval's windows written out: the first after BOS, then 16 new tokens each
    logprob, _, is_greedy = reference.score_sequence(first, 1, adapter_id)
    expected, greedy, done = logprob, is_greedy, 16
    while done < len(tokens):
        end = min(done + 16, len(tokens))
        begin = max(0, end - 17)
        logprob, _, is_greedy = reference.score_sequence(tokens[begin:end], done - begin, adapter_id)
        expected, greedy, done = expected + logprob, greedy and is_greedy, end
    result = await short_context.score_rolling(LONG_TEXT, model="", adapter_id=adapter_id)
    assert result.num_tokens == len(tokens)
    assert result.logprob == pytest.approx(expected, abs=1e-3)
    assert result.is_greedy == greedy


async def test_a_score_longer_than_the_context_is_refused_and_the_provider_keeps_serving(
    short_context: TransformersProvider,
) -> None:
    results = await asyncio.gather(
        short_context.score("Hi", LONG_TEXT, model=""),
        short_context.score("Knowledge is", " power", model="", adapter_id="a0"),
        return_exceptions=True,
    )
    assert isinstance(results[0], InvalidRequestError)
    assert "context of 16 tokens" in str(results[0]) and "max_position_embeddings" in str(results[0])
    assert not isinstance(results[1], BaseException) and results[1].num_tokens >= 1
    again = await short_context.score("Knowledge is", " power", model="", adapter_id="a0")
    assert again.logprob == pytest.approx(results[1].logprob, abs=1e-6)
    assert (await short_context.score_rolling("Knowledge is power", model="")).num_tokens >= 1


# JSON schema --------------------------------------------------------------------------------------------


async def test_sampled_json_in_mixed_adapter_batches_always_validates(provider: TransformersProvider) -> None:
    calls = []
    for number, schema in enumerate(SCHEMAS):
        for adapter_id in (None, "a0", "a1"):
            for seed in (None, number):  # unseeded requests share batches; seeded ones run alone
                calls.append((schema, adapter_id, seed))
    before = len(provider.recent_batch_sizes)
    results = await asyncio.gather(
        *(
            provider.generate(
                "Describe it in JSON.",
                model="",
                adapter_id=adapter_id,
                max_tokens=200,
                temperature=1.0,
                seed=seed,
                json_schema=schema,
            )
            for schema, adapter_id, seed in calls
        ),
        provider.generate("Free text", model="", adapter_id="a2", max_tokens=10, temperature=1.0),
    )
    assert max(provider.recent_batch_sizes[before:]) > 1
    for (schema, _, _), result in zip(calls, results, strict=False):
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), schema)
    batch = await provider.generate_batch(
        ["A", "B", "C"], model="", adapter_id="a1", max_tokens=200, temperature=1.0, json_schema=SCHEMAS[0]
    )
    for item in batch:
        assert not isinstance(item, Exception)
        jsonschema.validate(json.loads(item.text), SCHEMAS[0])


async def test_greedy_json_with_logprobs_and_streaming(provider: TransformersProvider) -> None:
    result = await provider.generate(
        "JSON please", model="", adapter_id="a0", max_tokens=200, temperature=0, json_schema=SCHEMAS[2], logprobs=1
    )
    jsonschema.validate(json.loads(result.text), SCHEMAS[2])
    assert result.finish_reason == "stop"
    assert result.logprobs is not None and len(result.logprobs) == result.completion_tokens
    pieces, final = [], None
    async for event in provider.stream(
        "JSON please", model="", adapter_id="a0", max_tokens=200, temperature=0, json_schema=SCHEMAS[2], logprobs=1
    ):
        if isinstance(event, str):
            pieces.append(event)
        else:
            final = event
    assert final == result and "".join(pieces) == result.text


async def test_a_schema_the_compiler_refuses_is_unsupported_here_and_the_provider_keeps_working(
    provider: TransformersProvider,
) -> None:
    refused = {"type": "string", "pattern": "(?<=a)b"}
    with pytest.raises(UnsupportedOperationError, match="json_schema cannot be compiled"):
        await provider.generate("Hi", model="", json_schema=refused)
    results = await asyncio.gather(
        provider.generate("Hi", model="", json_schema=refused, max_tokens=5, temperature=0),
        provider.generate("Hi", model="", json_schema=SCHEMAS[1], max_tokens=200, temperature=0),
        return_exceptions=True,
    )
    assert isinstance(results[0], UnsupportedOperationError)
    assert not isinstance(results[1], BaseException)
    jsonschema.validate(json.loads(results[1].text), SCHEMAS[1])


async def _prompt_ids(provider: TransformersProvider, reference: Reference, prompt: str) -> list[int]:
    tokenizer = reference.tokenizer
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        return reference.encode(text)
    return list(tokenizer(prompt)["input_ids"])
