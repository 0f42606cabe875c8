"""Runtime commands: `blazar serve`, and `ps`, `stop`, `run`, `launch` on a running daemon.

The daemon's address comes from `--url`, `$BLAZAR_URL`, the file a running
`serve` writes under the state directory, or, with no daemon running, the address
the user's manifest gives serve (`serving.host`, `port`, https with `tls_cert`),
else the default 127.0.0.1:11435. An https daemon's own certificate (`serving.tls_cert`,
which a self-signed pair makes the only anchor there is) is trusted for its address.
Once the gateway declares keys, these commands send `$BLAZAR_API_KEY` (`ps` and
`stop` need an admin key).
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import echo_json, human_bytes, table
from blazar.errors import BlazarError
from blazar.host.children import owner_only
from blazar.paths import Paths, resolve_paths, unread_config_warning

DEFAULT_URL = "http://127.0.0.1:11435"


class NoDaemon(BlazarError):
    pass


# https addresses and the certificate file their daemon serves (from serve.json or the
# manifest), trusted by `urlopen` for them alone.
_TRUSTED: dict[str, str] = {}


def daemon_url(paths: Paths, given: str | None = None) -> str:
    """The daemon's address: --url, $BLAZAR_URL, the running serve's, else the manifest's."""
    found = _served(paths)
    if given:
        url = given.rstrip("/")
    elif os.environ.get("BLAZAR_URL"):
        url = os.environ["BLAZAR_URL"].rstrip("/")
    elif found is not None:
        url = found[0]
    else:
        found = _declared(paths)
        url = found[0] if found is not None else DEFAULT_URL
    if found is not None and found[1] and url.startswith("https://"):
        _TRUSTED[url] = found[1]
    return url


def _served(paths: Paths) -> tuple[str, str | None] | None:
    """The running serve's address and certificate (serve.json)."""
    try:
        info = json.loads((paths.state / "serve.json").read_text())
        return str(info["url"]), info.get("tls_cert")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _declared(paths: Paths) -> tuple[str, str | None] | None:
    """The address the user's manifest gives serve, and its certificate; None without a
    manifest that loads (the default address then)."""
    if not paths.manifest.exists():
        return None
    from specs.loader import ManifestError, load_manifest

    try:
        serving = load_manifest(paths.manifest).serving
    except (ManifestError, OSError):
        return None
    host = f"[{serving.host}]" if ":" in serving.host else serving.host
    cert = str(Path(serving.tls_cert).expanduser()) if serving.tls_cert else None
    return f"{'https' if cert else 'http'}://{host}:{serving.port}", cert


def urlopen(request: urllib.request.Request | str, timeout: float) -> Any:
    """`urllib.request.urlopen`, trusting an https daemon's own certificate for its
    address (partial chains allowed: the served leaf, or a self-signed pair, is the
    anchor), besides the system's."""
    url = request.full_url if isinstance(request, urllib.request.Request) else request
    context = None
    for base, cert in _TRUSTED.items():
        if url.startswith(base + "/") or url == base:
            context = ssl.create_default_context()
            with contextlib.suppress(OSError, ssl.SSLError):  # unreadable: the system's only
                context.load_verify_locations(cafile=cert)
                context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
            break
    return urllib.request.urlopen(request, timeout=timeout, context=context)


def error_detail(exc: urllib.error.HTTPError) -> str:
    """The message of an error answer in any of the gateway's envelopes, else its body."""
    detail = exc.read().decode(errors="replace")
    with contextlib.suppress(ValueError, AttributeError):
        error = json.loads(detail).get("error")
        detail = error.get("message", detail) if isinstance(error, dict) else str(error)
    return detail


def no_daemon(url: str, exc: Exception) -> NoDaemon:
    return NoDaemon(
        f"no Blazar daemon answers at {url} ({getattr(exc, 'reason', exc)}): "
        "start one with `blazar serve` (or `blazar launch CMD`, which starts it)"
    )


