"""Each token's bytes, read off a Hugging Face tokenizer (no torch): what a token adds to the text, for token-level
work (:class:`~inference.tokens.TokenVocabulary`), and which tokens end a generation. Shared by Transformers and
vLLM (its engine and its server's model files), whose tokenizers are the same."""

from __future__ import annotations

from typing import Any

__all__ = ["end_token_ids", "special_ids", "token_bytes"]


def end_token_ids(tokenizer: Any, generation_eos: Any) -> tuple[int, ...]:
    """Every token that ends a generation, the tokenizer's EOS first, then the others by id: the tokenizer's
    ``eos_token_id`` and the generation config's (``generation_eos``: an id, a list of them or ``None``), the set
    Transformers' ``generate`` and vLLM's engine both stop on (Gemma 3's generation config adds ``<end_of_turn>``,
    Llama 3.1 Instruct's ``<|eom_id|>`` and ``<|eot_id|>``, Qwen2.5 Instruct's ``<|endoftext|>``)."""
    first = tokenizer.eos_token_id
    listed = [] if generation_eos is None else [generation_eos] if isinstance(generation_eos, int) else generation_eos
    others = {int(token) for token in listed} - ({int(first)} if first is not None else set())
    return (*(() if first is None else (int(first),)), *sorted(others))


def special_ids(tokenizer: Any, size: int) -> frozenset[int]:
    """The control tokens below ``size``: the tokenizer's special tokens (BOS, EOS, padding...) and every added token
    it marks special (chat markers such as ``<|im_start|>``, which ``all_special_ids`` leaves out unless they are
    listed as additional special tokens), as llama.cpp's vocabulary reads them from the same model."""
    ids = {int(token) for token in tokenizer.all_special_ids}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(int(token) for token, entry in added.items() if getattr(entry, "special", False))
    return frozenset(token for token in ids if 0 <= token < size)


def token_bytes(tokenizer: Any, size: int) -> tuple[bytes, ...]:
    """Each id's bytes, ``size`` entries: a byte-level BPE token's raw bytes (GPT-2, Qwen, Llama 3), a SentencePiece
    piece with ``▁`` as a space and ``<0xNN>`` as that byte (Llama 2, Gemma), a special token's text; ``b""`` for
    the ids the tokenizer lacks (a model's output layer may be wider)."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(size, len(tokenizer)))))
    specials = {int(token) for token in tokenizer.all_special_ids}
    decoder = _byte_decoder() if _is_byte_level(tokenizer) else None
    result = []
    for token_id, piece in enumerate(pieces):
        if piece is None:
            result.append(b"")
        elif token_id in specials or piece in tokenizer.get_added_vocab():
            result.append(piece.encode("utf-8"))
        elif decoder is not None:
            result.append(bytes(decoder[char] for char in piece) if all(c in decoder for c in piece) else
                          piece.encode("utf-8"))
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            result.append(bytes([int(piece[3:5], 16)]))
        else:
            result.append(piece.replace("\u2581", " ").encode("utf-8"))
    result.extend(b"" for _ in range(size - len(result)))
    return tuple(result)


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    return type(decoder).__name__ == "ByteLevel" or "ByteLevel" in repr(decoder)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's map from the printable characters of byte-level BPE back to bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}
