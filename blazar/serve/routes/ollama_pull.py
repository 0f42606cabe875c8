"""ollama's pull and create routes on the gateway: models that arrive over the API.

Both end in the manifest, the way `blazar pull` does (`manifest_ops`, in a
worker thread): the model is declared, only it is reconciled, and on failure
the manifest is put back; then the daemon runs a pass so the scheduler serves it.

- `POST /api/pull` reads `hf.co/owner/repo:QUANT` (as ollama names Hugging Face
  models; Q4_K_M when no quantization is named) as `hf://owner/repo:QUANT`; any
  Blazar source or short name works too, and a name already declared is
  reconciled again. It streams ollama's progress objects (`pulling manifest`,
  `downloading` with digest/total/completed, `verifying sha256 digest`,
  `success`), or on failure ends the stream with `{"error": ...}`.
- `POST /api/create` declares a GGUF from an uploaded blob (`files`, see
  `ollama_blobs`) or an absolute path (`from`) with a file:// source and its
  sha256; `from` an existing model with nothing else is another name for it (as
  `/api/copy`); `from` a model with `quantize` runs `blazar quantize`'s path
  (`blazar.manifest.quantize`: llama-quantize, the result declared under the new name).
  What a Modelfile asks and Blazar cannot do is a 400 that says what to do instead.

A path on the server (`from`, a `file://` pull) must lie in the store, the
uploaded blobs or `serving.import_roots` (`uploads.permitted`), checked before
anything is opened; otherwise the same 403 whether it exists or not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from blazar.errors import InvalidInput, NotFound
from blazar.manifest import ops as manifest_ops
from blazar.models.hashing import sha256_file
from blazar.protocols import ProtocolError, ollama
from blazar.serve.http import TRACE, name_in, read_json, trace_id
from blazar.serve.request import uploads
from blazar.serve.request.steps import Failure, failure, free_name
from blazar.serve.routes.services import Control, Services
from blazar.sources import UnknownModelName, resolve_registry
from reconcilers.plan import Action
from reconcilers.ports import Progress
from specs.names import parse_name
from specs.sources import RegistrySource, parse_source

NDJSON = "application/x-ndjson"
Emit = Callable[[dict[str, Any]], None]
CREATE_REFUSED = {
    "adapters": "declare LoRA adapters under [loras] in the manifest (`blazar lora add`)",
    "template": "ollama templates are Go templates; set chat_template for the model in the "
    "manifest (a template Blazar ships such as 'chatml', Jinja text, or a .jinja file)",
    "system": "Blazar keeps no per-model system prompt: send a system message with each request",
    "messages": "Blazar keeps no per-model conversation: send the messages with each request",
    "license": "Blazar keeps no license text with a model",
    "modelfile": "Modelfiles are not read: send `files` (uploaded blobs) or `from` (a GGUF path)",
}


def register(app: web.Application, services: Services) -> None:
    """Add the pull and create routes to the gateway's app."""
    api = OllamaPull(services)
    app.router.add_post("/api/pull", api.pull)
    app.router.add_post("/api/create", api.create)


def pull_source(requested: str) -> str:
    """An ollama pull name as a Blazar source: `hf.co/owner/repo:QUANT` -> `hf://owner/repo:QUANT`."""
    for host in ("hf.co/", "huggingface.co/"):
        if requested.startswith(host):
            repo, _, quant = requested.removeprefix(host).partition(":")
            quant = quant if quant and quant != "latest" else "Q4_K_M"  # ollama's default
            return f"hf://{repo}:{quant}"
    return requested


def known_short_name(source: str) -> None:
    """An unknown short name is the client's mistake: a 404 before anything is changed
    (not a failed pass, which answers as a server error)."""
    parsed = parse_source(source)  # `source_declaration` has checked that it parses
    if isinstance(parsed, RegistrySource):
        try:
            resolve_registry(parsed.name)
        except UnknownModelName as exc:
            raise NotFound(str(exc)) from None


