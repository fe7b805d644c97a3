"""OpenAI's sampling adjustments as Transformers logits processors: ``logit_bias``, ``presence_penalty`` and
``frequency_penalty``, with the meaning llama.cpp's sampler and vLLM give them (so the backends agree token for
token): a bias is added to its token's logit; a token generated ``c`` times so far (the prompt does not count) loses
``presence * (c > 0) + frequency * c``. torch is passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["LogitBias", "OpenAIPenalties"]


class LogitBias:
    """Adds each token's bias to its logit, at every step of every row."""

    def __init__(self, torch: Any, biases: Mapping[int, float], size: int, device: Any) -> None:
        self.bias = torch.zeros(size, dtype=torch.float32, device=device)
        for token, value in biases.items():
            if token < size:
                self.bias[token] = float(value)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        return scores + self.bias[: scores.shape[-1]].to(scores.dtype)


class OpenAIPenalties:
    """Subtracts ``presence * (c > 0) + frequency * c`` from the logit of each token generated ``c`` times so far.

    Args:
        torch: The torch module.
        presence: OpenAI's ``presence_penalty`` (0 for none).
        frequency: OpenAI's ``frequency_penalty`` (0 for none).
        prompt_width: The (left-padded) prompt's width: the tokens after it are the generated ones.
    """

    def __init__(self, torch: Any, presence: float, frequency: float, prompt_width: int) -> None:
        self.torch = torch
        self.presence = presence
        self.frequency = frequency
        self.prompt_width = prompt_width

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        generated = input_ids[:, self.prompt_width :]
        if generated.shape[1] == 0:
            return scores
        counts = self.torch.zeros_like(scores, dtype=self.torch.float32)
        counts.scatter_add_(1, generated, self.torch.ones_like(generated, dtype=self.torch.float32))
        penalty = self.frequency * counts + self.presence * (counts > 0).float()
        return scores - penalty.to(scores.dtype)
