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

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypedDict, TypeVar

from inference.exceptions import InvalidRequestError

__all__ = [
    "MAX_TOP_LOGPROBS",
    "OPTIONS",
    "POSITIONAL_OPTIONS",
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


def parse_flag(text: str) -> bool:
    """Read a yes/no option from the command line: ``true``/``false``, ``yes``/``no``, ``1``/``0``, ``on``/``off``."""
    words = {"true": True, "yes": True, "1": True, "on": True, "false": False, "no": False, "0": False, "off": False}
    value = words.get(text.strip().lower())
    if value is None:
        raise ValueError(f"expected true or false, got {text!r}")
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


def tools_file(path: str) -> list[Any]:
    """Read the command line's ``--tools FILE``: a JSON list of OpenAI function tools (checked afterwards)."""
    from inference._core.json_files import read_json_file

    loaded: Any = read_json_file(path, "the tools file")
    return loaded if isinstance(loaded, list) else [loaded]


def tool_choice_text(text: str) -> str | dict[str, Any]:
    """Read the command line's ``--tool-choice``: ``auto``, ``none``, ``required``, or the name of a tool."""
    if text in ("auto", "none", "required"):
        return text
    return {"type": "function", "function": {"name": text}}


def json_schema_file(path: str) -> dict[str, Any]:
    """Read the command line's ``--json-schema FILE``: the file's JSON (checked as a schema afterwards).

    Raises:
        InvalidRequestError: The file cannot be read, is not UTF-8 or not JSON, nests too deeply or holds a lone
            surrogate; the message names the file and the line.
    """
    from inference._core.json_files import read_json_file

    loaded: dict[str, Any] = read_json_file(path, "the JSON schema file")
    return loaded


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
        help="constrain the output to JSON valid against this schema (a dict or a pydantic model class)",
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

    @property
    def is_greedy(self) -> bool:
        """True when decoding is deterministic (temperature 0)."""
        return self.temperature == 0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The field names, in order."""
        return tuple(item.name for item in fields(cls))

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
        for item in sorted(fields(cls), key=lambda item: item.name in GenerationOptions.names()):
            if item.name in values:
                value = values[item.name]
            elif item.default is not MISSING:
                value = item.default
            else:
                raise TypeError(f"{cls.__name__}.from_arguments() is missing {item.name}")
            checked[item.name] = item.metadata[_SPEC].check(value, item.name, fail)
        from inference.tools import check_tools_together

        checked["tool_choice"] = check_tools_together(checked["tools"], checked["tool_choice"], fail)
        return cls(**checked)

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
    """

    stop: str | Sequence[str] | None
    seed: int | None
    top_k: int | None
    logprobs: int | None
    json_schema: Mapping[str, Any] | type | None
    tools: Sequence[Mapping[str, Any] | Callable[..., Any] | type] | None
    tool_choice: str | Mapping[str, Any] | None
    return_token_ids: bool | None


@dataclass(frozen=True)
class Sent:
    """How a backend receives an option.

    Attributes:
        field: Where it goes: for a server, the dotted path of the field in the request body
            (``"options.repeat_penalty"``); in process, the backend's own name for it (``"temp"`` of llama.cpp's
            sampler, ``"GenerationConfig.top_k"``).
        note: Anything a user should know (an extension field a server may refuse, a value that is mapped).
    """

    field: str
    note: str = ""


@dataclass(frozen=True)
class Refused:
    """A backend that cannot honour an option: a request that sets it is an ``UnsupportedOperationError`` before
    anything is sent.

    Attributes:
        reason: Why, in a few words (``"llama-server's completions give no log-probabilities"``).
    """

    reason: str


OptionMap = Mapping[str, "Sent | Refused"]
"""Option name -> how one provider receives it: the table each provider class declares as ``options``."""


def option_is_set(name: str, value: object) -> bool:
    """True when ``value`` is not the option's default (an option left at its default asks nothing of a backend)."""
    default = _DEFAULTS[name]
    return bool(value != default)


_DEFAULTS: dict[str, Any] = {item.name: item.default for item in fields(GenerationOptions)}
