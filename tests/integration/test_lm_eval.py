"""lm-eval-harness on the SDK's providers: the model ``inference``, local tasks, numbers checked against direct calls.

The tasks are YAML files over JSONL rows written here (no downloads): a multiple-choice task (``loglikelihood``),
a perplexity task (``loglikelihood_rolling``) and a short-answer task (``generate_until``).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")

import lm_eval.tasks
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager

from inference.cli import main as inference_main
from inference.exceptions import ConfigurationError, UnsupportedOperationError
from inference.fake_provider import FakeProvider
from inference.integrations.lm_eval import InferenceLM, main
from inference.llamacpp_provider import LlamaCppProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

ROWS: list[dict[str, Any]] = [
    {"question": "The sky is", "choices": [" blue", " green", " loud"], "label": 0},
    {"question": "Two plus two is", "choices": [" four", " five", " a chair"], "label": 0},
    {"question": "The fox jumps over the", "choices": [" dog", " moon", " seven"], "label": 0},
    {"question": "Water is", "choices": [" dry", " wet", " angry"], "label": 1},
    {"question": "Once upon a", "choices": [" time", " table"], "label": 0},
    {"question": "Hello,", "choices": [" world", " hello again and goodbye"], "label": 0},
]
PAGES = [{"page": "the quick brown fox jumps over the lazy dog and the village had three bakeries"}]
ANSWERS = [{"question": "Q: The quick brown fox", "answer": "jumps"}, {"question": "Q: Hello, world", "answer": "!"}]


class LocalTaskManager(TaskManager):  # type: ignore[misc]
    """lm-eval's task index of the local tasks only: indexing its thousands of built-in tasks takes seconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["include_defaults"] = False
        super().__init__(*args, **kwargs)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp_path = tmp_path_factory.mktemp("lm-eval-tasks")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
        monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalTaskManager)  # what lm-eval's command line builds
        yield _write_tasks(tmp_path)


def _write_tasks(tmp_path: Path) -> Path:
    for name, rows in (("mc", ROWS), ("pages", PAGES), ("answers", ANSWERS)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    def task(name: str, data: str, body: str) -> None:
        head = (
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / data}\n"
            "test_split: test\n"
        )
        (tmp_path / f"{name}.yaml").write_text(head + body)

    task(
        "tiny_mc", "mc.jsonl",
        'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: label\ntarget_delimiter: ""\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n',
    )
    task(
        "tiny_pages", "pages.jsonl",
        'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{page}}"\n'
        "metric_list:\n  - metric: word_perplexity\n",
    )
    task(
        "tiny_answers", "answers.jsonl",
        'output_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
        "generation_kwargs:\n  until: [\"\\n\", \"Q:\"]\n  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n",
    )
    return tmp_path


def evaluate(model_args: str, task_names: list[str], include: Path) -> dict[str, Any]:
    results: dict[str, Any] = simple_evaluate(
        model="inference", model_args=model_args, tasks=task_names,
        task_manager=LocalTaskManager(include_path=str(include)), log_samples=True,
    )
    return results


async def expected_accuracy(provider: Any, adapter_id: str | None = None) -> tuple[float, float]:
    """lm-eval's acc and acc_norm, recomputed from direct score calls (argmax over the choices)."""
    right = right_norm = 0
    for row in ROWS:
        scores = [await provider.score(row["question"], choice, "", adapter_id) for choice in row["choices"]]
        sums = [score.logprob for score in scores]
        normalised = [score.logprob / len(choice) for score, choice in zip(scores, row["choices"], strict=True)]
        right += sums.index(max(sums)) == row["label"]
        right_norm += normalised.index(max(normalised)) == row["label"]
    return right / len(ROWS), right_norm / len(ROWS)


