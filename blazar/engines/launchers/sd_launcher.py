"""Serve images with stable-diffusion.cpp's `sd-server`: the launcher of Blazar's sdcpp lane.

Blazar copies this file, with `launcher_common.py` and the built `sd-server` beside it,
into each sdcpp engine (`blazar.engines.sdcpp`); its supervisor runs it with Blazar's
Python, as it runs llama-server:

    python sd_launcher.py --model PATH --host 127.0.0.1 --port 0 [--threads N]
        [--server SD-SERVER] [-- ARGS FOR SD-SERVER]
    python sd_launcher.py --version

PATH is one checkpoint file (`-m`), or a directory whose files name their part:
`model.*` (a whole checkpoint), `diffusion_model.*`, `vae.*`, `taesd.*`, `clip_l.*`,
`clip_g.*`, `t5xxl.*`, `llm.*` (stable-diffusion.cpp's flags of those names). An image
model in Blazar's store is such a set (`blazar.models.filesets`).

Why a launcher and not `sd-server` itself: sd-server has no `/health`, prints no port
it chose, and cannot stop a generation under way (its jobs API cancels only queued
jobs). The launcher owns the sd-server child: it starts it on a free loopback port,
waits until the model is loaded (sd-server loads before it listens), prints the line
the supervisor reads (`sd_launcher: listening on http://HOST:PORT`), answers `/health`
itself, and passes every other request to sd-server as bytes (its OpenAI routes
`/v1/images/generations`, `/v1/images/edits`, `/v1/models`, and the `sdapi` and `sdcpp`
ones; an edit may come as JSON with its pictures in base64, made into sd-server's
multipart form here). `POST /cancel` stops the work under way: it kills sd-server and
starts it again (the requests under way end with a 503 saying they were cancelled); a
tiny model reloads in well under a second. SIGTERM or SIGINT stops sd-server and ends the launcher.

It runs under any Python 3.11 with the standard library only.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

if __package__:  # imported as blazar.engines.launchers.sd_launcher (Blazar's tests)
    from blazar.engines.launchers import launcher_common as common
else:  # run as a script in its engine's directory, launcher_common.py copied beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import launcher_common as common  # type: ignore[no-redef, import-not-found, unused-ignore]

NAME = "sd_launcher"
# A set's file stem -> sd-server's flag for that part.
PARTS = {
    "model": "--model",
    "diffusion_model": "--diffusion-model",
    "vae": "--vae",
    "taesd": "--taesd",
    "clip_l": "--clip_l",
    "clip_g": "--clip_g",
    "t5xxl": "--t5xxl",
    "llm": "--llm",
}
WEIGHTS = (".gguf", ".safetensors", ".ckpt", ".pt", ".pth", ".bin")
LOAD_TIMEOUT = 600.0  # seconds sd-server may take to load before it listens
FORWARDED = ("/v1/", "/sdapi/", "/sdcpp/")


def part_flags(path: Path) -> list[str]:
    """sd-server's model flags for a file (a checkpoint) or a set's directory."""
    if path.is_file():
        return ["--model", str(path)]
    if not path.is_dir():
        raise common.UsageError(f"--model {path}: no such file or directory")
    found: dict[str, Path] = {}
    for file in sorted(path.iterdir()):
        stem = file.name.split(".", 1)[0]
        if stem in PARTS and file.name.endswith(WEIGHTS):
            if stem in found:
                raise common.UsageError(f"{path} holds two {stem} files: keep one")
            found[stem] = file
    weights = [f for f in sorted(path.iterdir()) if f.is_file() and f.name.endswith(WEIGHTS)]
    if not found and len(weights) == 1:  # one checkpoint, whatever its name
        return ["--model", str(weights[0])]
    if "model" not in found and "diffusion_model" not in found:
        names = ", ".join(f"{p}.gguf" for p in PARTS)
        raise common.UsageError(
            f"{path} holds no model.* or diffusion_model.* file (its files name their part: "
            f"{names})"
        )
    return [arg for stem, file in found.items() for arg in (PARTS[stem], str(file))]


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def server_path(given: str | None) -> Path:
    path = Path(given) if given else Path(__file__).resolve().parent / "sd-server"
    if not path.is_file():
        raise common.UsageError(f"no sd-server at {path}: pass --server PATH")
    return path


SERVER: list[Path] = []  # the sd-server this launcher runs, once its flags are read


def versions(server: Path | None = None) -> str:
    try:
        found = server or (SERVER[0] if SERVER else server_path(None))
    except common.UsageError:
        return f"{NAME} (no sd-server beside it)"
    done = subprocess.run([str(found), "--version"], capture_output=True, text=True, timeout=60)
    said = (done.stdout or done.stderr).strip().splitlines()
    return said[-1] if said else "stable-diffusion.cpp (version unknown)"


class Child:
    """The sd-server process: started, restarted (to cancel), stopped. One owner: this."""

    def __init__(self, command: list[str], host: str) -> None:
        self.command = command
        self.host = host
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.lock = threading.Lock()
        self.generation = 0  # bumped on each restart: a request that saw an older one was cut

    def start(self) -> None:
        self.port = free_port(self.host)
        argv = [*self.command, "--listen-ip", self.host, "--listen-port", str(self.port)]
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + LOAD_TIMEOUT
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise common.LoadError(
                    f"sd-server exited with code {self.process.returncode} while loading "
                    "(its log above says why)"
                )
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
                conn.request("GET", "/v1/models")
                ok = conn.getresponse().status == 200
                conn.close()
                if ok:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise common.LoadError(f"sd-server did not listen within {LOAD_TIMEOUT:.0f} s")

    def restart(self) -> None:
        with self.lock:
            self.generation += 1
            self.stop(kill=True)
            self.start()

    def stop(self, kill: bool = False) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class SdEngine(common.Engine):
    def __init__(self, args: Any) -> None:
        super().__init__(args)
        server = server_path(args.server)
        SERVER[:] = [server]
        threads = ["--threads", str(args.threads)] if args.threads else []
        flags = part_flags(Path(args.model))
        extra = [a for a in args.extra if a != "--"]
        self.child = Child([str(server), *flags, *threads, *extra], "127.0.0.1")
        self.child.start()

    def describe(self) -> str:
        pid = self.child.process.pid if self.child.process else 0
        return f"{self.args.model} (sd-server pid {pid})"

    def close(self) -> None:
        self.child.stop()


class Handler(common.Handler):
    engine: SdEngine

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            alive = self.engine.child.alive
            self.send_json(200 if alive else 503, {"status": "ok" if alive else "down"})
        elif path.startswith(FORWARDED) or path == "/":
            self.forward("GET", b"")
        else:
            self.send_error_json(404, self.not_found(path))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        declared = (self.headers.get("Content-Length") or "0").strip()
        if not (declared.isascii() and declared.isdigit()):
            self.close_connection = True
            self.send_error_json(400, f"Content-Length must be a number of bytes: {declared!r}")
            return
        body = self.rfile.read(int(declared)) if int(declared) else b""
        if path == "/cancel":
            self.engine.child.restart()
            self.send_json(200, {"cancelled": True, "pid": self.engine.child.process.pid})  # type: ignore[union-attr]
        elif path == "/v1/images/edits" and self.headers.get_content_type() == "application/json":
            try:
                form, content_type = edit_form(json.loads(body))
            except (ValueError, KeyError, TypeError) as exc:
                self.send_error_json(400, f"an edit's JSON must hold prompt and images: {exc}")
                return
            self.forward("POST", form, content_type)
        elif path.startswith(FORWARDED):
            self.forward("POST", body)
        else:
            self.send_error_json(404, self.not_found(path))

    def forward(self, method: str, body: bytes, content_type: str | None = None) -> None:
        """The request to sd-server as it came (or with `body` made here, of
        `content_type`); its answer back as it went."""
        child = self.engine.child
        generation = child.generation
        skip = ("host", "connection", "content-length", "content-type", "transfer-encoding")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        headers["Content-Type"] = content_type or self.headers.get("Content-Type") or ""
        headers["Content-Length"] = str(len(body))
        try:
            conn = http.client.HTTPConnection(child.host, child.port, timeout=None)
            conn.request(method, self.path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            conn.close()
        except (OSError, http.client.HTTPException) as exc:
            if child.generation != generation:
                self.send_error_json(503, "the generation was cancelled", "cancelled")
            else:
                self.send_error_json(502, f"sd-server did not answer: {exc}", "server_error")
            return
        self.send(answer.status, data, answer.getheader("Content-Type") or "application/json")


def edit_form(fields: dict[str, Any]) -> tuple[bytes, str]:
    """An edit sent as JSON (the gateway's: prompt, n, size, output_format, images and
    mask in base64) as the multipart form sd-server's /v1/images/edits reads."""
    boundary = f"blazar-{uuid.uuid4().hex}"
    out = bytearray()

    def part(name: str, data: bytes, filename: str | None = None) -> None:
        out.extend(f"--{boundary}\r\n".encode())
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out.extend(f"Content-Disposition: {disposition}\r\n".encode())
        if filename is not None:
            out.extend(b"Content-Type: image/png\r\n")
        out.extend(b"\r\n" + data + b"\r\n")

    part("prompt", str(fields["prompt"]).encode())
    for name in ("n", "size", "output_format"):
        if fields.get(name) is not None:
            part(name, str(fields[name]).encode())
    for i, image in enumerate(fields["images"]):
        part("image[]", base64.b64decode(image), f"image{i}.png")
    if fields.get("mask"):
        part("mask", base64.b64decode(fields["mask"]), "mask.png")
    out.extend(f"--{boundary}--\r\n".encode())
    return bytes(out), f"multipart/form-data; boundary={boundary}"


def parser() -> Any:
    found = common.flags(
        __doc__, "a checkpoint file or a set's directory", "unused (one at a time)"
    )
    found.add_argument("--server", default=None, help="the sd-server binary (default: beside)")
    found.add_argument("extra", nargs="*", help="after --: sd-server's own flags")
    return found


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args:
        given = args[args.index("--server") + 1] if "--server" in args[:-1] else None
        print(versions(server_path(given) if given else None))
        return 0
    return common.serve_http(NAME, args, parser(), versions, SdEngine, Handler)


if __name__ == "__main__":
    raise SystemExit(main())
