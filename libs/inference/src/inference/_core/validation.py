"""Checks on what users pass in, shared by every provider, so each bad input gets one clear typed error.

The rules of the generation options live with the options (:mod:`inference.options`); this module adds the
request's own fields (prompt, model, adapter id) and the adapter id rule the lifecycle uses too.
"""

from __future__ import annotations

import math
import numbers
import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from inference.exceptions import InvalidRequestError, TokenLimitError
from inference.messages import Message, check_messages, plain_text
from inference.options import Fail, GenerationOptions, require_utf8, spec_field
from inference.tokens import TokenIds, TokenVocabulary

_RequestT = TypeVar("_RequestT", bound="GenerationRequest")

ADAPTER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""Adapter ids: letters, digits, ``.``, ``_`` and ``-``; no path separators, spaces or shell characters."""

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: a scale or an alpha above it becomes infinity in the backends (float32 or narrower)."""


def listed(items: Iterable[object], *, limit: int = 5) -> str:
    """Items for an error message: the first ``limit``, then how many more (a refusal never lists 200,000 names)."""
    shown: list[str] = []
    more = 0
    for item in items:
        if len(shown) < limit:
            text = item if isinstance(item, str) else repr(item)
            shown.append(text if len(text) <= 100 else text[:97] + "...")
        else:
            more += 1
    return ", ".join(shown) + (f" and {more} more" if more else "")


