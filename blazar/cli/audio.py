"""Audio commands: `blazar whisper` (speech to text) and `blazar tts` (text to speech).

`blazar whisper FILE` transcribes through the daemon (`/v1/audio/transcriptions`,
starting `blazar serve` when none runs), or with `--local` on an engine child of
its own (the model's files and the active whisper engine, no daemon);
`blazar tts TEXT` speaks through `/v1/audio/speech` (or `--local`) and writes a
WAV file (`-o -`: to stdout; it plays nothing). `--search [SUBSTR]` lists the
catalog (`blazar.sources.speech_catalog`: whisper sizes with their disk bytes,
piper voices by language, locale and name), each with whether it is pulled;
`--refresh` reads the catalog from the hub first. `--pull NAME` declares the
catalog's model in your manifest and fetches it (`manifest_ops.apply_model`);
`--install` installs the lane's engine (`blazar engine update --kind whisper|piper`).
"""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, manifest_option, pass_context
from blazar.cli.format import echo_json, human_bytes, table
from blazar.errors import BlazarError, InvalidInput, NotFound

FORMATS = ("text", "srt", "vtt", "json", "verbose_json")


def search_option(what: str) -> Any:
    """`--search` alone lists everything; `--search SUBSTR` what matches."""
    return click.option(
        "--search",
        "search",
        is_flag=False,
        flag_value="",
        default=None,
        metavar="[SUBSTR]",
        help=f"List the {what} (matching SUBSTR).",
    )


# -- shared ----------------------------------------------------------------------------------


def _held(ctx: Context, kind: str) -> list[Any]:
    return [m for m in ctx.store.list_models() if m.kind == kind]


def _choose(ctx: Context, kind: str, given: str | None, pull: str) -> str:
    """The model to use: the one given, else the only one of `kind` held."""
    if given:
        return given
    held = _held(ctx, kind)
    if len(held) == 1:
        return str(held[0].ref.short)
    if not held:
        raise NotFound(f"no {kind} model is held: pull one first (`{pull}`)")
    names = ", ".join(m.ref.short for m in held)
    flag = "--voice" if kind == "speech" else "--model"
    raise InvalidInput(f"several {kind} models are held ({names}): choose one with {flag}")


def _install(ctx: Context, kind: str) -> None:
    from blazar.engines.service import Engines

    outcome = Engines(ctx.store, ctx.paths).update(kind, progress=click.echo)
    click.echo(f"{kind}: {outcome.message}")


def _pull(ctx: Context, manifest: Path | None, name: str, source: str, kind: str) -> None:
    from blazar.cli.manifest import _event, _progress_for
    from blazar.manifest import ops as manifest_ops

    path = manifest or ctx.paths.manifest
    manifest_ops.apply_model(
        ctx.paths,
        path,
        name,
        {"source": source, "kind": kind},
        notify=lambda m: click.echo(m, err=True),
        on_event=_event,
        progress_for=_progress_for,
    )
    click.echo(f"pulled {name} (declared in {path})")


def _post(url: str, path: str, body: bytes, content_type: str) -> tuple[bytes, str]:
    """POST to the daemon; (body, content type), or a BlazarError with its message."""
    import urllib.error
    import urllib.request

    from blazar.cli.serve import error_detail, headers, no_daemon

    sent = {**headers(), "Content-Type": content_type}
    request = urllib.request.Request(url + path, data=body, headers=sent, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=3600) as resp:
            return resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raise BlazarError(f"{path}: {exc.code}: {error_detail(exc)}") from None
    except (urllib.error.URLError, ConnectionError) as exc:
        raise no_daemon(url, exc) from None


