"""lm-eval-harness on any provider that can: the lm-eval model ``inference``.

Importing this module registers the model ``inference`` with lm-eval. Its ``model_args`` are a provider type,
that provider's settings (the keys of ``.env.example`` in lower case, as ``get_provider_for_step`` takes them)
or other arguments of its constructor (``kv_cache_type``), and optionally an adapter::

    lm-eval --model inference --model_args provider=llamacpp,model_path=base.gguf,adapter=adapters/math ...
    inference lm-eval --model inference --model_args provider=transformers,model_name=models/base ...

lm-eval's three requests map onto the provider: ``loglikelihood`` onto
:meth:`~inference.InferenceProvider.score_batch`, ``loglikelihood_rolling`` onto
:meth:`~inference.InferenceProvider.score_rolling`, ``generate_until`` onto
:meth:`~inference.InferenceProvider.generate_batch`. Scores are tokenized by the SDK's one rule (lm-eval's),
the same on every backend. lm-eval calls the model synchronously: the provider lives on a private event loop
in a thread of its own, created, used and closed there.

Arguments besides the provider's settings:
    adapter: A PEFT directory or GGUF LoRA file, loaded once at the start.
    adapter_id: The id to load it under (default: the directory or file name).
    model: The model name passed to every call (servers; in-process providers ignore it).
    max_concurrency: Requests in flight at once (default: lm-eval's ``batch_size`` when it is a number, else 16).
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import sys
import threading
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from inference.config import SETTINGS, resolve_provider_type, resolve_settings
from inference.exceptions import ConfigurationError
from inference.provider import InferenceProvider
from inference.registry import load_provider_class
from inference.results import GenerationResult, ScoreResult

__all__ = ["InferenceLM", "main"]

logger = logging.getLogger("inference")
_T = TypeVar("_T")

_OWN_ARGUMENTS = ("provider", "adapter", "adapter_id", "model", "max_concurrency")
_LM_EVAL_ARGUMENTS = ("batch_size", "max_batch_size", "device")
"""What lm-eval adds to every model's arguments; ``batch_size`` sets the concurrency, the others do not apply."""


