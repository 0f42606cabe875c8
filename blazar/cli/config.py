"""`blazar config ...`: the user's manifest, read and edited by dotted keys.

Keys are the manifest's (`serving.port`) or the user guide's names for them
(`port`, `model_overrides.gemma.pin`: `specs.aliases`); every answer names the
manifest key it read or wrote (`port -> serving.port = 11434`), and a key that is
neither gets the closest ones. `get`, `set` and `unset` import the manifest editor
(tomlkit, and the manifest's pydantic models to validate) themselves; `config
path` needs neither.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from blazar.cli.context import Context, manifest_option, pass_context
from blazar.paths import unread_config_warning

if TYPE_CHECKING:
    from specs.aliases import Resolved


@click.group()
def config() -> None:
    """Blazar's configuration: the user's manifest.

    KEY is a dotted manifest key (serving.port, models.gemma.ctx) or the user
    guide's name for one (port, slots, model_overrides.gemma.pin); docs/manifest.md
    lists both.
    """


@config.command("path")
@pass_context
def config_path(ctx: Context) -> None:
    """Print the path of the user's manifest (the file imperative commands edit)."""
    click.echo(str(ctx.paths.manifest))
    if (unread := unread_config_warning(ctx.paths)) is not None:
        click.echo(f"blazar: WARNING: {unread}", err=True)


def _resolve(key: str, *, unsetting: bool = False) -> Resolved:
    """The manifest key KEY stands for; an error naming the closest keys when there is
    none, or saying why it cannot be set (per model, or not in this version)."""
    from blazar.errors import InvalidInput
    from blazar.manifest.edit import split_key
    from specs.aliases import NOT_IN_THIS_VERSION, resolve, unknown_message

    resolved = resolve(key, split_key(key))
    refusal = resolved.refusal
    # A key of a feature not in this version can only be in a hand-written manifest, which
    # is then refused whole: unset may take it out.
    if refusal is not None and not (unsetting and NOT_IN_THIS_VERSION in refusal):
        raise InvalidInput(refusal)
    if refusal is None and (unknown := unknown_message(resolved)) is not None:
        raise InvalidInput(unknown)
    return resolved


@config.command("get")
@click.argument("key")
@manifest_option
@pass_context
def config_get(ctx: Context, key: str, manifest_path: Path | None) -> None:
    """Print the value at KEY (dotted; quote a segment with dots: models."qwen3:0.6b".ctx).

    A key the manifest does not set prints its default, and says so on stderr.
    """
    from blazar.errors import NotFound
    from blazar.manifest.edit import ABSENT, ManifestFile

    path = manifest_path or ctx.paths.manifest
    resolved = _resolve(key)
    if resolved.alias is not None:
        click.echo(resolved.arrow, err=True)
    value = ManifestFile(path).lookup(resolved.parts)
    if value is ABSENT:
        value = _default(path, resolved.parts)
        if value is ABSENT:
            raise NotFound(f"{resolved.key} is not set in {path}, and has no default")
        click.echo(f"{resolved.key} is not set in {path}: its default", err=True)
    click.echo(value if isinstance(value, str) else json.dumps(value, sort_keys=True))


def _default(path: Path, parts: tuple[str, ...]) -> Any:
    """The value the manifest at `path` has at `parts` once loaded (its default, for a key
    it does not set); ABSENT when there is none (no such model) or it cannot be loaded."""
    from blazar.manifest.edit import ABSENT
    from specs.loader import ManifestError, load_manifest, load_manifest_text

    try:
        manifest = load_manifest(path) if path.exists() else load_manifest_text("")
    except ManifestError:
        return ABSENT
    node: Any = manifest.model_dump(mode="json", by_alias=True)
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def _save(manifest: Any) -> None:
    from blazar.errors import InvalidManifest
    from blazar.manifest.edit import ManifestError

    try:
        manifest.save()
    except ManifestError as exc:
        raise InvalidManifest(
            f"not written: the change would make the manifest invalid:\n{exc}"
        ) from None


