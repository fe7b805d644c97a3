"""Runtime LoRA routes: load, unload and list the adapters of one server while it runs.

vLLM (``POST /v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) and SGLang (``POST /load_lora_adapter``,
``/unload_lora_adapter``) take adapters at run time through routes of the same shape: a JSON body with
``lora_name`` and ``lora_path``, a success status, an error status with the server's sentence. What differs is
described by a :class:`LoRARoutes` (vLLM's own ``OpenAIServingModels`` keeps these routes apart from the serving
of generations the same way); :class:`RuntimeLoRA` sends them to one replica and maps the answers into the error
tree. Spreading adapters over several replicas is :mod:`inference._servers.served_adapters`' job.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from inference._core.paths import path_identity
from inference._servers.http import ErrorHandler, ErrorHandlers, ServerAnswer
from inference._servers.replicas import Replica
from inference.exceptions import (
    ConfigurationError,
    InferenceError,
    RuntimeLoRADisabledError,
    ServerAdapterAlreadyLoadedError,
    ServerResponseError,
)

__all__ = [
    "LoRARoutes",
    "RuntimeLoRA",
    "absolute_if_local",
    "already_loaded",
    "same_adapter_path",
    "shared_adapter_dir",
]


def _no_handlers(adapter_id: str, adapter_path: str) -> ErrorHandlers:
    return {}


def _no_unload_handlers(adapter_id: str) -> ErrorHandlers:
    return {}


def _missing_on_unload(error: ServerResponseError) -> bool:
    return error.status_code == 404


def _no_refusal(answer: ServerAnswer) -> ServerResponseError | None:
    return None


def _adapter_as_model(model: str, adapter_id: str) -> str:
    return adapter_id


@dataclass(frozen=True)
class LoRARoutes:
    """How one kind of server takes LoRA adapters at run time, and what its refusals mean.

    Attributes:
        server: The server's name in messages (``"vLLM"``).
        enable_hint: How to start the server so that the routes exist (said when they are missing).
        preload_hint: How to start the server with an adapter loaded, ``{adapter_id}`` filled in (said when a
            request names an adapter the server lacks).
        load_path: The load route, from the server's root.
        unload_path: The unload route, from the server's root.
        models_path: The model list, whose entries with a ``parent`` are the LoRA adapters served.
        load_refusals: The server's own error cases of one load: ``(adapter_id, path)`` -> handlers by status
            (a route the server lacks is already :class:`RuntimeLoRADisabledError`).
        unload_refusals: The same for one unload (``adapter_id`` -> handlers).
        gone_on_unload: Whether an unload's error says the server does not have the adapter (the unload's goal
            is met there).
        request_refusal: A 400 to a generation or scoring request that is about its adapter, else ``None``.
        adapter_model: The ``model`` a generation sends for an adapter: ``(model, adapter_id)`` -> name.
    """

    server: str
    enable_hint: str
    preload_hint: str
    load_path: str = "/v1/load_lora_adapter"
    unload_path: str = "/v1/unload_lora_adapter"
    models_path: str = "/v1/models"
    load_refusals: Callable[[str, str], ErrorHandlers] = field(default=_no_handlers)
    unload_refusals: Callable[[str], ErrorHandlers] = field(default=_no_unload_handlers)
    gone_on_unload: Callable[[ServerResponseError], bool] = field(default=_missing_on_unload)
    request_refusal: ErrorHandler = field(default=_no_refusal)
    adapter_model: Callable[[str, str], str] = field(default=_adapter_as_model)


class RuntimeLoRA:
    """Sends one kind of server's runtime LoRA routes (:class:`LoRARoutes`) to one replica at a time.

    Args:
        routes: The server's routes and refusals.
    """

    def __init__(self, routes: LoRARoutes) -> None:
        self.routes = routes

    def disabled(self, answer: ServerAnswer) -> ServerResponseError:
        """The error for a runtime LoRA route the server lacks: say how to start it with the routes."""
        return answer.error(
            RuntimeLoRADisabledError,
            f"{answer.where} refused runtime LoRA loading (404 on {answer.response.request.url.path}): "
            f"{self.routes.enable_hint}",
        )

    async def load(self, replica: Replica, adapter_id: str, adapter_path: str, *, healing: bool = False) -> bool:
        """Load ``adapter_path`` under ``adapter_id`` on ``replica``; ``False`` when, ``healing``, the server had an
        adapter of that name from that path already (another client loaded it again first), so that this call
        loaded nothing.

        A server that already has an adapter of that name from that very path (a retried POST found the load it
        had made) has loaded it. While healing, one that lists it from another path serves other weights under the
        name (after a restart, another client, ``--lora-modules`` or a resolver plugin gave the name first): refused,
        naming both paths; one that does not list it (some vLLM versions do not list runtime-loaded adapters)
        cannot say whose it is, and counts as healed.

        Raises:
            RuntimeLoRADisabledError: The server has no runtime LoRA routes.
            ServerAdapterAlreadyLoadedError: The server has another adapter of that name.
            InferenceError: The load failed otherwise (the server's refusal, mapped by ``routes.load_refusals``).
        """
        routes = self.routes
        body = {"lora_name": adapter_id, "lora_path": adapter_path}
        try:
            await self._post(replica, routes.load_path, "load", body, routes.load_refusals(adapter_id, adapter_path))
        except ServerAdapterAlreadyLoadedError as taken:
            served: str | None = None
            with contextlib.suppress(InferenceError):
                served = (await self.served(replica)).get(adapter_id) or None
            if served is not None and same_adapter_path(adapter_path, served):
                return not healing  # a retried load found its own; a heal found another client's of the same path
            if not healing:
                raise
            if served is None:
                return False  # the server has the name again, which healing wants; it cannot say from where
            raise self._other_weights(replica, taken, adapter_id, adapter_path, served) from taken
        return True

    def _other_weights(
        self, replica: Replica, taken: ServerAdapterAlreadyLoadedError, adapter_id: str, adapter_path: str,
        served: str,
    ) -> ServerAdapterAlreadyLoadedError:
        """The refusal of a heal whose name the server serves from another path."""
        return ServerAdapterAlreadyLoadedError(
            f"{replica.http.where} serves adapter {adapter_id!r} from {served!r}, not from {adapter_path!r}: "
            "other weights under the name (given to it by another client, --lora-modules or a resolver plugin, "
            f"as after a restart): unload_adapter({adapter_id!r}) unloads the server's, then load yours again, or "
            "load yours under another id",
            request=taken.request,
            response=taken.response,
            provider=taken.provider,
            url=taken.url,
            path=adapter_path,
        )

    async def unload(self, replica: Replica, adapter_id: str) -> None:
        """Unload ``adapter_id`` from ``replica``; a server that no longer has it (restarted) counts as done.

        Raises:
            RuntimeLoRADisabledError: The server has no runtime LoRA routes.
            InferenceError: The unload failed otherwise.
        """
        routes = self.routes
        try:
            body = {"lora_name": adapter_id}
            await self._post(replica, routes.unload_path, "unload", body, routes.unload_refusals(adapter_id))
        except RuntimeLoRADisabledError:
            raise
        except ServerResponseError as error:
            if not routes.gone_on_unload(error):
                raise
            # The server no longer has it (restarted): the unload's goal is met there.
            replica.http.logger.info(
                "%s had already lost adapter %r; nothing to unload there", replica.http.where, adapter_id
            )

    async def _post(self, replica: Replica, path: str, verb: str, body: dict[str, str], own: ErrorHandlers) -> None:
        """POST ``body`` to the route ``path`` of ``replica``; a refusal is mapped by ``own`` (the server's cases),
        a route the server lacks is :class:`RuntimeLoRADisabledError`."""
        backend_404 = own.get(404)

        def not_found(answer: ServerAnswer) -> ServerResponseError | None:
            if answer.route_missing:
                return self.disabled(answer)
            return backend_404(answer) if backend_404 is not None else None

        operation, handlers = f"{verb} adapter {body['lora_name']!r}", {**own, 404: not_found}
        await replica.http.request(
            "POST", f"{replica.root}{path}", operation=operation, json_body=body, handlers=handlers
        )

    async def served(self, replica: Replica) -> dict[str, str]:
        """The LoRA adapters ``replica`` lists in its model list: name -> path (``root``).

        LoRA entries are those with a ``parent`` (the base model's name); the base model's is ``null``, and
        servers without LoRA support (llama_cpp.server) send no ``parent`` at all.

        Raises:
            ProtocolError: The answer is not a model list.
        """
        operation = "list models"
        response = await replica.http.request("GET", f"{replica.root}{self.routes.models_path}", operation=operation)
        body = replica.http.parse_json(response, operation=operation)
        entries = body.get("data") if isinstance(body, dict) else None
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            raise replica.http.protocol_error(operation, "an answer that is not a model list (no data[] of objects)")
        served: dict[str, str] = {}
        for entry in entries:
            name, parent, root = entry.get("id"), entry.get("parent"), entry.get("root")
            if not isinstance(name, str) or not name:
                raise replica.http.protocol_error(operation, f"a model entry without an id: {entry!r:.200}")
            if parent:
                served[name] = root if isinstance(root, str) else ""
        return served


def already_loaded(answer: ServerAnswer, adapter_id: str, adapter_path: str) -> ServerResponseError | None:
    """A refused load whose sentence says an adapter of that name is already loaded (vLLM, SGLang), else ``None``."""
    if "already" not in answer.message.lower():
        return None
    return answer.error(
        ServerAdapterAlreadyLoadedError,
        f"{answer.where} already has an adapter named {adapter_id!r} ({answer.message}): "
        "unload it first or choose another id",
        path=adapter_path,
    )


def same_adapter_path(loaded: str, served: str) -> bool:
    """Whether ``served``, the path a server names for an adapter (``root`` in its model list), is ``loaded``, the
    one it was loaded from here: the same text, or two spellings of one place (``a/b/`` and ``a/b``; on this
    machine, a symlink and its target)."""
    return served == loaded or path_identity(served) == path_identity(loaded)


def absolute_if_local(path: str) -> str:
    """The path as a server receives it: one that exists here is sent absolute.

    The server would resolve a relative path against its own working directory, or take it for a Hugging Face
    Hub repo id.
    """
    if not os.path.isabs(path) and os.path.exists(path):
        return os.path.abspath(path)
    return path


def shared_adapter_dir(adapter_dir: str | None, *, server: str, env_prefix: str, provider: str) -> str:
    """``adapter_dir``: the servers read adapters from their own filesystem, so weights from memory must be
    written where they can read them.

    Raises:
        ConfigurationError: No ``adapter_dir`` (``<PREFIX>_ADAPTER_DIR``) is set.
    """
    if adapter_dir is None:
        raise ConfigurationError(
            f"adapters given as AdapterWeights must be written where the {server} servers can read them: set "
            f"{env_prefix}_ADAPTER_DIR (or adapter_dir=) to a directory this process writes and every server reads "
            "at the same path (a shared volume), or save the adapter yourself and pass its path",
            provider=provider,
        )
    return adapter_dir
