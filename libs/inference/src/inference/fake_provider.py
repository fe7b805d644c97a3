"""A deterministic provider with no dependencies, for users' own tests of agent loops."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

from inference._core.validation import GenerationRequest, ScoreRequest
from inference.adapters.source import AdapterSource
from inference.exceptions import InvalidRequestError
from inference.messages import Message
from inference.options import OptionMap, Sent
from inference.provider import InferenceProvider
from inference.results import GenerationResult, ScoreResult, StreamEvent, TokenLogprob
from inference.tools import parse_tool_call

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
    id and path). Adapters
    live in memory: ``load_adapter`` records the path (nothing is read), and the lifecycle rules of every
    provider apply (duplicate ids, unknown ids, unload waiting for requests, ``max_adapters`` eviction).
    ``stream`` yields the text word by word.

    With ``tools`` it calls them deterministically, so a tool loop can be tested without a model (pydantic-ai's
    ``TestModel`` idea). Each answer makes at most one call, ``call_N`` (``N`` counts the calls in the
    conversation), with arguments made from the tool's ``parameters`` as for ``json_schema``; it then has
    ``text == ""`` and ``finish_reason == "tool_calls"``:

    - ``tool_choice`` naming a tool: calls that tool, every time;
    - ``"required"``: calls the first tool not yet called since the last user message (the last tool once all
      were), so a loop that keeps ``"required"`` still moves through its tools;
    - ``"auto"`` (or left out): calls the first tool when the conversation ends with a user message; after tool
      results it answers in text that quotes them (``"[base] alpha bravo; get_weather returned sunny"``);
    - ``"none"``: answers in text.

    Args:
        max_adapters: Most adapters kept "resident" before the least recently used is evicted; else
            ``FAKE_MAX_ADAPTERS``; else no limit.

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
        '[a1] xray victor juliet'
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
    }
    supports_adapters = True
    hot_swaps_adapters = True
    batches_mixed_adapters = True
    supports_scoring = True

    def __init__(self, max_adapters: int | None = None) -> None:
        super().__init__(locals())
        self.max_adapters = self._settings["max_adapters"]
        self._resident: dict[str, str] = {}
        self.backend_loads = 0
        self.backend_unloads = 0

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
        for piece in re.findall(r"\s*\S+", result.text):
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
        del self._resident[adapter_id]
        self.backend_unloads += 1

    def _answer(self, request: GenerationRequest) -> GenerationResult:
        if request.adapter_id is not None and request.adapter_id not in self._resident:
            raise AssertionError(f"adapter {request.adapter_id!r} used while not resident: lifecycle bug")
        weights = self._weights(request.adapter_id)
        words = _words_for(request, weights)
        label = request.adapter_id.partition("@")[0] if request.adapter_id else "base"  # the id, not its version
        tool = _tool_to_call(request)
        if tool is not None:
            return self._tool_call(request, tool, words)
        results = _tool_results(request.messages)
        if results and request.json_schema is None:
            words = f"{' '.join(words[:2])}; {results}".split()
        finish_reason = "length" if len(words) > request.max_tokens else "stop"
        words = words[: request.max_tokens]
        text = f"[{label}] " + " ".join(words)
        if request.json_schema is not None:
            text, finish_reason = json.dumps(_instance(request.json_schema, words, request.json_schema)), "stop"
            _check_instance(text, request.json_schema, self.name)
        for stop in request.stop:
            if stop in text:
                text, finish_reason = text[: text.index(stop)], "stop"
        prompt_tokens = sum(len(message["content"].split()) for message in request.messages)
        return GenerationResult(
            text=text,
            model=request.model or "fake",
            adapter_id=request.adapter_id,
            token_count=prompt_tokens + len(words),
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(words),
            logprobs=None if request.logprobs is None else _logprobs(text, request, weights),
        )

    def _tool_call(self, request: GenerationRequest, tool: Mapping[str, Any], words: list[str]) -> GenerationResult:
        """The answer that calls ``tool``, with arguments made from its parameters' schema."""
        parameters = tool["function"]["parameters"]
        arguments = json.dumps(_instance(parameters, words, parameters))
        _check_instance(arguments, parameters, self.name)
        made = sum(len(message.get("tool_calls", ())) for message in request.messages)
        call = parse_tool_call(f"call_{made + 1}", tool["function"]["name"], arguments, request.tools)
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

def _words_for(request: GenerationRequest, weights: str) -> list[str]:
    """Between 8 and 23 words chosen by a hash of what the request asks.

    A message list hashes as its system messages' and its other messages' contents, so ``[system S, user U]``
    answers as ``U`` with ``system_prompt=S``.
    """
    messages = request.messages
    system = "\n\n".join(message["content"] for message in messages if message["role"] == "system")
    turns = "\n\n".join(message["content"] for message in messages if message["role"] != "system")
    digest = _digest(turns, system, weights, str(request.seed))
    return [_WORDS[byte % len(_WORDS)] for byte in digest[1 : 9 + digest[0] % 16]]


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
