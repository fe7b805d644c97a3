"""lm-eval-harness on any provider that can: the lm-eval model ``inference``.

Importing this module registers the model ``inference`` with lm-eval (``import inference`` never imports it).
Its ``model_args`` are a provider type, that provider's settings (the keys of ``.env.example`` in lower case, as
``get_provider_for_step`` takes them, ``kv_cache_type`` included) or other arguments of its constructor
(``seed``), and optionally an adapter::

    lm-eval --model inference --model_args provider=llamacpp,model_path=base.gguf,adapter=adapters/math ...
    inference lm-eval --model inference --model_args provider=transformers,model_name=models/base ...

lm-eval's three requests map onto the provider: ``loglikelihood`` onto
:meth:`~inference.InferenceProvider.score_batch`, ``loglikelihood_rolling`` onto
:meth:`~inference.InferenceProvider.score_rolling`, ``generate_until`` onto
:meth:`~inference.InferenceProvider.generate_batch`. Scores are tokenized by the SDK's one rule (lm-eval's),
the same on every backend.

lm-eval calls the model synchronously. The provider lives on a private event loop in a daemon thread of its own:
it is created, used and closed on that loop, so the caller's thread may be anything (a plain script, or a thread
that runs an event loop of its own, as in a notebook). The loop and the provider are closed by
:meth:`InferenceLM.close`, when the object is garbage-collected, or at interpreter exit, whichever comes first.

Arguments besides the provider's settings:
    adapter: A PEFT directory or GGUF LoRA file, loaded once at the start.
    adapter_id: The id to load it under (default: the directory or file name, without ``.gguf``).
    model: The model name passed to every call (servers); default the provider's model setting, else ``""``.
    max_concurrency: Requests in flight at once (default: lm-eval's ``batch_size`` when it is a number, else 16).

lm-eval's own ``device`` (its ``--device``) sets the device of a provider that has one (Transformers' ``device``)
only when the user gave it: lm-eval's command line passes ``cuda:0`` when ``--device`` is left out, and that
default must not override ``TRANSFORMERS_DEVICE=cpu`` (or the provider's own default, ``cpu``). A ``device`` in
``model_args`` wins over ``--device``.
"""

from __future__ import annotations

import asyncio
import contextvars
import difflib
import inspect
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from inference._core.dependencies import import_optional
from inference.config import SETTINGS, resolve_provider_type, resolve_settings
from inference.exceptions import ConfigurationError
from inference.options import OPTIONS
from inference.provider import InferenceProvider
from inference.registry import PROVIDERS, load_provider_class
from inference.results import GenerationResult, ScoreResult

_LM: Any = import_optional("lm_eval.api.model", provider="lm-eval", extra="lm-eval").LM
# lm-eval registers its own models (hf, vllm, dummy...) only while its registry is empty: ours first would hide them.
import_optional("lm_eval.models", provider="lm-eval", extra="lm-eval")
_register_model: Any = import_optional("lm_eval.api.registry", provider="lm-eval", extra="lm-eval").register_model

__all__ = ["InferenceLM", "main"]

logger = logging.getLogger("inference")
_T = TypeVar("_T")

_OWN_ARGUMENTS = ("provider", "adapter", "adapter_id", "model", "max_concurrency")
_LM_EVAL_ARGUMENTS = ("batch_size", "max_batch_size", "device")
"""What lm-eval adds to every model's arguments; ``batch_size`` sets the concurrency, ``device`` the device of a
provider that has that setting (when the user gave it), ``max_batch_size`` does not apply."""

_DEVICE_GIVEN: contextvars.ContextVar[bool | None] = contextvars.ContextVar("inference_lm_eval_device_given")
"""While :func:`main` runs lm-eval's command line: whether its ``device`` came from the user (``--device``, or
``device:`` in its ``--config`` file) rather than from lm-eval's default. Unset elsewhere: from Python,
``simple_evaluate`` passes a device only when its caller gives one."""


