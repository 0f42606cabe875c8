"""`blazar quantize MODEL --to TYPE`: a smaller copy of a model, made with llama-quantize.

Thin: `blazar.manifest.quantize` finds (or, with `--build`, builds) llama-quantize, runs it
and declares the result as a new model in your manifest; this module prints.
"""

from __future__ import annotations

from pathlib import Path

import click

from blazar.cli.context import Context, manifest_option, pass_context
from blazar.cli.format import echo_json, human_bytes

DEFAULT_SOURCE = "https://github.com/ggml-org/llama.cpp"


@click.command("quantize")
@click.argument("model")
@click.option("--to", "to", required=True, help="The type: Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0, ...")
@click.option("--name", default=None, help="The new model's name (default: MODEL:<type>).")
@click.option(
    "--allow-requantize", is_flag=True, help="Quantize a model that is quantized already."
)
@click.option(
    "--build", is_flag=True, help="Build llama-quantize from --source if none is installed."
)
@click.option(
    "--source",
    default=DEFAULT_SOURCE,
    show_default=True,
    help="With --build: a llama.cpp tree (a directory, a .tar.gz such as the llama-cpp-python "
    "sdist, or a git URL with optional @SHA).",
)
@click.option("--threads", type=int, default=None, help="Threads for llama-quantize.")
@click.option("--force", is_flag=True, help="Replace a model already declared with the name.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@manifest_option
@pass_context
def quantize(
    ctx: Context,
    model: str,
    to: str,
    name: str | None,
    allow_requantize: bool,
    build: bool,
    source: str,
    threads: int | None,
    force: bool,
    as_json: bool,
    manifest_path: Path | None,
) -> None:
    """Quantize MODEL to another type and declare the result as MODEL:<type>.

    It runs llama.cpp's llama-quantize: the one beside the active engine (a
    release engine ships it), else one Blazar built (--build builds it from
    --source with cmake, once). The result is verified, kept under its sha256,
    and declared in your manifest with the base's settings.

    \b
    Example:
      blazar quantize gemma3:f16 --to Q4_K_M        # declares gemma3:q4_k_m
      blazar quantize gemma3:f16 --to Q8_0 --build --source ./llama.cpp
    """
    from blazar.manifest.quantize import quantize_model

    done = quantize_model(
        ctx.paths,
        manifest_path or ctx.paths.manifest,
        model,
        to,
        name=name,
        allow_requantize=allow_requantize,
        build_from=source if build else None,
        threads=threads,
        force=force,
        notify=lambda m: click.echo(m, err=True),
    )
    if as_json:
        echo_json(
            {
                "name": done.name,
                "base": done.base,
                "type": done.type,
                "path": str(done.path),
                "sha256": done.sha256,
                "size": done.size,
                "base_size": done.base_size,
                "seconds": round(done.seconds, 3),
                "tool": str(done.tool),
            }
        )
        return
    ratio = done.size / done.base_size if done.base_size else 0
    click.echo(
        f"quantized {done.base} to {done.type} in {done.seconds:.1f} s: {done.name} "
        f"({human_bytes(done.size)}, {ratio:.0%} of {human_bytes(done.base_size)}; sha256 "
        f"{done.sha256[:12]}...)"
    )


COMMANDS = [quantize]
