"""What an evaluation runs on: the prompt set (a JSONL file) and the adapters (directories, files or globs)."""

from __future__ import annotations

import glob
import json
import numbers
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from inference._core.json_files import NotUtf8Error, decode_utf8
from inference._core.validation import ADAPTER_ID_PATTERN, validate_adapter_id
from inference.adapters.weights import AdapterWeights
from inference.exceptions import InvalidRequestError
from inference.options import require_utf8

__all__ = [
    "BASE_MODEL_ID",
    "AdapterSpec",
    "EvalPrompt",
    "adapter_id_for",
    "checked_prompts",
    "discover_adapters",
    "load_prompts",
    "parse_prompts",
]

_GLOB_CHARACTERS = re.compile(r"[*?\[]")

BASE_MODEL_ID = "(base)"
"""The ``adapter_id`` of the base model's rows (no adapter), in the results file, the summary and the CSV.

Not a valid adapter id (parentheses), so it never names an adapter."""


@dataclass(frozen=True)
class EvalPrompt:
    """One prompt of the prompt set.

    Attributes:
        id: Unique within the set; with the adapter id it keys a result row (and resumption).
        prompt: The user's text.
        system_prompt: An optional system message.
        expected: The expected answer (exact match), a pattern (regex scoring), or anything a user scorer reads.
            With a provider that can score, its negative log-likelihood per token after the prompt is recorded too.
        choices: Answers of a multiple-choice question, each scored as a continuation of the prompt.
        answer: The index of the right one in ``choices`` (given with ``choices``).
    """

    id: str
    prompt: str
    system_prompt: str | None = None
    expected: str | None = None
    choices: tuple[str, ...] | None = None
    answer: int | None = None


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter to evaluate, with the id you choose for it: files (``path``) or weights in memory (``weights``).

    Example:
        >>> AdapterSpec("step-100", Path("runs/ckpt-100/adapter")).id
        'step-100'

    ``AdapterSpec("task-3", weights=AdapterWeights(tensors, config))`` evaluates a hypernetwork's or a training
    loop's output without writing it anywhere; its rows are identified by a hash of the tensors and the config
    (see :func:`~inference.evaluation.identity.adapter_hash`), so a rerun with the same weights resumes.

    Attributes:
        id: The adapter id it is loaded under (derived from its directory or file name).
        path: Where it is (a PEFT directory or a GGUF LoRA file), or ``None`` for weights in memory.
        weights: The weights themselves (an :class:`~inference.AdapterWeights`), or ``None`` for a path. Not
            compared: two specs are equal when their ids and paths are.
    """

    id: str
    path: Path | None = None
    weights: AdapterWeights | None = field(default=None, compare=False)


def load_prompts(path: str | os.PathLike[str]) -> list[EvalPrompt]:
    """Read a prompt set: one JSON object per line with ``id``, ``prompt``, optional ``system_prompt``, ``expected``,
    and optional ``choices`` (a list of answers) with ``answer`` (the index of the right one).

    The file is UTF-8 (a leading byte-order mark is skipped) and lines end at ``\\n`` (or ``\\r\\n``) only, so
    U+2028, U+0085 and other Unicode line separators inside a JSON string are text. Blank lines are skipped. Ids
    may be strings or integers (kept as text) and must be unique.

    Raises:
        InvalidRequestError: The file is missing or not UTF-8, a line is not such an object, a text holds a lone
            surrogate (``"\\ud800"``), or an id repeats; the message names the file and the line.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InvalidRequestError(
            f"cannot read the prompt set {path}: {error.strerror or error}", path=str(path)
        ) from error
    try:
        text = decode_utf8(data)
    except NotUtf8Error as error:
        raise InvalidRequestError(
            f"{path} line {error.line} is not UTF-8 text (byte 0x{error.byte:02x} at byte {error.offset} cannot be "
            "decoded): save the prompt set as UTF-8",
            path=str(path),
        ) from None
    return parse_prompts(_jsonl_lines(text), source=str(path))


def _jsonl_lines(text: str) -> list[str]:
    """The lines of JSON Lines text: split at ``\\n`` only (a trailing ``\\r`` dropped), as JSON Lines defines them.

    ``str.splitlines`` would also split at U+2028, U+0085 and the other Unicode line separators, which JSON
    allows raw inside a string.
    """
    return [line.removesuffix("\r") for line in text.split("\n")]


