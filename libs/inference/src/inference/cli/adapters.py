"""``inference adapters load | unload | list`` (the adapters a server holds) and ``inference convert-adapter``
(a PEFT LoRA directory into a GGUF LoRA file).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from inference.cli.options import SERVER_PROVIDERS, _step_config
from inference.cli.running import _print_json, _run_async, _UsageError


def _missing_action(command: argparse.ArgumentParser) -> int:
    command.print_usage(sys.stderr)
    print("inference adapters: usage error: choose an action: load, unload or list", file=sys.stderr)
    return 2


def _server_provider(args: argparse.Namespace) -> Any:
    from inference.factory import get_provider_for_step

    config = _step_config(args)
    if config["provider"] not in SERVER_PROVIDERS:
        raise _UsageError(
            f"the {config['provider']} provider runs in process: its adapters live only in the process that loaded "
            "them, so there is nothing to manage from the command line; choose --provider vllm or ollama, or use "
            "'inference generate --adapter PATH' / 'inference eval'"
        )
    return get_provider_for_step(config)


def _adapters_load(args: argparse.Namespace) -> int:
    provider = _server_provider(args)
    path = os.path.abspath(args.path) if Path(args.path).exists() else args.path
    _run_async(lambda: provider.load_adapter(args.adapter_id, path))
    if args.json:
        _print_json({"loaded": args.adapter_id, "path": path, "provider": provider.name})
    else:
        print(f"loaded {args.adapter_id} from {path}")
    return 0


def _adapters_unload(args: argparse.Namespace) -> int:
    provider = _server_provider(args)
    _run_async(lambda: provider.unload_adapter(args.adapter_id))
    if args.json:
        _print_json({"unloaded": args.adapter_id, "provider": provider.name})
    else:
        print(f"unloaded {args.adapter_id}")
    return 0


def _adapters_list(args: argparse.Namespace) -> int:
    provider = _server_provider(args)  # a provider whose extra is missing: MissingDependencyError naming it
    # vLLM's adapters replica by replica. Its module is loaded if the provider is one; not imported for the others,
    # whose extras need not install what it imports.
    vllm = sys.modules.get("inference.vllm_provider")

    async def work() -> tuple[list[str], dict[str, list[str] | str] | None]:
        # The provider asks the server (an unreachable one is ProviderUnavailableError, exit 1).
        adapters: list[str] = await provider.list_adapters()
        by_vllm_replica = vllm is not None and isinstance(provider, vllm.VLLMProvider)
        by_replica = await provider.replica_adapters() if by_vllm_replica else None
        return adapters, by_replica

    adapters, by_replica = _run_async(work)
    if args.json:
        listing: dict[str, Any] = {"adapters": adapters, "provider": provider.name}
        listing["stats"] = dataclasses.asdict(provider.adapter_stats())  # this process's lifecycle counters
        if by_replica is not None:
            listing["replicas"] = by_replica
        _print_json(listing)
    else:
        for adapter_id in adapters:
            print(adapter_id)
    return 0


def _convert_adapter(args: argparse.Namespace) -> int:
    from inference.adapters.gguf import convert_peft_to_gguf

    output = convert_peft_to_gguf(args.peft_dir, args.base, args.output)
    print(output)
    return 0
