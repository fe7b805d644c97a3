"""The errors :class:`~inference._core.lifecycle.AdapterRegistry` raises about the state of an id: loaded from
another path, its files changed, not loaded (any more)."""

from __future__ import annotations

from inference._core.validation import listed
from inference.exceptions import AdapterAlreadyLoadedError, AdapterNotFoundError, InvalidAdapterError

__all__ = ["already_loaded", "files_changed_error", "not_loaded", "superseded"]


def already_loaded(
    provider: str, adapter_id: str, loaded: str, path: str, *, files_changed: bool = False
) -> AdapterAlreadyLoadedError:
    """A load of ``path`` under an id loaded from ``loaded`` without ``replace=True``: another path, or the same one
    whose files changed since it was loaded."""
    if files_changed:
        message = (
            f"adapter {adapter_id!r} is loaded from {loaded}, whose files changed since it was loaded: pass "
            "replace=True to serve the new files (or unload it first)"
        )
    else:
        message = (
            f"adapter {adapter_id!r} is already loaded from {loaded}: unload it first, choose another id, or pass "
            f"replace=True to load {path} in its place"
        )
    return AdapterAlreadyLoadedError(message, provider=provider, path=path)


def files_changed_error(provider: str, adapter_id: str, loaded: str) -> InvalidAdapterError:
    """An adapter to load again (a reload, a heal) whose files at ``loaded`` changed since it was loaded."""
    return InvalidAdapterError(
        f"adapter {adapter_id!r} must be loaded again and its files at {loaded} changed since it was loaded, which "
        "would serve other weights under the same id: call load_adapter(..., replace=True) to serve the new files, "
        "or put back the ones it was loaded from",
        provider=provider,
        path=loaded,
    )


def superseded(provider: str, adapter_id: str, path: str) -> AdapterNotFoundError:
    """The error of a load that an unload of the same id, called after it, superseded: the later call wins."""
    return AdapterNotFoundError(
        f"adapter {adapter_id!r} was unloaded (unload_adapter) while this load_adapter of {path} was still "
        "running: the later call wins, so the id is not loaded; load it again to serve it",
        provider=provider,
    )


def not_loaded(provider: str, adapter_id: str, *, unloading: bool, loaded: list[str]) -> AdapterNotFoundError:
    """The error of a request or an unload naming an id that is not loaded (``loaded``: the ids that are), or that
    is being unloaded."""
    if unloading:
        message = f"adapter {adapter_id!r} is being unloaded: load it again before using it"
    else:
        names = listed(sorted(loaded)) or "none"
        message = f"adapter {adapter_id!r} is not loaded (loaded: {names}): call load_adapter first"
    return AdapterNotFoundError(message, provider=provider)
