"""Generation options: every setting of ``generate``, ``stream`` and ``generate_batch``, defined once.

:class:`GenerationOptions` has one field per option. Each field's metadata is an :class:`OptionSpec`: the rule
that checks a value (raising :class:`~inference.exceptions.InvalidRequestError` with a sentence naming the
option and its allowed range), the one-line help, and how the command line reads it. Everything that handles
options reads these fields instead of naming the options:

- validation: :meth:`GenerationOptions.from_arguments`, and the request every backend receives
  (:class:`~inference._core.validation.GenerationRequest`, these fields plus the prompt, model and adapter);
- :meth:`~inference.InferenceProvider.generate`, ``stream`` and ``generate_batch``, whose signatures list the
  options as their public API (a test keeps them equal to these fields, names and defaults);
- the ``inference`` command's flags and ``--set`` keys;
- the evaluation runner's settings and the settings recorded in its results file.

Adding an option is adding a field here (type, default, rule, help), its key to :class:`RequestOptions` (what
type checkers see in ``**options``), and its entry to every provider's :attr:`~inference.InferenceProvider.options`
map: how that backend receives it (:class:`Sent`) or why it cannot (:class:`Refused`). A test fails until every
registered provider declares it.

A frozen dataclass rather than a ``TypedDict`` of settings: options are checked once, at the boundary, into an
immutable typed value that backends read as attributes (``request.temperature``), and each option's rule and help
sit next to its type and default, where a new option cannot leave them out.

Example:
    >>> options = GenerationOptions.from_arguments(provider="example", temperature=0, stop="END")
    >>> options.temperature, options.stop, options.is_greedy
    (0.0, ('END',), True)
    >>> GenerationOptions.from_arguments(provider="example", top_p=1.5)
    Traceback (most recent call last):
    ...
    inference.exceptions.InvalidRequestError: top_p must be a number in (0, 1] or None, got 1.5
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, TypedDict, TypeVar

from inference._core.option_maps import (
    NOT_BUILT_YET,
    RESPONSE_FORMAT_AS_JSON_SCHEMA,
    TIMEOUT_IN_BASE_CLASS,
    ByRequests,
    OptionMap,
    Refused,
    Sent,
)
from inference._core.option_texts import (
    chat_template_file,
    json_schema_file,
    json_text,
    parse_flag,
    tool_choice_text,
    tools_file,
)
from inference.exceptions import InvalidRequestError

__all__ = [
    "MAX_CHOICES",
    "MAX_TOP_LOGPROBS",
    "NOT_BUILT_YET",
    "OPTIONS",
    "POSITIONAL_OPTIONS",
    "RESPONSE_FORMAT_AS_JSON_SCHEMA",
    "TIMEOUT_IN_BASE_CLASS",
    "ByRequests",
    "GenerationOptions",
    "OptionMap",
    "OptionSpec",
    "Refused",
    "RequestOptions",
    "Sent",
]

Fail = Callable[[str], InvalidRequestError]
"""Builds the error for a message (it carries the provider's name)."""

Check = Callable[[object, str, Fail], Any]
"""A rule: ``check(value, name, fail)`` returns the value as the backends receive it, or raises ``fail(...)``."""

_SPEC = "inference.option"
MAX_TOP_LOGPROBS = 20
"""The most alternatives per token ``logprobs`` can ask for (OpenAI's and vLLM's limit)."""
MAX_CHOICES = 128
"""The most completions ``n`` can ask for in one request (OpenAI's limit)."""
_OptionsT = TypeVar("_OptionsT", bound="GenerationOptions")


@dataclass(frozen=True)
class OptionSpec:
    """What a field of :class:`GenerationOptions` (or of a request) needs besides its type and default.

    Attributes:
        check: The rule: ``check(value, name, fail)`` returns the normalised value or raises ``fail(message)``.
        help: One line for the command line's ``--help`` and the docs.
        metavar: The value's placeholder on the command line.
        parse: Reads the command line's text (``int``, ``float``, ``str``).
        repeatable: The flag may be given several times, each adding a value (``--stop``).
        flag: The command line flag, when it is not the name with dashes (``--system`` for ``system_prompt``).
    """

    check: Check
    help: str
    metavar: str = "VALUE"
    parse: Callable[[str], object] = str
    repeatable: bool = False
    flag: str | None = None


def spec_field(default: object = MISSING, **spec: Any) -> Any:
    """A dataclass field whose metadata holds an :class:`OptionSpec` built from ``spec``."""
    return field(default=default, metadata={_SPEC: OptionSpec(**spec)})


def text_or_none(value: object, name: str, fail: Fail) -> str | None:
    """A string that UTF-8 can encode, or ``None``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise fail(f"{name} must be a string or None, got {type(value).__name__}")
    require_utf8(value, name, fail)
    return value


def require_utf8(text: str, name: str, fail: Fail) -> None:
    """Refuse text that cannot be encoded as UTF-8 (a lone surrogate, such as U+D800).

    Every backend sends or tokenizes UTF-8, and would fail on such text with a ``UnicodeEncodeError``.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise fail(
            f"{name} holds {text[error.start]!r} at position {error.start}, a lone surrogate that cannot be "
            "encoded as UTF-8: remove it, or decode the original bytes with errors='replace'"
        ) from None


def _integer(value: object) -> int | None:
    """``value`` as an ``int`` when it is an integer that is not a bool (numpy's integers too: ``np.int64(5)``)."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None


def _positive_int(value: object, name: str, fail: Fail) -> int:
    number = _integer(value)
    if number is None or number < 1:
        raise fail(f"{name} must be a positive integer, got {value!r}")
    return number


def _int_or_none(minimum: int | None) -> Check:
    what = "an integer" if minimum is None else "a non-negative integer"

    def check(value: object, name: str, fail: Fail) -> int | None:
        if value is None:
            return None
        number = _integer(value)
        if number is None or (minimum is not None and number < minimum):
            raise fail(f"{name} must be {what} or None, got {value!r}")
        return number

    return check


def _number_or_none(minimum: float, maximum: float, *, exclusive_minimum: bool = False) -> Check:
    bound = "(" if exclusive_minimum else "["

    def check(value: object, name: str, fail: Fail) -> float | None:
        if value is None:
            return None
        # numpy's scalars are numbers too (np.float32(0.7))
        number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
        if math.isnan(number) or (number <= minimum if exclusive_minimum else number < minimum) or number > maximum:
            raise fail(f"{name} must be a number in {bound}{minimum:g}, {maximum:g}] or None, got {value!r}")
        return number

    return check


def _logprobs(value: object, name: str, fail: Fail) -> int | None:
    if value is None:
        return None
    number = _integer(value)
    if number is None or not 0 <= number <= MAX_TOP_LOGPROBS:
        raise fail(
            f"{name} must be an integer in 0..{MAX_TOP_LOGPROBS} (how many alternatives to report per token) "
            f"or None, got {value!r}"
        )
    return number


def _flag(value: object, name: str, fail: Fail) -> bool:
    """A yes/no option: ``True`` or ``False`` (``None``, the signatures' default, is ``False``)."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise fail(f"{name} must be True or False, got {value!r}")
    return value


def _json_schema(value: object, name: str, fail: Fail) -> dict[str, Any] | None:
    """A JSON schema as a dict: given as a dict, or as a pydantic model class (its ``model_json_schema()``);
    see :func:`inference._core.json_schemas.checked_schema` for what is refused."""
    if value is None:
        return None
    return check_json_schema(value, name, fail)


def check_json_schema(value: object, name: str, fail: Fail) -> dict[str, Any]:
    """``value`` (a JSON-schema dict, or a pydantic model class) as a fresh, checked JSON-schema dict: the rule of
    ``json_schema`` and of a tool's ``parameters`` (see :func:`inference._core.json_schemas.checked_schema`).

    Raises:
        InvalidRequestError: ``fail(message)`` when it is not a JSON schema the backends can use.
    """
    from inference._core.json_schemas import checked_schema

    return checked_schema(value, name, fail)


def _tools(value: object, name: str, fail: Fail) -> tuple[dict[str, Any], ...]:
    from inference.tools import check_tools  # inference.tools builds on this module

    return check_tools(value, name, fail)


def _tool_choice(value: object, name: str, fail: Fail) -> str | dict[str, Any] | None:
    from inference.tools import check_tool_choice

    return check_tool_choice(value, name, fail)


def _stop_sequences(value: object, name: str, fail: Fail) -> tuple[str, ...]:
    if value is None:
        return ()
    single = isinstance(value, str)
    sequences = [value] if isinstance(value, str) else value
    if not isinstance(sequences, Sequence) or not all(isinstance(s, str) and s for s in sequences):
        raise fail(f"{name} must be a non-empty string or a list of non-empty strings, got {repr(value)[:200]}")
    for index, sequence in enumerate(sequences):
        require_utf8(sequence, name if single else f"{name}[{index}]", fail)
    return tuple(sequences)


def _choices(value: object, name: str, fail: Fail) -> int:
    """``n``: how many completions (``None``, the signatures' default, is 1)."""
    if value is None:
        return 1
    number = _integer(value)
    if number is None or not 1 <= number <= MAX_CHOICES:
        raise fail(f"{name} must be an integer in 1..{MAX_CHOICES} (how many completions to return), got {value!r}")
    return number


def _flag_or_none(value: object, name: str, fail: Fail) -> bool | None:
    """A switch that may be left to a default: ``True``, ``False`` or ``None``."""
    if value is None or isinstance(value, bool):
        return value
    raise fail(f"{name} must be True, False or None (the default), got {value!r}")


def _seconds(value: object, name: str, fail: Fail) -> float | None:
    if value is None:
        return None
    number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if not math.isfinite(number) or number <= 0:
        raise fail(f"{name} must be a positive number of seconds or None (no limit), got {value!r}")
    return number


_MAX_LOGIT_BIAS = 100.0


def _logit_bias(value: object, name: str, fail: Fail) -> dict[int, float] | None:
    """Token id -> bias added to its logit (OpenAI's ``logit_bias``): ids as integers or as decimal strings (JSON's
    keys), biases in [-100, 100]; ``None`` or an empty mapping asks nothing."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise fail(f"{name} must map token ids to biases, such as {{50256: -100}}, got {type(value).__name__}")
    biases: dict[int, float] = {}
    for key, bias in value.items():
        token = _integer(key)
        if token is None and isinstance(key, str) and key.strip().isascii() and key.strip().isdigit():
            token = int(key)
        number = float(bias) if isinstance(bias, numbers.Real) and not isinstance(bias, bool) else math.nan
        if token is None or token < 0 or not -_MAX_LOGIT_BIAS <= number <= _MAX_LOGIT_BIAS:
            raise fail(
                f"{name} must map token ids (non-negative integers) to biases in [-100, 100] (-100 bans a token, "
                f"100 forces it), got {repr(key)[:40]}: {repr(bias)[:40]}"
            )
        biases[token] = number
    return dict(sorted(biases.items())) or None


def _json_object(value: object, name: str, fail: Fail) -> dict[str, Any] | None:
    """A dict with string keys that JSON can hold, copied (later changes to the caller's dict change nothing);
    ``None`` or an empty dict asks nothing."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise fail(f"{name} must be a dict with string keys, got {repr(value)[:80]}")
    try:
        copied: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as error:
        raise fail(
            f"{name} must hold JSON (dicts with string keys, lists, strings, finite numbers, booleans, None): "
            f"{str(error)[:200]}"
        ) from None
    require_utf8(json.dumps(copied, ensure_ascii=False), name, fail)
    return copied or None


def _template(value: object, name: str, fail: Fail) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise fail(f"{name} must be a Jinja chat template (a non-empty string) or None, got {repr(value)[:80]}")
    require_utf8(value, name, fail)
    return value


_JSON_SCHEMA_KEYS = frozenset({"name", "schema", "strict", "description"})


def _response_format(value: object, name: str, fail: Fail) -> dict[str, Any] | None:
    """OpenAI's ``response_format``, checked: ``{"type": "json_schema", "json_schema": {"schema": {...}}}`` (its
    ``name``, ``strict`` and ``description`` are taken and ignored), ``{"type": "json_object"}``, ``{"type":
    "text"}``, or a pydantic model class (the openai client's ``parse()`` habit). Returned in the first form
    (with the schema checked as ``json_schema`` is), ``{"type": "json_object"}`` or ``None`` for text."""
    if value is None:
        return None
    if isinstance(value, type):
        return {"type": "json_schema", "json_schema": {"schema": check_json_schema(value, name, fail)}}
    shapes = (
        '{"type": "json_schema", "json_schema": {"schema": {...}}}, {"type": "json_object"} or {"type": "text"}'
    )
    kind = value.get("type") if isinstance(value, Mapping) else None
    if not isinstance(value, Mapping) or kind not in ("json_schema", "json_object", "text"):
        raise fail(f"{name} must be OpenAI's {shapes}, or a pydantic model class; got {repr(value)[:120]}")
    extra = sorted(str(key) for key in value if key not in ("type", "json_schema"))
    if extra or (kind != "json_schema" and "json_schema" in value):
        raise fail(f"{name} has keys that OpenAI's {shapes} do not: {', '.join(extra) or 'json_schema'}")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    inner = value.get("json_schema")
    if not isinstance(inner, Mapping) or "schema" not in inner or not set(inner) <= _JSON_SCHEMA_KEYS:
        raise fail(
            f"{name}['json_schema'] must be a dict with the schema under 'schema' (and optionally name, strict, "
            f"description), got {repr(inner)[:120]}"
        )
    schema = check_json_schema(inner["schema"], f"{name}['json_schema']['schema']", fail)
    return {"type": "json_schema", "json_schema": {"schema": schema}}


JSON_OBJECT_SCHEMA: Mapping[str, Any] = {"type": "object"}
"""What ``response_format={"type": "json_object"}`` (OpenAI's JSON mode) maps to: ``json_schema`` for any JSON
object."""


def _together(checked: dict[str, Any], fail: Fail) -> dict[str, Any]:
    """The rules between options: ``response_format`` becomes ``json_schema`` (not both), and ``thinking`` and a
    ``chat_template_kwargs`` ``enable_thinking`` must agree."""
    response_format = checked["response_format"]
    if response_format is not None:
        if checked["json_schema"] is not None:
            raise fail(
                "json_schema and response_format both constrain the output: give one of them (response_format is "
                "mapped to json_schema)"
            )
        if response_format["type"] == "json_object":
            checked["json_schema"] = dict(JSON_OBJECT_SCHEMA)
        else:
            checked["json_schema"] = response_format["json_schema"]["schema"]
        checked["response_format"] = None
    variables = checked["chat_template_kwargs"] or {}
    enabled = variables.get("enable_thinking")
    if checked["thinking"] is not None and isinstance(enabled, bool) and enabled != checked["thinking"]:
        raise fail(
            f"thinking={checked['thinking']} and chat_template_kwargs['enable_thinking']={enabled} disagree: give "
            "one of them (thinking is sent as the backend's own switch)"
        )
    return checked


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
"""Each options class's field names, read once (a request is checked on every call)."""

_CHECK_ORDER: dict[type, tuple[Field[Any], ...]] = {}
"""Each options class's fields in the order ``from_arguments`` checks them, sorted once."""


@dataclass(frozen=True, kw_only=True)
class GenerationOptions:
    """The options of one generation, checked; each field's metadata holds its :class:`OptionSpec`.

    Build it with :meth:`from_arguments`, which checks every value. Each field's ``help`` (in the signature
    above, and as ``OPTIONS[name].help``) documents it; :meth:`~inference.InferenceProvider.generate` too.
    """

    max_tokens: int = spec_field(
        4096, check=_positive_int, help="most tokens to generate", metavar="N", parse=int
    )
    system_prompt: str | None = spec_field(
        None, check=text_or_none, help="a system message, sent through the chat template", metavar="TEXT",
        flag="--system",
    )
    temperature: float | None = spec_field(
        None, check=_number_or_none(0.0, 100.0), help="sampling temperature; 0 is greedy", metavar="T", parse=float
    )
    top_p: float | None = spec_field(
        None, check=_number_or_none(0.0, 1.0, exclusive_minimum=True), help="nucleus sampling mass in (0, 1]",
        metavar="P", parse=float,
    )
    repetition_penalty: float | None = spec_field(
        None, check=_number_or_none(0.0, 100.0, exclusive_minimum=True), help="above 1 discourages repeats",
        metavar="R", parse=float,
    )
    stop: tuple[str, ...] = spec_field(
        (), check=_stop_sequences,
        help="a string that ends the generation (not included in the text); ignored with json_schema",
        metavar="TEXT", repeatable=True,
    )
    seed: int | None = spec_field(
        None, check=_int_or_none(None), help="sampling seed, for reproducible output", metavar="N", parse=int
    )
    top_k: int | None = spec_field(
        None, check=_int_or_none(0), help="sample among the K most likely tokens", metavar="K", parse=int
    )
    logprobs: int | None = spec_field(
        None, check=_logprobs, metavar="K", parse=int,
        help=f"report each generated token's log-probability and its K (0-{MAX_TOP_LOGPROBS}) likeliest rivals",
    )
    json_schema: Mapping[str, Any] | None = spec_field(
        None, check=_json_schema, metavar="FILE", parse=json_schema_file,
        help="constrain the output to JSON valid against this schema (a dict or a pydantic model class; on the command "
        "line a JSON file of the schema)",
    )
    tools: tuple[Mapping[str, Any], ...] = spec_field(
        (), check=_tools, metavar="FILE", parse=tools_file,
        help="tools the model may call (OpenAI's function tools; on the command line a JSON file of them)",
    )
    tool_choice: str | Mapping[str, Any] | None = spec_field(
        None, check=_tool_choice, metavar="CHOICE", parse=tool_choice_text,
        help="whether the model calls a tool: auto (the default with tools), none, required, or a tool's name",
    )
    return_token_ids: bool = spec_field(
        False, check=_flag, metavar="BOOL", parse=parse_flag,
        help="report the generated token ids in the result's token_ids",
    )
    n: int = spec_field(
        1, check=_choices, metavar="N", parse=int,
        help=f"how many completions to return (1-{MAX_CHOICES}), in the result's choices",
    )
    presence_penalty: float | None = spec_field(
        None, check=_number_or_none(-2.0, 2.0), metavar="P", parse=float,
        help="OpenAI's presence penalty in [-2, 2]: subtracted once from the logit of every token already generated",
    )
    frequency_penalty: float | None = spec_field(
        None, check=_number_or_none(-2.0, 2.0), metavar="F", parse=float,
        help="OpenAI's frequency penalty in [-2, 2]: subtracted from a token's logit once per time it was generated",
    )
    min_p: float | None = spec_field(
        None, check=_number_or_none(0.0, 1.0), metavar="P", parse=float,
        help="drop the tokens less likely than min_p times the likeliest one, in [0, 1]",
    )
    logit_bias: Mapping[int, float] | None = spec_field(
        None, check=_logit_bias, metavar="JSON", parse=json_text,
        help="token id -> bias in [-100, 100] added to its logit, as OpenAI's logit_bias ({\"50256\": -100})",
    )
    raw_prompt: bool | None = spec_field(
        None, check=_flag_or_none, metavar="BOOL", parse=parse_flag,
        help="send the prompt text as it is, without the chat template (default: the provider's raw_prompt setting)",
    )
    chat_template: str | None = spec_field(
        None, check=_template, metavar="FILE", parse=chat_template_file,
        help="a Jinja chat template used instead of the model's (for a model without one)",
    )
    chat_template_kwargs: Mapping[str, Any] | None = spec_field(
        None, check=_json_object, metavar="JSON", parse=json_text,
        help="variables for the chat template, such as {\"enable_thinking\": false}",
    )
    thinking: bool | None = spec_field(
        None, check=_flag_or_none, metavar="BOOL", parse=parse_flag,
        help="switch a thinking model's reasoning on or off (default: the model's); it goes to the result's reasoning",
    )
    response_format: Mapping[str, Any] | None = spec_field(
        None, check=_response_format, metavar="JSON", parse=json_text,
        help="OpenAI's response_format (json_schema or json_object), mapped to json_schema",
    )
    extra_body: Mapping[str, Any] | None = spec_field(
        None, check=_json_object, metavar="JSON", parse=json_text,
        help="fields merged into a server's request body as they are (not checked)",
    )
    timeout: float | None = spec_field(
        None, check=_seconds, metavar="S", parse=float,
        help="seconds the call may take; then it is cancelled with a ProviderTimeoutError",
    )

    @property
    def is_greedy(self) -> bool:
        """True when decoding is deterministic (temperature 0)."""
        return self.temperature == 0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The field names, in order."""
        names = _FIELD_NAMES.get(cls)
        if names is None:
            names = _FIELD_NAMES[cls] = tuple(item.name for item in fields(cls))
        return names

    @classmethod
    def taken_from(cls, namespace: Mapping[str, Any]) -> dict[str, Any]:
        """The values ``namespace`` holds under the field names (a method's ``locals()``); each must be there."""
        return {name: namespace[name] for name in cls.names()}

    @classmethod
    def from_arguments(cls: type[_OptionsT], *, provider: str, **values: object) -> _OptionsT:
        """Check ``values`` (field name -> value; a missing one takes its default) and return them as an instance.

        Raises:
            InvalidRequestError: A value has the wrong type or is out of range; the message names it and the
                allowed range.
            TypeError: A name is not a field, or a field without a default is missing.
        """

        def fail(message: str) -> InvalidRequestError:
            return InvalidRequestError(message, provider=provider)

        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise TypeError(f"{cls.__name__}.from_arguments() got unexpected arguments: {', '.join(unknown)}")
        checked: dict[str, Any] = {}
        ordered = _CHECK_ORDER.get(cls)
        if ordered is None:  # the request's own fields first, then the options (some rules read both)
            options = frozenset(GenerationOptions.names())
            ordered = _CHECK_ORDER[cls] = tuple(sorted(fields(cls), key=lambda item: item.name in options))
        for item in ordered:
            if item.name in values:
                value = values[item.name]
            elif item.default is not MISSING:
                value = item.default
            else:
                raise TypeError(f"{cls.__name__}.from_arguments() is missing {item.name}")
            checked[item.name] = item.metadata[_SPEC].check(value, item.name, fail)
        from inference.tools import check_tools_together

        checked["tool_choice"] = check_tools_together(checked["tools"], checked["tool_choice"], fail)
        return cls(**_together(checked, fail))

    def as_arguments(self) -> dict[str, Any]:
        """The options as keyword arguments of ``generate`` (field name -> value)."""
        return {name: getattr(self, name) for name in GenerationOptions.names()}


OPTIONS: Mapping[str, OptionSpec] = {item.name: item.metadata[_SPEC] for item in fields(GenerationOptions)}
"""Option name -> its :class:`OptionSpec`, in the order of :class:`GenerationOptions`' fields."""


POSITIONAL_OPTIONS = ("max_tokens", "system_prompt", "temperature", "top_p", "repetition_penalty")
"""The options that are positional parameters of ``generate``, ``stream`` and ``generate_batch`` (after ``prompt``,
``model`` and ``adapter_id``), as in the first version of the SDK; every other option is keyword-only."""


class RequestOptions(TypedDict, total=False):
    """The keyword-only options of ``generate``, ``stream`` and ``generate_batch`` (their ``**options``).

    One key per field of :class:`GenerationOptions` that is not in :data:`POSITIONAL_OPTIONS`, with the types a
    caller may pass (a test keeps the two in step). Type checkers and editors check each name and type; at run
    time the methods' signatures list them as keyword-only parameters with the default ``None``, and an unknown
    name is a ``TypeError``. Each option's rule is on :class:`GenerationOptions`.

    Attributes:
        stop: A string or strings that end the generation (not included in the text). Not with ``json_schema``,
            whose JSON decides where the text ends.
        seed: Seed for sampling, for reproducible output.
        top_k: Sample only among the ``top_k`` most likely tokens; ``None`` keeps the backend's default.
        logprobs: Report each generated token's log-probability and its ``logprobs`` (0-20) most likely
            alternatives in :attr:`~inference.GenerationResult.logprobs`; ``None`` reports nothing.
        json_schema: Constrain the text to JSON valid against this schema (a JSON-schema dict, or a pydantic model
            class). The text then always parses and validates, unless ``finish_reason`` is ``"length"``. Not with
            ``stop``. Its ``$ref`` must point inside it (nothing is fetched).
        tools: Tools the model may call: OpenAI's function tools (``{"type": "function", "function": {"name",
            "description", "parameters"}}``), Python functions or pydantic model classes (see
            :mod:`inference.tools`). Its calls come back in :attr:`~inference.GenerationResult.tool_calls`.
        tool_choice: ``"auto"`` (the model decides; the default with tools), ``"none"``, ``"required"``, or
            ``{"type": "function", "function": {"name": N}}`` to force a call of tool ``N``.
        return_token_ids: Report the generated token ids in :attr:`~inference.GenerationResult.token_ids` (the ids
            the model produced, up to a stop string; ``None`` when not asked).
        n: How many completions to return (1-128): with ``n > 1`` the result's
            :attr:`~inference.GenerationResult.choices` holds them, the result itself is the first, and its token
            counts add up (the prompt counted once). vLLM, OpenAI-compatible servers, llama.cpp and Transformers in
            process compute the prompt once for all of them; a backend without a native ``n`` (Ollama,
            llama-server) sends ``n`` requests. Either way choice ``k`` is seeded ``seed + k`` when a ``seed`` is
            given (the choices of ``n`` requests with those seeds). Not with ``stream``.
        presence_penalty: OpenAI's presence penalty in [-2, 2]: subtracted once from the logit of every token
            already generated (negative values encourage repeats). Never mapped to another penalty.
        frequency_penalty: OpenAI's frequency penalty in [-2, 2]: subtracted from a token's logit once for each
            time it was generated.
        min_p: Keep only the tokens at least ``min_p`` times as likely as the likeliest one, in [0, 1].
        logit_bias: Token id -> bias in [-100, 100] added to that token's logit before sampling, as OpenAI's
            (``-100`` bans a token, ``100`` all but forces it). Ids as integers or decimal strings (JSON's keys).
        raw_prompt: ``True`` sends the prompt string as it is, without the chat template (a completion model, or
            a prompt you formatted yourself); ``False`` applies the template; ``None`` takes the provider's
            ``raw_prompt`` setting (off unless set). Not with a message list, ``system_prompt``, ``tools`` or the
            template options.
        chat_template: A Jinja chat template to render the messages with instead of the model's own (for a model
            without one, whose turns would otherwise be joined as plain text).
        chat_template_kwargs: Variables for the chat template, such as ``{"enable_thinking": False}``.
        thinking: ``True`` or ``False`` switches a thinking model's reasoning on or off, in the form its backend
            takes (Ollama's ``think``, the template's ``enable_thinking``...); ``None`` leaves the model's default.
            What the model thought is in :attr:`~inference.GenerationResult.reasoning`, never in ``text``.
        response_format: OpenAI's ``response_format``, mapped to ``json_schema``: ``{"type": "json_schema",
            "json_schema": {"schema": {...}}}`` constrains to that schema, ``{"type": "json_object"}`` (JSON mode)
            to any JSON object, ``{"type": "text"}`` to nothing; a pydantic model class as ``json_schema``. Not
            with ``json_schema``.
        extra_body: Fields merged into a server provider's request body as they are, for what the options do not
            model (as the openai client's ``extra_body``). Not checked: a field the server does not know is its
            error, or silently ignored by it. Where a key is also an option's field, ``extra_body`` wins.
        timeout: Seconds the call may take (the whole call: waiting for the adapter, generating, and for a stream
            every piece); then it is cancelled (an in-process generation stops within a token) and raises
            :class:`~inference.exceptions.ProviderTimeoutError`. ``None``: no limit besides a server provider's
            own ``timeout`` setting per answer. On a :class:`~inference.FallbackProvider`, each provider's attempt.
    """

    stop: str | Sequence[str] | None
    seed: int | None
    top_k: int | None
    logprobs: int | None
    json_schema: Mapping[str, Any] | type | None
    tools: Sequence[Mapping[str, Any] | Callable[..., Any] | type] | None
    tool_choice: str | Mapping[str, Any] | None
    return_token_ids: bool | None
    n: int | None
    presence_penalty: float | None
    frequency_penalty: float | None
    min_p: float | None
    logit_bias: Mapping[int, float] | Mapping[str, float] | Mapping[int | str, float] | None
    raw_prompt: bool | None
    chat_template: str | None
    chat_template_kwargs: Mapping[str, Any] | None
    thinking: bool | None
    response_format: Mapping[str, Any] | type | None
    extra_body: Mapping[str, Any] | None
    timeout: float | None


def option_is_set(name: str, value: object) -> bool:
    """True when ``value`` is not the option's default (an option left at its default asks nothing of a backend)."""
    default = _DEFAULTS[name]
    return bool(value != default)


_DEFAULTS: dict[str, Any] = {item.name: item.default for item in fields(GenerationOptions)}
