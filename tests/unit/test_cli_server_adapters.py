"""``inference adapters`` against servers, each command a new provider (as each is a new process).

The vLLM side is a stateful respx double answering with vLLM 0.33's exact bodies (``/v1/load_lora_adapter``
200 plain text, ``/v1/unload_lora_adapter`` 404 JSON for an unknown name, ``/v1/models`` LoRA cards with a
``parent``); Ollama's ``/api/tags`` is its ``ListResponse``. Where nothing answers, a real closed port on
loopback, in this process and in a real subprocess.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
import respx

from inference._servers.ollama_models import derived_model_name
from inference.cli import main

VLLM = "http://vllm.test:8100/v1"
OLLAMA = "http://ollama.test:11434"


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


class FakeVLLM:
    """A vLLM server with runtime LoRA updating on: what is loaded survives the client that loaded it."""

    def __init__(self, router: respx.MockRouter) -> None:
        self.adapters: dict[str, str] = {}
        router.post(f"{VLLM}/load_lora_adapter").mock(side_effect=self._load)
        router.post(f"{VLLM}/unload_lora_adapter").mock(side_effect=self._unload)
        router.get(f"{VLLM}/models").mock(side_effect=self._models)

    def _load(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.adapters[body["lora_name"]] = body["lora_path"]
        return httpx.Response(200, text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    def _unload(self, request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["lora_name"]
        if self.adapters.pop(name, None) is None:
            error = {"message": f"The lora adapter '{name}' cannot be found.", "type": "NotFoundError", "code": 404}
            return httpx.Response(404, json={"error": {**error, "param": None}})
        return httpx.Response(200, text=f"Success: LoRA adapter '{name}' removed successfully.")

    def _models(self, request: httpx.Request) -> httpx.Response:
        card = {"object": "model", "created": 1700000000, "owned_by": "vllm", "permission": []}
        data = [{"id": "base", "root": "/models/base", "parent": None, "max_model_len": 2048, **card}]
        data += [
            {"id": name, "root": path, "parent": "base", "max_model_len": None, **card}
            for name, path in self.adapters.items()
        ]
        return httpx.Response(200, json={"object": "list", "data": data})


@pytest.fixture
def vllm() -> Iterator[FakeVLLM]:
    with respx.mock(assert_all_called=False) as router:
        yield FakeVLLM(router)



def test_the_replicas_listed_show_their_urls_without_credentials(
    vllm: FakeVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    secret_url = VLLM.replace("http://", "http://bob:SECRETPW@") + "?api_key=SECRETQ"
    status, out, err = run(["adapters", "list", "--provider", "vllm", "--base-url", secret_url, "--json"], capsys)
    assert status == 0, err
    assert "SECRET" not in out + err
    assert list(json.loads(out)["replicas"].values()) == [[]]

def test_list_in_a_new_process_shows_what_an_earlier_load_left_on_vllm(
    vllm: FakeVLLM, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ["--provider", "vllm", "--base-url", VLLM]
    for adapter_id in ("support", "pirate"):
        status, _, err = run(["adapters", "load", adapter_id, f"/srv/adapters/{adapter_id}", *options], capsys)
        assert status == 0, err
    status, out, err = run(["adapters", "list", *options, "--json"], capsys)
    assert status == 0, err
    listing = json.loads(out)
    assert {key: listing[key] for key in ("adapters", "provider")} == {
        "adapters": ["pirate", "support"],
        "provider": "vllm",
    }
    assert listing["replicas"] == {VLLM: ["pirate", "support"]}  # what each server holds, by its own word
    assert listing["stats"]["provider"] == "vllm" and listing["stats"]["in_flight"] == 0
    status, out, _ = run(["adapters", "list", *options], capsys)
    assert (status, out) == (0, "pirate\nsupport\n")

    status, _, err = run(["adapters", "unload", "pirate", *options], capsys)
    assert status == 0, err
    status, out, _ = run(["adapters", "list", *options], capsys)
    assert (status, out) == (0, "support\n")
    assert vllm.adapters == {"support": "/srv/adapters/support"}


def test_list_json_shows_each_replica_and_the_lifecycle_counters(capsys: pytest.CaptureFixture[str]) -> None:
    """With several replicas, each one's adapters; one that does not answer says why instead of failing the list."""
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    options = ["--provider", "vllm", "--base-url", f"{VLLM},{dead}", "--set", "max_retries=0"]
    with respx.mock(assert_all_called=False) as router:
        router.route(host="127.0.0.1").pass_through()  # a real closed port
        vllm = FakeVLLM(router)
        vllm.adapters["support"] = "/srv/adapters/support"
        status, out, err = run(["adapters", "list", *options, "--json"], capsys)
    assert status == 0, err
    listing = json.loads(out)
    assert listing["adapters"] == ["support"]
    assert listing["replicas"][VLLM] == ["support"]
    assert "ProviderUnavailableError" in listing["replicas"][dead]
    assert listing["stats"]["adapters"] == [] and listing["stats"]["loads"] == 0  # this process loaded nothing


