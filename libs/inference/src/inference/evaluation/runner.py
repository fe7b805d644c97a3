"""The evaluation loop: for each adapter, load it, score and answer every prompt, unload it.

Per adapter, two phases, timed apart: every expected answer and choice of its prompts is scored in one
``score_batch`` (so a provider that batches scores runs them in a few forward passes), then, unless the run only
scores, every prompt is generated with bounded concurrency. The base model gets the same rows, as the reference
each adapter is compared with.

Rows go to the results file as they finish (see :mod:`inference.evaluation.rows`), so a run killed at any
point and started again with the same output skips the (adapter, prompt) pairs already there, once
:mod:`inference.evaluation.identity` has checked that they were made for the same adapters, prompts and settings.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference._core.validation import GenerationRequest
from inference.adapters.weights import AdapterWeights
from inference.evaluation.identity import (
    Reconciled,
    adapter_hash,
    prompt_hash,
    reconcile,
    row_filter,
    run_settings,
    settings_mode,
)
from inference.evaluation.inputs import (
    BASE_MODEL_ID,
    AdapterInput,
    AdapterSpec,
    EvalPrompt,
    adapter_specs,
    checked_prompts,
    load_prompts,
    name_weights,
)
from inference.evaluation.likelihood import likelihood_fields, score_pairs, with_likelihood
from inference.evaluation.loading import LoadedAdapter, for_turn, load_for_turn, unload_after_turn
from inference.evaluation.progress import Progress
from inference.evaluation.rows import ResultsWriter, check_file_path, open_results, read_rows, row_error, row_key
from inference.evaluation.scoring import Scorer, resolve_scorer, score_value
from inference.evaluation.summary import (
    AdapterTimings,
    EvaluationSummary,
    summarise,
    summary_csv_path,
)
from inference.exceptions import (
    ConfigurationError,
    InvalidRequestError,
    MissingDependencyError,
    ModelError,
    ProviderUnavailableError,
    UnsupportedOperationError,
)
from inference.factory import get_provider_for_step
from inference.options import GenerationOptions
from inference.provider import GenerationResult, InferenceProvider
from inference.results import ScoreResult

__all__ = ["DEFAULT_MAX_TOKENS", "GENERATION_KEYS", "MODES", "evaluate_adapters", "generation_settings"]

logger = logging.getLogger("inference.evaluation")

GENERATION_KEYS = ("model", *GenerationOptions.names())
"""Keys of the provider config that are generation settings: ``model`` and every
:class:`~inference.options.GenerationOptions` field (the rest configure the provider)."""

DEFAULT_MAX_TOKENS = 256
"""``max_tokens`` when the provider config gives none."""

MODES = ("auto", "generate", "score")
"""What :func:`evaluate_adapters` does per prompt: ``"generate"`` (generate, and score the expected answer and the
choices where the provider can), ``"score"`` (only score: no generation), ``"auto"`` (score only when nothing
would use a generation: no scorer and every prompt multiple-choice; a results file being resumed keeps its mode)."""


def generation_settings(provider_config: Mapping[str, Any], *, provider: str = "evaluation") -> dict[str, Any]:
    """The generation settings of a provider config, checked as ``generate`` would check them.

    ``model`` defaults to ``""`` (in-process providers use their loaded model) and ``max_tokens`` to
    :data:`DEFAULT_MAX_TOKENS`; the other settings default to the backend's own and are left out. Values
    are as the checks return them (``stop`` a tuple, numbers of sampling as floats).

    Raises:
        InvalidRequestError: A setting is out of range or of the wrong type (``max_tokens`` 0 included: the
            message says how to score without generating), or ``n`` is above 1 (a row records one completion).
    """
    given = {key: provider_config[key] for key in GENERATION_KEYS if provider_config.get(key) is not None}
    given.setdefault("model", "")
    given.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    if type(given["max_tokens"]) is int and given["max_tokens"] == 0:
        raise InvalidRequestError(
            "max_tokens must be a positive integer, got 0: to score the expected answers and choices without "
            "generating, evaluate with mode='score' (inference eval --score-only)",
            provider=provider,
        )
    request = GenerationRequest.from_arguments(provider=provider, prompt="", **given)
    if request.n > 1:
        raise InvalidRequestError(
            f"n is {request.n}, and an evaluation row records one completion: leave n at 1, and run the evaluation "
            "again with another seed for more samples (each run in its own output file)",
            provider=provider,
        )
    if request.json_schema is not None:
        given.setdefault("json_schema", request.json_schema)  # response_format, as the json_schema it maps to
    return {key: getattr(request, key) for key in given}


def _score_settings(provider_config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a score-only run: ``model`` alone (generation settings are not used, nor recorded)."""
    model = provider_config.get("model")
    if model is None:
        model = ""
    if not isinstance(model, str):
        raise InvalidRequestError(f"model must be a string, got {model!r}", provider="evaluation")
    unused = [key for key in GENERATION_KEYS if key != "model" and provider_config.get(key) is not None]
    if unused:
        logger.info("score-only evaluation: the generation settings %s are not used", ", ".join(unused))
    return {"model": model}