def multipart(fields: dict[str, str], filename: str, data: bytes) -> tuple[bytes, str]:
    """A multipart/form-data body: the text fields, then the file."""
    boundary = f"blazar-{uuid.uuid4().hex}"
    out = bytearray()
    for name, value in fields.items():
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode()
        out += value.encode() + b"\r\n"
    safe = filename.replace('"', "_")
    out += (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{safe}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    out += data + f"\r\n--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


def _engine_for(ctx: Context, model: str, kind: str, lane: str) -> tuple[Any, Any]:
    """(the model's record, its lane's active engine) for `--local`."""
    from blazar.engines.ledger import EngineStore
    from specs.names import parse_name

    record = ctx.store.get_model(parse_name(model))
    if record.kind != kind:
        raise InvalidInput(f"model '{record.ref.short}' is a {record.kind} model, not {kind}")
    engine = EngineStore(ctx.store).active(lane)
    if engine is None:
        raise NotFound(
            f"no {lane} engine is installed: `blazar {'whisper' if lane == 'whisper' else 'tts'}"
            " --install` (or `blazar engine update --kind " + lane + "`)"
        )
    return record, engine


def _declared_args(ctx: Context, manifest_path: Path | None, model: str, kind: str) -> list[str]:
    """What the manifest adds to the model's engine child (`deterministic`, `args`), as
    `blazar serve` would spawn it: `--local` must not answer differently."""
    from blazar.reconcile.apply import load_or_empty
    from blazar.serve.supervisor.build import audio_args

    manifest = load_or_empty(manifest_path or ctx.paths.manifest)
    return list(audio_args(manifest.declared_model(model), kind))


def _local(ctx: Context, engine: Any, model_path: str, call: Any, extra: list[str]) -> Any:
    """Run `call(url)` against an engine child of this command's own."""
    import asyncio

    from blazar.engines.process import EngineServer
    from blazar.serve.supervisor.runtime import default_threads

    async def run() -> Any:
        args = ["--model", model_path, "--threads", str(default_threads()), *extra]
        log = ctx.paths.logs / f"local-{engine.tag}.log"
        async with EngineServer(engine.command, args, log) as server:
            return await asyncio.to_thread(call, server.url)

    return asyncio.run(run())


def _pulled(held: list[Any], match: Any) -> str:
    found = [m.ref.short for m in held if match(m)]
    return ", ".join(found) if found else ""


# -- blazar whisper ----------------------------------------------------------------------------


@click.command("whisper")
@click.argument("file", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--model", default=None, help="A transcription model (default: the only one held).")
@click.option("--language", default=None, help="The spoken language (default: detected).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--translate", is_flag=True, help="Translate into English instead.")
@click.option("--local", is_flag=True, help="Run the engine here, without the daemon.")
@click.option("--url", default=None, help="The daemon (default: the running one, or start one).")
@search_option("catalog of sizes")
@click.option("--refresh", is_flag=True, help="With --search: read the catalog from the hub.")
@click.option("--json", "as_json", is_flag=True, help="With --search: one JSON object a line.")
@click.option("--pull", "pull", default=None, metavar="SIZE", help="Declare and fetch a size.")
@click.option("--install", is_flag=True, help="Install the whisper engine (faster-whisper).")
@manifest_option
@pass_context
def whisper(
    ctx: Context,
    file: Path | None,
    model: str | None,
    language: str | None,
    fmt: str,
    translate: bool,
    local: bool,
    url: str | None,
    search: str | None,
    refresh: bool,
    as_json: bool,
    pull: str | None,
    install: bool,
    manifest_path: Path | None,
) -> None:
    """Transcribe FILE (any audio faster-whisper decodes) and print the text.

    `--search [SUBSTR]` lists the model sizes (tiny ... large-v3, large-v3-turbo, the .en
    and distil ones) with their disk size and whether pulled; `--pull SIZE` fetches one.
    """
    from blazar.sources import speech_catalog

    if install:
        _install(ctx, "whisper")
    if pull is not None:
        size = speech_catalog.find_size(pull, ctx.paths.cache)
        if size is None:
            raise NotFound(f"no whisper size {pull!r} in the catalog: `blazar whisper --search`")
        _pull(ctx, manifest_path, size.model_name, size.source, "transcription")
    if search is not None:
        _search_whisper(ctx, search, refresh, as_json)
    if file is None:
        if search is None and pull is None and not install:
            raise click.UsageError("give a FILE to transcribe, or --search, --pull or --install")
        return
    data = file.read_bytes()
    chosen = _choose(ctx, "transcription", model, "blazar whisper --pull base")
    fields = {"model": chosen, "response_format": fmt if fmt != "text" else "text"}
    if language:
        fields["language"] = language
    if local:
        extra = _declared_args(ctx, manifest_path, chosen, "transcription")
        text = _whisper_local(ctx, chosen, data, fields, translate, extra)
    else:
        from blazar.cli.serve import ensure_daemon

        base = ensure_daemon(ctx.paths, url)
        body, content_type = multipart(fields, file.name, data)
        path = "/v1/audio/translations" if translate else "/v1/audio/transcriptions"
        answer, _ = _post(base, path, body, content_type)
        text = answer.decode()
    click.echo(text.rstrip("\n"))


def _whisper_local(
    ctx: Context,
    model: str,
    data: bytes,
    fields: dict[str, str],
    translate: bool,
    extra: list[str],
) -> str:
    from blazar.engines.audio_bench import transcribe
    from blazar.protocols.openai_audio import Transcript, render, transcription_request

    asked = transcription_request(
        {k: [v] for k, v in fields.items()}, "translate" if translate else "transcribe"
    )
    record, engine = _engine_for(ctx, model, "transcription", "whisper")
    lines = _local(
        ctx, engine, record.path, lambda url: transcribe(url, data, asked.query()), extra
    )
    heard = Transcript(task=asked.task)
    for line in lines:
        if line.get("type") == "error":
            raise BlazarError(f"the whisper engine failed: {line.get('message')}")
        heard.feed(line)
    return render(heard, asked)[0]


def _search_whisper(ctx: Context, text: str, refresh: bool, as_json: bool) -> None:
    from blazar.sources import speech_catalog

    if refresh:
        speech_catalog.refresh_whisper(ctx.paths.cache)
    held = _held(ctx, "transcription")
    sizes = speech_catalog.search(speech_catalog.whisper_sizes(ctx.paths.cache), text)

    def pulled(size: Any) -> str:
        names = (size.model_name, f"faster-whisper-{size.name}")
        return _pulled(held, lambda m: m.source == size.source or m.ref.name in names)

    if as_json:
        for size in sizes:
            echo_json({**asdict(size), "source": size.source, "pulled": pulled(size) or None})
        return
    if not sizes:
        click.echo(f"No whisper size matches {text!r}.")
        return
    rows = [
        [
            s.name,
            s.languages,
            s.parameters,
            ("" if s.exact else "~") + human_bytes(s.bytes),
            f"{s.stored}, runs int8",
            pulled(s) or "-",
            s.source,
        ]
        for s in sizes
    ]
    headers = ["SIZE", "LANGUAGES", "PARAMS", "DISK", "QUANTIZATION", "PULLED", "SOURCE"]
    click.echo(table(headers, rows))


# -- blazar tts --------------------------------------------------------------------------------


@click.command("tts")
@click.argument("text", required=False)
@click.option("--voice", default=None, help="A speech model or catalog voice (default: the only).")
@click.option("-o", "--output", default="speech.wav", show_default=True, help="'-': stdout.")
@click.option(
    "--format", "fmt", type=click.Choice(["wav", "pcm"]), default="wav", show_default=True
)
@click.option("--speed", type=float, default=1.0, show_default=True, help="0.25 to 4.0.")
@click.option("--local", is_flag=True, help="Run the engine here, without the daemon.")
@click.option("--url", default=None, help="The daemon (default: the running one, or start one).")
@search_option("voice catalog")
@click.option("--refresh", is_flag=True, help="With --search: read the catalog from the hub.")
@click.option("--json", "as_json", is_flag=True, help="With --search: one JSON object a line.")
@click.option("--pull", "pull", default=None, metavar="VOICE", help="Declare and fetch a voice.")
@click.option("--install", is_flag=True, help="Install the piper engine (piper-tts).")
@manifest_option
@pass_context
def tts(
    ctx: Context,
    text: str | None,
    voice: str | None,
    output: str,
    fmt: str,
    speed: float,
    local: bool,
    url: str | None,
    search: str | None,
    refresh: bool,
    as_json: bool,
    pull: str | None,
    install: bool,
    manifest_path: Path | None,
) -> None:
    """Speak TEXT ('-': read it from stdin) into a WAV file; nothing is played.

    `--search SUBSTR` lists the piper voices by language, locale or name, with quality,
    size and whether pulled; `--pull VOICE` (such as en_US-amy-medium) fetches one.
    """
    from blazar.sources import speech_catalog

    if install:
        _install(ctx, "piper")
    if pull is not None:
        found = speech_catalog.find_voice(pull, ctx.paths.cache)
        if found is None:
            raise NotFound(f"no voice {pull!r} in the catalog: `blazar tts --search {pull[:5]}`")
        _pull(ctx, manifest_path, found.model_name, found.source, "speech")
    if search is not None:
        _search_voices(ctx, search, refresh, as_json)
    if text is None:
        if search is None and pull is None and not install:
            raise click.UsageError("give the TEXT to speak, or --search, --pull or --install")
        return
    if text == "-":
        text = sys.stdin.read()
    chosen = _choose(ctx, "speech", _voice_name(ctx, voice), "blazar tts --pull en_US-amy-medium")
    body = {"model": chosen, "input": text, "response_format": fmt, "speed": speed}
    if local:
        audio = _tts_local(ctx, chosen, body, _declared_args(ctx, manifest_path, chosen, "speech"))
    else:
        from blazar.cli.serve import ensure_daemon

        base = ensure_daemon(ctx.paths, url)
        audio, _ = _post(base, "/v1/audio/speech", json.dumps(body).encode(), "application/json")
    if output == "-":
        sys.stdout.buffer.write(audio)
        sys.stdout.buffer.flush()
        return
    Path(output).write_bytes(audio)
    click.echo(f"wrote {output} ({human_bytes(len(audio))}) with {chosen}", err=True)


def _voice_name(ctx: Context, voice: str | None) -> str | None:
    """A catalog voice's key (en_US-joe-medium) names the model it was pulled as."""
    if voice is None:
        return None
    for model in _held(ctx, "speech"):
        files = model.facts.get("files") or {}
        if model.ref.short == voice or f"{voice}.onnx" in files:
            return str(model.ref.short)
    return voice


def _tts_local(ctx: Context, model: str, body: dict[str, Any], extra: list[str]) -> bytes:
    from blazar.engines.audio_bench import synthesize_body
    from blazar.protocols.openai_audio import speech_request

    asked = speech_request(body)
    record, engine = _engine_for(ctx, model, "speech", "piper")
    return bytes(
        _local(
            ctx, engine, record.path, lambda url: synthesize_body(url, asked.engine_body()), extra
        )
    )


def _search_voices(ctx: Context, text: str, refresh: bool, as_json: bool) -> None:
    from blazar.sources import speech_catalog

    if refresh:
        speech_catalog.refresh_voices(ctx.paths.cache)
    held = _held(ctx, "speech")
    found = speech_catalog.search(speech_catalog.voices(ctx.paths.cache), text)

    def pulled(voice: Any) -> str:
        return _pulled(held, lambda m: f"{voice.key}.onnx" in (m.facts.get("files") or {}))

    if as_json:
        for voice in found:
            echo_json({**asdict(voice), "source": voice.source, "pulled": pulled(voice) or None})
        return
    if not found:
        click.echo(f"No voice matches {text!r}.")
        return
    rows = [
        [
            v.key,
            v.language,
            v.region,
            v.name,
            v.quality,
            v.speakers,
            ("" if v.exact else "~") + human_bytes(v.bytes),
            pulled(v) or "-",
        ]
        for v in found
    ]
    headers = ["VOICE", "LANGUAGE", "REGION", "NAME", "QUALITY", "SPEAKERS", "SIZE", "PULLED"]
    click.echo(table(headers, rows))


COMMANDS = [whisper, tts]
