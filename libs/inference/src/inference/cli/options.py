"""What the parsed options mean: the step config they describe (provider, settings, generation options) and the
adapter of ``--adapter``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from inference._core.redaction import redact_written_url
from inference.cli.running import _UsageError
from inference.config import SETTINGS, resolve_provider_type
from inference.exceptions import AdapterNotFoundError, InferenceError
from inference.options import OPTIONS
from inference.registry import PROVIDERS

SERVER_PROVIDERS = tuple(name for name, spec in PROVIDERS.items() if spec.server)
"""Providers that talk to a server, whose adapters outlive the process (from the registry)."""

_MODEL_SETTINGS = {name: spec.model_setting for name, spec in PROVIDERS.items() if spec.model_setting}
"""In-process provider -> the setting ``--model-path`` sets (``model_path``, ``model_name``)."""

_GENERATION_TYPES: dict[str, Callable[[str], Any]] = {"model": str} | {
    name: spec.parse for name, spec in OPTIONS.items()
}
"""Generation keys of ``--set`` (``model`` and every generation option) -> how the text is read."""


def _step_config(args: argparse.Namespace, *, generation_keys: bool = False) -> dict[str, Any]:
    """The step config the options describe: ``provider``, provider settings, and generation settings."""
    provider_type = resolve_provider_type(args.provider)
    settings = {setting.key: setting for setting in SETTINGS[provider_type]}
    config: dict[str, Any] = {"provider": provider_type}
    if args.base_url is not None:
        config["base_url"] = args.base_url
    if getattr(args, "model_path", None) is not None:
        key = _MODEL_SETTINGS.get(provider_type)
        if key is None:
            raise _UsageError(
                f"--model-path is for the in-process providers ({', '.join(_MODEL_SETTINGS)}), not {provider_type}"
            )
        config[key] = args.model_path
    if getattr(args, "device", None) is not None:
        if "device" not in settings:
            raise _UsageError(f"--device is a transformers setting; the {provider_type} provider has none")
        config["device"] = args.device
    for key, text in args.settings:
        if key in settings:
            try:
                config[key] = settings[key].check(text)  # an argument: its message names --set, not a variable
            except ValueError as error:  # a key is never shown, nor the credentials of a URL
                shown = "(not shown)" if settings[key].kind == "secret" else repr(redact_written_url(text))
                raise _UsageError(f"--set {key}={shown}: {error}") from None
        elif generation_keys and key in _GENERATION_TYPES:
            try:
                value = _GENERATION_TYPES[key](text)
            except ValueError as error:  # the SDK's own sentence where it has one (a --json-schema file's problem)
                detail = f": {error}" if isinstance(error, InferenceError) else ""
                raise _UsageError(f"--set {key}={text!r} is not a valid {key}{detail}") from None
            repeatable = key in OPTIONS and OPTIONS[key].repeatable
            config[key] = [*config.get(key, []), value] if repeatable else value
        else:
            valid = sorted(set(settings) | (set(_GENERATION_TYPES) if generation_keys else set()))  # a name may be both
            raise _UsageError(
                f"--set {key}: not a setting of the {provider_type} provider; valid keys: {', '.join(valid) or 'none'}"
            )
    for key in _GENERATION_TYPES:
        value = getattr(args, key, None)
        if value is None:
            continue
        previous = config.get(key)
        # A repeatable option (--stop) adds to what --set gave; any other flag wins over --set.
        config[key] = [*previous, *value] if isinstance(previous, list) and isinstance(value, list) else value
    return config


def _sampling(config: dict[str, Any]) -> dict[str, Any]:
    """The generation options the step config sets, as ``generate``'s keyword arguments."""
    return {key: config[key] for key in OPTIONS if config.get(key) is not None}


@asynccontextmanager
async def _adapter_for(provider: Any, adapter: str | None) -> AsyncIterator[str | None]:
    """The adapter id of ``--adapter`` for one request: a path is loaded for the command, and unloaded after it on a
    server (where it would outlive the process); an id is used as it is."""
    adapter_id, loaded_here = await _use_adapter(provider, adapter)
    try:
        yield adapter_id
    finally:
        if loaded_here and not provider.runs_in_process and adapter_id is not None:
            await provider.unload_adapter(adapter_id)


async def _use_adapter(provider: Any, adapter: str | None) -> tuple[str | None, bool]:
    """The adapter id to generate with, and whether this command loaded it (from a path)."""
    if adapter is None:
        return None, False
    from inference.evaluation.inputs import adapter_id_for

    if Path(adapter).exists():
        adapter_id = adapter_id_for(adapter)
        await provider.load_adapter(adapter_id, os.path.abspath(adapter))
        return adapter_id, True
    if provider.runs_in_process:
        raise AdapterNotFoundError(
            f"{adapter!r} is not an adapter path, and the {provider.name} provider runs in this process, where no "
            "adapter is loaded yet: pass --adapter PATH (a PEFT directory or GGUF LoRA file)",
            provider=provider.name,
            path=adapter,
        )
    if "/" in adapter or os.sep in adapter:  # an id has no separator: a path, mistyped or missing
        raise AdapterNotFoundError(
            f"there is no adapter at {adapter!r} on this machine (and an adapter id has no path separators): check "
            "the path, or pass the id of an adapter the server holds (inference adapters list)",
            provider=provider.name,
            path=adapter,
        )
    return adapter, False
