"""Chat templates rendered as Transformers renders them, for the in-process backends that have no Hugging Face
tokenizer to do it (llama.cpp, whose GGUF file holds the template).

The same conversation must become the same text on llama.cpp and on Transformers. Transformers renders in a
sandboxed Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a
``{% generation %}`` block that only marks text, ``raise_exception`` and ``strftime_now``, and a ``tojson`` filter
that is ``json.dumps`` (keys in their order, non-ASCII kept). Jinja's own ``tojson`` sorts keys and escapes ``<``,
``>``, ``&`` and ``'``, which changes how tools and tool calls read (llama-cpp-python's renderer uses it): this
module's :class:`ChatTemplate` renders with Transformers' rules.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

__all__ = ["ChatTemplate"]


class ChatTemplate:
    """One chat template, compiled once.

    Args:
        source: The template's Jinja source.
        bos_token: The model's BOS token text (templates write it as ``bos_token``).
        eos_token: The model's EOS token text.

    Raises:
        jinja2.TemplateSyntaxError: The source is not a valid template.
    """

    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _environment().from_string(source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **variables: Any,
    ) -> str:
        """The text of ``messages`` (and ``tools``, where given) with the generation prompt; ``variables`` are the
        request's template variables (``enable_thinking``...).

        Raises:
            jinja2.TemplateError: The template refused the conversation (its ``raise_exception``), or failed.
        """
        return str(
            self._template.render(
                messages=list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **variables,
            )
        )


@lru_cache(maxsize=1)
def _environment() -> Any:
    """The Jinja environment of Transformers' chat templates (built once; jinja2 imported on first use)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: marks the assistant's text for training masks; renders its
        body as it is."""

        tags = {"generation"}  # noqa: RUF012 - jinja2's class attribute

        def parse(self, parser: Any) -> Any:
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=line)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.datetime.now().strftime(format)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    return environment
