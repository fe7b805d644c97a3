"""Generation on a Transformers model: batch rows, sampling, logprob recording, JSON masks and the stream watch.

:class:`HFGeneration` turns a batch of queued requests (see :mod:`inference._inprocess.batching`) into rows, runs
them as ONE left-padded ``model.generate`` in which each row applies its own adapter (PEFT's per-row
``adapter_names``, from :class:`~inference._inprocess.peft_slots.PeftSlots`), and cuts each row's tokens back into
its :class:`~inference.GenerationResult`. A streamed request runs alone, as a one-row ``generate`` whose stream
watch hands each new token's text to the caller.

Inside one ``generate``, per row: :class:`~inference._inprocess.batching.RowLimits` and
:class:`~inference._inprocess.batching.RowsCancelled` stop it at its own limit or once its caller gave up,
:class:`~inference._inprocess.constrained.GrammarRows` masks what its JSON schema does not allow, and the processors
of :mod:`inference._inprocess.hf_processors` keep its logprobs, end it at once when its logits are not finite (the
other rows go on) and stream it. Requests share a batch only when their :class:`Sampling` is equal.

A request for ``n`` completions runs as a batch of its own, ``n`` rows of one prompt: the prompt but its last token
goes through the model once, its keys and values are repeated for the ``n`` rows, and ``generate`` goes on from them
(only the last prompt token is computed per row). Seeded, each row samples with a generator of its own, seeded
``seed + k`` for choice ``k`` (``SeededRows``): the draws ``torch.manual_seed(seed + k)`` gives a request alone, so
the choices are those of ``n`` requests with those seeds (up to the float rounding of the shared prompt).

Everything here runs on the provider's worker thread; torch, transformers and llguidance are imported on first use.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from inference._core.dependencies import import_optional
from inference._core.validation import GenerationRequest
from inference._inprocess.base import non_finite_logits, require_prompt
from inference._inprocess.batching import BatchRow, PendingRequest, RowLimits, RowsCancelled, cut_row, left_pad
from inference._inprocess.constrained import GrammarRows, JsonGrammars, schema_subject
from inference._inprocess.hf_model import LoadedModel, as_inference_error
from inference._inprocess.hf_penalties import LogitBias, OpenAIPenalties
from inference._inprocess.hf_processors import FiniteRows, LogprobRecorder, MethodProcessor, SeededRows, StreamWatch
from inference._inprocess.hf_prompt import prompt_token_ids
from inference._inprocess.memory import free_cached_memory, out_of_memory
from inference._inprocess.peft_slots import PeftSlots
from inference._inprocess.streaming import PieceAssembler, PieceSink
from inference.exceptions import InvalidRequestError, ProviderError, TokenLimitError
from inference.provider import GenerationResult

logger = logging.getLogger("inference.transformers")

__all__ = [
    "MAX_SEED",
    "MIN_SEED",
    "GenerateRows",
    "HFGeneration",
    "Outputs",
    "Row",
    "Sampling",
    "check_seed",
]

MIN_SEED = -(2**63)
MAX_SEED = 2**64 - 1
"""The seeds ``torch.manual_seed`` takes (negative ones are mapped onto the unsigned range)."""

Queued = PendingRequest[GenerationRequest, GenerationResult]
"""A generation request on its way to the worker."""


@dataclass(frozen=True)
class Row(BatchRow):
    """A batch row with its JSON-schema matcher (``None`` for a free row), and which of its request's ``n`` choices it
    is."""

    matcher: Any = None
    choice: int = 0


@dataclass
class Outputs:
    """What one ``generate`` over a batch left: each row's new tokens, and the per-row bookkeeping."""

    tokens: list[list[int]]
    logprobs: LogprobRecorder | None
    grammar: GrammarRows | None
    finite: FiniteRows | None = None