class _Loop:
    """An event loop running in a daemon thread, for a synchronous caller."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="inference-lm-eval", daemon=True)
        self.thread.start()

    def run(self, work: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)


@register_model("inference")
class InferenceLM(LM):  # type: ignore[misc]
    """lm-eval's model interface over an inference provider (see the module's documentation).

    Raises:
        ConfigurationError: No ``provider``, or an argument that is neither one of the provider's settings nor
            one of this model's.
    """

    def __init__(self, provider: str | None = None, **arguments: Any) -> None:
        super().__init__()
        provider_type = resolve_provider_type(provider)
        keys = {setting.key for setting in SETTINGS[provider_type]}
        parameters = set(inspect.signature(load_provider_class(provider_type)).parameters) - keys
        unknown = sorted(set(arguments) - keys - parameters - set(_OWN_ARGUMENTS) - set(_LM_EVAL_ARGUMENTS))
        if unknown:
            raise ConfigurationError(
                f"model_args {', '.join(unknown)} are not settings of the {provider_type} provider; valid: "
                f"{', '.join(sorted(keys | parameters | set(_OWN_ARGUMENTS[1:])))}",
                provider=provider_type,
            )
        settings = resolve_settings(provider_type, {key: arguments[key] for key in keys if key in arguments})
        settings |= {key: arguments[key] for key in parameters if key in arguments}
        self.model_name = str(arguments.get("model") or "")
        batch_size = arguments.get("batch_size")
        default = batch_size if isinstance(batch_size, int) and batch_size > 0 else 16
        self.max_concurrency = int(arguments.get("max_concurrency") or default)
        self._loop = _Loop()
        self.provider: InferenceProvider = self._loop.run(self._create(provider_type, settings))
        self.adapter_id: str | None = None
        adapter = arguments.get("adapter")
        if adapter:
            self.adapter_id = str(arguments.get("adapter_id") or Path(str(adapter)).name.removesuffix(".gguf"))
            self._loop.run(self.provider.load_adapter(self.adapter_id, str(adapter)))
        atexit.register(self.close)

    @staticmethod
    async def _create(provider_type: str, settings: dict[str, Any]) -> InferenceProvider:
        provider: InferenceProvider = load_provider_class(provider_type)(**settings)
        return provider

    def close(self) -> None:
        """Close the provider and stop its loop (also at exit). Safe to call twice."""
        if not self._loop.loop.is_running():
            return
        try:
            self._loop.run(self.provider.aclose())
        except Exception:  # at interpreter exit the provider's own threads may be gone first
            logger.debug("closing the lm-eval model's provider failed", exc_info=True)
        finally:
            self._loop.stop()

    def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``(logprob, is_greedy)`` of each request's continuation after its context."""
        pairs = [(str(request.args[0]), str(request.args[1])) for request in requests]
        results = self._loop.run(
            self.provider.score_batch(pairs, self.model_name, self.adapter_id, max_concurrency=self.max_concurrency)
        )
        return [(result.logprob, result.is_greedy) for result in _raise_failures(results, ScoreResult)]

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each request's whole text."""

        async def score_all() -> list[Any]:
            semaphore = asyncio.Semaphore(self.max_concurrency)

            async def one(text: str) -> Any:
                async with semaphore:
                    try:
                        return await self.provider.score_rolling(text, self.model_name, self.adapter_id)
                    except Exception as error:
                        return error

            return list(await asyncio.gather(*(one(str(request.args[0])) for request in requests)))

        return [result.logprob for result in _raise_failures(self._loop.run(score_all()), ScoreResult)]

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        """Each request's generation, cut at its ``until`` strings, with its ``max_gen_toks``."""
        groups: dict[str, list[int]] = {}
        options: dict[str, dict[str, Any]] = {}
        for index, request in enumerate(requests):
            option = _generation_options(request.args[1] if len(request.args) > 1 else {})
            key = repr(sorted(option.items()))
            groups.setdefault(key, []).append(index)
            options[key] = option
        texts: list[str] = [""] * len(requests)
        for key, indices in groups.items():
            prompts = [str(requests[index].args[0]) for index in indices]
            results = self._loop.run(
                self.provider.generate_batch(
                    prompts, self.model_name, self.adapter_id, max_concurrency=self.max_concurrency, **options[key]
                )
            )
            for index, result in zip(indices, _raise_failures(results, GenerationResult), strict=True):
                texts[index] = result.text
        return texts


def _generation_options(gen_kwargs: Any) -> dict[str, Any]:
    """lm-eval's ``gen_kwargs`` as ``generate``'s options: ``until`` -> ``stop``, ``max_gen_toks`` -> ``max_tokens``,
    ``do_sample`` false -> greedy."""
    kwargs = dict(gen_kwargs or {})
    options: dict[str, Any] = {"max_tokens": int(kwargs.pop("max_gen_toks", 256))}
    until = kwargs.pop("until", None)
    if until:
        options["stop"] = [until] if isinstance(until, str) else list(until)
    do_sample = kwargs.pop("do_sample", None)
    temperature = kwargs.pop("temperature", None)
    options["temperature"] = 0.0 if do_sample is False or temperature in (None, 0) else float(temperature)
    for name in ("top_p", "top_k", "seed"):
        if name in kwargs:
            options[name] = kwargs.pop(name)
    if kwargs:
        logger.warning("lm-eval gen_kwargs %s are not generation options of the SDK; ignored", sorted(kwargs))
    return options


def _raise_failures(results: Sequence[Any], kind: type[_T]) -> list[_T]:
    """lm-eval has no per-request errors: the first failure is raised."""
    for result in results:
        if not isinstance(result, kind):
            raise result if isinstance(result, BaseException) else TypeError(f"unexpected result {result!r}")
    return list(results)


def main(argv: Sequence[str] | None = None) -> int:
    """Run lm-eval's command line with the model ``inference`` registered (``inference lm-eval ARGS``).

    Returns:
        lm-eval's exit status (0 on success).
    """
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
    try:
        cli_evaluate()
    except SystemExit as exit_request:
        code = exit_request.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
    return 0
