"""The ``inference`` command line with the fake provider: every subcommand, ``--json``, exit statuses, stderr."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import respx

from inference.cli import main
from inference.fake_provider import FakeProvider

VLLM = "http://vllm.test:8100/v1"
VLLM_NO_ADAPTERS = httpx.Response(200, json={"object": "list", "data": [
    {"id": "base", "object": "model", "created": 1700000000, "owned_by": "vllm", "root": "/models/base",
     "parent": None, "max_model_len": 2048, "permission": []},
]})
"""``GET /v1/models`` of a vLLM serving its base model and no LoRA adapter."""
DEAD = "http://127.0.0.1:9/v1"  # the discard port: nothing answers


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def fake_text(prompt: str, *, adapter_path: str = "/x", **arguments: object) -> str:
    async def answer() -> str:
        fake = FakeProvider()
        adapter = arguments.get("adapter_id")
        if isinstance(adapter, str):
            await fake.load_adapter(adapter, adapter_path)
        return (await fake.generate(prompt, model="", **arguments)).text  # type: ignore[arg-type]

    return asyncio.run(answer())


# generate ---------------------------------------------------------------------------------------------------


def test_generate_prints_the_text(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["generate", "Hello", "--provider", "fake", "--max-tokens", "5", "--seed", "3"], capsys)
    assert status == 0, err
    assert out == fake_text("Hello", max_tokens=5, seed=3) + "\n"


def test_generate_json_has_the_result_fields(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["generate", "Hi there", "--provider", "fake", "--system", "Be brief.", "--json"], capsys)
    assert status == 0
    answer = json.loads(out)
    assert answer["text"] == fake_text("Hi there", system_prompt="Be brief.", max_tokens=256)
    assert answer["token_count"] == answer["prompt_tokens"] + answer["completion_tokens"]
    assert answer["prompt_tokens"] == 4  # "Hi there" + "Be brief."
    assert answer["finish_reason"] in ("stop", "length")
    assert answer["adapter_id"] is None and answer["latency_s"] >= 0


def test_generate_n_prints_each_choice_and_json_lists_them(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "Hello", "--provider", "fake", "--n", "3", "--temperature", "1", "--max-tokens", "40"]
    status, out, err = run(argv, capsys)
    assert status == 0, err
    async def choices() -> list[str]:
        result = await FakeProvider().generate("Hello", model="", n=3, temperature=1, max_tokens=40)
        assert result.choices is not None
        return [choice.text for choice in result.choices]

    texts = asyncio.run(choices())
    assert out == "".join(f"--- choice {i} of 3 (stop)\n{text}\n" for i, text in enumerate(texts, 1))
    status, out, _ = run([*argv, "--json"], capsys)
    answer = json.loads(out)
    assert [choice["text"] for choice in answer["choices"]] == texts and answer["text"] == texts[0]
    assert answer["completion_tokens"] == sum(choice["completion_tokens"] for choice in answer["choices"])


def test_generate_takes_the_request_options_as_flags(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "Hello", "--provider", "fake", "--response-format", '{"type": "json_object"}', "--timeout",
            "30", "--logit-bias", '{"7": -100}', "--thinking", "true", "--json"]
    status, out, err = run(argv, capsys)
    assert status == 0, err
    answer = json.loads(out)
    assert isinstance(json.loads(answer["text"]), dict) and answer["reasoning"].startswith("Thinking: ")
    status, _, err = run(["generate", "Hello", "--provider", "fake", "--logit-bias", "{7: -100}"], capsys)
    assert status == 2 and "--logit-bias: '{7: -100}' is not JSON" in err
    status, _, err = run(["generate", "Hello", "--provider", "fake", "--n", "2", "--stream"], capsys)
    assert status == 1 and "stream yields the pieces of one completion, and n is 2" in err


def test_generate_stop_strings_are_passed_on(capsys: pytest.CaptureFixture[str]) -> None:
    full = fake_text("Hello", max_tokens=256)
    stop = full.split()[2]
    status, out, _ = run(["generate", "Hello", "--provider", "fake", "--stop", stop, "--stop", "zzz"], capsys)
    assert status == 0
    assert out.rstrip("\n") == full[: full.index(stop)]


def test_generate_stream_prints_the_same_text(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["generate", "Hello", "--provider", "fake", "--stream"], capsys)
    assert status == 0
    assert out == fake_text("Hello", max_tokens=256) + "\n"


def test_generate_stream_json_is_json_lines_ending_with_the_result(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["generate", "Hello", "--provider", "fake", "--stream", "--json"], capsys)
    assert status == 0
    lines = [json.loads(line) for line in out.splitlines()]
    pieces = [line["text"] for line in lines if line["type"] == "text"]
    assert lines[-1]["type"] == "result"
    assert [line["type"] for line in lines].count("result") == 1
    assert "".join(pieces) == lines[-1]["text"] == fake_text("Hello", max_tokens=256)


def test_generate_with_an_adapter_path_loads_it_under_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "my style").mkdir()
    status, out, _ = run(["generate", "Hi", "--provider", "fake", "--adapter", str(tmp_path / "my style")], capsys)
    assert status == 0
    expected = fake_text("Hi", adapter_id="my-style", adapter_path=str(tmp_path / "my style"), max_tokens=256)
    assert out.strip() == expected
    assert out.startswith("[my-style] ")


def test_generate_with_an_unknown_adapter_id_exits_1_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["generate", "Hi", "--provider", "fake", "--adapter", "nope"], capsys)
    assert status == 1
    assert out == ""
    assert err.startswith("inference: error: ") and "'nope'" in err and "not loaded" in err
    assert "Traceback" not in err


def test_generate_with_a_mistyped_adapter_path_names_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path with nothing there was taken for a server's adapter id, and refused as one (no path separators)."""
    missing = str(tmp_path / "adapters" / "stlye")
    status, out, err = run(["generate", "Hi", "--provider", "fake", "--adapter", missing], capsys)
    assert status == 1 and out == ""
    assert f"there is no adapter at {missing!r} on this machine" in err and "Traceback" not in err


