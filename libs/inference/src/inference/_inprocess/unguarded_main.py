"""Processes spawned from a script that has no ``if __name__ == "__main__":`` guard.

Python's ``spawn`` start method runs the parent's main module again in the child (as ``__mp_main__``), so that what
it defines can be unpickled there. A script that does its work at top level, unguarded, then does it again in the
child: it builds a provider and starts an engine during the child's bootstrapping, which Python refuses, and the
child dies (vLLM's CPU build always spawns its engine core). :func:`spawning_without_unguarded_main` leaves the
main module out of what a process spawned by this thread runs first, when that module is a script without the
guard: the child starts as it does under ``python -c`` or in a notebook. A guarded script is left as it is.

Example:
    >>> with spawning_without_unguarded_main():  # doctest: +SKIP
    ...     engine = start_an_engine_that_spawns()
"""

from __future__ import annotations

import ast
import multiprocessing.spawn
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["main_module_is_unguarded", "spawning_without_unguarded_main"]

_this_thread = threading.local()
_install_lock = threading.Lock()
_installed = False


@contextmanager
def spawning_without_unguarded_main() -> Iterator[None]:
    """Within this block, processes this thread spawns do not run an unguarded main script again.

    Other threads' processes, and every process when the main module is guarded (or is no script), spawn as usual.
    """
    if not main_module_is_unguarded():
        yield
        return
    _install()
    _this_thread.active = True
    try:
        yield
    finally:
        _this_thread.active = False


def main_module_is_unguarded() -> bool:
    """True when ``spawn`` would run the main module again and that module has no top-level
    ``if __name__ == "__main__":`` (its source is read; one that cannot be read or parsed counts as guarded)."""
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__")):
        return False  # `python -m package`: spawn does not run it again
    path = getattr(main, "__file__", None)
    if not path:
        return False  # python -c, a REPL, a notebook: nothing runs again
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    return not any(isinstance(node, ast.If) and _is_main_test(node.test) for node in tree.body)


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides) and any(
        isinstance(side, ast.Constant) and side.value == "__main__" for side in sides
    )


def _install() -> None:
    """Wrap ``multiprocessing.spawn.get_preparation_data`` once: unchanged, except in a thread inside the block."""
    global _installed
    with _install_lock:
        if _installed:
            return
        original = multiprocessing.spawn.get_preparation_data

        def get_preparation_data(name: str) -> dict[str, Any]:
            data: dict[str, Any] = original(name)
            if getattr(_this_thread, "active", False):
                data.pop("init_main_from_path", None)
                data.pop("init_main_from_name", None)
            return data

        multiprocessing.spawn.get_preparation_data = get_preparation_data
        _installed = True
