"""genlm-control on the SDK: ``AsyncInferenceLM`` is a genlm-backend ``AsyncLM`` over a provider.

genlm-control's own examples (a regex potential and a JSON-schema potential, sampled by sequential Monte Carlo
with AWRS) run end to end through ``PromptedLLM(..., lora_name=...)``; genlm-control's own consistency checks of a
``PromptedLLM`` hold on it; and each ``AsyncLM`` method maps onto the provider (lifecycle included). On the fake
provider here; the backends plug in the same way.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("genlm.control")

import torch
from genlm.backend.llm import AsyncLM
from genlm.control import AWRS, BoolFSA, JsonSchema, PromptedLLM

from inference.exceptions import AdapterNotFoundError, InvalidRequestError, UnsupportedOperationError
from inference.fake_provider import FakeProvider
from inference.integrations.genlm import AsyncInferenceLM, VocabularyTokenizer
from inference.provider import InferenceProvider
from inference.sync import run_sync

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # genlm's notice that a regex uses few of the vocabulary
]


async def test_a_regex_smc_run_of_the_genlm_control_readme_on_an_adapter() -> None:
    provider = FakeProvider()
    await provider.load_adapter("style", "/adapters/style")
    llm = PromptedLLM(await AsyncInferenceLM.create(provider, "m"), lora_name="style")
    llm.set_prompt_from_str("Here is my honest opinion:")
    fsa = BoolFSA.from_regex(r" SMC is (great|fun|fast) with LMs").coerce(llm, f=b"".join)
    np.random.seed(0)  # genlm-control resamples with numpy's global generator
    sequences = await AWRS(llm, fsa, seed=0).smc(n_particles=10, ess_threshold=0.5, max_tokens=40)
    posterior = sequences.decoded_posterior
    assert posterior, "every particle died"
    assert all(re.fullmatch(r" SMC is (great|fun|fast) with LMs", text) for text in posterior), posterior
    assert abs(sum(posterior.values()) - 1) < 1e-6
    stats = provider.adapter_stats().get("style")
    assert stats is not None and stats.last_used is not None  # lora_name reached the adapter
    cache = provider.cache_stats()
    assert cache.hits > 10 * cache.misses and cache.reused_tokens > 10 * cache.computed_tokens


async def test_a_json_schema_smc_run_gives_valid_json() -> None:
    provider = FakeProvider()
    llm = PromptedLLM(await AsyncInferenceLM.create(provider, "m"))
    llm.set_prompt_from_str("A pet as JSON:")
    schema = {
        "type": "object",
        "properties": {"pet": {"enum": ["cat", "dog"]}},
        "required": ["pet"],
        "additionalProperties": False,
    }
    np.random.seed(0)
    sequences = await AWRS(llm, JsonSchema(schema).coerce(llm, f=b"".join), seed=0).smc(
        n_particles=10, ess_threshold=0.5, max_tokens=30
    )
    posterior = sequences.decoded_posterior
    assert posterior, "every particle died"
    assert all(json.loads(text)["pet"] in ("cat", "dog") for text in posterior), posterior


async def test_genlm_controls_own_consistency_checks_hold_on_a_prompted_llm_over_the_provider() -> None:
    provider = FakeProvider()
    await provider.load_adapter("style", "/adapters/style")
    llm = PromptedLLM(await AsyncInferenceLM.create(provider, "m"), lora_name="style", temperature=0.8)
    llm.set_prompt_from_str("Hello")
    contexts = [llm.tokenize(" world"), llm.tokenize("!"), llm.tokenize(" there, you")]
    await llm.assert_contract(contexts, rtol=1e-3, atol=1e-4)
    spawned = llm.spawn_new_eos(eos_byte_strings=[b"!", b"?"])
    await spawned.assert_contract(contexts[:1], rtol=1e-3, atol=1e-4)


async def test_each_async_lm_call_is_the_providers() -> None:
    provider = FakeProvider()
    await provider.load_adapter("style", "/adapters/style")
    llm = await AsyncInferenceLM.create(provider, "m")
    assert isinstance(llm, AsyncLM)
    vocabulary = await provider.token_vocabulary("m")
    assert [token.token_id for token in llm.byte_vocab] == list(range(vocabulary.size))
    assert [bytes(token) for token in llm.byte_vocab] == list(vocabulary.token_bytes)
    ids = [vocabulary.bos_id, *await provider.tokenize("Hi", "m")]

    row = await llm.next_token_logprobs(ids, lora_name="style")
    assert isinstance(row, torch.Tensor) and row.dtype == torch.float32 and row.shape == (vocabulary.size,)
    np.testing.assert_array_equal(row.numpy(), await provider.next_token_logprobs(ids, "m", adapter_id="style"))
    rows = await llm.batch_next_token_logprobs([ids, ids[:2]])
    assert rows.shape == (2, vocabulary.size)
    np.testing.assert_array_equal(rows[1].numpy(), await provider.next_token_logprobs(ids[:2], "m"))
    # the _sync variants, from inside a running event loop (as in Jupyter)
    torch.testing.assert_close(llm.next_token_logprobs_sync(ids, lora_name="style"), row, rtol=0, atol=0)
    torch.testing.assert_close(llm.batch_next_token_logprobs_sync([ids, ids[:2]]), rows, rtol=0, atol=0)
    with pytest.raises(ValueError, match="token_ids is empty"):  # as genlm-backend: an error, a ValueError
        await llm.next_token_logprobs([])
    with pytest.raises(AdapterNotFoundError):
        await llm.next_token_logprobs(ids, lora_name="nope")

    first = await llm.sample(ids, max_tokens=12, eos_token_ids=[2], temperature=0.7, seed=80808, lora_name="style")
    again = await llm.sample(ids, max_tokens=12, eos_token_ids=[2], temperature=0.7, seed=80808, lora_name="style")
    assert first == again and 0 < len(first) <= 12 and 2 not in first
    batch = await llm.batch_sample([ids, ids[:2]], max_tokens=5, eos_token_ids=[], temperature=1.0)
    assert [len(sample) for sample in batch] == [5, 5]

    llm.clear_cache()
    assert provider.cache_stats().cached_tokens == 0


async def test_the_stand_in_tokenizer_has_what_genlm_reads() -> None:
    provider = FakeProvider()
    llm = await AsyncInferenceLM.create(provider, "m")
    tokenizer = llm.tokenizer
    assert isinstance(tokenizer, VocabularyTokenizer)
    assert (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.eos_token) == (2, 1, "<eos>")
    assert tokenizer.encode("Hi<eos>") == await provider.tokenize("Hi<eos>", "m")  # the fake adds no BOS
    assert tokenizer.decode(tokenizer.encode("Hé<eos>"), skip_special_tokens=True) == "Hé"
    assert len(tokenizer) == 259 and tokenizer.convert_ids_to_tokens([75, 2]) == ["H", "<eos>"]


def test_add_new_lora_and_remove_lora_go_through_the_adapter_lifecycle() -> None:
    provider = FakeProvider()
    llm = AsyncInferenceLM(provider, "m")  # built outside any event loop: the vocabulary through run_sync
    ids = [1, 75, 108]
    llm.add_new_lora("/adapters/one", "style")
    first = llm.next_token_logprobs_sync(ids, lora_name="style")
    llm.add_new_lora("/adapters/two", "style")  # the same name again: genlm-backend replaces the weights
    second = llm.next_token_logprobs_sync(ids, lora_name="style")
    assert not torch.equal(first, second)
    stats = provider.adapter_stats().get("style")
    assert stats is not None and stats.replacements == 1
    llm.remove_lora("style")
    assert run_sync(provider.list_adapters()) == []
    with pytest.raises(AdapterNotFoundError):
        llm.next_token_logprobs_sync(ids, lora_name="style")
    with pytest.raises(InvalidRequestError):
        llm.next_token_logprobs_sync([1, 999])


def test_the_sync_calls_work_from_a_plain_script() -> None:
    code = textwrap.dedent(
        """
        from inference import FakeProvider
        from inference.integrations.genlm import AsyncInferenceLM
        llm = AsyncInferenceLM(FakeProvider(), "m")
        row, rows = llm.next_token_logprobs_sync([1, 75]), llm.batch_next_token_logprobs_sync([[1]])
        print(tuple(row.shape), tuple(rows.shape))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert result.stdout.strip() == "(259,) (1, 259)", result.stderr


def test_a_provider_without_next_token_distributions_is_refused_naming_who_can() -> None:
    class Plain(InferenceProvider):
        name = "plain"

        async def _generate(self, request):  # type: ignore[no-untyped-def]
            raise AssertionError("never reached")

    with pytest.raises(UnsupportedOperationError, match=r"genlm-control.*providers that can: .*fake"):
        AsyncInferenceLM(Plain(), "m")


def test_importing_the_integration_leaves_this_process_environment_as_it_was() -> None:
    """genlm-backend's import sets vLLM engine-mode variables (V2 model runner) for every vLLM started later."""
    script = textwrap.dedent("""
        import os
        before = dict(os.environ)
        import inference.integrations.genlm
        print(sorted(set(os.environ.items()) ^ set(before.items())))
    """)
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300)
    assert finished.stdout.strip() == "[]", finished.stdout