class _Loop:
    """An event loop running in a daemon thread, for a synchronous caller."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="inference-lm-eval", daemon=True)
        self.thread.start()

    def run(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Run ``work`` on the loop and wait for it; an interrupted wait (Ctrl-C) cancels the work."""
        if threading.current_thread() is self.thread:
            work.close()
            raise RuntimeError("the lm-eval model cannot be called from its own event loop")
        if not self.loop.is_running():
            work.close()
            raise RuntimeError("this lm-eval model is closed: create a new one")
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # a no-op when it is done; else the provider's requests are cancelled too
            raise

    def stop(self) -> None:
        """Stop the loop, wait for its thread, and close it."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=30)
        if not self.thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


def _shutdown(loop: _Loop, provider: InferenceProvider | None) -> None:
    """Close ``provider`` on ``loop``, then stop the loop (a ``weakref.finalize`` callback: it holds no model)."""
    try:
        if provider is not None and loop.loop.is_running():
            loop.run(provider.aclose())
    except BaseException:  # at interpreter exit the provider's own threads may be gone first
        logger.debug("closing the lm-eval model's provider failed", exc_info=True)
    finally:
        loop.stop()


@_register_model("inference")
class InferenceLM(_LM):  # type: ignore[misc]
    """lm-eval's model interface over an inference provider (see the module's documentation).

    Args:
        provider: The provider type (``llamacpp``, ``transformers``, ``vllm``, ``fake``...); else
            ``INFERENCE_PROVIDER``.
        **arguments: The provider's settings and constructor arguments, and ``adapter``, ``adapter_id``,
            ``model``, ``max_concurrency``; lm-eval's own ``batch_size``, ``max_batch_size`` and ``device``.

    Raises:
        UnknownProviderError: ``provider`` is not a provider type.
        ConfigurationError: An argument that is neither one of the provider's settings nor one of this model's,
            or a setting that breaks its rule.
        MissingDependencyError: The provider's extra is not installed.
    """

    def __init__(self, provider: str | None = None, **arguments: Any) -> None:
        super().__init__()
        provider_type = resolve_provider_type(provider)
        keys = {setting.key for setting in SETTINGS[provider_type]}
        provider_class = load_provider_class(provider_type)
        parameters = set(inspect.signature(provider_class).parameters) - keys
        unknown = sorted(set(arguments) - keys - parameters - set(_OWN_ARGUMENTS) - set(_LM_EVAL_ARGUMENTS))
        if unknown:
            valid = sorted(keys | parameters | set(_OWN_ARGUMENTS))
            close = [match for key in unknown for match in difflib.get_close_matches(key, valid, n=1, cutoff=0.8)]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigurationError(
                f"model_args {', '.join(unknown)} are not settings of the {provider_type} provider{hint}; valid: "
                f"{', '.join(valid)}",
                provider=provider_type,
            )
        settings = resolve_settings(provider_type, {key: arguments[key] for key in keys if key in arguments})
        settings |= {key: arguments[key] for key in parameters if key in arguments}
        self.provider_type = provider_type
        model_setting = PROVIDERS[provider_type].model_setting or "base_model"  # Ollama's base_model
        default_model = settings.get(model_setting)
        self.model_name = str(arguments.get("model") or default_model or "")
        batch_size = arguments.get("batch_size")  # lm-eval's command line passes it as text ("4", "auto:4")
        if isinstance(batch_size, str) and batch_size.strip().isdigit():
            batch_size = int(batch_size)
        default = batch_size if isinstance(batch_size, int) and batch_size > 0 else 16
        concurrency = arguments.get("max_concurrency")
        concurrency = default if concurrency is None else concurrency
        try:
            self.max_concurrency = int(concurrency)
        except (TypeError, ValueError):
            self.max_concurrency = 0
        if self.max_concurrency < 1 or isinstance(concurrency, bool) or self.max_concurrency != float(concurrency):
            raise ConfigurationError(
                f"max_concurrency must be a whole number of at least 1, got {concurrency!r}", provider=provider_type
            )
        self.adapter_id: str | None = None
        self._loop = _Loop()
        self._closer = weakref.finalize(self, _shutdown, self._loop, None)
        self.provider: InferenceProvider = self._loop.run(self._create(provider_class, settings))
        self._closer.detach()
        self._closer = weakref.finalize(self, _shutdown, self._loop, self.provider)
        adapter = arguments.get("adapter")
        if adapter:
            self.adapter_id = str(arguments.get("adapter_id") or _adapter_name(str(adapter)))
            try:
                self._loop.run(self.provider.load_adapter(self.adapter_id, str(adapter)))
            except BaseException:
                self.close()
                raise

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None) -> InferenceLM:
        """Build the model from lm-eval's ``model_args`` string and its own arguments (see
        :meth:`create_from_arg_obj`)."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None
    ) -> InferenceLM:
        """Build the model from ``model_args`` and lm-eval's own arguments (``batch_size``, ``max_batch_size``,
        ``device``).

        ``model_args`` win over lm-eval's arguments of the same name (lm-eval would pass both and fail). lm-eval's
        ``device`` is used only when the user gave it: its command line's default (``cuda:0``) is dropped, so the
        provider's own setting (``TRANSFORMERS_DEVICE``, default ``cpu``) applies.
        """
        arguments = dict(arg_dict)
        given = {key: value for key, value in (additional_config or {}).items() if value is not None}
        device = given.pop("device", None)
        if device is not None and "device" not in arguments:
            if _DEVICE_GIVEN.get(None) is False:
                logger.info(
                    "lm-eval's default device %r is not used: the provider's device setting applies (give "
                    "--device or device= in model_args to choose one)",
                    device,
                )
            else:
                arguments["device"] = device
        elif device is not None and str(device) != str(arguments["device"]):
            logger.warning("model_args device=%s is used, not lm-eval's --device %s", arguments["device"], device)
        for key, value in given.items():
            arguments.setdefault(key, value)
        return cls(**arguments)

    @staticmethod
    async def _create(provider_class: type, settings: dict[str, Any]) -> InferenceProvider:
        provider: InferenceProvider = provider_class(**settings)  # on the private loop: its locks bind there
        return provider

    def close(self) -> None:
        """Close the provider and stop its loop (also done on garbage collection and at exit). Safe to call twice."""
        self._closer()

    @property
    def tokenizer_name(self) -> str:
        """What lm-eval's request cache keys chat-templated prompts by: the provider and its model."""
        return f"inference-{self.provider_type}-{self.model_name}"

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Refused: the SDK applies the model's chat template itself (see the docs page ``lm-eval.md``).

        Raises:
            ConfigurationError: Always, naming the fix (run without ``--apply_chat_template``).
        """
        raise ConfigurationError(
            "the lm-eval model 'inference' does not take --apply_chat_template: generate_until prompts already go "
            "through the model's own chat template when it has one, and loglikelihood scores the plain text; "
            "run without --apply_chat_template (and without --fewshot_as_multiturn)",
            provider=self.provider_type,
        )

    def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``(logprob, is_greedy)`` of each request's continuation after its context (an empty one: ``(0, True)``)."""
        pairs = [(str(request.args[0]), str(request.args[1])) for request in requests]
        scored = [index for index, (_, continuation) in enumerate(pairs) if continuation]
        answers: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        if not scored:
            return answers
        with _Progress(len(scored), "loglikelihood", disable_tqdm) as progress:
            results = self._loop.run(
                self.provider.score_batch(
                    [pairs[index] for index in scored], self.model_name, self.adapter_id,
                    max_concurrency=self.max_concurrency, on_result=progress.update,
                )
            )
        for index, result in zip(scored, _raise_failures(results, ScoreResult), strict=True):
            answers[index] = (result.logprob, result.is_greedy)
        return answers

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each request's whole text (an empty text: 0)."""
        texts = [str(request.args[0]) for request in requests]
        scored = [index for index, text in enumerate(texts) if text]
        answers = [0.0] * len(texts)
        with _Progress(len(scored), "loglikelihood_rolling", disable_tqdm) as progress:
            results = self._loop.run(self._score_rolling_all([texts[index] for index in scored], progress.update))
        for index, result in zip(scored, _raise_failures(results, ScoreResult), strict=True):
            answers[index] = result.logprob
        return answers

    async def _score_rolling_all(self, texts: list[str], on_result: Callable[..., object]) -> list[Any]:
        semaphore = asyncio.Semaphore(self.max_concurrency)

        async def one(index: int, text: str) -> Any:
            async with semaphore:
                try:
                    result: Any = await self.provider.score_rolling(text, self.model_name, self.adapter_id)
                except Exception as error:
                    result = error
            on_result(index, result)
            return result

        return list(await asyncio.gather(*(one(index, text) for index, text in enumerate(texts))))

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
        with _Progress(len(requests), "generate_until", disable_tqdm) as progress:
            for key, indices in groups.items():
                prompts = [str(requests[index].args[0]) for index in indices]
                results = self._loop.run(
                    self.provider.generate_batch(
                        prompts, self.model_name, self.adapter_id, max_concurrency=self.max_concurrency,
                        on_result=progress.update, **options[key],
                    )
                )
                for index, result in zip(indices, _raise_failures(results, GenerationResult), strict=True):
                    texts[index] = result.text
        return texts


