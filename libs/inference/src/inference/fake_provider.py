"""A deterministic provider with no dependencies, for users' own tests of agent loops."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from inference._core.scoring import too_long
from inference._core.validation import AdapterScales, GenerationRequest, ScoreRequest, TokenRequest
from inference.adapters.source import AdapterSource
from inference.exceptions import InvalidRequestError
from inference.messages import Message
from inference.options import RESPONSE_FORMAT_AS_JSON_SCHEMA, TIMEOUT_IN_BASE_CLASS, OptionMap, Sent
from inference.provider import InferenceProvider
from inference.results import GenerationResult, ScoreResult, StreamEvent, TokenLogprob
from inference.tokens import TokenCacheStats, TokenVocabulary
from inference.tools import parse_tool_call

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["FakeProvider"]

_WORDS = tuple(
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "  # noqa: SIM905
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu".split()
)


class FakeProvider(InferenceProvider):
    """Answers instantly with text that depends only on the prompt, system prompt, adapter and seed.

    Scores (``score``, ``score_rolling``) and token ``logprobs`` are made-up numbers that depend only on the
    text and the adapter: the same request always gets the same numbers, a word is one token. With
    ``json_schema`` it answers a small JSON value valid against the schema (the usual keywords: type,
    properties, items, enum, const, anyOf, ``$ref``, minimum/maximum), or raises
    :class:`~inference.exceptions.InvalidRequestError` for a schema it cannot satisfy.

    The same request always gives the same text; a different adapter gives a different text, and so does an
    adapter replaced with ``load_adapter(..., replace=True)`` from another path (the text depends on the adapter's
    id and path).

    Token level, it has a small vocabulary of 259 ids: ``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2), then one token
    per byte (byte ``b`` is id ``3 + b``), so ``tokenize`` is the text's UTF-8 bytes (the special tokens' text read
    as those tokens) and every text round-trips. ``next_token_logprobs`` gives a made-up distribution over the 259
    ids that depends only on the sequence and the adapter's weights (its id and path): the same call always gives
    the same array, on any machine. It keeps a prefix cache as a real backend does (``cache_stats()`` counts it;
    each token of a new prefix is one step of a hash chain, so an extended prefix costs one step), keyed by the
    adapter's version. ``generate`` takes a :class:`~inference.tokens.TokenIds` prompt (its answer depends on the
    ids) and ``return_token_ids=True`` gives the answer's ids in this vocabulary. Adapters
    live in memory: ``load_adapter`` records the path (nothing is read), and the lifecycle rules of every
    provider apply (duplicate ids, unknown ids, unload waiting for requests, ``max_adapters`` eviction).
    ``stream`` yields the text word by word.

    With ``tools`` it calls them deterministically, so a tool loop can be tested without a model (pydantic-ai's
    ``TestModel`` idea). Each answer makes at most one call, ``call_N`` (``N`` counts the calls in the
    conversation, raised past any id the conversation already uses: ids are unique within it), with arguments
    made from the tool's ``parameters`` as for ``json_schema``; it then has ``text == ""`` and
    ``finish_reason == "tool_calls"``:

    - ``tool_choice`` naming a tool: calls that tool, every time;
    - ``"required"``: calls the first tool not yet called since the last user message (the last tool once all
      were), so a loop that keeps ``"required"`` still moves through its tools;
    - ``"auto"`` (or left out): calls the first tool when the conversation ends with a user message; after tool
      results it answers in text that quotes them (``"[base] alpha bravo; get_weather returned sunny"``);
    - ``"none"``: answers in text.

    Args:
        max_adapters: Most adapters kept "resident" before the least recently used is evicted; else
            ``FAKE_MAX_ADAPTERS``; else no limit.
        prefix_cache_tokens: Most prefix tokens the cache holds before the least recently used are evicted
            (``0``: no cache, every sequence is computed whole); else ``FAKE_PREFIX_CACHE_TOKENS``; else 65536.
        context_length: The longest sequence ``next_token_logprobs`` and ``score`` take, in the fake's byte tokens
            (longer is a ``TokenLimitError``); else ``FAKE_CONTEXT_LENGTH``; else 2048.
        raw_prompt: Send prompts without the chat template unless a request says ``raw_prompt=False`` (the
            provider-level default of the ``raw_prompt`` option); else ``FAKE_RAW_PROMPT``; else off.

    Attributes:
        backend_loads: How many times an adapter was loaded into the (imaginary) backend, evictions'
            reloads included: lets your tests see what the lifecycle did.
        backend_unloads: Likewise for unloads and evictions.

    Example:
        >>> import asyncio
        >>> async def main():
        ...     async with FakeProvider() as fake:
        ...         await fake.load_adapter("a1", "/adapters/a1")
        ...         return (await fake.generate("hi", model="m", adapter_id="a1", max_tokens=3)).text
        >>> asyncio.run(main())
        '[a1] juliet lima golf'
    """

    name = "fake"
    options: ClassVar[OptionMap] = {
        "max_tokens": Sent("words", "the answer has at most max_tokens words"),
        "system_prompt": Sent("digest", "a different system prompt gives a different answer"),
        "temperature": Sent("checked", "checked by its rule; a fake's answer depends only on the prompt, system "
                            "prompt, adapter and seed"),
        "top_p": Sent("checked", "checked by its rule, as temperature"),
        "repetition_penalty": Sent("checked", "checked by its rule, as temperature"),
        "stop": Sent("stop", "the answer is cut at the first stop string"),
        "seed": Sent("digest", "a different seed gives a different answer"),
        "top_k": Sent("checked", "checked by its rule, as temperature"),
        "logprobs": Sent("logprobs", "made-up numbers that depend only on the text and the adapter"),
        "json_schema": Sent("instance", "a small JSON value valid against the schema"),
        "tools": Sent("tool_calls", "deterministic calls with arguments made from each tool's parameters"),
        "tool_choice": Sent("tool_calls", "auto calls a tool after a user turn; required or a named tool always "
                            "does; none never does"),
        "return_token_ids": Sent("token_ids", "the answer's text in the fake's byte vocabulary"),
        "n": Sent("choices", "n answers; with temperature 0 all equal, else each differs (and, as every answer of "
                  "the fake, the same request gives the same ones)"),
        "presence_penalty": Sent("digest", "checked by its rule; a different value gives a different answer"),
        "frequency_penalty": Sent("digest", "checked by its rule; a different value gives a different answer"),
        "min_p": Sent("digest", "checked by its rule; a different value gives a different answer"),
        "logit_bias": Sent("digest", "ids checked against the fake's vocabulary; a different bias gives a different "
                           "answer"),
        "raw_prompt": Sent("digest", "a raw prompt gives a different answer than the same text as a user message"),
        "chat_template": Sent("digest", "a different template gives a different answer"),
        "chat_template_kwargs": Sent("digest", "different variables give a different answer"),
        "thinking": Sent("reasoning", "thinking=True adds made-up reasoning (not in text, not counted in tokens)"),
        "response_format": RESPONSE_FORMAT_AS_JSON_SCHEMA,
        "extra_body": Sent("digest", "a fake has no request body: a different extra_body gives a different answer"),
        "timeout": TIMEOUT_IN_BASE_CLASS,
    }
    supports_adapters = True
    hot_swaps_adapters = True
    batches_mixed_adapters = True
    supports_scoring = True
    supports_tokenize = True
    supports_next_token_logprobs = True
    supports_token_prompts = True

    def __init__(
        self,
        max_adapters: int | None = None,
        *,
        prefix_cache_tokens: int | None = None,
        context_length: int | None = None,
        raw_prompt: bool | None = None,
    ) -> None:
        super().__init__(locals())
        self.max_adapters = self._settings["max_adapters"]
        self._resident: dict[str, str] = {}
        self.backend_loads = 0
        self.backend_unloads = 0
        self._cache = _PrefixCache(self._settings["prefix_cache_tokens"])
        self._context_length: int = self._settings["context_length"]

    def __repr__(self) -> str:
        return f"FakeProvider(resident={sorted(self._resident)})"

    @property
    def resident_adapters(self) -> list[str]:
        """Backend names of the adapters "in memory" now, sorted (a replaced adapter's new weights are ``id@n``)."""
        return sorted(self._resident)

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        await asyncio.sleep(0)  # a real provider yields to the loop too
        return self._answer(request)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        result = self._answer(request)
        pieces = re.findall(r"\s*\S+", result.text)
        rest = result.text[len("".join(pieces)) :]
        if rest:  # blanks a stop string's cut left at the end go with the last piece
            pieces = [*pieces[:-1], (pieces[-1] if pieces else "") + rest]
        for piece in pieces:
            await asyncio.sleep(0)
            yield piece
        yield result

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        adapter_path = source.path
        await asyncio.sleep(0)
        self._resident[adapter_id] = adapter_path
        self.backend_loads += 1

    async def _unload_adapter(self, adapter_id: str) -> None:
        await asyncio.sleep(0)
        self._cache.forget(self._weights(adapter_id))  # its prefixes belong to the weights that are going
        del self._resident[adapter_id]
        self.backend_unloads += 1

    async def _tokenize_text(self, text: str, model: str) -> list[int]:
        return encode(text)

    async def _detokenize_ids(self, request: TokenRequest) -> str:
        return decode(request.token_ids)

    async def _token_vocabulary(self, model: str) -> TokenVocabulary:
        return TokenVocabulary(
            size=VOCABULARY_SIZE,
            token_bytes=TOKEN_BYTES,
            special_ids=frozenset(range(len(SPECIAL_TOKENS))),
            bos_id=BOS_ID,
            eos_ids=(EOS_ID,),
            adds_bos=False,  # as GPT-2 and Qwen: prompts start with their first token
            context_length=self._context_length,
        )

    async def _next_token_logprobs(self, requests: list[TokenRequest]) -> NDArray[np.float32]:
        import numpy as np

        await asyncio.sleep(0)  # a real backend yields to the loop while its forward pass runs
        rows = np.empty((len(requests), VOCABULARY_SIZE), dtype=np.float64)
        for row, request in zip(rows, requests, strict=True):
            for adapter_id, _ in request.adapters:
                if adapter_id not in self._resident:
                    raise AssertionError(f"adapter {adapter_id!r} used while not resident: lifecycle bug")
            row[:] = self._logits(request.token_ids, request.adapters)
        rows -= rows.max(axis=1, keepdims=True)
        rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))
        return rows.astype(np.float32)

    def _cache_stats(self) -> TokenCacheStats:
        return self._cache.stats()

    def _clear_cache(self) -> None:
        self._cache.clear()

    def _logits(self, token_ids: tuple[int, ...], adapters: AdapterScales) -> Any:
        """Made-up logits: the base model's values plus each adapter's delta times its scale, each from the hash chain
        of the sequence under those weights (one chain per weights; the cache holds their states by prefix),
        squashed into (-0.5, 0.5), plus a prior: the fake "writes" ASCII text.

        ``<pad>``, ``<bos>`` and the bytes of multi-byte UTF-8 characters are e^20 times less likely than an ASCII
        byte (the fake writes ASCII: a sampler that proposes bytes one by one never starts a
        character it cannot finish), and ASCII bytes and ``<eos>`` are within a factor e of each other. Both keep
        genlm-control's AWRS sampler, which walks whole distributions in float32, away from the rounding its
        assertions cannot take (see the genlm section of docs/token-level.md).
        """
        import numpy as np

        chains = ("", *(self._weights(adapter_id) for adapter_id, _ in adapters))
        states = self._cache.states(chains, token_ids)
        values = _row(states[0])
        for (_, scale), state in zip(adapters, states[1:], strict=True):
            values += scale * 0.5 * _row(state)
        return 0.5 * np.tanh(values) + _prior()

    def _answer(self, request: GenerationRequest) -> GenerationResult:
        if request.adapter_id is not None and request.adapter_id not in self._resident:
            raise AssertionError(f"adapter {request.adapter_id!r} used while not resident: lifecycle bug")
        return GenerationResult.from_choices([self._choice(request, index) for index in range(request.n)])

    def _choice(self, request: GenerationRequest, index: int) -> GenerationResult:
        """The ``index``-th of the request's ``n`` answers (the first is the answer to ``n=1``)."""
        weights = self._weights(request.adapter_id)
        words = _words_for(request, weights, index)
        label = request.adapter_id.partition("@")[0] if request.adapter_id else "base"  # the id, not its version
        tool = _tool_to_call(request)
        if tool is not None:
            return self._tool_call(request, tool, words)
        results = _tool_results(request.messages) if request.prompt_token_ids is None else ""
        if results and request.json_schema is None:
            words = f"{' '.join(words[:2])}; {results}".split()
        finish_reason = "length" if len(words) > request.max_tokens else "stop"
        words = words[: request.max_tokens]
        text = f"[{label}] " + " ".join(words)
        if request.json_schema is not None:
            text, finish_reason = json.dumps(_instance(request.json_schema, words, request.json_schema)), "stop"
            _check_instance(text, request.json_schema, self.name)
        generated = len(words)
        cuts = [(text.index(stop), len(stop)) for stop in request.stop if stop in text]
        if cuts:  # the words generated until the first stop string was complete, as a real model counts them
            cut, length = min(cuts)
            starts = [match.start() for match in re.finditer(r"\S+", text)][1:]  # the words after the label
            generated = sum(1 for start in starts if start < cut + length)
            text, finish_reason = text[:cut], "stop"
        ids = request.prompt_token_ids
        if ids is not None:
            prompt_tokens = len(ids)
        else:
            prompt_tokens = sum(len(message["content"].split()) for message in request.messages)
        return GenerationResult(
            text=text,
            model=request.model or "fake",
            adapter_id=request.adapter_id,
            token_count=prompt_tokens + generated,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=generated,
            logprobs=None if request.logprobs is None else _logprobs(text, request, weights),
            reasoning=_reasoning(request, weights, index),
            token_ids=tuple(encode(text)) if request.return_token_ids else None,
        )

    def _tool_call(self, request: GenerationRequest, tool: Mapping[str, Any], words: list[str]) -> GenerationResult:
        """The answer that calls ``tool``, with arguments made from its parameters' schema."""
        parameters = tool["function"]["parameters"]
        arguments = json.dumps(_instance(parameters, words, parameters))
        _check_instance(arguments, parameters, self.name)
        taken = [str(call.get("id")) for message in request.messages for call in message.get("tool_calls", ())]
        number = len(taken) + 1
        while f"call_{number}" in taken:  # an id from elsewhere (another backend's turn, a fixture) is not reused
            number += 1
        call = parse_tool_call(f"call_{number}", tool["function"]["name"], arguments, request.tools)
        prompt_tokens = sum(len(message["content"].split()) for message in request.messages)
        completion_tokens = len(arguments.split()) + 1
        return GenerationResult(
            text="",
            model=request.model or "fake",
            adapter_id=request.adapter_id,
            token_count=prompt_tokens + completion_tokens,
            finish_reason="tool_calls",
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            logprobs=None if request.logprobs is None else (),
            tool_calls=(call,),
        )

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        await asyncio.sleep(0)
        length = len(encode(request.context + request.continuation))  # its byte tokens, as a real model's window
        if length > self._context_length:
            raise too_long(length, self._context_length, provider=self.name, setting="context_length")
        return self._score_words(request, request.context)

    async def _score_rolling(self, request: ScoreRequest) -> ScoreResult:
        await asyncio.sleep(0)
        return self._score_words(request, "")

    def _weights(self, backend_name: str | None) -> str:
        """What stands for an adapter's weights: its id and the path it was loaded from (``""``: the base model).

        An adapter replaced with another path answers differently; one loaded again from the same path, under
        the same id, answers as before.
        """
        if backend_name is None:
            return ""
        return f"{backend_name.partition('@')[0]}:{self._resident[backend_name]}"

    def _score_words(self, request: ScoreRequest, context: str) -> ScoreResult:
        if request.adapter_id is not None and request.adapter_id not in self._resident:
            raise AssertionError(f"adapter {request.adapter_id!r} used while not resident: lifecycle bug")
        words = request.continuation.split() or [request.continuation]
        adapter = self._weights(request.adapter_id)
        logprobs = [_word_logprob(context, adapter, str(index), word) for index, word in enumerate(words)]
        return ScoreResult(
            logprob=sum(logprobs),
            num_tokens=len(words),
            is_greedy=all(value > -1.0 for value in logprobs),
            model=request.model or "fake",
            adapter_id=request.adapter_id,
        )


