"""The ``thinking`` switch and the reasoning a thinking model writes before its answer, for the backends that render
the chat template themselves (in process) or through a server's ``chat_template_kwargs``.

- :func:`template_variables`: the request's ``chat_template_kwargs`` with ``thinking`` as ``enable_thinking`` (the
  variable Qwen3-style templates read: ``False`` writes an empty ``<think></think>`` into the prompt).
- :func:`split_thinking`: a generated text that starts with ``<think>`` becomes ``(answer, reasoning)``: the reasoning
  is what lies between the tags, the answer what follows ``</think>`` (leading whitespace dropped); a text cut inside
  the reasoning has an empty answer. A text that does not start with ``<think>`` is left as it is (a template that
  writes the opening tag into the prompt itself leaves the reasoning in the text).
- :class:`ThinkingStream`: the same rule over stream pieces, holding back what may still be reasoning, so that the
  pieces a caller reads join to the answer, never to the reasoning.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["CLOSE", "OPEN", "ThinkingStream", "split_thinking", "template_variables"]

OPEN, CLOSE = "<think>", "</think>"
"""The tags thinking models (Qwen3, DeepSeek-R1, QwQ...) put around their reasoning."""


class _Templated(Protocol):
    @property
    def chat_template_kwargs(self) -> Any: ...
    @property
    def thinking(self) -> bool | None: ...


def template_variables(request: _Templated) -> dict[str, Any]:
    """The chat template's variables for ``request``: its ``chat_template_kwargs``, and ``enable_thinking`` where
    ``thinking`` is set (the two agree: a request where they differ is refused before it gets here)."""
    variables = dict(request.chat_template_kwargs or {})
    if request.thinking is not None:
        variables["enable_thinking"] = request.thinking
    return variables


def split_thinking(text: str) -> tuple[str, str | None]:
    """``(answer, reasoning)`` of a generated text; ``reasoning`` is ``None`` where the text does not start with
    ``<think>`` (leading whitespace aside), and the text is then the answer as it is."""
    stripped = text.lstrip()
    if not stripped.startswith(OPEN):
        return text, None
    reasoning, closed, answer = stripped[len(OPEN):].partition(CLOSE)
    return (answer.lstrip() if closed else ""), reasoning.strip()


class ThinkingStream:
    """:func:`split_thinking` over stream pieces: :meth:`feed` returns the part of a piece that is answer text (``""``
    while the pieces may still be reasoning), :meth:`flush` what was held back when the stream ends. The pieces given
    out join to the answer :func:`split_thinking` gives for the whole text."""

    def __init__(self) -> None:
        self._held = ""
        self._state = "start"  # start (may still open <think>), thinking, leading (after </think>), answer

    def feed(self, piece: str) -> str:
        """The answer text ``piece`` adds (``""`` while it may be reasoning)."""
        if self._state == "answer":
            return piece
        self._held += piece
        if self._state == "start":
            stripped = self._held.lstrip()
            if len(stripped) < len(OPEN) and OPEN.startswith(stripped):
                return ""  # "", "<", "<thi"...: could still open the reasoning
            if not stripped.startswith(OPEN):
                self._state = "answer"
                return self._take()
            self._state = "thinking"
        if self._state == "thinking":
            if CLOSE not in self._held:
                return ""
            self._held = self._held.split(CLOSE, 1)[1]
            self._state = "leading"
        self._held = self._held.lstrip()
        if not self._held:
            return ""
        self._state = "answer"
        return self._take()

    def flush(self) -> str:
        """What was held back and is answer text after all (a whole text that only began like ``<think>``)."""
        return self._take() if self._state == "start" else ""

    def _take(self) -> str:
        held, self._held = self._held, ""
        return held
