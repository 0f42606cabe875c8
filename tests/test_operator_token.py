"""The local operator's way in once keys are declared: after `blazar keys add alice`, every
CLI command that talks to the daemon failed with a 401 that never said how to get back in
(issue 33, day one 7). serve writes a per-start token to a file only its user can read;
the CLI sends it to that serve alone; the gateway takes it as admin while serve runs."""

from __future__ import annotations

import hashlib
import http.server
import stat
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import ClassVar

from blazar.paths import Paths
from tests.conftest import run_blazar
from tests.serving import Served

KEY = "plm_alice-" + "a" * 40


class Recorder(http.server.BaseHTTPRequestHandler):
    """Another server: what headers reach it."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        Recorder.seen.append(dict(self.headers))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"models": [], "instances": []}')

    def log_message(self, *args: object) -> None:
        pass


def test_the_cli_on_this_machine_gets_in_without_a_key(paths: Paths, blazar_home: Path) -> None:
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    paths.manifest.parent.mkdir(parents=True, exist_ok=True)
    paths.manifest.write_text(f'[keys.alice]\nsha256 = "{sha}"\nscope = "inference"\n')
    token_file = paths.state / "operator.token"
    with Served(paths.manifest, blazar_home) as served:
        # A client with no key is refused, and told how the operator gets in.
        try:
            urllib.request.urlopen(f"{served.url}/api/blazar/ps", timeout=10)
            raise AssertionError("a request without a key was served")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
            assert "BLAZAR_API_KEY" in exc.read().decode()
        listed = run_blazar("ps", env={"BLAZAR_API_KEY": ""})
        assert listed.returncode == 0, listed.stderr
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert token not in served.log
        # The token goes to this serve alone: a daemon named with --url never sees it.
        other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
        thread = threading.Thread(target=other.serve_forever, daemon=True)
        thread.start()
        try:
            run_blazar("ps", "--url", f"http://127.0.0.1:{other.server_port}")
        finally:
            other.shutdown()
            other.server_close()
        assert Recorder.seen and not any("Authorization" in h for h in Recorder.seen)
        # An inference key is still only that: the token does not widen declared keys.
        refused = run_blazar("ps", env={"BLAZAR_API_KEY": KEY})
        assert refused.returncode != 0 and "scope" in refused.stderr
    assert not token_file.exists()  # gone with serve: it opens nothing once serve stops
    for path in blazar_home.rglob("*"):
        if path.is_file() and path.suffix in (".log", ".json", ".jsonl"):
            assert token not in path.read_text(errors="replace"), path