def _logprobs(text: str, request: GenerationRequest, weights: str) -> tuple[TokenLogprob, ...]:
    """One entry per word of ``text``: its log-probability, and ``logprobs`` alternatives, each less likely."""
    entries = []
    for index, piece in enumerate(re.findall(r"\s*\S+", text)):
        value = _word_logprob(weights, str(index), piece) / 4
        alternatives = [(piece, value)]
        for rank, word in enumerate(_WORDS):
            if len(alternatives) >= (request.logprobs or 0):
                break
            if f" {word}" != piece:
                alternatives.append((f" {word}", value - 1.0 - rank))
        entries.append(TokenLogprob(piece, value, tuple(alternatives[: request.logprobs])))
    return tuple(entries)

def _words_for(request: GenerationRequest, weights: str, choice: int = 0) -> list[str]:
    """Between 8 and 23 words chosen by a hash of what the request asks.

    A message list hashes as its system messages' and its other messages' contents, so ``[system S, user U]``
    answers as ``U`` with ``system_prompt=S``. The options that change a real model's answer are hashed too
    where they are set (:func:`_folded`), and so is the choice (but the first) unless decoding is greedy.
    """
    folded = _folded(request, choice)
    seed = str(_choice_seed(request, choice))
    if request.prompt_token_ids is not None:  # the model's own input: hashed as ids, never equal to any text
        digest = _digest("\x01ids", " ".join(map(str, request.prompt_token_ids)), weights, seed, *folded)
        return [_WORDS[byte % len(_WORDS)] for byte in digest[1 : 9 + digest[0] % 16]]
    messages = request.messages
    system = "\n\n".join(message["content"] for message in messages if message["role"] == "system")
    turns = "\n\n".join(message["content"] for message in messages if message["role"] != "system")
    digest = _digest(turns, system, weights, seed, *folded)
    return [_WORDS[byte % len(_WORDS)] for byte in digest[1 : 9 + digest[0] % 16]]


