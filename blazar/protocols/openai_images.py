"""OpenAI's images API: the generation and edit requests' fields, the caps, the answer.

Pure: the gateway (`blazar.serve.routes.images_api`) hands in the JSON body (or an edit's
form fields) and gets back an `ImageRequest` checked here, whose `engine_body` is what
the sdcpp lane's launcher is sent (`blazar.engines.launchers.sd_launcher`, which passes
it to stable-diffusion.cpp's own OpenAI route). OpenAI's fields: `model`, `prompt`, `n`
(1 to 10), `size` (WIDTHxHEIGHT), `response_format` (`b64_json` only: Blazar keeps no
images to link to, so `url` is a 400 that says so); `quality`, `style`, `user`,
`background`, `moderation` are accepted and ignored. Blazar's documented extra fields,
stable-diffusion.cpp's request options: `steps`, `cfg_scale`, `seed`, `sampler`,
`negative_prompt`, and `async` (a job instead of the answer). stable-diffusion.cpp's
OpenAI route takes its own options as a `<sd_cpp_extra_args>` JSON block at the end of
the prompt (its examples/server/api.md), so `engine_body` writes them there; a client's
prompt that carries such a block itself is refused, since it would change what the caps
checked.

`check_caps` refuses (400, naming the manifest field) a size or a step count over the
model's caps before any work; `answer` shapes the engine's reply as OpenAI's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blazar.protocols import ProtocolError

MAX_N = 10
DEFAULT_SIZE = "512x512"  # sd-server's own default; OpenAI's 1024x1024 is slow on a CPU
DEFAULT_STEPS = 20  # stable-diffusion.cpp's default sample_steps
SAMPLERS = (
    "euler",
    "euler_a",
    "heun",
    "dpm2",
    "dpm++2s_a",
    "dpm++2m",
    "dpm++2mv2",
    "ipndm",
    "ipndm_v",
    "lcm",
    "ddim_trailing",
    "tcd",
)
_SIZE = re.compile(r"^([1-9][0-9]{0,4})x([1-9][0-9]{0,4})$")
_BLOCK = "<sd_cpp_extra_args>"


def _bad(message: str) -> ProtocolError:
    return ProtocolError(400, message, "invalid_request_error")


def extra_args(
    steps: int | None,
    cfg_scale: float | None,
    seed: int | None,
    sampler: str | None,
    negative_prompt: str | None = None,
) -> str:
    """stable-diffusion.cpp's request options as its OpenAI routes take them: a
    `<sd_cpp_extra_args>` JSON block for the end of the prompt."""
    sample: dict[str, Any] = {}
    if steps is not None:
        sample["sample_steps"] = steps
    if cfg_scale is not None:
        sample["guidance"] = {"txt_cfg": cfg_scale}
    if sampler is not None:
        sample["sample_method"] = sampler
    extra: dict[str, Any] = {"embed_image_metadata": False}
    if seed is not None:
        extra["seed"] = seed
    if negative_prompt:
        extra["negative_prompt"] = negative_prompt
    if sample:
        extra["sample_params"] = sample
    return f"{_BLOCK}{json.dumps(extra, separators=(',', ':'))}</sd_cpp_extra_args>"


@dataclass(frozen=True)
class ImageRequest:
    """A generation (or, with `images`, an edit) as checked here."""

    model: str
    prompt: str
    n: int = 1
    width: int = 512
    height: int = 512
    steps: int | None = None
    cfg_scale: float | None = None
    seed: int | None = None
    sampler: str | None = None
    negative_prompt: str | None = None
    run_async: bool = False
    images: tuple[bytes, ...] = ()  # an edit's pictures (the first is the one edited)
    mask: bytes | None = None

    @property
    def size(self) -> str:
        return f"{self.width}x{self.height}"

    @property
    def edit(self) -> bool:
        return bool(self.images)

    def engine_body(self, default_steps: int | None = None) -> dict[str, Any]:
        """What the sdcpp launcher is sent (JSON; an edit's pictures in base64, which the
        launcher puts back into the multipart form sd-server reads). `default_steps`: the
        steps sent when the request names none (the cap, when it is below the engine's
        default)."""
        steps = self.steps if self.steps is not None else default_steps
        prompt = self.prompt + extra_args(
            steps, self.cfg_scale, self.seed, self.sampler, self.negative_prompt
        )
        body: dict[str, Any] = {
            "prompt": prompt,
            "n": self.n,
            "size": self.size,
            "output_format": "png",
        }
        if self.images:
            import base64

            body["images"] = [base64.b64encode(i).decode() for i in self.images]
            if self.mask is not None:
                body["mask"] = base64.b64encode(self.mask).decode()
        return body


def _int(value: object, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)  # a form's field is text
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        span = f"{low} to {high}" if high is not None else f"at least {low}"
        raise _bad(f"'{name}' must be {span}, got {value}")
    return value


def _float(value: object, name: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise _bad(f"'{name}' must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"'{name}' must be a number, got {value!r}")
    if not 0 <= value <= 100:
        raise _bad(f"'{name}' must be 0 to 100, got {value}")
    return float(value)


def _bool(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise _bad(f"'{name}' must be true or false, got {value!r}")


def parse_size(text: object) -> tuple[int, int]:
    match = _SIZE.match(text) if isinstance(text, str) else None
    if match is None:
        raise _bad(f"'size' must be WIDTHxHEIGHT in pixels, such as 512x512; got {text!r}")
    return int(match.group(1)), int(match.group(2))


def image_request(body: Mapping[str, Any], *, images: tuple[bytes, ...] = ()) -> ImageRequest:
    """A generation's JSON body (or an edit's form fields and `images`), checked."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required: the name of an image model served here")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise _bad("'prompt' is required: a text describing the picture")
    if _BLOCK in prompt:
        raise _bad(
            "the prompt may not carry <sd_cpp_extra_args>: send steps, cfg_scale, seed, "
            "sampler and negative_prompt as fields of the request"
        )
    response_format = body.get("response_format", "b64_json")
    if response_format == "url":
        raise _bad(
            "response_format 'url' is not offered: Blazar keeps no images to link to and "
            "returns each picture in the answer as base64 (response_format 'b64_json')"
        )
    if response_format not in (None, "b64_json"):
        raise _bad(f"response_format must be 'b64_json', got {response_format!r}")
    output_format = body.get("output_format", "png")
    if output_format not in (None, "png"):
        raise _bad(f"output_format must be 'png' (the pictures are PNG), got {output_format!r}")
    width, height = parse_size(body.get("size") or DEFAULT_SIZE)
    sampler = body.get("sampler")
    if sampler is not None and sampler not in SAMPLERS:
        raise _bad(f"'sampler' must be one of {', '.join(SAMPLERS)}; got {sampler!r}")
    negative = body.get("negative_prompt")
    if negative is not None and not isinstance(negative, str):
        raise _bad("'negative_prompt' must be a string")
    if negative is not None and _BLOCK in negative:
        raise _bad("the negative prompt may not carry <sd_cpp_extra_args>")
    seed = body.get("seed")
    return ImageRequest(
        model=model,
        prompt=prompt,
        n=_int(body.get("n", 1), "n", 1, MAX_N),
        width=width,
        height=height,
        steps=None if body.get("steps") is None else _int(body["steps"], "steps", 1),
        cfg_scale=None if body.get("cfg_scale") is None else _float(body["cfg_scale"], "cfg_scale"),
        seed=None if seed is None else _int(seed, "seed", 0, 2**31 - 1),
        sampler=sampler,
        negative_prompt=negative,
        run_async=_bool(body.get("async", False), "async"),
        images=images,
    )


