"""What a result row answers: which adapter (path and content hash), which prompt (its text), which settings.

A results file holds one experiment. Every row records the adapter's absolute path and a hash of its files,
a hash of the prompt, and the run's settings (provider, base model, generation settings, scorer). Before a run
appends to a file, :func:`reconcile` checks the file against the run, so a resumed run never reuses a row made
for another adapter, another version of the same adapter, another prompt text or other settings:

- an adapter the file already holds (same path, same content) keeps the id it has there, and its rows are reused;
- a new adapter whose name is taken in the file by another adapter gets a longer id made of its parent
  folders' names (``ckpt-200/adapter`` -> ``ckpt-200-adapter``), so checkpoints can be appended one at a time;
- an adapter whose files changed since its rows were written, a prompt whose text changed, or other settings
  are refused with :class:`ResultsFileMismatchError` before anything runs.

Adapters given as weights in memory (:class:`~inference.AdapterWeights`) have no path: their rows record
``adapter_path: null`` and a hash of the tensors and the config, and are reused for the same id and the same hash.
The base model's rows (:data:`~inference.evaluation.inputs.BASE_MODEL_ID`) have neither.

Rows written by versions that recorded no hashes or settings are matched on the adapter's path alone and reused;
a warning says that they could not be checked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from inference._core.validation import ADAPTER_ID_PATTERN
from inference.adapters.weights import AdapterWeights
from inference.evaluation.inputs import BASE_MODEL_ID, AdapterSpec, EvalPrompt, adapter_id_for
from inference.exceptions import InvalidRequestError

__all__ = [
    "HASH_LENGTH",
    "UNRECORDED_SETTINGS",
    "Reconciled",
    "ResultsFileMismatchError",
    "adapter_hash",
    "candidate_ids",
    "first_row_per_pair",
    "prompt_hash",
    "reconcile",
    "row_filter",
    "run_settings",
    "settings_mode",
]

logger = logging.getLogger("inference.evaluation")

HASH_LENGTH = 16
"""Hex digits kept of a SHA-256 (64 bits: no accidental collision among millions of adapters)."""

UNRECORDED_SETTINGS = ("timeout", "return_token_ids")
"""Generation settings left out of a row's ``settings``: they change neither the answer nor what a row records.
``timeout`` decides only whether a request fails in time (raising it and running again, once the timed-out rows are
deleted, is how they are retried); ``return_token_ids`` asks for ids that no row records. Rows of results files that
recorded them are compared without them. (``logprobs`` stays: on Transformers asking for them changes how the
logits are processed.)"""

_CHUNK = 1 << 20
_ADAPTER_SUFFIXES = (".safetensors", ".gguf")
_BASE_MODEL_ATTRIBUTES = ("model_path", "model_name", "torch_dtype", "base_model")
_RowT = TypeVar("_RowT", bound=Mapping[str, Any])


class ResultsFileMismatchError(InvalidRequestError):
    """The results file was written for another version of an adapter, another prompt text or other settings.

    Raised before anything runs or is written; the message says which adapter, prompt or setting differs.
    Use a new output file, or the same adapters, prompts and settings, to resume.
    """


def adapter_hash(path: str | os.PathLike[str] | AdapterWeights) -> str:
    """A hash of what an adapter is made of: the first :data:`HASH_LENGTH` hex digits of a SHA-256.

    For a file (a GGUF LoRA), its bytes. For a directory, the names and bytes of its top-level
    ``adapter_config.json``, ``adapter_model.*``, ``*.safetensors`` and ``*.gguf`` files (what the backends
    load), or of every top-level file when it has none of those. Training leftovers such as ``optimizer.pt``
    are left out, so hashing costs one read of the adapter's weights: SHA-256 runs at about 0.7 GB/s per core,
    so a 40 MiB adapter takes about 60 ms, and 500 of them about 30 s spread over the cores.

    For weights in memory (:class:`~inference.AdapterWeights`), the config (as ``adapter_config.json`` would hold
    it) and each tensor's name, dtype, shape and bytes, in name order: the same values give the same hash whether
    they are torch tensors or numpy arrays, on the CPU or a GPU.

    Raises:
        InvalidRequestError: A file cannot be read.
        InvalidAdapterError: Weights in memory whose config is not a ``LoraConfig`` or a dict.
    """
    if isinstance(path, AdapterWeights):
        return _weights_hash(path)
    path = Path(path)
    digest = hashlib.sha256()
    try:
        if path.is_dir():
            files = sorted(child for child in path.iterdir() if child.is_file())
            chosen = [child for child in files if _is_adapter_file(child.name)] or files
            for child in chosen:
                digest.update(f"{child.name}\0{child.stat().st_size}\0".encode())
                _digest_file(digest, child)
        else:
            _digest_file(digest, path)
    except OSError as error:
        raise InvalidRequestError(
            f"cannot read adapter {path} to hash it: {error.strerror or error}", path=str(path)
        ) from error
    return digest.hexdigest()[:HASH_LENGTH]


def _weights_hash(weights: AdapterWeights) -> str:
    digest = hashlib.sha256()
    config = json.dumps(weights.config_dict(), sort_keys=True, ensure_ascii=False, default=str)
    digest.update(f"config\0{config}\0".encode())
    tensors = weights.tensors
    for name in sorted(tensors, key=str):
        dtype, shape, data = _tensor_bytes(tensors[name])
        digest.update(f"{name}\0{dtype}\0{shape}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:HASH_LENGTH]


def _tensor_bytes(tensor: Any) -> tuple[str, tuple[int, ...], Any]:
    """A tensor's dtype name (``float32``, ``bfloat16``), shape and raw bytes (a buffer), copied to the CPU."""
    if type(tensor).__module__.startswith("torch"):
        import torch  # the tensor is a torch tensor: torch is imported already

        plain = tensor.detach().to("cpu").contiguous()
        shape = tuple(int(size) for size in plain.shape)
        dtype = str(plain.dtype).removeprefix("torch.")
        return dtype, shape, plain.reshape(-1).view(torch.uint8).numpy()
    import numpy as np  # an AdapterWeights' tensors are torch tensors or numpy arrays

    array = np.ascontiguousarray(tensor)
    return array.dtype.name, tuple(int(size) for size in array.shape), array.reshape(-1).view(np.uint8)