@dataclass
class _Run:
    """The state of one evaluation run, shared by its adapters."""

    provider: InferenceProvider
    writer: ResultsWriter
    prompts: Sequence[EvalPrompt]
    mode: str
    settings: dict[str, Any]
    fingerprint: dict[str, Any]
    adapter_hashes: dict[str, str | None]
    prompt_hashes: dict[str, str]
    scorer: Scorer | None
    max_concurrency: int
    on_progress: Callable[[Progress], object] | None
    adapters_total: int
    rows_total: int
    rows_done: int
    started: float = field(default_factory=time.monotonic)
    adapters_done: int = 0
    rows_written: int = 0
    score_s: float = 0.0
    generate_s: float = 0.0

    @property
    def model(self) -> str:
        return str(self.settings.get("model") or "")

    def report(self, adapter_id: str | None) -> None:
        if self.on_progress is not None:
            self.on_progress(
                Progress(
                    adapters_done=self.adapters_done,
                    adapters_total=self.adapters_total,
                    rows_done=self.rows_done,
                    rows_total=self.rows_total,
                    rows_this_run=self.rows_written,
                    elapsed_s=time.monotonic() - self.started,
                    adapter_id=adapter_id,
                    score_s=self.score_s,
                    generate_s=self.generate_s,
                )
            )

    def write(self, row: dict[str, Any]) -> None:
        self.writer.write(row)
        self.rows_written += 1
        self.rows_done += 1
        self.report(str(row["adapter_id"]))