def check_caps(request: ImageRequest, model: str, caps: tuple[int, int, int]) -> int | None:
    """Refuse (400) a picture or a step count over the model's caps, naming the field to
    raise; the steps to send when the request names none (None: the engine's default,
    which is within the cap)."""
    width, height, steps = caps
    if request.width > width or request.height > height:
        raise _bad(
            f"size {request.size} is over model '{model}''s cap of {width}x{height} "
            f"(models.{model}.image_max_size): ask for a smaller picture, or raise the cap"
        )
    if request.steps is not None and request.steps > steps:
        raise _bad(
            f"steps {request.steps} is over model '{model}''s cap of {steps} "
            f"(models.{model}.image_max_steps): ask for fewer, or raise the cap"
        )
    return steps if request.steps is None and steps < DEFAULT_STEPS else None


def answer(payload: Mapping[str, Any], created: int) -> dict[str, Any]:
    """The engine's reply as OpenAI's: `created` and `data`, one `b64_json` per picture."""
    data = payload.get("data")
    if not isinstance(data, list):
        raise ProtocolError(502, "the image engine answered no 'data' list", "upstream_error")
    pictures = [
        {"b64_json": d["b64_json"]} for d in data if isinstance(d, dict) and d.get("b64_json")
    ]
    return {"created": int(payload.get("created") or created), "data": pictures}