class _Progress:
    """A tqdm bar over one lm-eval call, advanced from the provider's loop (``on_result``)."""

    def __init__(self, total: int, what: str, disable: bool) -> None:
        tqdm = import_optional("tqdm", provider="lm-eval", extra="lm-eval")  # lm-eval's own dependency
        self._bar = tqdm.tqdm(total=total, desc=f"inference {what}", disable=disable or total == 0)
        self._lock = threading.Lock()

    def update(self, index: int, result: object) -> None:
        with self._lock:
            self._bar.update(1)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()


_MAX_TOKENS_NAMES = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
"""lm-eval's names for the most tokens to generate, first first (its ``normalize_gen_kwargs``)."""


def _adapter_name(adapter: str) -> str:
    """The default adapter id: the directory or file name, without ``.gguf`` (the directory's own name for ``.``)."""
    path = Path(adapter)
    name = path.name if path.name not in ("", ".", "..") else path.resolve().name
    return name.removesuffix(".gguf")


def _generation_options(gen_kwargs: Any) -> dict[str, Any]:
    """lm-eval's ``gen_kwargs`` as ``generate``'s options: ``until`` (and a ``stop``) -> ``stop`` (empty strings left
    out, as lm-eval's ``hf`` cuts at none), ``max_gen_toks`` (or ``max_new_tokens``, ``max_tokens``,
    ``max_completion_tokens``, in this order, as lm-eval reads them) -> ``max_tokens``, ``do_sample`` false or
    ``temperature`` 0 -> greedy; every other key that is an option of ``generate`` (a field of
    :class:`~inference.options.GenerationOptions`: ``top_p``, ``top_k``, ``min_p``, ``seed``, the penalties...) is
    passed on as it is, for the provider to check; others are ignored with a warning."""
    kwargs = dict(gen_kwargs or {})
    limits = [limit for limit in (kwargs.pop(name, None) for name in _MAX_TOKENS_NAMES) if limit is not None]
    options: dict[str, Any] = {"max_tokens": int(limits[0]) if limits else 256}
    stops = [stop for name in ("until", "stop") for stop in _strings(kwargs.pop(name, None))]
    if any(stops):
        options["stop"] = list(dict.fromkeys(stop for stop in stops if stop))
    do_sample = kwargs.pop("do_sample", None)
    temperature = kwargs.pop("temperature", None)
    if do_sample is False or temperature in (None, 0, 0.0):
        options["temperature"] = 0.0
        if do_sample:
            logger.warning("lm-eval gen_kwargs do_sample=True without a temperature: generating greedily")
    else:
        options["temperature"] = float(temperature)
    options |= {name: kwargs.pop(name) for name in list(kwargs) if name in OPTIONS}
    if kwargs:
        logger.warning("lm-eval gen_kwargs %s are not generation options of the SDK; ignored", sorted(kwargs))
    return options