def _is_adapter_file(name: str) -> bool:
    return name == "adapter_config.json" or name.startswith("adapter_model.") or name.endswith(_ADAPTER_SUFFIXES)


def _digest_file(digest: Any, path: Path) -> None:
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)


def prompt_hash(prompt: EvalPrompt) -> str:
    """A hash of a prompt's text, system prompt, expected answer, and choices with the answer (not its id)."""
    parts: list[Any] = [prompt.prompt, prompt.system_prompt, prompt.expected]
    if prompt.choices is not None:  # absent before multiple choice existed: older files keep their hashes
        parts += [list(prompt.choices), prompt.answer]
    text = json.dumps(parts, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_LENGTH]


def run_settings(
    provider: Any, generation: Mapping[str, Any], scorer: object, *, mode: str = "generate"
) -> dict[str, Any]:
    """What, besides the adapter and the prompt, decides a row: provider, base model, generation settings, scorer,
    and the mode.

    The base model is what the provider object says it serves (``model_path`` for llama.cpp,
    ``model_name`` and ``torch_dtype`` for Transformers, ``base_model`` for Ollama; the server model name
    is the ``model`` generation setting). Connection settings (URL, timeouts) are left out: the same model
    behind another address gives the same rows; so are the generation settings of :data:`UNRECORDED_SETTINGS`
    (``timeout``, ``return_token_ids``). ``generation`` is as
    :func:`~inference.evaluation.runner.generation_settings` returns it (checked and normalised, ``stop`` a
    tuple); a score-only run has only ``model``. Values are as JSON stores them, so they compare equal to what a
    results file holds. ``mode`` is recorded only for score-only runs (``"mode": "score"``): rows of generating
    runs, from before the mode existed or not, have no such key and stay comparable.
    """
    base: dict[str, Any] = {}
    for attribute in _BASE_MODEL_ATTRIBUTES:
        value = getattr(provider, attribute, None)
        if value is None or value == "":
            continue
        if isinstance(value, (str, os.PathLike)) and attribute in ("model_path", "model_name"):
            value = os.path.abspath(value) if Path(value).exists() else os.fspath(value)
        base[attribute] = value
    settings: dict[str, Any] = {"provider": str(getattr(provider, "name", type(provider).__name__)), "base_model": base}
    settings.update({key: value for key, value in generation.items() if key not in UNRECORDED_SETTINGS})
    settings["scorer"] = _scorer_name(scorer)
    if mode != "generate":
        settings["mode"] = mode
    normalised: dict[str, Any] = json.loads(json.dumps(settings, default=str))
    return normalised


