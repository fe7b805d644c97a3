"""Each provider's pip extra installs exactly what the provider's code imports; nothing is installed to check.

The imports are read from the source: starting at the provider class (its ``target`` in the registry), the walk
collects the third-party modules imported by the code it can reach: the class, the module-level code of every
module on the way, and the functions and classes named by ``from inference.x import name`` (also inside
functions, as the lazy imports are), with what they use of their own module. ``import_optional("x", ...)``
counts as an import of ``x``; imports guarded by ``except ImportError`` are optional and do not count.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
import tomllib

from inference.registry import PROVIDERS, ProviderSpec

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = ROOT / "libs" / "inference" / "src"

DISTRIBUTIONS = {"llama_cpp": "llama-cpp-python", "dotenv": "python-dotenv"}
"""Import name -> distribution name, where they differ (otherwise the same, ``_`` written ``-``)."""

NEEDED_AT_RUN_TIME = {
    "transformers": {
        "accelerate": "transformers needs it to place weights (device_map) and to load GGUF files",
        "gguf": "transformers reads .gguf model files with it (from_pretrained(..., gguf_file=...))",
    },
}
"""Requirements a provider needs without importing them itself, and why."""

NOT_IN_ALL = {
    "vllm-offline": "vLLM pins its own torch and transformers (and a GPU build is several GB): it goes in a venv "
    "of its own, not beside the other backends",
}
"""Provider extras that ``all`` leaves out, and why."""

Unit = tuple[str, str | None]
"""A module and one of its top-level names (``None``: the module-level code)."""


@cache
def _tree(module: str) -> ast.Module | None:
    base = PACKAGE_ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return ast.parse(path.read_text(encoding="utf-8"))
    return None


def _top_level(tree: ast.Module) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
    return names


def _guarded(tree: ast.AST) -> set[int]:
    """Ids of the nodes inside ``try:`` bodies that catch ImportError (optional imports)."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            caught = {ast.unparse(handler.type) for handler in node.handlers if handler.type is not None}
            if any(re.search(r"\b(ImportError|ModuleNotFoundError)\b", text) for text in caught):
                guarded |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    return guarded


def _importer_wrappers(tree: ast.Module) -> set[str]:
    """Top-level functions that pass their first parameter to ``import_optional`` (``_import("torch")``)."""
    wrappers = set()
    for name, node in _top_level(tree).items():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.args.args:
            parameter = node.args.args[0].arg
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and _called_name(call) == "import_optional"
                    and call.args
                    and isinstance(call.args[0], ast.Name)
                    and call.args[0].id == parameter
                ):
                    wrappers.add(name)
    return wrappers


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def _unit_nodes(tree: ast.Module, name: str | None) -> Iterator[ast.AST]:
    """The nodes a unit runs: a definition's whole body, or the module-level code without function bodies."""
    if name is not None:
        yield from ast.walk(_top_level(tree)[name])
        return
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            pending.extend(node.orelse)  # imports for type checkers never run
            continue
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


@cache
def _facts(module: str) -> tuple[ast.Module, dict[str, ast.AST], set[int], set[str]]:
    tree = _tree(module)
    assert tree is not None, f"no source for {module}"
    return tree, _top_level(tree), _guarded(tree), _importer_wrappers(tree)


