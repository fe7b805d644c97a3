"""vLLM's async engine for the ``vllm-offline`` provider: starting it, sampling settings, reading its outputs, and
shutting it down quietly."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference._core.dependencies import import_optional
from inference._core.hub import hub_model_problem
from inference._core.paths import HUB_ID
from inference._core.scoring import Vocabulary
from inference._core.validation import GenerationRequest
from inference._inprocess.hf_prompt import scoring_vocabulary
from inference._inprocess.token_bytes import end_token_ids
from inference._inprocess.unguarded_main import spawning_without_unguarded_main
from inference._inprocess.vllm_adapter_check import layer_features
from inference._inprocess.vllm_base_slot import (
    BASE_ADAPTER_ID,
    BASE_ADAPTER_NAME,
    needs_base_adapter,
    remove_base_adapter,
    write_base_adapter,
)
from inference.exceptions import InvalidRequestError, ModelLoadError, TokenLimitError
from inference.options import GenerationOptions
from inference.results import TokenLogprob

PROVIDER = "vllm-offline"
"""The provider name errors carry."""

DEFAULT_MAX_TOKENS: int = GenerationOptions().max_tokens
"""``generate``'s default ``max_tokens``; left at it, the room left in the context decides."""


@dataclass(frozen=True)
class Engine:
    """The running engine and what requests need from it."""

    llm: Any
    sampling: Any  # the module vllm.sampling_params
    lora_request: Any  # the class vllm.lora.request.LoRARequest
    tokenizer: Any
    vocabulary: Vocabulary
    max_model_len: int
    vocab_size: int
    refusals: tuple[type[Exception], ...] = (ValueError, TypeError)
    """What vLLM raises for a request it refuses (its ``VLLMClientError``, the errors of a 4xx on its server):
    an :class:`~inference.exceptions.InvalidRequestError`, never an engine failure."""
    layer_features: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """The decoder's linear layers by last name -> ``(in_features, out_features)``, from the model's config
    (:func:`~inference._inprocess.vllm_adapter_check.layer_features`): what an adapter's matrices must fit."""
    sampling_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The model's own sampling settings (``generation_config.json``, as vLLM reads them: ``temperature``,
    ``top_p``, ``top_k``, ``repetition_penalty``...), for what a request leaves unset."""
    samples_by_default: bool = False
    """The model's generation config sets ``do_sample``; without it an unset temperature decodes greedily, as on
    Transformers."""
    eos_ids: tuple[int, ...] = ()
    """The tokens the engine stops on, the tokenizer's EOS first: the tokenizer's and the generation config's, as
    vLLM reads them (:func:`~inference._inprocess.token_bytes.end_token_ids`, Transformers' set too)."""
    base_lora: Any = None
    """The ``LoRARequest`` requests on the base model carry (:mod:`~inference._inprocess.vllm_base_slot`; on vLLM's
    CPU build), else ``None``."""
    base_lora_directory: str | None = None
    """Where that adapter lies, removed when the engine shuts down."""


def start_engine(model_name: str, settings: Mapping[str, Any]) -> Engine:
    """Import vLLM and start its engine (call it in a worker thread: this takes seconds to minutes).

    Args:
        model_name: A local model directory or a Hugging Face Hub id.
        settings: ``AsyncEngineArgs`` over this module's own (the provider's settings, then the user's engine
            arguments, which are passed unchecked).
    """
    if not model_name:
        raise ModelLoadError(
            "no model to load: give model_name (or set VLLM_OFFLINE_MODEL_NAME) to a local model directory",
            provider=PROVIDER,
        )
    hub_id = not Path(model_name).exists() and HUB_ID.fullmatch(model_name) is not None
    problem = hub_model_problem(model_name) if hub_id else None
    if problem is None and not hub_id and not Path(model_name).is_dir():
        problem = (
            f"model_name {model_name!r} is not a directory, nor a Hugging Face Hub id (ORG/NAME): give a "
            "local model directory or a Hub id"
        )
    if problem is not None:
        raise ModelLoadError(problem, provider=PROVIDER, path=model_name)
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ModelLoadError(
            "vLLM's engine cannot start here: this code runs again while Python starts a process the main "
            "script spawned (vLLM spawns its engine process, which runs the main script first). Put the code "
            'that uses the provider under `if __name__ == "__main__":` in the script',
            provider=PROVIDER,
            path=model_name,
        )
    arg_utils = import_optional("vllm.engine.arg_utils", provider=PROVIDER)
    async_llm = import_optional("vllm.v1.engine.async_llm", provider=PROVIDER)
    sampling = import_optional("vllm.sampling_params", provider=PROVIDER)
    lora_request = import_optional("vllm.lora.request", provider=PROVIDER).LoRARequest
    arguments: dict[str, Any] = {
        "model": model_name,
        "disable_log_stats": True,
        "max_logprobs": -1,  # next_token_logprobs asks for every token's (a request's logprobs stay its own)
        # JSON as llguidance compiles it in process (the same library, compact): free whitespace would let a model
        # fill max_tokens with it (a random one does), and a request would read other tokens than on Transformers
        "structured_outputs_config": import_optional("vllm.config", provider=PROVIDER).StructuredOutputsConfig(
            backend="guidance", disable_any_whitespace=True
        ),
        **settings,
    }
    base_directory = None
    if needs_base_adapter(arguments):  # a slot of its own for the base model (vLLM's CPU kernels read slot -1)
        arguments["max_loras"] = int(arguments.get("max_loras", 1)) + 1
        base_directory = write_base_adapter()
    try:
        with spawning_without_unguarded_main():  # an unguarded script must not run again there
            llm = async_llm.AsyncLLM.from_engine_args(arg_utils.AsyncEngineArgs(**arguments))
    except Exception as error:
        remove_base_adapter(None if base_directory is None else str(base_directory))
        raise ModelLoadError(
            f"vLLM could not start on {model_name!r}: {type(error).__name__}: {_one_line(error)}",
            provider=PROVIDER,
            path=model_name,
        ) from error
    tokenizer = llm.get_tokenizer()
    generation_config = llm.model_config.try_get_generation_config()  # what vLLM's requests read: stop tokens too
    client_error = getattr(import_optional("vllm.exceptions", provider=PROVIDER), "VLLMClientError", ValueError)
    return Engine(
        llm=llm,
        sampling=sampling,
        lora_request=lora_request,
        tokenizer=tokenizer,
        vocabulary=scoring_vocabulary(tokenizer),
        max_model_len=int(llm.model_config.max_model_len),
        vocab_size=int(llm.model_config.get_vocab_size()),
        refusals=(ValueError, TypeError, client_error),
        layer_features=layer_features(llm.model_config.hf_text_config),
        sampling_defaults={name: value for name, value in llm.model_config.get_diff_sampling_param().items()
                           if name in MODEL_DEFAULTS},
        samples_by_default=bool(generation_config.get("do_sample")),
        eos_ids=end_token_ids(tokenizer, generation_config.get("eos_token_id")),
        base_lora=None if base_directory is None else lora_request(
            BASE_ADAPTER_NAME, BASE_ADAPTER_ID, str(base_directory)
        ),
        base_lora_directory=None if base_directory is None else str(base_directory),
    )


async def started_engine(model_name: str, settings: Mapping[str, Any]) -> Engine:
    """:func:`start_engine` in a worker thread, then the base model's adapter registered with the engine (where
    there is one), so a start that cannot serve base requests fails here rather than at the first of them."""
    engine = await asyncio.to_thread(start_engine, model_name, settings)
    if engine.base_lora is not None:
        try:
            await engine.llm.add_lora(engine.base_lora)
        except Exception as error:
            await shut_down(engine)
            raise ModelLoadError(
                f"vLLM could not register the base model's zero adapter on {model_name!r}: "
                f"{type(error).__name__}: {_one_line(error)}",
                provider=PROVIDER,
                path=model_name,
            ) from error
    return engine


MODEL_DEFAULTS = ("temperature", "top_p", "top_k", "repetition_penalty", "presence_penalty", "frequency_penalty",
                  "min_p")
"""The sampling settings a request may leave to the model's generation config (vLLM's ``get_diff_sampling_param``,
which its own ``LLM`` class and server use too)."""


def is_greedy(engine: Engine, request: GenerationRequest) -> bool:
    """Whether the request decodes greedily: a temperature below :data:`GREEDY`, or none on a model whose generation
    config does not set ``do_sample`` (Transformers' rule, so that both give the same tokens)."""
    if request.temperature is not None:
        return request.temperature < GREEDY
    return not engine.samples_by_default


def sampling_params(engine: Engine, request: GenerationRequest, prompt_length: int, *, stream: bool) -> Any:
    """vLLM's ``SamplingParams`` for the request, ``max_tokens`` within the context; what it leaves unset is the
    model's (:data:`MODEL_DEFAULTS`, and greedy by :func:`is_greedy`), else vLLM's."""
    room = engine.max_model_len - prompt_length
    if room < 1:
        raise TokenLimitError(
            f"the prompt has {prompt_length} tokens, which fills the engine's max_model_len of "
            f"{engine.max_model_len}: shorten it, or raise max_model_len (VLLM_OFFLINE_MAX_MODEL_LEN)",
            limit=engine.max_model_len - 1, value=prompt_length, kind="context", provider=PROVIDER,
        )
    max_tokens = request.max_tokens
    if max_tokens > room:
        if max_tokens != DEFAULT_MAX_TOKENS:
            raise InvalidRequestError(
                f"max_tokens={max_tokens} does not fit: the prompt has {prompt_length} tokens and the engine's "
                f"max_model_len is {engine.max_model_len}, which leaves {room}; ask for at most {room}",
                provider=PROVIDER,
            )
        max_tokens = room
    if request.seed is not None and not -(2**63) <= request.seed < 2**63:  # the engine fails on it, unsaid
        raise InvalidRequestError(f"seed must fit in a signed 64-bit integer, got {request.seed}", provider=PROVIDER)
    sampling = engine.sampling
    arguments: dict[str, Any] = {
        "max_tokens": max_tokens,
        "output_kind": sampling.RequestOutputKind.DELTA if stream else sampling.RequestOutputKind.FINAL_ONLY,
    }
    if request.n > 1:
        arguments["n"] = request.n
    for name in ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "logprobs", "presence_penalty",
                 "frequency_penalty", "min_p"):
        value = getattr(request, name)
        value = engine.sampling_defaults.get(name) if value is None else value  # the model's, as Transformers
        if value is not None:
            arguments[name] = value
    if is_greedy(engine, request):
        arguments["temperature"] = 0.0
    if request.stop:
        arguments["stop"] = list(request.stop)
    if request.logit_bias:
        arguments["logit_bias"] = dict(request.logit_bias)
    if request.json_schema is not None:
        arguments["structured_outputs"] = sampling.StructuredOutputsParams(json=dict(request.json_schema))
    try:
        return sampling.SamplingParams(**arguments)
    except engine.refusals as error:
        raise InvalidRequestError(f"vLLM refused the sampling settings: {error}", provider=PROVIDER) from error