async def evaluate_adapters(
    adapters: Sequence[AdapterInput] | str | os.PathLike[str] | AdapterWeights,
    prompts: str | os.PathLike[str] | Sequence[EvalPrompt],
    provider_config: Mapping[str, Any],
    output: str | os.PathLike[str],
    *,
    provider: InferenceProvider | None = None,
    max_concurrency: int = 4,
    scorer: str | Scorer | None = None,
    on_progress: Callable[[Progress], object] | None = None,
    warmup: bool = True,
    adapters_in_flight: int = 1,
    mode: str = "auto",
    base: bool = True,
) -> EvaluationSummary:
    """Evaluate every adapter (and the base model) on every prompt, writing one JSONL row per (adapter, prompt) as
    each finishes.

    For each adapter in turn: load it; score every expected answer and choice of the prompts it still lacks, all in
    one ``score_batch`` (where the provider can score); generate those prompts with at most ``max_concurrency``
    requests in flight (unless the run only scores); unload it. Running again with the same ``output`` resumes:
    pairs already in the file are skipped (a torn last line from a killed run is redone). An adapter that cannot be
    loaded gets one row per prompt carrying the load error, and the run goes on.

    A results file holds one experiment: rows are reused only for the same adapter (same path, same content
    hash; for weights in memory the same id and hash), the same prompt text and the same settings (provider, base
    model, generation settings, scorer, mode); anything else is refused before anything runs (see
    :mod:`~inference.evaluation.identity`). An adapter's files are hashed again right before its load and right
    after it, so its rows carry the hash of the files that were loaded (see :mod:`~inference.evaluation.loading`).

    Args:
        adapters: Adapter directories or GGUF LoRA files, or globs (``"runs/*/adapter"``), or
            :class:`AdapterSpec` s, or weights in memory (:class:`~inference.AdapterWeights`, a hypernetwork's or
            a training loop's output). The adapter id is the directory name (see
            :func:`~inference.evaluation.inputs.adapter_id_for`), or the id the output file already holds
            for that adapter; a name the file holds for another adapter gets its parent folders' names
            prefixed (``ckpt-200-adapter``). The ids of :class:`AdapterSpec` s are kept as given
            (``AdapterSpec("task-3", weights=w)`` names weights); bare weights get ``weights-`` and the first 12
            hex digits of their content hash. Paths are evaluated before bare weights given in the same list.
        prompts: A JSONL prompt set (``id``, ``prompt``, optional ``system_prompt``, ``expected``, ``choices`` with
            ``answer``) or the prompts themselves.
        provider_config: A step config as :func:`~inference.get_provider_for_step` takes it (``provider``,
            ``base_url``, provider settings), plus generation settings: ``model``, ``max_tokens`` (default
            256) and the :class:`~inference.options.GenerationOptions` fields (``temperature``, ``stop``...);
            a ``system_prompt`` here is used for the prompts that have none. A score-only run uses ``model`` alone.
        output: The JSONL results file (created, or resumed if it exists): a regular file, locked while the run
            writes it, so a second run on it is refused. The CSV summary is written next to it
            (``results.jsonl`` -> ``results.summary.csv``; another name is kept whole: ``results`` ->
            ``results-summary.csv``).
        provider: Use this provider instead of the one ``provider_config`` names (its generation settings
            still apply). The caller keeps ownership: it is not closed, and an adapter it had loaded under an
            adapter's id, from the same source, is evaluated and left loaded (from another source, it is left as it
            is and the adapter's rows carry the conflict as their load error; see
            :mod:`~inference.evaluation.loading`).
        max_concurrency: Most generation requests in flight at once, per adapter (so up to ``adapters_in_flight *
            max_concurrency`` in all); also the scores in flight on a server. An in-process provider gets all of an
            adapter's scores at once, and batches them as it can.
        scorer: ``"exact"``, ``"regex"`` (``expected`` is a pattern searched in the output),
            ``"pkg.module:function"``, or a callable ``(output, expected, row) -> float | bool | None``. It judges
            generated text, so a score-only run takes none.
        on_progress: Called with a :class:`~inference.evaluation.progress.Progress` after every row and
            adapter, e.g. a :class:`~inference.evaluation.progress.TerminalProgress`.
        warmup: Before the first adapter, send one base-model request (a generation of ``max_tokens=1``, or a score
            in a score-only run) so that a lazily loaded model's load time is counted neither in the first
            adapter's latencies nor in the progress bar's rate. If the base model cannot answer at all (server down,
            model missing), the run stops there with that error.
        adapters_in_flight: Adapters evaluated at once, each loaded, answered and unloaded on its own, in input
            order as places free up. Backends that batch requests for different adapters together (Transformers,
            vLLM offline and server: ``provider.batches_mixed_adapters``) then put several adapters in each
            forward pass; on llama.cpp adapters take turns in the decode loop, so there it brings little. Capped
            at the provider's ``max_adapters`` (loading more would evict adapters still in use). Rows are the
            same as one at a time; they reach the file in the order they finish.
        mode: ``"generate"``: generate every prompt, and score its expected answer and choices where the provider
            can. ``"score"``: only score (no generation: no ``output``, latency or scorer), for likelihood
            evaluations (NLL of reference answers, multiple-choice accuracy); every prompt needs ``expected`` or
            ``choices``. ``"auto"`` (default): ``"score"`` when there is nothing a generation would be used for (no
            scorer, and every prompt has ``choices``), else ``"generate"``; a results file being resumed keeps the
            mode its rows were made in.
        base: Also evaluate the base model (no adapter) on the same prompts, as the reference row
            (:data:`~inference.evaluation.inputs.BASE_MODEL_ID` in the results, ``summary.base``) that each
            adapter's ``*_delta`` figures are measured from. It costs one adapter's worth of requests, once per
            results file (resumed like the others); ``False`` skips it.

    Returns:
        The per-adapter summary of every row of these adapters and prompts (earlier runs' rows included).

    Raises:
        InvalidRequestError: The prompt set or an adapter path is invalid, a generation setting is out
            of range, ``mode`` is unknown, or a score-only run was given a scorer or a prompt with nothing to score
            (checked before anything runs).
        InvalidAdapterError: Weights in memory whose config is not a ``LoraConfig`` or a dict.
        ResultsFileMismatchError: ``output`` holds rows made with other settings, for another text of a
            prompt, or for another version of an adapter (an :class:`InvalidRequestError`; nothing is written).
        ResultsFileInUseError: Another run is writing ``output`` (a :class:`ConfigurationError`, raised at once;
            nothing is written).
        ConfigurationError: The provider config or the scorer is invalid, ``output`` (or the CSV summary's path)
            exists and is not a regular file (a pipe such as ``/dev/stdout``, a device such as ``/dev/null``), or
            the output cannot be written (a full disk: the message names the file).
        UnsupportedOperationError: The provider cannot load adapters, or cannot score what the run must score.
        MissingDependencyError: The provider's extra is not installed.

    Example:
        >>> import asyncio, tempfile, pathlib
        >>> from inference.evaluation import EvalPrompt, evaluate_adapters
        >>> folder = pathlib.Path(tempfile.mkdtemp()); (folder / "style").mkdir()
        >>> summary = asyncio.run(evaluate_adapters(
        ...     [folder / "style"], [EvalPrompt("q1", "Hello")], {"provider": "fake"}, folder / "out.jsonl"))
        >>> summary.adapters[0].adapter_id, summary.adapters[0].rows, summary.base.rows, summary.errors
        ('style', 1, 1, 0)
    """
    started = time.monotonic()
    check_file_path(output)  # a pipe or a device would hang or never end; refused before anything else
    check_file_path(summary_csv_path(output), "summary file")
    if mode not in MODES:
        raise InvalidRequestError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(base, bool):
        raise InvalidRequestError(f"base must be True or False, got {base!r}")
    specs, explicit_ids = adapter_specs(adapters)
    prompt_list = load_prompts(prompts) if isinstance(prompts, (str, os.PathLike)) else checked_prompts(prompts)
    if not prompt_list:
        raise InvalidRequestError("the prompt set is empty")
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise InvalidRequestError(f"max_concurrency must be a positive integer, got {max_concurrency!r}")
    if isinstance(adapters_in_flight, bool) or not isinstance(adapters_in_flight, int) or adapters_in_flight < 1:
        raise InvalidRequestError(f"adapters_in_flight must be a positive integer, got {adapters_in_flight!r}")
    if mode == "score" and scorer is not None:
        raise _scorer_in_score_only()
    generation = None if mode == "score" else generation_settings(provider_config)
    scoring = _score_settings(provider_config)
    score = resolve_scorer(scorer, prompt_list)
    if provider is None:
        provider = get_provider_for_step(provider_config)
    if not provider.supports_adapters:
        raise UnsupportedOperationError(
            f"the {provider.name} provider cannot load adapters, so it cannot evaluate them: "
            "use llamacpp, transformers, vllm or ollama",
            provider=provider.name,
        )
    multiple_choice = [prompt.id for prompt in prompt_list if prompt.choices is not None]
    if multiple_choice and not provider.supports_scoring:
        raise UnsupportedOperationError(
            f"prompts {_some(multiple_choice)} have 'choices', which are scored by log-likelihood, and the "
            f"{provider.name} provider cannot score: use transformers, llamacpp or vllm, or drop the choices",
            provider=provider.name,
        )
    if mode == "score":
        _check_score_only(provider, prompt_list, scorer)
    hashes: list[str | None] = list(
        await asyncio.gather(
            *(asyncio.to_thread(adapter_hash, spec.weights if spec.weights is not None else str(spec.path))
              for spec in specs)
        )
    )  # fmt: skip
    specs, hashes = name_weights(specs, hashes)
    if base:
        specs, hashes = [AdapterSpec(BASE_MODEL_ID), *specs], [None, *hashes]
    checked: list[tuple[str, dict[str, Any], dict[str, Any], Reconciled]] = []

    def check(rows: list[dict[str, Any]]) -> None:
        chosen = _resolve_mode(mode, rows, prompt_list, score)
        if chosen == "score":  # also when "auto" follows a score-only file being resumed
            _check_score_only(provider, prompt_list, scorer)
        settings = scoring if chosen == "score" or generation is None else generation
        fingerprint = run_settings(provider, settings, scorer, mode=chosen)
        reconciled = reconcile(
            specs, hashes, prompt_list, fingerprint, rows, output=output, explicit_ids=explicit_ids
        )
        checked.append((chosen, settings, fingerprint, reconciled))

    _, writer = open_results(output, check=check)  # locked: another run on this file is refused here
    chosen_mode, settings, fingerprint, reconciled = checked[-1]  # of the rows read under the lock
    specs = list(reconciled.specs)
    prompt_ids = {prompt.id for prompt in prompt_list}
    done = {row_key(row) for row in reconciled.reused}
    run = _Run(
        provider=provider,
        writer=writer,
        prompts=prompt_list,
        mode=chosen_mode,
        settings=settings,
        fingerprint=fingerprint,
        adapter_hashes={spec.id: content for spec, content in zip(specs, hashes, strict=True)},
        prompt_hashes={prompt.id: prompt_hash(prompt) for prompt in prompt_list},
        scorer=score,
        max_concurrency=max_concurrency,
        on_progress=on_progress,
        adapters_total=len(specs),
        rows_total=len(specs) * len(prompt_list),
        rows_done=len(done),
    )
    timings: dict[str, AdapterTimings] = {}
    resumed = run.rows_done
    in_flight = _adapters_at_once(provider, adapters_in_flight)
    with writer:
        if warmup and run.rows_done < run.rows_total:
            await _warm_up(run, prompt_list[0])
        run.started = time.monotonic()  # the rate and the time left count from here, not from the model's load
        places = asyncio.Semaphore(in_flight)
        stopping = False  # set by the first adapter that fails or is cancelled: the waiting ones never start

        async def evaluate(spec: AdapterSpec) -> None:
            nonlocal stopping
            async with places:
                if stopping:
                    return
                try:
                    pending = [prompt for prompt in prompt_list if (spec.id, prompt.id) not in done]
                    if pending:
                        timings[spec.id] = await _evaluate_adapter(run, spec, pending)
                        writer.sync()
                    run.adapters_done += 1
                    run.report(None if run.adapters_done == run.adapters_total else spec.id)
                except BaseException:
                    stopping = True
                    raise

        await _all_or_cancel([evaluate(spec) for spec in specs])
        belongs = row_filter(reconciled.specs, [run.adapter_hashes[spec.id] for spec in specs])  # as loaded
        rows = [row for row in read_rows(output) if belongs(row)]  # still locked: no other run's rows
        summaries = summarise(rows, specs, prompt_ids, timings, run.adapter_hashes)
        base_summary = summaries.pop(0) if base else None
        summary = EvaluationSummary(
            adapters=tuple(summaries),
            output=Path(output),
            csv_path=summary_csv_path(output),
            rows_total=run.rows_total,
            rows_written=run.rows_written,
            rows_resumed=resumed,
            elapsed_s=time.monotonic() - started,
            base=base_summary,
            mode=chosen_mode,
        )
        summary.write_csv()
    return summary


