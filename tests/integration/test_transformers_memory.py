"""Out of memory on Transformers: a batch that runs out is run again in halves, down to one row, with a warning each
time; every request comes back with the answer it gets alone, and one that runs out alone gets the error in place.

No GPU is needed: the tiny model's input embedding raises torch's ``OutOfMemoryError`` (what CUDA raises) for a
forward pass over more rows than a budget, or over a prompt longer than one, as a device that is too small would.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from inference.exceptions import ProviderError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from inference.transformers_provider import TransformersProvider  # noqa: E402

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

PROMPTS = ["the quick brown fox", "Once upon a time", "numbers 1 2 3 and", "Hello there", "A B C"]
TOO_LONG = "word " * 40
GREEDY: dict[str, Any] = {"model": "", "max_tokens": 6, "temperature": 0}


async def test_a_batch_out_of_memory_is_halved_until_it_fits_and_every_answer_comes_back(
    tiny_models: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    async with TransformersProvider(model_name=str(tiny_models["qwen2"].hf_dir), device="cpu") as provider:
        alone = [(await provider.generate(prompt, **GREEDY)).text for prompt in PROMPTS]

        def out_of_memory_above_two_rows(module: Any, inputs: tuple[Any, ...]) -> None:
            ids = inputs[0]
            if ids.shape[0] > 2 or ids.shape[1] > 30:
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate a batch of {ids.shape[0]} rows")

        assert provider.model is not None
        hook = provider.model.get_input_embeddings().register_forward_pre_hook(out_of_memory_above_two_rows)
        try:
            before = len(provider.recent_batch_sizes)
            release = threading.Event()
            holding = asyncio.ensure_future(provider._worker.run(release.wait))  # all six requests queue meanwhile
            calls = [provider.generate(prompt, **GREEDY) for prompt in [*PROMPTS, TOO_LONG]]
            answers = asyncio.gather(*calls, return_exceptions=True)
            while len(provider._queue) < 6:  # wait for the state: every request waiting for one batch
                await asyncio.sleep(0.01)
            with caplog.at_level(logging.WARNING, logger="inference.transformers"):
                release.set()
                await holding
                results = await answers
        finally:
            hook.remove()
    *answered, failed = results
    assert [getattr(result, "text", result) for result in answered] == alone
    assert isinstance(failed, ProviderError) and "ran out of memory generating this request alone" in str(failed)
    # 6 rows -> 3 + 3 -> (2 + 1) + (2 + 1): the long prompt's row fails alone at the end.
    assert list(provider.recent_batch_sizes)[before:] == [6, 3, 2, 1, 3, 2, 1]
    halvings = [record.getMessage() for record in caplog.records if "out of memory" in record.getMessage()]
    assert halvings == [
        "transformers: out of memory generating a batch of 6 rows: trying again as batches of 3 and 3 rows",
        "transformers: out of memory generating a batch of 3 rows: trying again as batches of 2 and 1 rows",
        "transformers: out of memory generating a batch of 3 rows: trying again as batches of 2 and 1 rows",
    ]