def is_real_number(value: object) -> bool:
    """A real number that is not a bool: ``int``, ``float``, numpy's scalars (``np.float32(0.5)``), ``Fraction``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def validate_adapter_id(adapter_id: object, *, provider: str) -> str:
    """Return ``adapter_id`` if it is a safe adapter name, else raise :class:`InvalidRequestError`."""
    return _adapter_id(adapter_id, "adapter_id", lambda message: InvalidRequestError(message, provider=provider))


def _adapter_id(value: object, name: str, fail: Fail) -> str:
    if not isinstance(value, str) or not ADAPTER_ID_PATTERN.fullmatch(value):
        raise fail(
            f"adapter id {value!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no path separators, spaces or shell characters)"
        )
    return value


def _adapter_id_or_none(value: object, name: str, fail: Fail) -> str | None:
    return None if value is None else _adapter_id(value, name, fail)


AdapterChoice = str | tuple[str, float] | Sequence[tuple[str, float]] | None
"""What ``adapter_id`` takes in ``generate``, ``stream`` and ``generate_batch``: a loaded adapter's id, ``None`` for
the base model, an ``(id, scale)`` pair, or a list of such pairs (several adapters at once, each with its scale)."""

AdapterScales = tuple[tuple[str, float], ...]
"""Adapters applied together, each with its scale (the delta of each is multiplied by its scale and added)."""


def split_adapter_choice(value: object, *, provider: str) -> tuple[str | None, AdapterScales]:
    """Split an :data:`AdapterChoice` into ``(adapter_id, scales)``: one of them is empty.

    A plain id (or one pair with scale 1) is ``(id, ())``, the base model ``(None, ())``; anything else
    ``(None, pairs)``, with each id checked, each scale a finite real number (numpy scalars too) that float32
    can hold, and no id twice.

    Raises:
        InvalidRequestError: The value is not one of these shapes, or an id or a scale is invalid.
    """

    def fail(message: str) -> InvalidRequestError:
        return InvalidRequestError(message, provider=provider)

    if value is None or isinstance(value, str):
        return _adapter_id_or_none(value, "adapter_id", fail), ()
    if _is_pair(value):
        pairs: list[object] = [value]
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        pairs = list(value)
    else:
        raise fail(_CHOICE_RULE + f", got {type(value).__name__}")
    scales = _adapter_scales(tuple(pairs), "adapter_id", fail)
    if not scales:
        raise fail("adapter_id is an empty list: give at least one (id, scale) pair, or None for the base model")
    if len(scales) == 1 and scales[0][1] == 1.0:
        return scales[0][0], ()
    return None, scales


_CHOICE_RULE = "adapter_id must be an adapter id, None, an (id, scale) pair or a list of (id, scale) pairs"


def _is_pair(value: object) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and is_real_number(value[1])
    )


def _adapter_scales(value: object, name: str, fail: Fail) -> AdapterScales:
    """Checked ``(id, scale)`` pairs: valid ids, finite scales that float32 can hold (as floats), no id twice."""
    if not isinstance(value, tuple):
        raise fail(f"{name} scales must be a tuple of (id, scale) pairs, got {type(value).__name__}")
    checked: list[tuple[str, float]] = []
    for item in value:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise fail(f"{_CHOICE_RULE}; {item!r} is not an (id, scale) pair")
        adapter_id, scale = item
        _adapter_id(adapter_id, name, fail)
        if not is_real_number(scale) or not math.isfinite(scale) or abs(scale) > FLOAT32_MAX:
            raise fail(
                f"the scale of adapter {adapter_id!r} must be a finite number that float32 can hold "
                f"(at most {FLOAT32_MAX:.4g} in size), got {scale!r}"
            )
        checked.append((adapter_id, float(scale)))
    ids = [adapter_id for adapter_id, _ in checked]
    repeated = sorted({adapter_id for adapter_id in ids if ids.count(adapter_id) > 1})
    if repeated:
        raise fail(f"adapter {repeated[0]!r} appears twice in adapter_id: give each adapter once, with one scale")
    return tuple(checked)


def adapters_label(scales: AdapterScales) -> str:
    """How a result names the adapters it was generated with: ``"math*1.0+style*0.5"``."""
    return "+".join(f"{adapter_id}*{scale:g}" for adapter_id, scale in scales)


def _text(value: object, name: str, fail: Fail) -> str:
    if not isinstance(value, str):
        raise fail(f"{name} must be a string, got {type(value).__name__}")
    require_utf8(value, name, fail)
    return value


def _prompt(value: object, name: str, fail: Fail) -> str | tuple[Message, ...] | TokenIds:
    """A string, a list of chat messages (checked, as a tuple of fresh dicts), or :class:`TokenIds` (checked)."""
    if isinstance(value, str):
        return _text(value, name, fail)
    if isinstance(value, TokenIds):
        return TokenIds(token_id_list(value.ids, f"{name}.ids", fail))
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return check_messages(value, name, fail)
    raise fail(f"{name} must be a string or a list of messages ({{'role': ..., 'content': ...}}), or the model's "
               f"token ids as TokenIds, got {type(value).__name__}")


def token_id_list(value: object, name: str, fail: Fail, *, allow_empty: bool = False) -> tuple[int, ...]:
    """Token ids as a tuple of ``int``: from a list, a tuple, a ``numpy`` array, anything iterable of integers.

    Raises:
        InvalidRequestError: (from ``fail``) ``value`` is text or not iterable (a 0-d ``numpy`` array is one id, not
            a list of them), an entry is no integer (a bool, a float) or is negative, or there are no ids (unless
            ``allow_empty``).
    """
    not_a_list = fail(f"{name} must be a list of token ids (integers), got {type(value).__name__}: "
                      "turn text into ids with provider.tokenize(text, model)")
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not hasattr(value, "__iter__"):
        raise not_a_list
    try:
        items = list(value)
    except TypeError:
        raise not_a_list from None  # iter() refused it after all (a 0-d numpy array)
    if all(type(item) is int for item in items):  # the common case, fast
        ids = tuple(items)
    else:
        checked = []
        for index, item in enumerate(items):
            if isinstance(item, bool):
                raise fail(f"{name}[{index}] is {item!r}: token ids are integers")
            try:
                checked.append(operator.index(item))
            except TypeError:
                raise fail(f"{name}[{index}] is {type(item).__name__} {item!r}, not an integer token id") from None
        ids = tuple(checked)
    if not ids and not allow_empty:
        raise fail(
            f"{name} is empty: give at least one token. To condition on nothing, start with the model's BOS token "
            "(provider.token_vocabulary(model).bos_id), as genlm-backend also requires"
        )
    if ids and min(ids) < 0:
        index = next(index for index, token in enumerate(ids) if token < 0)
        raise fail(f"{name}[{index}] is {ids[index]}: token ids are 0 or more")
    return ids


def check_token_limits(
    token_ids: Sequence[int],
    vocabulary: TokenVocabulary,
    *,
    provider: str,
    name: str = "token_ids",
    max_length: int | None = None,
) -> None:
    """Refuse ids the model cannot read, with a :class:`~inference.exceptions.TokenLimitError` naming the limit.

    The one check of every token-level call (the base class runs it with the backend's
    :class:`~inference.tokens.TokenVocabulary`, before the backend is called); a backend that learns a limit
    only later (a server's answer) raises the same error with the same sentence through it.

    Args:
        token_ids: Checked ids (:func:`token_id_list`).
        vocabulary: The model's vocabulary and context.
        provider: The provider's name, for the error.
        name: What the ids are called in the message (``"token_ids"``, ``"token_ids_list[3]"``).
        max_length: The most ids allowed (default: the context length).

    Raises:
        TokenLimitError: The sequence is longer than ``max_length``, or an id is not below ``vocabulary.size``.
    """
    context = vocabulary.context_length
    limit = context if max_length is None else max_length
    if len(token_ids) > limit:
        most = (f"the model's context of {limit} tokens" if limit >= context else
                f"the {limit} tokens the model's context of {context} takes with a token to generate")
        raise TokenLimitError(
            f"{name} is {len(token_ids)} tokens, more than {most}: shorten it (keep its last tokens), or use a "
            "model (or a context setting such as n_ctx) with a longer context",
            limit=limit, value=len(token_ids), kind="context", provider=provider,
        )
    if token_ids and max(token_ids) >= vocabulary.size:
        index = next(index for index, token in enumerate(token_ids) if token >= vocabulary.size)
        raise TokenLimitError(
            f"{name}[{index}] is {token_ids[index]}, outside the model's vocabulary of {vocabulary.size} ids "
            f"(0 to {vocabulary.size - 1}): use ids from this model's tokenizer (provider.tokenize)",
            limit=vocabulary.size, value=token_ids[index], kind="vocabulary", provider=provider,
        )


def checked_text(value: object, name: str, *, provider: str) -> str:
    """``value`` if it is a string UTF-8 can encode, else an :class:`InvalidRequestError` naming ``name``."""
    return _text(value, name, lambda message: InvalidRequestError(message, provider=provider))


def checked_model(value: object, *, provider: str) -> str:
    """The model argument: a string (``None`` is ``""``), else an :class:`InvalidRequestError`."""
    return _model_name(value, "model", lambda message: InvalidRequestError(message, provider=provider))


def _non_empty_text(value: object, name: str, fail: Fail) -> str:
    text = _text(value, name, fail)
    if not text:
        raise fail(f"{name} is empty: there is nothing to score; give at least one character")
    return text


_TEMPLATE_OPTIONS = ("chat_template", "chat_template_kwargs", "thinking")
"""The options that act through the chat template: nothing renders a raw prompt or token ids."""


def _check_raw_prompt(request: GenerationOptions, provider: str) -> None:
    """Refuse what a raw prompt cannot carry: it is the prompt string, sent as it is, with no chat template."""
    prompt = getattr(request, "prompt", None)
    if isinstance(prompt, tuple):
        problem = "a list of messages, which only a chat template can render: send one string"
    elif request.system_prompt is not None:
        problem = "system_prompt, which only a chat template can place: write it into the prompt string"
    elif request.tools:
        problem = "tools, which the chat template renders: leave raw_prompt off"
    else:
        templated = [name for name in _TEMPLATE_OPTIONS if getattr(request, name) is not None]
        if not templated:
            return
        problem = f"{templated[0]}, which acts through the chat template that a raw prompt skips"
    raise InvalidRequestError(
        f"raw_prompt (given, or the provider's raw_prompt setting) sends the prompt string without a chat template, "
        f"so it cannot be combined with {problem}; or pass raw_prompt=False",
        provider=provider,
    )


def _model_name(value: object, name: str, fail: Fail) -> str:
    """The model name; ``None`` is ``""`` (in-process providers use their loaded model)."""
    return "" if value is None else _text(value, name, fail)


@dataclass(frozen=True)
class GenerationRequest(GenerationOptions):
    """One validated generation request, as every provider receives it.

    It holds the prompt, the model and the adapter, plus every :class:`~inference.options.GenerationOptions`
    field (``request.temperature``, ``request.stop``, ``request.is_greedy``...). Build it with
    :meth:`~inference.options.GenerationOptions.from_arguments`, which checks each argument and raises
    :class:`InvalidRequestError` with a sentence naming the argument and the allowed range.
    """

    prompt: str | tuple[Message, ...] | TokenIds = spec_field(  # noqa: RUF009 - the spec, not a shared default
        check=_prompt, help="the user's text, chat messages, or the model's token ids"
    )
    model: str = spec_field(check=_model_name, help="the base model name (servers) or a label")
    adapter_id: str | None = spec_field(None, check=_adapter_id_or_none, help="a loaded adapter, or None")
    adapter_scales: tuple[tuple[str, float], ...] = spec_field(
        (), check=_adapter_scales, help="adapters applied together with their scales (then adapter_id is None)"
    )
    answer_prefix: str = spec_field(
        "", check=_text, help="text the answer starts with, written after the rendered prompt: set by the SDK (a "
        "forced tool call's opening marker in process, see inference._core.tool_formats), never by a caller",
    )

    @classmethod
    def from_arguments(cls: type[_RequestT], *, provider: str, **values: object) -> _RequestT:
        """Check every field (see :meth:`GenerationOptions.from_arguments`) and how the prompt and the system
        prompt go together.

        With a ``json_schema``, the request has no ``stop`` strings: the output ends where the schema's JSON is
        complete, and a stop string could only cut the JSON short (servers such as vLLM and llama-server would
        cut it and call it finished). No backend receives them, so the text parses on every provider.

        Raises:
            InvalidRequestError: A field is invalid, or ``system_prompt`` is given with a message list.
        """
        request = super().from_arguments(provider=provider, **values)
        if isinstance(request.prompt, TokenIds) and request.system_prompt is not None:
            raise InvalidRequestError(
                "system_prompt cannot be combined with a TokenIds prompt: the ids are the model's whole input; "
                "put the system prompt's tokens in them (tokenize the rendered chat)",
                provider=provider,
            )
        if isinstance(request.prompt, TokenIds) and request.tools:
            raise InvalidRequestError(
                "tools cannot be combined with a TokenIds prompt: the model's chat template renders the tools; send "
                "the conversation as messages",
                provider=provider,
            )
        if isinstance(request.prompt, tuple) and request.system_prompt is not None:
            raise InvalidRequestError(
                "system_prompt cannot be combined with a list of messages: put the system prompt in the list as "
                "its first message, {'role': 'system', 'content': ...}",
                provider=provider,
            )
        if request.raw_prompt:
            _check_raw_prompt(request, provider)
        if isinstance(request.prompt, TokenIds):
            templated = [name for name in _TEMPLATE_OPTIONS if getattr(request, name) is not None]
            if templated:
                raise InvalidRequestError(
                    f"{templated[0]} cannot be combined with a TokenIds prompt: the ids are the model's whole input, "
                    "no chat template renders them",
                    provider=provider,
                )
        if request.json_schema is not None and request.stop:
            request = replace(request, stop=())
        return request

    def under(self, adapter_id: str | None, adapter_scales: AdapterScales = ()) -> GenerationRequest:
        """This request for adapters under their backend names, as a held request has them (``math@2`` once
        replaced, which is no id a caller may give): how the SDK's own requests (a score, a next-token row) carry
        the adapters of the call they serve."""
        return replace(self, adapter_id=adapter_id, adapter_scales=tuple(adapter_scales))

    @property
    def messages(self) -> list[Message]:
        """The request as chat messages, the one rule every backend uses: the message list as given, or a system
        message when ``system_prompt`` is not ``None`` (an empty one too: it stands in for a chat template's default
        system prompt) and then the prompt as a user message."""
        if isinstance(self.prompt, TokenIds):
            raise TypeError("a TokenIds prompt has no messages: a backend with supports_token_prompts reads "
                            "request.prompt_token_ids")
        if isinstance(self.prompt, tuple):
            return [dict(message) for message in self.prompt]  # type: ignore[misc]
        messages: list[Message] = []
        if self.system_prompt is not None:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": self.prompt})
        return messages

    @property
    def adapters(self) -> AdapterScales:
        """The adapters this request applies with their scales: ``()`` for the base model, ``((id, 1.0),)`` for
        a plain ``adapter_id``, else :attr:`adapter_scales`. Requests with equal values run the same weights."""
        if self.adapter_id is not None:
            return ((self.adapter_id, 1.0),)
        return self.adapter_scales

    @property
    def prompt_token_ids(self) -> tuple[int, ...] | None:
        """The prompt's token ids when it is :class:`~inference.tokens.TokenIds` (the model's whole input), else
        ``None``."""
        return self.prompt.ids if isinstance(self.prompt, TokenIds) else None

    @property
    def plain_prompt(self) -> str:
        """The request as text for a model without a chat template (:func:`inference.messages.plain_text`)."""
        return plain_text(self.messages)

    @property
    def prompt_text(self) -> str:
        """The prompt as one string, for counting or hashing: the text, or every message's content."""
        if isinstance(self.prompt, TokenIds):
            return " ".join(map(str, self.prompt.ids))
        return self.prompt if isinstance(self.prompt, str) else plain_text(self.prompt)