def _some(ids: Sequence[str]) -> str:
    return f"{', '.join(ids[:3])}{'...' if len(ids) > 3 else ''}"


def _scorer_in_score_only() -> InvalidRequestError:
    return InvalidRequestError(
        "a scorer judges generated text, and a score-only run generates none: drop the scorer (the log-likelihood "
        "figures need none), or evaluate with mode='generate'"
    )


def _check_score_only(provider: InferenceProvider, prompts: Sequence[EvalPrompt], scorer: object) -> None:
    """Refuse a score-only run that could not score: a scorer, a provider without scores, prompts with nothing to
    score (they would never get a row)."""
    if scorer is not None:
        raise _scorer_in_score_only()
    if not provider.supports_scoring:
        raise UnsupportedOperationError(
            f"a score-only evaluation needs a provider that can score (transformers, llamacpp, vllm), and the "
            f"{provider.name} provider cannot: evaluate with mode='generate'",
            provider=provider.name,
        )
    nothing = [prompt.id for prompt in prompts if not prompt.expected and prompt.choices is None]
    if nothing:
        raise InvalidRequestError(
            f"prompts {_some(nothing)} have neither 'expected' nor 'choices', so a score-only evaluation has "
            "nothing to score for them: drop them, or evaluate with mode='generate'"
        )


