"""Model names: name[:tag], lowercase, '+' and '#' reserved; requested names with adapters."""

from __future__ import annotations

import pytest

from specs.names import (
    AdapterChoice,
    InvalidName,
    ModelName,
    Requested,
    parse_name,
    parse_requested,
)


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
        ("model#fox", "'#' are reserved"),
        ("model+fox", "'\\+' and '#' are reserved"),
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


FOX, OWL = AdapterChoice("fox"), AdapterChoice("owl")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tiny", Requested("tiny")),
        ("tiny:q8_0", Requested("tiny:q8_0")),
        ("tiny+fox", Requested("tiny", (FOX,))),
        ("tiny:latest+fox", Requested("tiny:latest", (FOX,))),
        ("tiny+fox+owl", Requested("tiny", (FOX, OWL))),
        ("tiny+fox:0.5", Requested("tiny", (AdapterChoice("fox", 0.5),))),
        ("tiny+fox:0", Requested("tiny", (AdapterChoice("fox", 0.0),))),
        ("tiny+none", Requested("tiny", ())),
        ("tiny#1", Requested("tiny", None, 1)),
        ("tiny#0+fox", Requested("tiny", (FOX,), 0)),
        ("tiny#fox", Requested("tiny", (FOX,))),  # the older spelling, kept as an alias
    ],
)
def test_requested_names(text: str, expected: Requested) -> None:
    assert parse_requested(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tiny+", "an empty adapter name"),
        ("tiny++fox", "an empty adapter name"),
        ("+fox", "names no model"),
        ("tiny+fox+none", "'none' among adapters"),
        ("tiny+fox+fox", "named twice"),
        ("tiny+fox:big", "'big' is not a scale"),
        ("tiny+fox:nan", "'nan' is not a scale"),
        ("tiny#", "replica number"),
        ("tiny#fox+owl", "replica number"),
    ],
)
def test_bad_requested_names_say_the_forms(text: str, message: str) -> None:
    with pytest.raises(InvalidName, match=message):
        parse_requested(text)


def test_requested_names_print_back() -> None:
    for text in ("tiny", "tiny+fox", "tiny+fox:0.5+owl", "tiny+none", "tiny#1+fox"):
        assert str(parse_requested(text)) == text
