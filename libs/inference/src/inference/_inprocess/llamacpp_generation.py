"""One llama.cpp request's generation: its prompt checked against the context, its JSON mask and sampler settings,
and the two ways it runs.

- :meth:`Generation.alone` runs a request by itself with ``Llama.generate`` (``n_parallel=1``);
- :class:`LoopBackend` is the provider as the decode loop sees it
  (:class:`~inference._inprocess.llamacpp_batch.BatchBackend`, ``n_parallel > 1``): the same preparation, and a
  sampler chain of the request's own; a request for ``n`` completions gets ``n`` of them
  (:class:`~inference._inprocess.llamacpp_batch.Branches`: the prompt decoded once, choice ``k`` seeded
  ``seed + k``, :func:`choice_seeds`).

Either way each sampled token goes to the request's :class:`~inference._inprocess.llamacpp_completion.Completion`,
which decides when it ends. Sampling: a request's ``None`` settings take llama.cpp's defaults
(:data:`DEFAULT_SAMPLING`); a request without ``seed`` uses the provider's (``None``: a fresh random seed).
All on the provider's worker thread.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from inference._core.dependencies import import_optional
from inference._core.validation import AdapterScales, GenerationRequest
from inference._inprocess.constrained import schema_subject
from inference._inprocess.llamacpp_batch import BatchEntry, Branches, Started
from inference._inprocess.llamacpp_completion import Completion, TokenText
from inference._inprocess.llamacpp_logits import JsonMask, clear_memory
from inference._inprocess.llamacpp_model import LlamaCppModel
from inference._inprocess.llamacpp_native import PromptAbort
from inference._inprocess.llamacpp_prompt import LlamaPrompts
from inference._inprocess.llamacpp_scoring import ScoreJob, ScoreWork, start_score
from inference._inprocess.schema_matchers import SchemaMatchers
from inference._inprocess.streaming import PieceSink
from inference.exceptions import InferenceError, ProviderError, TokenLimitError
from inference.provider import GenerationResult

__all__ = [
    "DEFAULT_SAMPLING",
    "MAX_SEED",
    "ChoicesApart",
    "Generation",
    "LoopBackend",
    "choice_seeds",
    "seed_fits",
    "seed_rule",
]

DEFAULT_SAMPLING: dict[str, float] = {
    "temperature": 0.8,
    "top_p": 0.95,
    "top_k": 40,
    "min_p": 0.05,
    "repeat_penalty": 1.0,
}
"""llama.cpp's own defaults, used for every sampling setting a request leaves as ``None``."""

MAX_SEED = 2**32 - 2
"""The largest seed llama.cpp takes: its samplers take a ``uint32_t`` and read ``0xFFFFFFFF`` as "random"."""


def seed_fits(seed: int) -> bool:
    """True for a seed llama.cpp takes as that seed (``[0, MAX_SEED]``)."""
    return 0 <= seed <= MAX_SEED


def seed_rule(seed: int) -> str:
    """What is wrong with a seed :func:`seed_fits` refuses, and what to give instead."""
    return (
        f"{seed} is out of range for llama.cpp: use an integer in [0, {MAX_SEED}] "
        "(llama.cpp seeds are 32-bit and 4294967295 means a random seed), or None for a fresh random seed"
    )


def choice_seeds(request: GenerationRequest, default: int | None) -> list[int | None]:
    """The sampler seed of each of a request's ``n`` choices: ``seed + k`` for choice ``k`` (the seeds ``n``
    requests of one completion get), from the request's seed, else the provider's (``default``); ``None`` each
    (a fresh random seed per choice) when neither is set."""
    seed = request.seed if request.seed is not None else default
    return [None if seed is None else seed + index for index in range(request.n)]


class ChoicesApart(Exception):
    """A request for ``n`` completions whose prompt plus ``n`` token limits does not fit the context, although one
    completion does: its choices are asked for one request each (the provider catches this)."""


