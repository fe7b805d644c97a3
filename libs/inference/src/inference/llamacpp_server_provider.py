"""llama.cpp's own server (``llama-server``): the ``llamacpp-server`` provider.

llama-server loads its LoRA adapters at start (``--lora FILE``, repeatable) and cannot take more while it runs; a
request chooses among them with its ``lora`` field. So ``load_adapter`` here does not send weights anywhere: it finds
the adapter among those the server has (by path, or by content), records the id, and tells you the ``--lora`` flag
to add when the server lacks it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference._core.paths import expand_path, path_identity
from inference._core.validation import GenerationRequest
from inference._servers.openai_compatible import CHAT, COMPLETIONS, OpenAICompatibleProvider, Replica
from inference.adapters.gguf import convert_peft_to_gguf_cached
from inference.exceptions import AdapterNotFoundError, InvalidAdapterError

__all__ = ["LlamaCppServerProvider", "ServedAdapter"]

_LORA_HINT = "--lora-init-without-apply"

FALLBACK_TEMPLATE = (
    "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n'"
    " -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\n' -}}\n{%- endif -%}"
)
"""The ChatML template llama-server reports (and uses) for a model whose GGUF has none."""

SERVED_TTL_SECONDS = 1.0
"""How long a reading of a server's ``GET /lora-adapters`` is used before it is read again."""


@dataclass(frozen=True)
class ServedAdapter:
    """One adapter a llama-server loaded at start (``GET /lora-adapters``).

    Attributes:
        index: Its id on the server (the order of the ``--lora`` flags).
        path: The file as the server names it (relative to the server's working directory when given so).
        name: The file name without ``.gguf``: the id it is listed under until you load it under another.
    """

    index: int
    path: str
    name: str