def headers(url: str | None = None) -> dict[str, str]:
    """A JSON request's headers, with `$BLAZAR_API_KEY` when it is set, else, for the
    serve running on this machine (`url` its address in serve.json), its operator token
    when this user can read it: never sent anywhere else."""
    key = os.environ.get("BLAZAR_API_KEY") or (_operator_token(url) if url else None)
    found = {"Content-Type": "application/json"}
    return {**found, "Authorization": f"Bearer {key}"} if key else found


def _operator_token(url: str) -> str | None:
    paths = resolve_paths()
    served = _served(paths)
    if served is None or served[0] != url.rstrip("/"):
        return None
    try:
        return (paths.state / "operator.token").read_text().strip() or None
    except OSError:  # another user's serve, or none: the gateway's 401 says what to do
        return None


def call(
    url: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = 600,
    method: str | None = None,
) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, headers=headers(url), method=method)
    try:
        with urlopen(request, timeout=timeout) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        raise BlazarError(f"{path}: {exc.code}: {error_detail(exc)}") from None
    except (urllib.error.URLError, ConnectionError) as exc:
        raise no_daemon(url, exc) from None


def health(url: str) -> str | None:
    """What a daemon at `url` says of itself: "ok", "starting" (its first pass is still
    running: 503), or None when nothing answers there."""
    request = urllib.request.Request(url + "/health", headers=headers(url))
    try:
        with urlopen(request, timeout=2):
            return "ok"
    except urllib.error.HTTPError as exc:
        return "starting" if exc.code == 503 else "ok"
    except (urllib.error.URLError, ConnectionError, OSError):
        return None


def healthy(url: str) -> bool:
    """A daemon answers at `url` and has made its models servable."""
    return health(url) == "ok"


URL_OPTION = click.option("--url", default=None, help="The daemon (default: the running one).")


@click.command("serve")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--host", default=None, help="Listen address (default: serving.host).")
@click.option("--port", type=int, default=None, help="Listen port (default: serving.port).")
@click.option("--no-apply", is_flag=True, help="Serve what is held; do not reconcile.")
@click.option(
    "--overlay",
    metavar="NAME",
    default=None,
    help="Merge the manifest directory's hosts/NAME overlay (default: this machine's name, "
    "when it has one; --host is the listen address here).",
)
@pass_context
def serve(
    ctx: Context,
    path: Path | None,
    host: str | None,
    port: int | None,
    no_apply: bool,
    overlay: str | None,
) -> None:
    """Run the gateway and the control loop. PATH: the manifest (default: yours)."""
    from blazar.serve.daemon import PortInUse, ServeOptions, run

    if (unread := unread_config_warning(ctx.paths)) is not None:
        click.echo(f"blazar: WARNING: {unread}", err=True)
    options = ServeOptions(
        path or ctx.paths.manifest, host, port, apply=not no_apply, overlay=overlay
    )
    try:
        run(ctx.paths, options)
    except PortInUse as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(3)


def _remaining(value: float | None) -> str:
    if value is None:
        return "forever"
    return f"{value:.0f}s" if value < 120 else f"{value / 60:.0f}m"


def _memory(row: dict[str, Any]) -> str | None:
    """A row's footprint, where it is measured or estimated from, and its devices:
    `117.5 MiB measured, cpu:0`; the warm peg's bytes when it has one."""
    if not row.get("footprint"):
        return None
    text = f"{human_bytes(row['footprint'])} {row.get('footprint_source') or ''}".strip()
    if row.get("devices"):
        text += f", {'+'.join(row['devices'])}"
    if row.get("pegged"):
        text += f", pegged {human_bytes(row['pegged'])}"
    return text