class Generation:
    """How the provider's requests generate on its model (worker thread).

    Args:
        model: The provider's model.
        prompts: Its prompts' token ids.
        seed: The seed of requests that give none (``None``: a fresh random one per request).
        require_prompt: Refuses an empty prompt (the in-process providers' one error for it).
    """

    def __init__(
        self,
        model: LlamaCppModel,
        prompts: LlamaPrompts,
        *,
        seed: int | None,
        require_prompt: Callable[[Sequence[int]], None],
    ) -> None:
        self.model = model
        self.prompts = prompts
        self.seed = seed
        self._require_prompt = require_prompt
        self._tokens: TokenText | None = None  # the loaded model's token helpers
        self._schemas: SchemaMatchers | None = None  # the loaded model's, made by its first json_schema request
        self._schemas_llama: Any = None  # the Llama they were made for

    def prepare(self, llama: Any, request: GenerationRequest, sink: PieceSink | None) -> tuple[list[int], Completion]:
        """Tokenise a request, check that it fits the context and compile its JSON mask."""
        provider, n_ctx = self.model.provider, self.model.settings.n_ctx
        prompt = self.prompts.tokens(llama, request)
        self._require_prompt(prompt)
        room = n_ctx - len(prompt)
        if room < 1:
            raise TokenLimitError(
                f"the prompt is {len(prompt)} tokens, which does not fit the context of {n_ctx} tokens: "
                "shorten it or raise n_ctx (LLAMACPP_N_CTX)",
                limit=n_ctx - 1, value=len(prompt), kind="context", provider=provider,
            )
        return prompt, self.completion(llama, request, sink, room)

    def completion(self, llama: Any, request: GenerationRequest, sink: PieceSink | None, room: int) -> Completion:
        """A new completion of ``request`` (its JSON mask compiled), with ``room`` cells left after the prompt."""
        if self._tokens is None or self._tokens.llama is not llama:
            numpy = import_optional("numpy", provider=self.model.provider, extra="llamacpp")
            self._tokens = TokenText(self.model.llama_cpp(), numpy, llama, self.model.provider)
        mask = self._json_mask(llama, request)
        return Completion(request, self._tokens, sink, min(request.max_tokens, room), mask)

    def sampling(
        self, llama: Any, request: GenerationRequest, completion: Completion, choice: int = 0
    ) -> dict[str, Any]:
        """The sampler settings of a request (of its choice ``choice``, seeded ``seed + choice``), as
        ``Llama.generate`` takes them; sets the model's seed."""
        llama_cpp = self.model.llama_cpp()
        seed = request.seed if request.seed is not None else self.seed
        seed = None if seed is None else seed + choice
        llama.set_seed(seed if seed is not None else llama_cpp.LLAMA_DEFAULT_SEED)
        return {
            "temp": DEFAULT_SAMPLING["temperature"] if request.temperature is None else request.temperature,
            "top_p": DEFAULT_SAMPLING["top_p"] if request.top_p is None else request.top_p,
            "top_k": int(DEFAULT_SAMPLING["top_k"]) if request.top_k is None else request.top_k,
            "min_p": DEFAULT_SAMPLING["min_p"] if request.min_p is None else request.min_p,
            "repeat_penalty": (
                DEFAULT_SAMPLING["repeat_penalty"]
                if request.repetition_penalty is None
                else request.repetition_penalty
            ),
            "frequency_penalty": request.frequency_penalty or 0.0,
            "presence_penalty": request.presence_penalty or 0.0,
            "logits_processor": self._processors(llama_cpp, request, completion),
        }

    def _processors(self, llama_cpp: Any, request: GenerationRequest, completion: Completion) -> Any:
        """The logits processors of a request, first in the sampler chain: its ``logit_bias``, then the JSON mask."""
        processors: list[Any] = []
        if request.logit_bias:
            numpy = import_optional("numpy", provider=self.model.provider, extra="llamacpp")
            ids = numpy.array(list(request.logit_bias), dtype=numpy.intp)
            values = numpy.array(list(request.logit_bias.values()), dtype=numpy.float32)

            def biased(input_ids: Any, scores: Any) -> Any:
                inside = ids < len(scores)
                scores[ids[inside]] += values[inside]
                return scores

            processors.append(biased)
        if completion.mask is not None:
            processors.append(completion.mask)
        return llama_cpp.LogitsProcessorList(processors) if processors else None

    def alone(
        self, llama: Any, request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event
    ) -> GenerationResult:
        """Generate one request alone on ``llama`` (its adapters applied), with ``Llama.generate``.

        Each token goes to the request's :class:`Completion`, which decides when it ends and hands its
        pieces to ``sink``. Setting ``cancel`` stops the loop after the current token (the result is then of
        no use to anyone), and stops the prompt's evaluation inside ``llama_decode`` (llama.cpp's abort
        callback, set until the first token: a long prompt is seconds of work on a busy CPU).
        """
        prompt, completion = self.prepare(llama, request, sink)
        tokens = llama.generate(prompt, **self.sampling(llama, request, completion))
        llama_cpp = self.model.llama_cpp()
        abort = PromptAbort(llama_cpp, llama.ctx, cancel)
        failed = True
        try:
            for token in tokens:
                abort.lift()  # the prompt is in
                if cancel.is_set() or completion.add(token, lambda: completion.tokens.logits(llama.ctx, -1)):
                    break
            failed = False
        except RuntimeError:
            if not cancel.is_set():
                raise
            failed = False  # llama_decode aborted the prompt: its cells are already removed, nothing is poisoned
            return self.cancelled(request)
        finally:
            abort.lift()
            tokens.close()  # released here, on the worker thread, not whenever it is collected
            if failed:  # NaN logits leave NaN in the KV cache, which would poison the next requests
                clear_memory(llama_cpp, llama)
        return completion.result(model=self.model.name, prompt_tokens=len(prompt))

    def cancelled(self, request: GenerationRequest) -> GenerationResult:
        """The (unread) result of a request whose caller gave up before it started."""
        return GenerationResult(
            text="", model=self.model.name, adapter_id=request.adapter_id, token_count=0, finish_reason="stop"
        )

    def _json_mask(self, llama: Any, request: GenerationRequest) -> JsonMask | None:
        """The request's JSON-schema mask, compiled before anything is generated (``None`` without a schema)."""
        if request.json_schema is None:
            return None
        numpy = import_optional("numpy", provider=self.model.provider, extra="llamacpp")
        if self._schemas is None or self._schemas_llama is not llama:  # reload mode rebuilt the model
            # llguidance's tokenizer keeps the model's vocabulary pointer, freed with the model it came from.
            self._schemas, self._schemas_llama = SchemaMatchers(self.model.provider, "llamacpp"), llama
        return JsonMask(numpy, self._schemas.matcher(
            request.json_schema, lambda _: self._tokenizer(llama), schema_subject(request)))

    def _tokenizer(self, llama: Any) -> Any:
        """llguidance's tokenizer for the model's vocabulary."""
        from llguidance.llamacpp import lltokenizer_from_vocab

        vocab = self.model.llama_cpp().llama_model_get_vocab(llama.model)
        with warnings.catch_warnings():  # llguidance calls llama_token_get_attr, deprecated by llama-cpp-python
            warnings.simplefilter("ignore", DeprecationWarning)
            return lltokenizer_from_vocab(vocab)


