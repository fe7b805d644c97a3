"""Continuous batching for llama.cpp: many requests' sequences advanced together, one ``llama_decode`` per step.

Requests wait in a :class:`ContinuousBatcher` (put there from the event loop's thread). The model's worker
thread runs :meth:`ContinuousBatcher.serve`, a loop of steps; each step is one ``llama_decode`` of a batch that
holds the next token of every sequence being generated and, in the room left (``n_batch`` tokens), chunks of
the prompts of sequences that just joined. A request joins at the next step, leaves the moment it is
complete (its KV cells are freed at once), streams its own pieces and samples with its own sampler chain
(its own temperature, top-k/p, penalties, seed and JSON mask), so each answer is what it would be alone.

Scheduling, in one place:

- **By adapter.** llama.cpp applies LoRA adapters to the whole context, so one step serves one adapter (or
  the base model). The loop takes the adapter of the oldest waiting request, and admits every waiting
  request for it, oldest first.
- **Fairness.** While a request for another adapter waits, the running group admits nobody new: it
  finishes the sequences it has (each bounded by its ``max_tokens``), then the loop switches to the adapter
  of the oldest waiting request. A stream of requests for one adapter cannot starve another.
- **Room.** Sequences share the context's cells (a unified KV cache of ``n_ctx`` cells). A request joins
  only when its prompt plus its token limit fits the cells not promised to others, so a running sequence
  never runs out of room, and a single request may still use the whole context.
- **Other work.** Loading an adapter, next-token distributions and closing run on the same worker thread. When
  such a call is queued, the loop admits nobody new, finishes its sequences and returns, so the call runs next
  and the loop resumes after it.
- **Scores.** A score request (:class:`~inference._inprocess.llamacpp_scoring.ScoreJob`) is a sequence of the
  loop like a generation, under the same rules (its adapter, fairness, room): its tokens go in as prompt chunks
  with logits asked at the positions it scores, read after each step
  (:class:`~inference._inprocess.llamacpp_scoring.ScoreWork`); a rolling score's windows go one after another
  in its sequence. Concurrent scores, and scores beside generations, share each ``llama_decode``.
- **Shared contexts.** A score that joins while another score with the same context (the tokens before the first
  scored token, at least two) runs follows that one: once the leader's cells hold the context but its last token,
  they are shared with the follower (``llama_memory_seq_cp``: the same cells, tagged with both sequences), which
  feeds only the context's last token (for the logits that score its first token) and its own continuation. A
  multiple-choice item's context is decoded once. A leader that finishes first shares its cells as it leaves; one
  that is cancelled or fails leaves its followers to read the context themselves.
- **Choices.** A request for ``n`` completions (:class:`Branches`) joins as ``n`` sequences at once, when ``n``
  sequence ids and its cells are free: the first decodes the prompt; at the step that ends it, its cells are shared
  with the others (``llama_memory_seq_cp``: the same cells, tagged with every sequence), and each samples its first
  token from the prompt's last logits with its own sampler chain, then goes on alone. The prompt is decoded once
  (:attr:`ContinuousBatcher.prompt_tokens` counts what is decoded); the request is answered once all ``n`` are done,
  and fails as a whole.
- **Cancellation.** A cancelled sequence leaves at the start of the next step. A step that feeds prompt tokens
  (up to ``n_batch`` of them: seconds on a busy CPU) is aborted inside ``llama_decode`` (llama.cpp's abort
  callback, checked between graph nodes) as soon as every sequence in it is cancelled, so a request that comes
  after a cancelled long prompt does not wait for the rest of its chunk. A step with a sequence still wanted runs
  to its end.

A request reaches the loop from the event loop through :class:`LoopStarter`: it joins the batcher, a loop call is
queued on the model's worker, and the caller awaits its answer (queuing the loop again when it gave way).

Nothing here imports llama_cpp: the module and the provider's helpers come in through :class:`BatchBackend`.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from inference._core.validation import AdapterScales, GenerationRequest
from inference._inprocess.llamacpp_completion import Completion
from inference._inprocess.llamacpp_logits import clear_memory
from inference._inprocess.llamacpp_scoring import ScoreJob, ScoreWork
from inference._inprocess.streaming import PieceSink
from inference._inprocess.worker import ModelWorker
from inference.provider import GenerationResult
from inference.results import ScoreResult

__all__ = ["BatchBackend", "BatchEntry", "Branches", "ContinuousBatcher", "LoopStarter", "Started"]


@dataclass(eq=False)
class BatchEntry:
    """One request waiting for, or running in, the decode loop.

    Attributes:
        request: The validated request: a generation, or a score (:class:`ScoreJob`).
        sink: Receives its text pieces (on the worker thread); ``None`` when nobody streams.
        cancel: Set when its caller gives up: it leaves the loop at the next step.
        future: Resolved by the worker thread with the result (a ``GenerationResult`` or a ``ScoreResult``) or
            the error; cancelled when the caller gives up before the request joins the loop.
    """

    request: GenerationRequest | ScoreJob
    sink: PieceSink | None
    cancel: threading.Event
    future: Future[Any] = field(default_factory=Future)

    @property
    def adapters(self) -> AdapterScales:
        """The adapters the request runs with (``()``: the base model)."""
        return self.request.adapters


@dataclass(frozen=True)
class Started:
    """What the backend prepared for a request about to join: its prompt, its sampler and its completion.

    Attributes:
        prompt: The prompt's token ids (not empty; shorter than the context).
        sampler: A llama-cpp-python ``LlamaSampler`` chain for this request alone (closed when it leaves).
        completion: Turns its sampled tokens into its result.
    """

    prompt: list[int]
    sampler: Any
    completion: Completion

    @property
    def cells(self) -> int:
        """The KV cells it needs: its prompt plus its token limit."""
        return len(self.prompt) + self.completion.limit

    @property
    def shared_context(self) -> None:
        """A generation shares no context with the loop's scores (:attr:`ScoreWork.shared_context`)."""
        return None

    def logits_at(self, position: int) -> bool:
        """Whether the logits after ``prompt[position]`` are wanted: at its last prompt token only."""
        return position == len(self.prompt) - 1

    def close(self) -> None:
        """Release its sampler (on the worker thread)."""
        self.sampler.close()


