"""The evaluation loop: for each adapter, load it, answer every prompt with bounded concurrency, unload it.

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

from inference._core.validation import GenerationRequest, validate_adapter_id
from inference.evaluation.identity import Reconciled, adapter_hash, prompt_hash, reconcile, run_settings
from inference.evaluation.inputs import AdapterSpec, EvalPrompt, discover_adapters, load_prompts
from inference.evaluation.progress import Progress
from inference.evaluation.rows import ResultsWriter, check_file_path, open_results, read_rows, row_key
from inference.evaluation.scoring import Scorer, regex_match, resolve_scorer, score_value
from inference.evaluation.summary import AdapterTimings, EvaluationSummary, summarise, summary_csv_path
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

__all__ = ["DEFAULT_MAX_TOKENS", "GENERATION_KEYS", "evaluate_adapters", "generation_settings"]

logger = logging.getLogger("inference.evaluation")

GENERATION_KEYS = ("model", *GenerationOptions.names())
"""Keys of the provider config that are generation settings: ``model`` and every
:class:`~inference.options.GenerationOptions` field (the rest configure the provider)."""

DEFAULT_MAX_TOKENS = 256
"""``max_tokens`` when the provider config gives none."""


def generation_settings(provider_config: Mapping[str, Any], *, provider: str = "evaluation") -> dict[str, Any]:
    """The generation settings of a provider config, checked as ``generate`` would check them.

    ``model`` defaults to ``""`` (in-process providers use their loaded model) and ``max_tokens`` to
    :data:`DEFAULT_MAX_TOKENS`; the other settings default to the backend's own and are left out. Values
    are as the checks return them (``stop`` a tuple, numbers of sampling as floats).

    Raises:
        InvalidRequestError: A setting is out of range or of the wrong type, or ``n`` is above 1 (a row records
            one completion).
    """
    given = {key: provider_config[key] for key in GENERATION_KEYS if provider_config.get(key) is not None}
    given.setdefault("model", "")
    given.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
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


@dataclass
class _Run:
    """The state of one evaluation run, shared by its adapters."""

    provider: InferenceProvider
    writer: ResultsWriter
    prompts: Sequence[EvalPrompt]
    settings: dict[str, Any]
    fingerprint: dict[str, Any]
    adapter_hashes: dict[str, str]
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
                )
            )

    def write(self, row: dict[str, Any]) -> None:
        self.writer.write(row)
        self.rows_written += 1
        self.rows_done += 1
        self.report(str(row["adapter_id"]))


async def evaluate_adapters(
    adapters: Sequence[str | os.PathLike[str] | AdapterSpec] | str | os.PathLike[str],
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
) -> EvaluationSummary:
    """Evaluate every adapter on every prompt, writing one JSONL row per (adapter, prompt) as each finishes.

    For each adapter in turn: load it, generate every prompt it still lacks with at most
    ``max_concurrency`` requests in flight, unload it. Running again with the same ``output`` resumes:
    pairs already in the file are skipped (a torn last line from a killed run is redone). An adapter that
    cannot be loaded gets one row per prompt carrying the load error, and the run goes on.

    A results file holds one experiment: rows are reused only for the same adapter (same path, same content
    hash), the same prompt text and the same settings (provider, base model, generation settings, scorer);
    anything else is refused before anything runs (see :mod:`~inference.evaluation.identity`).

    Args:
        adapters: Adapter directories or GGUF LoRA files, or globs (``"runs/*/adapter"``), or
            :class:`AdapterSpec` s. The adapter id is the directory name (see
            :func:`~inference.evaluation.inputs.adapter_id_for`), or the id the output file already holds
            for that adapter; a name the file holds for another adapter gets its parent folders' names
            prefixed (``ckpt-200-adapter``). The ids of :class:`AdapterSpec` s are kept as given.
        prompts: A JSONL prompt set (``id``, ``prompt``, optional ``system_prompt`` and ``expected``) or the
            prompts themselves.
        provider_config: A step config as :func:`~inference.get_provider_for_step` takes it (``provider``,
            ``base_url``, provider settings), plus generation settings: ``model``, ``max_tokens`` (default
            256) and the :class:`~inference.options.GenerationOptions` fields (``temperature``, ``stop``...);
            a ``system_prompt`` here is used for the prompts that have none.
        output: The JSONL results file (created, or resumed if it exists): a regular file, locked while the run
            writes it, so a second run on it is refused. The CSV summary is written next to it
            (``results.jsonl`` -> ``results.summary.csv``).
        provider: Use this provider instead of the one ``provider_config`` names (its generation settings
            still apply). The caller keeps ownership: it is not closed.
        max_concurrency: Most requests in flight at once, per adapter (so up to ``adapters_in_flight *
            max_concurrency`` in all).
        scorer: ``"exact"``, ``"regex"`` (``expected`` is a pattern searched in the output),
            ``"pkg.module:function"``, or a callable ``(output, expected, row) -> float | bool | None``.
        on_progress: Called with a :class:`~inference.evaluation.progress.Progress` after every row and
            adapter, e.g. a :class:`~inference.evaluation.progress.TerminalProgress`.
        warmup: Before the first adapter, send one base-model request (``max_tokens=1``) so that a lazily
            loaded model's load time is not counted in the first adapter's latencies. If the base model cannot
            answer at all (server down, model missing), the run stops there with that error.
        adapters_in_flight: Adapters evaluated at once, each loaded, answered and unloaded on its own, in input
            order as places free up. Backends that batch requests for different adapters together (Transformers,
            vLLM offline and server: ``provider.batches_mixed_adapters``) then put several adapters in each
            forward pass; on llama.cpp adapters take turns in the decode loop, so there it brings little. Capped
            at the provider's ``max_adapters`` (loading more would evict adapters still in use). Rows are the
            same as one at a time; they reach the file in the order they finish.

    Returns:
        The per-adapter summary of every row of these adapters and prompts (earlier runs' rows included).

    Raises:
        InvalidRequestError: The prompt set or an adapter path is invalid, or a generation setting is out
            of range (checked before anything runs).
        ResultsFileMismatchError: ``output`` holds rows made with other settings, for another text of a
            prompt, or for another version of an adapter (an :class:`InvalidRequestError`; nothing is written).
        ResultsFileInUseError: Another run is writing ``output`` (a :class:`ConfigurationError`, raised at once;
            nothing is written).
        ConfigurationError: The provider config or the scorer is invalid, ``output`` (or the CSV summary's path)
            exists and is not a regular file (a pipe such as ``/dev/stdout``, a device such as ``/dev/null``), or
            the output cannot be written (a full disk: the message names the file).
        UnsupportedOperationError: The provider cannot load adapters.
        MissingDependencyError: The provider's extra is not installed.

    Example:
        >>> import asyncio, tempfile, pathlib
        >>> from inference.evaluation import EvalPrompt, evaluate_adapters
        >>> folder = pathlib.Path(tempfile.mkdtemp()); (folder / "style").mkdir()
        >>> summary = asyncio.run(evaluate_adapters(
        ...     [folder / "style"], [EvalPrompt("q1", "Hello")], {"provider": "fake"}, folder / "out.jsonl"))
        >>> summary.adapters[0].adapter_id, summary.adapters[0].rows, summary.errors
        ('style', 1, 0)
    """
    started = time.monotonic()
    check_file_path(output)  # a pipe or a device would hang or never end; refused before anything else
    check_file_path(summary_csv_path(output), "summary file")
    specs, explicit_ids = _adapter_specs(adapters)
    prompt_list = load_prompts(prompts) if isinstance(prompts, (str, os.PathLike)) else list(prompts)
    if not prompt_list:
        raise InvalidRequestError("the prompt set is empty")
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise InvalidRequestError(f"max_concurrency must be a positive integer, got {max_concurrency!r}")
    if isinstance(adapters_in_flight, bool) or not isinstance(adapters_in_flight, int) or adapters_in_flight < 1:
        raise InvalidRequestError(f"adapters_in_flight must be a positive integer, got {adapters_in_flight!r}")
    settings = generation_settings(provider_config)
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
            f"prompts {', '.join(multiple_choice[:3])}{'...' if len(multiple_choice) > 3 else ''} have 'choices', "
            f"which are scored by log-likelihood, and the {provider.name} provider cannot score: use "
            "transformers, llamacpp or vllm, or drop the choices",
            provider=provider.name,
        )
    hashes = list(await asyncio.gather(*(asyncio.to_thread(adapter_hash, spec.path) for spec in specs)))
    fingerprint = run_settings(provider, settings, scorer)
    checked: list[Reconciled] = []

    def check(rows: list[dict[str, Any]]) -> None:
        checked.append(
            reconcile(specs, hashes, prompt_list, fingerprint, rows, output=output, explicit_ids=explicit_ids)
        )

    _, writer = open_results(output, check=check)  # locked: another run on this file is refused here
    reconciled = checked[-1]  # of the rows read under the lock
    specs = list(reconciled.specs)
    prompt_ids = {prompt.id for prompt in prompt_list}
    done = {row_key(row) for row in reconciled.reused}
    run = _Run(
        provider=provider,
        writer=writer,
        prompts=prompt_list,
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
            await _warm_up(provider, prompt_list[0], settings)
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
        rows = [row for row in read_rows(output) if reconciled.belongs(row)]  # still locked: no other run's rows
        adapters_summary = summarise(rows, specs, prompt_ids, timings, run.adapter_hashes)
        summary = EvaluationSummary(
            adapters=tuple(adapters_summary),
            output=Path(output),
            csv_path=summary_csv_path(output),
            rows_total=run.rows_total,
            rows_written=run.rows_written,
            rows_resumed=resumed,
            elapsed_s=time.monotonic() - started,
        )
        summary.write_csv()
    return summary


def _adapter_specs(
    adapters: Sequence[str | os.PathLike[str] | AdapterSpec] | str | os.PathLike[str],
) -> tuple[list[AdapterSpec], bool]:
    """The adapters, and whether the caller chose their ids (``AdapterSpec`` objects)."""
    if isinstance(adapters, (str, os.PathLike)):
        return discover_adapters([adapters]), False
    items = list(adapters)
    if items and all(isinstance(item, AdapterSpec) for item in items):
        specs = [item for item in items if isinstance(item, AdapterSpec)]
        ids = [spec.id for spec in specs]
        if len(set(ids)) != len(ids):
            raise InvalidRequestError(f"adapter ids must be unique, got {ids}")
        for spec in specs:
            validate_adapter_id(spec.id, provider="evaluation")
            if not Path(spec.path).exists():
                raise InvalidRequestError(
                    f"adapter path {spec.path} of {spec.id!r} does not exist here: the runner hashes each adapter's "
                    "files to tell versions apart, so give a path readable where the evaluation runs",
                    path=str(spec.path),
                )
        return specs, True
    if any(isinstance(item, AdapterSpec) for item in items):
        raise InvalidRequestError("give adapters either as paths and globs or as AdapterSpec objects, not both")
    return discover_adapters([item for item in items if not isinstance(item, AdapterSpec)]), False


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


async def _warm_up(provider: InferenceProvider, prompt: EvalPrompt, settings: dict[str, Any]) -> None:
    try:
        await provider.generate(prompt.prompt, **{**settings, "max_tokens": 1})
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
    provider = run.provider
    start = time.perf_counter()
    try:
        await provider.load_adapter(spec.id, os.path.abspath(spec.path))
    except Exception as error:  # any failure to load is this adapter's result; the run goes on
        logger.warning("adapter %s (%s) could not be loaded: %s", spec.id, spec.path, error)
        for prompt in pending:
            run.write(_row(run, spec, prompt, error=_error("load", error)))
        return AdapterTimings(load_s=time.perf_counter() - start)
    load_s = time.perf_counter() - start
    generate_start = time.perf_counter()
    try:
        await _generate_all(run, spec, pending)
    finally:
        generate_s = time.perf_counter() - generate_start
        unload_start = time.perf_counter()
        try:
            await provider.unload_adapter(spec.id)
        except Exception as error:  # the rows are written; a failed unload must not lose the run
            logger.warning("adapter %s could not be unloaded: %s", spec.id, error)
        unload_s = time.perf_counter() - unload_start
    return AdapterTimings(load_s=load_s, generate_s=generate_s, unload_s=unload_s)


async def _generate_all(run: _Run, spec: AdapterSpec, pending: list[EvalPrompt]) -> None:
    # Our own semaphore rather than provider.generate_batch: prompts carry their own system prompt, and each
    # row needs its own latency. Concurrent generate() calls still batch where the provider batches.
    semaphore = asyncio.Semaphore(run.max_concurrency)

    async def one(prompt: EvalPrompt) -> None:
        async with semaphore:
            start = time.perf_counter()
            try:
                result: GenerationResult | Exception = await run.provider.generate(
                    prompt.prompt, adapter_id=spec.id, **_settings_for(run.settings, prompt)
                )
            except Exception as error:  # this row's answer
                result = error
            latency = time.perf_counter() - start
            if isinstance(result, Exception):
                row = _row(run, spec, prompt, latency_s=latency, error=_error("generate", result))
            else:
                row = _scored(run.scorer, _row(run, spec, prompt, result=result, latency_s=latency), prompt)
                try:
                    row |= await likelihoods(run.provider, spec.id, prompt, settings=run.settings, scorer=run.scorer)
                except Exception as error:  # the row keeps its generation; the error says scoring failed
                    row["error"] = _error("score", error)
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
        "adapter_path": str(spec.path),
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


async def likelihoods(
    provider: InferenceProvider,
    adapter_id: str | None,
    prompt: EvalPrompt,
    *,
    settings: Mapping[str, Any],
    scorer: Scorer | None = None,
) -> dict[str, Any]:
    """The log-likelihood fields of a row, where the provider can score (``{}`` otherwise).

    - ``nll_per_token``: of ``expected`` after the prompt, when the row has an expected answer (not a pattern:
      nothing with the regex scorer).
    - For a multiple-choice row: ``choice_logprobs`` (each choice scored after the prompt), ``predicted`` (the
      highest: lm-eval's ``acc``), ``predicted_norm`` (the highest per character of the choice: lm-eval's
      ``acc_norm``), ``correct`` and ``correct_norm``.

    The context is the prompt's text as given (no chat template, no system prompt), as lm-eval scores.
    """
    if not provider.supports_scoring:
        return {}
    model = str(settings.get("model") or "")
    fields: dict[str, Any] = {}
    if prompt.expected and scorer is not regex_match:
        score = await provider.score(prompt.prompt, prompt.expected, model, adapter_id)
        fields["nll_per_token"] = score.nll_per_token
    if prompt.choices is not None:
        scores = [await provider.score(prompt.prompt, choice, model, adapter_id) for choice in prompt.choices]
        sums = [score.logprob for score in scores]
        normalised = [score.logprob / len(choice) for score, choice in zip(scores, prompt.choices, strict=True)]
        predicted, predicted_norm = sums.index(max(sums)), normalised.index(max(normalised))
        fields |= {
            "choice_logprobs": sums,
            "predicted": predicted,
            "predicted_norm": predicted_norm,
            "correct": predicted == prompt.answer,
            "correct_norm": predicted_norm == prompt.answer,
        }
    return fields


def _error(stage: str, error: BaseException) -> dict[str, str]:
    return {"stage": stage, "type": type(error).__name__, "message": str(error) or repr(error)}