def test_generate_with_bad_sampling_exits_1_with_the_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["generate", "Hi", "--provider", "fake", "--top-p", "1.5"], capsys)
    assert status == 1
    assert "top_p must be a number in (0, 1]" in err


def test_unknown_provider_exits_1_listing_the_valid_names(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["generate", "Hi", "--provider", "gpt5"], capsys)
    assert status == 1
    assert "unknown provider type 'gpt5'" in err and "llamacpp" in err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--set", "n_ctx=10"], "not a setting of the fake provider"),
        (["--model-path", "m.gguf"], "--model-path is for the in-process providers"),
        (["--device", "cuda"], "--device is a transformers setting"),
        (["--set", "oops"], "expected KEY=VALUE"),
        (["--max-tokens", "many"], "invalid int value"),
    ],
)
def test_usage_mistakes_exit_2(extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["generate", "Hi", "--provider", "fake", *extra], capsys)
    assert status == 2
    assert needle in err and out == ""


@pytest.mark.parametrize("provider", ["fake", "vllm"])
def test_an_unknown_set_key_lists_each_valid_key_once(provider: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A name that is both a provider setting and a request option (``timeout`` on vLLM, ``raw_prompt`` on the fake
    provider) was listed twice."""
    status, _, err = run(["generate", "Hi", "--provider", provider, "--set", "nosuch=1"], capsys)
    assert status == 2
    keys = err.split("valid keys: ", 1)[1].strip().split(", ")
    assert len(keys) == len(set(keys)) > 5 and keys == sorted(keys)


def test_json_schema_help_says_what_the_command_line_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """The help was the Python API's ("a dict or a pydantic model class"), which a shell cannot pass: the flag reads a
    JSON file."""
    assert main(["generate", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--json-schema FILE" in help_text and "on the command line a JSON file of the schema" in help_text


def test_set_takes_the_generation_options_on_generate_too(capsys: pytest.CaptureFixture[str]) -> None:
    """As cli.md says (``--set n=3``); it was "not a setting of the fake provider" (exit 2) on generate, where eval
    took it. The same request as the options' own flags."""
    status, out, _ = run(["generate", "Hi", "--provider", "fake", "--set", "n=3", "--set", "max_tokens=4",
                          "--set", "seed=7", "--set", "temperature=0.5", "--set", "timeout=30"], capsys)
    assert status == 0 and out.count("--- choice ") == 3
    flagged, flagged_out, _ = run(["generate", "Hi", "--provider", "fake", "--n", "3", "--max-tokens", "4",
                                   "--seed", "7", "--temperature", "0.5", "--timeout", "30"], capsys)
    assert flagged == 0 and flagged_out == out
    status, _, err = run(["generate", "Hi", "--provider", "fake", "--set", "n=many"], capsys)
    assert status == 2 and "--set n='many' is not a valid n" in err


def test_set_values_are_parsed_with_the_settings_table(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["generate", "Hi", "--provider", "vllm", "--set", "timeout=soon"], capsys)
    assert status == 2
    assert "--set timeout='soon'" in err
    status, _, err = run(["generate", "Hi", "--provider", "fake", "--set", "max_adapters=0"], capsys)
    assert status == 2 and "--set max_adapters='0'" in err and "positive integer" in err
    assert "environment variable" not in err  # the value came from --set, not from FAKE_MAX_ADAPTERS


def test_a_server_that_is_down_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "Hi", "--provider", "vllm", "--base-url", DEAD, "--model", "m", "--set", "max_retries=0"]
    status, _, err = run(argv, capsys)
    assert status == 1
    assert "127.0.0.1:9" in err and "Traceback" not in err