class LoopBackend:
    """The provider as the decode loop sees it (:class:`~inference._inprocess.llamacpp_batch.BatchBackend`).

    Args:
        generation: How its requests generate.
        activate: Applies adapters to the model and returns the ``Llama`` (the provider's, which knows the resident
            adapters).
        others_waiting: True when other work (a load, a next-token call, closing) is queued for the worker thread.
    """

    def __init__(
        self,
        generation: Generation,
        activate: Callable[[AdapterScales], Any],
        others_waiting: Callable[[], bool],
    ) -> None:
        self.generation = generation
        self.llama_cpp = generation.model.llama_cpp()
        self._activate = activate
        self._others_waiting = others_waiting

    def activate(self, adapters: AdapterScales) -> Any:
        return self._activate(adapters)

    def start(self, llama: Any, entry: BatchEntry) -> Started | Branches | ScoreWork:
        generation = self.generation
        request = entry.request
        if isinstance(request, ScoreJob):
            return start_score(generation.prompts, llama, request)
        prompt, completion = generation.prepare(llama, request, entry.sink)
        if request.n == 1:
            return Started(prompt, self._sampler(llama, request, completion, 0), completion)
        n_ctx = generation.model.settings.n_ctx
        if len(prompt) + request.n * completion.limit > n_ctx:
            raise ChoicesApart  # one completion fits (prepare checked), n of them beside one prompt do not
        completions = [completion]
        completions += [generation.completion(llama, request, None, n_ctx - len(prompt)) for _ in range(request.n - 1)]
        started: list[Started] = []
        try:
            for choice, each in enumerate(completions):
                started.append(Started(prompt, self._sampler(llama, request, each, choice), each))
        except BaseException:
            for made in started:
                made.close()
            raise
        return Branches(tuple(started))

    def _sampler(self, llama: Any, request: GenerationRequest, completion: Completion, choice: int) -> Any:
        """The chain ``Llama.generate`` builds, seeded with the request's seed (``+ choice`` for its choice)."""
        sampling = self.generation.sampling(llama, request, completion, choice)
        return llama._init_sampler(
            top_k=sampling["top_k"],
            top_p=sampling["top_p"],
            min_p=sampling["min_p"],
            temp=sampling["temp"],
            repeat_penalty=sampling["repeat_penalty"],
            frequency_penalty=sampling["frequency_penalty"],
            presence_penalty=sampling["presence_penalty"],
            logits_processor=sampling["logits_processor"],
        )

    def finish(self, entry: BatchEntry, completion: Completion, prompt_tokens: int) -> GenerationResult:
        return completion.result(model=self.generation.model.name, prompt_tokens=prompt_tokens)

    def failed(self, error: BaseException) -> BaseException:
        if isinstance(error, InferenceError):
            return error
        return ProviderError(
            f"llama.cpp failed to generate ({type(error).__name__}: {error}); the provider is still usable",
            provider=self.generation.model.provider,
        )

    def others_waiting(self) -> bool:
        return self._others_waiting()
