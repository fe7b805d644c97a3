"""``adapter_id`` as an id, an (id, scale) pair or a list of pairs: what each shape means, and what is refused."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from inference._core.validation import adapters_label, split_adapter_choice
from inference.exceptions import InvalidRequestError


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, (None, ())),
        ("math", ("math", ())),
        (("math", 1.0), ("math", ())),  # one adapter at scale 1 is the adapter itself
        ([("math", 1)], ("math", ())),
        (("math", 0.5), (None, (("math", 0.5),))),
        (("math", 0), (None, (("math", 0.0),))),
        ([("math", 1.0), ("style", -0.5)], (None, (("math", 1.0), ("style", -0.5)))),
        ([["math", 2], ["style", 0.25]], (None, (("math", 2.0), ("style", 0.25)))),
        # numpy scalars and other real numbers are numbers (a training loop's scales often are np.float32)
        (("math", np.float32(0.5)), (None, (("math", 0.5),))),
        ([("math", np.float64(0.25)), ("style", np.int64(2))], (None, (("math", 0.25), ("style", 2.0)))),
        (("math", np.float32(1.0)), ("math", ())),
        (("math", Fraction(1, 4)), (None, (("math", 0.25),))),
        (("math", -3.4e38), (None, (("math", -3.4e38),))),
    ],
)
def test_each_shape_splits_into_an_id_or_scales(choice: Any, expected: Any) -> None:
    assert split_adapter_choice(choice, provider="test") == expected


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ([], "empty list"),
        ([("math", float("nan"))], "finite number"),
        ([("math", float("inf"))], "finite number"),
        ([("math", "1")], "finite number"),
        ([("math", True)], "finite number"),
        ([("math", np.bool_(True))], "finite number"),
        ([("math", np.float32("nan"))], "finite number"),
        # beyond float32 the backends' scale becomes infinity: refused, not a NaN answer
        ([("math", 1e39)], "float32 can hold"),
        (("math", -1e300), "float32 can hold"),
        ([("math", 1.0), ("math", 0.5)], "appears twice"),
        ([("../etc", 1.0)], "is not valid"),
        ([("math\n", 1.0)], "is not valid"),  # the whole id is checked: not "math" and a line break
        ("math\n", "is not valid"),
        ([("math", 1.0, 2.0)], "is not an \\(id, scale\\) pair"),
        (42, "adapter_id must be an adapter id"),
        (b"math", "adapter_id must be an adapter id"),
    ],
)
def test_bad_choices_are_refused_with_a_sentence(choice: Any, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        split_adapter_choice(choice, provider="test")


def test_a_combination_is_labelled_with_its_scales() -> None:
    assert adapters_label((("math", 1.0), ("style", 0.5))) == "math*1+style*0.5"
    assert adapters_label((("math", -0.25),)) == "math*-0.25"