_FOLDED = (
    "presence_penalty", "frequency_penalty", "min_p", "logit_bias", "chat_template", "chat_template_kwargs",
    "extra_body",
)
"""The options the fake's answer depends on where they are set (besides the prompt, system prompt and seed)."""


def _folded(request: GenerationRequest, choice: int) -> tuple[str, ...]:
    """What of the request besides its prompt, system prompt, adapter and seed makes a different answer: nothing
    (the answers the fake always gave) unless one of these options is set, or this is a second choice or later
    of a request that samples."""
    parts = [
        f"{name}={json.dumps(getattr(request, name), sort_keys=True)}"
        for name in _FOLDED
        if getattr(request, name) is not None
    ]
    if request.raw_prompt:
        parts.append("raw_prompt")
    if choice and not request.is_greedy and request.seed is None:
        parts.append(f"choice={choice}")
    return tuple(parts)


def _choice_seed(request: GenerationRequest, choice: int) -> int | None:
    """The seed of choice ``choice`` of a request that samples: ``seed + choice``, as every backend seeds it (so the
    choices are those of ``n`` requests with those seeds)."""
    if request.seed is None or request.is_greedy:
        return request.seed
    return request.seed + choice


def _reasoning(request: GenerationRequest, weights: str, choice: int) -> str | None:
    """Made-up reasoning when ``thinking`` is on: a few words from their own hash, never in the answer."""
    if not request.thinking:
        return None
    digest = _digest(
        "\x02thinking", request.prompt_text, weights, str(_choice_seed(request, choice)), *_folded(request, choice)
    )
    return "Thinking: " + " ".join(_WORDS[byte % len(_WORDS)] for byte in digest[1 : 4 + digest[0] % 4])


