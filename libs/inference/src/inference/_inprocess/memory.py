"""Out of accelerator memory: telling torch's error apart, and giving the cached blocks back before a retry.

Neither imports torch: both look at the ``torch`` module only where this process has loaded it already (a model that
ran out of memory did).
"""

from __future__ import annotations

import sys

__all__ = ["free_cached_memory", "out_of_memory"]


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is torch's out-of-memory error (``torch.OutOfMemoryError``, which
    ``torch.cuda.OutOfMemoryError`` names too)."""
    torch = sys.modules.get("torch")
    kind = getattr(torch, "OutOfMemoryError", None) or getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return isinstance(kind, type) and isinstance(error, kind)


def free_cached_memory() -> None:
    """Give the CUDA caching allocator's free blocks back, so that a smaller retry finds them."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
