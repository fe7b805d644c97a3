"""The tokenization rule of scoring (inference._core.scoring), on a toy tokenizer that glues spaces to words."""

from __future__ import annotations

import re

import pytest

from inference._core.scoring import Vocabulary, rolling_windows, score_tokens
from inference.exceptions import InvalidRequestError

BOS, EOS = 1, 2
WORDS: dict[str, int] = {}


def encode(text: str) -> list[int]:
    """Each word with its leading spaces is one token (as byte-level BPE tokenizers glue them)."""
    return [WORDS.setdefault(piece, 10 + len(WORDS)) for piece in re.findall(r"\s*\S+|\s+$", text)]


NO_BOS = Vocabulary(encode, adds_bos=False, bos_id=BOS, eos_id=EOS)
WITH_BOS = Vocabulary(encode, adds_bos=True, bos_id=BOS, eos_id=EOS)


def test_the_continuation_is_what_follows_the_context_s_tokens() -> None:
    scored = score_tokens(NO_BOS, "The cat", " sat down", provider="t")
    assert scored.tokens == tuple(encode("The cat sat down"))
    assert scored.scored == tuple(encode("The cat sat down"))[2:]


def test_trailing_space_of_the_context_moves_to_the_continuation() -> None:
    moved = score_tokens(NO_BOS, "The cat ", "sat", provider="t")
    assert moved == score_tokens(NO_BOS, "The cat", " sat", provider="t")


def test_a_model_that_adds_bos_reads_it_first() -> None:
    scored = score_tokens(WITH_BOS, "The cat", " sat", provider="t")
    assert scored.tokens[0] == BOS and scored.start == 3


def test_an_empty_context_starts_from_bos_even_without_add_bos() -> None:
    scored = score_tokens(NO_BOS, "", "Hello world", provider="t")
    assert scored.tokens[0] == BOS and scored.start == 1 and len(scored.scored) == 2
    eos_only = Vocabulary(encode, adds_bos=False, bos_id=None, eos_id=EOS)
    assert score_tokens(eos_only, "", "Hello", provider="t").tokens[0] == EOS


def test_nothing_to_start_from_is_a_clear_error() -> None:
    bare = Vocabulary(encode, adds_bos=False, bos_id=None, eos_id=None)
    with pytest.raises(InvalidRequestError, match="give a context"):
        score_tokens(bare, "", "Hello", provider="t")


@pytest.mark.parametrize(("length", "window"), [(1, 4), (4, 4), (5, 4), (10, 4), (10, 3), (7, 1)])
def test_rolling_windows_score_every_token_once_within_the_window(length: int, window: int) -> None:
    text = " ".join(f"w{index}" for index in range(length))
    tokens = encode(text)
    windows = rolling_windows(NO_BOS, text, window, provider="t")
    scored = [token for piece in windows for token in piece.scored]
    assert scored == tokens
    assert all(len(piece.tokens) - 1 <= window for piece in windows)  # what the model reads fits
    assert windows[0].tokens[0] == BOS and windows[0].start == 1
    for piece in windows[1:]:  # every later window conditions on the tokens right before what it scores
        position = tokens.index(piece.scored[0])
        assert piece.tokens[: piece.start] == tuple(tokens[position - piece.start : position])


def encode_specials(text: str) -> list[int]:
    """Like a Hugging Face tokenizer with ``add_special_tokens=False``: ``<s>`` written in the text is BOS."""
    ids: list[int] = []
    for index, piece in enumerate(text.split("<s>")):
        ids.extend([BOS] if index else [])
        ids.extend(encode(piece))
    return ids


SPECIAL_WITH_BOS = Vocabulary(encode_specials, adds_bos=True, bos_id=BOS, eos_id=EOS)
SPECIAL_NO_BOS = Vocabulary(encode_specials, adds_bos=False, bos_id=BOS, eos_id=EOS)


def test_a_context_that_starts_with_the_bos_token_gets_no_second_one() -> None:
    # A chat-formatted context ("<bos><start_of_turn>user ...") already has its BOS, as lm-eval's hf model sees it.
    written = score_tokens(SPECIAL_WITH_BOS, "<s>The cat", " sat", provider="t")
    assert written == score_tokens(SPECIAL_WITH_BOS, "The cat", " sat", provider="t")
    assert written.tokens.count(BOS) == 1


def test_an_empty_context_and_a_continuation_that_starts_with_the_start_token_score_the_rest() -> None:
    # lm-eval: the written start token becomes the context, and is not scored after another one.
    for vocabulary in (SPECIAL_WITH_BOS, SPECIAL_NO_BOS):
        written = score_tokens(vocabulary, "", "<s>Hello world", provider="t")
        assert written.tokens[0] == BOS and written.tokens.count(BOS) == 1
        assert written == score_tokens(vocabulary, "", "Hello world", provider="t")


def test_rolling_windows_of_text_that_starts_with_the_start_token_do_not_score_it() -> None:
    written = rolling_windows(SPECIAL_NO_BOS, "<s>w0 w1 w2 w3 w4", 3, provider="t")
    assert written == rolling_windows(SPECIAL_NO_BOS, "w0 w1 w2 w3 w4", 3, provider="t")
    with pytest.raises(InvalidRequestError, match="no tokens"):
        rolling_windows(SPECIAL_NO_BOS, "<s>", 3, provider="t")


def test_special_token_text_later_in_the_text_is_scored_as_that_token() -> None:
    scored = score_tokens(SPECIAL_NO_BOS, "Answer: yes", "<s>", provider="t")
    assert scored.scored == (BOS,)
