"""Optional dependencies: import them only when a backend is used, and say which extra brings them."""

from __future__ import annotations

import importlib
from types import ModuleType

from inference.exceptions import MissingDependencyError

__all__ = ["import_optional", "missing_dependency"]


def import_optional(module: str, *, provider: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the pip extra to install.

    Args:
        module: The module to import, e.g. ``"llama_cpp"``, or a provider's own module (whose imports may fail).
        provider: The provider that needs it, e.g. ``"llamacpp"``.
        extra: The ``inference-adapters`` extra that installs it; else the provider's extra in
            :data:`inference.registry.PROVIDERS`.

    Raises:
        MissingDependencyError: The import failed (also when a module it imports is missing); the message
            names the module that could not be imported and the ``pip install`` command.
    """
    try:
        return importlib.import_module(module)
    except MissingDependencyError:
        raise
    except ImportError as error:
        raise missing_dependency(error.name or module, provider=provider, extra=extra, error=error) from error


def missing_dependency(
    module: str, *, provider: str, extra: str | None = None, error: BaseException | None = None
) -> MissingDependencyError:
    """The :class:`MissingDependencyError` for ``module``, which ``provider`` needs, in the one message format.

    Args:
        module: The module that could not be imported.
        provider: The provider that needs it.
        extra: The extra that installs it; else the provider's extra in the registry.
        error: The ``ImportError``, whose text is quoted.
    """
    if extra is None:
        from inference.registry import PROVIDER_EXTRAS  # here: the registry imports this module

        extra = PROVIDER_EXTRAS.get(provider)
    why = f" ({error})" if error is not None and str(error) else ""
    advice = f"run pip install 'inference-adapters[{extra}]'" if extra else "reinstall inference-adapters"
    return MissingDependencyError(
        f"the {provider} provider needs the Python package {module!r}, which cannot be imported{why}: {advice}",
        provider=provider,
    )