def _tool_to_call(request: GenerationRequest) -> Mapping[str, Any] | None:
    """The tool the fake calls, or ``None`` for a text answer (the rule is in the class docstring)."""
    tools, choice = request.tools, request.tool_choice
    if not tools or choice == "none":
        return None
    if isinstance(choice, Mapping):
        return next(tool for tool in tools if tool["function"]["name"] == choice["function"]["name"])
    messages = request.messages
    if choice != "required" and messages[-1]["role"] != "user":
        return None
    last_user = max((index for index, message in enumerate(messages) if message["role"] == "user"), default=-1)
    called = {
        call["function"]["name"] for message in messages[last_user + 1 :] for call in message.get("tool_calls", ())
    }
    return next((tool for tool in tools if tool["function"]["name"] not in called), tools[-1])


def _tool_results(messages: list[Message]) -> str:
    """What the tool messages since the last assistant turn said: ``"NAME returned CONTENT; ..."``."""
    names = {call["id"]: call["function"]["name"] for message in messages for call in message.get("tool_calls", ())}
    results: list[str] = []
    for message in reversed(messages):
        if message["role"] != "tool":
            break
        results.insert(0, f"{names.get(message.get('tool_call_id', ''), 'tool')} returned {message['content']}")
    return "; ".join(results)


