"""The command line's grammar: every command, its arguments, their help and examples (the handlers are in the
command modules: ``generate``, ``score``, ``adapters``, ``evaluation``, ``providers``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inference import __version__
from inference.cli.adapters import _adapters_list, _adapters_load, _adapters_unload, _convert_adapter, _missing_action
from inference.cli.evaluation import _eval, _lm_eval
from inference.cli.generate import _generate
from inference.cli.health import add_health
from inference.cli.logs import add_log_options
from inference.cli.options import _MODEL_SETTINGS, SERVER_PROVIDERS
from inference.cli.providers import _providers
from inference.cli.running import _UsageError
from inference.cli.score import _score
from inference.exceptions import InferenceError
from inference.options import OPTIONS
from inference.registry import PROVIDER_REGISTRY

__all__ = ["build_parser"]

_Subcommands = argparse._SubParsersAction  # argparse gives the type no public name


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


def seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds (``nan``, ``inf``, ``0`` and below are usage errors)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


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


def _add_adapter_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--adapter", metavar="ID_OR_PATH", help="a loaded adapter id, or an adapter path to load")


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
            "--logprobs, then a table: token, logprob, alternatives); with --n N above 1, each choice after a\n"
            "'--- choice I of N' line; with --json one object {text, model, adapter_id, finish_reason,\n"
            "prompt_tokens, completion_tokens, token_count, latency_s, logprobs, reasoning, tool_calls,\n"
            "token_ids, choices}; with --stream --json one line\n"
            '{"type": "text", "text": ...} per piece, then {"type": "result", ...}.'
        ),
    )
    command.add_argument("prompt", metavar="PROMPT", nargs="?", help="the user's text (or give --messages)")
    command.add_argument(
        "--messages",
        metavar="FILE",
        help='a conversation as the prompt: a JSON list of {"role": "system"|"user"|"assistant", "content": ...}',
    )
    _add_adapter_option(command)
    command.add_argument("--stream", action="store_true", help="print the text as it is generated")
    command.add_argument("--json", action="store_true", help="print JSON for scripts")
    _add_generation_options(command, notes={"max_tokens": "default: 256"})
    _add_provider_options(command)
    command.set_defaults(handler=_generate)


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
    _add_adapter_option(command)
    command.add_argument("--model", metavar="NAME", help="model name on the server (in-process providers ignore it)")
    command.add_argument("--json", action="store_true", help="print JSON for scripts")
    _add_provider_options(command)
    command.set_defaults(handler=_score)


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
    command.add_argument("--timeout", type=seconds, default=2.0, metavar="S", help="seconds per URL check (default: 2)")
    command.add_argument("--json", action="store_true", help="print JSON for scripts")
    command.set_defaults(handler=_providers)


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
