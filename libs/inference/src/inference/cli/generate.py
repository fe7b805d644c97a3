"""``inference generate``: one completion, printed as text, a stream, or JSON."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from inference.cli.options import _adapter_for, _sampling, _step_config
from inference.cli.running import _print_json, _run_async, _UsageError
from inference.exceptions import InferenceError


def _generate(args: argparse.Namespace) -> int:
    from inference.factory import get_provider_for_step

    config = _step_config(args, generation_keys=True)
    sampling = {"max_tokens": 256, **_sampling(config)}
    prompt = _prompt_argument(args)

    async def work() -> int:
        provider = get_provider_for_step(config)
        async with _adapter_for(provider, args.adapter) as adapter_id:
            start = time.perf_counter()
            call: dict[str, Any] = {"model": config.get("model") or "", "adapter_id": adapter_id}
            if args.stream:
                result = await _print_stream(provider, prompt, call | sampling, as_json=args.json)
            else:
                result = await provider.generate(prompt, **call, **sampling)
        latency = time.perf_counter() - start
        if args.json:
            fields = _result_fields(result, latency)
            _print_json({"type": "result", **fields} if args.stream else fields)
        else:
            choices = result.choices or (result,)
            for number, choice in enumerate(choices, 1):
                if len(choices) > 1:
                    print(f"--- choice {number} of {len(choices)} ({choice.finish_reason})")
                if not args.stream:
                    print(choice.text)
                for tool_call in choice.tool_calls or ():
                    print(f"tool call {tool_call.id}: {tool_call.name} {tool_call.raw_arguments}")
                if choice.logprobs is not None:
                    _print_logprobs(choice.logprobs)
        return 0

    return _run_async(work)


def _prompt_argument(args: argparse.Namespace) -> Any:
    """PROMPT, or the conversation of --messages FILE (one of the two)."""
    if (args.prompt is None) == (args.messages is None):
        raise _UsageError("give PROMPT or --messages FILE (one of them)")
    if args.messages is None:
        return args.prompt
    from inference._core.json_files import read_json_file

    try:
        return read_json_file(args.messages, "the --messages file")
    except InferenceError as error:  # missing, not UTF-8, not JSON, too deep, a lone surrogate: one line, exit 2
        raise _UsageError(str(error)) from None


def _print_logprobs(logprobs: Sequence[Any]) -> None:
    """One line per generated token: its text, its logprob, and the alternatives asked for."""
    print()
    print(f"{'token':<20} {'logprob':>9}  alternatives")
    for entry in logprobs:
        alternatives = "  ".join(f"{token!r} {value:.3f}" for token, value in entry.top_logprobs)
        print(f"{entry.token!r:<20} {entry.logprob:>9.4f}  {alternatives}")


async def _print_stream(provider: Any, prompt: str, call: dict[str, Any], *, as_json: bool) -> Any:
    stream = getattr(provider, "stream", None)
    if stream is None:  # a provider from before streaming: one piece
        result = await provider.generate(prompt, **call)
        events: list[Any] = [result.text, result]
        source: Any = _aiter(events)
    else:
        source = stream(prompt, **call)
    result = None
    async for event in source:
        if isinstance(event, str):
            if as_json:
                _print_json({"type": "text", "text": event})
            else:
                sys.stdout.write(event)
                sys.stdout.flush()
        else:
            result = event
    if not as_json:
        print(flush=True)
    if result is None:
        raise InferenceError(f"the {provider.name} provider's stream ended without a result", provider=provider.name)
    return result


async def _aiter(items: list[Any]) -> Any:
    for item in items:
        yield item


def _result_fields(result: Any, latency_s: float) -> dict[str, Any]:
    return {
        "text": result.text,
        "model": result.model,
        "adapter_id": result.adapter_id,
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "token_count": result.token_count,
        "latency_s": round(latency_s, 6),
        "logprobs": None if result.logprobs is None else [
            {"token": entry.token, "logprob": entry.logprob, "top_logprobs": [list(top) for top in entry.top_logprobs]}
            for entry in result.logprobs
        ],
        "reasoning": result.reasoning,
        "tool_calls": None if result.tool_calls is None else [
            {"id": call.id, "name": call.name, "arguments": call.arguments, "raw_arguments": call.raw_arguments,
             "error": call.error}
            for call in result.tool_calls
        ],
        "token_ids": None if result.token_ids is None else list(result.token_ids),
        "choices": None if result.choices is None else [_result_fields(choice, latency_s) for choice in result.choices],
    }
