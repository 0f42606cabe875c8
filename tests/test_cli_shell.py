"""`blazar completions` (click's own completion, checked in a real bash) and the honest
refusals of ollama's hub commands (`push`, `signin`, `signout`, `login`, `logout`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_blazar

BLAZAR = str(Path(sys.executable).with_name("blazar"))


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("push", "tiny"), "no model hub and no account to publish to"),
        (("push", "me/tiny:latest", "--insecure"), "`blazar pull owner/repo:QUANT`"),
        (("signin",), "to sign in to: models come from their sources"),
        (("login", "--username", "me"), "set HF_TOKEN"),
        (("signout",), "nothing to sign out of"),
        (("logout",), "nothing to sign out of"),
    ],
)
def test_hub_commands_refuse_in_one_line(args: tuple[str, ...], why: str) -> None:
    done = run_blazar(*args)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"Error: `blazar {args[0]}` is not supported: Blazar has no")
    assert why in lines[0]


def test_refusals_stay_out_of_help_but_not_out_of_reach() -> None:
    listed = run_blazar("--help").stdout
    assert "completions" in listed and "push" not in listed and "signin" not in listed
    assert "No such command" not in run_blazar("logout").stderr


def complete(words: str, cword: int) -> list[str]:
    """What click answers the bash completion function with, for `words` typed so far."""
    env = {**os.environ, "_BLAZAR_COMPLETE": "bash_complete", "COMP_WORDS": words}
    env["COMP_CWORD"] = str(cword)
    done = subprocess.run([BLAZAR], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_completions_for_bash_work_in_bash() -> None:
    script = run_blazar("completions", "bash")
    assert script.returncode == 0 and "_BLAZAR_COMPLETE=bash_complete" in script.stdout
    bash = shutil.which("bash")
    assert bash is not None
    registered = subprocess.run(
        [bash, "-c", 'eval "$1"; complete -p blazar', "-", script.stdout],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{Path(BLAZAR).parent}:{os.environ['PATH']}"},
    )
    assert registered.stdout.strip() == "complete -o nosort -F _blazar_completion blazar"
    assert complete("blazar lo", 1) == ["plain,lora"]  # hidden refusals are not offered
    assert complete("blazar lora ", 2) == ["plain,add", "plain,list", "plain,rm"]
    assert "plain,--always-on" in complete("blazar lora add --a", 3)


FISH = "complete --no-files --command blazar"


@pytest.mark.parametrize(("shell", "needle"), [("zsh", "#compdef blazar"), ("fish", FISH)])
def test_completions_for_zsh_and_fish(shell: str, needle: str) -> None:
    done = run_blazar("completions", shell)
    assert done.returncode == 0 and needle in done.stdout
    assert f"_BLAZAR_COMPLETE={shell}_complete" in done.stdout


def test_completions_for_an_unknown_shell_is_a_usage_error() -> None:
    done = run_blazar("completions", "tcsh")
    assert done.returncode == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in done.stderr
