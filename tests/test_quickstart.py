"""`make run`'s job on the real default model, Gemma 3 270M, and disk use on import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from blazar.cli.quickstart import MANIFEST, MODEL
from blazar.testing.ports import free_port
from specs.serving import Serving
from tests.conftest import Blazar
from tests.serving import Served

QUICKSTART = MANIFEST / "blazar.toml"
GEMMA_SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def disk_bytes(*roots: Path) -> int:
    """Bytes allocated under roots, counting each inode once (as `du` does)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for name in files:
                st = os.lstat(os.path.join(dirpath, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


@pytest.mark.slow  # Gemma 3 270M end to end, applied twice
def test_quickstart_serves_gemma_and_answers(blazar_home: Path) -> None:
    """`make run`'s job: engine, Gemma 3 270M, apply, serve, one answer through the gateway."""
    port = free_port()
    env = {**os.environ, "BLAZAR_QUICKSTART_PORT": str(port)}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "blazar.cli.quickstart", "--once"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )

    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    out = first.stdout
    assert "architecture       gemma3" in out
    assert "268.1M (268,098,176)" in out
    assert "quantization       Q4_K_M" in out
    assert "The three most useful things to pack for a day of hiking are" in out
    answer = out.split("hiking are", 1)[1].split("Try it yourself:", 1)[0]
    assert len(answer.split()) >= 5  # Gemma wrote something
    assert f"curl http://127.0.0.1:{port}/v1/completions" in out
    second = run()  # idempotent: the apply finds everything in place
    assert second.returncode == 0 and "No changes." in second.stdout
    blob_dir = blazar_home / "data" / "models" / "blobs"
    assert [p.name for p in blob_dir.iterdir()] == [f"sha256-{GEMMA_SHA}"]
    assert not any((blazar_home / "cache" / "downloads").iterdir())  # the assembly was moved in
    guides_curl_answers_within_seconds(blazar_home)


def guides_curl_answers_within_seconds(home: Path) -> None:
    """The user guide's Quickstart curl (a chat, no max_tokens) on the quickstart's Gemma:
    a base model (no template in its GGUF) wrote 2,038 tokens over 83 s until its context
    was full (issue 33, day one 3); now it stops at serving.default_max_tokens, and says so.
    """
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
    with Served(QUICKSTART, home, extra=("--no-apply",)) as served:
        request = urllib.request.Request(
            f"{served.url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        began = time.monotonic()
        with urllib.request.urlopen(request, timeout=300) as resp:
            answer = json.load(resp)
            capped = resp.headers.get("x-blazar-max-tokens-capped")
        took = time.monotonic() - began
    default = Serving().default_max_tokens
    assert answer["usage"]["completion_tokens"] <= default, answer
    if answer["choices"][0]["finish_reason"] == "length":
        assert capped == str(default)
    assert took < 60, f"the guide's curl took {took:.0f} s"


def test_importing_250mb_without_copy_adds_no_second_copy(
    blazar: Blazar, blazar_home: Path, gemma_gguf: Path
) -> None:
    size, links = gemma_gguf.stat().st_size, gemma_gguf.stat().st_nlink
    assert size > 250_000_000  # (links: other tests of the session may hold a link to it)
    before = disk_bytes(blazar_home, gemma_gguf.parent)
    blazar("import", str(gemma_gguf), "--name", "gemma3-270m")
    after = disk_bytes(blazar_home, gemma_gguf.parent)
    assert after - before < 5_000_000  # the store's database, not another 250 MB
    record = json.loads(blazar("show", "gemma3-270m", "--json").output)
    assert os.path.samefile(record["path"], gemma_gguf)
    assert gemma_gguf.stat().st_nlink == links + 1  # hardlinked into the store
    assert record["sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    blazar("rm", "gemma3-270m")
    assert gemma_gguf.stat().st_size == size and gemma_gguf.stat().st_nlink == links
