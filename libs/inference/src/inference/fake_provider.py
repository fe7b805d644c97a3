"""A deterministic provider with no dependencies, for users' own tests of agent loops."""

from __future__ import annotations

import asyncio
import hashlib

from inference._validation import GenerationRequest
from inference.exceptions import AdapterAlreadyLoadedError, AdapterNotFoundError
from inference.provider import GenerationResult, InferenceProvider

__all__ = ["FakeProvider"]

_WORDS = tuple(
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "  # noqa: SIM905
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu".split()
)


class FakeProvider(InferenceProvider):
    """Answers instantly with text that depends only on the prompt, system prompt, adapter and seed.

    The same request always gives the same text; a different adapter gives a different text. Adapters
    live in memory: ``load_adapter`` records the path (nothing is read), so the lifecycle and its errors
    behave as on a real provider.

    Example:
        >>> import asyncio
        >>> async def main():
        ...     async with FakeProvider() as fake:
        ...         await fake.load_adapter("a1", "/adapters/a1")
        ...         return (await fake.generate("hi", model="m", adapter_id="a1", max_tokens=3)).text
        >>> asyncio.run(main())
        '[a1] xray victor juliet'
    """

    name = "fake"
    supports_adapters = True
    hot_swaps_adapters = True
    batches_mixed_adapters = True

    def __init__(self) -> None:
        self._adapters: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"FakeProvider(adapters={sorted(self._adapters)})"

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        if request.adapter_id is not None and request.adapter_id not in self._adapters:
            raise AdapterNotFoundError(
                f"adapter {request.adapter_id!r} is not loaded: call load_adapter first "
                f"(loaded: {sorted(self._adapters) or 'none'})",
                provider=self.name,
            )
        await asyncio.sleep(0)  # a real provider yields to the loop too
        words = _words_for(request)
        finish_reason = "length" if len(words) > request.max_tokens else "stop"
        words = words[: request.max_tokens]
        prefix = f"[{request.adapter_id or 'base'}] "
        text = prefix + " ".join(words)
        for stop in request.stop:
            if stop in text:
                text, finish_reason = text[: text.index(stop)], "stop"
        prompt_tokens = len(request.prompt.split()) + len((request.system_prompt or "").split())
        return GenerationResult(
            text=text,
            model=request.model or "fake",
            adapter_id=request.adapter_id,
            token_count=prompt_tokens + len(words),
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=len(words),
        )

    async def _load_adapter(self, adapter_id: str, adapter_path: str) -> None:
        if adapter_id in self._adapters:
            raise AdapterAlreadyLoadedError(
                f"adapter {adapter_id!r} is already loaded (from {self._adapters[adapter_id]}): "
                "unload it first or choose another id",
                provider=self.name,
            )
        self._adapters[adapter_id] = adapter_path

    async def _unload_adapter(self, adapter_id: str) -> None:
        if self._adapters.pop(adapter_id, None) is None:
            raise AdapterNotFoundError(f"adapter {adapter_id!r} is not loaded", provider=self.name)

    async def _list_adapters(self) -> list[str]:
        return list(self._adapters)


def _words_for(request: GenerationRequest) -> list[str]:
    """Between 8 and 23 words chosen by a hash of what the request asks."""
    key = "\x00".join(
        [request.prompt, request.system_prompt or "", request.adapter_id or "", str(request.seed)]
    )
    digest = hashlib.sha256(key.encode()).digest()
    return [_WORDS[byte % len(_WORDS)] for byte in digest[1 : 9 + digest[0] % 16]]
