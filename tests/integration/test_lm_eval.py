"""lm-eval-harness on the SDK's providers: the model ``inference``, local tasks, numbers checked against direct calls.

The tasks are YAML files over JSONL rows written here (no downloads): a multiple-choice task (``loglikelihood``),
a perplexity task (``loglikelihood_rolling``) and a short-answer task (``generate_until``).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lm_eval")

from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

from inference.cli import main as inference_main
from inference.exceptions import ConfigurationError
from inference.fake_provider import FakeProvider
from inference.integrations.lm_eval import InferenceLM, main
from inference.llamacpp_provider import LlamaCppProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

ROWS = [
    {"question": "The sky is", "choices": [" blue", " green", " loud"], "label": 0},
    {"question": "Two plus two is", "choices": [" four", " five", " a chair"], "label": 0},
    {"question": "The fox jumps over the", "choices": [" dog", " moon", " seven"], "label": 0},
    {"question": "Water is", "choices": [" dry", " wet", " angry"], "label": 1},
    {"question": "Once upon a", "choices": [" time", " table"], "label": 0},
    {"question": "Hello,", "choices": [" world", " hello again and goodbye"], "label": 0},
]
PAGES = [{"page": "the quick brown fox jumps over the lazy dog and the village had three bakeries"}]
ANSWERS = [{"question": "Q: The quick brown fox", "answer": "jumps"}, {"question": "Q: Hello, world", "answer": "!"}]


@pytest.fixture
def tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
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
        task_manager=TaskManager(include_path=str(include)), log_samples=True,
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


def test_every_request_kind_on_llamacpp_equals_direct_calls(tasks: Path, tiny_models: dict[str, Any]) -> None:
    model = tiny_models["llama"]  # no chat template: lm-eval's prompts are plain text on both paths
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


def test_a_provider_that_cannot_score_is_named(tasks: Path) -> None:
    with pytest.raises(Exception, match="providers that can"):
        evaluate("provider=ollama,base_url=http://127.0.0.1:9", ["tiny_mc"], tasks)


def test_an_unknown_model_arg_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"n_cxt are not settings of the llamacpp provider"):
        InferenceLM(provider="llamacpp", model_path="base.gguf", n_cxt=512)


def test_the_command_lines_run_lm_eval(tasks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "inference", "--model_args", "provider=fake", "--tasks", "tiny_mc", "--include_path", str(tasks)]
    assert main(argv) == 0
    assert "tiny_mc" in capsys.readouterr().out
    assert inference_main(["lm-eval", *argv]) == 0
    assert "acc" in capsys.readouterr().out