def _strings(value: Any) -> list[Any]:
    """A string or strings as a list (``None``: none)."""
    return [value] if isinstance(value, str) else list(value or ())


def _raise_failures(results: Sequence[Any], kind: type[_T]) -> list[_T]:
    """lm-eval has no per-request errors: the first failure is raised."""
    for result in results:
        if not isinstance(result, kind):
            raise result if isinstance(result, BaseException) else TypeError(f"unexpected result {result!r}")
    return list(results)


def main(argv: Sequence[str] | None = None) -> int:
    """Run lm-eval's command line with the model ``inference`` registered (``inference lm-eval ARGS``).

    Args:
        argv: lm-eval's arguments (``--model inference --model_args ... --tasks ...``); default ``sys.argv[1:]``.

    Returns:
        lm-eval's exit status (0 on success).
    """
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]
    device_given = _DEVICE_GIVEN.set(_device_given(sys.argv[1:]))
    try:
        cli_evaluate()
    except SystemExit as exit_request:
        code = exit_request.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
        _DEVICE_GIVEN.reset(device_given)
    return 0


def _device_given(argv: Sequence[str]) -> bool:
    """Whether lm-eval's command line ``argv`` chooses a device: ``--device`` (or an abbreviation argparse takes,
    such as ``--dev``), or a ``--config``/``-C`` YAML file with a ``device``."""
    for index, word in enumerate(argv):
        name, equals, value = word.partition("=")
        if len(name) > 2 and name.startswith("--") and "--device".startswith(name):
            return True
        if name in ("--config", "-C") or (name.startswith("-C") and len(name) > 2):
            path = value if equals else (name[2:] if name.startswith("-C") and len(name) > 2 else None)
            if path is None and index + 1 < len(argv):
                path = argv[index + 1]
            if path and _config_device(path) is not None:
                return True
    return False


def _config_device(path: str) -> object:
    """The ``device`` of an lm-eval YAML config file, or ``None`` (also when it cannot be read: lm-eval says why)."""
    try:
        import yaml  # type: ignore[import-untyped]  # lm-eval's own dependency

        with open(path, encoding="utf-8") as file:
            config = yaml.safe_load(file)
    except Exception:  # lm-eval reads it next and reports the problem itself
        return None
    return config.get("device") if isinstance(config, dict) else None