@dataclass(frozen=True)
class Sampling:
    """Decoding settings resolved against the model's defaults; requests share a batch only when equal."""

    do_sample: bool
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int | None
    alone: object | None = None  # a fresh object for seeded sampling: it runs alone, so it reproduces
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_p: float | None = None


class GenerateRows(Protocol):
    """Runs one ``generate`` over rows (:meth:`HFGeneration.generate_rows`, or a provider's step around it)."""

    def __call__(self, loaded: LoadedModel, rows: list[Row], watch: Callable[..., Any] | None = None) -> Outputs: ...


def check_seed(request: GenerationRequest, *, provider: str) -> None:
    """Refuse a seed torch cannot take, before the request is queued."""
    if request.seed is not None and not MIN_SEED <= request.seed <= MAX_SEED:
        raise InvalidRequestError(
            f"seed {request.seed} is out of range for transformers: use an integer in "
            f"[{MIN_SEED}, {MAX_SEED}] (what torch.manual_seed takes), or None",
            provider=provider,
        )


class HFGeneration:
    """Runs generation requests on a loaded model: batches of rows, or one streamed row.

    Args:
        slots: The model's adapter slots (what each row applies).
        batch_sizes: Where each ``generate``'s number of rows is recorded (shared with scoring).
        provider: The provider's name, for errors.
    """

    def __init__(self, slots: PeftSlots, batch_sizes: deque[int], *, provider: str) -> None:
        self.slots = slots
        self.batch_sizes = batch_sizes
        self.provider = provider

    def sampling(self, loaded: LoadedModel, request: GenerationRequest) -> Sampling:
        """The request's batch key: its decoding settings, the model's defaults filled in."""
        defaults = loaded.model.generation_config
        penalty = request.repetition_penalty or defaults.repetition_penalty or 1.0
        greedy = request.temperature == 0 or (request.temperature is None and not defaults.do_sample)
        adjustments: dict[str, Any] = {
            "presence_penalty": float(request.presence_penalty or 0.0),
            "frequency_penalty": float(request.frequency_penalty or 0.0),
            "logit_bias": tuple(sorted((request.logit_bias or {}).items())),
        }
        if greedy:
            alone = None if request.n == 1 else object()  # n choices: rows of one prompt, a batch of their own
            return Sampling(False, 1.0, 1.0, 50, float(penalty), None, alone, **adjustments)
        temperature = request.temperature if request.temperature is not None else defaults.temperature
        top_p = request.top_p if request.top_p is not None else defaults.top_p
        top_k = request.top_k if request.top_k is not None else defaults.top_k
        return Sampling(
            do_sample=True,
            temperature=float(1.0 if temperature is None else temperature),
            top_p=float(1.0 if top_p is None else top_p),
            top_k=int(50 if top_k is None else top_k),
            repetition_penalty=float(penalty),
            seed=request.seed,
            alone=None if request.seed is None and request.n == 1 else object(),
            min_p=request.min_p,
            **adjustments,
        )

    def run_batch(self, loaded: LoadedModel, batch: list[Queued], generate: GenerateRows) -> None:
        """Answer every request of ``batch`` (its future gets the result or the error) with ``generate``.

        A request that fails on its own (its prompt, its adapter) fails alone; when the ``generate`` itself
        fails, each request is run again alone, so only the one that makes it fail gets the error. Out of memory
        (``torch.OutOfMemoryError``), the batch is run again as two halves, each halved again while it runs out,
        down to one row, with a warning each time: only a request that runs out of memory alone gets the error.
        A request for ``n`` completions is a batch of its own (:meth:`_run_choices`).
        """
        if len(batch) == 1 and batch[0].request.n > 1:
            self._run_choices(loaded, batch[0], generate)
            return
        rows: list[Row] = []
        with self.slots.holding(entry.request.adapter_scales for entry in batch):
            for entry in batch:
                if entry.cancel.is_set():  # its caller gave up after the batch was formed
                    _drop(entry, self.provider)
                    continue
                try:
                    self.slots.applied(loaded, entry.request.adapter_id, entry.request.adapter_scales)  # builds a mix
                    rows.append(self._row(loaded, entry))
                except BaseException as error:
                    entry.future.set_exception(as_inference_error(error, provider=self.provider))
        if not rows:
            return
        outputs: Outputs | None = None
        try:
            outputs = generate(loaded, rows)
        except BaseException as error:
            if len(rows) == 1:
                rows[0].entry.future.set_exception(self._alone_error(error))
                return
            if not out_of_memory(error):
                for row in rows:  # find the request that fails on its own; the others still get answers
                    self.run_batch(loaded, [row.entry], generate)
                return
        if outputs is None:  # out of memory: the halves run here, once the failed batch's tensors are freed
            half = (len(rows) + 1) // 2
            free_cached_memory()
            logger.warning(
                "%s: out of memory generating a batch of %d rows: trying again as batches of %d and %d rows",
                self.provider, len(rows), half, len(rows) - half,
            )
            for part in (rows[:half], rows[half:]):
                self.run_batch(loaded, [row.entry for row in part], generate)
            return
        for index, row in enumerate(rows):
            if row.entry.cancel.is_set():  # stopped early at its caller's request: nobody reads a result
                _drop(row.entry, self.provider)
                continue
            try:
                row.entry.future.set_result(self._result(loaded, row, outputs, index))
            except BaseException as error:
                row.entry.future.set_exception(as_inference_error(error, provider=self.provider))

    def _run_choices(self, loaded: LoadedModel, entry: Queued, generate: GenerateRows) -> None:
        """Answer a request for ``n`` completions: its ``n`` rows in one ``generate``, the prompt computed once (see
        :meth:`generate_rows`); the result joins them (the prompt counted once). Any choice that fails fails the
        request."""
        try:
            self.slots.applied(loaded, entry.request.adapter_id, entry.request.adapter_scales)
            first = self._row(loaded, entry)
            results = self._choices(loaded, first, range(entry.request.n), generate)
        except BaseException as error:
            entry.future.set_exception(self._alone_error(error))
            return
        if entry.cancel.is_set():
            _drop(entry, self.provider)
            return
        entry.future.set_result(GenerationResult.from_choices(results))

    def _choices(
        self, loaded: LoadedModel, first: Row, choices: range, generate: GenerateRows
    ) -> list[GenerationResult]:
        """The results of ``choices`` of ``first``'s request, as rows of one ``generate``; out of memory, as two
        halves (each halved again while it runs out), each choice keeping its seed."""
        request = first.entry.request
        rows = [
            replace(first, choice=choice, matcher=None if request.json_schema is None else (
                self._grammars(loaded).matcher(request.json_schema, schema_subject(request))))
            for choice in choices
        ]
        try:
            outputs = generate(loaded, rows)
        except BaseException as error:
            if len(rows) == 1 or not out_of_memory(error):
                raise
            half = (len(rows) + 1) // 2
            free_cached_memory()
            logger.warning(
                "%s: out of memory generating %d choices of one request: trying again as %d and %d",
                self.provider, len(rows), half, len(rows) - half,
            )
            return [
                *self._choices(loaded, first, choices[:half], generate),
                *self._choices(loaded, first, choices[half:], generate),
            ]
        return [self._result(loaded, row, outputs, index) for index, row in enumerate(rows)]

    def _alone_error(self, error: BaseException) -> BaseException:
        """The error of a request that failed alone (out of memory: a sentence saying what to lower)."""
        if not out_of_memory(error):
            return as_inference_error(error, provider=self.provider)
        wrapped = ProviderError(
            f"transformers ran out of memory generating this request alone ({error}): ask for fewer max_tokens, "
            "shorten the prompt, or load the model with a smaller dtype or on a larger device",
            provider=self.provider,
        )
        wrapped.__cause__ = error
        return wrapped

    def stream(
        self,
        loaded: LoadedModel,
        request: GenerationRequest,
        sink: PieceSink | None,
        cancel: threading.Event,
        generate: GenerateRows,
    ) -> GenerationResult:
        """Run one request alone (no batch) with ``generate``, handing its text to ``sink`` token by token."""
        self.slots.applied(loaded, request.adapter_id, request.adapter_scales)
        entry: Queued = PendingRequest(request, cancel=cancel)
        entry.key = self.sampling(loaded, request)
        row = self._row(loaded, entry)
        pieces = PieceAssembler(request.stop, sink)
        torch = import_optional("torch", extra="transformers", provider=self.provider)
        watch = StreamWatch(torch, len(row.prompt_ids), loaded.eos_ids, loaded.decode, pieces)
        try:
            outputs = generate(loaded, [row], watch)
        except BaseException as error:
            raise as_inference_error(error, provider=self.provider) from None
        result = self._result(loaded, row, outputs, 0)
        if not cancel.is_set():
            pieces.finish(result.text)
        return result

    def generate_rows(self, loaded: LoadedModel, rows: list[Row], watch: Callable[..., Any] | None = None) -> Outputs:
        """One left-padded ``generate`` over all rows, each with its own adapter; returns the new tokens.

        A row stops at its own limit, at its next token once its request's cancel flag is set, or once its
        JSON is complete. ``watch`` is one more stopping criterion (a streamed row's token watcher).

        Logits processors, in order: the logprob recorder (it sees the model's raw logits), the repetition
        penalty, the JSON-schema masks; then ``generate``'s temperature, top-k and top-p.

        Rows that are the ``n`` choices of one request share their prompt: it is computed once, but its last token
        (:func:`shared_prompt`), and ``generate`` starts from its keys and values; seeded, each row samples with its
        own generator (:class:`~inference._inprocess.hf_processors.SeededRows`).
        """
        torch = import_optional("torch", extra="transformers", provider=self.provider)
        transformers = import_optional("transformers", extra="transformers", provider=self.provider)
        sampling = rows[0].entry.key
        assert isinstance(sampling, Sampling)
        plain_rows: list[BatchRow] = list(rows)
        input_ids, attention_mask = left_pad(torch, plain_rows, loaded.pad_id)
        width = input_ids.shape[1]
        limits = [row.limit for row in rows]
        processors: list[Any] = []
        penalty = sampling.repetition_penalty
        wanted = [row.entry.request.logprobs for row in rows]
        recorder = None
        if any(k is not None for k in wanted):
            recorder = LogprobRecorder(torch, max(k or 0 for k in wanted))
            processors.append(recorder)
            if penalty != 1.0:  # after the recorder: generate would apply its own before every custom processor
                padding = (attention_mask != 0).int().argmax(dim=1).to(loaded.device)
                processors.append(transformers.RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=padding))
                penalty = 1.0
        if sampling.logit_bias:
            size = loaded.model.get_output_embeddings().weight.shape[0]
            processors.append(LogitBias(torch, dict(sampling.logit_bias), size, loaded.device))
        if sampling.presence_penalty or sampling.frequency_penalty:
            processors.append(OpenAIPenalties(torch, sampling.presence_penalty, sampling.frequency_penalty, width))
        grammar = None
        if any(row.matcher is not None for row in rows):
            grammar = GrammarRows(torch, [row.matcher for row in rows], width, limits)
            processors.append(grammar)
        finite = FiniteRows(torch, len(rows), min(loaded.eos_ids, default=loaded.pad_id), loaded.overflow)
        processors.insert(0, MethodProcessor(finite.check))  # the raw logits, before any penalty or mask
        processors.append(MethodProcessor(finite.force))  # last: sampling never sees the logits of a failed row
        config = transformers.GenerationConfig(
            max_new_tokens=max(limits),
            do_sample=sampling.do_sample,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            repetition_penalty=penalty,
            min_p=sampling.min_p,
            num_beams=1,
            pad_token_id=loaded.pad_id,
            eos_token_id=sorted(loaded.eos_ids) or None,
        )
        criteria: list[Any] = [
            RowLimits(torch.tensor(limits, device=loaded.device), width),
            RowsCancelled(torch, [row.entry for row in rows]),
        ]
        if grammar is not None:
            criteria.append(grammar.stops)
        criteria.append(finite.stops)
        if watch is not None:
            criteria.append(watch)
        applied = [(row.entry.request.adapter_id, row.entry.request.adapter_scales) for row in rows]
        choices = len(rows) > 1 and all(row.entry is rows[0].entry for row in rows)  # one request's n choices
        cache: dict[str, Any] = {}
        own_generators = False  # each row draws with a generator of its own (seeded choices)
        if choices:
            cache = shared_prompt(torch, loaded, self.slots, rows[0], len(rows), provider=self.provider)
            seeded = None
            if sampling.do_sample and sampling.seed is not None:
                seeds = [sampling.seed + row.choice for row in rows]
                seeded = SeededRows.of(torch, transformers, loaded, sampling, seeds)
            if seeded is not None:
                processors.append(seeded)
                config.do_sample = False  # SeededRows draws each row's token; generate takes it (argmax)
                config.temperature, config.top_p, config.top_k, config.min_p = 1.0, 1.0, 50, None
            own_generators = seeded is not None
        with self.slots.rows(loaded, applied) as extra, torch.inference_mode():
            if sampling.seed is not None and not own_generators:
                torch.manual_seed(sampling.seed)
            self.batch_sizes.append(len(rows))
            output = loaded.model.generate(
                input_ids=input_ids.to(loaded.device),
                attention_mask=attention_mask.to(loaded.device),
                generation_config=config,
                stopping_criteria=transformers.StoppingCriteriaList(criteria),
                logits_processor=transformers.LogitsProcessorList(processors),
                **cache,
                **extra,
            )
        new_tokens = output[:, width:]
        if recorder is not None:
            recorder.finish(new_tokens)
        tokens = [[int(token) for token in row] for row in new_tokens.tolist()]
        return Outputs(tokens, recorder, grammar, finite)

    def _row(self, loaded: LoadedModel, entry: Queued) -> Row:
        """Token ids per the in-process prompt rule (:mod:`inference._inprocess.hf_prompt`), and the row's matcher."""
        request = entry.request
        ids = prompt_token_ids(loaded.tokenizer, request, provider=self.provider)
        require_prompt(ids, provider=self.provider)
        room = request.max_tokens if loaded.context is None else loaded.context - len(ids)
        if room < 1:
            raise TokenLimitError(
                f"the prompt has {len(ids)} tokens, which fills the model's context of {loaded.context} "
                "tokens: shorten it",
                limit=(loaded.context or 1) - 1, value=len(ids), kind="context", provider=self.provider,
            )
        matcher = None if request.json_schema is None else self._grammars(loaded).matcher(
            request.json_schema, schema_subject(request))
        return Row(entry, ids, min(request.max_tokens, room), matcher)

    def _grammars(self, loaded: LoadedModel) -> JsonGrammars:
        """The model's JSON-schema grammars (made on first use: an llguidance tokenizer sized to the logits)."""
        if loaded.grammars is None:
            llguidance = import_optional("llguidance", extra="transformers", provider=self.provider)
            hf = import_optional("llguidance.hf", extra="transformers", provider=self.provider)
            width = int(loaded.base_model.get_output_embeddings().weight.shape[0])
            try:
                tokenizer = hf.from_tokenizer(
                    loaded.tokenizer,
                    n_vocab=max(width, len(loaded.tokenizer)),
                    eos_token=sorted(loaded.eos_ids) or [loaded.pad_id],
                )
            except ValueError as error:
                raise InvalidRequestError(
                    f"json_schema needs a fast (Rust) tokenizer and {loaded.name} has none ({error}): "
                    "save the model with its tokenizer.json",
                    provider=self.provider,
                ) from error
            loaded.grammars = JsonGrammars(llguidance, tokenizer, provider=self.provider)
        return loaded.grammars

    def _result(self, loaded: LoadedModel, row: Row, outputs: Outputs, index: int) -> GenerationResult:
        request = row.entry.request
        tokens, grammar = outputs.tokens[index], outputs.grammar
        if outputs.finite is not None and outputs.finite.failed(index, _steps(loaded, row, outputs, index)):
            raise non_finite_logits(self.provider, request.adapters)
        ended = None
        if grammar is not None and row.matcher is not None:
            error = grammar.errors[index]
            if error is not None:
                raise ProviderError(f"the JSON-schema grammar stopped with an error: {error}", provider=self.provider)
            ended = grammar.ended[index]
            if ended is not None:
                tokens = tokens[:ended]  # the JSON is complete (and, maybe, the end-of-sequence token after it)
        text, completion_tokens, kept, finish_reason = cut_row(
            tokens, row.limit, loaded.eos_ids, request.stop, loaded.decode
        )
        if ended is not None and ended <= row.limit:
            finish_reason = "stop"
        logprobs = None
        if outputs.logprobs is not None and request.logprobs is not None:
            logprobs = outputs.logprobs.row(loaded, index, tokens[:kept], request.logprobs)
        prompt_tokens = len(row.prompt_ids)
        return GenerationResult(
            text=text,
            model=loaded.name,
            adapter_id=request.adapter_id,
            token_count=prompt_tokens + completion_tokens,
            finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            logprobs=logprobs,
            token_ids=tuple(tokens[:kept]) if request.return_token_ids else None,
        )


