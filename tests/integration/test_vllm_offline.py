"""The ``vllm-offline`` provider (vLLM's engine in process, CPU build) against Transformers + PEFT.

vLLM pins its own transformers, so the provider runs in ``.venv-vllm``: ``vllm_offline_scenario.py`` drives it once
per session through a scenario on the head-64 tiny Qwen2 and its adapters, and these tests compare what it saw with
the Transformers provider on the same directory and adapters, here. They agree on greedy tokens and logprobs to about
1e-6 nats; the tolerance is 1e-3.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import pytest_asyncio

from inference.transformers_provider import TransformersProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

SCENARIO = Path(__file__).with_name("vllm_offline_scenario.py")
PROMPTS = ["the quick brown fox", "Once upon a time there was", "numbers 1 2 3 and"]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
SCORE_PAIRS = [
    ("the quick brown fox", " jumps over the dog"),
    ("", "Hello, world"),
    ("Answer: yes", "<|im_end|>"),  # special-token text is that token (one), as on Transformers
    ("The cafe\u0301 by the sea", " re\u0301sume\u0301"),  # "e" + U+0301: Qwen's tokenizer composes to NFC
]


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    """The Python of ``.venv-vllm`` (a skip without it, a failure where ``INFERENCE_REQUIRE_VLLM=1``)."""
    python = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    if not python.is_file():
        message = f"vLLM's venv {python.parent.parent} is missing: run `make vllm-venv`"
        if os.environ.get("INFERENCE_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory, vllm_python: Path) -> dict[str, Any]:
    """What the offline provider did in the scenario (its JSON), run once in ``.venv-vllm``."""
    python = vllm_python
    from inference.testing.vllm_model import build_vllm_model, vllm_environment

    build_vllm_model()  # built here, with this venv's transformers, before the scenario reads it
    directory = tmp_path_factory.mktemp("vllm-offline")
    out, log = directory / "seen.json", directory / "scenario.log"
    environment = vllm_environment(
        {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(directory / "hub")}
    )
    with log.open("wb") as sink:
        finished = subprocess.run(
            [str(python), str(SCENARIO), str(out)], stdout=sink, stderr=subprocess.STDOUT, env=environment,
            timeout=1800, check=False,  # a bound (this file took 11 min here at load average 15)
        )
    if finished.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-6000:]
        pytest.fail(f"the vllm-offline scenario failed ({finished.returncode}); its output ends:\n{tail}")
    seen: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return seen


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def local() -> AsyncIterator[TransformersProvider]:
    from inference.testing.vllm_model import build_vllm_model

    model = build_vllm_model()
    provider = TransformersProvider(model_name=str(model.hf_dir), torch_dtype="float32")
    for adapter_id in ("a0", "a1", "a2"):
        await provider.load_adapter(adapter_id, model.adapter_dirs[adapter_id])
    yield provider
    await provider.aclose()


def _agree(theirs: dict[str, Any], ours: Any) -> None:
    """Greedy generations agree: the same token ids, logprobs and alternatives within 1e-3 nats."""
    assert ours.logprobs is not None
    assert theirs["tokens"] == [entry.token_id for entry in ours.logprobs]
    assert theirs["logprobs"] == pytest.approx([entry.logprob for entry in ours.logprobs], abs=1e-3)
    for values, entry in zip(theirs["top"], ours.logprobs, strict=True):
        assert values == pytest.approx([value for _, value in entry.top_logprobs], abs=1e-3)
    assert theirs["prompt_tokens"] == ours.prompt_tokens  # the same prompt rule: the same tokens read


@pytest.mark.parametrize("adapter_id", [None, "a0", "a1"])
async def test_greedy_tokens_and_logprobs_match_transformers(
    seen: dict[str, Any], local: TransformersProvider, adapter_id: str | None
) -> None:
    for prompt in PROMPTS:
        ours = await local.generate(prompt, model="tiny", adapter_id=adapter_id, max_tokens=8, temperature=0,
                                    logprobs=2)
        _agree(seen["greedy"][f"{adapter_id}|{prompt}"], ours)
    texts = {seen["greedy"][f"{adapter_id}|{PROMPTS[0]}"]["text"] for adapter_id in (None, "a0", "a1")}
    assert len(texts) == 3  # each adapter changes the answer


async def test_64_concurrent_mixed_adapter_requests_equal_their_single_answers(seen: dict[str, Any]) -> None:
    # As on the server: batched CPU kernels round differently from a lone request, so greedy decoding may take the
    # other branch only where the two best tokens are within rounding of each other.
    concurrent = seen["concurrent"]
    equal = 0
    for key, result in zip(concurrent["work"], concurrent["results"], strict=True):
        alone = concurrent["single"][key]
        if result["tokens"] == alone["tokens"]:
            equal += 1
            continue
        first = next(i for i, (a, b) in enumerate(zip(result["tokens"], alone["tokens"], strict=True)) if a != b)
        best, second = alone["top"][first][:2]
        assert best - second < 1e-2, (key, first, best - second)
    assert equal >= 48


async def test_a_stream_gives_the_generation_piece_by_piece(seen: dict[str, Any]) -> None:
    stream = seen["stream"]
    assert len(stream["pieces"]) > 1
    assert "".join(stream["pieces"]) == stream["final"]["text"] == stream["whole"]["text"]
    assert stream["final"]["completion_tokens"] == stream["whole"]["completion_tokens"] == 12


async def test_cancelling_a_stream_or_a_generation_stops_the_engine_s_request(seen: dict[str, Any]) -> None:
    cancel = seen["cancel"]
    assert cancel["first_piece"] and cancel["running_mid_stream"] == 1
    assert cancel["running_after_stream"] == 0  # aborted in the engine, not left generating 400 tokens
    assert cancel["generate_cancelled"] is True  # cancelled while the engine held it (paused): it could not finish
    assert cancel["running_after"] == 0
    # A request the engine aborted (not its caller) fails; it used to come back as an answer, finish_reason "stop".
    assert cancel["aborted"]["type"] == "ProviderError" and "aborted" in cancel["aborted"]["message"]
    assert cancel["after"]["tokens"] == seen["greedy"][f"a1|{PROMPTS[0]}"]["tokens"]  # and it still works


async def test_the_adapter_lifecycle(seen: dict[str, Any], local: TransformersProvider) -> None:
    lifecycle = seen["lifecycle"]
    assert lifecycle["listed_before"] == lifecycle["listed_after"] == ["a0", "a1"]
    ours = await local.generate(PROMPTS[0], model="tiny", adapter_id="a2", max_tokens=8, temperature=0, logprobs=2)
    _agree(lifecycle["a2"], ours)
    assert lifecycle["after_unload"]["type"] == "AdapterNotFoundError"


@pytest.mark.parametrize("adapter_id", [None, "a1"])
async def test_scores_match_transformers(
    seen: dict[str, Any], local: TransformersProvider, adapter_id: str | None
) -> None:
    for context, continuation in SCORE_PAIRS:
        logprob, count, greedy = seen["scores"][f"{adapter_id}|{context}|{continuation}"]
        ours = await local.score(context, continuation, model="tiny", adapter_id=adapter_id)
        assert count == ours.num_tokens and greedy == ours.is_greedy
        assert abs(logprob - ours.logprob) / count < 1e-3
    text = "the quick brown fox jumps over the lazy dog. " * 10
    logprob, count, _ = seen["scores"][f"{adapter_id}|rolling"]
    ours = await local.score_rolling(text, model="tiny", adapter_id=adapter_id)
    assert count == ours.num_tokens
    assert abs(logprob - ours.logprob) / count < 1e-3


async def test_json_schema_output_validates(seen: dict[str, Any]) -> None:
    assert seen["json"]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(seen["json"]["text"]), SCHEMA)


async def test_request_options_give_transformers_tokens(seen: dict[str, Any], local: TransformersProvider) -> None:
    """logit_bias, the penalties, min_p, n, raw prompts, template overrides, thinking (the template's
    enable_thinking) and TokenIds prompts on vLLM's engine give the token ids Transformers gives for the same
    adapter."""
    options = seen["options"]
    for name, case in options.items():
        if case["extra"] is None:
            continue
        ours = await local.generate("numbers 1 2 3 and", model="tiny", adapter_id="a0", max_tokens=12,
                                    return_token_ids=True, **{"temperature": 0, **case["extra"]})
        assert case["ids"] == list(ours.token_ids or ()), name
        assert case["choices"] == len(ours.choices or (ours,)), name
    greedy = options["greedy"]["ids"]
    assert len(set(greedy)) < len(greedy)  # the penalties have a repetition to act on
    for name in ("banned", "presence", "frequency"):
        assert options[name]["ids"] != greedy, name
    assert greedy[0] not in options["banned"]["ids"] and set(options["forced"]["ids"]) == {greedy[0]}
    assert options["min_p"]["ids"] == greedy and options["n"]["texts"] == [options["greedy"]["texts"][0]]
    assert options["raw"]["ids"] == options["template"]["ids"] == options["token_prompt"]["ids"]
    assert options["thinking"]["ids"] != options["template"]["ids"]  # "No thinking. " went into the prompt



async def test_n_sampled_with_a_seed_gives_the_choices_of_single_requests_counted_with_the_prompt_once(
    seen: dict[str, Any],
) -> None:
    """vLLM's own n on its engine: the children of one request seeded seed + k are the single requests with those
    seeds; the prompt counted once, the completions summed."""
    case = seen["n_sampled"]
    assert case["texts"] == case["again"] == case["singles"] and len(set(case["texts"])) == 3
    assert case["choice_counts"] == case["single_counts"]
    prompt = case["single_counts"][0][0]
    completion = sum(count for _, count in case["single_counts"])
    assert case["counts"] == [prompt, completion, prompt + completion]


async def test_a_forced_tool_call_is_transformers_call(seen: dict[str, Any], local: TransformersProvider) -> None:
    """A forced call on vLLM's engine (the tools rendered by the chat template, the call constrained by vLLM's
    structured outputs) is a valid call, token for token the one Transformers makes (llguidance)."""
    from vllm_offline_scenario import OPTION_PROMPT, TOOL_REQUEST

    seen_call = seen["tool_call"]
    assert seen_call["finish_reason"] == "tool_calls" and seen_call["text"] == ""
    ((name, arguments, error),) = seen_call["calls"]
    assert (name, error) == ("time", None) and arguments["zone"] in ("CET", "UTC")
    ours = await local.generate([{"role": "user", "content": OPTION_PROMPT}], model="tiny", adapter_id="a0",
                                max_tokens=60, temperature=0, return_token_ids=True, **TOOL_REQUEST)
    eos = (await local.token_vocabulary("tiny")).eos_ids
    theirs = seen_call["ids"][:-1] if seen_call["ids"] and seen_call["ids"][-1] in eos else seen_call["ids"]
    assert theirs == list(ours.token_ids or ())  # vLLM's grammar ends on the EOS token, which it counts
    assert ours.tool_calls is not None and ours.tool_calls[0].arguments == arguments


async def test_tokenize_detokenize_and_the_vocabulary_are_transformers(
    seen: dict[str, Any], local: TransformersProvider
) -> None:
    vocabulary = seen["vocabulary"]
    ours = await local.token_vocabulary("tiny")
    assert vocabulary["size"] == ours.size and [bytes.fromhex(piece) for piece in vocabulary["bytes"]] == list(
        ours.token_bytes
    )
    assert vocabulary["ids"] == await local.tokenize("numbers 1 2 3 and", "tiny")
    assert vocabulary["text"] == "numbers 1 2 3 and"



async def test_next_token_distributions_are_transformers(seen: dict[str, Any], local: TransformersProvider) -> None:
    """Full distributions from vLLM's engine (every token's logprob, the engine at max_logprobs=-1), batched with an
    adapter and alone on the base model, equal Transformers' rows within 1e-4 per entry."""
    import numpy as np

    ids = seen["vocabulary"]["ids"]
    theirs = np.asarray(seen["next_token"]["a0"], dtype=np.float32)
    ours = await local.batch_next_token_logprobs([ids, ids[:3]], "tiny", "a0")
    assert theirs.shape == ours.shape and float(np.abs(theirs - ours).max()) < 1e-4
    base = np.asarray(seen["next_token"]["base"], dtype=np.float32)
    assert float(np.abs(base - await local.next_token_logprobs(ids, "tiny")).max()) < 1e-4
    assert abs(float(np.logaddexp.reduce(base.astype(np.float64)))) < 1e-4


