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

The two commands share that catalog flow (install, pull, search) and their `--local`
engine child; what differs between them is data, one `SpeechLane` each (`WHISPER`, `TTS`),
and `catalog_options` runs the flow before a command's own work.
"""

from __future__ import annotations

import functools
import json
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, manifest_option, pass_context
from blazar.cli.format import echo_json, human_bytes, table
from blazar.errors import BlazarError, InvalidInput, NotFound
from blazar.sources import speech_catalog

FORMATS = ("text", "srt", "vtt", "json", "verbose_json")


@dataclass(frozen=True)
class SpeechLane:
    """What `blazar whisper` and `blazar tts` differ in: their models' kind, their engine,
    their catalog and how its table reads. The flow around them is one piece of code."""

    command: str  # whisper | tts
    kind: str  # the models' kind: transcription | speech
    engine: str  # the engine lane --install installs and --local runs: whisper | piper
    noun: str  # one catalog entry, in messages: "whisper size" | "voice"
    catalog: str  # --search's help: what it lists
    metavar: str  # --pull's
    installs: str  # --install's help: the engine's package
    model_flag: str  # the option that names a model when several are held
    example: str  # an entry to pull, for the error when none is held
    asks: str  # the command's argument, in the error when nothing was asked: "a FILE to ..."
    entries: Callable[[Path], Sequence[Any]]  # the catalog (the cache's copy, or the shipped)
    refresh: Callable[[Path], object]  # read the catalog from the hub into the cache
    find: Callable[[str, Path], Any]  # the entry --pull names, or None
    is_entry: Callable[[Any, Any], bool]  # whether a held model was pulled as this entry
    headers: tuple[str, ...]
    row: Callable[[Any, str], list[Any]]  # an entry, and the models pulled as it

    def pull_hint(self, name: str) -> str:
        return f"`blazar {self.command} --search {name[:5]}`"

    def not_pulled(self, name: str) -> NotFound:
        """The refusal for a model of this lane that is not held: the command that pulls it
        (the gateway's 404 and the store's said `blazar pull` and `blazar list`)."""
        return NotFound(
            f"{self.noun} '{name}' is not pulled: `blazar {self.command} --pull {name}` "
            f"fetches it (`blazar {self.command} --search` lists them)"
        )


def _disk(entry: Any) -> str:
    return ("" if entry.exact else "~") + human_bytes(entry.bytes)


def _is_size(size: Any, model: Any) -> bool:
    names = (size.model_name, f"faster-whisper-{size.name}")
    return bool(model.source == size.source or model.ref.name in names)


def _is_voice(voice: Any, model: Any) -> bool:
    return f"{voice.key}.onnx" in (model.facts.get("files") or {})


WHISPER = SpeechLane(
    command="whisper",
    kind="transcription",
    engine="whisper",
    noun="whisper size",
    catalog="catalog of sizes",
    metavar="SIZE",
    installs="faster-whisper",
    model_flag="--model",
    example="base",
    asks="a FILE to transcribe",
    entries=speech_catalog.whisper_sizes,
    refresh=speech_catalog.refresh_whisper,
    find=speech_catalog.find_size,
    is_entry=_is_size,
    headers=("SIZE", "LANGUAGES", "PARAMS", "DISK", "QUANTIZATION", "PULLED", "SOURCE"),
    row=lambda s, pulled: [
        s.name,
        s.languages,
        s.parameters,
        _disk(s),
        f"{s.stored}, runs int8",
        pulled or "-",
        s.source,
    ],
)

TTS = SpeechLane(
    command="tts",
    kind="speech",
    engine="piper",
    noun="voice",
    catalog="voice catalog",
    metavar="VOICE",
    installs="piper-tts",
    model_flag="--voice",
    example="en_US-amy-medium",
    asks="the TEXT to speak",
    entries=speech_catalog.voices,
    refresh=speech_catalog.refresh_voices,
    find=speech_catalog.find_voice,
    is_entry=_is_voice,
    headers=("VOICE", "LANGUAGE", "REGION", "NAME", "QUALITY", "SPEAKERS", "SIZE", "PULLED"),
    row=lambda v, pulled: [
        v.key,
        v.language,
        v.region,
        v.name,
        v.quality,
        v.speakers,
        _disk(v),
        pulled or "-",
    ],
)


# -- the catalog flow, shared ----------------------------------------------------------------


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


def catalog_options(lane: SpeechLane, argument: str) -> Callable[[Callable[..., None]], Any]:
    """The catalog's options (`--search`, `--refresh`, `--json`, `--pull`, `--install`) on a
    command: they run first, in that order (install, pull, search); then the command's own
    work runs when its `argument` is given, and without it they must have asked something."""
    options = [
        search_option(lane.catalog),
        click.option(
            "--refresh", is_flag=True, help="With --search: read the catalog from the hub."
        ),
        click.option(
            "--json", "as_json", is_flag=True, help="With --search: one JSON object a line."
        ),
        click.option(
            "--pull",
            "pull",
            default=None,
            metavar=lane.metavar,
            help=f"Declare and fetch a {lane.noun}.",
        ),
        click.option(
            "--install", is_flag=True, help=f"Install the {lane.engine} engine ({lane.installs})."
        ),
        manifest_option,
        pass_context,
    ]

    def decorate(work: Callable[..., None]) -> Any:
        @functools.wraps(work)
        def command(
            ctx: Context,
            search: str | None,
            refresh: bool,
            as_json: bool,
            pull: str | None,
            install: bool,
            **given: Any,
        ) -> None:
            if install:
                _install(ctx, lane.engine)
            if pull is not None:
                _pull(ctx, lane, given["manifest_path"], pull)
            if search is not None:
                _search(ctx, lane, search, refresh, as_json)
            if given[argument] is not None:
                work(ctx, **given)
            elif search is None and pull is None and not install:
                raise click.UsageError(f"give {lane.asks}, or --search, --pull or --install")

        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _held(ctx: Context, kind: str) -> list[Any]:
    return [m for m in ctx.store.list_models() if m.kind == kind]


def _install(ctx: Context, engine: str) -> None:
    from blazar.engines.service import Engines

    outcome = Engines(ctx.store, ctx.paths).update(engine, progress=click.echo)
    click.echo(f"{engine}: {outcome.message}")


def _pull(ctx: Context, lane: SpeechLane, manifest: Path | None, name: str) -> None:
    """Declare the catalog's entry `name` in the manifest and fetch it."""
    from blazar.cli.manifest import _event, _progress_for
    from blazar.manifest import ops as manifest_ops

    entry = lane.find(name, ctx.paths.cache)
    if entry is None:
        raise NotFound(f"no {lane.noun} {name!r} in the catalog: {lane.pull_hint(name)}")
    path = manifest or ctx.paths.manifest
    manifest_ops.apply_model(
        ctx.paths,
        path,
        entry.model_name,
        {"source": entry.source, "kind": lane.kind},
        notify=lambda m: click.echo(m, err=True),
        on_event=_event,
        progress_for=_progress_for,
    )
    click.echo(f"pulled {entry.model_name} (declared in {path})")


