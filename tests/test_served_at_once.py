"""What the CLI declares is served at once: each imperative command run beside a real
`blazar serve` takes effect within AT_ONCE seconds, not at serve's next timer pass.

The regression it pins: serve's pass for the manifest change found the command's own
apply holding the lock, served only what it had, and waited for the 30-second timer
(`tiny+fox` answered 404 for 29 s after `blazar lora add`). Each check polls until its
deadline, counting from the moment the command returned; the answers are read (the
adapter's word, the key enforced), not only their status.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from blazar.paths import Paths
from blazar.testing.tiny import is_tiny_text, write_tiny_lora, write_tiny_model
from tests.conftest import Blazar
from tests.serving import Served
from tests.test_serve import ENGINE, model_block

AT_ONCE = 2.0  # seconds from a command's return to its change being served
ORIGIN = "https://app.example"
NO_HEADERS: Mapping[str, str] = MappingProxyType({})


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    src = tmp_path / "src"
    src.mkdir()
    tiny = write_tiny_model(src / "tiny.gguf")
    return {
        "tiny": tiny,
        "other": write_tiny_model(src / "other.gguf", seed=3),
        "fox": write_tiny_lora(src / "fox.gguf", tiny, word="fox"),
        "owl": write_tiny_lora(src / "owl.gguf", tiny, word="owl"),
    }


def call(
    served: Served,
    path: str,
    body: dict[str, Any] | None = None,
    headers: Mapping[str, str] = NO_HEADERS,
) -> tuple[int, Any]:
    """(status, JSON body) of one request; an error status is an answer too."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        served.url + path, data=data, headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def answer(served: Served, model: str, headers: Mapping[str, str] = NO_HEADERS) -> str | None:
    """The model's chat answer, or None when the request is not served."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    status, reply = call(served, "/v1/chat/completions", body, headers)
    return reply["choices"][0]["message"]["content"] if status == 200 else None


def models(served: Served) -> set[str]:
    return {m["id"] for m in call(served, "/v1/models")[1].get("data", [])}


def only(word: str, text: str | None) -> bool:
    return bool(text) and all(w == word for w in (text or "").split())


def within(check: Callable[[], bool], what: str, served: Served) -> float:
    """Seconds until `check` held, counted from now; fails past AT_ONCE."""
    start = time.monotonic()
    while True:
        if check():
            return time.monotonic() - start
        waited = time.monotonic() - start
        assert waited < AT_ONCE, f"{what}: not served {waited:.1f} s later\n{served.log[-3000:]}"
        time.sleep(0.05)


def test_each_imperative_command_is_served_at_once(
    blazar: Blazar, paths: Paths, blazar_home: Path, files: dict[str, Path]
) -> None:
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text(ENGINE + model_block("tiny", files["tiny"], keep_alive="-1"))
    with Served(paths.manifest, blazar_home) as served:
        assert is_tiny_text(answer(served, "tiny") or "", allow=())
        took = {}

        blazar("lora", "add", "tiny", str(files["fox"]), "--name", "fox")
        took["lora add"] = within(lambda: only("fox", answer(served, "tiny+fox")), "fox", served)
        rows = blazar("ps", "--url", served.url).output.splitlines()
        assert any(r.split()[:2] == ["tiny", "fox"] for r in rows), rows  # told apart

        blazar("lora", "add", "tiny", str(files["owl"]), "--name", "owl", "--always-on")
        took["lora add --always-on"] = within(
            lambda: only("owl", answer(served, "tiny")), "an always-on adapter", served
        )

        blazar("pull", files["other"].as_uri(), "--name", "other")
        took["pull"] = within(lambda: answer(served, "other") is not None, "a pull", served)

        mine = write_tiny_model(blazar_home / "mine.gguf")
        blazar("import", str(mine), "--name", "mine")  # declared, so served by the CLI's pass
        took["import"] = within(lambda: answer(served, "mine") is not None, "an import", served)

        blazar("cp", "other", "another")
        took["cp"] = within(lambda: "another" in models(served), "an alias", served)

        blazar("create", "terse", "--from", "other", "--system", "Answer in one word.")
        took["create"] = within(lambda: "terse" in models(served), "a derived model", served)

        blazar("rm", "other")
        took["rm"] = within(
            lambda: not {"other", "another"} & models(served), "a removed model", served
        )

        cors = ["config", "set", "serving.cors_origins", json.dumps([ORIGIN])]
        assert call(served, "/v1/models", headers={"Origin": ORIGIN})[0] == 403
        blazar(*cors)
        took["config set"] = within(
            lambda: call(served, "/v1/models", headers={"Origin": ORIGIN})[0] == 200,
            "an allowed origin",
            served,
        )

        secret = blazar("keys", "add", "ci", "--scope", "admin").stdout.strip().splitlines()[-1]
        took["keys add"] = within(
            lambda: call(served, "/v1/models")[0] == 401, "a key required", served
        )
        assert only("owl", answer(served, "tiny", {"Authorization": f"Bearer {secret}"}))

        blazar("keys", "rm", "ci", "--force")
        took["keys rm"] = within(
            lambda: call(served, "/v1/models")[0] == 200, "no key required", served
        )

        blazar("lora", "rm", "fox")
        took["lora rm"] = within(
            lambda: call(served, "/v1/models")[0] == 200 and answer(served, "tiny+fox") is None,
            "a removed adapter",
            served,
        )
        status, error = call(
            served, "/v1/chat/completions", {"model": "tiny+fox", "messages": [], "max_tokens": 1}
        )
        assert status == 404 and "no adapter 'fox'" in error["error"]["message"], error
        print("served after", {k: round(v, 2) for k, v in took.items()})