def _instance(schema: Any, words: list[str], root: Mapping[str, Any], depth: int = 0) -> Any:
    """A small JSON value for ``schema``, its strings taken from ``words`` (the keywords a typical tool or
    pydantic schema uses: type, properties, required, items, enum, const, anyOf/oneOf, $ref, minimum, minItems)."""
    if not isinstance(schema, Mapping) or depth > 8:
        return None
    ref = str(schema.get("$ref", ""))
    if ref == "#" or ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/") if ref != "#" else ():
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part, {}) if isinstance(target, Mapping) else {}
        return _instance(target, words, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][len(words) % len(schema["enum"])]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _instance(schema[key][0], words, root, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    kind = next((k for k in kind if k != "null"), "null") if isinstance(kind, list) else kind
    word = words[depth % len(words)] if words else "fake"
    if kind == "object":
        properties, required = schema.get("properties", {}), schema.get("required", ())
        return {  # optional properties near the top only: a recursive schema ends
            name: _instance(sub, words[1:] + words[:1], root, depth + 1)
            for name, sub in properties.items()
            if name in required or depth < 3
        }
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 0) if "maxItems" not in schema else min(1, schema["maxItems"])
        return [_instance(schema.get("items", {}), words, root, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        low, high = schema.get("minimum", 0), schema.get("maximum", 100)
        return low + len(word) % (int(high - low) + 1) if high >= low else low
    if kind == "boolean":
        return len(word) % 2 == 0
    if kind == "null":
        return None
    return word


def _check_instance(text: str, schema: Mapping[str, Any], provider: str) -> None:
    """Refuse, with a sentence, a schema the fake's small generator could not satisfy (a ``pattern``, a
    ``format``...): it never returns JSON that does not validate."""
    from inference._core.json_schemas import validator

    error = next(iter(validator(schema).iter_errors(json.loads(text))), None)  # never fetches a remote $ref
    if error is not None:
        raise InvalidRequestError(
            f"the fake provider cannot produce JSON for this schema ({error.message}); it knows type, "
            "properties, items, enum, const, anyOf and minimum/maximum: use a real provider for the rest",
            provider=provider,
        )


def _digest(*parts: str) -> bytes:
    key = "\x00".join(parts)
    return hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).digest()  # never a UnicodeEncodeError


def _word_logprob(*parts: str) -> float:
    """A log-probability in (-8, 0) that depends only on ``parts``."""
    return -8.0 * (int.from_bytes(_digest(*parts)[:4], "big") / 2**32)


# Token level ---------------------------------------------------------------------------------------------

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
"""The fake's special tokens, ids 0, 1 and 2; byte ``b`` is id ``3 + b``."""
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
_BYTE_OFFSET = len(SPECIAL_TOKENS)
VOCABULARY_SIZE = _BYTE_OFFSET + 256
TOKEN_BYTES: tuple[bytes, ...] = (
    *(token.encode() for token in SPECIAL_TOKENS),
    *(bytes([value]) for value in range(256)),
)
_SPECIAL_PATTERN = re.compile("|".join(re.escape(token) for token in SPECIAL_TOKENS))


def encode(text: str) -> list[int]:
    """The fake's token ids of ``text``: special-token text is that token, everything else one id per UTF-8 byte."""
    ids: list[int] = []
    start = 0
    for match in _SPECIAL_PATTERN.finditer(text):
        ids += [_BYTE_OFFSET + value for value in text[start : match.start()].encode("utf-8")]
        ids.append(SPECIAL_TOKENS.index(match.group()))
        start = match.end()
    ids += [_BYTE_OFFSET + value for value in text[start:].encode("utf-8")]
    return ids


def decode(token_ids: Sequence[int]) -> str:
    """The text of the fake's ids: special tokens written out, bytes decoded as UTF-8 (broken ones as U+FFFD)."""
    return b"".join(TOKEN_BYTES[token] for token in token_ids).decode("utf-8", errors="replace")


@functools.cache
def _prior() -> Any:
    """The fake's prior over its vocabulary (logits added to every distribution)."""
    import numpy as np

    prior = np.zeros(VOCABULARY_SIZE)
    prior[PAD_ID] = prior[BOS_ID] = -20.0  # finite, as a real model's: nothing downstream meets an infinity
    prior[_BYTE_OFFSET + 0x80 :] = -20.0  # bytes of multi-byte characters
    prior.flags.writeable = False
    return prior


def _row(state: bytes) -> Any:
    """Made-up values for one hash-chain state: standard normal, one per vocabulary entry."""
    import numpy as np

    return np.random.default_rng(int.from_bytes(state, "little")).standard_normal(VOCABULARY_SIZE)


def _step(state: bytes, token: int) -> bytes:
    return hashlib.blake2b(state + token.to_bytes(4, "little"), digest_size=16).digest()


class _Node:
    """One cached prefix: the hash-chain state of each of its weights after its last token."""

    __slots__ = ("children", "parent", "states", "token")

    def __init__(self, parent: _Node | None, token: int, states: tuple[bytes, ...]) -> None:
        self.parent = parent
        self.token = token
        self.states = states
        self.children: dict[int, _Node] = {}


class _PrefixCache:
    """The fake's prefix cache: one trie of hash-chain states per combination of weights, LRU-bounded in tokens.

    A node's ancestors are always used more recently than it (a walk touches the path from its end back to the
    root), so the least recently used node is a leaf, and evicting it never orphans a cached descendant.
    """

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()  # the sync facade's loop and yours may both call the fake
        self._roots: dict[tuple[str, ...], _Node] = {}
        self._recent: OrderedDict[_Node, None] = OrderedDict()
        self._counts = dict.fromkeys(("hits", "misses", "reused_tokens", "computed_tokens", "evictions"), 0)

    @property
    def enabled(self) -> bool:
        return self.capacity != 0

    def states(self, chains: tuple[str, ...], token_ids: tuple[int, ...]) -> tuple[bytes, ...]:
        """Each chain's state after ``token_ids``, from the longest cached prefix on."""
        with self._lock:
            return self._states(chains, token_ids)

    def _states(self, chains: tuple[str, ...], token_ids: tuple[int, ...]) -> tuple[bytes, ...]:
        root = self._roots.get(chains)
        if root is None:
            root = _Node(None, -1, tuple(hashlib.blake2b(chain.encode(), digest_size=16).digest() for chain in chains))
            if self.enabled:
                self._roots[chains] = root
        node, reused = root, 0
        path: list[_Node] = []
        while reused < len(token_ids) and self.enabled:
            child = node.children.get(token_ids[reused])
            if child is None:
                break
            node, reused = child, reused + 1
            path.append(node)
        states = node.states
        for token in token_ids[reused:]:
            states = tuple(_step(state, token) for state in states)
            if self.enabled:
                node = node.children.setdefault(token, _Node(node, token, states))
                path.append(node)
        counts = self._counts
        counts["hits" if reused else "misses"] += 1
        counts["reused_tokens"] += reused
        counts["computed_tokens"] += len(token_ids) - reused
        for cached in reversed(path):
            self._recent[cached] = None
            self._recent.move_to_end(cached)
        self._evict()
        return states

    def _evict(self) -> None:
        while self.capacity is not None and len(self._recent) > self.capacity:
            node, _ = self._recent.popitem(last=False)
            if node.parent is not None:
                node.parent.children.pop(node.token, None)
            self._counts["evictions"] += 1

    def forget(self, chain: str) -> None:
        """Drop every trie that uses ``chain``'s weights (an adapter unloaded or replaced)."""
        with self._lock:
            for chains in [chains for chains in self._roots if chain in chains]:
                self._drop(self._roots.pop(chains))

    def clear(self) -> None:
        with self._lock:
            for root in self._roots.values():
                self._drop(root)
            self._roots.clear()

    def _drop(self, root: _Node) -> None:
        pending = list(root.children.values())
        while pending:
            node = pending.pop()
            self._recent.pop(node, None)
            pending += node.children.values()

    def stats(self) -> TokenCacheStats:
        with self._lock:
            return self._stats()

    def _stats(self) -> TokenCacheStats:
        return TokenCacheStats(
            enabled=self.enabled,
            cached_tokens=len(self._recent),
            capacity_tokens=self.capacity if self.enabled else 0,
            **self._counts,
        )