def _scorer_name(scorer: object) -> str | None:
    if scorer is None or isinstance(scorer, str):
        return scorer
    module = getattr(scorer, "__module__", None) or "?"
    name = getattr(scorer, "__qualname__", None) or type(scorer).__qualname__
    return f"{module}:{name}"


def candidate_ids(path: str | os.PathLike[str], preferred: str | None = None) -> list[str]:
    """Readable adapter ids for ``path``, shortest first: ``preferred``, then parent folders' names prefixed.

    Example:
        >>> candidate_ids("/runs/ckpt-200/adapter")
        ['adapter', 'ckpt-200-adapter', 'runs-ckpt-200-adapter']
    """
    path = Path(os.path.abspath(path))
    candidate = adapter_id_for(path)
    found = [preferred] if preferred else []
    for parent in [None, *(parent for parent in path.parents if parent.name)]:
        if parent is not None:
            candidate = f"{adapter_id_for(parent.name)}-{candidate}"
        shortened = _shorten(candidate)
        if shortened not in found:
            found.append(shortened)
    return found


def _shorten(candidate: str) -> str:
    """Keep an id within 128 characters, cutting from the left (the adapter's own name stays)."""
    if len(candidate) <= 128:
        return candidate
    cut = candidate[-128:].lstrip("._-")
    return cut if ADAPTER_ID_PATTERN.fullmatch(cut) else adapter_id_for(cut)


def first_row_per_pair(rows: Iterable[_RowT]) -> list[_RowT]:
    """The first row of each (adapter id, prompt id) pair, in file order: a pair is counted once.

    A file can hold a pair twice when two runs wrote it at once (before results files were locked); the
    first row is the one resumption found first, so it is the one summarised and reused.
    """
    seen: set[tuple[str, str]] = set()
    unique: list[_RowT] = []
    for row in rows:
        pair = (str(row["adapter_id"]), str(row["prompt_id"]))
        if pair not in seen:
            seen.add(pair)
            unique.append(row)
    return unique


@dataclass(frozen=True)
class Reconciled:
    """The outcome of :func:`reconcile`.

    Attributes:
        specs: The adapters with their final ids (and absolute paths), in run order.
        reused: The rows of the file that answer a pair of this run (they are not asked again), one per pair.
        legacy_rows: Rows of the file written without hashes or settings (reused unchecked).
        belongs: Whether a row answers one of ``specs`` (its id, its path, and its content hash where it
            has one); the summary counts only those rows.
    """

    specs: tuple[AdapterSpec, ...]
    reused: tuple[dict[str, Any], ...]
    legacy_rows: int
    belongs: Callable[[Mapping[str, Any]], bool]


@dataclass
class _Known:
    """What the results file says about one adapter id."""

    paths: set[str]
    hashes: set[str]

    def path(self) -> str | None:
        return next(iter(self.paths)) if len(self.paths) == 1 else None


