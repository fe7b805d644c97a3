"""The files of an evaluation: prompt sets as JSON Lines define them, one writer per results file, results paths
that are files, each pair counted once, and a full disk named.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from inference.evaluation import EvalPrompt, load_prompts
from inference.exceptions import InvalidRequestError

pytestmark = pytest.mark.integration


# Prompt sets --------------------------------------------------------------------------------------------------


def test_unicode_line_separators_inside_a_json_string_are_text(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    texts = ["one\u2028two", "next\x85line", "para\u2029graph", "form\x0cfeed", "group\x1dsep"]
    lines = [json.dumps({"id": index, "prompt": text}, ensure_ascii=False) for index, text in enumerate(texts)]
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))  # Windows line ends too
    assert [prompt.prompt for prompt in load_prompts(path)] == texts
    path.write_bytes(b"\xef\xbb\xbf" + lines[0].encode("utf-8"))  # a byte-order mark, no final newline
    assert load_prompts(path) == [EvalPrompt("0", texts[0])]


def test_a_prompt_set_that_is_not_utf8_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"id": 1, "prompt": "ok"}\n{"id": 2, "prompt": "café"}\n'.encode("latin-1"))
    where = re.escape(str(path))
    with pytest.raises(InvalidRequestError, match=rf"{where} line 2 is not UTF-8 text \(byte 0xe9 at byte 50"):
        load_prompts(path)


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (r'{"id": 1, "prompt": "a\ud800b"}', "'prompt'"),
        (r'{"id": 1, "prompt": "a", "system_prompt": "\udfff"}', "'system_prompt'"),
        (r'{"id": 1, "prompt": "a", "expected": "x\ud800"}', "'expected'"),
        (r'{"id": "\ud800", "prompt": "a"}', "'id'"),
        (r'{"id": 1, "prompt": "a", "choices": ["x", "\ud800"], "answer": 0}', "'choices\\[1\\]'"),
    ],
)
def test_a_lone_surrogate_in_a_prompt_set_is_refused_with_its_line(tmp_path: Path, record: str, field: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": 0, "prompt": "fine \\ud83d\\ude00"}\n' + record + "\n")  # an escaped pair is fine
    with pytest.raises(InvalidRequestError, match=rf"line 2: {field} holds .* a lone surrogate"):
        load_prompts(path)
