"""Which Unicode normalization the llama.cpp provider applies, read from a GGUF file's metadata.

The text itself is tested against Transformers on the tiny models (tests/integration/test_cross_backend.py).
"""

from __future__ import annotations

import json

import pytest

from inference._inprocess.llamacpp_text import normalization_form


@pytest.mark.parametrize(
    ("pre", "form"),
    [("qwen2", "NFC"), ("qwen35", "NFC"), ("command-r", "NFC"), ("olmo", "NFC"), ("llama-bpe", None), ("", None)],
)
def test_the_tokenizer_family_says_whether_it_normalizes(pre: str, form: str | None) -> None:
    assert normalization_form({"tokenizer.ggml.pre": pre}) == form


def test_an_embedded_tokenizer_json_gives_the_normalizer_of_other_families() -> None:
    sequence = {"type": "Sequence", "normalizers": [{"type": "Replace"}, {"type": "NFKC"}]}
    embedded = {"tokenizer.ggml.pre": "default", "tokenizer.huggingface.json": json.dumps({"normalizer": sequence})}
    assert normalization_form(embedded) == "NFKC"
    plain = {"tokenizer.huggingface.json": json.dumps({"normalizer": None})}
    assert normalization_form(plain) is None
    assert normalization_form({"tokenizer.huggingface.json": "not json"}) is None
    # A known family decides: Transformers sets Qwen's NFC itself, whatever tokenizer.json says.
    assert normalization_form({"tokenizer.ggml.pre": "qwen2", **plain}) == "NFC"