def parse_prompts(lines: Iterable[str], *, source: str = "<prompts>") -> list[EvalPrompt]:
    """Parse prompt-set lines (see :func:`load_prompts`); ``source`` names them in error messages."""
    prompts: list[EvalPrompt] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise InvalidRequestError(f"{where} is not JSON ({error.msg})", path=source) from error
        prompt = _prompt_from_record(record, where, source)
        if prompt.id in seen:
            raise InvalidRequestError(
                f"{where}: id {prompt.id!r} was already used on line {seen[prompt.id]}; ids must be unique",
                path=source,
            )
        seen[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise InvalidRequestError(f"the prompt set {source} has no prompts", path=source)
    return prompts


def checked_prompts(prompts: Iterable[Any]) -> list[EvalPrompt]:
    """A list of :class:`EvalPrompt` checked as a prompt file's lines are (unique ids, text fields, ``choices`` of
    two or more non-empty strings with an ``answer`` among them), each named by its index in messages.

    Raises:
        InvalidRequestError: An item is no ``EvalPrompt``, or breaks a rule of the prompt set.
    """
    checked: list[EvalPrompt] = []
    seen: dict[str, int] = {}
    for index, prompt in enumerate(prompts):
        where = f"prompts[{index}]"
        if not isinstance(prompt, EvalPrompt):
            raise InvalidRequestError(f"{where} must be an EvalPrompt, got {type(prompt).__name__}", path="prompts")
        record = {
            **asdict(prompt),
            "id": _plain_integer(prompt.id),
            "choices": None if prompt.choices is None else list(prompt.choices),
            "answer": _plain_integer(prompt.answer),
            "expected": prompt.expected if isinstance(prompt.expected, str) else None,
        }
        prompt = replace(_prompt_from_record(record, where, "prompts"), expected=prompt.expected)  # any for a scorer
        if prompt.id in seen:
            raise InvalidRequestError(
                f"{where}: id {prompt.id!r} was already used by prompts[{seen[prompt.id]}]; ids must be unique",
                path="prompts",
            )
        seen[prompt.id] = index
        checked.append(prompt)
    return checked


def _plain_integer(value: Any) -> Any:
    """A numpy or other integral number as an ``int`` (ids and answers from a data frame); anything else as it is."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value


def _prompt_from_record(record: Any, where: str, source: str) -> EvalPrompt:
    if not isinstance(record, Mapping):
        raise InvalidRequestError(f"{where} must be a JSON object with 'id' and 'prompt'", path=source)
    prompt_id = record.get("id")
    if isinstance(prompt_id, bool) or not isinstance(prompt_id, (str, int)) or str(prompt_id) == "":
        raise InvalidRequestError(
            f"{where}: 'id' must be a non-empty string or an integer, got {prompt_id!r}", path=source
        )
    fields: dict[str, str | None] = {}
    for key, required in (("prompt", True), ("system_prompt", False), ("expected", False)):
        value = record.get(key)
        if value is None and not required:
            fields[key] = None
        elif isinstance(value, str):
            fields[key] = value
        else:
            kind = "a string" if required else "a string or null"
            raise InvalidRequestError(f"{where}: {key!r} must be {kind}, got {value!r}", path=source)
    choices, answer = _choices_from_record(record, where, source)
    texts = {"id": str(prompt_id), **fields, **{f"choices[{i}]": choice for i, choice in enumerate(choices or ())}}
    for key, text in texts.items():
        if text is not None:
            require_utf8(text, f"{where}: {key!r}", lambda message: InvalidRequestError(message, path=source))
    return EvalPrompt(
        str(prompt_id), str(fields["prompt"]), fields["system_prompt"], fields["expected"], choices, answer
    )


def _choices_from_record(
    record: Mapping[str, Any], where: str, source: str
) -> tuple[tuple[str, ...] | None, int | None]:
    """``choices`` (at least two non-empty strings) and ``answer`` (an index into them), both or neither."""
    choices, answer = record.get("choices"), record.get("answer")
    if choices is None and answer is None:
        return None, None
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        raise InvalidRequestError(f"{where}: 'choices' must be a list of two or more non-empty strings", path=source)
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
        raise InvalidRequestError(
            f"{where}: 'answer' must be the index of the right choice, 0 to {len(choices) - 1}, got {answer!r}",
            path=source,
        )
    return tuple(choices), answer


def adapter_id_for(path: str | os.PathLike[str]) -> str:
    """The adapter id an evaluation uses for ``path``: its name (a file's stem), made a valid adapter id.

    Characters other than letters, digits, ``.``, ``_`` and ``-`` become ``-``; leading separators are
    dropped; the result is cut to 128 characters.

    Example:
        >>> adapter_id_for("runs/step 100/")
        'step-100'
    """
    path = Path(path)
    name = path.stem if path.suffix.lower() == ".gguf" else path.name
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).lstrip("._-")[:128].rstrip("-") or "adapter"
    if not ADAPTER_ID_PATTERN.fullmatch(cleaned):  # pragma: no cover - the substitutions above make it valid
        cleaned = "adapter"
    return cleaned


def discover_adapters(specs: Sequence[str | os.PathLike[str]]) -> list[AdapterSpec]:
    """Expand adapter paths and globs into :class:`AdapterSpec` s with unique ids.

    Each item is a directory or file (a PEFT directory, or a GGUF LoRA file for llama.cpp) or a glob
    (``runs/*/adapter``). Matches of a glob are sorted; a path named twice is kept once. When two adapters
    get the same id (``runs/1/adapter`` and ``runs/2/adapter``), the parent directory names are prefixed
    (``1-adapter``), then a counter is appended, so ids are unique and stable between runs.

    Raises:
        InvalidRequestError: No adapters given, a path does not exist, or a glob matches nothing.
    """
    if isinstance(specs, (str, os.PathLike)):
        specs = [specs]
    paths: list[Path] = []
    for spec in specs:
        text = os.fspath(spec)
        if _GLOB_CHARACTERS.search(text) and not Path(text).exists():
            matches = sorted(glob.glob(os.path.expanduser(text)))
            if not matches:
                raise InvalidRequestError(f"the adapter glob {text!r} matches nothing", path=text)
            paths += [Path(match) for match in matches]
        else:
            path = Path(text).expanduser()
            if not path.exists():
                raise InvalidRequestError(
                    f"adapter path {text} does not exist: give a PEFT adapter directory, a GGUF LoRA file or a glob",
                    path=text,
                )
            paths.append(path)
    unique: list[Path] = []
    seen: set[Path] = set()
    for path in paths:
        resolved = path.resolve()
        if resolved not in seen:
            seen.add(resolved)
            unique.append(path)
    if not unique:
        raise InvalidRequestError("no adapters given: pass adapter directories, GGUF LoRA files or a glob")
    return [AdapterSpec(adapter_id, path) for adapter_id, path in zip(_unique_ids(unique), unique, strict=True)]


def _unique_ids(paths: list[Path]) -> list[str]:
    names = [adapter_id_for(path) for path in paths]
    ids = [
        adapter_id_for(f"{path.resolve().parent.name}-{name}")
        if names.count(name) > 1 and path.resolve().parent.name
        else name
        for name, path in zip(names, paths, strict=True)
    ]
    taken: set[str] = set()
    result: list[str] = []
    for adapter_id in ids:
        candidate, counter = adapter_id, 2
        while candidate in taken:
            candidate = f"{adapter_id[:120]}-{counter}"
            counter += 1
        taken.add(candidate)
        result.append(candidate)
    return result


AdapterInput = str | os.PathLike[str] | AdapterSpec | AdapterWeights
"""One item of ``evaluate_adapters``' ``adapters``: a path or glob, an :class:`AdapterSpec`, or weights in memory."""


def adapter_specs(
    adapters: Sequence[AdapterInput] | str | os.PathLike[str] | AdapterWeights,
) -> tuple[list[AdapterSpec], bool]:
    """The adapters, and whether the caller chose their ids (``AdapterSpec`` objects).

    Bare weights get the id ``""`` here; :func:`name_weights` names them once they are hashed.
    """
    if isinstance(adapters, (str, os.PathLike)):
        return discover_adapters([adapters]), False
    items: list[Any] = [adapters] if isinstance(adapters, AdapterWeights) else list(adapters)
    weights = [AdapterSpec("", weights=item) for item in items if isinstance(item, AdapterWeights)]
    given = [item for item in items if isinstance(item, AdapterSpec)]
    paths = [item for item in items if not isinstance(item, (AdapterSpec, AdapterWeights))]
    if given and paths:
        raise InvalidRequestError(
            "give adapters either as paths and globs or as AdapterSpec objects, not both (weights in memory go "
            "with either)"
        )
    if given:
        ids = [spec.id for spec in given]
        if len(set(ids)) != len(ids):
            raise InvalidRequestError(f"adapter ids must be unique, got {ids}")
        for spec in given:
            _check_spec(spec)
        return [*given, *weights], True
    if weights and not paths:
        return weights, True
    return [*discover_adapters(paths), *weights], False


def _check_spec(spec: AdapterSpec) -> None:
    validate_adapter_id(spec.id, provider="evaluation")
    if (spec.path is None) == (spec.weights is None):
        raise InvalidRequestError(
            f"AdapterSpec {spec.id!r} needs either a path or weights (AdapterSpec(id, path) or AdapterSpec(id, "
            "weights=AdapterWeights(...))), not both or neither"
        )
    if spec.weights is not None:
        if not isinstance(spec.weights, AdapterWeights):
            raise InvalidRequestError(
                f"AdapterSpec {spec.id!r}: weights must be an AdapterWeights, got {type(spec.weights).__name__}"
            )
        return
    if not Path(str(spec.path)).exists():
        raise InvalidRequestError(
            f"adapter path {spec.path} of {spec.id!r} does not exist here: the runner hashes each adapter's "
            "files to tell versions apart, so give a path readable where the evaluation runs",
            path=str(spec.path),
        )


def name_weights(specs: list[AdapterSpec], hashes: list[str | None]) -> tuple[list[AdapterSpec], list[str | None]]:
    """Bare weights named after their content hash (``weights-<12 hex digits>``), the same weights given twice kept
    once; every id unique."""
    named: list[AdapterSpec] = []
    kept: list[str | None] = []
    seen: set[str] = set()
    for spec, content in zip(specs, hashes, strict=True):
        if spec.id == "":
            spec = replace(spec, id=f"weights-{str(content)[:12]}")
            if spec.id in seen:
                continue  # the same weights twice: evaluated once, as a path given twice
        if spec.id in seen:
            raise InvalidRequestError(f"adapter id {spec.id!r} is given twice: ids must be unique")
        seen.add(spec.id)
        named.append(spec)
        kept.append(content)
    return named, kept