def test_multiple_choice_on_the_fake_equals_direct_scores(tasks: Path) -> None:
    results = evaluate("provider=fake", ["tiny_mc"], tasks)["results"]["tiny_mc"]
    acc, acc_norm = asyncio.run(expected_accuracy(FakeProvider()))
    assert (results["acc,none"], results["acc_norm,none"]) == (pytest.approx(acc), pytest.approx(acc_norm))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_every_request_kind_on_llamacpp_equals_direct_calls(
    arch: str, tasks: Path, tiny_models: dict[str, Any]
) -> None:
    if not LlamaCppProvider.supports_scoring:
        pytest.skip("the llamacpp provider cannot score yet (supports_scoring is False)")
    model = tiny_models[arch]  # qwen2 has a chat template (generation goes through it on both paths), llama none
    adapter = model.adapter_dirs["a1"]
    arguments = f"provider=llamacpp,model_path={model.gguf_path},n_ctx=256,kv_cache_type=f32,adapter={adapter}"
    output = evaluate(arguments, ["tiny_mc", "tiny_pages", "tiny_answers"], tasks)
    results, samples = output["results"], output["samples"]

    async def direct() -> tuple[tuple[float, float], float, list[str]]:
        async with LlamaCppProvider(model_path=model.gguf_path, n_ctx=256, kv_cache_type="f32") as provider:
            await provider.load_adapter("a1", adapter)
            accuracy = await expected_accuracy(provider, "a1")
            rolling = await provider.score_rolling(PAGES[0]["page"], "", "a1")
            texts = []
            for row in ANSWERS:
                result = await provider.generate(
                    row["question"], "", "a1", max_tokens=6, temperature=0, stop=["\n", "Q:"]
                )
                texts.append(result.text)
            return accuracy, rolling.logprob, texts

    (acc, acc_norm), logprob, texts = asyncio.run(direct())
    assert results["tiny_mc"]["acc,none"] == pytest.approx(acc)
    assert results["tiny_mc"]["acc_norm,none"] == pytest.approx(acc_norm)
    words = len(re.split(r"\s+", PAGES[0]["page"]))
    assert results["tiny_pages"]["word_perplexity,none"] == pytest.approx(math.exp(-logprob / words), rel=1e-6)
    answered = {sample["doc"]["question"]: sample["resps"][0][0] for sample in samples["tiny_answers"]}
    assert [answered[row["question"]] for row in ANSWERS] == texts


def test_transformers_and_llamacpp_give_the_same_benchmark_numbers(tasks: Path, tiny_models: dict[str, Any]) -> None:
    pytest.importorskip("peft")
    from inference.transformers_provider import TransformersProvider

    if not (LlamaCppProvider.supports_scoring and TransformersProvider.supports_scoring):
        pytest.skip("the llamacpp or transformers provider cannot score yet (supports_scoring is False)")
    model = tiny_models["qwen2"]
    adapter = model.adapter_dirs["a2"]
    on_llamacpp = evaluate(
        f"provider=llamacpp,model_path={model.gguf_path},n_ctx=256,kv_cache_type=f32,adapter={adapter}",
        ["tiny_mc", "tiny_pages"], tasks,
    )["results"]
    on_transformers = evaluate(
        f"provider=transformers,model_name={model.hf_dir},torch_dtype=float32,adapter={adapter}",
        ["tiny_mc", "tiny_pages"], tasks,
    )["results"]
    for metric in ("acc,none", "acc_norm,none"):
        assert on_transformers["tiny_mc"][metric] == on_llamacpp["tiny_mc"][metric]
    perplexity = on_llamacpp["tiny_pages"]["word_perplexity,none"]
    assert on_transformers["tiny_pages"]["word_perplexity,none"] == pytest.approx(perplexity, rel=1e-3)