@config.command("set")
@click.argument("pairs", nargs=-1, required=True, metavar="KEY VALUE [KEY VALUE]...")
@manifest_option
@pass_context
def config_set(ctx: Context, pairs: tuple[str, ...], manifest_path: Path | None) -> None:
    """Set each KEY to its VALUE in the manifest, keeping its comments and layout.

    VALUE is read as a TOML value when it is one (8192, true, "text", [1, 2]) and
    as a string otherwise. Several pairs are set together: the manifest with all of
    them is validated once, as a whole, and written once (or not at all), so fields
    that need each other go in one call:

        blazar config set serving.tls_cert cert.pem serving.tls_key key.pem
    """
    from blazar.manifest.edit import ManifestFile, parse_value

    if len(pairs) % 2:
        raise click.UsageError(
            f"{len(pairs)} arguments: give KEY VALUE pairs, a value for each key "
            f"({pairs[-1]!r} has none), e.g. `blazar config set serving.port 11436`"
        )
    path = manifest_path or ctx.paths.manifest
    given = pairs[0::2]
    resolved = [_resolve(key) for key in given]
    _once(resolved)
    manifest = ManifestFile(path)
    for each, value in zip(resolved, pairs[1::2], strict=True):
        manifest.set_parts(each.parts, parse_value(value), each.given)
    _save(manifest)
    for each in resolved:
        click.echo(f"{each.arrow} = {json.dumps(manifest.lookup(each.parts))}  ({path})")
    _restart_note(ctx, [r.key for r in resolved])


@config.command("unset")
@click.argument("keys", nargs=-1, required=True, metavar="KEY...")
@manifest_option
@pass_context
def config_unset(ctx: Context, keys: tuple[str, ...], manifest_path: Path | None) -> None:
    """Remove each KEY from the manifest, so its default applies again.

    The keys are removed together, and the manifest is validated once, as a whole,
    before it is written (or not at all):

        blazar config unset serving.tls_cert serving.tls_key
    """
    from blazar.manifest.edit import ManifestFile

    path = manifest_path or ctx.paths.manifest
    resolved = [_resolve(key, unsetting=True) for key in keys]
    _once(resolved)
    manifest = ManifestFile(path)
    removed = [manifest.unset_parts(each.parts) for each in resolved]
    if any(removed):
        _save(manifest)
    for each, done in zip(resolved, removed, strict=True):
        what = "removed" if done else "was not set"
        click.echo(f"{each.arrow} {what}  ({path})")
    _restart_note(ctx, [r.key for r, done in zip(resolved, removed, strict=True) if done])


# What a running serve applies only when it starts again: where it listens, and TLS on or
# off (a rotated certificate is reloaded in place). Everything else is applied at once.
RESTART_KEYS = ("serving.host", "serving.port", "serving.tls_cert", "serving.tls_key")


def _restart_note(ctx: Context, keys: list[str]) -> None:
    """Say so when a running serve applies a change only once restarted (`blazar status`
    shows it too, as serve's RestartNeeded condition)."""
    needs = [k for k in keys if k in RESTART_KEYS]
    if not needs:
        return
    try:
        info = json.loads((ctx.paths.state / "serve.json").read_text())
    except (OSError, ValueError):
        return  # no serve runs: the next start reads it
    click.echo(
        f"{', '.join(needs)}: the running serve (pid {info.get('pid')}, {info.get('url')}) "
        "applies this when it restarts: stop it and run `blazar serve` again",
        err=True,
    )


def _once(resolved: list[Resolved]) -> None:
    """Refuse a key given twice, under either of its names."""
    keys = [r.key for r in resolved]
    repeated = sorted({r.given for r in resolved if keys.count(r.key) > 1})
    if repeated:
        raise click.UsageError(
            f"{', '.join(repeated)} given twice (one manifest key): set each key once"
        )


COMMANDS = [config]
