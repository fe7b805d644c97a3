"""Unit tests' wire mocks answer the routes each test is about.

The vLLM provider's default ``api="auto"`` asks each server once (``POST /tokenize`` of a chat message) whether its
model has a chat template. The respx tests here are about other things, so they fix the route to chat; the tests of
the route itself (``test_vllm_route.py``) ask for ``api="auto"`` explicitly.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _vllm_chat_route(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API", "chat")