def reconcile(
    specs: Sequence[AdapterSpec],
    hashes: Sequence[str | None],
    prompts: Sequence[EvalPrompt],
    settings: Mapping[str, Any],
    rows: Iterable[dict[str, Any]],
    *,
    output: str | os.PathLike[str],
    explicit_ids: bool,
) -> Reconciled:
    """Check a results file against a run and give each adapter its id in that file.

    Args:
        specs: The run's adapters (ids unique within the run): paths, weights in memory (``path`` ``None``; their
            ids are kept), and the base model (:data:`~inference.evaluation.inputs.BASE_MODEL_ID`).
        hashes: :func:`adapter_hash` of each spec, in the same order (``None`` for the base model).
        prompts: The run's prompts.
        settings: :func:`run_settings` of the run.
        rows: The complete rows already in the file.
        output: The file, for messages.
        explicit_ids: The caller chose the ids (``AdapterSpec`` objects): they are never changed, and one
            the file holds for another adapter is refused.

    Raises:
        ResultsFileMismatchError: The file holds rows made with other settings, for another text of one of
            the prompts, or for another version (other content at the same path) of one of the adapters, or
            (with ``explicit_ids``) an id of the run names another adapter in the file.
    """
    rows = list(rows)
    legacy = [row for row in rows if "adapter_hash" not in row]
    _check_settings(rows, settings, output)
    _check_prompts(rows, prompts, output)
    known = _known_adapters(rows)
    paths = [None if spec.path is None else os.path.abspath(spec.path) for spec in specs]
    ids: list[str | None] = [None] * len(specs)
    for index, spec in enumerate(specs):
        path, content = paths[index], hashes[index]
        if spec.id == BASE_MODEL_ID:
            ids[index] = spec.id
        elif path is None or content is None:  # weights in memory: the id is the caller's, or their hash's
            _check_weights(spec.id, str(content), known.get(spec.id), output)
            ids[index] = spec.id
        elif explicit_ids:
            _check_explicit(spec.id, path, content, known.get(spec.id), output)
            ids[index] = spec.id
        else:
            ids[index] = _known_id(spec.id, path, content, known, output)
    taken = set(known) | {adapter_id for adapter_id in ids if adapter_id is not None}
    for index, spec in enumerate(specs):
        if ids[index] is None:
            ids[index] = _free_id(candidate_ids(str(paths[index]), spec.id), taken)
            taken.add(str(ids[index]))
    final = tuple(
        replace(spec, id=str(adapter_id), path=None if path is None else Path(path))
        for spec, adapter_id, path in zip(specs, ids, paths, strict=True)
    )
    belongs = row_filter(final, hashes)
    wanted = {prompt.id for prompt in prompts}
    reused = tuple(first_row_per_pair(row for row in rows if str(row.get("prompt_id")) in wanted and belongs(row)))
    if legacy:
        logger.warning(
            "%d rows of %s were written by an older version that recorded no adapter hash, prompt hash or "
            "settings: rows whose adapter path matches are reused unchecked; if the adapters, prompts or "
            "generation settings changed since, write to a new output file",
            len(legacy),
            output,
        )
    return Reconciled(specs=final, reused=reused, legacy_rows=len(legacy), belongs=belongs)


def _check_settings(rows: list[dict[str, Any]], settings: Mapping[str, Any], output: str | os.PathLike[str]) -> None:
    for row in rows:
        stored = row.get("settings")
        if isinstance(stored, Mapping):  # older files recorded a timeout: any timeout resumes them
            stored = {key: value for key, value in stored.items() if key not in UNRECORDED_SETTINGS}
        if isinstance(stored, Mapping) and stored != dict(settings):
            raise ResultsFileMismatchError(
                f"{output} holds rows made with other settings ({_differences(stored, settings)}): a results file "
                "holds one experiment, so write to a new output file, or run with the settings of the file to "
                "resume it",
                path=os.fspath(output),
            )


def settings_mode(settings: Mapping[str, Any]) -> str:
    """The mode a row's ``settings`` record: ``"score"``, or ``"generate"`` where none is recorded."""
    return str(settings.get("mode") or "generate")


def _differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    def value(settings: Mapping[str, Any], key: str) -> Any:
        return settings_mode(settings) if key == "mode" else settings.get(key)

    keys = [key for key in {**stored, **current} if value(stored, key) != value(current, key)]
    return "; ".join(
        f"{key} was {json.dumps(value(stored, key))}, now {json.dumps(value(current, key))}" for key in keys
    )


def _check_prompts(rows: list[dict[str, Any]], prompts: Sequence[EvalPrompt], output: str | os.PathLike[str]) -> None:
    current = {prompt.id: prompt_hash(prompt) for prompt in prompts}
    for row in rows:
        prompt_id, stored = str(row.get("prompt_id")), row.get("prompt_hash")
        if stored is not None and prompt_id in current and stored != current[prompt_id]:
            raise ResultsFileMismatchError(
                f"prompt {prompt_id!r} has another text, system prompt or expected answer than when its rows were "
                f"written to {output}: write to a new output file, or give each changed prompt a new id",
                path=os.fspath(output),
            )


