"""OpenAI's images API on the gateway: generations, edits, and async image jobs.

- `POST /v1/images/generations` (JSON: `model`, `prompt`, `n`, `size`,
  `response_format` b64_json, and Blazar's extra fields `steps`, `cfg_scale`, `seed`,
  `sampler`, `negative_prompt`, `async`) and `POST /v1/images/edits` (a multipart form:
  `image` or `image[]`, optional `mask`, and the same fields): checked by
  `protocols.openai_images`; the model must be an image model (400 otherwise), and its
  caps (`image_max_size`, `image_max_steps`) are checked here, against the resolved
  model, before the request takes the one request path (`pipeline`: keys, queue,
  lease, trace) to an sdcpp child (`image_jobs.generate`). A client that hangs up
  mid-generation (serve cancels its handler) stops the child's work, as a cancelled
  job does (`image_jobs.stop_abandoned`). With `async=true` a generation answers 202
  with a job instead (`image_jobs.ImageJobs`).
- `GET /v1/images/jobs`, `GET /v1/images/jobs/{id}`, `POST /v1/images/jobs/{id}/cancel`:
  the jobs; with keys in use, a key sees only its own. Cancelling a running job stops
  the child's work.

Failures are raised as `ProtocolError`s and answered in OpenAI's envelope by the app's
errors middleware.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from blazar.protocols import ProtocolError
from blazar.protocols.openai_images import ImageRequest, check_caps, image_request
from blazar.serve.http import TRACE, parse_json_object, trace_id, wants_priority
from blazar.serve.request import steps
from blazar.serve.request.asks import Ask
from blazar.serve.request.image_jobs import ImageJobs, generate, stop_abandoned
from blazar.serve.request.images import Limits, check_image
from blazar.serve.request.pipeline import Leased
from blazar.serve.routes.job_routes import JobRoutes
from blazar.serve.routes.services import Services
from blazar.serve.supervisor.runtime import resolve as resolve_name

GENERATIONS, EDITS = "/v1/images/generations", "/v1/images/edits"
PICTURE_LIMIT = 16 * 1024**2  # bytes of one uploaded picture


@dataclass
class ImageAsk(Ask):
    """A generation or an edit, checked, with the steps to send when it names none."""

    asked: ImageRequest | None = None
    default_steps: int | None = None


class ImagesAPI(JobRoutes[ImageJobs]):
    """The images handlers; one instance per gateway app."""

    noun = "image"

    def __init__(self, services: Services) -> None:
        self.services = services
        self.jobs: ImageJobs | None = None

    def _capped(self, asked: ImageRequest, path: str) -> ImageAsk:
        """The ask, its caps checked against the model it names (when that is an image
        model served here; the pipeline refuses any other with its own words)."""
        default_steps = None
        try:
            runtime = resolve_name(self.services.scheduler.runtimes, asked.model)[0]
        except (KeyError, ValueError):
            runtime = None
        if runtime is not None and runtime.kind == steps.IMAGE:
            default_steps = check_caps(asked, runtime.name, runtime.image_caps)
        return ImageAsk(
            asked.model,
            path,
            {},
            need=steps.IMAGE,
            deferred=asked.run_async,
            asked=asked,
            default_steps=default_steps,
        )

    async def generation_ask(self, request: web.Request) -> Ask:
        asked = image_request(parse_json_object(await request.read()))
        return self._capped(asked, GENERATIONS)

    async def edit_ask(self, request: web.Request) -> Ask:
        fields, pictures, mask = await self._form(request)
        if not pictures:
            raise ProtocolError(
                400, "'image' is required: the picture to edit (a PNG)", "invalid_request_error"
            )
        asked = image_request(fields, images=tuple(pictures))
        if asked.run_async:
            raise ProtocolError(400, "async applies to /v1/images/generations only")
        if mask is not None:
            asked = ImageRequest(**{**asked.__dict__, "mask": mask})
        return self._capped(asked, EDITS)

    async def draw(self, request: web.Request, ask: Ask, leased: Leased | None) -> web.Response:
        assert isinstance(ask, ImageAsk) and ask.asked is not None
        if leased is None:  # async: a job instead
            key, _ = self._who(request)
            job = self._jobs().submit(
                ask.asked, ask.default_steps, key=key, priority=wants_priority(request)
            )
            return web.json_response(job.to_api(), status=202)
        lease = leased.lease
        try:
            answer = await generate(
                self.services.children, lease.url, lease.runtime.name, ask.asked, ask.default_steps
            )
        except asyncio.CancelledError:
            await stop_abandoned(self.services.children, lease.url, lease.member.in_flight)
            raise
        return web.json_response(answer, headers={TRACE: trace_id(request)})

    async def _form(self, request: web.Request) -> tuple[dict[str, Any], list[bytes], bytes | None]:
        """An edit's text fields, its pictures and its mask. The access layer has read the
        body already (within the gateway's body cap), so the form is parsed from it."""
        if request.content_type != "multipart/form-data":
            raise ProtocolError(
                400,
                "send an edit as multipart/form-data, the picture in an 'image' field (as "
                "OpenAI's clients do)",
                "invalid_request_error",
            )
        fields: dict[str, Any] = {}
        pictures: list[bytes] = []
        mask: bytes | None = None
        for name, data, is_file in form_parts(
            request.headers["Content-Type"], await request.read()
        ):
            if is_file:
                if len(data) > PICTURE_LIMIT:
                    raise ProtocolError(
                        413, f"the {name} is over {PICTURE_LIMIT // 1024**2} MiB", "file_too_large"
                    )
                if name in ("image", "image[]"):
                    pictures.append(data)
                elif name == "mask":
                    mask = data
            elif name in ("image", "image[]", "mask"):
                raise ProtocolError(400, f"'{name}' must be a file (a PNG), not text")
            else:
                fields[name] = data.decode(errors="replace")
        # The vision routes' checks: a type sd-server decodes, and a size its header
        # declares that it can allocate (a few bytes may claim 40 GB of pixels).
        limits = Limits.of(self.services.serving)
        for data in pictures:
            check_image(data, "'image'", limits)
        if mask is not None:
            check_image(mask, "'mask'", limits)
        return fields, pictures, mask

    # -- async jobs -----------------------------------------------------------------------


def form_parts(content_type: str, body: bytes) -> list[tuple[str, bytes, bool]]:
    """A multipart/form-data body's parts: (name, bytes, whether it is a file). The gateway
    has the body whole already (the access layer read it within the body cap), and
    aiohttp parses forms only from the stream, so the standard library's MIME parser
    reads it."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise ProtocolError(400, "the multipart form cannot be read: no parts")
    found = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        data = part.get_payload(decode=True)
        is_file = part.get_param("filename", header="content-disposition") is not None
        found.append((name, data if isinstance(data, bytes) else b"", is_file))
    return found


def register(app: web.Application, services: Services) -> None:
    """Add the images routes (through the one pipeline) and their async jobs."""
    api = ImagesAPI(services)
    app.router.add_post(GENERATIONS, services.route(api.generation_ask, api.draw))
    app.router.add_post(EDITS, services.route(api.edit_ask, api.draw))
    app.router.add_get("/v1/images/jobs", api.list_jobs)
    app.router.add_get("/v1/images/jobs/{id}", api.job)
    app.router.add_post("/v1/images/jobs/{id}/cancel", api.cancel)
    if services.control is None:  # as audio jobs: under `blazar serve` only
        return
    jobs = api.jobs = ImageJobs(
        pipeline=services.pipeline, retention=lambda: services.serving.audio_job_retention
    )

    async def start(_: web.Application) -> None:
        await jobs.start()

    app.on_startup.append(start)
    services.closing.append(jobs.close)