SHUTDOWN_SECONDS: float = 60.0
"""How long the engine's processes may take to exit when closed before vLLM kills them (vLLM's default, 5 s, is
too short on a busy machine: the kill leaves shared memory behind and warnings on stderr)."""


async def shut_down(engine: Engine) -> None:
    """Stop vLLM's engine so that nothing is printed, now or at exit.

    Its output handler task is stopped first (else it sees the dead engine and logs ``EngineDeadError``); requests
    still waiting get that error (our callers see a :class:`ProviderError`); the processes get
    :data:`SHUTDOWN_SECONDS` to exit; and the ``AsyncLLM``'s destructor, which would shut down again at interpreter
    exit, when vLLM's module globals are already gone (a ``TypeError``), is left nothing to do. The base model's
    adapter directory goes too.
    """
    llm = engine.llm
    handler = getattr(llm, "output_handler", None)
    if isinstance(handler, asyncio.Task) and not handler.done() and handler.get_loop() is asyncio.get_running_loop():
        handler.cancel()
        await asyncio.wait([handler])
    _fail_waiting_requests(llm)
    await asyncio.to_thread(llm.shutdown, SHUTDOWN_SECONDS)
    _fail_waiting_requests(llm)  # any request that registered while the engine shut down
    llm.shutdown = _already_shut_down
    remove_base_adapter(engine.base_lora_directory)


