"""`blazar ui`: open the running daemon's dashboard (`/ui`) in the default browser.

The daemon is found the way `ps` and `why` find it (`--url`, `$BLAZAR_URL`, the
`serve.json` a running serve writes, the default address) and asked for `/health`
first, so a daemon that is not running is said plainly. The page itself is served by
`blazar.serve.routes.ui_api`; no key is put in the URL (it would land in the browser's
history and in the process list): with keys declared, the page asks for one.
"""

from __future__ import annotations

import webbrowser

import click

from blazar.cli.context import Context, pass_context
from blazar.cli.serve import URL_OPTION, NoDaemon, daemon_url, health
from blazar.errors import BlazarError


@click.command("ui")
@URL_OPTION
@click.option("--print", "print_only", is_flag=True, help="Print the URL; open nothing.")
@pass_context
def ui(ctx: Context, url: str | None, print_only: bool) -> None:
    """Open the dashboard of the running daemon in the default browser: models (load,
    unload, pin), requests with their trails, metrics, a playground, health and logs.

    With keys declared the page asks for one and keeps it in that browser tab only.

    \b
    Examples:
      blazar ui                # opens http://127.0.0.1:11435/ui
      blazar ui --print        # prints the URL, for a browser elsewhere or a script
    """
    base = daemon_url(ctx.paths, url)
    if health(base) is None:
        raise NoDaemon(
            f"no daemon answers at {base}: start one with `blazar serve`, then `blazar ui` again"
        )
    target = f"{base}/ui"
    if print_only:
        click.echo(target)
        return
    if not webbrowser.open(target):
        raise BlazarError(
            f"no browser could be opened here: open {target} yourself "
            "(`blazar ui --print` prints it)"
        )
    click.echo(f"opened {target}")


COMMANDS = [ui]
