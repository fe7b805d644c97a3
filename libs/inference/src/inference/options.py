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

Adding an option is adding a field here (type, default, rule, help) and its parameter to those three
signatures.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from inference.exceptions import InvalidRequestError

__all__ = ["MAX_TOP_LOGPROBS", "OPTIONS", "GenerationOptions", "OptionSpec"]

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


def _positive_int(value: object, name: str, fail: Fail) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(f"{name} must be a positive integer, got {value!r}")
    return value


def _int_or_none(minimum: int | None) -> Check:
    what = "an integer" if minimum is None else "a non-negative integer"

    def check(value: object, name: str, fail: Fail) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
            raise fail(f"{name} must be {what} or None, got {value!r}")
        return value

    return check


def _number_or_none(minimum: float, maximum: float, *, exclusive_minimum: bool = False) -> Check:
    bound = "(" if exclusive_minimum else "["

    def check(value: object, name: str, fail: Fail) -> float | None:
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or math.isnan(value)
            or (value <= minimum if exclusive_minimum else value < minimum)
            or value > maximum
        ):
            raise fail(f"{name} must be a number in {bound}{minimum:g}, {maximum:g}] or None, got {value!r}")
        return float(value)

    return check


def _logprobs(value: object, name: str, fail: Fail) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise fail(
            f"{name} must be an integer in 0..{MAX_TOP_LOGPROBS} (how many alternatives to report per token) "
            f"or None, got {value!r}"
        )
    return value


def _json_schema(value: object, name: str, fail: Fail) -> dict[str, Any] | None:
    """A JSON schema as a dict: given as a dict, or as a pydantic model class (its ``model_json_schema()``);
    see :func:`inference._core.json_schemas.checked_schema` for what is refused."""
    if value is None:
        return None
    from inference._core.json_schemas import checked_schema

    return checked_schema(value, name, fail)


def json_schema_file(path: str) -> dict[str, Any]:
    """Read the command line's ``--json-schema FILE``: the file's JSON (checked as a schema afterwards)."""
    with open(path, encoding="utf-8") as file:
        loaded: dict[str, Any] = json.load(file)
    return loaded


def _stop_sequences(value: object, name: str, fail: Fail) -> tuple[str, ...]:
    if value is None:
        return ()
    single = isinstance(value, str)
    sequences = [value] if isinstance(value, str) else value
    if not isinstance(sequences, Sequence) or not all(isinstance(s, str) and s for s in sequences):
        raise fail(f"{name} must be a non-empty string or a list of non-empty strings, got {value!r}")
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
        return cls(**checked)

    def as_arguments(self) -> dict[str, Any]:
        """The options as keyword arguments of ``generate`` (field name -> value)."""
        return {name: getattr(self, name) for name in GenerationOptions.names()}


OPTIONS: Mapping[str, OptionSpec] = {item.name: item.metadata[_SPEC] for item in fields(GenerationOptions)}
"""Option name -> its :class:`OptionSpec`, in the order of :class:`GenerationOptions`' fields."""

