"""`blazar image "a prompt" -o out.png`: a picture from an image model.

Through the daemon's `POST /v1/images/generations` (starting `blazar serve` when none
runs), or with `--local` on an sdcpp engine child of this command's own (the model's
files on the active sdcpp engine, as `blazar serve` would spawn it). The model is the one
given with `--model`, else the only image model held. `--steps`, `--seed`, `--cfg-scale`,
`--sampler` are stable-diffusion.cpp's request options (docs/engines.md); the model's caps
(image_max_size, image_max_steps) hold here too. With `-n 2` or more, `out.png` becomes
`out-1.png`, `out-2.png`, ...
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.format import human_bytes
from blazar.errors import BlazarError, InvalidInput, NotFound

KIND = "image"


def _choose(ctx: Context, given: str | None) -> str:
    if given:
        return given
    held = [m for m in ctx.store.list_models() if m.kind == KIND]
    if len(held) == 1:
        return str(held[0].ref.short)
    if not held:
        raise NotFound(
            'no image model is held: declare one (`[models.NAME] kind = "image"`, '
            "docs/engines.md) and `blazar apply`"
        )
    names = ", ".join(m.ref.short for m in held)
    raise InvalidInput(f"several image models are held ({names}): choose one with --model")


def _daemon(ctx: Context, url: str | None, body: dict[str, Any]) -> dict[str, Any]:
    import urllib.error
    import urllib.request

    from blazar.cli.serve import ensure_daemon, error_detail, headers, no_daemon, urlopen

    base = ensure_daemon(ctx.paths, url)
    sent = {**headers(base), "Content-Type": "application/json"}
    request = urllib.request.Request(
        base + "/v1/images/generations", data=json.dumps(body).encode(), headers=sent
    )
    try:
        with urlopen(request, timeout=3600) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        raise BlazarError(f"/v1/images/generations: {exc.code}: {error_detail(exc)}") from None
    except (urllib.error.URLError, ConnectionError) as exc:
        raise no_daemon(base, exc) from None


def _local(ctx: Context, model: str, body: dict[str, Any]) -> dict[str, Any]:
    from blazar.engines.ledger import EngineStore
    from blazar.engines.process import EngineServer
    from blazar.engines.sd_bench import generate
    from blazar.protocols.openai_images import check_caps, image_request
    from blazar.reconcile.apply import load_or_empty
    from blazar.serve.supervisor.build import image_caps
    from blazar.serve.supervisor.runtime import default_threads
    from specs.names import parse_name

    record = ctx.store.find_model(parse_name(model))
    if record is None:
        raise NotFound(f"model '{model}' is not held: declare it and `blazar apply`")
    if record.kind != KIND:
        raise InvalidInput(f"model '{record.ref.short}' is a {record.kind} model, not an image one")
    engine = EngineStore(ctx.store).active("sdcpp")
    if engine is None:
        raise NotFound("no sdcpp engine is installed: `blazar engine install --kind sdcpp`")
    declared = load_or_empty(ctx.paths.manifest).declared_model(model)
    asked = image_request(body)
    default_steps = check_caps(asked, record.ref.short, image_caps(declared))
    args = ["--model", record.path, "--threads", str(default_threads())]
    if declared is not None:
        args += list(declared.args)

    async def run() -> dict[str, Any]:
        log = ctx.paths.logs / f"local-{engine.tag}.log"
        async with EngineServer(engine.command, args, log) as server:
            pictures = await asyncio.to_thread(
                generate, server.url, asked.engine_body(default_steps)
            )
        return {"data": [{"b64_json": base64.b64encode(p).decode()} for p in pictures]}

    return asyncio.run(run())


@click.command("image")
@click.argument("prompt")
@click.option("-o", "--output", default="image.png", show_default=True, help="The PNG to write.")
@click.option("--model", default=None, help="An image model (default: the only one held).")
@click.option("--size", default="512x512", show_default=True, help="WIDTHxHEIGHT in pixels.")
@click.option("--steps", type=int, default=None, help="Sampling steps (default: the model's).")
@click.option(
    "--seed", type=int, default=None, help="The noise seed: the same one, the same picture."
)
@click.option(
    "--cfg-scale", type=float, default=None, help="Guidance scale (default: the model's)."
)
@click.option(
    "--sampler", default=None, help="euler, euler_a, dpm++2m, lcm, ... (default: the model's)."
)
@click.option("-n", "count", type=int, default=1, show_default=True, help="Pictures to make.")
@click.option("--local", is_flag=True, help="Run the engine here, without the daemon.")
@click.option("--url", default=None, help="The daemon (default: the running one, or start one).")
@pass_context
def image(
    ctx: Context,
    prompt: str,
    output: str,
    model: str | None,
    size: str,
    steps: int | None,
    seed: int | None,
    cfg_scale: float | None,
    sampler: str | None,
    count: int,
    local: bool,
    url: str | None,
) -> None:
    """Make a picture of PROMPT with an image model and write it as a PNG.

    Examples:

    \b
        blazar image "a lighthouse at dusk" -o lighthouse.png
        blazar image "a red fox" --size 256x256 --steps 4 --seed 7 --local
    """
    chosen = _choose(ctx, model)
    body: dict[str, Any] = {"model": chosen, "prompt": prompt, "size": size, "n": count}
    for name, value in (("steps", steps), ("seed", seed), ("cfg_scale", cfg_scale)):
        if value is not None:
            body[name] = value
    if sampler is not None:
        body["sampler"] = sampler
    answer = _local(ctx, chosen, body) if local else _daemon(ctx, url, body)
    pictures = [base64.b64decode(d["b64_json"]) for d in answer.get("data", [])]
    if not pictures:
        raise BlazarError(f"model '{chosen}' answered no picture")
    target = Path(output)
    for i, data in enumerate(pictures, start=1):
        path = target if len(pictures) == 1 else target.with_stem(f"{target.stem}-{i}")
        path.write_bytes(data)
        click.echo(f"wrote {path} ({human_bytes(len(data))}) with {chosen}", err=True)


COMMANDS = [image]
