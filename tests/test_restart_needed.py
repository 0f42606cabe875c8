"""A change that only a restart applies (where serve listens, TLS on or off) is said to
need one, in the CLI's answer and in `blazar status`: it was accepted with no word
(issue 33, day one 11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blazar.paths import Paths
from blazar.serve.daemon import restart_needed
from specs.serving import Serving
from tests.conftest import Blazar, run_blazar
from tests.serving import Served
from tests.waiting import wait_until

BOUND = ("127.0.0.1", 11435, False)


@pytest.mark.parametrize(
    ("host", "port", "serving", "said"),
    [
        (None, None, Serving(), ""),
        (None, None, Serving(port=11434), "serving.port is 11434, serve listens on 11435"),
        (None, 11435, Serving(port=11434), ""),  # serve --port wins over the manifest
        ("127.0.0.1", None, Serving(host="localhost"), ""),  # serve --host wins likewise
        (None, None, Serving(host="localhost"), "serving.host is localhost"),
        (None, None, Serving(tls_cert="c.pem", tls_key="k.pem"), "TLS is on in the manifest"),
    ],
)
def test_what_needs_a_restart(
    host: str | None, port: int | None, serving: Serving, said: str
) -> None:
    found = restart_needed(BOUND, host, port, serving)
    assert (said in found) if said else found == ""
    assert restart_needed(None, host, port, serving) == ""  # not listening yet


def test_the_cli_and_status_say_a_restart_is_needed(
    blazar: Blazar, paths: Paths, blazar_home: Path
) -> None:
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text('[serving]\nhost = "127.0.0.1"\n')
    with Served(paths.manifest, blazar_home):
        done = run_blazar("config", "set", "serving.host", "localhost")
        assert done.returncode == 0, done.stderr
        assert "serving.host: the running serve" in done.stderr
        assert "applies this when it restarts" in done.stderr

        def said() -> bool:
            return "RestartNeeded" in run_blazar("status").stdout

        wait_until(said, "status to show RestartNeeded", timeout=20, every=0.3)
        assert (
            "serving.host is localhost, serve listens on 127.0.0.1" in run_blazar("status").stdout
        )
        kept = run_blazar("config", "set", "serving.cors_origins", '["https://app.example"]')
        assert "restarts" not in kept.stderr  # applied at once: nothing to say