def _search(ctx: Context, lane: SpeechLane, text: str, refresh: bool, as_json: bool) -> None:
    """The catalog's entries that match `text`, each with the models pulled as it."""
    if refresh:
        lane.refresh(ctx.paths.cache)
    held = _held(ctx, lane.kind)
    found = speech_catalog.search(lane.entries(ctx.paths.cache), text)

    def pulled(entry: Any) -> str:
        return ", ".join(m.ref.short for m in held if lane.is_entry(entry, m))

    if as_json:
        for entry in found:
            echo_json({**asdict(entry), "source": entry.source, "pulled": pulled(entry) or None})
        return
    if not found:
        click.echo(f"No {lane.noun} matches {text!r}.")
        return
    click.echo(table(list(lane.headers), [lane.row(entry, pulled(entry)) for entry in found]))


# -- a model to use, through the daemon or an engine child of our own --------------------------


def _choose(ctx: Context, lane: SpeechLane, given: str | None) -> str:
    """The model to use: the one given, else the only one of the lane's kind held."""
    if given:
        return given
    held = _held(ctx, lane.kind)
    if len(held) == 1:
        return str(held[0].ref.short)
    if not held:
        raise NotFound(
            f"no {lane.kind} model is held: pull one first"
            f" (`blazar {lane.command} --pull {lane.example}`)"
        )
    names = ", ".join(m.ref.short for m in held)
    raise InvalidInput(
        f"several {lane.kind} models are held ({names}): choose one with {lane.model_flag}"
    )


def _post(
    url: str, path: str, body: bytes, content_type: str, lane: SpeechLane, model: str
) -> tuple[bytes, str]:
    """POST to the daemon; (body, content type), or a BlazarError with its message (a 404
    for the model: the lane's command that pulls it)."""
    import urllib.error
    import urllib.request

    from blazar.cli.serve import error_detail, headers, no_daemon, urlopen

    sent = {**headers(url), "Content-Type": content_type}
    request = urllib.request.Request(url + path, data=body, headers=sent, method="POST")
    try:
        with urlopen(request, timeout=3600) as resp:
            return resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        detail = error_detail(exc)
        if exc.code == 404 and model in detail:
            raise lane.not_pulled(model) from None
        raise BlazarError(f"{path}: {exc.code}: {detail}") from None
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


