"""One registry entry per provider; everything that lists providers reads it."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import inference
from inference import cli, exceptions
from inference.cli.options import _step_config
from inference.cli.providers import _provider_report
from inference.config import SETTINGS, Setting
from inference.exceptions import MissingDependencyError, UnknownProviderError
from inference.registry import PROVIDER_EXTRAS, PROVIDER_REGISTRY, PROVIDERS, load_provider_class

INIT = Path(inference.__file__)


def test_every_list_of_providers_is_the_registry() -> None:
    names = list(PROVIDERS)
    assert list(PROVIDER_REGISTRY) == list(PROVIDER_EXTRAS) == list(SETTINGS) == names
    assert {name: spec.target for name, spec in PROVIDERS.items()} == PROVIDER_REGISTRY
    assert set(cli.SERVER_PROVIDERS) == {"vllm", "openai", "ollama", "llamacpp-server"}
    assert {name: spec.packages for name, spec in PROVIDERS.items()} == cli.PROVIDER_PACKAGES
    for spec in PROVIDERS.values():
        assert all(isinstance(setting, Setting) for setting in spec.settings)
        assert spec.server == any(setting.key == "base_url" for setting in spec.settings), spec.name
        if spec.model_setting is not None:
            assert spec.model_setting in {setting.key for setting in spec.settings}


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_each_target_is_a_provider_class_named_like_its_entry(name: str) -> None:
    spec = PROVIDERS[name]
    cls = load_provider_class(name)
    assert cls.__name__ == spec.class_name and cls.__module__ == spec.module
    assert cls.name == name  # type: ignore[attr-defined]
    assert getattr(inference, spec.class_name) is cls  # the lazy attribute of ``inference``


def test_init_names_every_provider_class_for_type_checkers() -> None:
    """``inference/__init__.py`` imports each class under TYPE_CHECKING and lists it in ``__all__``."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    checked = next(
        node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    imports = [node for node in checked.body if isinstance(node, ast.ImportFrom)]
    imported = {f"{node.module}:{alias.name}" for node in imports for alias in node.names}
    providers = {target for target in imported if target.partition(":")[0].endswith("_provider")}
    assert providers == set(PROVIDER_REGISTRY.values()), "add the class to inference/__init__.py's TYPE_CHECKING block"
    assert {spec.class_name for spec in PROVIDERS.values()} <= set(inference.__all__)


def _seen_by_type_checkers(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The top-level statements a type checker reads: both branches of an ``if``, the body of ``if TYPE_CHECKING:``,
    nothing of ``if not TYPE_CHECKING:``."""
    for node in body:
        if not isinstance(node, ast.If):
            yield node
        elif ast.unparse(node.test) == "TYPE_CHECKING":
            yield from _seen_by_type_checkers(node.body)
        elif ast.unparse(node.test) != "not TYPE_CHECKING":
            yield from _seen_by_type_checkers([*node.body, *node.orelse])


@pytest.mark.parametrize("module", [inference, exceptions], ids=lambda module: module.__name__)
def test_every_public_name_is_declared_for_type_checkers_and_no_other(module: ModuleType) -> None:
    """Each name of ``__all__`` is defined or imported where a type checker looks (else ``from inference import
    AdapterWeights`` is ``Any`` to it): a lazy one under ``if TYPE_CHECKING:``, from where it is at run time; and the
    lazy ``__getattr__`` is hidden from type checkers (else ``inference.get_provder``, misspelt, is ``Any`` too)."""
    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    seen = list(_seen_by_type_checkers(tree.body))
    imported = {
        alias.asname or alias.name: node.module or ""
        for node in seen if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    declared = set(imported) | {node.name for node in seen if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    declared |= {target.id for node in seen if isinstance(node, ast.Assign) for target in node.targets
                 if isinstance(target, ast.Name)}
    public = _static_all() if module is inference else list(module.__all__)
    missing = [name for name in public if name not in declared]
    assert not missing, f"import them under `if TYPE_CHECKING:` in {module.__file__}: {missing}"
    for name in public:
        if name in imported:  # the object a type checker reads is the one the module hands out
            assert getattr(importlib.import_module(imported[name]), name) is getattr(module, name), name
    assert "__getattr__" not in declared, "define the module's __getattr__ under `if not TYPE_CHECKING:`"
    assert callable(module.__getattr__)  # still there at run time


def test_unknown_provider_lists_the_registered_names() -> None:
    with pytest.raises(UnknownProviderError, match="valid names are " + ", ".join(sorted(PROVIDERS))):
        load_provider_class("tgi")


def test_a_provider_whose_module_cannot_be_imported_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PROVIDER_REGISTRY, "openai", "inference._no_such_module:OpenAIProvider")
    with pytest.raises(MissingDependencyError) as caught:
        load_provider_class("openai")
    assert str(caught.value) == (
        "the openai provider needs the Python package 'inference._no_such_module', which cannot be imported "
        "(No module named 'inference._no_such_module'): run pip install 'inference-adapters[openai]'"
    )
    assert caught.value.provider == "openai"


def test_a_missing_backend_package_is_named_with_the_extra_of_the_provider() -> None:
    """httpx hidden: building a provider names the package and the extra that installs it, in one format."""
    code = (
        "import sys; sys.modules['httpx'] = None\n"
        "for name in [m for m in sys.modules if m.startswith('inference.')]: del sys.modules[name]\n"
        "from inference import get_provider\n"
        "for name in ('vllm', 'openai'):\n"
        "    try: get_provider(name, 'http://127.0.0.1:1/v1')\n"
        "    except ImportError as error: print(type(error).__name__, error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    lines = result.stdout.splitlines()
    assert lines == [
        f"MissingDependencyError the {name} provider needs the Python package 'httpx', which cannot be imported "
        f"(import of httpx halted; None in sys.modules): run pip install 'inference-adapters[{name}]'"
        for name in ("vllm", "openai")
    ], result.stderr


WITHOUT_HTTPX = """\
import json, sys
sys.modules["httpx"] = None  # an install without the HTTP extras
import inference
errors = {}
for spec in inference.PROVIDERS.values():
    try:
        exec(f"from inference import {spec.class_name}", {})
    except ImportError as error:
        try:
            inference.get_provider(spec.name, "http://127.0.0.1:1/v1")
        except ImportError as built:
            errors[spec.class_name] = [type(error).__name__, str(error), str(built)]
star = {}
exec("from inference import *", star)
print(json.dumps({"errors": errors, "star": sorted(name for name in star if name != "__builtins__")}))
"""


def _static_all() -> list[str]:
    """``inference.__all__`` as written in ``inference/__init__.py`` (what type checkers read)."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    assigned = next(
        node for node in tree.body
        if isinstance(node, ast.Assign) and [ast.unparse(target) for target in node.targets] == ["__all__"]
    )
    names: list[str] = ast.literal_eval(assigned.value)
    return names


