"""Ollama adapters as derived models: names, blob uploads, ``/api/create``, ``/api/delete``, ``/api/tags``.

Ollama has no runtime adapter loading: a LoRA exists only baked into a model created ``FROM`` a base model.
This module does that work for :class:`~inference.ollama_provider.OllamaProvider`:

- :func:`derived_model_name` names the model ``inference-lora/<encoded adapter id>:<base digest>``, and the
  weights of a replaced id (backend name ``id@n``) ``inference-lora/<encoded id>_.replaced-<n>:<base digest>``,
  a name no id's model can take. The namespace is reserved for the SDK, so a derived model never collides with
  a user's model, and the name decodes back to the adapter id and its replacement number
  (:func:`parse_derived_model_name`), so ``/api/tags`` tells a new process which adapters exist.
- :meth:`OllamaModels.adapter_files` turns what the user gave (a GGUF LoRA file, or a PEFT directory) into
  the files Ollama takes for that base: PEFT safetensors as they are for ``llama``/``gemma2`` bases (Ollama
  converts those itself), else a GGUF LoRA converted here against the base's layout from ``/api/show``.
- :meth:`OllamaModels.upload_blob` sends each file once by SHA-256 digest (``HEAD`` first), streamed from disk.
- :meth:`OllamaModels.create` posts ``/api/create`` and reads its NDJSON status lines up to ``success``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from inference._core.backend_names import default_versioned_name, parse_versioned_name
from inference._servers.http import ServerAnswer, ServerClient
from inference.exceptions import (
    AdapterConversionError,
    InvalidAdapterError,
    InvalidRequestError,
    ServerInvalidAdapterError,
    ServerModelNotFoundError,
    ServerResponseError,
)

__all__ = [
    "DERIVED_NAMESPACE",
    "OLLAMA_SAFETENSORS_ARCHITECTURES",
    "AdapterFile",
    "DerivedName",
    "OllamaModels",
    "base_model_digest",
    "derived_model_name",
    "parse_derived_model_name",
]

DERIVED_NAMESPACE = "inference-lora"
"""The Ollama namespace of every model the SDK derives from a base model with an adapter."""

OLLAMA_SAFETENSORS_ARCHITECTURES = frozenset({"llama", "gemma2"})
"""Base architectures for which Ollama converts a PEFT safetensors adapter itself (``convert.ConvertAdapter``)."""

_NAME_PART_MAX = 80  # Ollama's limit for the namespace, model and tag parts of a name
_REPLACED = "_.replaced-"  # '_' then '.' is never in an encoded id ('_' is written '__'): no id ends this way
_MODEL_PART = re.compile(r"((?:[a-z0-9.-]|_[a-z_])+)(?:_\.replaced-([1-9][0-9]*))?")
_CHUNK = 1 << 20
_DEFAULT_PREFIXES = ("registry.ollama.ai/library/", "library/")


def encode_adapter_id(adapter_id: str) -> str:
    """The model part of a derived name: lowercase, reversible, unique even though Ollama ignores case.

    ``_`` becomes ``__`` and an uppercase letter ``X`` becomes ``_x``; everything else an adapter id may
    hold (lowercase letters, digits, ``.``, ``-``) stays.
    """
    return re.sub(r"[A-Z_]", lambda match: "__" if match[0] == "_" else "_" + match[0].lower(), adapter_id)


def decode_adapter_id(model_part: str) -> str | None:
    """Invert :func:`encode_adapter_id`; ``None`` for a name the SDK did not make."""
    if not re.fullmatch(r"(?:[a-z0-9.-]|_[a-z_])+", model_part):
        return None
    return re.sub(r"_([a-z_])", lambda match: "_" if match[1] == "_" else match[1].upper(), model_part)


class DerivedName(NamedTuple):
    """What the name of a derived model says (:func:`parse_derived_model_name`).

    Attributes:
        adapter_id: The id of the adapter it holds.
        base_digest: The tag: the digest of the base model's name (:func:`base_model_digest`).
        version: 1 for the model of the id itself, ``n`` for the weights it was replaced with under the backend
            name ``id@n``.
    """

    adapter_id: str
    base_digest: str
    version: int

    @property
    def backend_name(self) -> str:
        """The name the adapter registry knows these weights by: the id, or ``id@n``."""
        return self.adapter_id if self.version == 1 else default_versioned_name(self.adapter_id, self.version)


def base_model_digest(base_model: str) -> str:
    """Twelve hex digits naming a base model (``llama3.2`` and ``llama3.2:latest`` give the same)."""
    canonical = base_model.strip().lower()
    for prefix in _DEFAULT_PREFIXES:
        if canonical.startswith(prefix):
            canonical = canonical[len(prefix) :]
    if canonical.rfind(":") <= canonical.rfind("/"):
        canonical += ":latest"
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def derived_model_name(adapter_id: str, base_model: str, *, provider: str = "ollama") -> str:
    """The Ollama model that holds ``adapter_id`` on ``base_model``: ``inference-lora/<id>:<base digest>``.

    ``adapter_id`` may be the backend name ``id@n`` of a replaced id's weights: their model is
    ``inference-lora/<id>_.replaced-<n>:<base digest>``.

    Example:
        >>> derived_model_name("Support_v2", "llama3.2")
        'inference-lora/_support__v2:17177962e713'
        >>> derived_model_name("Support_v2@3", "llama3.2")
        'inference-lora/_support__v2_.replaced-3:17177962e713'

    Raises:
        InvalidRequestError: The encoded id is longer than Ollama's 80 characters for a model name.
    """
    versioned = parse_versioned_name(adapter_id)
    if versioned is None:
        model_part = encode_adapter_id(adapter_id)
    else:
        adapter_id, version = versioned
        model_part = f"{encode_adapter_id(adapter_id)}{_REPLACED}{version}"
    if len(model_part) > _NAME_PART_MAX:
        raise InvalidRequestError(
            f"adapter id {adapter_id!r} is too long for an Ollama model name ({len(model_part)} characters once "
            f"encoded{' with its replacement number' if versioned else ''}, at most {_NAME_PART_MAX}; each "
            "uppercase letter and '_' takes two): use a shorter id",
            provider=provider,
        )
    return f"{DERIVED_NAMESPACE}/{model_part}:{base_model_digest(base_model)}"


def parse_derived_model_name(name: str) -> DerivedName | None:
    """``(adapter id, base digest, version)`` of a derived model's name, or ``None`` for any other model."""
    for prefix in ("registry.ollama.ai/",):
        if name.lower().startswith(prefix):
            name = name[len(prefix) :]
    namespace, slash, rest = name.partition("/")
    if not slash or namespace.lower() != DERIVED_NAMESPACE:
        return None
    model_part, _, tag = rest.partition(":")
    parts = _MODEL_PART.fullmatch(model_part)
    adapter_id = decode_adapter_id(parts[1]) if parts is not None else None
    if parts is None or adapter_id is None or parts[2] == "1":
        return None
    return DerivedName(adapter_id, tag or "latest", int(parts[2] or 1))


