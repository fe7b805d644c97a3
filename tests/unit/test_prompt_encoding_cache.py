"""The in-process prompt rule keeps a tokenizer's ids per prompt text: the same ids, the tokenizer asked once."""

from __future__ import annotations

from typing import Any

from inference._inprocess import hf_prompt


class CountingTokenizer:
    """Ids are the text's character codes (plus 1 in front with special tokens); counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.size = 100

    def __len__(self) -> int:
        return self.size

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, Any]:
        self.calls += 1
        return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}


def test_a_text_seen_before_gets_the_same_ids_without_asking_the_tokenizer() -> None:
    tokenizer = CountingTokenizer()
    first = hf_prompt.encode(tokenizer, "hi", special=True)
    first.append(999)  # a caller's list is its own: the kept ids do not change
    assert hf_prompt.encode(tokenizer, "hi", special=True) == [1, 104, 105]
    assert hf_prompt.encode(tokenizer, "hi", special=False) == [104, 105]  # another key
    assert tokenizer.calls == 2
    assert hf_prompt.encode(CountingTokenizer(), "hi", special=True) == [1, 104, 105]  # per tokenizer
    tokenizer.size += 1  # a token added: the text is tokenized again
    hf_prompt.encode(tokenizer, "hi", special=True)
    assert tokenizer.calls == 3


def test_the_least_recently_used_text_is_dropped_past_the_bound(monkeypatch: Any) -> None:
    monkeypatch.setattr(hf_prompt, "ENCODED_TEXTS", 2)
    tokenizer = CountingTokenizer()
    for text in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" comes
        hf_prompt.encode(tokenizer, text, special=False)
    assert tokenizer.calls == 3
    hf_prompt.encode(tokenizer, "a", special=False)
    assert tokenizer.calls == 3
    hf_prompt.encode(tokenizer, "b", special=False)
    assert tokenizer.calls == 4


class BatchTokenizer(CountingTokenizer):
    """Also takes a list of texts, as Hugging Face tokenizers do."""

    def __call__(self, text: Any, add_special_tokens: bool = True) -> dict[str, Any]:
        if isinstance(text, list):
            self.calls += 1
            return {"input_ids": [([1] if add_special_tokens else []) + [ord(c) for c in one] for one in text]}
        return super().__call__(text, add_special_tokens)


def test_texts_encoded_ahead_in_one_call_give_each_text_its_own_ids() -> None:
    tokenizer = BatchTokenizer()
    hf_prompt.encode(tokenizer, "a", special=False)
    hf_prompt.encode_ahead(tokenizer, ["a", "bc", "bc", "d"], special=False)  # "a" is kept already
    calls = tokenizer.calls
    assert [hf_prompt.encode(tokenizer, text, special=False) for text in ("a", "bc", "d")] == [[97], [98, 99], [100]]
    assert tokenizer.calls == calls == 2  # one call for "a", one for the rest
