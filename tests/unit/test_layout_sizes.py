"""The package stays in parts (issue 27): no module over 700 lines, no provider class over 450.

A provider that grows past its limit should be split by concern into parts under ``_core/``, ``_servers/`` or
``_inprocess/`` (see ``docs/architecture.md``), not exempted here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import inference

PACKAGE = Path(inference.__file__).parent
MODULE_LINES = 700
PROVIDER_CLASS_LINES = 450


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_over_700_lines() -> None:
    sizes = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in _modules()}
    assert len(sizes) > 100  # the whole package was read
    assert {name: size for name, size in sizes.items() if size > MODULE_LINES} == {}


def test_no_provider_class_is_over_450_lines() -> None:
    providers: dict[str, int] = {}
    for path in _modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name.endswith("Provider"):
                assert node.end_lineno is not None
                providers[node.name] = node.end_lineno - node.lineno + 1
    assert {"TransformersProvider", "VLLMProvider", "LlamaCppProvider", "VLLMOfflineProvider"} <= set(providers)
    assert {name: size for name, size in providers.items() if size > PROVIDER_CLASS_LINES} == {}


def test_the_architecture_map_names_every_module_of_the_layers_it_draws() -> None:
    """``docs/architecture.md`` draws the package file by file, but for the command line, the evaluation runner,
    the integrations and the testing helpers, which it describes in a sentence each."""
    text = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    described = {"cli", "evaluation", "integrations", "testing"}
    missing = [
        str(path.relative_to(PACKAGE))
        for path in _modules()
        if path.name != "__init__.py" and path.relative_to(PACKAGE).parts[0] not in described
        and f"{path.name} " not in text
    ]
    assert missing == []