@click.command("ps")
@URL_OPTION
@click.option("--json", "as_json", is_flag=True, help="One JSON object per instance.")
@pass_context
def ps(ctx: Context, url: str | None, as_json: bool) -> None:
    """The running instances: model, replica, engine lane and tag, pid, port, slots, load,
    memory (the footprint, measured or estimated, and its devices), speculative decoding
    mode and the fields the model's profile set (`blazar tune`); the models served from
    remotes (lane `remote NAME`, state its health); and the warm pegs (models.NAME.warm_peg:
    unloaded models whose files are held in memory) with their bytes."""
    answer = call(daemon_url(ctx.paths, url), "/api/blazar/ps")
    rows, pegged = answer["instances"], answer.get("pegs") or {}
    if as_json:
        for row in rows:
            echo_json(row)
        for model, size in pegged.items():  # an unloaded warm_peg model: no instance
            if not any(r["model"] == model for r in rows):
                echo_json({"model": model, "state": "pegged", "pegged": size})
        return
    pegs_line = (
        "Warm pegs (files held in memory): "
        + ", ".join(f"{m} {human_bytes(b)}" for m, b in pegged.items())
        if pegged
        else None
    )
    if not rows:
        click.echo("No model is loaded.")
        if pegs_line:
            click.echo(pegs_line)
        return
    headers = [
        "MODEL",
        "ADAPTERS",
        "REPLICA",
        "LANE",
        "ENGINE",
        "PID",
        "PORT",
        "SLOTS",
        "CTX",
        "IN FLIGHT",
        "KEEP ALIVE",
        "STATE",
        "MEMORY",
        "SPEC",
        "PROFILE",
    ]
    click.echo(
        table(
            headers,
            [
                [
                    r["model"],
                    # the adapters its instances load: a model beside its elder after
                    # `lora add` is told apart from it by them
                    ",".join(r.get("adapters") or []) or None,
                    r["replica"],
                    f"remote {r['remote']}" if r.get("remote") else r.get("lane"),
                    r["engine"],
                    r["pid"],
                    r["port"],
                    r["slots"],
                    r["ctx"] or None,  # a speech model has none
                    r["in_flight"],
                    "-" if r.get("remote") else _remaining(r["keep_alive_remaining"]),
                    r["state"],
                    _memory(r),
                    r.get("spec"),
                    ",".join(r.get("profile") or []) or None,  # fields `blazar tune` set
                ]
                for r in rows
            ],
        )
    )
    if pegs_line:
        click.echo(pegs_line)


@click.command("stop")
@click.argument("model")
@URL_OPTION
@pass_context
def stop(ctx: Context, model: str, url: str | None) -> None:
    """Unload MODEL now (requests in flight finish first)."""
    result = call(daemon_url(ctx.paths, url), "/api/blazar/stop", {"model": model})
    click.echo(f"stopped {model}" if result.get("stopped") else f"{model} was not loaded")


def _stream(url: str, path: str, body: dict[str, Any], pick: Any) -> str:
    """POST a streaming request; echo text as it arrives; return the whole text."""
    request = urllib.request.Request(
        url + path, data=json.dumps({**body, "stream": True}).encode(), headers=headers(url)
    )
    text = []
    try:
        with urlopen(request, timeout=600) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise BlazarError(chunk["error"].get("message", str(chunk["error"])))
                piece = pick(chunk) or ""
                text.append(piece)
                click.echo(piece, nl=False)
    except urllib.error.HTTPError as exc:
        raise BlazarError(error_detail(exc)) from None
    except urllib.error.URLError as exc:
        raise no_daemon(url, exc) from None
    click.echo()
    return "".join(text)


def _chat_piece(chunk: dict[str, Any]) -> str | None:
    choices = chunk.get("choices") or [{}]
    content = (choices[0].get("delta") or {}).get("content")
    return content if isinstance(content, str) else None


def _completion_piece(chunk: dict[str, Any]) -> str | None:
    choices = chunk.get("choices") or [{}]
    text = choices[0].get("text")
    return text if isinstance(text, str) else None


