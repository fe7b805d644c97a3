"""An adapter's turn on the provider during an evaluation run: loaded right before its prompts, unloaded after them.

The caller keeps ownership of what it loaded itself. An adapter its caller had loaded on the provider under the
adapter's id, from the same source, is used as it is (the load does nothing) and left loaded, pinned or not, after
the run. One loaded under that id from another source (other files, or weights in memory) is never evaluated under
the adapter's name, nor replaced: the load is refused with an error that says so, which becomes the adapter's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass

from inference.evaluation.inputs import AdapterSpec
from inference.exceptions import AdapterAlreadyLoadedError
from inference.provider import InferenceProvider

__all__ = ["LoadedAdapter", "load_for_turn", "unload_after_turn"]

logger = logging.getLogger("inference.evaluation")


@dataclass(frozen=True)
class LoadedAdapter:
    """An adapter loaded for its turn.

    Attributes:
        adapter_id: The id it is loaded under.
        owned_by_caller: The caller had loaded it before the run (from the same source): it stays loaded.
    """

    adapter_id: str
    owned_by_caller: bool


async def load_for_turn(provider: InferenceProvider, spec: AdapterSpec) -> LoadedAdapter:
    """Load ``spec`` under its id for its turn, noting whether the caller had loaded it already.

    A cancellation that arrives once the backend has the adapter unloads it again (unless it is the caller's).

    Raises:
        AdapterAlreadyLoadedError: The caller loaded another source under this id (nothing is changed).
        Exception: Whatever the provider raised: the adapter could not be loaded.
    """
    adapter_id = spec.id
    owned_by_caller = provider.adapter_stats().get(adapter_id) is not None  # loaded by the caller, not by this run
    source = spec.weights if spec.weights is not None else os.path.abspath(str(spec.path))
    try:
        await provider.load_adapter(adapter_id, source)
    except asyncio.CancelledError:  # a load, once the backend has it, finishes before the cancellation
        if not owned_by_caller:
            with contextlib.suppress(Exception):
                await provider.unload_adapter(adapter_id)
        raise
    except AdapterAlreadyLoadedError as error:
        if not owned_by_caller:
            raise
        what = "these weights in memory" if spec.weights is not None else str(source)
        raise AdapterAlreadyLoadedError(
            f"adapter id {adapter_id!r} is already loaded on the {provider.name} provider by its caller, from other "
            f"files or weights than {what} (or from files changed since): the evaluation neither answers with "
            "those weights under this adapter's name nor replaces them; unload that adapter first, or give this "
            "one another id (AdapterSpec). The caller's adapter is left as it was",
            provider=provider.name,
        ) from error
    return LoadedAdapter(adapter_id, owned_by_caller)


async def unload_after_turn(provider: InferenceProvider, loaded: LoadedAdapter) -> None:
    """Unload an adapter after its turn, unless the caller had loaded it; a failure is logged (its rows are
    written: a failed unload must not lose the run)."""
    if loaded.owned_by_caller:
        return
    try:
        await provider.unload_adapter(loaded.adapter_id)
    except Exception as error:
        logger.warning("adapter %s could not be unloaded: %s", loaded.adapter_id, error)