async def test_bad_input_is_a_typed_error_and_the_provider_goes_on(seen: dict[str, Any]) -> None:
    errors = seen["errors"]
    assert errors["missing_adapter"]["type"] == "InvalidAdapterError"
    assert errors["rank_too_large"]["type"] == "InvalidAdapterError"
    assert "VLLM_OFFLINE_MAX_LORA_RANK" in errors["rank_too_large"]["message"]
    assert errors["prompt_too_long"]["type"] == "TokenLimitError"  # an InvalidRequestError of kind "context"
    assert "max_model_len of 512" in errors["prompt_too_long"]["message"]
    assert errors["max_tokens_too_large"]["type"] == "InvalidRequestError"
    assert "ask for at most" in errors["max_tokens_too_large"]["message"]
    for refused in ("temperature_refused", "temperature_refused_streamed"):  # vLLM's own VLLMValidationError
        assert errors[refused]["type"] == "InvalidRequestError", errors[refused]
    assert errors["seed_too_large"]["type"] == "InvalidRequestError"  # was "the engine failed", with no reason
    assert "signed 64-bit" in errors["seed_too_large"]["message"]
    assert errors["whole_context_distribution"]["type"] == "TokenLimitError"  # no room for the one token it generates
    assert errors["listed"] == ["a0", "a1"]  # failed loads left nothing behind
    assert errors["after"]["tokens"] == seen["greedy"][f"a0|{PROMPTS[0]}"]["tokens"]