def test_the_adapter_changes_lm_eval_scores(tiny_models: dict[str, Any]) -> None:
    if not LlamaCppProvider.supports_scoring:
        pytest.skip("the llamacpp provider cannot score yet (supports_scoring is False)")
    model = tiny_models["qwen2"]
    common: dict[str, Any] = {
        "provider": "llamacpp", "model_path": str(model.gguf_path), "n_ctx": 256, "kv_cache_type": "f32"
    }
    request = [Instance("loglikelihood", {}, ("The sky is", " blue"), 0)]
    base = InferenceLM(**common)
    adapted = InferenceLM(**common, adapter=str(model.adapter_dirs["a1"]))
    try:
        assert adapted.adapter_id == "a1"
        [(base_logprob, _)] = base.loglikelihood(request)
        [(adapted_logprob, _)] = adapted.loglikelihood(request)
        assert base_logprob < 0 and adapted_logprob < 0
        assert adapted_logprob != pytest.approx(base_logprob, abs=1e-4)
    finally:
        base.close()
        adapted.close()


def test_empty_continuations_and_texts_score_zero_as_in_lm_eval() -> None:
    lm = InferenceLM(provider="fake")
    try:
        pairs = [Instance("loglikelihood", {}, ("Hello", ""), 0), Instance("loglikelihood", {}, ("Hello", " world"), 1)]
        empty, scored = lm.loglikelihood(pairs)
        assert empty == (0.0, True)
        assert scored[0] < 0
        texts = [Instance("loglikelihood_rolling", {}, ("",), 0), Instance("loglikelihood_rolling", {}, ("a b",), 1)]
        nothing, some = lm.loglikelihood_rolling(texts)
        assert nothing == 0.0 and some < 0
    finally:
        lm.close()


def test_a_provider_that_cannot_score_is_named(tasks: Path) -> None:
    with pytest.raises(UnsupportedOperationError, match=r"providers that can: .*llamacpp"):
        evaluate("provider=ollama,base_url=http://127.0.0.1:9", ["tiny_mc"], tasks)


def test_an_unknown_model_arg_is_a_configuration_error() -> None:
    pattern = r"n_cxt are not settings of the llamacpp provider \(did you mean n_ctx\?\); valid: .*kv_cache_type"
    with pytest.raises(ConfigurationError, match=pattern):
        InferenceLM(provider="llamacpp", model_path="base.gguf", n_cxt=512)


def test_apply_chat_template_is_refused_with_the_fix(tasks: Path) -> None:
    with pytest.raises(ConfigurationError, match="run without --apply_chat_template"):
        simple_evaluate(
            model="inference", model_args="provider=fake", tasks=["tiny_answers"], apply_chat_template=True,
            task_manager=LocalTaskManager(include_path=str(tasks)),
        )


def test_the_model_works_inside_a_running_event_loop_and_closes_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[tuple[FakeProvider, asyncio.AbstractEventLoop]] = []

    async def aclose(self: FakeProvider) -> None:
        closed.append((self, asyncio.get_running_loop()))

    monkeypatch.setattr(FakeProvider, "aclose", aclose)

    async def notebook_cell() -> list[str]:
        lm = InferenceLM(provider="fake")  # lm-eval's calls are synchronous, even under a running loop
        answers: list[str] = lm.generate_until(
            [Instance("generate_until", {}, ("Hello", {"until": ["\n"], "max_gen_toks": 4}), 0)]
        )
        lm.close()
        lm.close()  # twice is harmless
        assert [provider for provider, _ in closed] == [lm.provider]
        assert closed[0][1] is not asyncio.get_running_loop()  # closed on its own loop, not the caller's
        return answers

    [answer] = asyncio.run(notebook_cell())
    direct = asyncio.run(FakeProvider().generate("Hello", "", max_tokens=4, temperature=0, stop=["\n"]))
    assert answer == direct.text
    lm = InferenceLM(provider="fake")
    provider = lm.provider
    del lm
    gc.collect()
    assert closed[-1][0] is provider  # garbage collection closed it and stopped its loop
    assert not [thread for thread in threading.enumerate() if thread.name == "inference-lm-eval"]


