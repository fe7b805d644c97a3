"""Text to token ids on llama.cpp, as the model's Hugging Face tokenizer makes them (prompts and scored text).

llama.cpp's tokenizer differs from the Hugging Face tokenizer that Transformers, vLLM and lm-eval's ``hf`` model
use in two ways, and :class:`TextEncoder` removes both:

- **Special-token text.** A Hugging Face tokenizer reads every added token written in its input as that token
  (``"<|im_end|>"`` is one token, with or without ``add_special_tokens``); ``llama_tokenize`` does that only with
  ``parse_special=True``, which is what this module passes.
- **Unicode normalization.** A Hugging Face tokenizer runs its normalizer first: Qwen's, Cohere's and GPT-NeoX's
  compose to NFC, so ``"e"`` followed by U+0301 becomes ``"é"`` and tokenizes as that; llama.cpp normalizes
  nothing. A GGUF file does not record the normalizer (unless the converter copied the whole tokenizer.json into
  ``tokenizer.huggingface.json``), but it records the tokenizer's family as ``tokenizer.ggml.pre``, and
  :data:`NORMALIZING_PRE_TOKENIZERS` says which families normalize. As the Hugging Face tokenizer does, the text
  between special-token texts is normalized, never a special token itself.

Everything here runs on the provider's worker thread, with the ``Llama`` object it owns.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, Literal, cast

__all__ = ["NORMALIZING_PRE_TOKENIZERS", "TextEncoder", "normalization_form"]

Form = Literal["NFC", "NFD", "NFKC", "NFKD"]

NORMALIZING_PRE_TOKENIZERS: Mapping[str, Form] = {
    "qwen2": "NFC",  # Qwen1.5 to Qwen3 (transformers' Qwen2Tokenizer; Qwen's tokenizer.json)
    "qwen35": "NFC",  # Qwen3.5 (Qwen3_5Tokenizer)
    "command-r": "NFC",  # Cohere Command-R (CohereTokenizer)
    "olmo": "NFC",  # GPT-NeoX-20B's tokenizer: OLMo, Pythia, GPT-NeoX (GPTNeoXTokenizer)
    "mpt": "NFC",  # MPT, also GPT-NeoX-20B's tokenizer
}
"""``tokenizer.ggml.pre`` values (what llama.cpp's converter records) whose Hugging Face tokenizer applies a Unicode
normalization before tokenizing. Families not listed (Llama 3, Gemma, Mistral, GPT-2, DeepSeek...) have none."""

_FORMS: tuple[Form, ...] = ("NFC", "NFD", "NFKC", "NFKD")
_SPECIAL_ATTRIBUTES = (1 << 0) | (1 << 3) | (1 << 4)
"""``LLAMA_TOKEN_ATTR_UNKNOWN | CONTROL | USER_DEFINED``: the tokens ``parse_special`` reads in text."""


def normalization_form(metadata: Mapping[str, str]) -> Form | None:
    """The Unicode normalization the model's Hugging Face tokenizer applies, from a GGUF file's metadata.

    The tokenizer family (``tokenizer.ggml.pre``) decides where :data:`NORMALIZING_PRE_TOKENIZERS` knows it
    (Transformers sets these families' normalizer itself, whatever their tokenizer.json says); otherwise the
    normalizer of an embedded ``tokenizer.huggingface.json``; otherwise ``None`` (no normalization).
    """
    known = NORMALIZING_PRE_TOKENIZERS.get(metadata.get("tokenizer.ggml.pre", ""))
    if known is not None:
        return known
    try:
        normalizer = json.loads(metadata.get("tokenizer.huggingface.json", "{}")).get("normalizer")
    except (ValueError, AttributeError):
        return None
    steps = normalizer.get("normalizers", []) if isinstance(normalizer, dict) else []
    for step in [normalizer, *steps]:
        kind = step.get("type") if isinstance(step, dict) else None
        if kind in _FORMS:
            return cast(Form, kind)
    return None


class TextEncoder:
    """Token ids of text for one llama.cpp model, special-token text read as those tokens, normalized as its
    Hugging Face tokenizer does (:func:`normalization_form`).

    Args:
        form: The Unicode normalization to apply, or ``None``.
    """

    def __init__(self, form: Form | None) -> None:
        self.form = form
        self._specials: re.Pattern[str] | None = None  # the special-token texts, read when first needed

    @classmethod
    def for_model(cls, llama: Any) -> TextEncoder:
        """The encoder for a loaded ``Llama`` (its GGUF metadata says how to normalize)."""
        return cls(normalization_form(dict(llama.metadata or {})))

    def encode(self, llama_cpp: Any, llama: Any, text: str, *, add_bos: bool) -> list[int]:
        """Token ids of ``text``; ``add_bos`` adds BOS where the vocabulary says so (``llama_vocab_get_add_bos``)."""
        normalized = self.normalize(llama_cpp, llama, text)
        return [int(token) for token in llama.tokenize(normalized.encode("utf-8"), add_bos=add_bos, special=True)]

    def normalize(self, llama_cpp: Any, llama: Any, text: str) -> str:
        """``text`` with every stretch between special-token texts normalized (unchanged without a form)."""
        if self.form is None or unicodedata.is_normalized(self.form, text):
            return text
        if self._specials is None:
            self._specials = _special_texts(llama_cpp, llama)
        pieces = self._specials.split(text)  # the pattern's group keeps the special texts at the odd indices
        return "".join(
            piece if index % 2 else unicodedata.normalize(self.form, piece) for index, piece in enumerate(pieces)
        )


def _special_texts(llama_cpp: Any, llama: Any) -> re.Pattern[str]:
    """A pattern that matches the model's special-token texts, longest first (as llama.cpp looks for them)."""
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    texts = set()
    for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        if llama_cpp.llama_vocab_get_attr(vocab, token) & _SPECIAL_ATTRIBUTES:
            text = bytes(llama_cpp.llama_vocab_get_text(vocab, token) or b"").decode("utf-8", errors="replace")
            if text:
                texts.add(text)
    if not texts:
        return re.compile(r"(?!)()")  # matches nothing; split() then gives the whole text
    return re.compile("(" + "|".join(re.escape(text) for text in sorted(texts, key=len, reverse=True)) + ")")