def _fail_waiting_requests(llm: Any) -> None:
    output_processor = getattr(llm, "output_processor", None)
    if output_processor is not None:
        output_processor.propagate_error(llm.dead_error)


def _already_shut_down(timeout: float | None = None) -> None:
    """What ``AsyncLLM.shutdown`` becomes once the provider shut the engine down."""


GREEDY = 1e-5
"""A temperature below this is greedy sampling (vLLM's ``_SAMPLING_EPS``), where vLLM refuses ``n > 1``."""


def _one_line(error: BaseException) -> str:
    """An error's message on one line (Python's spawn error starts with a line break: it read as empty)."""
    return " ".join(str(error).split())


def token_logprobs(token_ids: Any, logprobs: Any, k: int) -> list[TokenLogprob]:
    """vLLM's per-token ``{token_id: Logprob(logprob, rank, decoded_token)}`` as :class:`TokenLogprob` entries: the
    sampled token's, and the ``k`` best alternatives (ranks 1 to ``k``) best first."""
    entries: list[TokenLogprob] = []
    for token_id, candidates in zip(token_ids, logprobs or (), strict=False):
        chosen = candidates[token_id]
        best = sorted((entry for entry in candidates.values() if entry.rank is not None and entry.rank <= k),
                      key=lambda entry: entry.rank)
        entries.append(
            TokenLogprob(
                token=chosen.decoded_token or "",
                logprob=float(chosen.logprob),
                top_logprobs=tuple((entry.decoded_token or "", float(entry.logprob)) for entry in best),
                token_id=int(token_id),
            )
        )
    return entries
