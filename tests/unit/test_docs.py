"""The documentation site builds cleanly and stays true to the code.

- ``mkdocs build --strict`` succeeds (broken links, missing pages and docstring warnings fail it);
- every page in the nav exists, and every public module has an API reference page;
- every environment variable the package reads is in the configuration page;
- the error tree on the errors page is the one in ``inference/exceptions.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from inference import exceptions
from inference.config import PROVIDER_ENV_VAR, SETTINGS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "libs" / "inference" / "src" / "inference"
MKDOCS_YML = ROOT / "mkdocs.yml"


def _nav_pages() -> list[str]:
    """The Markdown files named in mkdocs.yml's ``nav`` (everything after the ``nav:`` key)."""
    text = MKDOCS_YML.read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    return re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w./-]+\.md)\s*$", nav, flags=re.M)


def test_every_page_in_the_nav_exists() -> None:
    pages = _nav_pages()
    assert "index.md" in pages and "configuration.md" in pages, f"nav not parsed: {pages}"
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"pages in mkdocs.yml's nav that docs/ lacks: {missing}"


def test_every_docs_page_is_in_the_nav() -> None:
    pages = set(_nav_pages())
    orphans = sorted(
        str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md") if str(path.relative_to(DOCS)) not in pages
    )
    assert not orphans, f"pages a reader can only find by URL (add them to the nav in mkdocs.yml): {orphans}"


def _public_modules() -> list[str]:
    modules = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 1 and not any(part.startswith("_") for part in parts):
            modules.append(".".join(parts))
    return sorted(modules)


def test_every_public_module_has_an_api_reference_page() -> None:
    directives = {
        match
        for page in (DOCS / "reference").glob("*.md")
        for match in re.findall(r"^::: (inference[\w.]*)\s*$", page.read_text(encoding="utf-8"), flags=re.M)
    }
    # A package's page covers its submodules (``show_submodules``) or re-exports their API (``__all__``).
    missing = [
        module
        for module in _public_modules()
        if not any(module == directive or module.startswith(directive + ".") for directive in directives)
    ]
    assert not missing, f"public modules without a '::: module' directive in docs/reference/: {missing}"


