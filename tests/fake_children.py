"""Child processes for the supervisor tests: small fake servers and what to check them with.

`tests/test_instance.py` and `tests/test_children.py` run real children: the
real engine (the launcher on xllamacpp) for normal paths, and these `python -c`
scripts only for faults the engine will not produce on demand (a hang, a child
that ignores SIGTERM, a grandchild holding the output pipe). Each script carries
MARKER (replaced by the test's tmp_path) so a leftover is found by its command line.
Every test fails if it leaves a child or an asyncio task behind (tests/leaks.py);
`run` also bounds a scenario's time.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import blazar.engines.launchers

T = TypeVar("T")
# The real engine, run with the test interpreter (xllamacpp is a test dependency).
LAUNCHER = str(blazar.engines.launchers.LLAMA)

# A fake upstream that is healthy at once; with IGNORE_TERM it shrugs off SIGTERM; with
# GRANDCHILD it starts a process of its own that shares its output pipe and process group.
FAKE_SERVER = """# MARKER
import http.server, signal, subprocess, sys
if IGNORE_TERM:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if GRANDCHILD:
    child = subprocess.Popen([sys.executable, "-c", "# MARKER\\nimport time; time.sleep(60)"])
    print("fake: grandchild", child.pid, flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Health)
print("fake: listening on http://127.0.0.1:%d" % server.server_port, flush=True)
server.serve_forever()
"""
# Names a port where nothing listens, then hangs: never healthy.
FAKE_DEAD_PORT = """# MARKER
import socket, time
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
print("fake: listening on http://127.0.0.1:%d" % port, flush=True)
time.sleep(60)
"""
FAKE_SILENT = "# MARKER\nimport time\ntime.sleep(60)\n"


def fake_server(ignore_term: bool = False, grandchild: bool = False) -> str:
    script = FAKE_SERVER.replace("IGNORE_TERM", str(ignore_term))
    return script.replace("GRANDCHILD", str(grandchild))


def run(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, and fail if the coroutine left tasks behind (an owner not closed)."""

    async def main() -> T:
        result = await asyncio.wait_for(coro, 10)
        others = asyncio.all_tasks() - {asyncio.current_task()}
        assert not others, f"tasks left behind: {others}"
        return result

    return asyncio.run(main())


def child_processes(marker: str) -> list[int]:
    """Live processes that are our children or mention the test's marker."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(status.split("PPid:")[1].split()[0])
        if ppid == os.getpid() or marker in cmdline:
            found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def dead(pid: int) -> bool:
    """A grandchild is reaped by init, not by us: count a zombie as dead; allow it 1 s."""
    for _ in range(100):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return True
        await asyncio.sleep(0.01)
    return False
