"""What a backend loads an adapter from: :class:`AdapterSource`, handed to every provider's load hook.

``load_adapter(id, path_or_weights)`` becomes one source, which the adapter registry keeps for the id and hands to
the backend each time it loads the adapter: the first load, a reload after an eviction, a reload on a restarted
server. A source is a directory or file, or the weights themselves when the backend takes them from memory
(``loads_adapter_weights_in_memory``), plus what a backend needs besides (Ollama's base model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inference._core.paths import path_identity

if TYPE_CHECKING:
    from inference.adapters.weights import AdapterWeights

__all__ = ["AdapterSource"]


@dataclass(frozen=True)
class AdapterSource:
    """Where an adapter's weights come from.

    Attributes:
        path: The adapter's directory or file, written canonically; for weights kept in memory, a label that names
            them in messages and statistics (``"<adapter weights 3>"``: no file is behind it).
        weights: The weights themselves (a private, checked copy) when the backend loads them from memory; else
            ``None``, and the backend reads ``path``.
        base_model: The base model to apply the adapter to, for a backend that needs it per adapter (Ollama).
    """

    path: str
    weights: AdapterWeights | None = field(default=None, compare=False, repr=False)
    base_model: str | None = None

    @property
    def identity(self) -> str:
        """What two loads of the same adapter share: the real path of a file or directory on this machine (however
        it is written), the path as written for one elsewhere (a server's), the label of weights in memory."""
        return self.path if self.weights is not None else path_identity(self.path)