def test_mkdocs_build_strict_succeeds(tmp_path: Path) -> None:
    for package in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            found = importlib.util.find_spec(package) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            pytest.skip(f"{package} is not installed (pip install the dev extra to build the docs)")
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(MKDOCS_YML)]
    completed = subprocess.run(
        [*command, "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, f"mkdocs build --strict failed:\n{completed.stdout}\n{completed.stderr}"
    # The API reference really rendered the docstrings, with Sphinx roles turned into links or code.
    provider_page = (site / "reference" / "provider" / "index.html").read_text(encoding="utf-8")
    assert 'id="inference.provider.InferenceProvider.generate"' in provider_page
    assert 'id="inference.provider.InferenceProvider.load_adapter"' in provider_page
    leftover = [
        str(page.relative_to(site))
        for page in (site / "reference").rglob("*.html")
        if re.search(r":(?:class|meth|func|mod|data|attr|exc):<code>", page.read_text(encoding="utf-8"))
    ]
    assert not leftover, f"Sphinx roles printed literally in: {leftover}"


# Environment variables --------------------------------------------------------------------------------------


def _module_string_constants(tree: ast.Module) -> dict[str, str]:
    constants = {}
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        value = getattr(node, "value", None)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            constants.update({target.id: value.value for target in targets if isinstance(target, ast.Name)})
    return constants


def _is_environ(node: ast.expr) -> bool:
    """``os.environ``, ``environ`` or a mapping parameter named ``environ`` (config's injectable environment)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def _environment_names_read(path: Path, constants: dict[str, str]) -> set[str]:
    """Names of the variables a module reads with a literal (or a module-level string constant) name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    local = {**constants, **_module_string_constants(tree)}

    def literal(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return local.get(node.id)
        return None

    names: set[str | None] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            function = node.func
            is_getenv = (isinstance(function, ast.Attribute) and function.attr in ("getenv", "getenvb")) or (
                isinstance(function, ast.Name) and function.id in ("getenv", "getenvb")
            )
            is_mapping_read = (
                isinstance(function, ast.Attribute)
                and function.attr in ("get", "pop", "setdefault")
                and _is_environ(function.value)
            )
            if is_getenv or is_mapping_read:
                names.add(literal(node.args[0]))
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            names.add(literal(node.slice))
        elif (
            isinstance(node, ast.Compare)
            and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
            and any(_is_environ(comparator) for comparator in node.comparators)
        ):
            names.add(literal(node.left))
    return {name for name in names if name}


def _environment_names_in_package() -> dict[str, set[str]]:
    sources = sorted(PACKAGE.rglob("*.py"))
    constants: dict[str, str] = {}
    for path in sources:  # names like CACHE_ENV_VAR may be imported from another module of the package
        constants.update(_module_string_constants(ast.parse(path.read_text(encoding="utf-8"))))
    found: dict[str, set[str]] = {}
    for path in sources:
        for name in _environment_names_read(path, constants):
            found.setdefault(name, set()).add(str(path.relative_to(PACKAGE)))
    return found


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    read = _environment_names_in_package()
    # The scan must see what is known to be read, or it proves nothing.
    assert PROVIDER_ENV_VAR in read, f"scan found: {sorted(read)}"
    assert "INFERENCE_TEST_MODELS_DIR" in read, f"scan found: {sorted(read)}"
    names = dict(read)
    for settings in SETTINGS.values():
        for setting in settings:
            names.setdefault(setting.env_var, set()).add("config.SETTINGS")
    docs = (DOCS / "configuration.md").read_text(encoding="utf-8")
    undocumented = {name: sorted(where) for name, where in names.items() if f"`{name}`" not in docs}
    assert not undocumented, (
        "environment variables read by the code but missing from docs/configuration.md "
        f"(add a Setting to inference/config.py, or list the variable under the table): {undocumented}"
    )


@pytest.mark.parametrize("provider", sorted(SETTINGS))
def test_each_provider_page_names_every_setting_of_its_provider_with_its_variable(provider: str) -> None:
    """A reader of one provider's page sees all its settings (a replica's ``replica_down_s``, an adapter cache), not
    only those its author thought of; ``docs/configuration.md`` has them all too."""
    page = (DOCS / "providers" / f"{provider}.md").read_text(encoding="utf-8")
    missing = [
        f"{setting.key} ({setting.env_var})"
        for setting in SETTINGS[provider]
        if f"`{setting.key}`" not in page or setting.env_var not in page
    ]
    assert not missing, f"docs/providers/{provider}.md does not name these settings with their variables: {missing}"


def test_environment_scan_sees_every_kind_of_read(tmp_path: Path) -> None:
    module = tmp_path / "reads.py"
    module.write_text(
        textwrap.dedent(
            """
            import os
            from os import environ, getenv
            NAME = "FROM_CONSTANT"
            a = os.environ.get("FROM_GET")
            b = os.environ["FROM_SUBSCRIPT"]
            c = os.getenv("FROM_GETENV")
            d = getenv(NAME)
            e = "FROM_IN" in os.environ
            f = environ.get(NAME + "_NOT_LITERAL")
            os.environ.setdefault("FROM_SETDEFAULT", "1")
            """
        ),
        encoding="utf-8",
    )
    assert _environment_names_read(module, {}) == {
        "FROM_CONSTANT",
        "FROM_GET",
        "FROM_SUBSCRIPT",
        "FROM_GETENV",
        "FROM_IN",
        "FROM_SETDEFAULT",
    }


# Errors -----------------------------------------------------------------------------------------------------


def test_error_tree_on_the_errors_page_is_the_one_in_the_code() -> None:
    docstring = exceptions.__doc__ or ""
    tree = textwrap.dedent(docstring[docstring.index("    InferenceError\n") :]).strip()
    page = (DOCS / "errors.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- error-tree[^>]*-->\n```text\n(.*?)\n```\n<!-- /error-tree -->", page, flags=re.S)
    assert block is not None, "docs/errors.md lost its error-tree block"
    assert block.group(1).strip() == tree, "docs/errors.md's error tree differs from inference/exceptions.py"
    for name in re.findall(r"^[│├└─ ]*(\w+)", tree, flags=re.M):
        assert hasattr(exceptions, name), f"the tree names {name}, which inference.exceptions lacks"


# Examples ---------------------------------------------------------------------------------------------------


def _python_examples() -> list[tuple[str, ast.Module]]:
    """Every ```python block of the documentation and the README, parsed (page and block number, tree)."""
    examples = []
    for page in [*sorted(DOCS.rglob("*.md")), ROOT / "README.md"]:
        text = page.read_text(encoding="utf-8")
        blocks = re.finditer(r"^([ \t]*)```(?:python|py)\n(.*?)^\1```", text, flags=re.M | re.S)
        for number, block in enumerate(blocks, start=1):
            where = f"{page.relative_to(ROOT)} block {number}"
            try:
                examples.append((where, ast.parse(textwrap.dedent(block.group(2)))))
            except SyntaxError as error:
                raise AssertionError(f"{where} is not Python: {error}") from error
    return examples


def test_a_message_list_kept_in_a_variable_is_annotated_for_type_checkers() -> None:
    """``messages = [{"role": ...}]`` infers ``list[dict[str, str]]``, which mypy refuses as a prompt and to which
    it refuses to append ``result.as_message()``: an example that keeps messages declares ``list[Message]``."""
    examples = _python_examples()
    assert len(examples) > 40, "the code blocks were not found"

    def holds_messages(node: ast.expr | None) -> bool:
        items = node.elts if isinstance(node, ast.List) else []
        keys = [key for item in items if isinstance(item, ast.Dict) for key in item.keys]
        return any(isinstance(key, ast.Constant) and key.value == "role" for key in keys)

    assignments = [(where, node) for where, tree in examples for node in ast.walk(tree)]
    unannotated = [
        f"{where}: {ast.unparse(node)[:60]}"
        for where, node in assignments
        if isinstance(node, ast.Assign) and holds_messages(node.value)
    ]
    assert not unannotated, f"write `messages: list[Message] = [...]` (from inference import Message): {unannotated}"
    annotated = [
        ast.unparse(node.annotation)
        for _, node in assignments
        if isinstance(node, ast.AnnAssign) and holds_messages(node.value)
    ]
    assert annotated and set(annotated) == {"list[Message]"}, annotated


def test_make_bench_runs_every_benchmark_script() -> None:
    """benchmarks.md says ``make bench`` runs them all: every ``scripts/bench_*.py`` is in a bench target."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    run = set(re.findall(r"scripts/(bench_\w+\.py)", makefile))
    scripts = {path.name for path in (ROOT / "scripts").glob("bench_*.py")}
    assert scripts - run == set(), f"benchmarks no make target runs: {sorted(scripts - run)}"
