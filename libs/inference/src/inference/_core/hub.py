"""Models named by Hugging Face Hub id, resolved through the Hugging Face cache as the backends' own loaders do.

- :func:`hub_gguf` reads llama.cpp's form, ``ORG/NAME:FILE.gguf`` (the repository and the GGUF file in it, as
  ``Llama.from_pretrained(repo_id, filename)`` takes them and as ``llama-server -hf ORG/NAME:QUANT`` writes them);
  :func:`hub_file` resolves it with ``hf_hub_download``: the cached file, fetched into the cache first unless
  ``HF_HUB_OFFLINE`` is set.
- :func:`hub_model_problem` checks, offline, that a Transformers-style Hub id (``ORG/NAME``) is in the cache, for a
  backend that resolves the id itself (vLLM) and would otherwise fail deep inside its engine.

A setting is read as a Hub id only when no such path exists, so a relative path keeps its meaning. Nothing here
imports ``huggingface_hub`` before it is called.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from inference._core.paths import HUB_ID
from inference.exceptions import ModelLoadError

__all__ = ["HUB_GGUF", "hub_file", "hub_gguf", "hub_model_problem", "hub_offline"]

HUB_GGUF = re.compile(rf"(?P<repo>{HUB_ID.pattern}):(?P<file>[^:]+\.gguf)", re.IGNORECASE)
"""A GGUF file in a Hub repository: ``ORG/NAME:FILE.gguf`` (``FILE`` may sit in a folder of the repository)."""


def hub_gguf(text: str) -> tuple[str, str] | None:
    """``(repo_id, filename)`` when ``text`` names a GGUF file on the Hub and no such local path exists, else
    ``None``."""
    match = HUB_GGUF.fullmatch(text)
    if match is None or os.path.exists(os.path.expanduser(text)):
        return None
    return match["repo"], match["file"]


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (as ``huggingface_hub`` reads it)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_file(repo_id: str, filename: str, provider: str) -> Path:
    """The local path of ``filename`` in the Hub repository ``repo_id``: from the Hugging Face cache, downloaded
    there first unless ``HF_HUB_OFFLINE`` is set (blocking: call it off the event loop).

    Raises:
        ModelLoadError: The file is not cached and cannot be downloaded (offline, no such repository or file).
    """
    from inference._core.dependencies import import_optional

    huggingface_hub = import_optional("huggingface_hub", extra="llamacpp", provider=provider)
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(huggingface_hub.hf_hub_download(repo_id, filename))
    except (OSError, ValueError, EntryNotFoundError) as error:  # not cached, offline, no such repo/file
        raise ModelLoadError(
            f"the Hub file {filename!r} of {repo_id!r} is not in the local Hugging Face cache and could not be "
            f"downloaded ({type(error).__name__}: {str(error)[:300]}): download it first (huggingface-cli download "
            f"{repo_id} {filename}) or, offline, unset HF_HUB_OFFLINE once you can reach the Hub",
            provider=provider,
            path=f"{repo_id}:{filename}",
        ) from error


def hub_model_problem(repo_id: str) -> str | None:
    """Why the Hub model ``repo_id`` cannot load offline (``None`` when its ``config.json`` is in the Hugging Face
    cache, or when ``HF_HUB_OFFLINE`` is not set: the backend may then download it)."""
    from huggingface_hub import try_to_load_from_cache

    if not hub_offline():
        return None
    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return None
    return (
        f"the Hub model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: download it "
        f"first (huggingface-cli download {repo_id}) or unset HF_HUB_OFFLINE once you can reach the Hub"
    )