class OllamaPull:
    """The handlers for models that arrive over the API; one instance per gateway app."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.jobs: set[asyncio.Task[None]] = set()  # pulls and creates outlive their clients

    @property
    def control(self) -> Control:
        return self.services.need_control()

    async def _progress(
        self, request: web.Request, body: dict[str, Any], job: Callable[[Emit], Awaitable[None]]
    ) -> web.StreamResponse:
        """Run a job that emits ollama progress objects; stream them (or answer the last).

        The job runs on if the client goes away, so the manifest and the store always end
        in a consistent state."""
        stream = body.get("stream", True)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        failed: list[int] = []

        async def run() -> None:
            try:
                await job(queue.put_nowait)
            except Exception as exc:  # the client learns of every failure, expected or not
                known = failure(exc) or Failure(500, str(exc) or type(exc).__name__)
                failed.append(known.status)
                queue.put_nowait(ollama.error(known.message or type(exc).__name__))
            finally:
                queue.put_nowait(None)

        task = asyncio.ensure_future(run())
        self.jobs.add(task)
        task.add_done_callback(self.jobs.discard)
        headers = {TRACE: trace_id(request)}
        if stream is False:
            last: dict[str, Any] = {}
            while (item := await queue.get()) is not None:
                last = item
            return web.json_response(last, status=failed[0] if failed else 200, headers=headers)
        response = web.StreamResponse(headers={"Content-Type": NDJSON, **headers})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):  # a client that left: the job goes on
            while (item := await queue.get()) is not None:
                await response.write(ollama.ndjson(item))
            await response.write_eof()
        return response

    def _threadsafe(self, emit: Emit) -> Emit:
        loop = asyncio.get_running_loop()

        def threadsafe(obj: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(emit, obj)

        return threadsafe

    @staticmethod
    def _download_progress(emit: Emit, digest: str) -> Callable[[Action], Progress | None]:
        def progress_for(action: Action) -> Progress | None:
            if action.kind != "model":
                return None
            last = [-1]

            def progress(done: int, total: int | None) -> None:
                step = max((total or 0) // 50, 1 << 20)  # about 50 lines a download
                if done - last[0] < step and done != total:
                    return
                last[0] = done
                line = {"status": "downloading", "digest": digest, "completed": done}
                emit(line if total is None else {**line, "total": total})

            return progress

        return progress_for

    async def pull(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        requested = name_in(body, "model", "name")
        control = self.control
        manifest = manifest_ops.open_manifest(control.manifest)
        key = manifest_ops.declared_key(manifest, requested) or manifest_ops.alias_owner(
            manifest, requested
        )
        fields: dict[str, Any] | None = None
        if key is None:  # named as `blazar pull` names it
            source = pull_source(requested)
            key, fields = manifest_ops.source_declaration(source)
            known_short_name(source)
            uploads.check_source("pull", fields["source"], self._roots())
        name = key

        async def job(emit: Emit) -> None:
            emit({"status": "pulling manifest"})
            digest = fields["source"] if fields else name
            progress_for = self._download_progress(self._threadsafe(emit), digest)
            await asyncio.to_thread(
                manifest_ops.apply_model,
                control.paths,
                control.manifest,
                name,
                fields,
                progress_for=progress_for,
            )
            emit({"status": "verifying sha256 digest"})
            await control.refresh(f"pull {name}")
            emit({"status": f"model '{name}' is declared in {control.manifest}"})
            emit({"status": "success"})

        return await self._progress(request, body, job)

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        name = parse_name(name_in(body, "model", "name")).short
        for key, why in CREATE_REFUSED.items():
            if body.get(key):
                raise ProtocolError(400, f"create: {key} is not supported: {why}")
        fields = self._create_fields(body)
        control = self.control
        if body.get("quantize") is not None:
            return await self._quantize(request, body, name, fields)
        found, digest = await self._create_file(request, body, name)
        if found is None:  # `from` an existing model, changing nothing: another name for it
            await asyncio.to_thread(manifest_ops.add_alias, control.manifest, digest, name)
            await control.refresh(f"create {name} from {digest}")
            return await self._progress(request, body, self._done)
        path = found

        async def job(emit: Emit) -> None:
            emit({"status": "parsing GGUF"})
            sha256 = digest or (await asyncio.to_thread(sha256_file, path))[0]
            emit({"status": f"using existing layer sha256:{sha256}"})
            declared = {"source": path.as_uri(), "sha256": sha256, **fields}
            await asyncio.to_thread(
                manifest_ops.apply_model, control.paths, control.manifest, name, declared
            )
            emit({"status": "writing manifest"})
            await control.refresh(f"create {name}")
            await self._done(emit)

        return await self._progress(request, body, job)

    async def _quantize(
        self, request: web.Request, body: dict[str, Any], name: str, fields: dict[str, Any]
    ) -> web.StreamResponse:
        """`quantize` with `from` a model: `blazar quantize`'s path (`blazar.manifest.quantize`)."""
        from blazar.manifest import quantize

        control = self.control
        try:
            qtype = quantize.quant_type(str(body["quantize"]))
        except InvalidInput as exc:
            raise ProtocolError(400, f"create: quantize: {exc}") from None
        origin = body.get("from")
        if body.get("files") or not isinstance(origin, str) or not origin or "/" in origin:
            raise ProtocolError(
                400,
                "create: quantize needs `from` naming a model Blazar serves (create the model "
                "from its files first, then quantize it)",
            )
        target = self.services.pipeline.resolve_here(request, origin)
        free_name(self.services.scheduler, name, target)
        tool, method = quantize.locate_tool(control.paths, control.store)
        if tool is None:
            raise ProtocolError(400, f"create: quantize: {quantize.missing_tool_message(method)}")
        base = target.runtime.name

        async def job(emit: Emit) -> None:
            emit({"status": f"quantizing {base} model to {qtype}"})
            say = self._threadsafe(emit)
            done = await asyncio.to_thread(
                quantize.quantize_model,
                control.paths,
                control.manifest,
                base,
                qtype,
                name=name,
                fields=fields,
                notify=lambda m: say({"status": m}),
            )
            emit({"status": f"using layer sha256:{done.sha256}"})
            emit({"status": "writing manifest"})
            await control.refresh(f"create {name} (quantize {base} to {qtype})")
            await self._done(emit)

        return await self._progress(request, body, job)

    @staticmethod
    async def _done(emit: Emit) -> None:
        emit({"status": "success"})

    @staticmethod
    def _create_fields(body: dict[str, Any]) -> dict[str, Any]:
        params = body.get("parameters") or {}
        if not isinstance(params, dict):
            raise ProtocolError(400, "create: parameters must be an object")
        other = sorted(k for k in params if k != "num_ctx")
        if other:
            raise ProtocolError(
                400,
                f"create: parameters {', '.join(other)} are not kept per model by Blazar: send "
                "them as options with each request (num_ctx is kept: it becomes the model's ctx)",
            )
        ctx = params.get("num_ctx")
        if ctx is None:
            return {}
        if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1:
            raise ProtocolError(400, "create: parameters.num_ctx must be a positive integer")
        return {"ctx": ctx}

    def _roots(self) -> tuple[Path, ...]:
        return uploads.readable_roots(self.control.paths, self.services.serving)

    async def _create_file(
        self, request: web.Request, body: dict[str, Any], name: str
    ) -> tuple[Path | None, str]:
        """The GGUF to declare and its sha256 (empty: hash it), or (None, model) for a copy."""
        files, origin = body.get("files"), body.get("from")
        if files:
            if not isinstance(files, dict):
                raise ProtocolError(400, "create: files must map file names to sha256 digests")
            ggufs = [(f, d) for f, d in files.items() if str(f).endswith(".gguf")]
            if len(ggufs) != 1 or len(files) != 1:
                raise ProtocolError(
                    400,
                    "create: Blazar serves one GGUF file per model (no safetensors, no vision "
                    "projector); send files with exactly one .gguf blob",
                )
            match = uploads.DIGEST.fullmatch(str(ggufs[0][1]))
            blob = uploads.blob_path(self.control.paths, match.group(1)) if match else None
            if blob is None or not blob.is_file():
                raise ProtocolError(
                    400,
                    f"create: blob {ggufs[0][1]} is not uploaded: POST /api/blobs/<digest> first",
                )
            return blob, match.group(1) if match else ""
        if isinstance(origin, str) and origin:
            if origin.startswith("/"):
                path = uploads.permitted(origin, self._roots())  # before anything is opened
                if path is None:
                    raise uploads.refused("create: from", origin)
                if not path.is_file():
                    raise ProtocolError(400, f"create: from: no such file: {origin}")
                return path, ""
            if body.get("parameters"):
                raise ProtocolError(
                    400,
                    f"create: to serve '{origin}' with other settings as '{name}', declare "
                    f"[models.{name}] in the manifest with the same source and the settings",
                )
            target = self.services.pipeline.resolve_here(request, origin)
            free_name(self.services.scheduler, name, target)
            return None, target.runtime.name
        raise ProtocolError(400, "create: send `files` (an uploaded GGUF blob) or `from`")
