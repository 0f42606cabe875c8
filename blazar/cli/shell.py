"""Shell completion, and the ollama commands Blazar has no use for, refused honestly.

`blazar completions bash|zsh|fish` prints click's own completion script for the
shell (the shell then calls `blazar` with `_BLAZAR_COMPLETE` set, and click
answers from the same command table `blazar --help` uses). `push`, `signin`,
`signout`, `login` and `logout` exist so that a user coming from ollama gets
one line saying why there is nothing to do, and exit code 1, instead of
click's "No such command".
"""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_BLAZAR_COMPLETE"


@click.command("completions")
@click.argument("shell", type=click.Choice(SHELLS))
def completions(shell: str) -> None:
    """Print the shell completion script for SHELL.

    bash: `eval "$(blazar completions bash)"` in ~/.bashrc; zsh: the same with zsh
    in ~/.zshrc; fish: `blazar completions fish > ~/.config/fish/completions/blazar.fish`.
    """
    from click.shell_completion import get_completion_class

    from blazar.cli.main import cli

    completion = get_completion_class(shell)
    assert completion is not None  # click ships all three
    click.echo(completion(cli, {}, "blazar", COMPLETE_VAR).source())


NO_HUB = "Blazar has no model hub and no account"
REFUSALS = {
    "push": (
        f"{NO_HUB} to publish to: share a model through a manifest (its source and sha256) "
        "that other hosts `blazar apply`, or upload the GGUF to Hugging Face (`hf upload`) "
        "and `blazar pull owner/repo:QUANT` it"
    ),
    "signin": (
        f"{NO_HUB} to sign in to: models come from their sources (hf://, https://, file://, "
        "ollama://); for a private or gated Hugging Face repo, set HF_TOKEN"
    ),
    "signout": f"{NO_HUB}, so there is nothing to sign out of; unset HF_TOKEN to stop using it",
}
REFUSALS["login"] = REFUSALS["signin"]
REFUSALS["logout"] = REFUSALS["signout"]


def _refusal(name: str, why: str) -> click.Command:
    @click.command(
        name,
        hidden=True,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
        help=f"Not supported: {why}.",
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def refuse(args: tuple[str, ...]) -> None:
        raise click.ClickException(f"`blazar {name}` is not supported: {why}")

    return refuse


push, signin, signout, login, logout = (_refusal(name, REFUSALS[name]) for name in REFUSALS)

COMMANDS = [completions, push, signin, signout, login, logout]
