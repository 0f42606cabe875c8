"""A stand-in llama.cpp fork for the fork-lane tests: a git repository, a catalog, a toolchain.

The fork adds the GGUF architecture `nova`, which mainstream llama.cpp rejects
("unknown model architecture: 'nova'"). Its "llama-server" is a real engine
honouring the contract: a Python program that, given a `nova` model, writes a
copy of it under the `llama` architecture (`blazar.testing.tiny.
copy_with_architecture`) and runs Blazar's xllamacpp launcher on that copy in
the same process (so the process's command line still names the engine's
directory, as a real llama-server's does). Any other model it serves as is.

`make_fork_repo` commits a llama.cpp-shaped tree holding that program to a
bare repository the tests reach over `file://`; `fake_cmake` puts a `cmake` on
PATH whose build step "compiles" `tools/server/fork-server.py` into
`build/bin/llama-server`, so the engine that gets installed is exactly what the
pinned commit holds: the fake-toolchain technique of tests/test_source_build.py
for the CLI and `blazar serve`, which run cmake as a program.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from blazar.engines import launchers

LAUNCHER = launchers.LLAMA
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=m"]

FORK_SERVER = '''
"""A llama.cpp fork that adds the {adds} architecture(s) (a test stand-in)."""
import atexit, hashlib, os, runpy, sys, tempfile

ADDS = {adds!r}
SLOW = {slow!r}  # a build that is really slower: eight threads pinned to one core
args = sys.argv[1:]
if SLOW and not os.environ.get("FORK_PINNED"):
    os.environ["FORK_PINNED"] = "1"
    os.execvp("taskset", ["taskset", "-c", "0", sys.executable, __file__, *args])
if SLOW:  # llama.cpp's threads spin at each barrier: eight on one core contend hard
    args += ["--threads", "8", "--threads-batch", "8"]
if "--model" in args:
    import gguf
    from blazar.testing.tiny import copy_with_architecture

    at = args.index("--model") + 1
    arch = str(gguf.GGUFReader(args[at]).fields["general.architecture"].contents())
    if arch in ADDS:
        key = hashlib.sha256(os.path.abspath(args[at]).encode()).hexdigest()[:16]
        mapped = os.path.join(tempfile.gettempdir(), f"blazar-fork-{{key}}-{{os.getpid()}}.gguf")
        copy_with_architecture(args[at], mapped, "llama")
        atexit.register(os.unlink, mapped)
        args[at] = mapped
sys.argv = [{launcher!r}, *args]
runpy.run_path({launcher!r}, run_name="__main__")
'''

FAKE_CMAKE = """#!{python}
import pathlib, sys
args = sys.argv[1:]
if args[0] == "--build":
    build = pathlib.Path(args[1])
    source = pathlib.Path((build / "source-dir").read_text())
    print("building llama-server from", source)
    server = build / "bin" / "llama-server"
    server.parent.mkdir(parents=True, exist_ok=True)
    body = (source / "tools" / "server" / "fork-server.py").read_text()
    server.write_text("#!{python}\\n" + body)
    server.chmod(0o755)
else:
    source, build = args[args.index("-S") + 1], pathlib.Path(args[args.index("-B") + 1])
    build.mkdir(parents=True, exist_ok=True)
    (build / "source-dir").write_text(source)
    (build / "configure-args").write_text("\\n".join(args))
    print("configured", source)
"""


def git(repo: Path, *args: str) -> str:
    done = subprocess.run([*GIT, "-C", str(repo), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def fork_server(adds: tuple[str, ...] = ("nova",), slow: bool = False) -> str:
    return FORK_SERVER.format(adds=set(adds), slow=slow, launcher=str(LAUNCHER))


class ForkRepo:
    """A work tree and the bare repository it pushes to; `commit` returns (sha, tree)."""

    def __init__(self, root: Path) -> None:
        self.work = root / "fork-work"
        self.bare = root / "fork.git"
        (self.work / "tools" / "server").mkdir(parents=True)
        (self.work / "include").mkdir()
        (self.work / "include" / "llama.h").write_text("// llama\n")
        (self.work / "CMakeLists.txt").write_text("project(llama.cpp)\n")
        git(self.work, "init", "-q")
        subprocess.run([*GIT, "init", "-q", "--bare", str(self.bare)], check=True)

    @property
    def url(self) -> str:
        return self.bare.as_uri()

    def commit(self, message: str, *, slow: bool = False) -> tuple[str, str]:
        (self.work / "tools" / "server" / "fork-server.py").write_text(fork_server(slow=slow))
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "-m", message)
        git(self.work, "push", "-q", str(self.bare), "HEAD:refs/heads/main")
        return git(self.work, "rev-parse", "HEAD"), git(self.work, "rev-parse", "HEAD^{tree}")


def offer_toml(
    offer_id: str,
    repo: str,
    commit: str,
    tree: str,
    *,
    adds: str = "nova",
    upstream: str | None = "b12000",
) -> str:
    lines = [
        f"[offers.{offer_id}]",
        f'description = "adds {adds} (test fork)"',
        f'repo = "{repo}"',
        f'commit = "{commit}"',
        f'tree = "{tree}"',
        f'architectures = ["{adds}"]',
        'build_options = ["-DGGML_NOVA=ON"]',
    ]
    if upstream:
        lines.append(f'upstream = "{upstream}"')
    return "\n".join(lines) + "\n\n"


def fake_cmake(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `cmake` first on PATH (for this test and the processes it starts)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    cmake = bin_dir / "cmake"
    cmake.write_text(FAKE_CMAKE.format(python=sys.executable))
    cmake.chmod(0o755)
    import os

    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return cmake
