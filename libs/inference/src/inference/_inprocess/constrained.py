"""JSON-schema constrained decoding for an in-process model, with llguidance: one grammar matcher per batch row.

:class:`JsonGrammars` compiles a schema once into an llguidance grammar (cached) and makes a fresh
``LLMatcher`` per row. :class:`GrammarRows` drives the matchers of one batch through a ``generate`` call in
two roles:

* as a logits processor, before sampling, it sets every token the row's grammar does not allow at this step
  to ``-inf`` (temperature, top-k and top-p apply afterwards, to the allowed tokens only);
* as a stopping criterion, after every step, it feeds each row's new token to its matcher and stops the row
  once the matcher is stopped: the JSON is complete and nothing but the end-of-sequence token may follow,
  or the end-of-sequence token was chosen where the JSON could have ended.

Rows without a schema (``None`` matcher) are left untouched, so constrained and free requests share a batch.
JSON is compiled compact (no free whitespace): a model that may write any amount of whitespace between
tokens could fill ``max_tokens`` with it.

Nothing here imports torch or llguidance: the modules are passed in.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from inference.exceptions import UnsupportedOperationError
from inference.tools import forced_tool

if TYPE_CHECKING:
    from inference._core.validation import GenerationRequest

__all__ = ["GrammarRows", "JsonGrammars", "schema_subject"]

_CACHE_SIZE = 64


class JsonGrammars:
    """Compile JSON schemas for one tokenizer and hand out a fresh matcher per row.

    Args:
        llguidance: The ``llguidance`` module.
        tokenizer: The model's ``LLTokenizer`` (``llguidance.hf.from_tokenizer``, or
            ``llguidance.llamacpp.lltokenizer_from_vocab``), sized to the logits.
        provider: The provider's name, for errors.
    """

    def __init__(self, llguidance: Any, tokenizer: Any, *, provider: str) -> None:
        self.llguidance = llguidance
        self.tokenizer = tokenizer
        self.provider = provider
        self._compiled: OrderedDict[str, Any] = OrderedDict()

    def matcher(self, schema: Mapping[str, Any], subject: str = "json_schema") -> Any:
        """A matcher at the start of ``schema``'s JSON (compiled once per schema, copied per row).

        Args:
            schema: The JSON schema.
            subject: What the schema is, for errors (:func:`schema_subject`).

        Raises:
            UnsupportedOperationError: The grammar compiler refuses the schema (e.g. ``uniqueItems``, ``oneOf``, a
                regex with look-around): a server that compiles JSON schemas its own way may take it.
        """
        key = json.dumps(schema, sort_keys=True, default=str)
        template = self._compiled.get(key)
        if template is None:
            matcher_class = self.llguidance.LLMatcher
            try:
                grammar = matcher_class.grammar_from_json_schema(dict(schema), overrides={"whitespace_flexible": False})
                template = matcher_class(self.tokenizer, grammar, log_level=0)
            except (ValueError, TypeError, RuntimeError) as error:
                raise self._refused(str(error), subject) from error
            if template.is_error():
                raise self._refused(_first_lines(template.get_error()), subject)
            self._compiled[key] = template
            if len(self._compiled) > _CACHE_SIZE:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(key)
        return template.deep_copy()

    def _refused(self, reason: str, subject: str) -> UnsupportedOperationError:
        return UnsupportedOperationError(
            f"{subject} cannot be compiled into a grammar in process ({reason}): simplify the schema (llguidance "
            "supports most of JSON schema, but not e.g. uniqueItems, oneOf, not, if/then, contains, "
            "dependentRequired or regex look-around), or send the request to a server that takes it",
            provider=self.provider,
        )


def schema_subject(request: GenerationRequest) -> str:
    """What a request's ``json_schema`` is, as errors name it: the tool of a forced call (whose schema the SDK
    built from the tool's parameters), else ``"json_schema"``."""
    if request.tool_choice in (None, "auto", "none"):
        return "json_schema"
    named = forced_tool(request.tools, request.tool_choice)
    names = [named] if named is not None else [str(tool["function"]["name"]) for tool in request.tools]
    if not names:  # the tools were left out (a template that cannot show them): the call schema names them
        schema = request.json_schema or {}
        schema = schema.get("items", schema)  # Mistral: a list of one call
        names = [str(option.get("properties", {}).get("name", {}).get("const"))
                 for option in schema.get("anyOf", [schema])]
    return f"the parameters of tool {names[0]!r}" if len(names) == 1 else (
        f"the parameters of tools {', '.join(repr(name) for name in names)}"
    )


class GrammarRows:
    """The matchers of one batch (``None`` for a free row), as a logits processor and a stopping criterion.

    Args:
        torch: The torch module.
        matchers: One matcher or ``None`` per row, in row order.
        prompt_width: The padded prompt length (new tokens start there).
        limits: Each row's most new tokens (after it, the row's tokens are padding and are not fed).

    Attributes:
        ended: Per row, the number of new tokens at which its matcher stopped (``None``: not stopped).
        errors: Per row, the matcher's error when a token it did not allow was fed (``None``: none).
    """

    def __init__(self, torch: Any, matchers: Sequence[Any | None], prompt_width: int, limits: Sequence[int]) -> None:
        self.torch = torch
        self.matchers: list[Any] = list(matchers)
        self.prompt_width = prompt_width
        self.limits = list(limits)
        self.ended: list[int | None] = [None] * len(self.matchers)
        self.errors: list[str | None] = [None] * len(self.matchers)
        self._bits = torch.arange(32, dtype=torch.int32)

    def active(self, row: int) -> bool:
        """The row has a matcher that still takes tokens."""
        return self.matchers[row] is not None and self.ended[row] is None and self.errors[row] is None

    def accepting(self, row: int) -> bool:
        """The row's JSON is complete (its matcher stopped or may stop here)."""
        matcher = self.matchers[row]
        return matcher is not None and self.errors[row] is None and bool(matcher.is_accepting())

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Logits processor: mask, per constrained row, every token its grammar does not allow now."""
        torch = self.torch
        rows = [row for row in range(len(self.matchers)) if self.active(row)]
        if not rows:
            return scores
        masks = torch.stack(
            [torch.frombuffer(bytearray(self.matchers[row].compute_bitmask()), dtype=torch.int32) for row in rows]
        )
        allowed = ((masks.unsqueeze(-1) >> self._bits) & 1).reshape(len(rows), -1).bool()
        vocab = scores.shape[1]
        if allowed.shape[1] < vocab:  # logits beyond the tokenizer's vocabulary are never allowed
            allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
        allowed = allowed[:, :vocab].to(scores.device)
        index = torch.tensor(rows, device=scores.device)
        scores[index] = scores[index].masked_fill(~allowed, float("-inf"))
        return scores

    def stops(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        """Stopping criterion: feed each constrained row its new token; a row is done once its matcher stopped."""
        count = input_ids.shape[1] - self.prompt_width
        done = [False] * len(self.matchers)
        if count > 0:
            last = input_ids[:, -1].tolist()
            for row, matcher in enumerate(self.matchers):
                if not self.active(row) or count > self.limits[row]:
                    continue
                if not matcher.consume_token(int(last[row])):
                    self.errors[row] = _first_lines(matcher.get_error()) or f"token {last[row]} was not allowed"
                    done[row] = True
                elif matcher.is_stopped():
                    self.ended[row] = count
                    done[row] = True
        return self.torch.tensor(done, dtype=self.torch.bool, device=input_ids.device)


def _first_lines(message: str, lines: int = 6) -> str:
    return "\n".join(str(message).strip().splitlines()[:lines])
