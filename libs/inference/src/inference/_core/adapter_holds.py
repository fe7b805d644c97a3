"""Holds on adapters: how evaluation runs that share a provider, and the provider's user, keep each other's adapters.

An evaluation run loads each adapter for its turn and unloads it after. Two runs on one provider (two tasks
evaluated at once through one cached provider, or one provider object passed to both) evaluate the same adapter ids,
and the user may load one of them too meanwhile (a serving loop on the same provider). So a run does not load and
unload an adapter for itself; it takes a hold on it, and gives the hold back after its turn:

- ``load_adapter`` called inside :func:`holding` takes ``holder``'s hold on the adapter (loading it, when it is not
  loaded yet) instead of loading it for the user; ``unload_adapter`` called inside gives that hold back instead of
  unloading.
- The adapter is unloaded when its last hold is given back, unless the user loaded it: a ``load_adapter`` call of
  the user's, before the holds or while they last, whether it loaded the adapter, found it loaded (the same source:
  it does nothing) or pinned it. What the user loaded stays loaded until the user unloads it.
- Giving back a hold that was never taken (its load failed, or was cancelled before the backend had the adapter)
  does nothing; so does giving back one whose adapter the user has unloaded or replaced since.
- The user's own ``unload_adapter`` unloads the adapter whatever holds it (after its requests in flight, as always):
  the rows of a run still using it become errors.
- A request made inside :func:`holding` (a run's generations and scores of its turn) is refused with
  ``AdapterNotFoundError`` once the id no longer serves the weights ``holder`` holds: the user replaced them
  (``replace=True``), or unloaded and loaded the id again. A run's rows thus never answer with weights it did not
  load, under the hash of the files it did.

The holder travels in a context variable so that a provider that loads through others (``FallbackProvider``) passes
it on unchanged; :class:`~inference._core.lifecycle.AdapterRegistry` records the holds of each adapter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["current_holder", "holding"]

_holder: ContextVar[object | None] = ContextVar("inference_adapter_holder", default=None)


@contextlib.contextmanager
def holding(holder: object) -> Iterator[None]:
    """Make the ``load_adapter`` and ``unload_adapter`` calls inside take and give back ``holder``'s hold (see the
    module docstring); ``holder`` is any object, compared by identity: one per adapter turn of a run."""
    token = _holder.set(holder)
    try:
        yield
    finally:
        _holder.reset(token)


def current_holder() -> object | None:
    """The holder whose hold the adapter calls made now take and give back; ``None`` for the user's own calls."""
    return _holder.get()