async def test_a_hub_id_loads_offline_from_the_cache_with_engine_arguments_from_a_step_config(
    seen: dict[str, Any],
) -> None:
    """``model_name="ORG/NAME"`` in a step config loads the model from the Hugging Face cache with HF_HUB_OFFLINE=1
    and answers as the directory does; the step's ``engine_args`` reach vLLM's engine; a Hub id not cached is a
    ModelLoadError saying so, before the engine starts."""
    hub = seen["hub"]
    assert hub["greedy"]["tokens"] == seen["greedy"][f"None|{PROMPTS[0]}"]["tokens"]
    assert hub["greedy"]["text"] == seen["greedy"][f"None|{PROMPTS[0]}"]["text"]
    assert hub["max_num_seqs"] == 4
    assert hub["same_provider"]  # a mapping and its JSON text are one setting
    assert hub["not_cached"]["type"] == "ModelLoadError"
    assert "not in the local Hugging Face cache" in hub["not_cached"]["message"]


async def test_base_requests_in_a_step_with_adapters_filling_every_slot_are_the_base_model(
    seen: dict[str, Any],
) -> None:
    """With every one of the ``max_loras`` slots filled by an adapter, base-model requests (a generation, a score, a
    next-token distribution) in the same engine step answer as the base model alone. vLLM's CPU kernels read a
    request without an adapter from the last slot: they answered with the adapter's output."""
    import numpy as np

    case = seen["base_mixed"]
    assert case["a0"] != case["alone"]["ids"]  # the adapter changes the answer
    assert case["mixed"]["ids"] == case["alone"]["ids"] and case["a0_mixed"] == case["a0"]
    assert case["mixed"]["score"] == pytest.approx(case["alone"]["score"], abs=1e-3)
    assert float(np.abs(np.asarray(case["mixed"]["next"]) - np.asarray(case["alone"]["next"])).max()) < 1e-3
    assert case["listed"] == ["a0"]  # the base model's own adapter is not one of the provider's