def test_importing_inference_does_not_import_lm_eval_and_a_missing_lm_eval_names_the_extra() -> None:
    code = (
        "import sys, inference, inference.integrations\n"
        "assert 'lm_eval' not in sys.modules, 'lm_eval imported'\n"
        "sys.modules['lm_eval'] = None\n"
        "from inference.exceptions import MissingDependencyError\n"
        "try:\n    import inference.integrations.lm_eval\n"
        "except MissingDependencyError as error:\n    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert "pip install 'inference-adapters[lm-eval]'" in done.stdout


def test_the_command_lines_run_lm_eval(tasks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "inference", "--model_args", "provider=fake", "--tasks", "tiny_mc", "--include_path", str(tasks)]
    assert main(argv) == 0
    assert re.search(r"tiny_mc.*acc", capsys.readouterr().out)
    assert inference_main(["lm-eval", *argv]) == 0
    assert "acc" in capsys.readouterr().out


def test_lm_eval_s_default_device_never_overrides_the_provider_s(
    tasks: Path, tiny_models: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """lm-eval's command line passes device='cuda:0' when --device is left out; on a CPU-only machine that used
    to fail with "device 'cuda:0' was requested" although TRANSFORMERS_DEVICE=cpu."""
    pytest.importorskip("peft")
    import torch

    from inference.transformers_provider import TransformersProvider

    built: list[TransformersProvider] = []
    original = TransformersProvider.__init__

    def record(self: TransformersProvider, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(TransformersProvider, "__init__", record)
    model = tiny_models["qwen2"]
    common = ["--model", "inference", "--tasks", "tiny_mc", "--include_path", str(tasks)]
    base = f"provider=transformers,model_name={model.hf_dir},torch_dtype=float32"

    def run(model_args: str, *extra: str) -> tuple[int, str]:
        status = inference_main(["lm-eval", *common, "--model_args", model_args, *extra])
        return status, capsys.readouterr().err

    monkeypatch.setenv("TRANSFORMERS_DEVICE", "cpu")
    status, err = run(base)  # no --device: lm-eval's default is not a request
    assert status == 0, err
    assert built[-1].device == "cpu"

    monkeypatch.setenv("TRANSFORMERS_DEVICE", "cuda:0")  # an explicit choice wins over the environment:
    assert run(base, "--device", "cpu")[0] == 0 and built[-1].device == "cpu"  # lm-eval's --device
    assert run(f"{base},device=cpu")[0] == 0 and built[-1].device == "cpu"  # model_args (was a TypeError)

    if not torch.cuda.is_available():  # --device cuda:0 given by the user is honoured, so refused here
        monkeypatch.setenv("TRANSFORMERS_DEVICE", "cpu")
        status, err = run(base, "--device", "cuda:0")
        assert status == 1 and "device 'cuda:0' was requested but torch sees no CUDA GPU" in err


def test_lm_eval_s_own_arguments_from_python_are_the_caller_s() -> None:
    lm = InferenceLM.create_from_arg_string("provider=fake,max_concurrency=3", {"device": "cuda:0", "batch_size": 8})
    try:
        assert lm.max_concurrency == 3  # model_args win over lm-eval's batch_size
    finally:
        lm.close()
    lm = InferenceLM.create_from_arg_obj({"provider": "fake"}, {"batch_size": 5, "device": None})
    try:
        assert lm.max_concurrency == 5
    finally:
        lm.close()


@pytest.mark.parametrize(("batch_size", "expected"), [("4", 4), ("1", 1), (2, 2), ("auto", 16), ("auto:4", 16)])
def test_lm_eval_s_batch_size_from_its_command_line_is_the_concurrency(batch_size: Any, expected: int) -> None:
    """lm-eval's command line passes ``--batch_size 4`` as the text "4": it was ignored (16 requests at once). An
    explicit ``max_concurrency=None`` is the default too."""
    lm = InferenceLM.create_from_arg_obj({"provider": "fake", "max_concurrency": None},
                                         {"batch_size": batch_size, "device": None})
    try:
        assert lm.max_concurrency == expected
    finally:
        lm.close()


@pytest.mark.parametrize("concurrency", [0, -1, "many", 2.5])
def test_a_max_concurrency_below_1_or_not_a_number_is_refused(concurrency: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_concurrency must be a whole number of at least 1"):
        InferenceLM(provider="fake", max_concurrency=concurrency)


def test_generation_reads_lm_eval_s_other_names_for_the_token_limit_and_skips_empty_stops() -> None:
    """lm-eval reads max_new_tokens, max_tokens and max_completion_tokens as max_gen_toks (in this order) and its hf
    model cuts at no empty until string: a task giving them got 256 tokens, and an empty stop, here."""
    lm = InferenceLM(provider="fake")
    try:
        cases = [({"until": ["", "\n"], "max_new_tokens": 3}, 3), ({"max_tokens": 5, "max_completion_tokens": 2}, 5),
                 ({"max_completion_tokens": 2, "max_new_tokens": None}, 2), ({"until": "", "max_gen_toks": 4}, 4)]
        answers = lm.generate_until([Instance("generate_until", {}, ("Hello there", kwargs), 0) for kwargs, _ in cases])
    finally:
        lm.close()
    for answer, (kwargs, limit) in zip(answers, cases, strict=True):
        stop = [text for text in kwargs.get("until", []) if text] or None
        direct = asyncio.run(FakeProvider().generate("Hello there", "", max_tokens=limit, temperature=0, stop=stop))
        assert answer == direct.text and direct.completion_tokens == limit, kwargs


def test_generation_passes_on_every_gen_kwarg_that_is_an_option_of_the_sdk(caplog: pytest.LogCaptureFixture) -> None:
    """min_p, presence_penalty and frequency_penalty were dropped with a warning that they are "not generation options
    of the SDK" (they are): a task that set them generated as if it had not. Only a key that is no option is warned
    about; a ``stop`` adds to ``until``."""
    penalties = {"min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5}
    options: dict[str, Any] = {"max_tokens": 8, "temperature": 0.7, "seed": 1, "stop": ["\n"]}
    direct = asyncio.run(FakeProvider().generate("Q", "", **options, **penalties))
    without = asyncio.run(FakeProvider().generate("Q", "", **options))
    stop = " " + without.text.split()[3]  # a word of the answer: cut there
    gen_kwargs = {"until": ["\n"], "max_gen_toks": 8, "temperature": 0.7, "seed": 1}
    lm = InferenceLM(provider="fake")
    try:
        with caplog.at_level(logging.WARNING, logger="inference"):
            answers = lm.generate_until([
                Instance("generate_until", {}, ("Q", {**gen_kwargs, **penalties, "typical_p": 0.9}), 0),
                Instance("generate_until", {}, ("Q", {**gen_kwargs, "stop": stop}), 1),
            ])
    finally:
        lm.close()
    assert answers[0] == direct.text != without.text
    assert answers[1] == without.text[: without.text.index(stop)]
    warnings = [record.getMessage() for record in caplog.records if "gen_kwargs" in record.getMessage()]
    assert warnings == ["lm-eval gen_kwargs ['typical_p'] are not generation options of the SDK; ignored"]


def test_adapter_dot_loads_the_current_directory_under_its_name(
    tiny_models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter_dir: Path = tiny_models["qwen2"].adapter_dirs["a0"]
    monkeypatch.chdir(adapter_dir)
    lm = InferenceLM(provider="fake", adapter=".")
    try:
        assert lm.adapter_id == adapter_dir.name
        assert adapter_dir.name in asyncio.run(lm.provider.list_adapters())
    finally:
        lm.close()


def test_registering_the_model_keeps_lm_eval_s_own_models() -> None:
    """Imported first, as the docs show it, the integration left lm-eval's registry holding "inference" alone: lm-eval
    fills it only while it is empty, so ``--model hf`` (to compare with PEFT in one process) was not found."""
    code = (
        "import inference.integrations.lm_eval\n"
        "from lm_eval.api.registry import get_model\n"
        "print(get_model('hf').__name__, get_model('dummy').__name__, get_model('inference').__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["HFLM", "DummyLM", "InferenceLM"]
