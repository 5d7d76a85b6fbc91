"""`--concurrency 1,4,16` and `--rate 2.5,5`: the levels they give, the texts they refuse."""

from __future__ import annotations

import pytest

from servepilot.core.errors import ConfigError
from servepilot.load.levels import parse_levels


def test_a_list_gives_its_levels_in_order() -> None:
    assert parse_levels("1,4,16", "--concurrency") == (1.0, 4.0, 16.0)
    assert parse_levels(" 2.5, 5 ", "--rate") == (2.5, 5.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,x", "--rate '1,x': 'x' is not a number"),
        ("1,,2", "--rate '1,,2': '' is not a number"),
        ("4,0", "--rate '4,0': levels must be positive"),
        ("-2", "--rate '-2': levels must be positive"),
    ],
)
def test_what_is_not_a_positive_list_is_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_levels(text, "--rate")