def third_party_imports(target: str) -> set[str]:
    """The top-level names of the third-party modules the code reachable from ``module:Class`` imports."""
    module, _, class_name = target.partition(":")
    stdlib = set(sys.stdlib_module_names)
    found: set[str] = set()
    seen: set[Unit] = set()
    pending: list[Unit] = [(module, None), (module, class_name)]
    while pending:
        unit = pending.pop()
        if unit in seen:
            continue
        seen.add(unit)
        current, name = unit
        # importing inference.a.b runs inference/__init__.py and inference/a/__init__.py first
        parts = current.split(".")
        pending += [(".".join(parts[:index]), None) for index in range(1, len(parts))]
        tree, defined, guarded, wrappers = _facts(current)
        for node in _unit_nodes(tree, name):
            if isinstance(node, ast.Name) and node.id in defined and (current, node.id) != unit:
                pending.append((current, node.id))
            if id(node) in guarded:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "inference":
                        pending.append((alias.name, None))
                    else:
                        found.add(alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                assert not node.level, f"{current} uses a relative import; the walk reads absolute ones"
                source = node.module or ""
                if source.split(".")[0] != "inference":
                    found.add(source.split(".")[0])
                    continue
                pending.append((source, None))
                for alias in node.names:
                    submodule, source_tree = _tree(f"{source}.{alias.name}"), _tree(source)
                    if submodule is not None:  # a whole module: all of it may be used
                        pending.append((f"{source}.{alias.name}", None))
                        pending += [(f"{source}.{alias.name}", defined_name) for defined_name in _top_level(submodule)]
                    elif source_tree is not None and alias.name in _top_level(source_tree):
                        pending.append((source, alias.name))
            elif (
                isinstance(node, ast.Call)
                and (_called_name(node) == "import_optional" or _called_name(node) in wrappers)
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                imported = node.args[0].value.split(".")[0]
                if imported != "inference":
                    found.add(imported)
    return {name for name in found - stdlib if name != "__future__"}


def _requirements(extra: str | None) -> set[str]:
    """The distributions an extra lists; ``None``: the package's own dependencies (installed with every extra)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    listed = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return {re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower() for requirement in listed}


CORE = _requirements(None)
"""What ``pip install inference-adapters`` installs, for every provider."""


def _distribution(import_name: str) -> str:
    return DISTRIBUTIONS.get(import_name, import_name.replace("_", "-")).lower()


SPECS = [spec for spec in PROVIDERS.values() if spec.extra is not None]


@pytest.mark.parametrize("spec", SPECS, ids=[spec.name for spec in SPECS])
def test_each_extra_installs_what_its_provider_imports(spec: ProviderSpec) -> None:
    assert spec.extra is not None
    imported = third_party_imports(spec.target)
    needed = {_distribution(name) for name in imported} - CORE | set(NEEDED_AT_RUN_TIME.get(spec.name, {}))
    listed = _requirements(spec.extra)
    assert not needed - listed, f"[{spec.extra}] lacks what {spec.target} imports: {sorted(needed - listed)}"
    assert not listed - needed, (
        f"[{spec.extra}] installs what {spec.target} never imports: {sorted(listed - needed)} (remove it, or "
        "say in NEEDED_AT_RUN_TIME why it is needed)"
    )
    own = {name for name in imported if _distribution(name) not in CORE}
    assert set(spec.packages) == own | set(NEEDED_AT_RUN_TIME.get(spec.name, {})), (
        f"ProviderSpec.packages of {spec.name} should list the import names {sorted(imported)}"
    )


def test_providers_without_an_extra_import_nothing_third_party() -> None:
    for spec in PROVIDERS.values():
        if spec.extra is None:
            assert {_distribution(name) for name in third_party_imports(spec.target)} <= CORE, spec.name


def test_the_walk_sees_lazy_and_optional_imports() -> None:
    # The Ollama provider imports gguf and numpy only inside functions, through two modules: the walk must
    # follow them; torch (only under ``except ImportError`` in adapters/gguf.py) is optional.
    found = third_party_imports("inference.ollama_provider:OllamaProvider")
    assert {"httpx", "gguf", "numpy"} <= found and "torch" not in found
    assert "huggingface_hub" not in third_party_imports("inference.vllm_provider:VLLMProvider")


def test_all_installs_every_provider_extra() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (everything,) = pyproject["project"]["optional-dependencies"]["all"]
    match = re.search(r"\[(.*)\]", everything)
    assert match is not None, everything
    extras = set(match.group(1).split(","))
    assert extras == {spec.extra for spec in PROVIDERS.values() if spec.extra} - set(NOT_IN_ALL)
