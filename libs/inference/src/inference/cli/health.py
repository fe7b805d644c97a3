"""``inference health``: the provider's health as a container probe (exit 0 up, 1 degraded, 2 down or misconfigured)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from inference.exceptions import InferenceError
from inference.health import EXIT_CODES, ProviderHealth

__all__ = ["add_health"]

DESCRIPTION = (
    "Check the provider the options (or INFERENCE_PROVIDER and its settings, from the environment or ./.env) "
    "describe, without generating anything: each server (each replica) is asked GET /models, at once and without "
    "retries; an in-process provider says whether its model file is there (its model loads in the process that "
    "uses it, not here). Exit status: 0 every backend up, 1 degraded (some up), 2 nothing answers or the "
    "configuration is invalid. Use it as a container health probe."
)

EPILOG = (
    "examples:\n"
    "  inference health                                    # the provider of INFERENCE_PROVIDER, settings from env\n"
    "  inference health --provider vllm --base-url http://a:8100/v1,http://b:8100/v1 --json\n"
    "  HEALTHCHECK CMD inference health --timeout 3 || exit 1          (Dockerfile)\n"
    "output: a line 'PROVIDER: STATUS (N of M backends up)', then one line per backend (up/down, name, latency,\n"
    "models, adapters, error); with --json one object {provider, status, error, backends: [{name, up, latency_s,\n"
    "models, adapters, model_loaded, error}]}."
)


def add_health(subcommands: Any) -> None:
    """Add the ``health`` subcommand (its provider options are those of ``generate``)."""
    from inference.cli.parser import _add_provider_options, _parser, seconds

    command = _parser(subcommands, "health", help="check that the provider's servers or model can serve "
                          "(exit 0 up, 1 degraded, 2 down)", description=DESCRIPTION, epilog=EPILOG)
    command.add_argument("--timeout", type=seconds, default=5.0, metavar="S", dest="probe_timeout",
                         help="seconds to wait for each server (default: 5)")  # not the provider's timeout setting
    command.add_argument("--json", action="store_true", help="print JSON for scripts")
    _add_provider_options(command)
    command.set_defaults(handler=_health, configuration_failed=_configuration_down)


def _health(args: argparse.Namespace) -> int:
    from inference.cli.options import _step_config
    from inference.cli.running import _print_json, _run_async, _UsageError
    from inference.factory import get_provider_for_step

    try:
        config = _step_config(args)

        async def work() -> ProviderHealth:
            return await get_provider_for_step(config).health(timeout=args.probe_timeout)

        health = _run_async(work)
    except (InferenceError, _UsageError) as error:  # an invalid configuration (a setting, .env, an extra missing)
        return _configuration_down(args, error)
    if args.json:
        _print_json(health.as_dict())
    else:
        _print(health)
    return health.exit_code


def _configuration_down(args: argparse.Namespace, error: Exception) -> int:
    """Report a configuration that does not resolve as ``down``, with its error (the JSON object too, with --json)."""
    from inference.cli.running import _print_error, _print_json

    provider = getattr(error, "provider", None) or getattr(args, "provider", None) or "inference"
    health = ProviderHealth.of(str(provider), (), error=str(error))
    if args.json:
        _print_json(health.as_dict())
    _print_error(f"error: {error}")
    return EXIT_CODES["down"]


def _print(health: ProviderHealth) -> None:
    up = sum(backend.up for backend in health.backends)
    print(f"{health.provider}: {health.status} ({up} of {len(health.backends)} backends up)")
    if health.error:
        print(f"  {health.error}")
    for backend in health.backends:
        parts = ["up  " if backend.up else "down", backend.name]
        if backend.latency_s is not None:
            parts.append(f"{backend.latency_s * 1000:.0f} ms")
        if backend.model_loaded is not None:
            parts.append("model loaded" if backend.model_loaded else "model not loaded yet (loads on first use)")
        elif backend.models:
            parts.append(f"models: {', '.join(backend.models)}")
        if backend.adapters or backend.model_loaded is not None:
            parts.append(f"adapters: {', '.join(backend.adapters) or 'none'}")
        if backend.error:
            parts.append(backend.error)
        print("  " + "  ".join(parts))
    sys.stdout.flush()