async def test_an_adapter_for_another_base_model_is_refused_and_a_failed_replace_keeps_the_old_one(
    seen: dict[str, Any],
) -> None:
    """An adapter whose matrices do not fit the model's layers (vLLM registered it and served garbage) is an
    InvalidAdapterError naming the layer; as a replacement it leaves the adapter that was loaded serving."""
    checks = seen["adapter_checks"]
    for case in ("other_base", "replaced"):
        assert checks[case]["type"] == "InvalidAdapterError", checks[case]
        assert "trained for another base model" in checks[case]["message"]
        assert "does not fit" in checks[case]["message"]
    assert checks["listed"] == ["a0"] and checks["a0_kept"]


async def test_sampling_settings_a_request_leaves_unset_are_the_model_s(seen: dict[str, Any]) -> None:
    """A request without a temperature decodes greedily on a model whose generation config has no ``do_sample``
    (Transformers' rule), and samples with the model's own settings where it has one (here ``top_k=1``: the greedy
    tokens, whatever the seed). vLLM's defaults (temperature 1, every token) sampled at random instead."""
    greedy = seen["greedy"][f"None|{PROMPTS[0]}"]["tokens"]
    assert seen["unset_temperature"] == greedy
    assert seen["hub"]["model_sampling"] == seen["hub"]["greedy"]["tokens"] == greedy