@click.command("run", context_settings={"ignore_unknown_options": False})
@click.argument("model")
@click.argument("prompt", required=False)
@URL_OPTION
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option("--temperature", type=float, default=None)
@click.option("--system", default=None, help="A system message (chat models).")
@click.option("--raw", is_flag=True, help="A plain completion of PROMPT, no chat template.")
@click.option(
    "--no-draft",
    is_flag=True,
    help="Answer on a dense child of its own (speculative decoding off), not the daemon's.",
)
@pass_context
def run_(
    ctx: Context,
    model: str,
    prompt: str | None,
    url: str | None,
    max_tokens: int,
    temperature: float | None,
    system: str | None,
    raw: bool,
    no_draft: bool,
) -> None:
    """Chat with MODEL interactively, or answer PROMPT once.

    Flags go before PROMPT; `--` ends them (`blazar run m -- --not-a-flag`).
    Example: blazar run gemma3-270m --no-draft "Why is the sea salty?"
    """
    if no_draft:
        from blazar.reconcile.apply import load_or_empty
        from blazar.tune.local import run_dense

        manifest = load_or_empty(ctx.paths.manifest)

        def answer(child: str, runtime: Any) -> None:
            refusal = None if raw else runtime.chat_refusal("use --raw, or ")
            if refusal is not None:
                raise BlazarError(refusal)
            told = system or runtime.system  # the gateway's default, applied here
            _converse(child, runtime.name, prompt, max_tokens, temperature, told, raw)

        run_dense(ctx.store, ctx.paths, manifest, model, answer)
        return
    _converse(daemon_url(ctx.paths, url), model, prompt, max_tokens, temperature, system, raw)


def _converse(
    base: str,
    model: str,
    prompt: str | None,
    max_tokens: int,
    temperature: float | None,
    system: str | None,
    raw: bool,
) -> None:
    """PROMPT answered once, or a chat on the terminal, through the server at `base`."""
    params: dict[str, Any] = {"model": model, "max_tokens": max_tokens}
    if temperature is not None:
        params["temperature"] = temperature
    if prompt is not None and raw:
        _stream(base, "/v1/completions", {**params, "prompt": prompt}, _completion_piece)
        return
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    if prompt is not None:
        messages = [*history, {"role": "user", "content": prompt}]
        _stream(base, "/v1/chat/completions", {**params, "messages": messages}, _chat_piece)
        return
    click.echo(f"Chatting with {model}; an empty line or Ctrl-D ends.", err=True)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            break
        if not line.strip():
            break
        history.append({"role": "user", "content": line})
        answer = _stream(base, "/v1/chat/completions", {**params, "messages": history}, _chat_piece)
        history.append({"role": "assistant", "content": answer})


def ensure_daemon(paths: Paths, url: str | None) -> str:
    """The running daemon's URL, starting `blazar serve` in the background when none runs."""
    base = daemon_url(paths, url)
    state = health(base)
    if state == "ok":
        return base
    log = paths.logs / "serve.log"
    if state == "starting":  # one is starting already: wait for it, start no other
        return _wait_healthy(paths, url, log)
    log.parent.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("blazar")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "blazar.cli.main"]
    with open(log, "ab", opener=owner_only) as out:  # serve.log: 0600 (docs/security.md)
        subprocess.Popen(
            [*command, "serve"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return _wait_healthy(paths, url, log)


def _wait_healthy(paths: Paths, url: str | None, log: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        base = daemon_url(paths, url)
        if healthy(base):
            return base
        time.sleep(0.2)
    raise NoDaemon(f"`blazar serve` did not become ready within 60 s; see {log}")


@click.command("launch", context_settings={"ignore_unknown_options": True})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@URL_OPTION
@pass_context
def launch(ctx: Context, command: tuple[str, ...], url: str | None) -> None:
    """Run COMMAND pointed at Blazar: starts the daemon if needed, then sets
    OPENAI_BASE_URL, OPENAI_API_BASE, ANTHROPIC_BASE_URL and OLLAMA_HOST (and, from
    $BLAZAR_API_KEY, OPENAI_API_KEY, ANTHROPIC_API_KEY and OLLAMA_API_KEY) and execs it."""
    base = ensure_daemon(ctx.paths, url)
    os.environ["OPENAI_BASE_URL"] = f"{base}/v1"
    os.environ["OPENAI_API_BASE"] = f"{base}/v1"
    os.environ["ANTHROPIC_BASE_URL"] = base
    os.environ["OLLAMA_HOST"] = base
    key = os.environ.get("BLAZAR_API_KEY")
    if key:
        for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OLLAMA_API_KEY"):
            os.environ[variable] = key
    os.environ.setdefault("OPENAI_API_KEY", "blazar")
    try:
        os.execvp(command[0], list(command))
    except FileNotFoundError:
        raise BlazarError(f"command not found: {command[0]}") from None


COMMANDS = [serve, ps, stop, run_, launch]
