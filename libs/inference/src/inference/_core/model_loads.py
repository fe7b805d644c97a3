"""What health knows of an in-process model's loading: the last failure, until a load succeeds.

An in-process provider loads its model on the first request, and tries again at the next request after a failure.
Between the two, :meth:`~inference.InferenceProvider.health` reports the provider down with that failure, where it
would otherwise say "not loaded yet" (up): a model file that exists but does not load (corrupt, an architecture the
backend lacks, too large for the memory) cannot serve.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from inference.exceptions import InferenceError

__all__ = ["ModelLoads"]


class ModelLoads:
    """The last failure to load a provider's model, forgotten when a load succeeds.

    Attributes:
        failure: The error the last load raised; ``None`` before any load fails, and after one succeeds.

    Example:
        >>> from inference.exceptions import ModelLoadError
        >>> loads = ModelLoads()
        >>> try:
        ...     with loads.attempt():
        ...         raise ModelLoadError("llama.cpp could not load base.gguf")
        ... except ModelLoadError:
        ...     pass
        >>> str(loads.failure)
        'llama.cpp could not load base.gguf'
        >>> with loads.attempt():
        ...     pass
        >>> loads.failure is None
        True
    """

    def __init__(self) -> None:
        self.failure: InferenceError | None = None

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        """Load the model inside the block: an :class:`~inference.InferenceError` it raises is remembered (and
        raised); leaving the block without one forgets the last failure. A cancellation is neither."""
        try:
            yield
        except InferenceError as error:
            self.failure = error
            raise
        self.failure = None
