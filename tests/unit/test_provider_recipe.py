"""The "add a provider" recipe of docs/architecture.md works as written.

The test copies the package, writes the recipe's module and adds the recipe's registry entry exactly as the page
shows them (its two code blocks), then checks, in a fresh interpreter on that copy, what the page promises: the
factory, step configs, ``inference.EchoProvider``, settings from the environment, the command line, the option
check, adapters and ``.env.example``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "libs" / "inference" / "src" / "inference"


def _recipe_blocks() -> tuple[str, str]:
    """The module and the registry entry of the recipe (its first two Python blocks)."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    recipe = page[page.index("## Adding a provider") :]
    blocks = [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", recipe, flags=re.S)]
    assert len(blocks) >= 2, "the recipe shows a module and a registry entry"
    return blocks[0], blocks[1]


def _copy_with_the_recipe(tmp_path: Path) -> Path:
    module, entry = _recipe_blocks()
    src = tmp_path / "src"
    shutil.copytree(PACKAGE, src / "inference", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "inference" / "echo_provider.py").write_text(module, encoding="utf-8")
    registry = src / "inference" / "registry.py"
    text = registry.read_text(encoding="utf-8")
    end = text.index("\n)\n\nPROVIDERS")  # the end of the _SPECS tuple
    registry.write_text(text[:end] + "\n" + textwrap.indent(entry.rstrip(), "    ") + text[end:], encoding="utf-8")
    return src


def _run(src: Path, code: str, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src), **environment}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_a_provider_added_as_the_recipe_says_is_picked_up_everywhere(tmp_path: Path) -> None:
    src = _copy_with_the_recipe(tmp_path)
    done = _run(
        src,
        """
        import asyncio, json
        import inference
        from inference import UnsupportedOperationError, get_provider, get_provider_for_step
        from inference.config import render_env_example
        from inference.options import GenerationOptions

        async def main():
            provider = get_provider("echo")
            assert type(provider) is inference.EchoProvider
            assert get_provider_for_step({"provider": "echo"}) is provider
            assert set(provider.options) == set(GenerationOptions.names())  # every option declared
            first = await provider.generate("hello there world", model="m", max_tokens=2)
            await provider.load_adapter("style", "/adapters/style")
            styled = await provider.generate("hi", model="m", adapter_id="style")
            try:
                await provider.generate("hi", model="m", temperature=0.5)
            except UnsupportedOperationError as error:
                refused = str(error)
            else:
                refused = None
            other = get_provider_for_step({"provider": "echo", "prefix": "> "})
            second = await other.generate("hi", model="m")
            return {
                "first": first.text, "styled": styled.text, "refused": refused, "second": second.text,
                "adapters": await provider.list_adapters(), "env": "ECHO_PREFIX" in render_env_example(),
            }

        print(json.dumps(asyncio.run(main())))
        """,
        ECHO_PREFIX="env: ",
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["first"] == "env: hello there"  # the setting came from its environment variable
    assert seen["styled"] == "[style] env: hi"
    assert seen["second"] == "> hi"  # a step config's setting wins over the environment
    assert seen["adapters"] == ["style"] and seen["env"] is True
    assert "EchoProvider cannot honour the option temperature (an echo samples nothing)" in seen["refused"]


def test_the_command_line_knows_the_recipe_s_provider(tmp_path: Path) -> None:
    src = _copy_with_the_recipe(tmp_path)
    done = _run(src, "from inference.cli import main; raise SystemExit(main(['providers', '--json']))")
    assert done.returncode == 0, done.stderr
    assert "echo" in {entry["name"] for entry in json.loads(done.stdout)["providers"]}
    done = _run(
        src,
        "from inference.cli import main; "
        "raise SystemExit(main(['generate', 'one two three', '--provider', 'echo', '--set', 'prefix=>> ', "
        "'--max-tokens', '2']))",
    )
    assert done.returncode == 0, done.stderr
    assert ">> one two" in done.stdout
