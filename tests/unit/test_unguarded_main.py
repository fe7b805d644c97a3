"""A process spawned from a script without ``if __name__ == "__main__":`` (``_inprocess/unguarded_main.py``).

vLLM's CPU build spawns its engine process; spawn runs the main script again in the child, and an unguarded script
then starts its work again there and dies. Here a stdlib process stands in for vLLM's engine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import multiprocessing
import time

from inference._inprocess.unguarded_main import spawning_without_unguarded_main

print("script ran")
with {block}:
    process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    process.start()
    process.join()
print("child exit code", process.exitcode)
"""


def run(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(text, encoding="utf-8")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          check=False)


def test_an_unguarded_script_spawns_without_running_again(tmp_path: Path) -> None:
    finished = run(tmp_path, SCRIPT.format(block="spawning_without_unguarded_main()"))
    assert finished.stdout.splitlines() == ["script ran", "child exit code 0"], finished.stderr
    assert "Traceback" not in finished.stderr


def test_without_the_block_the_child_runs_the_script_again_and_dies(tmp_path: Path) -> None:
    # What vLLM's engine did: the child re-ran the script, which tried to spawn during its bootstrapping.
    finished = run(tmp_path, SCRIPT.format(block="open(__file__)"))
    assert finished.stdout.count("script ran") == 2
    assert "bootstrapping phase" in finished.stderr


def test_a_guarded_script_spawns_as_usual(tmp_path: Path) -> None:
    guarded = (
        "from inference._inprocess.unguarded_main import main_module_is_unguarded, spawning_without_unguarded_main\n"
        "import multiprocessing.spawn\n"
        "if __name__ == '__main__':\n"
        "    with spawning_without_unguarded_main():\n"
        "        data = multiprocessing.spawn.get_preparation_data('x')\n"
        "        print(main_module_is_unguarded(), 'init_main_from_path' in data)\n"
    )
    assert run(tmp_path, guarded).stdout.split() == ["False", "True"]


@pytest.mark.parametrize(
    ("source", "unguarded"),
    [
        ("print(1)\n", True),
        ("if __name__ == '__main__':\n    print(1)\n", False),
        ("if '__main__' == __name__:\n    print(1)\n", False),
        ("def main():\n    if __name__ == '__main__':\n        print(1)\n", True),  # only a top-level guard counts
        ("if __name__ != '__main__':\n    print(1)\n", True),
        ("def (:\n", False),  # not Python: left as it is
    ],
)
def test_the_guard_is_read_from_the_main_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, unguarded: bool
) -> None:
    from inference._inprocess import unguarded_main

    path = tmp_path / "main.py"
    path.write_text(source, encoding="utf-8")
    main = type(sys)("__main__")
    main.__file__ = str(path)
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert unguarded_main.main_module_is_unguarded() is unguarded
