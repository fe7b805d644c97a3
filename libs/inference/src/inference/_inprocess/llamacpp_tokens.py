"""The token level on llama.cpp: the vocabulary as token bytes (the full next-token distributions are computed through
:mod:`~inference._inprocess.llamacpp_prefix_cache`). On the provider's worker thread, with the ``Llama`` it owns.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from inference._inprocess.llamacpp_scoring import vocabulary as scoring_vocabulary
from inference.tokens import TokenVocabulary

if TYPE_CHECKING:
    from inference._inprocess.llamacpp_prompt import LlamaPrompts

__all__ = ["token_piece", "vocabulary"]


def vocabulary(prompts: LlamaPrompts, llama: Any, n_ctx: int) -> TokenVocabulary:
    """The model's :class:`~inference.tokens.TokenVocabulary` (``n_ctx`` is the context's size)."""
    llama_cpp = prompts.model.llama_cpp()
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    size = int(llama.n_vocab())
    special = frozenset(token for token in range(size) if llama_cpp.llama_vocab_is_control(vocab, token))
    end = tuple(token for token in range(size) if llama_cpp.llama_vocab_is_eog(vocab, token))
    words = scoring_vocabulary(prompts, llama)
    eos = words.eos_id
    return TokenVocabulary(
        size=size,
        token_bytes=tuple(token_piece(llama_cpp, vocab, token) for token in range(size)),
        special_ids=special,
        bos_id=words.bos_id,
        eos_ids=tuple(sorted(end, key=lambda token: (token != eos, token))),
        adds_bos=words.adds_bos,
        context_length=n_ctx,
    )


def token_piece(llama_cpp: Any, vocab: Any, token: int) -> bytes:
    """One token's bytes as llama.cpp writes them (special tokens by their text, no leading space removed)."""
    size = 64
    while True:
        buffer = ctypes.create_string_buffer(size)
        written = int(llama_cpp.llama_token_to_piece(vocab, token, buffer, size, 0, True))
        if written >= 0:
            return bytes(buffer.raw[:written])
        size = -written
