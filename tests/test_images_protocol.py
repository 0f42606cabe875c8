"""OpenAI's images API as Blazar reads it (`blazar.protocols.openai_images`): the request's
fields and refusals, the caps, what the sdcpp engine is sent, the answer's shape. Pure:
tables of cases, no child."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from blazar.protocols import ProtocolError
from blazar.protocols.openai_images import (
    ImageRequest,
    answer,
    check_caps,
    extra_args,
    image_request,
)

BASE = {"model": "sd", "prompt": "a cat"}


def block(prompt: str) -> dict[str, Any]:
    """The `<sd_cpp_extra_args>` JSON at the end of an engine prompt."""
    inner = prompt.split("<sd_cpp_extra_args>", 1)[1].removesuffix("</sd_cpp_extra_args>")
    return dict(json.loads(inner))


def test_a_generation_becomes_the_engines_body() -> None:
    asked = image_request(
        {
            **BASE,
            "n": 2,
            "size": "64x48",
            "steps": 4,
            "cfg_scale": 2.5,
            "seed": 7,
            "sampler": "euler",
            "negative_prompt": "dogs",
            "quality": "hd",  # OpenAI's, ignored
            "user": "u1",
        }
    )
    body = asked.engine_body()
    assert body["prompt"].startswith("a cat<sd_cpp_extra_args>")
    assert {k: v for k, v in body.items() if k != "prompt"} == {
        "n": 2,
        "size": "64x48",
        "output_format": "png",
    }
    assert block(body["prompt"]) == {
        "embed_image_metadata": False,
        "seed": 7,
        "negative_prompt": "dogs",
        "sample_params": {
            "sample_steps": 4,
            "guidance": {"txt_cfg": 2.5},
            "sample_method": "euler",
        },
    }


def test_defaults_and_a_cap_below_the_engines_default_steps() -> None:
    asked = image_request(BASE)
    assert (asked.width, asked.height, asked.n, asked.steps, asked.run_async) == (
        512,
        512,
        1,
        None,
        False,
    )
    assert check_caps(asked, "sd", (1024, 1024, 50)) is None  # the engine's default (20) fits
    assert check_caps(asked, "sd", (1024, 1024, 8)) == 8  # sent, so the cap holds
    assert block(asked.engine_body(8)["prompt"])["sample_params"] == {"sample_steps": 8}


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"prompt": "x"}, "'model' is required"),
        ({"model": "sd"}, "'prompt' is required"),
        ({**BASE, "prompt": "  "}, "'prompt' is required"),
        ({**BASE, "response_format": "url"}, "returns each picture in the answer as base64"),
        ({**BASE, "response_format": "png"}, "response_format must be 'b64_json'"),
        ({**BASE, "output_format": "webp"}, "output_format must be 'png'"),
        ({**BASE, "size": "big"}, "WIDTHxHEIGHT"),
        ({**BASE, "size": "0x64"}, "WIDTHxHEIGHT"),
        ({**BASE, "n": 0}, "'n' must be 1 to 10"),
        ({**BASE, "n": 11}, "'n' must be 1 to 10"),
        ({**BASE, "n": True}, "'n' must be an integer"),
        ({**BASE, "steps": 0}, "'steps' must be at least 1"),
        ({**BASE, "cfg_scale": "x"}, "'cfg_scale' must be a number"),
        ({**BASE, "seed": -1}, "'seed' must be 0 to"),
        ({**BASE, "sampler": "nope"}, "'sampler' must be one of"),
        ({**BASE, "async": "maybe"}, "'async' must be true or false"),
        ({**BASE, "prompt": "x<sd_cpp_extra_args>{}</sd_cpp_extra_args>"}, "may not carry"),
    ],
)
def test_refusals_say_what_is_wrong(body: dict[str, Any], said: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        image_request(body)
    assert caught.value.status == 400 and said in caught.value.message


@pytest.mark.parametrize(
    ("size", "steps", "said"),
    [
        ("2048x64", None, "size 2048x64 is over model 'sd''s cap of 1024x768"),
        ("64x1024", None, "(models.sd.image_max_size)"),
        ("64x64", 51, "steps 51 is over model 'sd''s cap of 50 (models.sd.image_max_steps)"),
    ],
)
def test_caps_name_the_field(size: str, steps: int | None, said: str) -> None:
    asked = image_request({**BASE, "size": size, "steps": steps})
    with pytest.raises(ProtocolError) as caught:
        check_caps(asked, "sd", (1024, 768, 50))
    assert caught.value.status == 400 and said in caught.value.message


def test_an_edit_carries_its_pictures_in_base64() -> None:
    asked = image_request({**BASE, "n": "2", "seed": "3"}, images=(b"\x89PNG1", b"\x89PNG2"))
    asked = ImageRequest(**{**asked.__dict__, "mask": b"M"})
    body = asked.engine_body()
    assert asked.edit and asked.n == 2 and asked.seed == 3  # form fields are text
    assert [base64.b64decode(i) for i in body["images"]] == [b"\x89PNG1", b"\x89PNG2"]
    assert base64.b64decode(body["mask"]) == b"M"


def test_the_answer_is_openais_shape() -> None:
    engine = {"created": 5, "output_format": "png", "data": [{"b64_json": "QUJD"}, {"x": 1}]}
    assert answer(engine, 9) == {"created": 5, "data": [{"b64_json": "QUJD"}]}
    with pytest.raises(ProtocolError) as caught:
        answer({"error": "boom"}, 9)
    assert caught.value.status == 502


def test_extra_args_without_options_only_turn_off_the_metadata() -> None:
    assert block(extra_args(None, None, None, None)) == {"embed_image_metadata": False}


def test_blazar_why_says_what_was_drawn() -> None:
    from blazar.observe.outcome import from_response
    from blazar.observe.trail import render

    summary = {"images": 2, "seconds": 3.2, "steps": 4, "seconds_per_step": 0.8}
    out = from_response("/v1/images/generations", summary)
    assert out.text is None and out.images == 2 and out.predicted_ms == 3200
    record = {"id": "t1", "time": 0, "protocol": "openai", "route": "/v1/images/generations"}
    lines = render({**record, "requested": "sd", "model": "sd", "image": out.image, "status": 200})
    assert any("drew 2 picture(s) in 3.2 s in 4 steps, 0.800 s a step" in line for line in lines)
