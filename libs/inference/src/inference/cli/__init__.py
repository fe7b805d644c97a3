"""The ``inference`` command line.

Each subcommand is an ``_add_<name>`` in ``parser`` (the whole grammar: arguments, help, examples) and a handler
in its command module (``generate``, ``score``, ``adapters``, ``evaluation``, ``providers``) that takes the parsed
arguments and returns the exit status; :func:`build_parser` wires them up. What the parsed options mean (the step
config, ``--adapter``) is in ``options``; how a command runs (its event loop, stdout, one-line errors, the exit
status) in ``running``.

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
import sys
from collections.abc import Callable, Sequence

from inference.cli.evaluation import _lm_eval
from inference.cli.logs import command_logging
from inference.cli.options import SERVER_PROVIDERS as SERVER_PROVIDERS
from inference.cli.parser import build_parser
from inference.cli.providers import PROVIDER_PACKAGES
from inference.cli.running import (
    _drop_stdout,
    _os_error_sentence,
    _print_error,
    _StandardOutput,
    _stdout_closed,
    _UsageError,
)
from inference.exceptions import ConfigurationError, InferenceError

__all__ = ["PROVIDER_PACKAGES", "build_parser", "main"]

Handler = Callable[[argparse.Namespace], int]


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
    except ConfigurationError as error:  # INFERENCE_LOG_LEVEL or INFERENCE_LOG_FORMAT (a .env unread: the command's)
        report: Callable[[argparse.Namespace, Exception], int] | None = getattr(args, "configuration_failed", None)
        if report is not None:  # health reports it as its answer (with --json, the object)
            return report(args, error)
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