# adapters ---------------------------------------------------------------------------------------------------


def test_adapters_refuses_in_process_providers_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["adapters", "list", "--provider", "llamacpp"], capsys)
    assert status == 2
    assert "adapters live only in the process that loaded them" in err


def test_adapters_without_an_action_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["adapters"], capsys)
    assert status == 2
    assert "load, unload or list" in err


def test_adapters_load_and_unload_on_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    with respx.mock(assert_all_called=True) as router:
        load = router.post(f"{VLLM}/load_lora_adapter").mock(
            return_value=httpx.Response(200, text="Success: LoRA adapter 'style' added successfully.")
        )
        router.get(f"{VLLM}/models").mock(return_value=VLLM_NO_ADAPTERS)  # a first load asks what it holds
        status, out, err = run(
            ["adapters", "load", "style", "/srv/adapters/style", "--provider", "vllm", "--base-url", VLLM, "--json"],
            capsys,
        )
    assert status == 0, err
    assert json.loads(load.calls.last.request.content) == {"lora_name": "style", "lora_path": "/srv/adapters/style"}
    assert json.loads(out) == {"loaded": "style", "path": "/srv/adapters/style", "provider": "vllm"}


def test_adapters_list_prints_the_ids_one_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    models = {
        "object": "list",
        "data": [
            {"id": "base", "object": "model", "root": "base", "parent": None},
            {"id": "style", "object": "model", "root": "/srv/adapters/style", "parent": "base"},
        ],
    }
    argv = ["adapters", "list", "--provider", "vllm", "--base-url", VLLM]
    with respx.mock(assert_all_called=False) as router:
        router.get(f"{VLLM}/models").mock(return_value=httpx.Response(200, json=models))
        status, out, err = run([*argv, "--json"], capsys)
        assert status == 0, err
        listed = json.loads(out)
        status, out, _ = run(argv, capsys)
    assert status == 0
    assert listed["provider"] == "vllm"
    assert out.splitlines() == listed["adapters"]


def test_adapters_against_a_server_that_is_down_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["adapters", "load", "x", "/a", "--provider", "vllm", "--base-url", DEAD, "--set", "max_retries=0"]
    status, out, err = run(argv, capsys)
    assert status == 1
    assert out == "" and err.startswith("inference: error: ")


# eval -------------------------------------------------------------------------------------------------------


@pytest.fixture
def eval_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    for name in ("a1", "a2"):
        (tmp_path / "adapters" / name).mkdir(parents=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}", "expected": r"^\[a1\]"}) for i in range(3))
    )
    return tmp_path / "adapters", prompts, tmp_path / "out" / "results.jsonl"


