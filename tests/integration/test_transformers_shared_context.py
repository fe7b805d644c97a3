"""Transformers: the choices of a multiple-choice item read their shared context once, and score as if alone.

An evaluation scores one context with N continuations per item (and per adapter). The provider computes the
context once per adapter (one packed row: the context, then every choice, each seeing the context and itself); a
user sees the same log-likelihoods as when each pair is scored alone (within 1e-5, or float32's resolution of a
large sum), in order, with a bad pair's error in its place.
"""

from __future__ import annotations

from typing import Any

import pytest

import inference._inprocess.hf_scoring as hf_scoring
from inference.exceptions import InvalidRequestError
from inference.results import ScoreResult
from inference.transformers_provider import TransformersProvider

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

ITEMS = [
    ("Question: what is the colour of the sky on a clear day? Answer:", [" blue", " green", " red and white", " it"]),
    ("The capital of France is", [" Paris", " a city in the north of Europe", " Berlin", " unknown"]),
    ("1, 2, 3, 4,", [" 5", " 6, 7", " five", ""]),  # the empty continuation is refused, in its place
]


def _pairs() -> list[tuple[str, str]]:
    return [(context, choice) for context, choices in ITEMS for choice in choices]


@pytest.fixture(params=["qwen2", "llama"])
def model(request: pytest.FixtureRequest, tiny_models: dict[str, Any]) -> Any:
    return tiny_models[request.param]


async def test_shared_contexts_score_as_the_pairs_alone_in_order_with_errors_in_place(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared: list[int] = []
    real = hf_scoring.score_groups

    def counting(torch: Any, loaded: Any, slots: Any, groups: Any, batch_sizes: Any) -> Any:
        shared.extend(len(group.members) for group in groups)
        return real(torch, loaded, slots, groups, batch_sizes)

    monkeypatch.setattr(hf_scoring, "score_groups", counting)
    pairs = _pairs()
    async with TransformersProvider(
        model_name=str(model.hf_dir), torch_dtype="float32", batch_window_ms=500, max_batch_size=64
    ) as provider:
        await provider.load_adapter("a1", model.adapter_dirs["a1"])
        await provider.load_adapter("a2", model.adapter_dirs["a2"])
        alone: dict[str | None, list[ScoreResult | Exception]] = {}
        for adapter_id in (None, "a1", "a2"):
            alone[adapter_id] = []
            for context, continuation in pairs:  # one at a time: nothing to share
                try:
                    alone[adapter_id].append(await provider.score(context, continuation, "tiny", adapter_id))
                except InvalidRequestError as error:
                    alone[adapter_id].append(error)
        assert not shared
        together = [  # one adapter at a time: the rows differ from the pairs alone by the shared context only
            await provider.score_batch(pairs, "tiny", adapter_id, max_concurrency=64) for adapter_id in alone
        ]
    assert shared and max(shared) >= 3  # the choices of an item branched from one context
    for adapter_id, batch in zip(alone, together, strict=True):
        assert len(batch) == len(pairs)
        for index, (mine, reference) in enumerate(zip(batch, alone[adapter_id], strict=True)):
            if pairs[index][1] == "":
                assert isinstance(mine, InvalidRequestError) and isinstance(reference, InvalidRequestError)
                continue
            assert isinstance(mine, ScoreResult) and isinstance(reference, ScoreResult), (adapter_id, index, mine)
            # 1e-5, or float32's own resolution of the sum where that is coarser (its spacing is 1.5e-5 between
            # 128 and 256: a 30-token continuation's -146 cannot be told apart more finely).
            assert mine.logprob == pytest.approx(reference.logprob, abs=1e-5, rel=2e-7), (adapter_id, pairs[index])
            assert (mine.num_tokens, mine.is_greedy, mine.adapter_id) == (
                reference.num_tokens,
                reference.is_greedy,
                adapter_id,
            )