@dataclass(frozen=True)
class AdapterFile:
    """One file of an adapter as Ollama receives it.

    Attributes:
        name: The file name in ``/api/create``'s ``adapters`` map (``adapter_model.safetensors``, ``x.gguf``).
        path: Where it is on this machine.
    """

    name: str
    path: Path


@dataclass(frozen=True)
class BaseModelInfo:
    """What ``POST /api/show`` says about a base model (non-verbose: large metadata arrays are left out).

    Attributes:
        name: The base model's name.
        architecture: ``model_info["general.architecture"]``.
        model_info: The GGUF metadata Ollama reports.
        tensors: Tensor name -> dimensions in GGUF order (Ollama 0.6.1 and later report them).
    """

    name: str
    architecture: str
    model_info: Mapping[str, Any]
    tensors: Mapping[str, Any]


class _FileBody:
    """A request body read from a file in chunks off the event loop; iterable again when a retry resends it."""

    def __init__(self, path: Path) -> None:
        self._path = path

    async def __aiter__(self) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(open, self._path, "rb")
        try:
            while chunk := await asyncio.to_thread(handle.read, _CHUNK):
                yield chunk
        finally:
            handle.close()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class OllamaModels:
    """The Ollama routes behind the adapter lifecycle, on the provider's :class:`~inference._servers.http.ServerClient`.

    Args:
        http: The provider's HTTP client (pooling, retries, error mapping).
        native_url: Ollama's root URL (without ``/v1``).
        cache_dir: Where PEFT adapters converted to GGUF are kept.
    """

    def __init__(self, http: ServerClient, native_url: str, cache_dir: Path) -> None:
        self._http = http
        self._native_url = native_url
        self._cache_dir = cache_dir
        self._provider = http.provider

    # Requests ------------------------------------------------------------------------------------------

    async def show(self, model: str) -> BaseModelInfo:
        """``POST /api/show`` for ``model`` (404: the model is not pulled)."""
        operation = f"show model {model!r}"
        response = await self._http.request(
            "POST",
            f"{self._native_url}/api/show",
            operation=operation,
            json_body={"model": model},
            handlers={404: lambda answer: self._base_missing(answer, model)},
        )
        body = self._http.parse_json(response, operation=operation)
        model_info = body.get("model_info") if isinstance(body, dict) else None
        architecture = model_info.get("general.architecture") if isinstance(model_info, dict) else None
        if not isinstance(architecture, str) or not architecture:
            raise self._http.protocol_error(operation, "an answer without model_info['general.architecture']")
        assert isinstance(model_info, dict)
        tensors: dict[str, Any] = {}
        listed = body.get("tensors") or []
        if not isinstance(listed, list):
            raise self._http.protocol_error(operation, "an answer whose tensors are not a list")
        for tensor in listed:
            if isinstance(tensor, dict) and isinstance(tensor.get("name"), str):
                tensors[tensor["name"]] = tensor.get("shape")  # checked by layout_from_metadata
        return BaseModelInfo(name=model, architecture=architecture, model_info=model_info, tensors=tensors)

    def _base_missing(self, answer: ServerAnswer, model: str) -> ServerResponseError | None:
        if answer.route_missing:
            return None
        return answer.error(
            ServerModelNotFoundError,
            f"{answer.where} has no base model {model!r} to apply adapters to ({answer.message}): run "
            f"`ollama pull {model}` on the server, or choose another base (base_model= or OLLAMA_BASE_MODEL)",
        )

    async def tags(self) -> list[str]:
        """Names of every model on the server (``GET /api/tags``)."""
        operation = "list models"
        response = await self._http.request("GET", f"{self._native_url}/api/tags", operation=operation)
        body = self._http.parse_json(response, operation=operation)
        models = body.get("models") if isinstance(body, dict) else None
        if not isinstance(models, list):
            raise self._http.protocol_error(operation, "an answer without a models list")
        names = []
        for entry in models:
            name = entry.get("name") or entry.get("model") if isinstance(entry, dict) else None
            if isinstance(name, str):
                names.append(name)
        return names

    async def upload_blob(self, file: AdapterFile) -> str:
        """Make sure the server holds ``file`` as a blob; return its digest (``sha256:<hex>``).

        ``HEAD /api/blobs/<digest>`` first: 200 means the server has it and nothing is sent. Otherwise the
        bytes are streamed from disk with ``POST`` (201).
        """
        try:
            size = file.path.stat().st_size
            digest = "sha256:" + await asyncio.to_thread(_sha256_file, file.path)
        except OSError as error:
            raise InvalidAdapterError(
                f"adapter file {file.path} cannot be read ({error})", provider=self._provider, path=str(file.path)
            ) from error
        url = f"{self._native_url}/api/blobs/{digest}"
        operation = f"check for blob {digest} ({file.name})"
        head = await self._http.request("HEAD", url, operation=operation, ok_statuses=frozenset({404}))
        if head.status_code == 200:
            return digest
        await self._http.request(
            "POST",
            url,
            operation=f"upload {file.path} as blob {digest}",
            content=_FileBody(file.path),
            headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
        )
        return digest

    async def create(self, name: str, base_model: str, adapters: Mapping[str, str], *, adapter_id: str) -> None:
        """``POST /api/create`` the derived model and read its status lines until ``{"status": "success"}``.

        Raises:
            ServerInvalidAdapterError: Ollama refused to build the model (an ``{"error": ...}`` line or a
                400 answer), with Ollama's sentence.
        """
        operation = f"create model {name!r} from {base_model!r} with adapter {adapter_id!r}"
        body = {"model": name, "from": base_model, "adapters": dict(adapters)}

        def refused(sentence: str, response: httpx.Response) -> ServerInvalidAdapterError:
            return ServerInvalidAdapterError(
                f"{self._http.where} could not create {name!r} from {base_model!r} with adapter {adapter_id!r}: "
                f"{sentence}. Check that the adapter was trained for {base_model!r}, or load a GGUF LoRA made "
                "for it (`inference convert-adapter`)",
                request=response.request,
                response=response,
                provider=self._provider,
                url=self._http.shown_url,
            )

        def on_error_status(answer: ServerAnswer) -> ServerResponseError | None:
            return None if answer.route_missing else refused(answer.message, answer.response)

        async with self._http.stream_json_lines(
            "POST",
            f"{self._native_url}/api/create",
            operation=operation,
            json_body=body,
            handlers={400: on_error_status, 404: on_error_status},
            error_line=refused,
        ) as statuses:
            async for status in statuses:
                if not isinstance(status, dict):
                    problem = f"a status line that is not an object: {json.dumps(status)[:200]}"
                    raise self._http.protocol_error(operation, problem)
                if status.get("status") == "success":
                    return
        raise self._http.protocol_error(operation, 'status lines that ended without {"status": "success"}')

    async def delete(self, name: str) -> bool:
        """``DELETE /api/delete`` the model; ``False`` when the server did not have it (404)."""
        response = await self._http.request(
            "DELETE",
            f"{self._native_url}/api/delete",
            operation=f"delete model {name!r}",
            json_body={"model": name},
            ok_statuses=frozenset({404}),
        )
        return response.status_code != 404

    # Adapter files ---------------------------------------------------------------------------------------

    async def check_adapter(self, adapter_path: str) -> None:
        """What can be refused of the adapter at ``adapter_path`` before the server is asked anything: nothing
        there, or a PEFT directory the one checker refuses (:func:`~inference.adapters.peft.read_peft_adapter`).

        Raises:
            InvalidAdapterError: Nothing at the path, or a PEFT directory that is not a servable LoRA.
        """
        from inference.adapters.peft import read_peft_adapter

        path = Path(adapter_path)
        if not path.exists():
            raise InvalidAdapterError(
                f"no adapter at {path}: give a GGUF LoRA file or a PEFT adapter directory on this machine "
                "(the provider uploads it to Ollama)",
                provider=self._provider,
                path=str(path),
            )
        if path.is_dir():
            await asyncio.to_thread(read_peft_adapter, path, provider=self._provider)

    async def adapter_files(
        self, adapter_path: str, base: BaseModelInfo, *, cache_dir: Path | None = None
    ) -> list[AdapterFile]:
        """The files Ollama should receive for the adapter at ``adapter_path`` on ``base``; a conversion is kept in
        ``cache_dir`` (default: the cache given at construction).

        - A file: must be a GGUF LoRA for the base's architecture; sent as it is.
        - A PEFT directory: ``adapter_config.json`` + ``adapter_model.safetensors`` when the base is ``llama``
          or ``gemma2`` (Ollama converts those); else converted here to a GGUF LoRA for the base's tensor
          layout (cached by content), which Ollama applies to any architecture.

        Raises:
            InvalidAdapterError: Nothing usable at the path, or a GGUF LoRA for another architecture.
            AdapterConversionError: The PEFT adapter does not fit the base model.
        """
        from inference.adapters.peft import read_peft_adapter

        path = Path(adapter_path)
        if path.is_file():
            return [await self._gguf_file(path, base)]
        await self.check_adapter(adapter_path)
        adapter = await asyncio.to_thread(read_peft_adapter, path, provider=self._provider)
        if base.architecture in OLLAMA_SAFETENSORS_ARCHITECTURES and adapter.weights_path.suffix == ".safetensors":
            return [
                AdapterFile("adapter_config.json", adapter.path / "adapter_config.json"),
                AdapterFile("adapter_model.safetensors", adapter.weights_path),
            ]
        converted = await asyncio.to_thread(self._convert, path, base, cache_dir or self._cache_dir)
        return [AdapterFile(converted.name, converted)]

    async def _gguf_file(self, path: Path, base: BaseModelInfo) -> AdapterFile:
        from inference.adapters.gguf import read_lora_gguf_architecture

        architecture = await asyncio.to_thread(read_lora_gguf_architecture, path, provider=self._provider)
        if architecture != base.architecture:
            raise InvalidAdapterError(
                f"GGUF LoRA {path} is for the {architecture} architecture but base model {base.name!r} is "
                f"{base.architecture}: use an adapter trained for {base.name!r}, or pass base_model=",
                provider=self._provider,
                path=str(path),
            )
        name = path.name if path.suffix == ".gguf" else f"{path.name}.gguf"
        return AdapterFile(name, path)

    def _convert(self, peft_dir: Path, base: BaseModelInfo, cache_dir: Path) -> Path:
        """Convert a PEFT directory to a GGUF LoRA for ``base`` into ``cache_dir`` (blocking; run it in a thread)."""
        from inference.adapters.gguf import convert_peft_to_gguf_for_layout_cached, layout_from_metadata

        if not base.tensors:
            raise AdapterConversionError(
                f"{self._http.where} did not report the tensors of base model {base.name!r} ({base.architecture}), "
                "which converting a PEFT adapter for it needs (Ollama reports them from version 0.6.1): upgrade "
                "Ollama, or convert the adapter yourself with `inference convert-adapter` against the base "
                "model's GGUF file and load the .gguf",
                provider=self._provider,
                path=str(peft_dir),
            )
        layout = layout_from_metadata(base.name, base.model_info, base.tensors, provider=self._provider)
        return convert_peft_to_gguf_for_layout_cached(peft_dir, layout, cache_dir, provider=self._provider)


def default_cache_dir() -> Path:
    """``~/.cache/inference-adapters``, shared with the llama.cpp provider's converted adapters."""
    return Path(os.path.expanduser("~")) / ".cache" / "inference-adapters"
