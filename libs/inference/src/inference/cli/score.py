"""``inference score``: the log-likelihood of a continuation (or of a whole text, ``--rolling``)."""

from __future__ import annotations

import argparse
from typing import Any

from inference.cli.options import _adapter_for, _step_config
from inference.cli.running import _print_json, _run_async, _UsageError


def _score(args: argparse.Namespace) -> int:
    from inference.factory import get_provider_for_step

    if args.rolling == (args.continuation is not None):
        raise _UsageError("give CONTEXT and CONTINUATION, or CONTEXT alone with --rolling")
    config = _step_config(args)

    async def work() -> Any:
        provider = get_provider_for_step(config)
        model = args.model or ""
        async with _adapter_for(provider, args.adapter) as adapter_id:
            if args.rolling:
                return await provider.score_rolling(args.context, model, adapter_id)
            return await provider.score(args.context, args.continuation, model, adapter_id)

    result = _run_async(work)
    fields = {
        "logprob": result.logprob,
        "num_tokens": result.num_tokens,
        "nll_per_token": result.nll_per_token,
        "is_greedy": result.is_greedy,
        "model": result.model,
        "adapter_id": result.adapter_id,
    }
    if args.json:
        _print_json(fields)
    else:
        for key in ("logprob", "num_tokens", "nll_per_token", "is_greedy"):
            print(f"{key:<14} {fields[key]}")
    return 0