def _resolve_mode(mode: str, rows: Sequence[Mapping[str, Any]], prompts: Sequence[EvalPrompt], scorer: object) -> str:
    """``mode``, with ``"auto"`` decided: the mode of the rows being resumed, else ``"score"`` when nothing would use
    a generation (no scorer, every prompt multiple-choice), else ``"generate"``."""
    if mode != "auto":
        return mode
    for row in rows:
        stored = row.get("settings")
        return settings_mode(stored) if isinstance(stored, Mapping) else "generate"  # older rows: generated
    if scorer is None and all(prompt.choices is not None for prompt in prompts):
        return "score"
    return "generate"


def _adapters_at_once(provider: InferenceProvider, asked: int) -> int:
    """``adapters_in_flight``, capped at the provider's ``max_adapters`` where it has one."""
    capacity = getattr(provider, "max_adapters", None)
    if isinstance(capacity, int) and not isinstance(capacity, bool) and capacity < asked:
        logger.info(
            "evaluating %d adapters at once, not %d: the %s provider holds at most %d (max_adapters)",
            capacity, asked, provider.name, capacity,
        )
        return capacity
    return asked


async def _all_or_cancel(work: Sequence[Awaitable[None]]) -> None:
    """Run ``work`` concurrently; if one fails or the caller is cancelled, cancel the rest and wait for them."""
    tasks = [asyncio.ensure_future(item) for item in work]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _warm_up(run: _Run, prompt: EvalPrompt) -> None:
    try:
        if run.mode == "score":
            expected = prompt.expected if isinstance(prompt.expected, str) else None  # a scorer's data is no text
            continuation = expected or (prompt.choices or ("?",))[0]
            await run.provider.score(prompt.prompt, continuation, run.model)
        else:
            await run.provider.generate(prompt.prompt, **{**run.settings, "max_tokens": 1})
    except (ProviderUnavailableError, ModelError, ConfigurationError, MissingDependencyError):
        raise  # nothing of this run could work: say so once instead of in every row
    except Exception as error:  # the rows will tell; the warm-up only saves latency
        logger.info("warm-up request failed (%s); going on", error)


