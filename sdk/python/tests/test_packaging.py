"""blazar-sdk stands alone: standard library only, Python 3.9's rules, installable by itself.

The sources are read with `ast`: every import is the standard library's or the
package's own, and every module parses under Python 3.9's grammar, without the
newer standard-library names that would fail there at run time. Then the wheel
`make test` builds (sdk/python/build/wheel) is installed with pip, from no
index, into a fresh virtualenv of the oldest Python found here (3.9 when the
machine has one, else this one), and a script there imports the package, checks
that every module it loaded is the standard library's, and chats with the real
gateway, whole and streamed.
"""

from __future__ import annotations

import ast
import glob
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import SDK, Gateway

SOURCES = sorted((SDK / "src" / "blazar_sdk").glob("*.py"))
WHEELS = SDK / "build" / "wheel"
# Names newer than 3.9 that a 3.9 interpreter would trip on at run time.
NEWER = {
    ("typing", "TypeAlias"),
    ("typing", "ParamSpec"),
    ("typing", "Self"),
    ("typing", "TypeGuard"),
    ("typing", "Concatenate"),
    ("typing", "Never"),
    ("typing", "assert_never"),
    ("typing", "reveal_type"),
    ("typing", "LiteralString"),
    ("datetime", "UTC"),
    ("itertools", "pairwise"),
    ("itertools", "batched"),
}
NEWER_KEYWORDS = {("dataclass", "slots"), ("dataclass", "kw_only"), ("zip", "strict")}


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


@pytest.mark.parametrize("path", SOURCES, ids=[p.name for p in SOURCES])
def test_standard_library_only_under_python_39_rules(path: Path) -> None:
    source = path.read_text()
    tree = ast.parse(source, feature_version=(3, 9))  # a 3.10+ construct is a SyntaxError
    assert source.startswith('"""'), "every module opens with a docstring"
    assert "from __future__ import annotations" in source, "annotations stay unevaluated"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "absolute imports"
            names = [(node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                assert (_called(node), keyword.arg) not in NEWER_KEYWORDS, ast.unparse(node)
            continue
        else:
            continue
        for module, name in names:
            top = module.split(".")[0]
            assert top == "blazar_sdk" or top in sys.stdlib_module_names, module
            assert (module, name) not in NEWER, f"{module}.{name} is newer than Python 3.9"
    assert len(source.splitlines()) <= 450


def test_the_package_is_typed() -> None:
    assert (SDK / "src" / "blazar_sdk" / "py.typed").exists()


def oldest_python() -> tuple[str, str]:
    """A Python 3.9 if this machine has one (PATH, pyenv), else the running Python; and
    its version as X.Y."""
    home = Path.home()
    candidates = [
        os.environ.get("BLAZAR_SDK_PYTHON", ""),
        "python3.9",
        "/usr/bin/python3.9",
        *sorted(glob.glob(str(home / ".pyenv/versions/3.9*/bin/python3.9"))),
    ]
    for candidate in filter(None, candidates):
        try:
            found = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except OSError:
            continue
        if found.returncode == 0 and found.stdout.strip() == "3.9":
            return candidate, "3.9"
    return sys.executable, f"{sys.version_info[0]}.{sys.version_info[1]}"


SCRIPT = textwrap.dedent(
    """
    import sys, sysconfig
    import blazar_sdk
    from blazar_sdk import Client, batches, chat, realtime, tools  # every module
    from blazar_sdk import _transport, _websocket, client, errors, types
    stdlib = sysconfig.get_paths()["stdlib"]
    package = blazar_sdk.__file__.rsplit("/", 1)[0]
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None) or ""
        assert not where or where.startswith((stdlib, package)), (name, where)
    assert "site-packages" in package, package  # the installed copy, not the sources
    c = Client()  # BLAZAR_URL and BLAZAR_API_KEY
    answer = c.chat("tiny", "hello", max_tokens=3)
    with c.chat("tiny", "hello", max_tokens=3, stream=True) as stream:
        pieces = [d.content for d in stream if d.content]
    def weather(city: str, days: int = 1) -> str:
        "The weather."
        return "sunny"
    schema = blazar_sdk.function_tool(weather)["function"]["parameters"]
    print("%d.%d" % sys.version_info[:2], len(answer.text.split()), len(pieces), schema["required"])
    """
)


def test_installed_alone_it_runs_on_the_oldest_python(tmp_path: Path, gateway: Gateway) -> None:
    wheels = sorted(WHEELS.glob("blazar_sdk-*.whl"))
    assert wheels, f"no wheel in {WHEELS}: run `make -C sdk/python test` (it builds one)"
    python, version = oldest_python()
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    # This pip installs into that Python's site-packages (pip itself may not run on 3.9).
    site = venv / "lib" / f"python{version}" / "site-packages"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            version,
            "--target",
            str(site),
            str(wheels[-1]),
        ],
        check=True,
        timeout=120,
    )
    assert (site / "blazar_sdk" / "py.typed").exists()
    env = {**os.environ, "BLAZAR_URL": gateway.url, "BLAZAR_API_KEY": gateway.app_key}
    env.pop("PYTHONPATH", None)
    ran = subprocess.run(
        [str(venv / "bin" / "python"), "-c", SCRIPT],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"{version} 3 3 ['city']\n", ran.stdout
