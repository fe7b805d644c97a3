"""Optional dependencies: import them only when a backend is used, and say which extra brings them."""

from __future__ import annotations

import importlib
from types import ModuleType

from inference.exceptions import MissingDependencyError


def import_optional(module: str, *, extra: str, provider: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the pip extra to install.

    Args:
        module: The module to import, e.g. ``"llama_cpp"``.
        extra: The ``inference-adapters`` extra that installs it, e.g. ``"llamacpp"``.
        provider: The provider that needs it, for the message.
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingDependencyError(
            f"the {provider} provider needs the Python package {module!r}, which is not installed: "
            f"run pip install 'inference-adapters[{extra}]'",
            provider=provider,
        ) from error
