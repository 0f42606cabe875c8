"""ollama's blob routes on the gateway: `HEAD` and `POST /api/blobs/:digest`.

`ollama create` uploads a GGUF here before it creates a model from it
(`ollama_pull`). An upload is streamed to disk under a temporary name, never
held in memory; it is refused as soon as its first bytes are not a GGUF
header (nothing more is written), when it grows past `uploads.upload_cap`
(`serving.max_upload`, and the free disk less a margin) or stalls for longer
than `serving.body_timeout` per MiB; it is kept only when its sha256 matches
the digest and its whole header parses (`gguf_info.read_header`). What is
kept and never used by a model is removed later (`uploads.sweep`). Errors name
no server path.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import uuid
from pathlib import Path

from aiohttp import web

from blazar.errors import NotGGUF
from blazar.models.gguf import has_gguf_magic, read_header
from blazar.protocols import ProtocolError
from blazar.serve.request import uploads
from blazar.serve.routes.services import Services
from specs.sizes import format_size

CHUNK = 1 << 20
NOT_GGUF = (
    "the upload is not a GGUF model ({why}): Blazar serves GGUF files; convert the model "
    "with llama.cpp's convert_hf_to_gguf.py"
)


def register(app: web.Application, services: Services) -> None:
    """Add the blob routes to the gateway's app."""
    api = OllamaBlobs(services)
    app.router.add_route("HEAD", "/api/blobs/{digest}", api.has_blob)
    app.router.add_post("/api/blobs/{digest}", api.put_blob)


class OllamaBlobs:
    """The upload handlers; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def _blob(self, request: web.Request) -> tuple[str, Path]:
        match = uploads.DIGEST.fullmatch(request.match_info["digest"])
        if match is None:
            raise ProtocolError(400, "a blob digest is sha256:<64 lowercase hex digits>")
        sha256 = match.group(1)
        return sha256, uploads.blob_path(self.services.need_control().paths, sha256)

    async def has_blob(self, request: web.Request) -> web.StreamResponse:
        _, blob = self._blob(request)
        return web.Response(status=200 if blob.is_file() else 404)

    async def put_blob(self, request: web.Request) -> web.StreamResponse:
        expected, target = self._blob(request)
        if target.is_file():
            return web.Response(status=200)
        target.parent.mkdir(parents=True, exist_ok=True)
        serving = self.services.serving
        cap = uploads.upload_cap(serving.max_upload, shutil.disk_usage(target.parent).free)
        too_big = ProtocolError(
            413,
            f"the upload is larger than the {format_size(cap)} the gateway accepts now "
            "(serving.max_upload, and the free disk space less 1 GiB)",
        )
        if request.content_length is not None and request.content_length > cap:
            raise too_big
        tmp = target.with_name(f"{uploads.TMP_PREFIX}{uuid.uuid4().hex}")
        try:
            digest = await self._receive(request, tmp, cap, too_big, serving.body_timeout)
            if digest != expected:
                raise ProtocolError(
                    400, f"digest mismatch: the upload's sha256 is {digest}, not {expected}"
                )
            try:
                await asyncio.to_thread(read_header, tmp)
            except NotGGUF:  # its message names the temporary file: not for clients
                why = "its header is truncated or damaged"
                raise ProtocolError(400, NOT_GGUF.format(why=why)) from None
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
        return web.Response(status=201)

    @staticmethod
    async def _receive(
        request: web.Request, tmp: Path, cap: int, too_big: ProtocolError, timeout: float
    ) -> str:
        """Write the body to `tmp`; its sha256. Each MiB must arrive within `timeout`."""
        digest = hashlib.sha256()
        written = 0
        head = b""
        with tmp.open("wb") as out:
            while True:
                last = False
                try:
                    async with asyncio.timeout(timeout):
                        chunk = await request.content.readexactly(CHUNK)
                except asyncio.IncompleteReadError as exc:  # the body's end
                    chunk, last = exc.partial, True
                except TimeoutError:
                    raise ProtocolError(
                        408, f"the upload is too slow: a MiB took longer than {timeout:g} s"
                    ) from None
                if len(head) < 8:
                    head += chunk[: 8 - len(head)]
                    if len(head) == 8 and not has_gguf_magic(head):
                        raise ProtocolError(400, NOT_GGUF.format(why="its first bytes"))
                written += len(chunk)
                if written > cap:
                    raise too_big
                digest.update(chunk)
                out.write(chunk)
                if last:
                    break
        if len(head) < 8:
            raise ProtocolError(400, NOT_GGUF.format(why="it is shorter than a header"))
        return digest.hexdigest()