async def test_the_generation_config_s_end_tokens_are_transformers(seen: dict[str, Any]) -> None:
    """On a model whose generation config lists an end token besides the tokenizer's (``[2, 0]``, as Qwen2.5
    Instruct's; Gemma 3's and Llama 3.1 Instruct's do too), the vocabulary's ``eos_ids`` and a generation that stops
    on the other one are Transformers': the end token is not in ``token_ids`` nor in the logprobs. They were the
    tokenizer's EOS alone, and ``(0,)`` with its logprob."""
    from inference import TokenIds

    end = seen["hub"]["end"]
    local = TransformersProvider(model_name=seen["hub"]["directory"], torch_dtype="float32")
    async with local:
        ours = await local.generate(TokenIds([15, 200, 31]), model="tiny", max_tokens=4, temperature=0, logprobs=0,
                                    logit_bias={0: 100}, return_token_ids=True)
        assert end["eos_ids"] == list((await local.token_vocabulary("tiny")).eos_ids) == [2, 0]
    assert end["ids"] == list(ours.token_ids or ()) == [] and end["logprobs"] == len(ours.logprobs or ()) == 0
    assert end["finish_reason"] == ours.finish_reason == "stop" and end["text"] == ours.text == ""
    assert end["completion_tokens"] == ours.completion_tokens == 1  # the end token is counted, as generated


async def test_the_engine_starts_off_the_event_loop_and_closes(seen: dict[str, Any]) -> None:
    # A ticker on the event loop ran while vLLM loaded the model (a start that blocked the loop leaves it at 0);
    # not a rate: how many 50 ms sleeps fit in the start depends on the machine's load.
    assert seen["ticks_during_start"] >= 2
    # A request the engine still held when the provider closed fails with a ProviderError, never hangs or passes.
    assert seen["closed_in_flight"]["type"] == "ProviderError"
    assert "closed while the request ran" in seen["closed_in_flight"]["message"]
    assert seen["closed"]["type"] == "ProviderError" and "closed" in seen["closed"]["message"]



PLAIN_SCRIPT = """
import asyncio
import sys

from inference.vllm_offline_provider import VLLMOfflineProvider

provider = VLLMOfflineProvider(model_name=sys.argv[1], dtype="float32", max_model_len=512)


async def main():
    result = await provider.generate("the quick brown fox", model="tiny", max_tokens=4, temperature=0)
    print("generated", result.completion_tokens, "tokens")
    await provider.aclose()


asyncio.run(main())
print("closed")
"""
"""A user's script without ``if __name__ == "__main__":``: the provider built and used at top level."""


async def test_a_plain_script_without_a_main_guard_runs_and_closes_without_a_word(
    vllm_python: Path, tmp_path: Path
) -> None:
    from inference.testing.vllm_model import build_vllm_model, vllm_environment

    model = build_vllm_model()
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SCRIPT, encoding="utf-8")
    environment = vllm_environment({"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})
    finished = await asyncio.to_thread(
        subprocess.run, [str(vllm_python), str(script), str(model.hf_dir)], capture_output=True, text=True,
        env=environment, cwd=tmp_path, timeout=900, check=False,
    )
    output = finished.stdout + finished.stderr  # vLLM logs to stdout
    assert finished.returncode == 0, output[-6000:]
    assert "generated 4 tokens" in finished.stdout and finished.stdout.rstrip().endswith("closed")
    # vLLM's own INFO and WARNING lines stay; no error, traceback or warning about what the close left behind
    for sign in ("Traceback", "ERROR", "Error:", "Exception ignored", "leaked"):
        assert sign not in output, output[-6000:]