def test_list_in_a_new_process_shows_the_adapters_ollama_holds(capsys: pytest.CaptureFixture[str]) -> None:
    names = ["llama3.2:latest", derived_model_name("Style_B", "llama3.2"), derived_model_name("a0", "qwen2.5:0.5b")]
    models = [
        {
            "name": name,
            "model": name,
            "modified_at": "2026-01-01T00:00:00Z",
            "size": 1,
            "digest": "0" * 64,
            "details": {"format": "gguf", "family": "llama"},
        }
        for name in names
    ]
    with respx.mock(assert_all_mocked=False) as router:  # other requests (a reachability probe) get a 200
        router.get(f"{OLLAMA}/api/tags").mock(return_value=httpx.Response(200, json={"models": models}))
        status, out, err = run(["adapters", "list", "--provider", "ollama", "--base-url", f"{OLLAMA}/v1"], capsys)
    assert status == 0, err
    assert out == "Style_B\na0\n"


@pytest.mark.parametrize("provider", ["vllm", "ollama"])
def test_list_where_nothing_answers_exits_1_and_says_so(provider: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    argv = ["adapters", "list", "--provider", provider, "--base-url", url, "--set", "max_retries=0", "--json"]
    status, out, err = run(argv, capsys)
    assert status == 1
    assert out == ""  # never an empty list from a server that was not asked
    assert err.startswith("inference: error: ") and url in err and f"{provider.upper()}_BASE_URL" in err


def test_list_where_nothing_answers_exits_1_from_a_real_process() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    command = "import sys; from inference.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["adapters", "list", "--provider", "vllm", "--base-url", url, "--set", "max_retries=0"]
    result = subprocess.run([sys.executable, "-c", command, *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stdout == "" and result.stderr.startswith("inference: error: ") and url in result.stderr


WITHOUT_HTTPX = """\
import contextlib, io, sys
sys.modules["httpx"] = None  # an install without the HTTP extras
from inference.cli import main
for argv in (sys.argv[1:4], sys.argv[4:]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(["adapters", *argv, "--provider", PROVIDER])
    print(status, err.getvalue().strip().splitlines()[-1])
"""


@pytest.mark.parametrize(
    ("provider", "status", "message"),
    [
        *(
            (name, 1, f"the {name} provider needs the Python package 'httpx', which cannot be imported (import of "
                      f"httpx halted; None in sys.modules): run pip install 'inference-adapters[{name}]'")
            for name in ("vllm", "openai", "ollama", "llamacpp-server")
        ),
        *((name, 2, f"the {name} provider runs in process") for name in ("fake", "llamacpp")),
    ],
)
def test_adapters_commands_without_the_provider_extra_say_what_to_install(
    provider: str, status: int, message: str
) -> None:
    """``list`` as ``load``: the CLI's own line (the extra to install, or the usage error), never a traceback."""
    code = WITHOUT_HTTPX.replace("PROVIDER", repr(provider))
    argv = ["load", "style", "/adapters/style", "list"]
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2, result.stdout
    for line in lines:  # load, then list
        assert line.startswith(f"{status} inference: ") and message in line, line
