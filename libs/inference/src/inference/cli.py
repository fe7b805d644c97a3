"""The ``inference`` command line.

Each subcommand is one small function that takes the parsed arguments and returns the exit status;
:func:`build_parser` wires them up, so adding a subcommand is adding a ``_add_<name>`` and a handler.

Exit status: 0 on success, 1 when the SDK refuses or fails (one line on stderr, no traceback), 2 for usage
errors, 130 on Ctrl-C, and 141 (128 + SIGPIPE, what a shell reports for a program a closed pipe stopped) when
stdout is closed early, as by ``inference eval ... --json | head -c 100``: the command then stops quietly.
``--json`` makes a command print one JSON object on stdout (JSON lines for ``generate --stream``).

Example:
    $ inference generate "Hello" --provider llamacpp --model-path base.gguf --max-tokens 16 --temperature 0
    $ inference convert-adapter adapters/support --base models/qwen2.5-0.5b.gguf -o adapters/support.gguf
    adapters/support.gguf
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from inference import __version__
from inference._cli.health import add_health
from inference._cli.logs import add_log_options, command_logging, log_error
from inference._core.env_file import settings_environment
from inference._core.redaction import redact_url
from inference.config import SETTINGS, resolve_provider_type, resolve_settings
from inference.exceptions import (
    AdapterNotFoundError,
    ConfigurationError,
    InferenceError,
    InvalidRequestError,
    MissingDependencyError,
)
from inference.options import OPTIONS
from inference.registry import PROVIDER_EXTRAS, PROVIDER_REGISTRY, PROVIDERS

__all__ = ["PROVIDER_PACKAGES", "build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]
_T = TypeVar("_T")
_Subcommands = argparse._SubParsersAction  # argparse gives the type no public name

SERVER_PROVIDERS = tuple(name for name, spec in PROVIDERS.items() if spec.server)
"""Providers that talk to a server, whose adapters outlive the process (from the registry)."""

PROVIDER_PACKAGES: dict[str, tuple[str, ...]] = {name: spec.packages for name, spec in PROVIDERS.items()}
"""The import names each provider needs (what its pip extra installs; from the registry)."""

_MODEL_SETTINGS = {name: spec.model_setting for name, spec in PROVIDERS.items() if spec.model_setting}
"""In-process provider -> the setting ``--model-path`` sets (``model_path``, ``model_name``)."""

_GENERATION_TYPES: dict[str, Callable[[str], Any]] = {"model": str} | {
    name: spec.parse for name, spec in OPTIONS.items()
}
"""Generation keys of ``--set`` (``model`` and every generation option) -> how the text is read."""


class _UsageError(Exception):
    """The command line does not make sense (exit status 2)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``inference`` command, with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="inference",
        description="Tools of the inference-adapters SDK (async inference with a LoRA adapter lifecycle).",
        epilog=(
            "Run 'inference COMMAND --help' for a command's options and examples.\n"
            "Exit status: 0 success, 1 the SDK refused or failed (reason on stderr), 2 usage error,\n"
            "130 interrupted, 141 stdout closed early (a pipe into head).\n"
            "Settings not given on the command line come from the environment, then ./.env (see .env.example).\n"
            "Log lines on stderr: --log-level/INFERENCE_LOG_LEVEL, --log-format/INFERENCE_LOG_FORMAT (text, json)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subcommands = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_generate(subcommands)
    _add_score(subcommands)
    _add_adapters(subcommands)
    _add_convert_adapter(subcommands)
    _add_eval(subcommands)
    _add_providers(subcommands)
    add_health(subcommands)
    _add_lm_eval(subcommands)
    add_log_options(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``inference`` command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        The exit status: 0 success, 1 refused or failed (one line on stderr), 2 usage error, 130 interrupted,
        141 stdout closed early (the rest of the output is dropped quietly).
    """
    stdout = sys.stdout
    sys.stdout = _StandardOutput(stdout)  # a refused write names stdout
    try:
        status = _run(argv)
        sys.stdout.flush()  # a closed pipe shows here rather than at exit, where it could not be handled
    except BrokenPipeError:  # stdout's reader went away (``| head``), in any command
        return _stdout_closed()
    except OSError as error:  # stdout's file refused the text (``> file`` on a full disk)
        _print_error(f"error: {_os_error_sentence(error)}")
        _drop_stdout()
        return 1
    finally:
        sys.stdout = stdout
    return status


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        if words[:1] == ["lm-eval"] and words[1:2] not in (["-h"], ["--help"]):
            args = argparse.Namespace(handler=_lm_eval, lm_eval_args=words[1:])  # every argument is lm-eval's
        else:
            args = parser.parse_args(words)
    except SystemExit as exit_request:  # --help, --version, usage errors: argparse already printed
        code = exit_request.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    except _UsageError as error:  # a flag's file could not be read (--json-schema)
        _print_error(f"usage error: {error}")
        return 2
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        restore_logging = command_logging(args)
    except ConfigurationError as error:  # INFERENCE_LOG_LEVEL or INFERENCE_LOG_FORMAT
        _print_error(f"usage error: {error}")
        return 2
    try:
        return handler(args)
    except _UsageError as error:
        _print_error(f"usage error: {error}")
        return 2
    except InferenceError as error:
        _print_error(f"error: {error}")
        return 1
    except BrokenPipeError:
        raise  # main's to handle
    except OSError as error:  # the file system refused (a directory that cannot be written, a full disk...)
        _print_error(f"error: {_os_error_sentence(error)}")
        if error.filename == _StandardOutput.name:
            _drop_stdout()
        return 1
    except KeyboardInterrupt:
        _print_error("interrupted")
        return 130
    finally:
        restore_logging()


def _print_error(message: str) -> None:
    """One line on stderr, whatever line breaks the message holds (a JSON record with INFERENCE_LOG_FORMAT=json)."""
    line = " ".join(message.split())
    if not log_error(line):
        print(f"inference: {line}", file=sys.stderr)


def _os_error_sentence(error: OSError) -> str:
    where = f"{error.filename}: " if error.filename is not None else ""
    if error.errno in _DISK_FULL:
        return f"{where}{error.strerror or error}: free some space and run the command again"
    return f"{where}{error.strerror or error}: check the path and its permissions"


_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}


class _StandardOutput:
    """``sys.stdout`` while a command runs: a write or flush the system refuses (``> file`` on a full disk)
    names ``standard output`` as its file, so the one-line error says which file is full."""

    name = "standard output"

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return int(self._named(self._stream.write, text))

    def flush(self) -> None:
        self._named(self._stream.flush)

    def _named(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as error:
            if error.filename is None and not isinstance(error, BrokenPipeError):
                error.filename = self.name
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_closed() -> int:
    """Stop quietly after the reader of stdout went away (``| head``); the exit status is 128 + SIGPIPE."""
    _drop_stdout()
    return 128 + int(getattr(signal, "SIGPIPE", 13))  # 13 where the platform has no SIGPIPE (Windows)


def _drop_stdout() -> None:
    """Point stdout at devnull so that the flush at exit cannot fail again (Python's recommended handling)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file descriptor (a test's capture): nothing to flush later
        pass


# Shared options --------------------------------------------------------------------------------------------


def _parser(
    subcommands: _Subcommands[argparse.ArgumentParser], name: str, *, help: str, description: str, epilog: str
) -> argparse.ArgumentParser:
    command: argparse.ArgumentParser = subcommands.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return command


def _key_value(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _add_provider_options(command: argparse.ArgumentParser, *, in_process: bool = True) -> None:
    group = command.add_argument_group("provider")
    group.add_argument(
        "--provider",
        metavar="NAME",
        help=f"provider type: {', '.join(sorted(PROVIDER_REGISTRY))} (default: $INFERENCE_PROVIDER, else vllm)",
    )
    group.add_argument(
        "--base-url", metavar="URL", help=f"server URL for {'/'.join(SERVER_PROVIDERS)} (default: $VLLM_BASE_URL...)"
    )
    if in_process:
        group.add_argument(
            "--model-path",
            metavar="PATH",
            help="in-process model: "
            + ", ".join(f"{key} of {name}" for name, key in _MODEL_SETTINGS.items())
            + " (the GGUF file, the model directory)",
        )
        group.add_argument("--device", metavar="DEVICE", help="transformers device: cpu, cuda, cuda:1...")
    group.add_argument(
        "--set",
        dest="settings",
        metavar="KEY=VALUE",
        action="append",
        type=_key_value,
        default=[],
        help="a provider setting (n_ctx=2048, max_adapters=4, timeout=30...; see .env.example); repeatable",
    )


def _add_generation_options(command: argparse.ArgumentParser, *, notes: dict[str, str]) -> None:
    """``--model`` and one flag per generation option (its help from :data:`inference.options.OPTIONS`).

    ``notes`` adds to an option's help, by option name (the command's default, how it applies).
    """
    group = command.add_argument_group("generation")
    group.add_argument("--model", metavar="NAME", help="model name on the server (in-process providers ignore it)")
    for name, spec in OPTIONS.items():
        note = f" ({notes[name]})" if name in notes else ""
        flag = spec.flag or f"--{name.replace('_', '-')}"
        group.add_argument(
            flag,
            dest=name,
            type=_flag_parser(flag, spec.parse),
            action="append" if spec.repeatable else "store",
            metavar=spec.metavar,
            help=spec.help + ("; repeatable" if spec.repeatable else "") + note,
        )


def _flag_parser(flag: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` for argparse, with the SDK's sentence for a value it refuses (a ``--json-schema`` file that cannot
    be read) as one usage-error line, instead of argparse's usage block and ``invalid ... value``."""

    def read(text: str) -> Any:
        try:
            return parse(text)
        except InferenceError as error:
            raise _UsageError(f"{flag}: {error}") from None

    read.__name__ = getattr(parse, "__name__", "value")  # argparse names the type in its own messages (int, float)
    return read


def _step_config(args: argparse.Namespace, *, generation_keys: bool = False) -> dict[str, Any]:
    """The step config the options describe: ``provider``, provider settings, and generation settings."""
    provider_type = resolve_provider_type(args.provider)
    settings = {setting.key: setting for setting in SETTINGS[provider_type]}
    config: dict[str, Any] = {"provider": provider_type}
    if args.base_url is not None:
        config["base_url"] = args.base_url
    if getattr(args, "model_path", None) is not None:
        key = _MODEL_SETTINGS.get(provider_type)
        if key is None:
            raise _UsageError(
                f"--model-path is for the in-process providers ({', '.join(_MODEL_SETTINGS)}), not {provider_type}"
            )
        config[key] = args.model_path
    if getattr(args, "device", None) is not None:
        if "device" not in settings:
            raise _UsageError(f"--device is a transformers setting; the {provider_type} provider has none")
        config["device"] = args.device
    for key, text in args.settings:
        if key in settings:
            try:
                config[key] = settings[key].parse(text)
            except ValueError as error:  # a key is never shown, nor the credentials of a URL
                shown = "(not shown)" if settings[key].kind == "secret" else redact_url(repr(text))
                raise _UsageError(f"--set {key}={shown}: {error}") from None
        elif generation_keys and key in _GENERATION_TYPES:
            try:
                value = _GENERATION_TYPES[key](text)
            except ValueError as error:  # the SDK's own sentence where it has one (a --json-schema file's problem)
                detail = f": {error}" if isinstance(error, InferenceError) else ""
                raise _UsageError(f"--set {key}={text!r} is not a valid {key}{detail}") from None
            repeatable = key in OPTIONS and OPTIONS[key].repeatable
            config[key] = [*config.get(key, []), value] if repeatable else value
        else:
            valid = sorted(settings) + (sorted(_GENERATION_TYPES) if generation_keys else [])
            raise _UsageError(
                f"--set {key}: not a setting of the {provider_type} provider; valid keys: {', '.join(valid) or 'none'}"
            )
    for key in _GENERATION_TYPES:
        value = getattr(args, key, None)
        if value is None:
            continue
        previous = config.get(key)
        # A repeatable option (--stop) adds to what --set gave; any other flag wins over --set.
        config[key] = [*previous, *value] if isinstance(previous, list) and isinstance(value, list) else value
    return config


def _sampling(config: dict[str, Any]) -> dict[str, Any]:
    """The generation options the step config sets, as ``generate``'s keyword arguments."""
    return {key: config[key] for key in OPTIONS if config.get(key) is not None}


def _run_async(work: Callable[[], Awaitable[_T]]) -> _T:
    """Run ``work`` on a fresh event loop and close every provider it used before returning."""
    from inference.factory import aclose_all_providers

    async def run() -> _T:
        try:
            return await work()
        finally:
            await aclose_all_providers()

    return asyncio.run(run())


def _print_json(value: Any) -> None:
    print(json.dumps(value, ensure_ascii=False), flush=True)


# generate --------------------------------------------------------------------------------------------------


def _add_generate(subcommands: _Subcommands[argparse.ArgumentParser]) -> None:
    command = _parser(
        subcommands,
        "generate",
        help="generate a completion for one prompt, optionally with an adapter",
        description=(
            "Generate a completion for PROMPT with any provider and print it. --adapter takes an adapter id "
            "already loaded on a server, or a path (PEFT directory or GGUF LoRA file), which is loaded for this "
            "command (and unloaded afterwards on a server)."
        ),
        epilog=(
            "examples:\n"
            "  inference generate 'Hello' --provider llamacpp --model-path base.gguf --max-tokens 32 --temperature 0\n"
            "  inference generate 'Hello' --provider llamacpp --model-path base.gguf --adapter adapters/style\n"
            "  inference generate 'Hi' --provider vllm --base-url http://localhost:8100/v1 \\\n"
            "      --model Qwen/Qwen2.5-0.5B --adapter support --stream\n"
            "  inference generate 'Hi' --provider transformers --model-path models/tiny --device cpu --json\n"
            "  inference generate --messages chat.json --json-schema answer.schema.json --logprobs 3 ...\n"
            "output: the text on stdout, then one 'tool call ID: NAME ARGUMENTS' line per tool call (with\n"
            "--logprobs, then a table: token, logprob, alternatives); with --json one object {text, model,\n"
            "adapter_id, finish_reason, prompt_tokens, completion_tokens, token_count, latency_s, logprobs,\n"
            "reasoning, tool_calls, token_ids}; with --stream --json one line\n"
            '{"type": "text", "text": ...} per piece, then {"type": "result", ...}.'
        ),
    )
    command.add_argument("prompt", metavar="PROMPT", nargs="?", help="the user's text (or give --messages)")
    command.add_argument(
        "--messages",
        metavar="FILE",
        help='a conversation as the prompt: a JSON list of {"role": "system"|"user"|"assistant", "content": ...}',
    )
    command.add_argument("--adapter", metavar="ID_OR_PATH", help="a loaded adapter id, or an adapter path to load")
    command.add_argument("--stream", action="store_true", help="print the text as it is generated")
    command.add_argument("--json", action="store_true", help="print JSON for scripts")
    _add_generation_options(command, notes={"max_tokens": "default: 256"})
    _add_provider_options(command)
    command.set_defaults(handler=_generate)


def _generate(args: argparse.Namespace) -> int:
    from inference.factory import get_provider_for_step

    config = _step_config(args)
    sampling = {"max_tokens": 256, **_sampling(config)}
    prompt = _prompt_argument(args)

    async def work() -> int:
        provider = get_provider_for_step(config)
        adapter_id, loaded_here = await _use_adapter(provider, args.adapter)
        start = time.perf_counter()
        try:
            call: dict[str, Any] = {"model": config.get("model") or "", "adapter_id": adapter_id}
            if args.stream:
                result = await _print_stream(provider, prompt, call | sampling, as_json=args.json)
            else:
                result = await provider.generate(prompt, **call, **sampling)
        finally:
            if loaded_here and not provider.runs_in_process and adapter_id is not None:
                await provider.unload_adapter(adapter_id)
        latency = time.perf_counter() - start
        if args.json:
            fields = _result_fields(result, latency)
            _print_json({"type": "result", **fields} if args.stream else fields)
        else:
            if not args.stream:
                print(result.text)
            for tool_call in result.tool_calls or ():
                print(f"tool call {tool_call.id}: {tool_call.name} {tool_call.raw_arguments}")
            if result.logprobs is not None:
                _print_logprobs(result.logprobs)
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


async def _use_adapter(provider: Any, adapter: str | None) -> tuple[str | None, bool]:
    """The adapter id to generate with, and whether this command loaded it (from a path)."""
    if adapter is None:
        return None, False
    from inference.evaluation.inputs import adapter_id_for

    if Path(adapter).exists():
        adapter_id = adapter_id_for(adapter)
        await provider.load_adapter(adapter_id, os.path.abspath(adapter))
        return adapter_id, True
    if provider.runs_in_process:
        raise AdapterNotFoundError(
            f"{adapter!r} is not an adapter path, and the {provider.name} provider runs in this process, where no "
            "adapter is loaded yet: pass --adapter PATH (a PEFT directory or GGUF LoRA file)",
            provider=provider.name,
            path=adapter,
        )
    return adapter, False


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
    }


# score -----------------------------------------------------------------------------------------------------


def _add_score(subcommands: _Subcommands[argparse.ArgumentParser]) -> None:
    command = _parser(
        subcommands,
        "score",
        help="the log-likelihood of a continuation after a context",
        description=(
            "Score CONTINUATION after CONTEXT (lm-eval's loglikelihood) with a provider that can "
            "(supports_scoring: transformers, llamacpp, vllm), optionally with an adapter. With --rolling, score "
            "all of CONTEXT instead (loglikelihood_rolling, for perplexity)."
        ),
        epilog=(
            "examples:\n"
            "  inference score 'Question: 2 + 2 =' ' 4' --provider llamacpp --model-path base.gguf\n"
            "  inference score 'A long document...' --rolling --provider transformers --model-path models/tiny\n"
            "output: logprob, num_tokens, nll_per_token, is_greedy; with --json one object with those keys."
        ),
    )
    command.add_argument("context", metavar="CONTEXT", help="the text before (with --rolling: the text to score)")
    command.add_argument("continuation", metavar="CONTINUATION", nargs="?", help="the text to score")
    command.add_argument("--rolling", action="store_true", help="score all of CONTEXT (no CONTINUATION)")
    command.add_argument("--adapter", metavar="ID_OR_PATH", help="a loaded adapter id, or an adapter path to load")
    command.add_argument("--model", metavar="NAME", help="model name on the server (in-process providers ignore it)")
    command.add_argument("--json", action="store_true", help="print JSON for scripts")
    _add_provider_options(command)
    command.set_defaults(handler=_score)


def _score(args: argparse.Namespace) -> int:
    from inference.factory import get_provider_for_step

    if args.rolling == (args.continuation is not None):
        raise _UsageError("give CONTEXT and CONTINUATION, or CONTEXT alone with --rolling")
    config = _step_config(args)

    async def work() -> Any:
        provider = get_provider_for_step(config)
        adapter_id, loaded_here = await _use_adapter(provider, args.adapter)
        model = args.model or ""
        try:
            if args.rolling:
                return await provider.score_rolling(args.context, model, adapter_id)
            return await provider.score(args.context, args.continuation, model, adapter_id)
        finally:
            if loaded_here and not provider.runs_in_process and adapter_id is not None:
                await provider.unload_adapter(adapter_id)

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


# adapters load | unload | list ------------------------------------------------------------------------------


def _add_adapters(subcommands: _Subcommands[argparse.ArgumentParser]) -> None:
    command = _parser(
        subcommands,
        "adapters",
        help="load, unload or list the adapters of a server (vllm, ollama)",
        description=(
            "Manage the LoRA adapters a server holds (vllm, ollama). Adapters loaded on a server stay there for "
            "other processes. The in-process providers (llamacpp, transformers) keep adapters only inside the "
            "process that loaded them, so this command refuses them: use 'inference generate --adapter PATH', "
            "'inference eval', or the Python API."
        ),
        epilog=(
            "examples:\n"
            "  inference adapters load support /models/adapters/support --provider vllm --base-url http://gpu:8100/v1\n"
            "  inference adapters list --provider vllm --json\n"
            "  inference adapters unload support --provider vllm\n"
            "the PATH is read by the server: give a path on the server's machine."
        ),
    )
    actions = command.add_subparsers(title="actions", metavar="ACTION")
    load = actions.add_parser("load", help="load an adapter under an id", description="Load an adapter on the server.")
    load.add_argument("adapter_id", metavar="ID", help="the id to use it by (letters, digits, '.', '_', '-')")
    load.add_argument("path", metavar="PATH", help="the adapter directory, as the server sees it")
    unload = actions.add_parser("unload", help="unload an adapter", description="Unload an adapter from the server.")
    unload.add_argument("adapter_id", metavar="ID", help="the adapter id")
    listing = actions.add_parser("list", help="list the loaded adapters", description="List the server's adapters.")
    for action, handler in ((load, _adapters_load), (unload, _adapters_unload), (listing, _adapters_list)):
        action.add_argument("--json", action="store_true", help="print JSON for scripts")
        _add_provider_options(action, in_process=False)
        action.set_defaults(handler=handler)
    command.set_defaults(handler=lambda _args: _missing_action(command))


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

    async def work() -> None:
        await provider.load_adapter(args.adapter_id, path)

    _run_async(work)
    if args.json:
        _print_json({"loaded": args.adapter_id, "path": path, "provider": provider.name})
    else:
        print(f"loaded {args.adapter_id} from {path}")
    return 0


def _adapters_unload(args: argparse.Namespace) -> int:
    provider = _server_provider(args)

    async def work() -> None:
        await provider.unload_adapter(args.adapter_id)

    _run_async(work)
    if args.json:
        _print_json({"unloaded": args.adapter_id, "provider": provider.name})
    else:
        print(f"unloaded {args.adapter_id}")
    return 0


def _adapters_list(args: argparse.Namespace) -> int:
    from inference.vllm_provider import VLLMProvider

    provider = _server_provider(args)

    async def work() -> tuple[list[str], dict[str, list[str] | str] | None]:
        # The provider asks the server (an unreachable one is ProviderUnavailableError, exit 1).
        adapters: list[str] = await provider.list_adapters()
        by_replica = await provider.replica_adapters() if isinstance(provider, VLLMProvider) else None
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


# convert-adapter ---------------------------------------------------------------------------------------------


def _add_convert_adapter(subcommands: _Subcommands[argparse.ArgumentParser]) -> None:
    command = _parser(
        subcommands,
        "convert-adapter",
        help="convert a PEFT LoRA adapter directory into a GGUF LoRA file for llama.cpp",
        description=(
            "Convert a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) into a GGUF "
            "LoRA file that llama.cpp loads on the given base model. The base GGUF decides the tensor names and "
            "shapes; an adapter trained for another model is refused. Prints the output path."
        ),
        epilog=(
            "example:\n"
            "  inference convert-adapter adapters/support --base models/base.gguf -o adapters/support.gguf\n"
            "then: Llama(model_path='models/base.gguf', lora_path='adapters/support.gguf')"
        ),
    )
    command.add_argument("peft_dir", metavar="PEFT_DIR", type=Path, help="the PEFT LoRA adapter directory")
    command.add_argument("--base", required=True, type=Path, metavar="MODEL.gguf", help="the base model's GGUF file")
    command.add_argument(
        "-o", "--output", required=True, type=Path, metavar="OUT.gguf", help="the GGUF LoRA file to write"
    )
    command.set_defaults(handler=_convert_adapter)


def _convert_adapter(args: argparse.Namespace) -> int:
    from inference.adapters.gguf import convert_peft_to_gguf

    output = convert_peft_to_gguf(args.peft_dir, args.base, args.output)
    print(output)
    return 0


# eval --------------------------------------------------------------------------------------------------------


def _add_eval(subcommands: _Subcommands[argparse.ArgumentParser]) -> None:
    command = _parser(
        subcommands,
        "eval",
        help="evaluate many adapters on a prompt set (resumable JSONL results, scoring, summary)",
        description=(
            "For each adapter, and for the base model (the reference row, '(base)'; --no-base skips it): load it, "
            "score every expected answer and choice of the prompt set by log-likelihood in one batch (providers "
            "that can score), generate every prompt (at most --concurrency requests at once; --score-only skips "
            "generating), unload it. One JSONL row per (adapter, prompt) is written to --output as it finishes; "
            "running the same command again resumes (pairs already in the file are skipped). A results file holds "
            "one experiment: rows are reused only for the same adapter files and prompt text, and a file written "
            "with other settings (model, --max-tokens, --temperature, scorer, --score-only...) is refused. An "
            "adapter that cannot be loaded gets one row per prompt with the load error, and the run goes on. At "
            "the end a per-adapter table (score, nll/token, acc, latency, tokens/s, errors; each figure's "
            "difference from the base model in brackets; the best adapter per figure) is printed, written as CSV "
            "next to the output (results.jsonl -> results.summary.csv) and drawn as a PNG beside it "
            "(results.summary.png, with the plot extra). A progress bar is drawn on stderr when it is a terminal."
        ),
        epilog=(
            "prompt set (JSONL, one object per line):\n"
            '  {"id": "q1", "prompt": "2+2=", "expected": "4"}\n'
            '  {"id": "q2", "prompt": "Capital of France?", "system_prompt": "One word.", "expected": "Paris"}\n'
            "examples:\n"
            "  inference eval --adapters 'runs/*/adapter' --prompts prompts.jsonl --output results.jsonl \\\n"
            "      --provider llamacpp --model-path base.gguf --max-tokens 64 --temperature 0 --score exact\n"
            "  inference eval --adapters a1 a2 --prompts p.jsonl --output r.jsonl --provider vllm \\\n"
            "      --base-url http://gpu:8100/v1 --model Qwen/Qwen2.5-0.5B --score regex --concurrency 16\n"
            "  inference eval ... --score mypkg.scoring:f1    # f1(output, expected, row) -> float | bool\n"
            "  inference eval --adapters 'runs/*/adapter' --prompts mc.jsonl --output nll.jsonl --score-only \\\n"
            "      --provider transformers --model-path google/gemma-3-270m --sort acc   # likelihoods only\n"
            "exit status: 0 when the run finished (rows may carry errors: see the errors column), 1 when the run\n"
            "could not start (the output holds rows of other settings included) or every row failed, 2 usage\n"
            "error. --json prints the summary as one JSON object."
        ),
    )
    command.add_argument(
        "--adapters",
        required=True,
        nargs="+",
        action="extend",
        metavar="PATH_OR_GLOB",
        help=(
            "adapter directories, GGUF LoRA files or globs (quote them); repeatable. The id is the name, with "
            "parent folders prefixed when the output file already uses it for another adapter"
        ),
    )
    command.add_argument("--prompts", required=True, type=Path, metavar="FILE", help="the prompt set (JSONL)")
    command.add_argument(
        "--output", required=True, type=Path, metavar="FILE", help="results JSONL (resumed if present)"
    )
    command.add_argument(
        "--concurrency", type=int, default=4, metavar="N", help="requests in flight per adapter (default: 4)"
    )
    command.add_argument(
        "--adapters-in-flight",
        type=int,
        default=1,
        metavar="N",
        help="adapters evaluated at once (default: 1); faster where the provider batches different adapters "
        "together (transformers, vllm, vllm-offline)",
    )
    command.add_argument(
        "--score", metavar="exact|regex|pkg.mod:func", help="score each row: exact match, regex search, or a function"
    )
    modes = command.add_mutually_exclusive_group()
    modes.add_argument(
        "--score-only",
        dest="mode",
        action="store_const",
        const="score",
        help="only score the expected answers and choices by log-likelihood (nll/token, acc): no generation, so "
        "no --score and no generation options; every prompt needs 'expected' or 'choices'. The default when no "
        "--score is given and every prompt has 'choices'",
    )
    modes.add_argument(
        "--generate",
        dest="mode",
        action="store_const",
        const="generate",
        help="generate every prompt even when every prompt has 'choices' and no --score is given",
    )
    command.add_argument(
        "--no-base",
        dest="base",
        action="store_false",
        help="leave out the base model's reference row (it costs one adapter's worth of requests, once per output)",
    )
    command.add_argument(
        "--sort",
        metavar="FIGURE",
        help="sort the table best first by score, nll_per_token, acc, acc_norm, mean_latency_s or tokens_per_s "
        "(nll_per_token and mean_latency_s: lower is better; the others: higher)",
    )
    plots = command.add_mutually_exclusive_group()
    plots.add_argument(
        "--plot",
        dest="plot",
        action="store_true",
        default=None,
        help="draw the figures per adapter as results.summary.png (default: when matplotlib is installed; with "
        "--plot it must be: pip install 'inference-adapters[plot]')",
    )
    plots.add_argument("--no-plot", dest="plot", action="store_false", help="draw no plot")
    command.add_argument("--json", action="store_true", help="print the summary as JSON for scripts")
    command.add_argument("--no-progress", action="store_true", help="never draw the progress bar")
    _add_generation_options(
        command, notes={"max_tokens": "default: 256", "system_prompt": "for the prompts that have none"}
    )
    _add_provider_options(command)
    command.set_defaults(handler=_eval, mode="auto")


def _eval(args: argparse.Namespace) -> int:
    from inference.evaluation import METRICS, TerminalProgress, evaluate_adapters, summary_csv_path, summary_plot_path
    from inference.evaluation.plot import PLOT_EXTRA, can_plot
    from inference.evaluation.rows import check_file_path

    check_file_path(args.output)  # --output /dev/stdout | cat would hang reading its own pipe: refused first
    check_file_path(summary_csv_path(args.output), "summary file")
    if args.plot is not False:
        check_file_path(summary_plot_path(args.output), "plot file")
    if args.plot and not can_plot():  # asked for: say so before the run, not after it
        raise MissingDependencyError(
            f"--plot needs matplotlib, which is not installed: run pip install 'inference-adapters[{PLOT_EXTRA}]', "
            "or leave --plot out"
        )
    if args.sort is not None and args.sort not in METRICS:
        raise _UsageError(f"--sort {args.sort!r}: use one of {', '.join(METRICS)}")
    if args.mode == "score" and args.score:
        raise _UsageError(
            "--score judges generated text, and --score-only generates none: drop one of them (the log-likelihood "
            "figures need no --score)"
        )
    if args.concurrency < 1:
        raise _UsageError(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.adapters_in_flight < 1:
        raise _UsageError(f"--adapters-in-flight must be at least 1, got {args.adapters_in_flight}")
    if args.score and ":" not in args.score and args.score not in ("exact", "regex"):
        raise _UsageError(f"--score {args.score!r}: use exact, regex or an import path pkg.module:function")
    if os.getcwd() not in sys.path and "" not in sys.path:  # let --score find the user's own modules
        sys.path.insert(0, os.getcwd())
    config = _step_config(args, generation_keys=True)
    progress = TerminalProgress(sys.stderr, enabled=False if args.no_progress else None)
    try:
        summary = _run_async(
            lambda: evaluate_adapters(
                args.adapters,
                args.prompts,
                config,
                args.output,
                max_concurrency=args.concurrency,
                scorer=args.score,
                on_progress=progress,
                adapters_in_flight=args.adapters_in_flight,
                mode=args.mode,
                base=args.base,
            )
        )
    finally:
        progress.close()
    plot, plot_note = _eval_plot(summary, args.plot, can_plot(), PLOT_EXTRA)
    if args.json:
        _print_json({**summary.to_dict(), "plot_path": None if plot is None else str(plot)})
    else:
        print(summary.format_table(sort_by=args.sort))
        drawn = f"  plot: {plot}" if plot is not None else ""
        print(
            f"\nresults: {summary.output}  summary: {summary.csv_path}{drawn}  "
            f"({summary.rows_written} rows written, {summary.rows_resumed} resumed)"
        )
        print(_eval_times(summary.timings(), summary.elapsed_s))
    if plot_note:
        print(f"inference: {plot_note}", file=sys.stderr)
    everyone = [*([summary.base] if summary.base is not None else []), *summary.adapters]
    rows = sum(adapter.rows for adapter in everyone)
    if rows and summary.errors == rows:
        first = next(adapter for adapter in everyone if adapter.errors)
        detail = first.load_error or "see the error field of the rows"
        print(f"inference: error: every row failed (first adapter {first.adapter_id}: {detail})", file=sys.stderr)
        return 1
    if summary.errors:
        print(f"inference: {summary.errors} of {rows} rows have errors (see {summary.output})", file=sys.stderr)
    return 0


def _eval_plot(summary: Any, asked: bool | None, available: bool, extra: str) -> tuple[Path | None, str | None]:
    """Draw the summary's plot where asked (``--plot``) or by default where matplotlib is installed: its path, and a
    note for stderr when none was drawn although it could have been wanted."""
    if asked is False:
        return None, None
    if not available:
        return None, (
            f"no plot drawn: matplotlib is not installed (pip install 'inference-adapters[{extra}]'; --no-plot "
            "skips this note)"
        )
    try:
        return summary.write_plot(), None
    except InferenceError as error:  # the run's results stand; the plot is extra
        nothing_to_draw = isinstance(error, InvalidRequestError)  # no score, nll/token or acc in any adapter
        return None, f"no plot drawn: {error}" if asked or not nothing_to_draw else None


def _eval_times(timings: dict[str, float], elapsed_s: float) -> str:
    """``time: scoring 3.2 s, generating 40.1 s, loading 1.2 s, unloading 0.3 s (this run: 45.0 s)``."""
    names = (("score_s", "scoring"), ("generate_s", "generating"), ("load_s", "loading"), ("unload_s", "unloading"))
    parts = [f"{label} {timings[key]:.1f} s" for key, label in names if timings.get(key)]
    return f"time: {', '.join(parts) or 'nothing to do'} (this run: {elapsed_s:.1f} s)"


# providers ---------------------------------------------------------------------------------------------------


def _add_providers(subcommands: _Subcommands[argparse.ArgumentParser]) -> None:
    command = _parser(
        subcommands,
        "providers",
        help="show which providers are installed and whether their servers answer",
        description=(
            "For each provider: whether the Python packages of its extra are installed (checked without importing "
            f"them), and for the servers ({', '.join(SERVER_PROVIDERS)}) whether the configured URL answers; for the "
            "in-process providers, the configured model. A server URL that is neither given nor set in the "
            "environment is checked only when it is on this machine (no remote host is contacted unasked). "
            "Always exits 0 when it could check; read the table or --json."
        ),
        epilog=(
            "examples:\n"
            "  inference providers\n"
            "  inference providers --vllm-url http://gpu:8100/v1 --timeout 5 --json\n"
            "URLs come from --vllm-url / --ollama-url..., else VLLM_BASE_URL / OLLAMA_BASE_URL..., else the defaults."
        ),
    )
    for name in SERVER_PROVIDERS:
        command.add_argument(f"--{name}-url", metavar="URL", help=f"{name} base URL to check")
    command.add_argument("--timeout", type=float, default=2.0, metavar="S", help="seconds per URL check (default: 2)")
    command.add_argument("--json", action="store_true", help="print JSON for scripts")
    command.set_defaults(handler=_providers)


def _providers(args: argparse.Namespace) -> int:
    urls = {name: getattr(args, f"{name.replace('-', '_')}_url") for name in SERVER_PROVIDERS}
    reports = [_provider_report(name, urls.get(name)) for name in PROVIDER_REGISTRY]
    checks = {report["name"]: report["base_url"] for report in reports if report["base_url"]}
    reachability = asyncio.run(_check_urls(checks, args.timeout)) if checks else {}
    for report in reports:
        if report["name"] in reachability:
            report["reachable"], report["detail"] = reachability[report["name"]]
        if report["base_url"]:
            report["base_url"] = redact_url(report["base_url"])  # shown: credentials in the URL hidden
    if args.json:
        _print_json({"providers": reports})
        return 0
    for report in reports:
        state = "installed" if report["installed"] else f"missing {', '.join(report['missing'])}"
        if not report["installed"] and report["extra"]:
            state += f" (pip install 'inference-adapters[{report['extra']}]')"
        line = f"{report['name']:<13} {state}"
        if report["base_url"]:
            line += f"; {report['base_url']} " + ("reachable" if report["reachable"] else "unreachable")
        if report["detail"]:
            line += f" ({report['detail']})"
        print(line)
    return 0


def _provider_report(name: str, url: str | None) -> dict[str, Any]:
    missing = [package for package in PROVIDER_PACKAGES.get(name, ()) if not _installed(package)]
    report: dict[str, Any] = {
        "name": name,
        "installed": not missing,
        "missing": missing,
        "extra": PROVIDER_EXTRAS.get(name),
        "server": name in SERVER_PROVIDERS,
        "base_url": None,
        "reachable": None,
        "detail": None,
    }
    try:
        settings = resolve_settings(name, {"base_url": url} if url else {})
    except ConfigurationError as error:
        report["detail"] = str(error)
        return report
    spec = PROVIDERS.get(name)
    if spec is None:
        return report
    if spec.server:
        report["base_url"] = settings["base_url"]
        base_url_setting = next(setting for setting in spec.settings if setting.key == "base_url")
        configured = settings_environment().get(base_url_setting.env_var)  # the process's, else the .env file's
        if not url and not configured and not _on_this_machine(settings["base_url"]):
            report["base_url"] = None  # a remote default (https://api.openai.com/v1): not contacted unasked
            report["detail"] = (
                f"not checked: the default {redact_url(settings['base_url'])} is remote; give --{name}-url or set "
                f"{base_url_setting.env_var}"
            )
    elif spec.model_setting:
        variable = next(setting.env_var for setting in spec.settings if setting.key == spec.model_setting)
        report["detail"] = _model_detail(settings.get(spec.model_setting), variable)
    return report


def _on_this_machine(base_url: str) -> bool:
    from urllib.parse import urlsplit

    hosts = {urlsplit(url).hostname for url in base_url.split(",") if url}
    return hosts <= {"localhost", "127.0.0.1", "::1"}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _model_detail(model: str | None, variable: str) -> str:
    if not model:
        return f"no model configured (set {variable})"
    return f"model {model}" + ("" if Path(model).exists() else " (not found on this machine)")


async def _check_urls(urls: dict[str, str], timeout: float) -> dict[str, tuple[bool, str | None]]:
    try:
        import httpx

        from inference._servers.http import api_base, base_url_query
    except ImportError:
        return {name: (False, "cannot check: httpx is not installed") for name in urls}

    async def check(client: httpx.AsyncClient, base_url: str) -> tuple[bool, str | None]:
        urls, answered, notes = base_url.split(","), 0, []
        for url in urls:
            try:
                response = await client.get(f"{api_base(url)}/models", params=base_url_query(url))
            except httpx.HTTPError as error:
                notes.append(f"{redact_url(url)}: {type(error).__name__}")
                continue
            answered += 1
            if response.status_code >= 400:  # something answers: reachable, but say what it said
                notes.append(f"{redact_url(url)}: answered HTTP {response.status_code}")
        if 0 < answered < len(urls):  # some replicas answer: reachable, but not the whole fleet
            notes.insert(0, f"degraded: {answered} of {len(urls)} replicas answer")
        return answered > 0, "; ".join(notes) or None

    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:  # no proxy, as the providers
        answers = await asyncio.gather(*(check(client, url) for url in urls.values()))
    return dict(zip(urls, answers, strict=True))

# lm-eval ---------------------------------------------------------------------------------------------------


def _add_lm_eval(subcommands: _Subcommands[argparse.ArgumentParser]) -> None:
    command = _parser(
        subcommands,
        "lm-eval",
        help="run lm-eval-harness with this SDK's model 'inference' registered",
        description=(
            "Run lm-eval-harness's command line with the model 'inference' registered: --model inference "
            "--model_args provider=TYPE,SETTING=VALUE,...[,adapter=PATH]. Every argument after lm-eval is "
            "lm-eval's own. Needs the lm-eval extra: pip install 'inference-adapters[lm-eval]'."
        ),
        epilog=(
            "example:\n"
            "  inference lm-eval --model inference \\\n"
            "      --model_args provider=llamacpp,model_path=base.gguf,adapter=adapters/math --tasks arc_easy"
        ),
    )
    command.add_argument("lm_eval_args", nargs=argparse.REMAINDER, metavar="ARGS", help="lm-eval's arguments")
    command.set_defaults(handler=_lm_eval)


def _lm_eval(args: argparse.Namespace) -> int:
    from inference._core.dependencies import import_optional

    integration = import_optional("inference.integrations.lm_eval", provider="lm-eval", extra="lm-eval")
    status: int = integration.main(list(args.lm_eval_args))
    return status


if __name__ == "__main__":
    sys.exit(main())
