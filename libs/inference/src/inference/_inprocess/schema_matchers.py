"""The JSON-schema matchers of one in-process model, as every in-process backend sets them up.

llguidance compiles a request's ``json_schema`` into a grammar over the model's tokens
(:class:`~inference._inprocess.constrained.JsonGrammars`). :class:`SchemaMatchers` does what is the same for every
backend around it: it imports llguidance (a missing one names the backend's extra), builds the grammar compiler for
the model's tokenizer on the first schema (the only costly step: about a second for a large vocabulary), and turns a
schema llguidance cannot compile into one :class:`~inference.UnsupportedOperationError` (a server may take it). How
the model's tokens become an llguidance tokenizer is the backend's part: it passes a function that builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from inference._core.dependencies import import_optional
from inference._inprocess.constrained import JsonGrammars

__all__ = ["SchemaMatchers"]


class SchemaMatchers:
    """Hands out a fresh llguidance matcher per request for one model's tokenizer (worker thread).

    Args:
        provider: The provider's name, for errors.
        extra: The pip extra that installs llguidance for this backend.
    """

    def __init__(self, provider: str, extra: str) -> None:
        self.provider = provider
        self.extra = extra
        self._grammars: JsonGrammars | None = None

    def matcher(self, schema: Mapping[str, Any], tokenizer: Callable[[Any], Any], subject: str = "json_schema") -> Any:
        """A matcher at the start of ``schema``'s JSON (compiled once per schema).

        Args:
            schema: The request's JSON schema.
            tokenizer: Builds the model's ``LLTokenizer`` from the ``llguidance`` module; called on the first
                schema only.
            subject: What the schema is, for errors (:func:`~inference._inprocess.constrained.schema_subject`).

        Raises:
            UnsupportedOperationError: llguidance cannot compile the schema.
        """
        if self._grammars is None:
            llguidance = import_optional("llguidance", provider=self.provider, extra=self.extra)
            self._grammars = JsonGrammars(llguidance, tokenizer(llguidance), provider=self.provider)
        return self._grammars.matcher(schema, subject)
