"""`blazar doctor`: what is wrong with this host and the command that fixes each thing.

The findings come from `blazar.doctor`; this command asks the daemon for its live
summary (`/api/blazar/stats`) when one answers, and `blazar coreside`'s answer (the
daemon's, else the store's: a model over every memory budget is an error), prints the
findings by group (or as JSON) and exits 1 when any of them is an error.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.coreside import local
from blazar.cli.format import echo_json
from blazar.cli.serve import URL_OPTION, call, daemon_url
from blazar.doctor import GROUPS, DaemonView, examine, exit_code
from blazar.errors import BlazarError
from specs.problems import ManifestError

MARKS = {"ok": "ok", "info": "--", "warning": "!!", "error": "XX"}


def _daemon(ctx: Context, url: str | None) -> DaemonView:
    base = daemon_url(ctx.paths, url)
    pid = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        pid = int(json.loads((ctx.paths.state / "serve.json").read_text())["pid"])
    try:
        stats = call(base, "/api/blazar/stats", timeout=10)
    except BlazarError:
        return DaemonView(base, up=False)
    return DaemonView(base, up=True, pid=pid, stats=stats)


def _coreside(ctx: Context, daemon: DaemonView, manifest: Path) -> dict[str, Any] | None:
    """What can be resident here: the daemon's answer, else the store's; None when
    neither can tell (an invalid manifest is its own finding)."""
    try:
        if daemon.up:
            answer: dict[str, Any] = call(daemon.url, "/api/blazar/coreside", timeout=10)
            return answer
        return local(ctx, manifest, ())
    except (BlazarError, ManifestError):
        return None


@click.command("doctor")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--deep", is_flag=True, help="Also re-hash every model file (slow).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per finding.")
@URL_OPTION
@pass_context
def doctor(ctx: Context, path: Path | None, deep: bool, as_json: bool, url: str | None) -> None:
    """Check this host: system, GPU, engines, models, channels and the running daemon.

    Each finding says what is wrong and the command that fixes it. Exit status 1 when
    any finding is an error, else 0. PATH: the manifest (default: yours)."""
    manifest = path or ctx.paths.manifest
    daemon = _daemon(ctx, url)
    fits = _coreside(ctx, daemon, manifest)
    findings = examine(ctx.paths, manifest, daemon, deep=deep, coreside=fits)
    if as_json:
        for finding in findings:
            echo_json(finding.to_dict())
    else:
        for group in GROUPS:
            mine = [f for f in findings if f.group == group]
            if not mine:
                continue
            click.echo(group)
            for finding in mine:
                click.echo(f"  {MARKS[finding.severity]} {finding.what}")
                if finding.fix and finding.severity != "ok":
                    click.echo(f"     fix: {finding.fix}")
        errors = sum(1 for f in findings if f.severity == "error")
        warnings = sum(1 for f in findings if f.severity == "warning")
        click.echo(f"\n{errors} error(s), {warnings} warning(s).")
    sys.exit(exit_code(findings))


COMMANDS = [doctor]
