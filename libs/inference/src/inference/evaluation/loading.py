"""An adapter's turn on the provider during an evaluation run: loaded right before its prompts, unloaded after them.

Its rows carry the content hash of the files that were loaded, not of those found when the run started (the hash
that checked the results file, see :mod:`~inference.evaluation.identity`): the files are hashed again right before
the load, and once more right after it.

- Files that changed since the run started are evaluated as they are now, and their rows carry the new hash;
  unless the results file already holds rows of the earlier files, which rows of the new ones would contradict:
  then the adapter is not loaded, and its rows carry the change as their load error (and the hash of the earlier
  files, the one version of it the file holds).
- Files that changed while they were being loaded leave it unknown which weights would answer: the adapter is
  unloaded, and its rows carry that as their load error (and the hash taken before the load).

Weights in memory are hashed once, before the run, and must not change while it uses them.

A turn does not load and unload the adapter for itself: it takes a hold on it and gives the hold back after (see
:mod:`inference._core.adapter_holds`), so that the provider's user, and other runs on the same provider, keep what
they use. An adapter the caller loaded on the provider under the adapter's id, from the same source, before the run
or while it runs, is used as it is (the load does nothing) and left loaded, pinned or not, after the run; one that
another run on the provider holds is shared, and unloaded by the last run that gives its hold back. One loaded
under that id from another source (other files, or weights in memory) is never evaluated under the adapter's name,
nor replaced: the load is refused with an error that says so, which becomes the adapter's rows.

The turn's requests are made for its hold (:func:`for_turn`): once the id no longer serves the weights the turn
loaded (the caller replaced them with ``load_adapter(..., replace=True)``, or unloaded and loaded the id again), each
of its remaining requests is refused with an :class:`~inference.exceptions.AdapterNotFoundError` that says so, and
becomes its row's error. Rows that answered before keep the hash of the files that answered them; no row ever
carries that hash beside an answer of other weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from contextlib import AbstractContextManager
from dataclasses import dataclass

from inference._core.adapter_holds import holding
from inference.evaluation.identity import adapter_hash
from inference.evaluation.inputs import AdapterSpec
from inference.exceptions import AdapterAlreadyLoadedError, InvalidAdapterError
from inference.provider import InferenceProvider

__all__ = ["LoadedAdapter", "for_turn", "load_for_turn", "unload_after_turn"]

logger = logging.getLogger("inference.evaluation")


@dataclass(frozen=True)
class LoadedAdapter:
    """An adapter held for its turn.

    Attributes:
        adapter_id: The id it is loaded under.
        hold: The turn's hold on it, given back after the turn (it is unloaded unless someone else holds it, or
            the caller loaded it).
    """

    adapter_id: str
    hold: object


def for_turn(loaded: LoadedAdapter | None) -> AbstractContextManager[None]:
    """The context of a turn's requests: made for its hold, so that they are refused once the id serves other
    weights than the turn loaded (see the module docstring); nothing for the base model's turn."""
    return contextlib.nullcontext() if loaded is None else holding(loaded.hold)


async def load_for_turn(
    provider: InferenceProvider,
    spec: AdapterSpec,
    hashes: dict[str, str | None],
    *,
    has_rows: bool,
    output: str | os.PathLike[str],
) -> LoadedAdapter:
    """Load ``spec`` under its id for its turn, holding it (see the module docstring), and check its files'
    content hash before and after the load.

    ``hashes[spec.id]`` is the hash its rows carry: the one taken when the run started, replaced by the one taken
    right before the load when the files changed meanwhile (and the results file holds no rows of the adapter yet:
    ``has_rows`` false). A cancellation that arrives once the backend has the adapter gives the hold back.

    Raises:
        InvalidAdapterError: The files changed since the run started and ``output`` holds rows of the earlier
            ones, or they changed while being loaded.
        AdapterAlreadyLoadedError: The caller, or another run, loaded another source under this id (nothing is
            changed).
        Exception: Whatever the provider raised: the adapter could not be loaded.
    """
    adapter_id = spec.id
    path = None if spec.weights is not None else os.path.abspath(str(spec.path))
    if path is not None:
        await _hash_before_load(provider, adapter_id, path, hashes, has_rows=has_rows, output=output)
    loaded = LoadedAdapter(adapter_id, hold=object())
    source = spec.weights if spec.weights is not None else str(path)
    try:
        with holding(loaded.hold):
            await provider.load_adapter(adapter_id, source)
    except asyncio.CancelledError:  # a load, once the backend has it, finishes before the cancellation
        await _release_quietly(provider, loaded)
        raise
    except AdapterAlreadyLoadedError as error:
        what = "these weights in memory" if spec.weights is not None else source
        raise AdapterAlreadyLoadedError(
            f"adapter id {adapter_id!r} is already loaded on the {provider.name} provider, by its caller or by "
            f"another evaluation run on it, from other files or weights than {what} (or from files changed "
            "since): the evaluation neither answers with those weights under this adapter's name nor replaces "
            "them; unload that adapter first (or wait for the other run), or give this one another id "
            "(AdapterSpec). The adapter loaded is left as it was",
            provider=provider.name,
        ) from error
    if path is not None:
        try:
            before, after = hashes[adapter_id], await _hash(path)
            if after != before:
                raise InvalidAdapterError(
                    f"the files of adapter {adapter_id!r} at {path} changed while it was being loaded (content "
                    f"hash {before} before, {after} after), so which weights would answer cannot be told: once they "
                    f"no longer change, delete the rows of {adapter_id!r} from {os.fspath(output)} and run again",
                    provider=provider.name,
                    path=path,
                )
        except BaseException:  # changed, unreadable now, or cancelled: not evaluated, so not left loaded
            await _release_quietly(provider, loaded)
            raise
    return loaded


async def _hash_before_load(
    provider: InferenceProvider,
    adapter_id: str,
    path: str,
    hashes: dict[str, str | None],
    *,
    has_rows: bool,
    output: str | os.PathLike[str],
) -> None:
    """Hash the files right before the load: the rows carry this hash (see the module docstring)."""
    started, current = hashes[adapter_id], await _hash(path)
    if current == started:
        return
    if has_rows:
        raise InvalidAdapterError(
            f"the files of adapter {adapter_id!r} at {path} changed since this run started (content hash {started}, "
            f"now {current}), and {os.fspath(output)} holds rows of the earlier files, which rows of these would "
            "contradict: it was not evaluated. Write to a new output file to evaluate the new version, or delete "
            f"the rows of {adapter_id!r} from {os.fspath(output)} to replace them",
            provider=provider.name,
            path=path,
        )
    logger.info(
        "adapter %s changed since the run started (content hash %s, now %s): evaluating its files as they are now",
        adapter_id, started, current,
    )
    hashes[adapter_id] = current


async def _release_quietly(provider: InferenceProvider, loaded: LoadedAdapter) -> None:
    """Give back the hold of a turn that will not use the adapter; the error that stopped the turn is the one to
    see."""
    with contextlib.suppress(Exception), holding(loaded.hold):
        await provider.unload_adapter(loaded.adapter_id)


async def _hash(path: str) -> str:
    return await asyncio.to_thread(adapter_hash, path)


async def unload_after_turn(provider: InferenceProvider, loaded: LoadedAdapter) -> None:
    """Give back the turn's hold on its adapter: it is unloaded unless another run holds it or the caller loaded
    it; a failure is logged (its rows are written: a failed unload must not lose the run)."""
    try:
        with holding(loaded.hold):
            await provider.unload_adapter(loaded.adapter_id)
    except Exception as error:
        logger.warning("adapter %s could not be unloaded: %s", loaded.adapter_id, error)
