"""The ``inference`` command line.

Each subcommand is one small function that takes the parsed arguments and returns the exit status;
:func:`build_parser` wires them up, so adding a subcommand is adding a ``_add_<name>`` and a handler.

Exit status: 0 on success, 1 when the SDK refuses or fails (the sentence goes to stderr), 2 for usage errors.

Example:
    $ inference convert-adapter adapters/support --base models/qwen2.5-0.5b.gguf -o adapters/support.gguf
    adapters/support.gguf
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from inference import __version__
from inference.exceptions import InferenceError

__all__ = ["build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``inference`` command, with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="inference",
        description="Tools of the inference-adapters SDK (async inference with a LoRA adapter lifecycle).",
        epilog=(
            "Run 'inference COMMAND --help' for a command's options.\n"
            "Exit status: 0 success, 1 the SDK refused or failed (reason on stderr), 2 usage error."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subcommands = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_convert_adapter(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``inference`` command line.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        The exit status: 0 success, 1 refused or failed (message on stderr), 2 usage error.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # --help, --version, usage errors: argparse already printed
        code = exit_request.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return handler(args)
    except InferenceError as error:
        print(f"inference: error: {error}", file=sys.stderr)
        return 1


def _add_convert_adapter(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = subcommands.add_parser(
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
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    command.add_argument("peft_dir", metavar="PEFT_DIR", type=Path, help="the PEFT LoRA adapter directory")
    command.add_argument("--base", required=True, type=Path, metavar="MODEL.gguf", help="the base model's GGUF file")
    command.add_argument(
        "-o", "--output", required=True, type=Path, metavar="OUT.gguf", help="the GGUF LoRA file to write"
    )
    command.set_defaults(handler=_convert_adapter)


def _convert_adapter(args: argparse.Namespace) -> int:
    from inference.gguf_conversion import convert_peft_to_gguf

    output = convert_peft_to_gguf(args.peft_dir, args.base, args.output)
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