@dataclass(frozen=True)
class Branches:
    """What the backend prepared for a request for ``n`` completions: one prompt, a sampler and a completion per
    choice (choice ``k`` seeded ``seed + k``).

    Attributes:
        choices: One :class:`Started` per choice, in order, all with the same prompt.
    """

    choices: tuple[Started, ...]

    @property
    def cells(self) -> int:
        """The KV cells they need: the prompt once (its cells are shared), plus each choice's token limit."""
        return len(self.choices[0].prompt) + sum(choice.completion.limit for choice in self.choices)

    def close(self) -> None:
        """Release every choice's sampler (on the worker thread)."""
        for choice in self.choices:
            choice.close()


class BatchBackend(Protocol):
    """What the decode loop asks of the provider (all on the worker thread)."""

    llama_cpp: Any
    """The ``llama_cpp`` module."""

    def activate(self, adapters: AdapterScales) -> Any:
        """Apply ``adapters`` (``()``: the base model) to the context; return the ``Llama``."""

    def start(self, llama: Any, entry: BatchEntry) -> Started | Branches | ScoreWork:
        """Tokenise and check a request, and build its sampler (its choices' samplers, for ``n > 1``) or its score
        (raises an inference error to refuse it)."""

    def finish(self, entry: BatchEntry, completion: Completion, prompt_tokens: int) -> GenerationResult:
        """The result of a request whose completion is done."""

    def failed(self, error: BaseException) -> BaseException:
        """The error a request gets when llama.cpp fails under it."""

    def others_waiting(self) -> bool:
        """True when other work (a load, a next-token call, closing) is queued for the worker thread."""


@dataclass(eq=False)
class _Sequence:
    """A request in the loop (or one choice of a request for ``n``): its sequence id, its cells and where its tokens
    are."""

    entry: BatchEntry
    seq_id: int
    started: Started | ScoreWork
    cells: int  # KV cells promised to it: prompt plus token limit (a branch: its token limit)
    fed: int = 0  # prompt tokens sent to llama_decode so far
    position: int = 0  # its tokens in the KV cache
    next_token: int | None = None  # sampled, to be decoded at the next step
    row: int = -1  # its logits row in the batch being decoded; -1 when it has none
    choices: _Choices | None = None  # the request's choices, when it asked for n > 1
    choice: int = 0  # which of them this sequence is (0 decodes the prompt)
    leader: _Sequence | None = None  # a score waiting for another's context cells (see "Shared contexts")
    followers: list[_Sequence] = field(default_factory=list)  # the scores waiting for this one's context cells