def _settings_for(settings: dict[str, Any], prompt: EvalPrompt) -> dict[str, Any]:
    """The run's settings for one prompt: its own system prompt, where it has one, replaces the run's."""
    if prompt.system_prompt is None:
        return settings
    return {**settings, "system_prompt": prompt.system_prompt}


async def _evaluate_adapter(run: _Run, spec: AdapterSpec, pending: list[EvalPrompt]) -> AdapterTimings:
    loaded: LoadedAdapter | None = None  # the base model: nothing to load
    load_s = score_s = generate_s = unload_s = 0.0
    if spec.id != BASE_MODEL_ID:
        start = time.perf_counter()
        try:
            loaded = await load_for_turn(
                run.provider, spec, run.adapter_hashes, has_rows=len(pending) < len(run.prompts),
                output=run.writer.path,
            )  # fmt: skip
        except Exception as error:  # any failure to load is this adapter's result; the run goes on
            logger.warning("adapter %s (%s) could not be loaded: %s", spec.id, spec.path or "in memory", error)
            for prompt in pending:
                run.write(_row(run, spec, prompt, error=row_error("load", error)))
            return AdapterTimings(load_s=time.perf_counter() - start)
        load_s = time.perf_counter() - start
    try:
        start = time.perf_counter()
        try:
            likelihood = await _score_all(run, spec, loaded, pending)
        finally:
            score_s = time.perf_counter() - start
            run.score_s += score_s
        if run.mode != "score":
            start = time.perf_counter()
            try:
                await _generate_all(run, spec, loaded, pending, likelihood)
            finally:
                generate_s = time.perf_counter() - start
                run.generate_s += generate_s
    finally:
        if loaded is not None:
            start = time.perf_counter()
            await unload_after_turn(run.provider, loaded)  # unless the caller or another run uses it
            unload_s = time.perf_counter() - start
    return AdapterTimings(load_s=load_s, generate_s=generate_s, unload_s=unload_s, score_s=score_s)