def _local(
    ctx: Context, lane: SpeechLane, manifest_path: Path | None, model: str, call: Any
) -> Any:
    """Run `call(url)` against an engine child of this command's own: the model's files on
    the lane's active engine, with what the manifest adds to the model's child
    (`deterministic`, `args`) as `blazar serve` would spawn it: `--local` must not answer
    differently."""
    import asyncio

    from blazar.engines.ledger import EngineStore
    from blazar.engines.process import EngineServer
    from blazar.reconcile.apply import load_or_empty
    from blazar.serve.supervisor.build import audio_args
    from blazar.serve.supervisor.runtime import default_threads
    from specs.names import InvalidName, parse_name

    try:
        record = ctx.store.find_model(parse_name(model))
    except InvalidName:  # a catalog voice's key (en_US-amy-medium) that no model is yet
        record = None
    if record is None:
        raise lane.not_pulled(model)
    if record.kind != lane.kind:
        raise InvalidInput(f"model '{record.ref.short}' is a {record.kind} model, not {lane.kind}")
    engine = EngineStore(ctx.store).active(lane.engine)
    if engine is None:
        raise NotFound(
            f"no {lane.engine} engine is installed: `blazar {lane.command} --install`"
            f" (or `blazar engine update --kind {lane.engine}`)"
        )
    manifest = load_or_empty(manifest_path or ctx.paths.manifest)
    extra = audio_args(manifest.declared_model(model), lane.kind)

    async def run() -> Any:
        args = ["--model", record.path, "--threads", str(default_threads()), *extra]
        log = ctx.paths.logs / f"local-{engine.tag}.log"
        async with EngineServer(engine.command, args, log) as server:
            return await asyncio.to_thread(call, server.url)

    return asyncio.run(run())


# -- blazar whisper ----------------------------------------------------------------------------


@click.command("whisper")
@click.argument("file", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--model", default=None, help="A transcription model (default: the only one held).")
@click.option("--language", default=None, help="The spoken language (default: detected).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--translate", is_flag=True, help="Translate into English instead.")
@click.option("--local", is_flag=True, help="Run the engine here, without the daemon.")
@click.option("--url", default=None, help="The daemon (default: the running one, or start one).")
@catalog_options(WHISPER, "file")
def whisper(
    ctx: Context,
    file: Path,
    model: str | None,
    language: str | None,
    fmt: str,
    translate: bool,
    local: bool,
    url: str | None,
    manifest_path: Path | None,
) -> None:
    """Transcribe FILE (any audio faster-whisper decodes) and print the text.

    `--search [SUBSTR]` lists the model sizes (tiny ... large-v3, large-v3-turbo, the .en
    and distil ones) with their disk size and whether pulled; `--pull SIZE` fetches one.
    """
    data = file.read_bytes()
    chosen = _choose(ctx, WHISPER, model)
    fields = {"model": chosen, "response_format": fmt}
    if language:
        fields["language"] = language
    if local:
        text = _whisper_local(ctx, manifest_path, chosen, data, fields, translate)
    else:
        from blazar.cli.serve import ensure_daemon

        base = ensure_daemon(ctx.paths, url)
        body, content_type = multipart(fields, file.name, data)
        path = "/v1/audio/translations" if translate else "/v1/audio/transcriptions"
        answer, _ = _post(base, path, body, content_type, WHISPER, chosen)
        text = answer.decode()
    click.echo(text.rstrip("\n"))


def _whisper_local(
    ctx: Context,
    manifest_path: Path | None,
    model: str,
    data: bytes,
    fields: dict[str, str],
    translate: bool,
) -> str:
    from blazar.engines.audio_bench import transcribe
    from blazar.protocols.openai_audio import Transcript, render, transcription_request

    asked = transcription_request(
        {k: [v] for k, v in fields.items()}, "translate" if translate else "transcribe"
    )
    lines = _local(
        ctx, WHISPER, manifest_path, model, lambda url: transcribe(url, data, asked.query())
    )
    heard = Transcript(task=asked.task)
    for line in lines:
        if line.get("type") == "error":
            raise BlazarError(f"the whisper engine failed: {line.get('message')}")
        heard.feed(line)
    return render(heard, asked)[0]


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
@catalog_options(TTS, "text")
def tts(
    ctx: Context,
    text: str,
    voice: str | None,
    output: str,
    fmt: str,
    speed: float,
    local: bool,
    url: str | None,
    manifest_path: Path | None,
) -> None:
    """Speak TEXT ('-': read it from stdin) into a WAV file; nothing is played.

    `--search SUBSTR` lists the piper voices by language, locale or name, with quality,
    size and whether pulled; `--pull VOICE` (such as en_US-amy-medium) fetches one.
    """
    if text == "-":
        text = sys.stdin.read()
    chosen = _choose(ctx, TTS, _voice_name(ctx, voice))
    body = {"model": chosen, "input": text, "response_format": fmt, "speed": speed}
    if local:
        audio = _tts_local(ctx, manifest_path, chosen, body)
    else:
        from blazar.cli.serve import ensure_daemon

        base = ensure_daemon(ctx.paths, url)
        speech = json.dumps(body).encode()
        audio, _ = _post(base, "/v1/audio/speech", speech, "application/json", TTS, chosen)
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


def _tts_local(ctx: Context, manifest_path: Path | None, model: str, body: dict[str, Any]) -> bytes:
    from blazar.engines.audio_bench import synthesize_body
    from blazar.protocols.openai_audio import speech_request

    asked = speech_request(body)

    def speak(url: str) -> bytes:
        return bytes(synthesize_body(url, asked.engine_body()))

    return bytes(_local(ctx, TTS, manifest_path, model, speak))


COMMANDS = [whisper, tts]