@dataclass(frozen=True, kw_only=True)
class TokenRequest:
    """One validated token-level request: a sequence of token ids, the model, and the adapters to apply.

    What :meth:`~inference.InferenceProvider.next_token_logprobs` (and ``detokenize``) hand to the backend: the
    ids are checked (integers, at least one, within the vocabulary and the context), and the adapters are held
    loaded and named as the backend knows them (a replaced adapter's versioned name, ``id@2``).

    Attributes:
        token_ids: The sequence.
        model: The model name (servers) or a label (in-process providers use their loaded model).
        adapter_id: One adapter at scale 1, or ``None``.
        adapter_scales: Several adapters with their scales (then ``adapter_id`` is ``None``).
    """

    token_ids: tuple[int, ...]
    model: str
    adapter_id: str | None = None
    adapter_scales: AdapterScales = ()

    @classmethod
    def checked(
        cls, *, provider: str, token_ids: object, model: object, adapter_id: str | None = None,
        adapter_scales: AdapterScales = (), name: str = "token_ids", allow_empty: bool = False,
    ) -> TokenRequest:
        """Check ``token_ids`` (:func:`token_id_list`; empty where ``allow_empty``) and ``model``; the adapters come
        split and checked (:func:`split_adapter_choice`).

        Raises:
            InvalidRequestError: The ids or the model are not valid.
        """

        def fail(message: str) -> InvalidRequestError:
            return InvalidRequestError(message, provider=provider)

        return cls(
            token_ids=token_id_list(token_ids, name, fail, allow_empty=allow_empty),
            model=_model_name(model, "model", fail),
            adapter_id=adapter_id,
            adapter_scales=adapter_scales,
        )

    @property
    def adapters(self) -> AdapterScales:
        """As :attr:`GenerationRequest.adapters`: ``()`` for the base model, else each adapter with its scale."""
        if self.adapter_id is not None:
            return ((self.adapter_id, 1.0),)
        return self.adapter_scales


@dataclass(frozen=True, kw_only=True)
class ScoreRequest:
    """One validated log-likelihood request: the continuation's tokens scored after the context's.

    For ``score_rolling`` the context is ``""`` and the continuation is the whole text.
    """

    context: str
    continuation: str
    model: str
    adapter_id: str | None = None

    @classmethod
    def checked(cls, *, provider: str, context: object, continuation: object, model: object,
                adapter_id: object = None) -> ScoreRequest:
        """Check each argument.

        Raises:
            InvalidRequestError: The context is not a string, the continuation is empty or not a string, the
                model is not a string, or the adapter id is not valid.
        """

        def fail(message: str) -> InvalidRequestError:
            return InvalidRequestError(message, provider=provider)

        values: dict[str, Any] = {
            "context": _text(context, "context", fail),
            "continuation": _non_empty_text(continuation, "continuation", fail),
            "model": _model_name(model, "model", fail),
            "adapter_id": _adapter_id_or_none(adapter_id, "adapter_id", fail),
        }
        return cls(**values)
