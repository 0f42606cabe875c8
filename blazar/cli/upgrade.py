"""`blazar upgrade [--rollback]`: Blazar itself, upgraded the way it was installed.

Thin: `blazar.host.upgrade` detects the install, keeps the old one, runs pip and checks
that the new one starts; this module prints. It imports only the standard
library and click, so it runs even when Blazar's other dependencies are broken.
"""

from __future__ import annotations

import click

from blazar.cli.format import echo_json


@click.command("upgrade")
@click.option("--rollback", is_flag=True, help="Go back to the Blazar the last upgrade replaced.")
@click.option(
    "--source",
    default=None,
    help="What pip installs: a package spec, a checkout's path or a git URL (default: what "
    "Blazar was installed from).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON.")
def upgrade(rollback: bool, source: str | None, as_json: bool) -> None:
    """Upgrade Blazar in its virtual environment, keeping the old one to roll back to.

    Works for the venv packaging/install.sh makes and for a venv Blazar was
    pip-installed into; refused in an editable checkout (`pip install -e`),
    which is yours to update. The new version must start (`blazar --version`)
    or the old one is put back. Restart `blazar serve` afterwards.

    \b
    Examples:
      blazar upgrade
      blazar upgrade --source git+https://github.com/blazar-llm/blazar.git@main
      blazar upgrade --rollback
    """
    from blazar.host import upgrade as self_upgrade

    install = self_upgrade.this_install(source)
    if rollback:
        done = self_upgrade.rollback(install)
    else:
        done = self_upgrade.upgrade(install, notify=lambda m: click.echo(m, err=True))
    if as_json:
        echo_json(
            {
                "how": install.how,
                "prefix": str(install.prefix),
                "source": install.source,
                "before": done.before,
                "after": done.after,
                "previous": str(done.previous) if done.previous else None,
                "rolled_back": rollback,
            }
        )
        return
    if done.before == done.after:
        click.echo(f"Blazar {done.after} is the newest from {install.source}; nothing changed")
    elif rollback:
        click.echo(
            f"rolled back to Blazar {done.after} (was {done.before}, kept in {done.previous}; "
            "`blazar upgrade --rollback` again goes forward)"
        )
    else:
        click.echo(
            f"upgraded Blazar {done.before} -> {done.after} in {install.prefix} (the old one is "
            f"in {done.previous}: `blazar upgrade --rollback`); restart `blazar serve` to run it"
        )


COMMANDS = [upgrade]
