"""docs/sdk.md's examples run as they are, against the real gateway, and cover every call.

Each ```python block is run in its own process (the SDK from src/, BLAZAR_URL and
an admin BLAZAR_API_KEY in the environment, as a user would set them); a block
after the `<!-- waiting on the gateway ... -->` line is only compiled, since its
routes do not exist yet. Every public method of `Client` and `Batches` must be
named in the page.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys

import pytest

from blazar_sdk import Batches, Client, Realtime
from conftest import REPO, SDK, Gateway

PAGE = REPO / "docs" / "sdk.md"
BLOCK = re.compile(r"(<!-- waiting on the gateway[^>]*-->\n)?```python\n(.*?)```", re.S)
EXAMPLES = [(bool(waiting), code) for waiting, code in BLOCK.findall(PAGE.read_text())]


def test_every_call_is_documented() -> None:
    text = PAGE.read_text()
    for kind in (Client, Batches, Realtime):
        for name, _ in inspect.getmembers(kind, inspect.isfunction):
            if not name.startswith("_"):
                assert f"{name}(" in text, f"docs/sdk.md does not show {kind.__name__}.{name}"
    assert len(EXAMPLES) >= 10 and sum(waiting for waiting, _ in EXAMPLES) == 0  # all run


@pytest.mark.parametrize(
    ("waiting", "code"), EXAMPLES, ids=[f"example{i}" for i, _ in enumerate(EXAMPLES)]
)
def test_the_example_runs(waiting: bool, code: str, gateway: Gateway) -> None:
    compile(code, str(PAGE), "exec")
    if waiting:
        return
    env = {
        **os.environ,
        "BLAZAR_URL": gateway.url,
        "BLAZAR_API_KEY": gateway.admin_key,
        "PYTHONPATH": str(SDK / "src"),
    }
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert ran.returncode == 0, f"{code}\n---\n{ran.stdout}\n{ran.stderr}"
    assert ran.stdout.strip(), "an example shows what it did"