def test_eval_writes_rows_and_prints_the_table(
    eval_files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    adapters, prompts, output = eval_files
    argv = ["eval", "--adapters", str(adapters / "*"), "--prompts", str(prompts), "--output", str(output)]
    argv += ["--provider", "fake", "--score", "regex", "--max-tokens", "4", "--no-plot"]
    status, out, err = run(argv, capsys)
    assert status == 0, err
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted((row["adapter_id"], row["prompt_id"]) for row in rows) == [
        (a, f"p{i}") for a in ("(base)", "a1", "a2") for i in range(3)
    ]
    assert all(row["completion_tokens"] <= 4 for row in rows)
    table = out.splitlines()
    assert table[0].split() == ["adapter", "rows", "score", "latency_s", "tokens/s", "errors"]
    assert table[1].split()[:3] == ["(base)", "3", "0.000"]  # the base model's reference line first
    assert table[2].split()[:4] == ["a1", "3", "1.000", "(+1.000)"] and table[3].split()[:3] == ["a2", "3", "0.000"]
    assert "best score: a1 1.000 (higher is better; base model 0.000)" in out
    assert output.with_name("results.summary.csv").is_file()
    assert err == ""  # not a terminal: no progress bar


def test_eval_with_adapters_in_flight_writes_the_same_rows(
    eval_files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    adapters, prompts, output = eval_files
    argv = ["eval", "--adapters", str(adapters / "*"), "--prompts", str(prompts), "--provider", "fake"]
    assert run([*argv, "--output", str(output)], capsys)[0] == 0
    status, _, err = run([*argv, "--output", str(output.with_name("two.jsonl")), "--adapters-in-flight", "2"], capsys)
    assert status == 0, err

    def texts(path: Path) -> dict[tuple[str, str], str]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return {(row["adapter_id"], row["prompt_id"]): row["output"] for row in rows}

    assert texts(output.with_name("two.jsonl")) == texts(output) and len(texts(output)) == 9  # and the base model
    status, _, err = run([*argv, "--output", str(output), "--adapters-in-flight", "0"], capsys)
    assert status == 2 and "--adapters-in-flight must be at least 1" in err


def test_eval_json_summary_and_resumption(
    eval_files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    adapters, prompts, output = eval_files
    argv = ["eval", "--adapters", str(adapters / "a1"), "--adapters", str(adapters / "a2"), "--prompts", str(prompts)]
    argv += ["--output", str(output), "--provider", "fake", "--json"]
    status, out, _ = run(argv, capsys)
    assert status == 0
    first = json.loads(out)
    assert (first["rows_total"], first["rows_written"], first["rows_resumed"], first["errors"]) == (9, 9, 0, 0)
    assert [adapter["adapter_id"] for adapter in first["adapters"]] == ["a1", "a2"]
    assert first["base"]["adapter_id"] == "(base)" and first["base"]["rows"] == 3
    status, out, _ = run(argv, capsys)
    assert status == 0
    again = json.loads(out)
    assert (again["rows_written"], again["rows_resumed"]) == (0, 9)
    assert len(output.read_text().splitlines()) == 9


def test_eval_counts_the_rows_whose_scorer_raised_as_errors(
    eval_files: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A --score function that raised cost its rows their score, and the run said nothing (errors 0, no line)."""
    (tmp_path / "flaky_scorer.py").write_text(
        "def score(output, expected, row):\n"
        "    if row['prompt_id'] == 'p0' or expected == 'always':\n"
        "        return 1 / 0\n"
        "    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    adapters, prompts, output = eval_files
    argv = ["eval", "--adapters", str(adapters / "*"), "--prompts", str(prompts), "--provider", "fake", "--no-plot"]
    status, out, err = run([*argv, "--output", str(output), "--score", "flaky_scorer:score", "--json"], capsys)
    summary = json.loads(out)
    assert status == 0 and summary["errors"] == 3  # p0 of the base model, a1 and a2
    assert "inference: 3 of 9 rows have errors" in err
    assert [adapter["scored"] for adapter in summary["adapters"]] == [2, 2]
    prompts.write_text(json.dumps({"id": "p0", "prompt": "q", "expected": "always"}))
    status, _, err = run([*argv, "--output", str(output.with_name("all.jsonl")), "--score", "flaky_scorer:score"],
                         capsys)
    assert status == 1 and "every row failed" in err and "score_error" in err


def test_health_json_answers_an_object_when_the_configuration_does_not_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .env line that is not KEY=value, or a --set value out of range: the probe's stdout was empty."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("INFERENCE_ENV_FILE", raising=False)
    (tmp_path / ".env").write_text("INFERENCE_PROVIDER=vllm\nnot a kv line\n")
    cases = [["health", "--json"], ["health", "--json", "--provider", "vllm", "--set", "timeout=-3"]]
    for index, argv in enumerate(cases):
        status, out, err = run(argv, capsys)
        answer = json.loads(out)
        assert status == 2 and answer["status"] == "down" and answer["error"], argv
        assert answer["error"] in err
        (tmp_path / ".env").unlink(missing_ok=True)
        assert index == 0 or "timeout" in answer["error"]


@pytest.mark.parametrize("command", [["providers"], ["health", "--provider", "fake"]])
@pytest.mark.parametrize("timeout", ["nan", "0", "-1", "inf", "soon"])
def test_a_timeout_that_is_not_a_positive_number_of_seconds_is_a_usage_error(
    command: list[str], timeout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """providers --timeout nan was a traceback, and --timeout 0 reported every server unreachable."""
    status, out, err = run([*command, "--timeout", timeout], capsys)
    assert status == 2 and out == "" and f"expected a positive number of seconds, got {timeout!r}" in err


@pytest.mark.parametrize(
    ("extra", "status", "needle"),
    [
        (["--score", "fuzzy"], 2, "--score 'fuzzy'"),
        (["--concurrency", "0"], 2, "--concurrency must be at least 1"),
        (["--score", "no_such_module_here:f"], 1, "cannot import the scorer module"),
        (["--temperature", "-1"], 1, "temperature must be a number"),
        (["--set", "max_tokens=lots"], 2, "--set max_tokens='lots'"),
    ],
)
def test_eval_refuses_bad_options_before_writing(
    eval_files: tuple[Path, Path, Path], extra: list[str], status: int, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    adapters, prompts, output = eval_files
    argv = ["eval", "--adapters", str(adapters / "*"), "--prompts", str(prompts), "--output", str(output)]
    code, _, err = run([*argv, "--provider", "fake", *extra], capsys)
    assert code == status
    assert needle in err
    assert not output.exists()


def test_eval_with_a_missing_prompt_file_or_adapter_exits_1(
    eval_files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    adapters, prompts, output = eval_files
    status, _, err = run(
        ["eval", "--adapters", str(adapters / "a1"), "--prompts", "missing.jsonl", "--output", str(output)], capsys
    )
    assert status == 1 and "cannot read the prompt set missing.jsonl" in err
    status, _, err = run(
        ["eval", "--adapters", str(adapters / "zz*"), "--prompts", str(prompts), "--output", str(output)], capsys
    )
    assert status == 1 and "matches nothing" in err


def test_eval_without_required_options_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["eval", "--prompts", "p.jsonl"], capsys)
    assert status == 2
    assert "--adapters" in err


# providers --------------------------------------------------------------------------------------------------


def test_providers_json_lists_every_provider(capsys: pytest.CaptureFixture[str]) -> None:
    with respx.mock(assert_all_called=True) as router:
        router.get(f"{VLLM}/models").mock(return_value=httpx.Response(200, json={"object": "list", "data": []}))
        router.route(host="127.0.0.1").pass_through()  # the dead URL is really tried
        status, out, _ = run(
            ["providers", "--vllm-url", VLLM, "--ollama-url", DEAD, "--llamacpp-server-url", DEAD, "--json"], capsys
        )
    assert status == 0
    reports = {report["name"]: report for report in json.loads(out)["providers"]}
    assert set(reports) == {
        "vllm", "openai", "ollama", "llamacpp", "llamacpp-server", "transformers", "vllm-offline", "fake"
    }
    assert reports["fake"]["installed"] is True and reports["fake"]["missing"] == []
    assert reports["vllm"]["reachable"] is True and reports["vllm"]["base_url"] == VLLM
    assert reports["ollama"]["reachable"] is False and "127.0.0.1:9" in reports["ollama"]["detail"]
    assert reports["llamacpp"]["server"] is False and reports["llamacpp"]["reachable"] is None


def test_providers_table_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import inference.cli as cli

    monkeypatch.setitem(cli.PROVIDER_PACKAGES, "transformers", ("torch", "surely_not_installed_pkg"))
    status, out, _ = run(["providers", "--vllm-url", DEAD, "--ollama-url", DEAD, "--timeout", "0.5"], capsys)
    assert status == 0
    line = next(line for line in out.splitlines() if line.startswith("transformers"))
    assert "missing surely_not_installed_pkg" in line and "pip install 'inference-adapters[transformers]'" in line
    assert "unreachable" in next(line for line in out.splitlines() if line.startswith("vllm"))


def test_providers_does_not_import_heavy_backends() -> None:
    code = (
        "import sys; from inference.cli import main; main(['providers', '--vllm-url', 'http://127.0.0.1:9/v1',"
        " '--ollama-url', 'http://127.0.0.1:9/v1', '--timeout', '0.2', '--json']);"
        "heavy = [m for m in ('torch', 'transformers', 'llama_cpp', 'openai') if m in sys.modules];"
        "print('HEAVY', heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "HEAVY []" in result.stdout


# help and the process -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["generate"], ["adapters"], ["adapters", "load"], ["convert-adapter"], ["eval"], ["providers"]],
)
def test_every_command_has_help_with_examples(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run([*command, "--help"], capsys)
    assert status == 0
    assert "usage: inference" in out
    if command != ["adapters", "load"]:
        assert "example" in out


def test_the_module_runs_as_a_program_with_exit_statuses(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "inference.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "INFERENCE_PROVIDER": "fake"},
        )

    ok = cli("generate", "Hello", "--max-tokens", "3")
    assert ok.returncode == 0 and ok.stdout.startswith("[base] ")
    failed = cli("generate", "Hello", "--adapter", "ghost")
    assert failed.returncode == 1 and "ghost" in failed.stderr and "Traceback" not in failed.stderr
    usage = cli("generate")
    assert usage.returncode == 2 and "PROMPT" in usage.stderr
    nothing = cli()
    assert nothing.returncode == 2 and "generate" in nothing.stderr


# one-line errors, a closed stdout ----------------------------------------------------------------------------


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("provider", ["vllm", "ollama"])
def test_adapters_list_where_nothing_listens_exits_1_with_one_line(
    provider: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{unused_port()}/v1"
    argv = ["adapters", "list", "--provider", provider, "--base-url", url, "--set", "max_retries=0"]
    for extra in ([], ["--json"]):
        status, out, err = run([*argv, *extra], capsys)
        assert status == 1
        assert out == ""  # not "[]": an empty list would say the server holds no adapters
        assert err.startswith("inference: error: ") and err.count("\n") == 1
        assert url in err and f"{provider.upper()}_BASE_URL" in err and "Traceback" not in err


def test_an_error_message_with_line_breaks_is_printed_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from inference.exceptions import ProviderError

    async def broken(self: FakeProvider, request: object) -> object:
        raise ProviderError("the backend failed:\n  line two\n  line three")

    monkeypatch.setattr(FakeProvider, "_generate", broken)
    status, out, err = run(["generate", "Hi", "--provider", "fake"], capsys)
    assert status == 1 and out == ""
    assert err == "inference: error: the backend failed: line two line three\n"


def test_a_file_system_refusal_is_one_line_with_exit_1(
    eval_files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    adapters, prompts, _ = eval_files
    blocker = adapters.parent / "a-file"
    blocker.write_text("not a directory")
    argv = ["eval", "--adapters", str(adapters / "a1"), "--prompts", str(prompts), "--provider", "fake"]
    status, out, err = run([*argv, "--output", str(blocker / "results.jsonl")], capsys)
    assert status == 1 and out == ""
    assert err.startswith("inference: error: ") and err.count("\n") == 1 and str(blocker) in err


def test_resuming_eval_with_other_settings_exits_1_saying_to_use_a_new_output(
    eval_files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    adapters, prompts, output = eval_files
    argv = ["eval", "--adapters", str(adapters / "*"), "--prompts", str(prompts), "--output", str(output)]
    argv += ["--provider", "fake"]
    assert run([*argv, "--max-tokens", "4"], capsys)[0] == 0
    before = output.read_bytes()
    status, out, err = run([*argv, "--max-tokens", "8"], capsys)
    assert status == 1 and out == ""
    assert "max_tokens was 4, now 8" in err and "new output file" in err and err.count("\n") == 1
    assert output.read_bytes() == before


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "Hello", "--max-tokens", "50"],
        ["generate", "Hello", "--max-tokens", "50", "--stream"],
        ["generate", "Hello", "--max-tokens", "50", "--stream", "--json"],
        ["eval", "--adapters", "{adapters}/*", "--prompts", "{prompts}", "--output", "{output}", "--json"],
        ["providers", "--vllm-url", "http://127.0.0.1:9/v1", "--ollama-url", "http://127.0.0.1:9/v1", "--json"],
    ],
)
def test_a_closed_stdout_stops_the_command_quietly(command: list[str], eval_files: tuple[Path, Path, Path]) -> None:
    adapters, prompts, output = eval_files
    argv = [part.format(adapters=adapters, prompts=prompts, output=output) for part in command]
    process = subprocess.Popen(
        [sys.executable, "-m", "inference.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "INFERENCE_PROVIDER": "fake"},
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # like `| head` having read enough: every write to stdout now fails
    with process.stderr:
        err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, err  # 128 + SIGPIPE, as a shell reports for `yes | head`
    assert err == ""