def test_a_provider_class_without_its_extra_names_the_extra_and_star_import_leaves_it_out() -> None:
    """httpx hidden: ``from inference import OpenAIProvider`` raises what ``get_provider("openai")`` raises (not a
    bare ModuleNotFoundError), and ``from inference import *`` binds every other public name."""
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_HTTPX], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    server_classes = {spec.class_name: name for name, spec in PROVIDERS.items() if "httpx" in spec.packages}
    assert set(answer["errors"]) == set(server_classes)
    for class_name, (kind, message, from_get_provider) in answer["errors"].items():
        assert kind == "MissingDependencyError" and message == from_get_provider
        assert f"run pip install 'inference-adapters[{PROVIDER_EXTRAS[server_classes[class_name]]}]'" in message
    assert answer["star"] == sorted(set(_static_all()) - set(server_classes))


def test_star_import_binds_every_public_name_when_the_extras_are_installed() -> None:
    star: dict[str, object] = {}
    exec("from inference import *", star)
    assert set(star) - {"__builtins__"} == set(_static_all()) == set(inference.__all__)


def test_import_optional_takes_the_extra_from_the_registry_or_the_argument() -> None:
    from inference._core.dependencies import import_optional

    assert import_optional("json", provider="vllm").__name__ == "json"
    with pytest.raises(MissingDependencyError, match=r"\[transformers\]"):
        import_optional("surely_not_installed_pkg", provider="transformers")
    with pytest.raises(MissingDependencyError, match=r"\[llamacpp\]"):
        import_optional("surely_not_installed_pkg", provider="ollama", extra="llamacpp")


def test_inference_providers_never_contacts_a_remote_default_unasked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("VLLM_BASE_URL", raising=False)
    report = _provider_report("openai", None)
    assert report["server"] is True and report["base_url"] is None
    assert "not checked" in report["detail"] and "--openai-url" in report["detail"]
    assert _provider_report("openai", "http://127.0.0.1:30000/v1")["base_url"] == "http://127.0.0.1:30000/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", "https://gateway.example/v1")
    assert _provider_report("openai", None)["base_url"] == "https://gateway.example/v1"
    assert _provider_report("vllm", None)["base_url"] == "http://localhost:8100/v1"  # local default: checked


def test_model_path_sets_the_model_setting_of_the_in_process_provider() -> None:
    parser = cli.build_parser()
    for name in ("llamacpp", "transformers"):
        args = parser.parse_args(["generate", "Hi", "--provider", name, "--model-path", "/m"])
        assert _step_config(args)[PROVIDERS[name].model_setting or ""] == "/m"
