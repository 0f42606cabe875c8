"""Model names: name[:tag], lowercase, '#' reserved."""

from __future__ import annotations

import pytest

from specs.names import InvalidName, ModelName, parse_name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gemma3-270m", ModelName("gemma3-270m", "latest")),
        ("qwen3:0.6b", ModelName("qwen3", "0.6b")),
        ("a.b_c-d:q4_k_m", ModelName("a.b_c-d", "q4_k_m")),
        ("x", ModelName("x", "latest")),
        ("9lives:v2", ModelName("9lives", "v2")),
    ],
)
def test_valid_names(text: str, expected: ModelName) -> None:
    assert parse_name(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model#fox", "'#' is reserved"),
        ("Gemma", "try 'gemma'"),
        ("", "name is empty"),
        ("x:", "tag is empty"),
        (":tag", "name is empty"),
        ("a:b:c", "one ':'"),
        ("has space", "' '"),
        ("-leading", "start with a letter or digit"),
        ("a/b", "'/'"),
        ("x" * 129, "longer than 128"),
    ],
)
def test_invalid_names_say_what_to_fix(text: str, message: str) -> None:
    with pytest.raises(InvalidName, match=message.replace("(", r"\(")):
        parse_name(text)


def test_short_form_hides_the_default_tag() -> None:
    assert parse_name("a").short == "a"
    assert parse_name("a:b").short == "a:b"
    assert str(parse_name("a")) == "a:latest"