class LlamaCppServerProvider(OpenAICompatibleProvider):
    """Generates through llama.cpp's ``llama-server``, choosing a preloaded LoRA adapter per request.

    Start the server with every adapter you will use, not applied by default::

        llama-server -m base.gguf --lora adapters/math.gguf --lora adapters/style.gguf --lora-init-without-apply

    Then ``load_adapter("math", "adapters/math.gguf")`` finds the file among the server's adapters (the same path,
    or a file with the same bytes) and records the id; a PEFT directory is converted here
    (:func:`~inference.adapters.gguf.convert_peft_to_gguf_cached`, on the server's base model when its file is
    readable from this machine) and matched by content, which is what ``inference convert-adapter`` wrote for the
    server. An adapter the server does not have is an :class:`~inference.exceptions.InvalidAdapterError` that
    prints the ``--lora`` flag to add. ``unload_adapter`` forgets the id (the server keeps the file).

    Every generation sends the server's whole adapter list in its ``lora`` field: scale 1 for the adapter asked for
    (or each adapter's own scale, for ``adapter_id=[("math", 1.0), ("style", 0.5)]``), 0 for the others (all 0 for
    the base model), so a server started without ``--lora-init-without-apply`` still
    answers each request with exactly its adapter. On a server with adapters, ``cache_prompt`` is turned off:
    llama-server reuses a slot's cached prompt across requests for different adapters (llama.cpp#26207), which
    silently mixes the previous request's adapter into the answer. Requests for different adapters may run at once
    (in different slots). ``list_adapters`` lists the ids you loaded and, under their file names, the other
    adapters the server has; such a file name can be used as an ``adapter_id`` without ``load_adapter``.

    Generation goes to ``/v1/chat/completions`` (the server renders its model's chat template), or, for a model
    without a chat template, to ``/v1/completions`` with the plain text (the system prompt, a blank line, the
    prompt), as the in-process llama.cpp provider does; the server's ``GET /props`` tells which, once.
    ``logprobs`` and ``json_schema`` work as on the other OpenAI-compatible servers. llama-server has no prompt
    log-probabilities, so this provider does not score (``supports_scoring`` is false).

    Args:
        base_url: The server's URL (``http://HOST:PORT``, with or without ``/v1``), or several (replicas started
            with the same adapters); else ``LLAMACPP_SERVER_BASE_URL``; else ``http://localhost:8080``.
        api_key: The server's ``--api-key``; else ``LLAMACPP_SERVER_API_KEY``. Never shown.
        timeout: Seconds to wait for one answer; else ``LLAMACPP_SERVER_TIMEOUT``; else 120.
        max_retries: Retries of connect errors and 429/502/503/504; else ``LLAMACPP_SERVER_MAX_RETRIES``; else 2.
        adapter_cache_dir: Where PEFT directories are converted to GGUF for matching; else
            ``LLAMACPP_SERVER_ADAPTER_CACHE_DIR``; else ``~/.cache/inference-adapters``.

    Example:
        >>> LlamaCppServerProvider(base_url="http://127.0.0.1:8080")
        LlamaCppServerProvider(base_url='http://127.0.0.1:8080', api_key=None, adapters=[])
    """

    name = "llamacpp-server"
    server_label = "llama-server"
    env_prefix = "LLAMACPP_SERVER"
    model_hint = "llama-server serves the one model it was started with (-m)"
    supports_adapters = True
    hot_swaps_adapters = True
    supports_logprobs = True
    supports_json_schema = True
    supports_adapter_scales = True

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        adapter_cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url, api_key=api_key, timeout=timeout, max_retries=max_retries,
            adapter_cache_dir=None if adapter_cache_dir is None else os.fspath(adapter_cache_dir),
        )
        for replica in self._replicas:  # the OpenAI-compatible routes, whether base_url ends with /v1 or not
            replica.urls = {CHAT: f"{replica.root}/v1/chat/completions", COMPLETIONS: f"{replica.root}/v1/completions"}
        self.adapter_cache_dir = expand_path(self._settings["adapter_cache_dir"] or "~/.cache/inference-adapters")
        self._served: dict[str, tuple[float, list[ServedAdapter]]] = {}  # replica URL -> (when read, its adapters)
        self._props: dict[str, dict[str, Any]] = {}  # replica URL -> its GET /props
        self._matched: dict[str, str] = {}  # adapter id -> the server's file path it matched

    def __repr__(self) -> str:
        key = "***" if self._api_key else "None"
        adapters = sorted(self._adapter_registry.ids())
        return f"LlamaCppServerProvider(base_url={self.base_url!r}, api_key={key}, adapters={adapters})"

    async def served_adapters(self) -> list[ServedAdapter]:
        """The adapters the (first) server loaded at start, read again from ``GET /lora-adapters``."""
        return await self._read_served(self._replicas[0])

    # Generation ---------------------------------------------------------------------------------------------

    async def _create(self, replica: Replica, request: GenerationRequest, arguments: dict[str, Any]) -> Any:
        """The request with the ``lora`` field that applies exactly the adapter asked for (or none)."""
        served = await self._served_recently(replica)
        scales: dict[int, float] = {}  # server index -> scale, for every adapter the request applies
        for adapter_id, scale in request.adapters:
            chosen = self._matched.get(adapter_id)
            index = next((entry.index for entry in served if entry.path == chosen), None)
            if index is None:
                raise AdapterNotFoundError(
                    f"{replica.http.where} no longer has adapter {adapter_id!r} ({chosen}): it was restarted "
                    f"without it; start it with --lora {chosen}",
                    provider=self.name,
                )
            scales[index] = scale
        body = {**arguments, "model": request.model}
        if served:
            body["lora"] = [{"id": entry.index, "scale": scales.get(entry.index, 0.0)} for entry in served]
            # llama-server reuses a slot's cached prompt across requests for different adapters (llama.cpp#26207):
            # the answer would be computed partly with the previous request's adapter. Off, for correctness.
            body["cache_prompt"] = False
        return await super()._create(replica, request, body)

    async def _route(self, replica: Replica, request: GenerationRequest) -> str:
        """Chat when the server's model has a chat template of its own (``GET /props``), else plain-text completions.

        For a model without one, llama-server reports (and chats with) its ChatML fallback: that template counts
        as none, so such a model reads the same text as in the in-process provider.
        """
        template = (await self._server_props(replica)).get("chat_template")
        if not isinstance(template, str) or not template.strip() or template.strip() == FALLBACK_TEMPLATE:
            return COMPLETIONS
        return CHAT

    # Adapters -----------------------------------------------------------------------------------------------

    async def _load_adapter(self, adapter_id: str, adapter_path: str) -> None:
        """Find the adapter among every replica's preloaded ones; record the server's path for it."""
        found: str | None = None
        for replica in self._replicas:
            served = await self._read_served(replica)
            match = await self._match(replica, served, adapter_path)
            if match is None:
                files = ", ".join(entry.path for entry in served) or "none"
                raise InvalidAdapterError(
                    f"{replica.http.where} has no adapter {adapter_path} (it serves: {files}). llama-server "
                    f"loads adapters only at start: restart it with --lora {self._flag_path(adapter_path)} "
                    f"(and {_LORA_HINT}, so that adapters apply only to the requests that ask for them)",
                    provider=self.name,
                    path=adapter_path,
                )
            found = match.path
        assert found is not None
        self._matched[adapter_id] = found

    async def _unload_adapter(self, adapter_id: str) -> None:
        self._matched.pop(adapter_id, None)

    async def _list_adapters(self) -> list[str]:
        served = await self._read_served(self._replicas[0])
        mapped = set(self._matched.values())
        ids = set(self._adapter_registry.ids())
        return sorted(ids | {entry.name for entry in served if entry.path not in mapped})

    async def _discover_adapter(self, adapter_id: str) -> str | None:
        """An adapter the server has under the file name ``adapter_id`` (``math`` for ``math.gguf``)."""
        served = await self._read_served(self._replicas[0])
        entry = next((entry for entry in served if entry.name == adapter_id), None)
        if entry is None:
            return None
        self._matched[adapter_id] = entry.path
        return entry.path

    async def _server_props(self, replica: Replica) -> dict[str, Any]:
        """``GET /props`` of the replica, read once (the chat template, the model's path)."""
        props = self._props.get(replica.base_url)
        if props is None:
            operation = "read the server's properties"
            response = await replica.http.request("GET", f"{replica.root}/props", operation=operation)
            body = replica.http.parse_json(response, operation=operation)
            props = self._props[replica.base_url] = body if isinstance(body, dict) else {}
        return props

    async def _served_recently(self, replica: Replica) -> list[ServedAdapter]:
        """The replica's adapters, read again when the last reading is older than :data:`SERVED_TTL_SECONDS`.

        A restarted server may list its adapters in another order, and the ``lora`` field names them by position,
        so the list is never trusted for long.
        """
        read = self._served.get(replica.base_url)
        if read is not None and time.monotonic() - read[0] < SERVED_TTL_SECONDS:
            return read[1]
        return await self._read_served(replica)

    async def _read_served(self, replica: Replica) -> list[ServedAdapter]:
        operation = "list the server's LoRA adapters"
        response = await replica.http.request("GET", f"{replica.root}/lora-adapters", operation=operation)
        body = replica.http.parse_json(response, operation=operation)
        try:
            served = [
                ServedAdapter(index=int(entry["id"]), path=str(entry["path"]), name=_file_name(str(entry["path"])))
                for entry in body
            ]
        except (KeyError, TypeError, ValueError) as error:
            raise replica.http.protocol_error(
                operation, f"an adapter list that is not llama-server's ({error!r})"
            ) from error
        self._served[replica.base_url] = (time.monotonic(), served)
        return served

    async def _match(self, replica: Replica, served: list[ServedAdapter], adapter_path: str) -> ServedAdapter | None:
        """The served adapter that is ``adapter_path``: the same file, else the same bytes (a PEFT directory is
        converted first, for the server's base model)."""
        identity = path_identity(adapter_path)
        for entry in served:
            if path_identity(entry.path) == identity:
                return entry
        local: Path | None = Path(identity)
        if local is not None and local.is_dir():
            model_path = (await self._server_props(replica)).get("model_path")
            if not isinstance(model_path, str) or not Path(model_path).is_file():
                return None  # the base model is not readable here: nothing to convert for
            local = await asyncio.to_thread(convert_peft_to_gguf_cached, local, model_path, self.adapter_cache_dir)
        if local is None or not local.is_file():
            return None
        digest = await asyncio.to_thread(_sha256, local)
        for entry in served:
            server_file = Path(entry.path)
            if server_file.is_file() and await asyncio.to_thread(_sha256, server_file) == digest:
                return entry
        return None

    def _flag_path(self, adapter_path: str) -> str:
        path = Path(adapter_path)
        if path.is_dir():
            return f"<the GGUF of `inference convert-adapter {adapter_path} --base <the server's model>`>"
        return adapter_path


def _file_name(path: str) -> str:
    name = Path(path).name
    return name[: -len(".gguf")] if name.endswith(".gguf") else name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
