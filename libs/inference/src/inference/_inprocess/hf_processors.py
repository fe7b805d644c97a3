"""What runs inside one Transformers ``generate``, per row: seeded sampling (:class:`SeededRows`), rows whose logits
are not finite ended alone (:class:`FiniteRows`), the stream watch (:class:`StreamWatch`) and logprob recording
(:class:`LogprobRecorder`). See :mod:`inference._inprocess.hf_generation`, which builds them for a batch.

Everything here runs on the provider's worker thread; torch is passed in, never imported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inference._inprocess.hf_model import LoadedModel, OverflowWatch
from inference._inprocess.streaming import PieceAssembler
from inference.results import TokenLogprob

if TYPE_CHECKING:
    from inference._inprocess.hf_generation import Sampling

__all__ = ["FiniteRows", "LogprobRecorder", "MethodProcessor", "SeededRows", "StreamWatch", "unusable_rows"]


class SeededRows:
    """The last logits processor of a ``generate`` whose rows are one request's seeded choices: each row's token drawn
    with a generator of its own (``seed + k`` for choice ``k``), its logits returned as that token alone (``generate``
    runs greedy and takes it).

    The warpers ``generate`` applies when it samples (temperature, top-k, top-p, min-p, in its order) come first,
    then ``torch.multinomial`` over the softmax, as ``generate`` draws: a row draws what ``torch.manual_seed(seed +
    k)`` and ``generate`` give a request alone.

    Args:
        torch: The torch module.
        warpers: The sampling warpers, in ``generate``'s order.
        seeds: One seed per row.
        device: The logits' device.
    """

    def __init__(self, torch: Any, warpers: list[Any], seeds: list[int], device: Any) -> None:
        self.torch = torch
        self.warpers = warpers
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]

    @classmethod
    def of(
        cls, torch: Any, transformers: Any, loaded: LoadedModel, sampling: Sampling, seeds: list[int]
    ) -> SeededRows | None:
        """The processor for ``sampling`` (resolved against the model's defaults, as ``generate`` resolves them);
        ``None`` for a model whose generation config sets a warper this does not apply (typical-p, epsilon or eta
        sampling): its rows then sample as one batch after ``torch.manual_seed(seed)``, reproducible, but not the
        choices of single requests."""
        defaults = loaded.model.generation_config
        if (
            (defaults.typical_p or 1.0) < 1.0
            or (defaults.epsilon_cutoff or 0.0) > 0.0
            or (defaults.eta_cutoff or 0.0) > 0.0
            or getattr(defaults, "top_h", None) is not None
        ):
            return None
        warpers: list[Any] = []
        if sampling.temperature != 1.0:
            warpers.append(transformers.TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k != 0:
            warpers.append(transformers.TopKLogitsWarper(top_k=sampling.top_k, min_tokens_to_keep=1))
        if sampling.top_p < 1.0:
            warpers.append(transformers.TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
        min_p = sampling.min_p if sampling.min_p is not None else loaded.model.generation_config.min_p
        if min_p is not None:
            warpers.append(transformers.MinPLogitsWarper(min_p=min_p, min_tokens_to_keep=1))
        return cls(torch, warpers, seeds, loaded.device)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        torch = self.torch
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        probs = torch.nn.functional.softmax(scores, dim=-1)
        chosen = torch.cat([
            torch.multinomial(probs[row : row + 1], num_samples=1, generator=generator)
            for row, generator in enumerate(self.generators)
        ])
        forced = torch.full_like(scores, float("-inf"))
        return forced.scatter_(1, chosen, 0.0)


def unusable_rows(torch: Any, logits: Any, overflow: OverflowWatch | None) -> Any:
    """Which rows of ``logits`` (rows x vocabulary, one position) give no token to read: not finite, or overflowed
    before the final norm (all equal logits, where the model has no watch)."""
    lowest, highest = torch.aminmax(logits, dim=-1)
    bad = ~torch.isfinite(highest)
    flagged = overflow.take() if overflow is not None else None
    if flagged is not None and flagged.shape[0] == bad.shape[0]:
        return bad | flagged.to(bad.device)
    return bad if overflow is not None else bad | (highest <= lowest)


class MethodProcessor:
    """A bound method as a logits processor.

    transformers reads every processor's ``__call__`` signature at every step; a bound method's ``__call__`` is a
    builtin whose signature is parsed from text each time (about 80 us, against 10 us for this class's).
    """

    def __init__(self, method: Callable[[Any, Any], Any]) -> None:
        self.method = method

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        return self.method(input_ids, scores)


class FiniteRows:
    """Two logits processors of a ``generate`` (the first and the last) and a stopping criterion: end the rows
    whose logits are not finite.

    A row whose raw logits have no finite maximum (a NaN, +infinity), or whose hidden state overflowed before the
    final norm (:class:`~inference._inprocess.hf_model.OverflowWatch`: the norm's output is then 0 and every logit
    equal; without a watch, all-equal logits count as that), has no next token to read from its logits: an adapter
    or a scale too large for the model's numbers. :meth:`check` records the first such step; :meth:`force` makes the
    row's logits a sure end token (so it ends there, streams nothing more, and sampling never sees a NaN:
    ``torch.multinomial`` would fail the whole batch); its request fails with :class:`~inference.ProviderError`,
    and the other rows go on.

    Args:
        torch: The torch module.
        rows: The batch's rows.
        end_token: The token a failed row is given (an end-of-sequence token where the model has one).
        overflow: The model's overflow watch, or ``None``.
    """

    def __init__(self, torch: Any, rows: int, end_token: int, overflow: OverflowWatch | None = None) -> None:
        self.torch = torch
        self.end_token = end_token
        self.overflow = overflow
        self.first_bad: list[int | None] = [None] * rows
        self._step = 0
        self._bad: Any = None  # this step's failed rows (a bool tensor), or None

    def check(self, input_ids: Any, scores: Any) -> Any:
        """The first processor: record the rows whose raw logits are unusable at this step."""
        bad = unusable_rows(self.torch, scores, self.overflow)
        self._bad = None
        if bool(bad.any()):
            self._bad = bad
            for row in bad.nonzero().flatten().tolist():
                if self.first_bad[row] is None:
                    self.first_bad[row] = self._step
        self._step += 1
        return scores

    def force(self, input_ids: Any, scores: Any) -> Any:
        """The last processor: the rows :meth:`check` found this step get a sure end token."""
        if self._bad is None:
            return scores
        forced = self.torch.full_like(scores[:1], float("-inf"))
        forced[0, self.end_token] = 0.0
        return self.torch.where(self._bad[:, None], forced, scores)

    def stops(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        """Stopping criterion: a row is done once its logits were not finite."""
        flags = [step is not None for step in self.first_bad]
        return self.torch.tensor(flags, dtype=self.torch.bool, device=input_ids.device)

    def failed(self, row: int, steps: int) -> bool:
        """Whether ``row``'s logits were not finite within its first ``steps`` steps (the ones that made its tokens)."""
        step = self.first_bad[row]
        return step is not None and step < steps


class StreamWatch:
    """A ``generate`` stopping criterion for one streamed row: hands out its text, stops at a stop string.

    Called after every new token. Text is handed out only while it decodes cleanly: a trailing U+FFFD
    (a character whose bytes are split over tokens) waits for the next token. (Cancellation is
    :class:`~inference._inprocess.batching.RowsCancelled`'s job, as for every row.)
    """

    def __init__(
        self,
        torch: Any,
        prompt_width: int,
        eos_ids: frozenset[int],
        decode: Callable[[list[int]], str],
        pieces: PieceAssembler,
    ) -> None:
        self.torch = torch
        self.prompt_width = prompt_width
        self.eos_ids = eos_ids
        self.decode = decode
        self.pieces = pieces

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        done = False
        tokens = [int(token) for token in input_ids[0, self.prompt_width :].tolist()]
        end = next((index for index, token in enumerate(tokens) if token in self.eos_ids), None)
        if end is None:  # after an end-of-sequence token generate stops by itself; finish() hands out the rest
            text = self.decode(tokens).rstrip("\ufffd")
            done = self.pieces.update(text) is not None
        return self.torch.full((input_ids.shape[0],), done, dtype=self.torch.bool, device=input_ids.device)


class LogprobRecorder:
    """The first logits processor of a ``generate``: keeps each step's top tokens and the chosen token's logprob.

    It sees the raw logits (after the adapter, before any penalty, mask or sampling setting). The chosen
    token of a step is read from ``input_ids`` at the next step, and from the output after the last one,
    so only one step's full distribution is kept at a time.

    Args:
        torch: The torch module.
        top: The most alternatives any row asked for (0 to 20).
    """

    def __init__(self, torch: Any, top: int) -> None:
        self.torch = torch
        self.top = top
        self.chosen: list[Any] = []
        self.best: list[tuple[Any, Any]] = []
        self._previous: Any = None
        self._values: list[list[float]] | None = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        logprobs = self.torch.log_softmax(scores.float(), dim=-1)
        if self._previous is not None:
            self.chosen.append(self._previous.gather(1, input_ids[:, -1:]).squeeze(1))
        if self.top > 0:
            values, ids = logprobs.topk(self.top, dim=-1)
            self.best.append((values, ids))
        self._previous = logprobs
        return scores

    def finish(self, new_tokens: Any) -> None:
        """Read the last step's chosen tokens from ``generate``'s output (``new_tokens``: rows x steps)."""
        steps = new_tokens.shape[1]
        if self._previous is not None and len(self.chosen) < steps:
            last = new_tokens[:, len(self.chosen) : len(self.chosen) + 1].to(self._previous.device)
            self.chosen.append(self._previous.gather(1, last).squeeze(1))
        self._previous = None
        self._chosen_rows = self.torch.stack(self.chosen, dim=1).tolist() if self.chosen else []
        if self.best:
            self._best_values = self.torch.stack([values for values, _ in self.best], dim=1).tolist()
            self._best_ids = self.torch.stack([ids for _, ids in self.best], dim=1).tolist()
        self.best = []
        self.chosen = []

    def row(self, loaded: LoadedModel, index: int, tokens: list[int], top: int) -> tuple[TokenLogprob, ...]:
        """The logprobs of row ``index``'s first ``len(tokens)`` tokens, each with its ``top`` alternatives."""
        entries = []
        for step, token in enumerate(tokens):
            alternatives: tuple[tuple[str, float], ...] = ()
            if top > 0:
                ids, values = self._best_ids[index][step][:top], self._best_values[index][step][:top]
                alternatives = tuple(
                    (loaded.token_text(int(other)), float(value)) for other, value in zip(ids, values, strict=True)
                )
            entries.append(
                TokenLogprob(
                    token=loaded.token_text(token),
                    logprob=float(self._chosen_rows[index][step]),
                    top_logprobs=alternatives,
                    token_id=token,
                )
            )
        return tuple(entries)
