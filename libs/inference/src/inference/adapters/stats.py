"""What a provider's adapters are doing: :meth:`InferenceProvider.adapter_stats` returns these.

Counters live in the provider's adapter registry (:mod:`inference._core.lifecycle`) and count backend work:
a load is one call that put weights into the backend (first load, replacement, reload after an eviction or
after the backend lost them); an eviction is one unload made to respect ``max_adapters``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AdapterStats", "ProviderAdapterStats"]


@dataclass(frozen=True)
class AdapterStats:
    """One loaded adapter, as the provider sees it now.

    Attributes:
        adapter_id: The id the user loaded it under.
        backend_name: The name the backend holds its current weights under (the id until it is replaced).
        state: The lifecycle state: ``"resident"``, ``"evicted"``, ``"loading"``, ``"evicting"`` or
            ``"unloading"``.
        resident: The weights are in the backend now (an evicted adapter is loaded again on its next use).
        pinned: Never evicted.
        in_flight: Requests using it right now.
        loads: Backend loads of this id since it was first loaded (replacements and reloads included).
        evictions: Times it was evicted to make room.
        reloads: Loads after an eviction or after the backend lost it (self-healing).
        replacements: Successful ``load_adapter(..., replace=True)`` switches to new weights.
        last_load_ms: How long the last backend load took, in milliseconds (``None`` before any).
        last_used: When a request last started with it (``time.time()`` seconds; ``None`` if never).
    """

    adapter_id: str
    backend_name: str
    state: str
    resident: bool
    pinned: bool
    in_flight: int
    loads: int
    evictions: int
    reloads: int
    replacements: int
    last_load_ms: float | None
    last_used: float | None


@dataclass(frozen=True)
class ProviderAdapterStats:
    """Every adapter of one provider, with totals.

    The totals count over the provider's life, adapters unloaded since included; ``resident``, ``evicted``
    and ``in_flight`` describe now.

    Attributes:
        provider: The provider's name.
        adapters: One entry per loaded adapter (evicted ones included), sorted by id.
        resident: Adapters whose weights are in the backend now.
        evicted: Adapters listed but not in the backend (loaded again on use).
        in_flight: Requests using an adapter right now.
        loads: Backend loads.
        evictions: Evictions.
        reloads: Loads after an eviction or a loss.
        replacements: Successful replacements.
        unloads: ``unload_adapter`` calls that completed.
        failed_loads: Backend loads that raised (the adapter, or the old weights of a replacement, stay as
            they were).
    """

    provider: str
    adapters: tuple[AdapterStats, ...]
    resident: int
    evicted: int
    in_flight: int
    loads: int
    evictions: int
    reloads: int
    replacements: int
    unloads: int
    failed_loads: int

    def get(self, adapter_id: str) -> AdapterStats | None:
        """The entry of ``adapter_id``, or ``None`` when it is not loaded."""
        return next((stats for stats in self.adapters if stats.adapter_id == adapter_id), None)