def _known_adapters(rows: list[dict[str, Any]]) -> dict[str, _Known]:
    known: dict[str, _Known] = {}
    for row in rows:
        entry = known.setdefault(str(row["adapter_id"]), _Known(set(), set()))
        if row.get("adapter_path") is not None:
            entry.paths.add(os.path.realpath(str(row["adapter_path"])))
        if row.get("adapter_hash") is not None:
            entry.hashes.add(str(row["adapter_hash"]))
    return known


def _known_id(
    preferred: str, path: str, content: str, known: Mapping[str, _Known], output: str | os.PathLike[str]
) -> str | None:
    """The id the file holds this adapter under (same path; same content where recorded), or ``None``."""
    real = os.path.realpath(path)
    matches = sorted((adapter_id for adapter_id, entry in known.items() if entry.path() == real), key=len)
    matches.sort(key=lambda adapter_id: adapter_id != preferred)
    for adapter_id in matches:
        stored = known[adapter_id].hashes
        if stored and stored != {content}:
            raise ResultsFileMismatchError(
                f"{output} holds rows of adapter {adapter_id!r} from {path} whose files have changed since "
                f"(content hash {', '.join(sorted(stored))}, now {content}): write to a new output file to "
                f"evaluate the new version, or delete the rows of {adapter_id!r} from {output} to replace them",
                path=path,
            )
        return adapter_id
    return None


def _check_weights(adapter_id: str, content: str, entry: _Known | None, output: str | os.PathLike[str]) -> None:
    """Weights in memory reuse the rows of their id only when those were made from the same weights (hash)."""
    if entry is None:
        return
    if entry.paths:
        raise ResultsFileMismatchError(
            f"adapter id {adapter_id!r} names {', '.join(sorted(entry.paths))} in {output}, not weights in memory: "
            "choose another id for these weights, or write to a new output file",
            path=os.fspath(output),
        )
    if entry.hashes and entry.hashes != {content}:
        raise ResultsFileMismatchError(
            f"{output} holds rows of adapter {adapter_id!r} made from other weights (content hash "
            f"{', '.join(sorted(entry.hashes))}, now {content}): give these weights another id, or write to a new "
            "output file",
            path=os.fspath(output),
        )


def _check_explicit(
    adapter_id: str, path: str, content: str, entry: _Known | None, output: str | os.PathLike[str]
) -> None:
    if entry is None:
        return
    if entry.path() != os.path.realpath(path):
        where = ", ".join(sorted(entry.paths)) or ("weights in memory" if entry.hashes else "an unknown path")
        raise ResultsFileMismatchError(
            f"adapter id {adapter_id!r} names {where} in {output}, not {path}: choose another id for this "
            "adapter, or write to a new output file",
            path=path,
        )
    _known_id(adapter_id, path, content, {adapter_id: entry}, output)


def _free_id(candidates: list[str], taken: set[str]) -> str:
    for candidate in candidates:
        if candidate not in taken:
            return candidate
    base = candidates[0][:120]
    counter = 2
    while f"{base}-{counter}" in taken:
        counter += 1
    return f"{base}-{counter}"


def row_filter(
    specs: Sequence[AdapterSpec], hashes: Sequence[str | None]
) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a row answers one of ``specs`` (with their final ids), whose content hashes are ``hashes``: its id, its
    path, and its hash where it has one (weights in memory: no path, the same hash; the base model: no path, no
    hash)."""
    expected = {
        spec.id: (None if spec.path is None else os.path.realpath(spec.path), content)
        for spec, content in zip(specs, hashes, strict=True)
    }

    def belongs(row: Mapping[str, Any]) -> bool:
        identity = expected.get(str(row.get("adapter_id")))
        if identity is None:
            return False
        if identity[0] is None:
            return row.get("adapter_path") is None and row.get("adapter_hash") == identity[1]
        if row.get("adapter_path") is None:
            return False
        if os.path.realpath(str(row["adapter_path"])) != identity[0]:
            return False
        stored = row.get("adapter_hash")
        return stored is None or stored == identity[1]

    return belongs
