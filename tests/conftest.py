"""Shared fixtures: a clean provider cache per test, and the tiny test models (built once, cached)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from inference.factory import aclose_all_providers

# Settings come from the process environment, then ./.env: a developer's .env in the repository must not change
# what the suite sees (tests of the .env file point INFERENCE_ENV_FILE elsewhere, or remove it).
os.environ.setdefault("INFERENCE_ENV_FILE", os.devnull)

_VLLM_ENGINE_MODE = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_V2_MODEL_RUNNER")
_ENGINE_MODE_BEFORE = {name: os.environ.get(name) for name in _VLLM_ENGINE_MODE}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Undo what importing genlm-backend (test_genlm's collection) wrote into this process's environment: vLLM's
    engine-mode variables, which would reach every vLLM server a later test starts (V2 runner: no Triton here)."""
    for name, value in _ENGINE_MODE_BEFORE.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(autouse=True)
async def _fresh_provider_cache() -> AsyncIterator[None]:
    """Each test starts and ends with an empty provider cache, its providers closed."""
    await aclose_all_providers()
    yield
    await aclose_all_providers()


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, object]:
    """The tiny Qwen2 and Llama models (HF + GGUF twin + PEFT adapters), keyed by architecture.

    Built by ``inference.testing.tiny_models.build_tiny_models`` into its cache on first use.
    """
    pytest.importorskip("torch")
    from inference.testing.tiny_models import build_tiny_models

    return dict(build_tiny_models())


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]
