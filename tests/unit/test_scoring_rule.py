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