@dataclass(eq=False)
class _Choices:
    """The sequences of one request for ``n`` completions, and their results as they come."""

    members: list[_Sequence]
    results: list[GenerationResult | None]
    branched: bool = False  # the prompt is in, and its cells are shared with every choice

    def branch(self, llama_cpp: Any, llama: Any, lead: _Sequence, running: list[_Sequence]) -> None:
        """Right after the step that decoded the prompt's last token (``lead``'s): share the prompt's cells with the
        other choices, which sample their first token from the same logits row."""
        self.branched = True
        memory = llama_cpp.llama_get_memory(llama.ctx)
        for member in self.members[1:]:
            if member in running:
                llama_cpp.llama_memory_seq_cp(memory, lead.seq_id, member.seq_id, -1, -1)
                member.position, member.row = lead.position, lead.row


class ContinuousBatcher:
    """The requests waiting for the llama.cpp decode loop, and the loop itself.

    Args:
        n_parallel: The most sequences decoded together.
        n_ctx: The context's cells, shared by the sequences.
        n_batch: The most tokens in one ``llama_decode`` call.
    """

    def __init__(self, n_parallel: int, n_ctx: int, n_batch: int) -> None:
        self.n_parallel = n_parallel
        self.n_ctx = n_ctx
        self.n_batch = max(n_batch, n_parallel)
        self._lock = threading.Lock()
        self._waiting: list[BatchEntry] = []
        self._running: list[_Sequence] = []
        self._stale = False  # a sequence failed: its cells may hold NaN, wiped once no sequence runs
        self._in_step: list[_Sequence] = []  # the sequences with tokens in the step being decoded
        self.steps = 0
        """``llama_decode`` calls made so far (benchmarks read it)."""
        self.prompt_tokens = 0
        """Prompt tokens sent to ``llama_decode`` so far (a request for ``n`` completions: its prompt once)."""
        self.aborted_steps = 0
        """Steps aborted inside ``llama_decode`` because every sequence in them was cancelled."""
        self.share_contexts = True
        """Whether scores with one context share its cells (benchmarks switch it off to compare)."""

    # Any thread -------------------------------------------------------------------------------------------

    def put(
        self, request: GenerationRequest | ScoreJob, sink: PieceSink | None, cancel: threading.Event
    ) -> BatchEntry:
        """Queue a request for the loop; its entry's future gets the result."""
        entry = BatchEntry(request, sink, cancel)
        with self._lock:
            self._waiting.append(entry)
        return entry

    def discard(self, entry: BatchEntry) -> None:
        """The caller gave up: a waiting request is dropped, a running one leaves at the next step."""
        entry.cancel.set()
        with self._lock:
            if entry in self._waiting:
                self._waiting.remove(entry)
        entry.future.cancel()

    @property
    def running(self) -> int:
        """Sequences in the loop now (0 whenever the loop is not running)."""
        return len(self._running)

    # Worker thread ----------------------------------------------------------------------------------------

    def serve(self, backend: BatchBackend) -> None:
        """Run steps until no sequence is left and nobody may join (see the module's scheduling rules)."""
        llama_cpp = backend.llama_cpp
        batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        abort = llama_cpp.ggml_abort_callback(self._step_abandoned)  # kept alive while llama.cpp may call it
        try:
            llama: Any = None
            while True:
                llama = self._admit(backend, llama)
                if not self._running:
                    return
                self._step(backend, llama, batch, abort)
        finally:
            llama_cpp.llama_batch_free(batch)

    def _admit(self, backend: BatchBackend, llama: Any) -> Any:
        """Let waiting requests join; return the ``Llama`` (``None`` when nothing runs)."""
        with self._lock:
            self._waiting = [entry for entry in self._waiting if not entry.cancel.is_set()]
            if not self._waiting or backend.others_waiting():
                return llama
            if self._running:
                adapters = self._running[0].entry.adapters
                if any(entry.adapters != adapters for entry in self._waiting):
                    return llama  # fairness: another adapter waits, so this group takes nobody new
            else:
                adapters = self._waiting[0].adapters
            candidates = [entry for entry in self._waiting if entry.adapters == adapters]
        if not self._running:
            try:
                llama = backend.activate(adapters)
            except BaseException as error:  # the model cannot load, reload mode cannot combine: these fail
                for entry in candidates:
                    self._take(entry)
                    if entry.future.set_running_or_notify_cancel():
                        entry.future.set_exception(backend.failed(error))
                return None
        free_ids = sorted(set(range(self.n_parallel)) - {sequence.seq_id for sequence in self._running})
        free_cells = self.n_ctx - sum(sequence.cells for sequence in self._running)
        for entry in candidates:
            if not free_ids:
                break
            try:
                started = backend.start(llama, entry)
            except BaseException as error:  # this request is refused; the others go on
                self._take(entry)
                if entry.future.set_running_or_notify_cancel():
                    entry.future.set_exception(error)
                continue
            cells = started.cells
            wanted = len(started.choices) if isinstance(started, Branches) else 1
            if cells > free_cells or wanted > len(free_ids):
                started.close()
                break  # it waits for room (it fits an empty context: start() checked)
            self._take(entry)
            if not entry.future.set_running_or_notify_cancel():  # cancelled meanwhile
                started.close()
                continue
            if isinstance(started, Branches):
                self._running.extend(self._branches(entry, started, [free_ids.pop(0) for _ in range(wanted)]))
            else:
                self._running.append(self._follow(_Sequence(entry, free_ids.pop(0), started, cells)))
            free_cells -= cells
        return llama

    @staticmethod
    def _branches(entry: BatchEntry, branches: Branches, seq_ids: list[int]) -> list[_Sequence]:
        """The sequences of a request for ``n`` completions: the first decodes the prompt, the others wait for its
        cells (their prompt counts as fed)."""
        prompt = len(branches.choices[0].prompt)
        members = [
            _Sequence(entry, seq_id, started, started.cells if index == 0 else started.completion.limit,
                      fed=0 if index == 0 else prompt, choice=index)
            for index, (seq_id, started) in enumerate(zip(seq_ids, branches.choices, strict=True))
        ]
        choices = _Choices(members, [None] * len(members))
        for member in members:
            member.choices = choices
        return members

    def _follow(self, sequence: _Sequence) -> _Sequence:
        """Make a joining score a follower of a running score with its context (see "Shared contexts" in the
        module's docstring)."""
        context = sequence.started.shared_context
        if context is None or not self.share_contexts:
            return sequence
        for leader in self._running:
            if leader.leader is None and leader.started.shared_context == context:
                sequence.leader = leader
                leader.followers.append(sequence)
                break
        return sequence

    @staticmethod
    def _copy_context(llama_cpp: Any, llama: Any, follower: _Sequence) -> None:
        """Give ``follower`` its leader's cells of the context but its last token, and feed it from there."""
        leader, shared = follower.leader, len(follower.started.shared_context or ()) - 1
        assert leader is not None and leader.fed >= shared
        memory = llama_cpp.llama_get_memory(llama.ctx)
        llama_cpp.llama_memory_seq_cp(memory, leader.seq_id, follower.seq_id, 0, shared)
        follower.fed = follower.position = shared
        follower.leader = None
        leader.followers.remove(follower)

    def _take(self, entry: BatchEntry) -> None:
        with self._lock:
            if entry in self._waiting:
                self._waiting.remove(entry)

    def _step(self, backend: BatchBackend, llama: Any, batch: Any, abort: Any) -> None:
        """One ``llama_decode``: every running sequence's next token, then prompt chunks in the room left."""
        llama_cpp = backend.llama_cpp
        for sequence in [sequence for sequence in self._running if sequence.entry.cancel.is_set()]:
            self._leave(llama_cpp, llama, sequence)
        count = 0
        in_step: dict[int, _Sequence] = {}

        def add(token: int, sequence: _Sequence, logits: bool) -> None:
            nonlocal count
            in_step[sequence.seq_id] = sequence
            batch.token[count] = token
            batch.pos[count] = sequence.position
            batch.n_seq_id[count] = 1
            batch.seq_id[count][0] = sequence.seq_id
            batch.logits[count] = logits
            if logits:
                sequence.row = count
            sequence.position += 1
            count += 1

        for sequence in self._running:
            if sequence.next_token is not None:
                add(sequence.next_token, sequence, True)
                sequence.next_token = None
        decoding = count
        for sequence in self._running:  # before this step feeds anything: fed tokens are decoded ones here
            if sequence.leader is not None and sequence.leader.fed >= len(sequence.started.shared_context or ()) - 1:
                self._copy_context(llama_cpp, llama, sequence)
        for sequence in self._running:
            if sequence.leader is not None:
                continue  # it waits for its leader's context
            started = sequence.started
            prompt = started.prompt
            while sequence.fed < len(prompt) and count < self.n_batch:
                sequence.fed += 1
                self.prompt_tokens += 1
                wanted = started.logits_at(sequence.fed - 1)
                if wanted and isinstance(started, ScoreWork):
                    started.note(count, sequence.fed - 1)
                add(prompt[sequence.fed - 1], sequence, wanted)
        if count == 0:
            return
        batch.n_tokens = count
        self.steps += 1
        self._in_step = list(in_step.values())
        code = self._decode(llama_cpp, llama, batch, abort if count > decoding else None)
        self._in_step = []
        if code == _ABORTED and all(sequence.entry.cancel.is_set() for sequence in in_step.values()):
            self.aborted_steps += 1
            for sequence in in_step.values():
                self._leave(llama_cpp, llama, sequence)
            return
        if code != 0:
            error = backend.failed(RuntimeError(f"llama_decode returned {code}"))
            for sequence in list(self._running):
                self._leave(llama_cpp, llama, sequence, error=error)
            return
        for sequence in in_step.values():  # a prompt of n choices just in: its cells go to every choice
            choices = sequence.choices
            if choices is not None and not choices.branched and sequence.row >= 0:
                choices.branch(llama_cpp, llama, sequence, self._running)
        for sequence in list(self._running):
            if sequence not in self._running:
                continue  # it left with the other choices of its request
            if isinstance(sequence.started, ScoreWork):
                if sequence.seq_id in in_step:
                    self._scored(backend, llama, sequence, sequence.started)
                continue
            if sequence.row < 0:
                continue  # its prompt is not all in yet
            row, sequence.row = sequence.row, -1
            if sequence.entry.cancel.is_set():
                self._leave(llama_cpp, llama, sequence)
                continue
            completion = sequence.started.completion
            try:
                token = int(llama_cpp.llama_sampler_sample(sequence.started.sampler.sampler, llama.ctx, row))
                done = completion.add(token, functools.partial(completion.tokens.logits, llama.ctx, row))
            except BaseException as error:  # a grammar that refuses its own token: this request fails alone
                self._leave(llama_cpp, llama, sequence, error=backend.failed(error))
                continue
            if done:
                try:
                    result = backend.finish(sequence.entry, completion, len(sequence.started.prompt))
                except BaseException as error:
                    self._leave(llama_cpp, llama, sequence, error=backend.failed(error))
                else:
                    self._leave(llama_cpp, llama, sequence, result=result)
            else:
                sequence.next_token = token

    def _scored(self, backend: BatchBackend, llama: Any, sequence: _Sequence, work: ScoreWork) -> None:
        """After a step: read a score's logits; move it to its next window, or answer it once all is read."""
        llama_cpp = backend.llama_cpp
        sequence.row = -1
        if sequence.entry.cancel.is_set():
            self._leave(llama_cpp, llama, sequence)
            return
        try:
            work.read(llama.ctx)
        except BaseException as error:  # non-finite logits: this request fails alone
            self._leave(llama_cpp, llama, sequence, error=backend.failed(error))
            return
        if sequence.fed < len(work.prompt):
            return  # more of this window next step
        if work.next_window():  # each window is read from an empty sequence
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llama.ctx), sequence.seq_id, -1, -1)
            sequence.fed = sequence.position = 0
            return
        self._leave(llama_cpp, llama, sequence, result=work.result())

    @staticmethod
    def _decode(llama_cpp: Any, llama: Any, batch: Any, abort: Any) -> int:
        """``llama_decode``, abortable by ``abort`` when one is given (a step with prompt tokens: a Python call
        between graph nodes costs little there, but would slow the one-token steps of generation)."""
        if abort is None:
            return int(llama_cpp.llama_decode(llama.ctx, batch))
        llama_cpp.llama_set_abort_callback(llama.ctx, abort, None)
        try:
            return int(llama_cpp.llama_decode(llama.ctx, batch))
        finally:
            llama_cpp.llama_set_abort_callback(llama.ctx, llama_cpp.ggml_abort_callback(), None)

    def _step_abandoned(self, _data: Any) -> bool:
        """llama.cpp's abort callback (on the worker thread, between graph nodes): every sequence in the step
        being decoded was cancelled."""
        in_step = self._in_step
        return bool(in_step) and all(sequence.entry.cancel.is_set() for sequence in in_step)

    def _leave(
        self,
        llama_cpp: Any,
        llama: Any,
        sequence: _Sequence,
        *,
        result: GenerationResult | ScoreResult | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Take a sequence out of the loop: free its cells and sampler, and answer its caller.

        One choice of a request for ``n`` answers it once every choice is done (their results joined, the prompt
        counted once); one that fails or is abandoned takes the other choices out with it.

        A sequence that failed (NaN logits...) may leave NaN in its cells' values, which freeing does not wipe:
        once no sequence runs, the cache is cleared (:func:`~inference._inprocess.llamacpp_logits.clear_memory`).
        """
        if sequence not in self._running:
            return  # it left with the other choices of its request
        self._running.remove(sequence)
        for follower in list(sequence.followers):  # done: its cells go to them now; else they read the context
            if result is not None and follower in self._running:
                self._copy_context(llama_cpp, llama, follower)
            follower.leader = None
        sequence.followers = []
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llama.ctx), sequence.seq_id, -1, -1)
        sequence.started.close()
        self._stale = self._stale or error is not None
        choices = sequence.choices
        if choices is not None and result is not None:
            assert isinstance(result, GenerationResult)
            choices.results[sequence.choice] = result
            done = [one for one in choices.results if one is not None]
            if len(done) < len(choices.results):
                return  # the other choices go on
            result = GenerationResult.from_choices(done)
        if self._stale and not self._running:
            clear_memory(llama_cpp, llama)
            self._stale = False
        future = sequence.entry.future
        if not future.done():
            if error is not None:
                future.set_exception(error)
            elif result is not None:
                future.set_result(result)
            else:  # its caller gave up; nobody reads this
                future.set_exception(_Abandoned())
        if choices is not None and (error is not None or result is None):
            for member in choices.members:  # the request failed as a whole: its other choices stop too
                self._leave(llama_cpp, llama, member)


_ABORTED = 2
"""What ``llama_decode`` returns when its abort callback stopped it (the step's cells are already removed)."""


class _Abandoned(Exception):
    """The answer of a request whose caller gave up (nobody waits for it)."""


class LoopStarter:
    """Starts a request in the decode loop, from the event loop (a :data:`~inference._inprocess.streaming.JobStarter`).

    Args:
        batcher: The requests waiting for the loop, and the loop.
        worker: The model's worker thread.
        serve: Runs the loop on the worker thread (:meth:`ContinuousBatcher.serve` with the provider's backend).
    """

    def __init__(self, batcher: ContinuousBatcher, worker: ModelWorker, serve: Callable[[], None]) -> None:
        self.batcher = batcher
        self.worker = worker
        self.serve = serve

    def __call__(
        self, request: GenerationRequest, sink: PieceSink | None, cancel: threading.Event
    ) -> asyncio.Future[GenerationResult]:
        """Queue a request for the decode loop; the returned future drives the loop until it is answered."""
        entry = self.batcher.put(request, sink, cancel)
        loop_call = self.worker.submit(self.serve)  # queued now: a later aclose() runs after it
        return asyncio.ensure_future(self._answer(entry, loop_call))

    async def score(self, job: ScoreJob) -> ScoreResult:
        """Score in the decode loop; a caller that gives up frees its sequence at the next step."""
        entry = self.batcher.put(job, None, threading.Event())
        loop_call = self.worker.submit(self.serve)
        result: ScoreResult = await self._answer(entry, loop_call)
        return result

    async def _answer(self, entry: BatchEntry, loop_call: asyncio.Future[None]) -> Any:
        """Wait for ``entry``'s answer while a decode loop runs on the worker thread.

        The answer comes the moment its sequence ends (the loop goes on for the others). When the loop
        returns without it (it gave way to a load or a next-token call queued behind it), the loop is queued again.
        """
        answer = asyncio.wrap_future(entry.future)
        answer.add_done_callback(_retrieve)  # read through entry.future below
        try:
            while True:
                waiting: set[asyncio.Future[Any]] = {answer, loop_call}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if loop_call.done():
                    loop_call.result()  # a failure of the loop itself (the model could not load)
                if entry.future.done():
                    return entry.future.result()
                if loop_call.done():
                    loop_call = self.worker.submit(self.serve)
        finally:
            if not entry.future.done():
                self.batcher.discard(entry)
            if not loop_call.done():
                loop_call.cancel()  # dropped if it has not started; a running loop serves the others on
                loop_call.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an abandoned future's error as seen (nobody waits for it any more)."""
    if not future.cancelled():
        future.exception()