async def _score_all(
    run: _Run, spec: AdapterSpec, loaded: LoadedAdapter | None, pending: list[EvalPrompt]
) -> dict[str, dict[str, Any]]:
    """Score every pair of ``pending`` in one ``score_batch``; the log-likelihood fields of each row, by prompt id
    (with an ``error`` for a row one of whose scores failed, beside the figures its other scores give).

    A score-only run writes each row as soon as its last score arrives. An in-process provider gets all the pairs
    at once (it queues them and batches as it can); a server at most ``max_concurrency`` at a time.
    """
    if not run.provider.supports_scoring:
        return {}
    wanted = [(prompt, score_pairs(prompt, run.scorer)) for prompt in pending]
    pairs = [pair for _, prompt_pairs in wanted for pair in prompt_pairs]
    if not pairs:
        return {}
    owners = [index for index, (_, prompt_pairs) in enumerate(wanted) for _ in prompt_pairs]
    firsts = [0] * len(wanted)  # where each row's pairs start in ``pairs``
    for index in range(1, len(wanted)):
        firsts[index] = firsts[index - 1] + len(wanted[index - 1][1])
    items: list[list[ScoreResult | Exception | None]] = [[None] * len(prompt_pairs) for _, prompt_pairs in wanted]
    remaining = [len(prompt_pairs) for _, prompt_pairs in wanted]
    fields: dict[str, dict[str, Any]] = {}
    failures: list[BaseException] = []

    def arrived(index: int, item: ScoreResult | Exception) -> None:
        owner = owners[index]
        items[owner][index - firsts[owner]] = item
        remaining[owner] -= 1
        if remaining[owner]:
            return
        prompt = wanted[owner][0]
        fields[prompt.id] = likelihood_fields(prompt, run.scorer, items[owner])
        if run.mode == "score" and not failures:
            try:  # score_batch would log and swallow an error of this callback: a full disk must stop the run
                run.write(_scored_row(run, spec, prompt, fields[prompt.id]))
            except BaseException as error:
                failures.append(error)

    in_flight = len(pairs) if run.provider.runs_in_process else run.max_concurrency
    adapter_id = None if loaded is None else loaded.adapter_id
    with for_turn(loaded):  # refused once the id serves other weights than the turn loaded
        await run.provider.score_batch(pairs, run.model, adapter_id, max_concurrency=in_flight, on_result=arrived)
    if failures:
        raise failures[0]
    return fields


def _scored_row(run: _Run, spec: AdapterSpec, prompt: EvalPrompt, likelihood: Mapping[str, Any]) -> dict[str, Any]:
    """The row of a score-only run: no generation (``output``, tokens, latency are ``null``), the likelihoods."""
    return with_likelihood(_row(run, spec, prompt), likelihood)


async def _generate_all(
    run: _Run,
    spec: AdapterSpec,
    loaded: LoadedAdapter | None,
    pending: list[EvalPrompt],
    likelihood: Mapping[str, Mapping[str, Any]],
) -> None:
    # Our own semaphore rather than provider.generate_batch: prompts carry their own system prompt, and each
    # row needs its own latency. Concurrent generate() calls still batch where the provider batches.
    semaphore = asyncio.Semaphore(run.max_concurrency)
    adapter_id = None if loaded is None else loaded.adapter_id

    async def one(prompt: EvalPrompt) -> None:
        async with semaphore:
            start = time.perf_counter()
            try:
                with for_turn(loaded):  # refused once the id serves other weights than the turn loaded
                    result: GenerationResult | Exception = await run.provider.generate(
                        prompt.prompt, adapter_id=adapter_id, **_settings_for(run.settings, prompt)
                    )
            except Exception as error:  # this row's answer
                result = error
            latency = time.perf_counter() - start
            if isinstance(result, Exception):
                row = _row(run, spec, prompt, latency_s=latency, error=row_error("generate", result))
            else:
                row = _scored(run.scorer, _row(run, spec, prompt, result=result, latency_s=latency), prompt)
            row = with_likelihood(row, likelihood.get(prompt.id, {}))  # scored before: kept whatever happened
        run.write(row)

    await _all_or_cancel([one(prompt) for prompt in pending])


def _row(
    run: _Run,
    spec: AdapterSpec,
    prompt: EvalPrompt,
    *,
    result: GenerationResult | None = None,
    latency_s: float | None = None,
    error: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "adapter_id": spec.id,
        "adapter_path": None if spec.path is None else str(spec.path),
        "adapter_hash": run.adapter_hashes[spec.id],
        "prompt_id": prompt.id,
        "prompt_hash": run.prompt_hashes[prompt.id],
        "output": result.text if result else None,
        "prompt_tokens": result.prompt_tokens if result else None,
        "completion_tokens": result.completion_tokens if result else None,
        "finish_reason": result.finish_reason if result else None,
        "latency_s": round(latency_s, 6) if latency_s is not None else None,
        "error": error,
        "score": None,
        "settings": run.fingerprint,
    }


def _scored(scorer: Scorer | None, row: dict[str, Any], prompt: EvalPrompt) -> dict[str, Any]:
    if scorer is None:
        return row
    try:
        row["score"] = score_value(scorer(str(row["output"]), prompt.expected, dict(row)))
    except Exception as error:  # a scorer bug costs this row's score, not the run
        row["score_error"] = f"{type(error).__name__}: {error}"
    return row