def shared_prompt(
    torch: Any, loaded: LoadedModel, slots: PeftSlots, row: Row, rows: int, *, provider: str
) -> dict[str, Any]:
    """``generate``'s ``past_key_values`` for ``rows`` rows of ``row``'s prompt: the prompt but its last token, through
    the model once (with the row's adapters), its keys and values repeated per row; ``{}`` for a one-token prompt.

    Raises:
        ProviderError: The prompt's hidden state overflowed (an adapter or a scale too large for the model's numbers),
            as a row whose whole prompt went through ``generate`` would fail.
    """
    if len(row.prompt_ids) < 2:
        return {}
    request = row.entry.request
    ids = torch.tensor([row.prompt_ids[:-1]], dtype=torch.long, device=loaded.device)
    with slots.rows(loaded, [(request.adapter_id, request.adapter_scales)]) as extra, torch.inference_mode():
        answer = loaded.model(input_ids=ids, use_cache=True, logits_to_keep=1, **extra)
    overflowed = loaded.overflow.take() if loaded.overflow is not None else None
    if overflowed is not None and bool(overflowed.any()):
        raise non_finite_logits(provider, request.adapters)
    past = answer.past_key_values
    past.batch_repeat_interleave(rows)
    return {"past_key_values": past}


def _steps(loaded: LoadedModel, row: Row, outputs: Outputs, index: int) -> int:
    """How many of ``generate``'s steps made the row's tokens (up to its end token, JSON end or limit); the
    steps after those only padded it while other rows went on."""
    tokens = outputs.tokens[index][: row.limit]
    steps = next((position + 1 for position, token in enumerate(tokens) if token in loaded.eos_ids), len(tokens))
    ended = None if outputs.grammar is None else outputs.grammar.ended[index]
    return steps if ended is None else min(steps, ended)


def _drop(entry: Queued, provider: str) -> None:
    """Settle the future of a request whose caller gave up (no result is computed for it)."""
    if not entry.future.done():
        entry.future.set_exception(ProviderError("the request was cancelled", provider=provider))
